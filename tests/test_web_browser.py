"""dispatch web in a real headless Chromium against a real ``dispatch web`` process.

What a user meets: cards added by the CLI on the board and pushed to an open page within a
second; unblock, kill-run and cron pause clicked in the browser and seen by the CLI; a live log
tail; user text and worker output inert (no dialog ever opens); live updates paused and
resumed, and a server that goes away and comes back; another site's form and a rebound DNS name
refused; the layout at 1280 and 390 px (screenshots kept; ``DISPATCH_WEB_SCREENSHOTS=DIR``
keeps them in DIR, which is how docs/web-board.png is made).
"""

from __future__ import annotations

import http.server
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import WebHome, WebProcess, browser, dialogs_of, page
from tests.support.wait import wait_for

__all__ = ["browser", "page"]

XSS = "<img src=x onerror=alert(1)>"
NOISY = (
    "i=0; while [ $i -lt 30 ]; do i=$((i+1)); "
    "printf '\\\\033[31m<script>alert(2)</script> tick %s\\\\033[0m\\\\n' $i; "
    "sleep 0.2; done"
)
CONFIG = f"""
kanban:
  degrade_without_scope: true
  assignees:
    echo:
      command: ["sh", "-c", "echo hi"]
    sleeper:
      command: ["sleep", "120"]
    noisy:
      command: ["sh", "-c", "{NOISY}"]
cron:
  jobs:
    - id: nightly
      schedule: "30 2 * * *"
      timezone: America/New_York
      command: ["true"]
"""


class Home(WebHome):
    """The CLI and one dashboard on a fresh state dir."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, CONFIG)
        self.web: WebProcess | None = None

    def start(self, listen: str = "127.0.0.1:0") -> WebProcess:
        self.web = WebProcess(self.config, self.state, self.env, listen=listen)
        return self.web


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Home]:
    board = Home(tmp_path)
    board.start()
    try:
        yield board
    finally:
        if board.web is not None:
            assert board.web.stop() == 0, board.web.errors
        for session in board.json("ps"):
            board.dispatch("kill", session["id"], "--grace", "1")


def signed_in(page: Any, home: Home, path: str = "/") -> Any:
    assert home.web is not None
    page.goto(home.web.sign_in)
    if path != "/":
        page.goto(home.web.url + path)
    return page


def live(page: Any) -> None:
    page.wait_for_selector('#live-state[data-state="live"]', timeout=15_000)


def shots() -> Path | None:
    kept = os.environ.get("DISPATCH_WEB_SCREENSHOTS")
    return Path(kept) if kept else None


# -- the board --------------------------------------------------------------------------------


def test_the_board_shows_cli_cards_and_pushes_new_ones_within_a_second(
    page: Any, home: Home
) -> None:
    first = home.add("added before the page opened")
    assert home.web is not None
    page.goto(home.web.url + "/")
    assert (
        page.locator(f"#col-ready #card-{first}")
        .inner_text()
        .startswith("added before the page opened")
    )
    live(page)
    card = home.add("added while the page is open")
    exited = time.monotonic()
    page.wait_for_selector(f"#col-ready #card-{card}", timeout=10_000)
    assert time.monotonic() - exited <= 1.0
    second, committed = home.add_fast("timed from its commit")
    page.wait_for_selector(f"#col-ready #card-{second}", timeout=10_000)
    assert time.monotonic() - committed <= 1.0
    assert page.locator('[data-count="ready"]').first.inner_text() == "3"


def test_live_updates_pause_resume_and_survive_a_restart(page: Any, home: Home) -> None:
    assert home.web is not None
    page.goto(home.web.url + "/")
    live(page)
    page.click("#live-toggle")
    assert page.inner_text("#live-state") == "paused"
    held, _ = home.add_fast("held while paused")
    page.wait_for_timeout(1500)
    assert page.locator(f"#card-{held}").count() == 0
    page.click("#live-toggle")
    page.wait_for_selector(f"#col-ready #card-{held}", timeout=10_000)
    port = home.web.port
    assert home.web.stop() == 0
    page.wait_for_selector('#live-state[data-state="down"]', timeout=15_000)
    assert page.inner_text("#live-state") == "disconnected — retrying"
    missed, _ = home.add_fast("added while the server was down")
    home.start(listen=f"127.0.0.1:{port}")
    live(page)
    page.wait_for_selector(f"#col-ready #card-{missed}", timeout=30_000)


# -- actions in the browser, seen by the CLI --------------------------------------------------


def test_unblock_kill_run_and_cron_pause_clicked_in_the_browser(page: Any, home: Home) -> None:
    blocked = home.add("stuck")
    home.dispatch("kanban", "move", blocked, "blocked")
    sleepy = home.add("sleepy", "sleeper")
    home.dispatch("kanban", "tick")
    run = home.json("kanban", "show", sleepy)["current_run_id"]
    assert run is not None
    dialogs = dialogs_of(page)

    signed_in(page, home, f"/cards/{blocked}")
    page.click("text=Unblock")
    page.wait_for_url(f"**/cards/{blocked}")
    assert home.json("kanban", "show", blocked)["status"] == "ready"

    page.goto(f"{home.web.url}/cards/{sleepy}")  # type: ignore[union-attr]
    page.click("summary:has-text('Kill run')")
    page.click("button:has-text('Yes, kill run')")
    page.wait_for_url(f"**/cards/{sleepy}")
    [closed] = [r for r in home.json("kanban", "show", sleepy)["runs"] if r["run_id"] == run]
    assert closed["outcome"] == "failed" and closed["signal"] in ("SIGTERM", "SIGKILL")

    page.goto(f"{home.web.url}/cron")  # type: ignore[union-attr]
    page.click("#job-nightly button:has-text('Pause')")
    page.wait_for_url("**/cron")
    assert home.json("cron", "list")[0]["paused"] is True
    assert page.locator("#job-nightly .state").inner_text() == "paused"
    assert dialogs == []


def test_add_a_card_in_the_browser(page: Any, home: Home) -> None:
    signed_in(page, home)
    page.click("summary:has-text('Add card')")
    page.fill("input[name=title]", "typed in the browser")
    page.fill("input[name=priority]", "5")
    page.click("form[action='/cards'] button[type=submit]")
    page.wait_for_url("**/")
    [card] = home.json("kanban", "list")
    assert card["title"] == "typed in the browser" and card["priority"] == 5
    page.wait_for_selector(f"#col-ready #card-{card['id']}")


# -- live log and inert text ------------------------------------------------------------------


def test_the_log_tail_grows_and_everything_user_supplied_stays_text(page: Any, home: Home) -> None:
    dialogs = dialogs_of(page)
    card = home.add(XSS, "noisy")
    assert home.web is not None
    page.goto(f"{home.web.url}/cards/{card}")
    live(page)
    assert page.inner_text("h1.card-title") == XSS
    home.dispatch("kanban", "tick")

    def log_lines() -> int:
        return int(page.locator("#log").inner_text().count("tick "))

    first = wait_for(log_lines, timeout=30, interval=0.1, what="the first log lines")
    wait_for(lambda: log_lines() > first + 3, timeout=30, interval=0.1, what="the log growing")
    text = page.locator("#log").inner_text()
    assert "<script>alert(2)</script> tick 1" in text
    assert "\x1b" not in text and "[31m" not in text
    page.wait_for_selector("text=the worker finished", timeout=30_000)
    page.goto(f"{home.web.url}/")
    assert page.locator(f"#card-{card} .tile-title").inner_text() == XSS
    assert page.locator("img").count() == 0 and page.locator("main script").count() == 0
    assert page.evaluate("document.querySelectorAll('[onerror]').length") == 0
    assert dialogs == []


# -- what another site (or a rebound name) can do ---------------------------------------------


class _Evil(http.server.BaseHTTPRequestHandler):
    target = ""

    def do_GET(self) -> None:
        body = (
            f'<form id="f" method="post" action="{self.target}/cards">'
            '<input name="title" value="forged"><input name="assignee" value="echo"></form>'
            "<script>document.getElementById('f').submit()</script>"
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


def test_another_sites_form_and_a_post_without_token_are_refused(page: Any, home: Home) -> None:
    assert home.web is not None
    signed_in(page, home)  # the victim is signed in
    _Evil.target = home.web.url
    evil = http.server.ThreadingHTTPServer(("127.0.0.2", 0), _Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        answer = page.goto(f"http://127.0.0.2:{evil.server_address[1]}/")
        page.wait_for_url(f"{home.web.url}/cards", timeout=15_000)
        assert answer is not None
        assert "may not act" in page.content() or "needs the dashboard" in page.content()
    finally:
        evil.shutdown()
        evil.server_close()
    request = page.context.request
    same = request.post(f"{home.web.url}/cards", form={"title": "no token", "assignee": "echo"})
    assert same.status == 403 and "reload the page" in same.text()
    stranger = page.context.browser.new_context()
    try:
        anonymous = stranger.request.post(
            f"{home.web.url}/cards", form={"title": "no secret", "assignee": "echo"}
        )
        assert anonymous.status == 403 and "secret" in anonymous.text()
    finally:
        stranger.close()
    assert home.json("kanban", "list") == []


def test_a_rebound_dns_name_is_refused(page: Any, home: Home) -> None:
    assert home.web is not None
    answer = page.goto(f"http://rebound.test:{home.web.port}/")
    assert answer is not None and answer.status == 403
    assert "does not name this dashboard" in page.content()


# -- layout -----------------------------------------------------------------------------------


def test_the_layout_works_at_1280_and_390_px(browser: Any, home: Home, tmp_path: Path) -> None:
    moves = {
        "Write the release notes": None,
        "Rotate the API keys": "review",
        "Nightly backup check": "done",
        "Migrate the staging database": "blocked",
        XSS: None,
    }
    for title, status in moves.items():
        card = home.add(title)
        if status:
            home.dispatch("kanban", "move", card, status)
    home.dispatch(
        "kanban", "add", "Crawl the changelog feeds", "--assignee", "sleeper", "--priority", "5"
    )
    home.dispatch("kanban", "tick", "--max", "1")
    assert home.web is not None
    saved = {}
    for width in (1280, 390):
        context = browser.new_context(viewport={"width": width, "height": 900})
        try:
            view = context.new_page()
            view.goto(home.web.sign_in)
            live(view)
            columns = view.locator("section.column")
            assert columns.count() == 6
            boxes = [columns.nth(i).bounding_box() for i in range(6)]
            tops = {round(box["y"]) for box in boxes}
            if width == 1280:
                assert len(tops) == 1, "the six columns stand side by side"
                assert all(box["x"] + box["width"] <= width for box in boxes)
            else:
                assert len(tops) == 6, "the columns stack on a phone"
                assert all(box["width"] <= width for box in boxes)
            scroll = view.evaluate("document.documentElement.scrollWidth")
            assert scroll <= width, f"the page scrolls sideways at {width} px ({scroll})"
            saved[width] = tmp_path / f"board-{width}.png"
            view.screenshot(path=str(saved[width]), full_page=True)
        finally:
            context.close()
    assert all(path.stat().st_size > 10_000 for path in saved.values())
    kept = shots()
    if kept is not None:
        kept.mkdir(parents=True, exist_ok=True)
        for width, path in saved.items():
            shutil.copy(path, kept / f"web-board-{width}.png")


FOLLOWED = (
    "seq 1 300 | sed 's/^/early line /'; i=0; while [ $i -lt 600 ]; do i=$((i+1)); "
    "echo late line $i; sleep 0.05; done"
)


def test_log_panes_follow_the_newest_output_and_the_add_form_floats(page: Any, home: Home) -> None:
    """Issue 19, section 5: a log pane opens at its end and follows it until the reader
    scrolls up; "Add card" opens over the board; the live toggle says what it pauses."""
    session = home.dispatch("run", "--", "sh", "-c", FOLLOWED).stdout.strip()
    assert home.web is not None
    wait_for(
        lambda: "late line" in home.dispatch("logs", session).stdout,
        timeout=15,
        what="the worker's output",
    )
    page.goto(f"{home.web.url}/sessions/{session}")
    live(page)
    gap = "(() => { const p = document.getElementById('log');"
    gap += " return p.scrollHeight - p.scrollTop - p.clientHeight; })()"
    top = "document.getElementById('log').scrollTop"
    height = "document.getElementById('log').scrollHeight"
    assert page.evaluate(top) > 0 and page.evaluate(gap) < 40  # opened at the newest line
    grown = page.evaluate(height)
    wait_for(lambda: page.evaluate(height) > grown + 200, timeout=15, what="the pane growing")
    assert page.evaluate(gap) < 40  # and it followed
    page.evaluate("document.getElementById('log').scrollTop = 0")
    wait_for(lambda: page.evaluate(top) == 0, timeout=5, what="the scroll up")
    grown = page.evaluate(height)
    wait_for(lambda: page.evaluate(height) > grown + 200, timeout=15, what="more output")
    assert page.evaluate(top) == 0  # the reader's place is kept
    assert page.inner_text("#live-toggle") == "Pause live updates"
    page.click("#live-toggle")
    assert page.inner_text("#live-toggle") == "Resume live updates"
    # The add form opens over the board instead of pushing it down.
    signed_in(page, home)
    before = page.locator("#board").bounding_box()
    page.click("summary:has-text('Add card')")
    form = page.locator("form[action='/cards']")
    form.wait_for(state="visible")
    after = page.locator("#board").bounding_box()
    assert before is not None and after is not None and after["y"] == before["y"]
    assert page.inner_text("#pause-form button") == "Pause claiming"
