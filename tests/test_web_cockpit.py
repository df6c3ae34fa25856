"""The cockpit pages over HTTP (Starlette's TestClient): charts, the runs behind a bar, the
timeline, search and bulk actions, and the per-bucket cache that lets many dashboards share one
read.

The board is :func:`tests.support.history.seed_small`, written through the board store's own
calls at the start of a recent one-hour window's 200th bucket; its numbers are worked out by
hand in that function's docstring."""

from __future__ import annotations

import re
import threading
import time
import urllib.parse
from collections.abc import Iterator
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from dispatcher import buckets
from dispatcher.buckets import Bucket, Window
from dispatcher.kanban.model import CardStatus, NewCard
from dispatcher.web.history import HistoryCache, run_buckets, status_flows
from scope.foundation.clock import FakeClock
from tests.support.history import Seeded, seed_small
from tests.test_web_http import Dash

FIRST = 200
"""The bucket of the one-hour range where the seeded history starts."""


@pytest.fixture
def dash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Dash]:
    board = Dash(tmp_path, capsys)
    try:
        yield board
    finally:
        board.close()


def seeded(dash: Dash) -> tuple[Seeded, Window]:
    win = buckets.window("1h", time.time())
    return seed_small(dash.source.store, start=win.start + FIRST * win.step, step=win.step), win


def bars(html: str, chart: str) -> list[dict[str, Any]]:
    """The bars of one chart: the link, x and numbers (from the hover text) of each."""
    part = html.split(f'id="chart-{chart}"', 1)[1].split("</figure>", 1)[0]
    found = re.findall(
        r'<a href="([^"]*)"><rect class="hit" x="([^"]*)"[^>]*data-tip="([^"]*)"', part
    )
    return [{"href": unescape(h), "x": x, "counts": counts_of(unescape(t))} for h, x, t in found]


def counts_of(tip: str) -> dict[str, int]:
    """``09:05 to 09:10: 2 (tempfail 1, spawn_refused 1)`` → {tempfail: 1, spawn_refused: 1}."""
    inside = tip.rsplit(" (", 1)[1].rstrip(")")
    return {label: int(n) for label, n in (part.split(" ") for part in inside.split(", "))}


def drawn(html: str, chart: str) -> dict[str, int]:
    """How many segments each outcome's outline draws in one chart."""
    part = html.split(f'id="chart-{chart}"', 1)[1].split("</figure>", 1)[0]
    return {
        label: d.count("z") for label, d in re.findall(r'<path class="f-([^"]*)" d="([^"]*)"', part)
    }


def table(html: str, chart: str) -> list[list[str]]:
    part = html.split(f'id="table-{chart}"', 1)[1].split("</table>", 1)[0]
    body = part.split("<tbody>", 1)[1]
    return [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", body)]


def test_the_charts_show_the_seeded_runs_in_their_buckets(dash: Dash) -> None:
    seed, win = seeded(dash)
    html = dash.client.get("/charts?range=1h").text
    slot = svg_slot(win)
    runs = bars(html, "runs")
    assert [(float(b["x"]), b["counts"]) for b in runs] == [
        (round(FIRST * slot, 2), {"completed": 1}),
        (round((FIRST + 1) * slot, 2), {"failed": 1}),
        (round((FIRST + 2) * slot, 2), {"tempfail": 1, "spawn_refused": 1}),
    ]
    # One outline per outcome, a segment per bar it is in.
    assert drawn(html, "runs") == {"completed": 1, "failed": 1, "tempfail": 1, "spawn_refused": 1}
    rows = table(html, "runs")
    assert [row[1:] for row in rows] == [
        ["1", "1", "0", "0", "0"],
        ["1", "0", "1", "0", "0"],
        ["2", "0", "0", "1", "1"],
    ]
    # Wait and run time (a quarter of the hand-computed minute's seconds: 15 s buckets).
    assert [row[1:] for row in table(html, "wait")] == [
        ["1", "3.0 s", "3.0 s", "3.0 s"],
        ["1", "5.0 s", "5.0 s", "5.0 s"],
        ["1", "8.5 s", "8.5 s", "8.5 s"],
    ]
    assert [row[2] for row in table(html, "run")] == ["4.5 s", "11.2 s", "6.5 s"]
    # The depth table has the first interval, each one where a count changed, and now.
    depth = [row[1:] for row in table(html, "depth")]
    assert depth == [["0", "0", "0"], ["0", "1", "0"], ["2", "1", "0"], ["2", "1", "0"]]
    # A bar lists exactly the runs it counts, and offers to narrow them to one outcome.
    failed = dash.client.get(runs[1]["href"]).text
    assert re.findall(r'data-run="([^"]+)"', failed) == [seed.runs["beta1"].run_id]
    both = dash.client.get(runs[2]["href"]).text
    assert set(re.findall(r'data-run="([^"]+)"', both)) == {
        seed.runs["beta2"].run_id,
        seed.runs["gamma"].run_id,
    }
    only = re.findall(r'<p class="outcomes">only: (.*?)</p>', both)[0]
    narrow = dict((t, unescape(h)) for h, t in re.findall(r'<a href="([^"]*)">([^<]*)</a>', only))
    assert list(narrow) == ["tempfail", "spawn_refused"]
    refused = dash.client.get(narrow["spawn_refused"]).text
    assert re.findall(r'data-run="([^"]+)"', refused) == [seed.runs["gamma"].run_id]


def svg_slot(win: Window) -> float:
    from dispatcher.web.svg import WIDTH

    return WIDTH / win.count


def test_pages_go_gzip_compressed_to_a_browser_that_takes_it(dash: Dash) -> None:
    seeded(dash)
    plain = dash.client.get("/charts?range=1h", headers={"Accept-Encoding": "identity"})
    packed = dash.client.get("/charts?range=1h", headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in plain.headers
    assert packed.headers["content-encoding"] == "gzip"
    assert "accept-encoding" in packed.headers["vary"].lower()
    assert int(packed.headers["content-length"]) * 4 < len(plain.content)
    figures = re.compile(r'<figure class="chart".*?</figure>', re.S)
    assert figures.findall(packed.text) == figures.findall(plain.text)
    # The strict headers stay on a compressed answer; a small one goes as it is.
    assert "script-src 'self'" in packed.headers["content-security-policy"]
    small = dash.client.get("/static/icon.svg", headers={"Accept-Encoding": "gzip"})
    assert small.status_code == 200 and "content-encoding" not in small.headers


def test_the_filters_and_the_range_are_in_the_url(dash: Dash) -> None:
    seeded(dash)
    html = dash.client.get("/charts?range=1h&assignee=a").text
    assert [b["counts"] for b in bars(html, "runs")] == [{"completed": 1}, {"spawn_refused": 1}]
    assert "assignee=a" in bars(html, "runs")[0]["href"]
    assert 'aria-current="true">1h<' in html
    # An unknown range is the default one; a bad bar link is a 400 naming the field.
    assert 'aria-current="true">24h<' in dash.client.get("/charts?range=9y").text
    bad = dash.client.get("/charts/runs?start=soon&end=1")
    assert bad.status_code == 400 and "start" in bad.text


def test_the_board_shows_the_strip(dash: Dash) -> None:
    html = dash.client.get("/").text
    assert 'id="strip"' not in html  # nothing ran yet
    seeded(dash)
    # The history was written minutes in the past, into buckets the cache already keeps as
    # settled (real runs end now): a fresh cache, as after a restart.
    dash.site.history = HistoryCache()
    html = dash.client.get("/").text
    assert 'id="chart-strip"' in html
    shown: dict[str, int] = {}
    for bar in bars(html, "strip"):
        for outcome, n in bar["counts"].items():
            shown[outcome] = shown.get(outcome, 0) + n
    # The board reconciled the open run without a worker (no gateway runs here): lost.
    assert shown == {"completed": 1, "failed": 1, "tempfail": 1, "spawn_refused": 1, "lost": 1}


def test_the_timeline_draws_each_run_from_claim_to_end(dash: Dash) -> None:
    seed, win = seeded(dash)
    start, end = win.start + (FIRST - 2) * win.step, win.start + (FIRST + 18) * win.step
    html = dash.client.get(f"/timeline?end={end:.0f}&span={end - start:.0f}s").text
    scale = 960.0 / (end - start)
    for name, run in seed.runs.items():
        match = re.search(
            rf'x="([^"]*)" y="([^"]*)" width="([^"]*)"[^>]*data-run="{run.run_id}"', html
        )
        assert match, name
        x, width = float(match.group(1)), float(match.group(3))
        assert x == pytest.approx((run.claimed_at - start) * scale, abs=0.01), name
        finish = run.ended_at if run.ended_at is not None else end
        assert width == pytest.approx(max(1.0, (finish - run.claimed_at) * scale), abs=0.01), name
    rows = re.findall(r'data-row="([^"]*)"', html)
    assert rows == ["a", "b"]
    # The runs of b overlap (beta's second run and delta's are apart; beta1 and delta never
    # overlap), so each row needs one lane.
    assert html.count('class="tl-lanes lanes-1"') == 2
    zoom = re.search(r'id="tl-zoom-in" href="([^"]*)"', html)
    assert zoom and "span=150s" in unescape(zoom.group(1))


def blocked_cards(
    dash: Dash, count: int, title: str = "stuck", group: str | None = None
) -> list[str]:
    store = dash.source.store
    ids = []
    for n in range(count):
        new = NewCard(title=f"{title} {n}", assignee="echo", group=group)
        card, _ = store.add_card(new, now=time.time())
        store.move(card.id, CardStatus.BLOCKED, now=time.time())
        ids.append(card.id)
    return ids


def test_search_finds_sorts_and_pages(dash: Dash) -> None:
    seeded(dash)
    ids = blocked_cards(dash, 60)
    html = dash.client.get("/search?q=stuck").text
    assert '<p class="note" id="found">60 cards; 1\N{EN DASH}50 shown</p>' in html
    assert len(re.findall(r'<tr data-card="', html)) == 50
    older = re.search(r'href="([^"]*)" id="page-older"', html)
    assert older
    rest = dash.client.get(unescape(older.group(1))).text
    assert len(re.findall(r'<tr data-card="', rest)) == 10
    titles = dash.client.get("/search?q=stuck&sort=title&desc=0").text
    shown = re.findall(r'<a href="/cards/[^"]*">(stuck \d+)</a>', titles)
    assert shown == sorted(shown) and shown[0] == "stuck 0"
    assert re.findall(r'<tr data-card="([^"]*)"', dash.client.get(f"/search?q={ids[7]}").text) == [
        ids[7]
    ]
    bad = dash.client.get("/search?q=status:blokced")
    assert bad.status_code == 400 and "statuses are todo" in bad.text
    # Read-only (not signed in): no boxes, no actions.
    assert 'name="card"' not in html and "/search/act" not in html


def post(dash: Dash, fields: list[tuple[str, str]]) -> Any:
    """A form with a repeated field (ticked boxes), as a browser sends it."""
    return dash.client.post(
        "/search/act",
        content=urllib.parse.urlencode(fields),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )


def test_a_bulk_retry_moves_exactly_the_ticked_cards_with_one_event_each(dash: Dash) -> None:
    ids = blocked_cards(dash, 5)
    other = blocked_cards(dash, 2, "other")
    dash.sign_in()
    page = dash.client.get("/search?q=stuck").text
    token = re.search(r'name="csrf" value="([^"]*)"', page)
    assert token and 'name="card"' in page
    fields: list[tuple[str, str]] = [
        ("csrf", token.group(1)),
        ("action", "retry"),
        ("status", "todo"),
        ("scope", "selected"),
        ("next", "/search?q=stuck"),
        *[("card", card_id) for card_id in ids[:3]],
    ]
    asked = post(dash, fields)
    assert asked.status_code == 200 and "Retry: 3 cards (the ticked cards)?" in asked.text
    assert all(dash.source.store.get_card(i).status is CardStatus.BLOCKED for i in ids)
    done = post(dash, [*fields, ("confirm", "yes")])
    assert "3 of 3 cards retried." in done.text
    statuses = {i: dash.source.store.get_card(i).status for i in ids + other}
    assert [statuses[i] for i in ids] == [CardStatus.READY] * 3 + [CardStatus.BLOCKED] * 2
    assert all(statuses[i] is CardStatus.BLOCKED for i in other)
    for card_id in ids[:3]:
        retried = [
            e for e in dash.source.store.events_of(card_id) if e.data.get("action") == "retry"
        ]
        assert len(retried) == 1
    # Again: the three are ready now, so the CLI's rule skips them, with its reason.
    again = post(dash, [*fields, ("confirm", "yes")])
    assert "0 of 3 cards retried." in again.text and "cannot retry card" in again.text


def test_a_whole_result_is_confirmed_by_its_count(dash: Dash) -> None:
    ids = blocked_cards(dash, 4)
    dash.sign_in()
    token = dash.token("cards.bulk")
    fields = {"csrf": token, "action": "unblock", "scope": "all", "q": "stuck status:blocked"}
    asked = dash.client.post("/search/act", data=fields)
    assert "Unblock: 4 cards (every card the search finds" in asked.text
    count = re.search(r'name="count" value="(\d+)"', asked.text)
    assert count and count.group(1) == "4"
    blocked_cards(dash, 1)  # the result changes before the operator confirms
    changed = dash.client.post("/search/act", data={**fields, "count": "4", "confirm": "yes"})
    assert changed.status_code == 409 and "now finds 5 cards, not the 4" in changed.text
    assert all(dash.source.store.get_card(i).status is CardStatus.BLOCKED for i in ids)
    done = dash.client.post("/search/act", data={**fields, "count": "5", "confirm": "yes"})
    assert "5 of 5 cards unblocked." in done.text


def test_search_by_group_shows_it_and_a_bulk_action_takes_that_group_only(dash: Dash) -> None:
    night = blocked_cards(dash, 3, "night", group="night shift")
    day = blocked_cards(dash, 2, "day", group="day")
    loose = blocked_cards(dash, 2, "loose")
    html = dash.client.get("/search", params={"q": 'group:"night shift"'}).text
    assert set(re.findall(r'<tr data-card="([^"]*)"', html)) == set(night)
    groups = re.findall(r'<td class="group">(.*?)</td>', html)
    assert len(groups) == 3 and all(">night shift</a>" in g for g in groups)
    # Each shown group links to its own search.
    link_to = unescape(re.findall(r'<td class="group"><a href="([^"]*)"', html)[0])
    assert set(re.findall(r'<tr data-card="([^"]*)"', dash.client.get(link_to).text)) == set(night)
    every = dash.client.get("/search?q=status:blocked").text
    assert len(re.findall(r'<td class="group">-</td>', every)) == len(loose)
    dash.sign_in()
    fields = {
        "csrf": dash.token("cards.bulk"),
        "action": "unblock",
        "scope": "all",
        "q": "group:day status:blocked",
        "count": "2",
        "confirm": "yes",
    }
    done = dash.client.post("/search/act", data=fields)
    assert "2 of 2 cards unblocked." in done.text
    statuses = {i: dash.source.store.get_card(i).status for i in night + day + loose}
    assert [i for i, s in statuses.items() if s is not CardStatus.BLOCKED] == day


def test_bulk_actions_need_the_secret_and_the_token(dash: Dash) -> None:
    ids = blocked_cards(dash, 1)
    form = {"action": "archive", "scope": "selected", "card": ids[0], "confirm": "yes"}
    assert dash.client.post("/search/act", data=form).status_code == 403
    dash.sign_in()
    assert dash.client.post("/search/act", data=form).status_code == 403  # no CSRF token
    moved = dash.client.post(
        "/search/act",
        data={**form, "csrf": dash.token("cards.bulk"), "action": "move", "status": "review"},
    )
    assert "1 of 1 card moved to review." in moved.text
    assert dash.source.store.get_card(ids[0]).status is CardStatus.REVIEW


# -- the per-bucket cache --------------------------------------------------------------------


class Counting:
    """A store that counts its reads and answers each bucket with its start."""

    def __init__(self) -> None:
        self.windows: list[Window] = []
        self.lock = threading.Lock()

    def run_buckets(self, window: Window, *, assignee: str | None = None) -> list[Bucket]:
        with self.lock:
            self.windows.append(window)
        time.sleep(0.01)  # a read takes a moment: concurrent pages must wait for it, not repeat it
        return [Bucket({"at": int(s)}) for s in window.edges()]

    def status_flows(self, window: Window) -> tuple[dict[str, int], list[Any]]:
        self.windows.append(window)
        return {"ready": len(self.windows)}, [{} for _ in window.edges()]


def test_the_cache_reads_settled_buckets_once_and_the_newest_once_per_ttl() -> None:
    clock = FakeClock(1_800_000_000.0 + 7)
    cache = HistoryCache(clock, ttl=5.0, settle=60.0)
    store = Counting()
    win = buckets.window("1h", clock.time())
    first = run_buckets(cache, store, win, None)
    assert [b.counts["at"] for b in first] == [int(s) for s in win.edges()]
    settled = [w.count for w in store.windows]
    assert settled == [win.count - 5, 5]  # the last 60 s (4 buckets of 15 s + the current one)
    run_buckets(cache, store, win, None)
    assert len(store.windows) == 2  # within the TTL: nothing read
    clock.advance(5.0)
    run_buckets(cache, store, buckets.window("1h", clock.time()), None)
    assert [w.count for w in store.windows[2:]] == [5]  # only the newest buckets again
    clock.advance(15.0)  # one more bucket settles, the window moves on by one
    moved = buckets.window("1h", clock.time())
    again = run_buckets(cache, store, moved, None)
    assert [w.count for w in store.windows[3:]] == [1, 5]
    assert [b.counts["at"] for b in again] == [int(s) for s in moved.edges()]
    # Another filter is another series.
    run_buckets(cache, store, moved, "a")
    assert len(store.windows) == 7


def test_fifty_dashboards_at_once_cost_one_read() -> None:
    clock = FakeClock(1_800_000_000.0 + 7)
    cache = HistoryCache(clock)
    store = Counting()
    win = buckets.window("24h", clock.time())
    threads = [
        threading.Thread(target=run_buckets, args=(cache, store, win, None)) for _ in range(50)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(store.windows) == 2  # the settled buckets and the newest ones, once
    assert cache.reads == 2


def test_the_queue_depth_counts_come_with_the_newest_buckets() -> None:
    clock = FakeClock(1_800_000_000.0 + 7)
    cache = HistoryCache(clock, ttl=5.0)
    store = Counting()
    win = buckets.window("1h", clock.time())
    counts, flows = status_flows(cache, store, win)
    assert counts == {"ready": 2} and len(flows) == win.count
    clock.advance(5.0)
    counts, _ = status_flows(cache, store, win)
    assert counts == {"ready": 3}  # re-read with the newest buckets, not kept with the old


def test_the_cockpit_pages_carry_no_inline_script_or_style(dash: Dash) -> None:
    seeded(dash)
    blocked_cards(dash, 2)
    dash.sign_in()
    for path in ("/charts?range=1h", "/timeline", "/search?q=stuck", "/"):
        answer = dash.client.get(path)
        assert answer.status_code == 200, path
        assert "default-src 'none'" in answer.headers["content-security-policy"]
        html = answer.text
        assert " style=" not in html and "<style" not in html, path
        assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/dispatch.js" defer>'], (
            path
        )
        assert not re.search(r"<[^>]+\son[a-z]+=", html), path  # no event handler attributes


@pytest.mark.postgres
def test_in_cluster_mode_the_timeline_has_a_row_per_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_url: str
) -> None:
    from dispatcher.cluster.board import HostStamp, PgBoardStore
    from dispatcher.cluster.database import ClusterDB
    from dispatcher.cluster.hosts import Hosts
    from dispatcher.launch.outcome import Outcome
    from tests.support.history import run_once

    now = time.time()
    runs = {}
    with ClusterDB(pg_url) as cluster:
        cluster.migrate()
        hosts = Hosts(cluster, lease_ttl=60)
        for n, host in enumerate(("beta", "alpha")):
            lease = hosts.join(host, boot_id=f"boot-{host}", version="1")
            store = PgBoardStore(cluster, HostStamp(host_id=host, epoch=lease.epoch))
            card, _ = store.add_card(NewCard(title=f"on {host}", assignee="echo"), now=now - 300)
            begin = now - 200 + 30 * n
            runs[host] = run_once(
                store, card.id, claimed=begin, started=begin + 1, ended=begin + 20,
                outcome=Outcome.FAILED if host == "beta" else Outcome.COMPLETED,
            )  # fmt: skip
    board = Dash(tmp_path, capsys, extra=f"cluster:\n  database: {pg_url}\n  host_id: alpha\n")
    try:
        html = board.client.get("/timeline?span=10m").text
        assert "a row per host" in html
        assert re.findall(r'data-row="([^"]*)"', html) == ["alpha", "beta"]
        for host, run in runs.items():
            row = html.split(f'data-row="{host}"', 1)[1].split("</svg>", 1)[0]
            assert f'data-run="{run.run_id}"' in row
        charts = board.client.get("/charts?range=1h").text
        assert sorted(o for b in bars(charts, "runs") for o in b["counts"]) == [
            "completed",
            "failed",
        ]
    finally:
        board.close()


def test_the_roller_stores_what_settled_and_the_charts_read_it(dash: Dash) -> None:
    from dispatcher import rollup
    from dispatcher.web.roller import Roller

    # The seeded board in five-minute buckets, two hours and more ago: long settled.
    start = (time.time() // 7200 - 2) * 7200
    seed_small(dash.source.store, start=start, step=300.0)
    win = Window(start=start, step=300.0, count=24)
    counted = dash.source.store.run_buckets(win)
    roller = Roller(dash.source, FakeClock(start + 7200 + rollup.SETTLE))
    assert roller.round() > 0
    assert roller.round() == 0
    with dash.source.reader.db.read() as conn:
        assert len(rollup.stored(conn, "runs", win)) == 24
    assert dash.source.store.run_buckets(win) == counted
    assert [b.total for b in counted[:3]] == [1, 1, 2]
