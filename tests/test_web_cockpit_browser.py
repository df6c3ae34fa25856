"""The cockpit pages in a real headless Chromium against a real ``dispatch web`` process.

The state dir holds :func:`tests.support.history.seed_small`'s board (hand-computed numbers in
its docstring), written through the board store's own calls into recent 15-second buckets, and
three cron fires. The tests read what a user sees: each chart's bars and table, the numbers a
hover shows, the runs a bar click lists, the timeline's bars where the runs were, search by each
field, a bulk retry of 50 blocked cards, and a signed-out view without a single action.
Screenshots of the three pages are kept with ``DISPATCH_WEB_SCREENSHOTS=DIR`` (docs/web.md's).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher import buckets
from dispatcher.app.database import open_state
from dispatcher.cron.ledger import Ledger
from dispatcher.cron.records import Kind, Status
from dispatcher.kanban.model import CardStatus, NewCard
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.outcome import Outcome
from tests.benchmarks.history import fill
from tests.support.browser import WebHome, WebProcess, browser, page
from tests.support.history import seed_small
from tests.test_web_cockpit import counts_of

__all__ = ["browser", "page"]

CONFIG = """
kanban:
  degrade_without_scope: true
  assignees:
    a: {command: ["true"]}
    b: {command: ["true"]}
    echo: {command: ["sh", "-c", "echo hi"]}
cron:
  jobs:
    - {id: nightly, schedule: "30 2 * * *", command: ["true"]}
"""
FIRST = 200
"""The one-hour range's bucket where the seeded history starts (some ten minutes ago)."""


class Cockpit(WebHome):
    """A seeded state dir and one dashboard on it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, CONFIG)
        self.window = buckets.window("1h", time.time())
        start = self.window.start + FIRST * self.window.step
        with open_state(self.state) as db:
            store = SqliteBoardStore(db)
            self.seed = seed_small(store, start=start, step=self.window.step)
            self.blocked = [self._blocked(store, f"stuck {n}") for n in range(50)]
            self.others = [self._blocked(store, f"other {n}", "night shift") for n in range(3)]
            _fires(Ledger(db), start + 5 * self.window.step)
        self.web = WebProcess(self.config, self.state, self.env)

    @staticmethod
    def _blocked(store: SqliteBoardStore, title: str, group: str | None = None) -> str:
        new = NewCard(title=title, assignee="echo", group=group)
        card, _ = store.add_card(new, now=time.time())
        store.move(card.id, CardStatus.BLOCKED, now=time.time())
        return card.id


def _fires(ledger: Ledger, at: float) -> None:
    """Two completed fires and a failed one of ``nightly``, all ending at ``at`` + 5 s."""
    with ledger.transaction() as tx:
        for n, outcome in enumerate((Outcome.COMPLETED, Outcome.COMPLETED, Outcome.FAILED)):
            tx.insert(
                fire_key=f"nightly@test-{n}",
                job_id="nightly",
                kind=Kind.SCHEDULE,
                nominal_wall=f"2026-01-01T00:00:0{n}",
                zone="UTC",
                nominal=at,
                decided_at=at,
                due_at=at,
                actual=at + 1,
                started_at=at + 1,
                ended_at=at + 5,
                status=Status.DONE,
                outcome=outcome,
            )


@pytest.fixture(scope="module")
def cockpit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cockpit]:
    home = Cockpit(tmp_path_factory.mktemp("cockpit"))
    try:
        yield home
    finally:
        assert home.web.stop() == 0, home.web.errors


def signed_in(page: Any, cockpit: Cockpit, path: str) -> Any:
    page.goto(cockpit.web.sign_in)
    page.goto(cockpit.web.url + path)
    return page


def bars(page: Any, chart: str) -> list[tuple[float, dict[str, int]]]:
    """Each bar of a chart: its x and its numbers (the hover text's)."""
    return [
        (float(r.get_attribute("x")), counts_of(r.get_attribute("data-tip")))
        for r in page.locator(f"#chart-{chart} a rect.hit").all()
    ]


def _load_charts(page: Any, cockpit: Cockpit) -> int:
    """Load the one-hour charts page; the bucket where the seeded history starts in the window
    the page drew (the window slides by a bucket every 15 s: a load that straddled a bucket's
    end, where the page's window is not known, is done again)."""
    seeded = cockpit.window.start + FIRST * cockpit.window.step
    for _ in range(3):
        before = buckets.window("1h", time.time())
        page.goto(cockpit.web.url + "/charts?range=1h")
        if buckets.window("1h", time.time()) == before:
            return round((seeded - before.start) / before.step)
    raise AssertionError("three loads of /charts each straddled a 15 s bucket's end")


def test_each_chart_shows_the_seeded_numbers_and_a_hover_and_a_click_tell_more(
    page: Any, cockpit: Cockpit
) -> None:
    first = _load_charts(page, cockpit)
    # It came gzip-compressed (Chromium takes it), and draws all the same.
    sent, read = page.evaluate(
        "(() => { const n = performance.getEntriesByType('navigation')[0];"
        " return [n.encodedBodySize, n.decodedBodySize]; })()"
    )
    assert 0 < sent < read / 3
    slot = 960.0 / cockpit.window.count
    assert bars(page, "runs") == [
        (round(first * slot, 2), {"completed": 1}),
        (round((first + 1) * slot, 2), {"failed": 1}),
        (round((first + 2) * slot, 2), {"tempfail": 1, "spawn_refused": 1}),
    ]
    assert bars(page, "fires") == [(round((first + 5) * slot, 2), {"completed": 2, "failed": 1})]
    # Each outcome is drawn: its segments' outline has the bars' height in it.
    outline = page.locator("#chart-runs path.f-spawn_refused")
    assert outline.count() == 1 and outline.bounding_box()["height"] > 0
    # Without a click, the tables hold the same numbers (the wait of the 15 s buckets: a
    # quarter of the hand-computed minute's).
    page.click("#chart-wait summary")
    rows = page.locator("#table-wait tbody tr").all_inner_texts()
    assert [r.split("\t")[1:] for r in rows] == [
        ["1", "3.0 s", "3.0 s", "3.0 s"],
        ["1", "5.0 s", "5.0 s", "5.0 s"],
        ["1", "8.5 s", "8.5 s", "8.5 s"],
    ]
    page.click("#chart-depth summary")
    depth = page.locator("#table-depth tbody tr").all_inner_texts()
    assert [r.split("\t")[1:] for r in depth] == [
        ["0", "0", "0"],
        ["0", "1", "0"],
        ["2", "1", "0"],
        ["2", "1", "53"],  # now: the 53 cards blocked for the search tests
    ]
    page.click("#chart-lag summary")
    assert [r.split("\t")[1:] for r in page.locator("#table-lag tbody tr").all_inner_texts()] == [
        ["3", "1.0 s", "1.0 s", "1.0 s"]
    ]
    # Hover: the numbers of the bucket under the pointer.
    page.hover("#chart-runs a rect.hit >> nth=2")
    page.wait_for_selector("#tip:not([hidden])")
    assert page.inner_text("#tip").endswith(": 2 (tempfail 1, spawn_refused 1)")
    page.hover("#chart-run rect.hit >> nth=1")
    assert "p50 11.2 s" in page.inner_text("#tip")
    # A click on a bar lists exactly the runs it counts.
    page.click("#chart-runs a rect.hit >> nth=1")
    page.wait_for_url("**/charts/runs?**")
    listed = [r.get_attribute("data-run") for r in page.locator("#bar-list tbody tr").all()]
    assert listed == [cockpit.seed.runs["beta1"].run_id]


def test_the_timeline_draws_the_seeded_runs_where_they_were(page: Any, cockpit: Cockpit) -> None:
    win = cockpit.window
    start = win.start + (FIRST - 2) * win.step
    end = start + 20 * win.step
    page.goto(cockpit.web.url + f"/timeline?end={end:.0f}&span={end - start:.0f}s")
    scale = 960.0 / (end - start)
    for name, run in cockpit.seed.runs.items():
        rect = page.locator(f'#timeline rect[data-run="{run.run_id}"]')
        assert float(rect.get_attribute("x")) == pytest.approx(
            (run.claimed_at - start) * scale, abs=0.01
        ), name
        finish = end if run.ended_at is None else run.ended_at
        width = float(rect.get_attribute("width"))
        assert width == pytest.approx(max(1.0, (finish - run.claimed_at) * scale), abs=0.01), name
    assert page.locator(".tl-row").all_inner_texts()[:3] == ["a", "b", "cron nightly"]
    assert page.locator(".tl-cron rect[data-fire]").count() == 3
    # A bar links to its run (which opens its card, at the run).
    page.click(f'#timeline rect[data-run="{cockpit.seed.runs["alpha"].run_id}"]')
    page.wait_for_url(f"**/cards/{cockpit.seed.cards['alpha']}*")
    page.go_back()
    page.click("#tl-zoom-in")
    assert "span=150s" in page.url


@pytest.mark.parametrize(
    ("term", "want"),
    [
        ("DB", ["beta"]),
        ('"alpha deploy"', ["alpha"]),
        ("assignee:a", ["alpha", "gamma"]),
        ("status:done", ["alpha"]),
        ("status:ready,running a:b", ["beta", "delta"]),
    ],
)
def test_search_finds_by_each_field(
    page: Any, cockpit: Cockpit, term: str, want: list[str]
) -> None:
    page.goto(cockpit.web.url + "/search")
    page.fill("#q", term)
    page.press("#q", "Enter")
    page.wait_for_url("**/search?**")
    found = {r.get_attribute("data-card") for r in page.locator("#results tbody tr").all()}
    assert found == {cockpit.seed.cards[name] for name in want}


def test_search_finds_by_group(page: Any, cockpit: Cockpit) -> None:
    page.goto(cockpit.web.url + "/search")
    page.fill("#q", 'group:"night shift"')
    page.press("#q", "Enter")
    page.wait_for_url("**/search?**")
    found = {r.get_attribute("data-card") for r in page.locator("#results tbody tr").all()}
    assert found == set(cockpit.others)
    assert set(page.locator("#results td.group").all_inner_texts()) == {"night shift"}
    # From any result, a card's group is one click away.
    page.goto(cockpit.web.url + "/search?q=other")
    page.click("#results td.group a >> nth=0")
    page.wait_for_url("**/search?q=group*")
    assert page.input_value("#q") == 'group:"night shift"'
    assert page.locator("#results tbody tr").count() == 3


def test_search_by_id_and_time(page: Any, cockpit: Cockpit) -> None:
    alpha = cockpit.seed.cards["alpha"]
    page.goto(cockpit.web.url + f"/search?q={alpha[:7]}")
    assert page.locator("#results tbody tr").count() == 1
    page.goto(cockpit.web.url + "/search?q=stuck&range=1h&sort=title&desc=0")
    assert page.inner_text("#found").startswith("50 cards")
    titles = page.locator("#results tbody tr td:nth-child(2)").all_inner_texts()
    assert titles[:2] == ["stuck 0", "stuck 1"]
    page.goto(cockpit.web.url + "/search?q=created:1s")  # nothing that new
    assert page.inner_text("#found").startswith("0 cards")


def test_a_bulk_retry_of_50_blocked_cards_moves_exactly_those_with_50_events(
    page: Any, cockpit: Cockpit
) -> None:
    signed_in(page, cockpit, "/search?q=stuck+status:blocked")
    assert page.inner_text("#found").startswith("50 cards")
    page.check("input[data-select-all]")
    assert page.locator('input[name="card"]:checked').count() == 50
    page.select_option('select[name="action"]', "retry")
    page.click('button[name="scope"][value="selected"]')
    assert page.inner_text("#question") == "Retry: 50 cards (the ticked cards)?"
    page.click("#confirm")
    assert page.inner_text("#outcome") == "50 of 50 cards retried."
    with open_state(cockpit.state) as db:
        store = SqliteBoardStore(db)
        statuses = {c: store.get_card(c).status for c in cockpit.blocked + cockpit.others}
        retried = [
            e
            for c in cockpit.blocked + cockpit.others
            for e in store.events_of(c)
            if e.data.get("action") == "retry"
        ]
    assert all(statuses[c] is CardStatus.READY for c in cockpit.blocked)
    assert all(statuses[c] is CardStatus.BLOCKED for c in cockpit.others)
    assert sorted(e.card_id for e in retried) == sorted(cockpit.blocked)


def test_a_signed_out_view_offers_no_actions(page: Any, cockpit: Cockpit) -> None:
    for path in ("/search?q=other", "/charts", "/timeline", "/"):
        page.goto(cockpit.web.url + path)
        assert page.locator("form[method=post]").count() == 0, path
        assert page.locator('input[name="card"]').count() == 0, path
        assert page.locator("#signin").is_visible(), path
    page.goto(cockpit.web.url + "/search?q=other")
    assert page.locator("#results tbody tr").count() == 3


def test_the_cockpit_pages_at_1280_px(browser: Any, tmp_path: Path) -> None:
    """A day of a busy board (the benchmark's history, which counts back to the cards'
    statuses) in each page; nothing scrolls sideways. The screenshots are docs/web.md's."""
    home = WebHome(tmp_path, CONFIG.replace("a: {", "build: {").replace("b: {", "deploy: {"))
    fill(home.state, runs=2500, cards=250, days=1, now=time.time(), fires=150)
    web = WebProcess(home.config, home.state, home.env)
    saved = {}
    try:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        view = context.new_page()
        view.goto(web.sign_in)
        for name, path in (
            ("charts", "/charts"),
            ("timeline", "/timeline?span=1h"),
            ("search", "/search?q=deploy+status:ready&sort=changed"),
        ):
            view.goto(web.url + path)
            scroll = view.evaluate("document.documentElement.scrollWidth")
            assert scroll <= 1280, f"{name} scrolls sideways ({scroll})"
            saved[name] = tmp_path / f"web-{name}.png"
            view.screenshot(path=str(saved[name]), full_page=name != "search")
        context.close()
    finally:
        assert web.stop() == 0, web.errors
    assert all(path.stat().st_size > 10_000 for path in saved.values())
    kept = os.environ.get("DISPATCH_WEB_SCREENSHOTS")
    if kept:
        Path(kept).mkdir(parents=True, exist_ok=True)
        for path in saved.values():
            shutil.copy(path, Path(kept) / path.name)
