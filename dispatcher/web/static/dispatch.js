// dispatch web: live updates over Server-Sent Events. Pages work without this file; it only
// keeps them current. Everything the server sends was rendered (and escaped) by the server's
// templates; it is parsed in an inert document and moved in, and worker output is added as
// text only. The Content-Security-Policy forbids any other script.
"use strict";

(function () {
  const bar = document.getElementById("live-bar");
  const stateEl = document.getElementById("live-state");
  const toggle = document.getElementById("live-toggle");
  const parser = new DOMParser();
  const MAX_LOG_CHARS = 2000000;
  let source = null;
  let lastId = null;
  let paused = false;
  let retry = null;
  let backoff = 1000;

  document.documentElement.classList.add("js");

  function setState(text, state) {
    if (!stateEl) return;
    stateEl.textContent = text;
    stateEl.dataset.state = state;
  }

  function fragment(html) {
    const doc = parser.parseFromString(html, "text/html");
    const out = document.createDocumentFragment();
    for (const node of Array.from(doc.body.childNodes)) out.appendChild(document.adoptNode(node));
    return out;
  }

  function replaceRegion(id, html) {
    const region = document.getElementById(id);
    if (!region) return;
    // A confirmation the operator opened stays open across an update.
    const open = new Set(
      Array.from(region.querySelectorAll("details[open][data-keep]"), (d) => d.dataset.keep)
    );
    region.replaceChildren(fragment(html));
    for (const d of region.querySelectorAll("details[data-keep]")) {
      if (open.has(d.dataset.keep)) d.open = true;
    }
    tick();
  }

  function placeCard(card) {
    const old = document.getElementById("card-" + card.id);
    if (old) old.remove();
    const column = document.getElementById("col-" + card.status);
    if (!column) return;
    if (card.status === "done" && column.dataset.offset !== "0") return;
    const list = column.querySelector("ol.tiles");
    const tile = fragment(card.html).firstElementChild;
    if (!list || !tile) return;
    let before = null;
    for (const other of list.children) {
      if ((other.dataset.rank || "") > card.rank) {
        before = other;
        break;
      }
    }
    list.insertBefore(tile, before);
    const limit = parseInt(column.dataset.limit || "0", 10);
    while (limit > 0 && list.children.length > limit) list.lastElementChild.remove();
    tile.classList.add("fresh");
    setTimeout(() => tile.classList.remove("fresh"), 2000);
  }

  function applyCards(data) {
    for (const card of data.cards || []) placeCard(card);
    for (const id of data.gone || []) {
      const old = document.getElementById("card-" + id);
      if (old) old.remove();
    }
    for (const [status, count] of Object.entries(data.counts || {})) {
      for (const el of document.querySelectorAll('[data-count="' + status + '"]')) {
        el.textContent = String(count);
      }
    }
    if (typeof data.paused === "boolean") {
      const show = (id, on) => {
        const el = document.getElementById(id);
        if (el) el.hidden = !on;
      };
      show("paused-note", data.paused);
      show("pause-form", !data.paused);
      show("resume-form", data.paused);
    }
    tick();
  }

  // A log pane opens at its newest output and follows what is appended, until the reader
  // scrolls up; scrolling back to the end follows again.
  let following = true;
  const atEnd = (pre) => pre.scrollHeight - pre.scrollTop - pre.clientHeight < 40;
  const logPane = document.getElementById("log");
  if (logPane) {
    logPane.scrollTop = logPane.scrollHeight;
    logPane.addEventListener("scroll", () => {
      following = atEnd(logPane);
    });
  }

  function appendLog(data) {
    const pre = document.getElementById("log");
    if (!pre) return;
    pre.hidden = false;
    const follow = following;
    if (data.reset) {
      pre.textContent = "";
      const link = document.getElementById("log-session");
      if (link && data.session) link.textContent = data.session;
      note("the worker is running");
    }
    if (data.text) pre.appendChild(document.createTextNode(data.text));
    if (pre.textContent.length > MAX_LOG_CHARS) {
      pre.textContent = pre.textContent.slice(-MAX_LOG_CHARS / 2);
    }
    if (follow) pre.scrollTop = pre.scrollHeight;
  }

  function note(text) {
    const el = document.getElementById("log-state");
    if (el) el.textContent = text;
  }

  function problem(text) {
    const banner = document.getElementById("problem");
    const span = document.getElementById("problem-text");
    if (!banner || !span) return;
    banner.hidden = !text;
    span.textContent = text || "";
  }

  function connect() {
    if (!bar || paused) return;
    let url = bar.dataset.stream;
    if (lastId !== null) url += (url.includes("?") ? "&" : "?") + "last=" + encodeURIComponent(lastId);
    const stream = new EventSource(url);
    source = stream;
    setState("connecting…", "connecting");
    const seen = (event) => {
      if (event.lastEventId) lastId = event.lastEventId;
    };
    stream.onopen = () => {
      backoff = 1000;
      setState("live", "live");
      problem("");
    };
    stream.onerror = () => {
      if (paused || source !== stream) return;
      setState("disconnected — retrying", "down");
      if (stream.readyState === EventSource.CLOSED) {
        // The server answered with an error: the browser gives up, so retry ourselves.
        source = null;
        clearTimeout(retry);
        retry = setTimeout(connect, backoff);
        backoff = Math.min(backoff * 2, 30000);
      }
    };
    stream.addEventListener("cards", (e) => {
      seen(e);
      applyCards(JSON.parse(e.data));
    });
    stream.addEventListener("regions", (e) => {
      seen(e);
      const data = JSON.parse(e.data);
      for (const [id, html] of Object.entries(data)) replaceRegion(id, html);
    });
    stream.addEventListener("log", (e) => {
      seen(e);
      appendLog(JSON.parse(e.data));
    });
    stream.addEventListener("logend", (e) => {
      seen(e);
      note("the worker finished");
    });
    stream.addEventListener("problem", (e) => problem(JSON.parse(e.data).problem));
    stream.addEventListener("reload", () => window.location.reload());
  }

  function pause() {
    paused = true;
    clearTimeout(retry);
    if (source) source.close();
    source = null;
    setState("paused", "paused");
    toggle.textContent = "Resume live updates";
    toggle.setAttribute("aria-pressed", "true");
  }

  function resume() {
    paused = false;
    toggle.textContent = "Pause live updates";
    toggle.setAttribute("aria-pressed", "false");
    connect();
  }

  // The CLI's rule (dispatcher/timefmt.py span): largest unit first, the next one only
  // while the first is below 10 ("3h12m" but "14h").
  const UNITS = [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]];
  function span(seconds) {
    let rest = Math.floor(Math.abs(seconds));
    for (let i = 0; i < UNITS.length; i++) {
      const [unit, size] = UNITS[i];
      if (rest >= size || size === 1) {
        const count = Math.floor(rest / size);
        rest -= count * size;
        let text = count + unit;
        if (count < 10 && i + 1 < UNITS.length) {
          const [small, smallSize] = UNITS[i + 1];
          const more = Math.floor(rest / smallSize);
          if (more) text += more + small;
        }
        return text;
      }
    }
    return "0s";
  }

  function tick() {
    const now = Date.now() / 1000;
    for (const el of document.querySelectorAll("time[data-since]")) {
      el.textContent = span(now - parseFloat(el.dataset.since));
    }
  }


  // Charts: hovering (or focusing) a bar or an interval shows its numbers in a small box that
  // follows the pointer; the numbers are the shape's own data-tip text (also its <title>, which
  // the browser shows when this script does not run).
  const tipBox = document.createElement("div");
  tipBox.id = "tip";
  tipBox.hidden = true;
  tipBox.setAttribute("role", "status");
  document.body.appendChild(tipBox);
  let tipped = null;
  function showTip(target, x, y) {
    if (tipped && tipped !== target) tipped.classList.remove("tipped");
    tipped = target;
    target.classList.add("tipped");
    tipBox.textContent = target.dataset.tip;
    tipBox.hidden = false;
    const left = Math.min(x + 14, window.innerWidth - tipBox.offsetWidth - 8);
    tipBox.style.left = Math.max(4, left) + "px";
    tipBox.style.top = Math.max(4, y - tipBox.offsetHeight - 10) + "px";
  }
  function hideTip() {
    if (tipped) tipped.classList.remove("tipped");
    tipped = null;
    tipBox.hidden = true;
  }
  document.addEventListener("mousemove", (e) => {
    const target = e.target instanceof Element ? e.target.closest("[data-tip]") : null;
    if (target) showTip(target, e.clientX, e.clientY);
    else if (tipped) hideTip();
  });
  document.addEventListener("focusin", (e) => {
    const target = e.target instanceof Element ? e.target.closest("[data-tip]") : null;
    if (!target) return;
    const box = target.getBoundingClientRect();
    showTip(target, box.left, box.top);
  });
  document.addEventListener("focusout", hideTip);

  // Search results: the header's box ticks or clears every card box of its form.
  for (const all of document.querySelectorAll("input[data-select-all]")) {
    all.addEventListener("change", () => {
      const form = all.closest("form");
      if (!form) return;
      for (const box of form.querySelectorAll('input[type="checkbox"][name="card"]')) {
        box.checked = all.checked;
      }
    });
  }

  if (bar && toggle) {
    toggle.hidden = false;
    toggle.addEventListener("click", () => (paused ? resume() : pause()));
    connect();
  }
  setInterval(() => {
    if (!paused) tick();
  }, 1000);
})();
