"""``dispatch web``'s cockpit: the charts over a month of history, card search, and what
dashboards polling the charts cost the gateway.

(a) *charts*: a state dir with 30 days of history (1,000,000 runs of 100,000 cards, their
events, 50,000 cron fires; written by :mod:`tests.benchmarks.history`) and its rollup
(:mod:`dispatcher.rollup`), built as a ``dispatch web`` running through that month would have
kept it; building it from nothing (what a state upgraded with a month of history costs once,
in the background) is a figure of its own. Then a real ``dispatch web`` serves it. Figures from
the server's own ``Server-Timing``: the first load of the 30-day charts page (nothing cached in
the process), then the p50 of warm loads, one every 0.4 s for long enough that the newest
buckets' cache (5 s) expires several times in between, so the figure includes those re-reads.
The 24-hour page (the default) is reported the same way.

(b) *search*: ``GET /search`` over the same 100,000 cards, a mix of what an operator types (no
filter, a title word, a status, an assignee with words, an id prefix, ``changed:24h``, a word
no title holds, a group alone and with a status (a third of the cards are in one of 40
groups), a sort by title), p50 over all loads.

(c) *dashboards polling the charts*: the gateway benchmark's ready -> worker running
measurement (:func:`tests.benchmarks.bench_gateway._latency`), run alternately without a
dashboard and with a ``dispatch web`` on the same state dir (given a day of finished history
first; at ``nice 10``, as the shipped unit runs it) and :data:`DASHBOARDS` clients each
loading the charts page every :data:`EVERY` seconds, all of them open (a first load done)
before the first card. The figure is the p50 with them over the p50 without.

Full mode: as above; 3 rounds of 40 cards each way. Quick: 20,000 runs of 2,000 cards, fewer
loads, 1 round of 12 cards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from tests.benchmarks.bench_gateway import Serve, _latency, _load
from tests.benchmarks.bench_web import _timed_get
from tests.benchmarks.common import Row, median, percentile, ratio
from tests.benchmarks.history import fill
from tests.support.browser import WebProcess
from tests.support.env import no_bus_env

NAME = "cockpit"
DESCRIPTION = (
    "dispatch web cockpit: charts over 30 days / 1,000,000 runs (first and warm), search over "
    "100,000 cards, gateway ready -> running with 50 dashboards polling the charts vs none"
)

TARGET_MS = 200.0
TARGET_FIRST_MS = 1000.0
TARGET_SLOWDOWN = 1.10
DASHBOARDS = 50
EVERY = 5.0
"""Seconds between two loads of one polling dashboard (the charts' cache lasts as long)."""
CONFIG = "kanban:\n  assignees:\n" + "".join(
    f"    {name}:\n      command: ['true']\n" for name in ("build", "test", "deploy", "report")
)
QUERIES = (
    "",
    "deploy",
    "status:ready",
    "a:build deploy 12",
    "c_00000a",
    "changed:24h",
    "zzz",
    "group:customer-7",
    "group:customer-7 status:ready",
)


def _server(url: str) -> float:
    return _timed_get(url)[0]


def _warm(url: str, loads: int, every: float) -> list[float]:
    times = []
    for _ in range(loads):
        started = time.monotonic()
        times.append(_server(url))
        time.sleep(max(0.0, every - (time.monotonic() - started)))  # paced: the cache expires
    return times


def _history_rows(runs: int, cards: int, loads: int) -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="bench-cockpit-"))
    try:
        (root / "config.yaml").write_text(CONFIG)
        state = root / "state"
        built = time.perf_counter()
        fill(state, runs=runs, cards=cards, days=30, now=time.time(), fires=runs // 20)
        built = time.perf_counter() - built
        load_before = _load()
        rolled, stored = _roll_up(state)
        web = WebProcess(root / "config.yaml", state, no_bus_env(root), timeout=300)
        try:
            first = _server(web.url + "/charts?range=30d")
            month = _warm(web.url + "/charts?range=30d", loads, 0.4)
            day_first = _server(web.url + "/charts")
            day = _warm(web.url + "/charts", loads, 0.4)
            found = [
                _server(web.url + "/search?" + urllib.parse.urlencode({"q": q}))
                for _ in range(max(2, loads // 6))
                for q in QUERIES
            ]
            found += [_server(web.url + "/search?sort=title&desc=0") for _ in range(3)]
        finally:
            web.stop()
        cluster = _postgres_rows(root, state, runs, loads)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    scale = f"{runs:,} runs of {cards:,} cards over 30 days"
    return [
        Row(
            figure=f"web: rollup of 30 days, {runs:,} runs, built from nothing",
            value=rolled,
            unit="s",
            note=f"{stored:,} bucket answers, in write transactions of 50 ms at most (once, in the"
            f" background, after an upgrade); history written in {built:.0f} s; {load_before}",
        ),
        Row(
            figure=f"web: charts page, 30 days, {runs:,} runs, first load (server time)",
            value=first,
            unit="ms",
            target=f"<= {TARGET_FIRST_MS:g} ms",
            met=first <= TARGET_FIRST_MS,
            note=f"a new dispatch web: settled buckets from the rollup, the newest counted; "
            f"{scale}; {_load()}",
        ),
        _row(f"web: charts page, 30 days, {runs:,} runs, warm, server time p50", month, scale),
        Row(
            figure="web: charts page, 24 h (the default), first load (server time)",
            value=day_first,
            unit="ms",
            target=f"<= {TARGET_FIRST_MS:g} ms",
            met=day_first <= TARGET_FIRST_MS,
            note=scale,
        ),
        _row("web: charts page, 24 h, warm, server time p50", day, scale),
        _row(f"web: search over {cards:,} cards, server time p50", found, f"{len(QUERIES)} queries "
             "and a sort by title, mixed; " + scale),
        *cluster,
    ]  # fmt: skip


def _postgres_rows(root: Path, state: Path, runs: int, loads: int) -> list[Row]:
    """The same history in PostgreSQL (copied by ``dispatch state migrate``'s function, then
    rolled up) and a ``dispatch web`` in cluster mode on it: the 30-day page's first and warm
    loads."""
    from dispatcher.app.database import open_state
    from dispatcher.cluster.board import PgBoardStore
    from dispatcher.cluster.database import ClusterDB
    from dispatcher.cluster.ledger import PgLedger
    from dispatcher.cluster.migrate import migrate
    from dispatcher.web.roller import BATCH
    from tests.support.postgres import PostgresUnavailable, start_server

    figure = f"web on PostgreSQL: charts page, 30 days, {runs:,} runs, first load (server time)"
    try:
        server = start_server()
    except PostgresUnavailable as exc:
        return [Row(figure=figure, value=None, unit="ms", note=f"no PostgreSQL: {exc}")]
    try:
        url = server.url(server.create_database())
        with open_state(state) as source, ClusterDB(url, pooled=False) as target:
            migrate(source, target)
            with target.connect(autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")  # as autovacuum would have by now
            rolled = time.perf_counter()
            board, ledger = PgBoardStore(target), PgLedger(target)
            now = time.time()
            while board.roll_up(now, spans=BATCH) + ledger.roll_up(now, spans=BATCH):
                pass
            rolled = time.perf_counter() - rolled
        config = root / "cluster.yaml"
        config.write_text(CONFIG + f"cluster:\n  database: {url}\n  host_id: bench\n")
        web = WebProcess(config, root / "host-state", no_bus_env(root), timeout=300)
        try:
            first = _server(web.url + "/charts?range=30d")
            month = _warm(web.url + "/charts?range=30d", loads, 0.4)
        finally:
            web.stop()
    finally:
        try:
            server.stop("immediate")
        finally:
            shutil.rmtree(server.root, ignore_errors=True)
    scale = f"{runs:,} runs over 30 days in PostgreSQL 15"
    return [
        Row(
            figure=figure,
            value=first,
            unit="ms",
            target=f"<= {TARGET_FIRST_MS:g} ms",
            met=first <= TARGET_FIRST_MS,
            note=f"rollup built from nothing in {rolled:.1f} s first; {scale}; {_load()}",
        ),
        _row("web on PostgreSQL: charts page, 30 days, warm, server time p50", month, scale),
    ]


def _roll_up(state: Path) -> tuple[float, int]:
    """Build the rollup of ``state`` from nothing, as ``dispatch web`` does in the background
    (its batches, without the pauses); seconds and answers stored."""
    from dispatcher.app.database import open_state
    from dispatcher.cron.ledger import Ledger
    from dispatcher.kanban.store import SqliteBoardStore
    from dispatcher.web.roller import BATCH

    started = time.perf_counter()
    stored = 0
    with open_state(state) as db:
        board, ledger = SqliteBoardStore(db), Ledger(db)
        now = time.time()
        while more := board.roll_up(now, spans=BATCH) + ledger.roll_up(now, spans=BATCH):
            stored += more
    return time.perf_counter() - started, stored


def _row(figure: str, times: list[float], what: str) -> Row:
    value = median(times)
    return Row(
        figure=figure,
        value=value,
        unit="ms",
        target=f"p50 <= {TARGET_MS:g} ms",
        met=value <= TARGET_MS,
        note=f"n={len(times)}, p90 {percentile(times, 90):.1f} ms, max {max(times):.1f} ms; "
        f"{what}; {_load()}",
    )


@contextlib.contextmanager
def _pollers(serve: Serve, loads: list[float], history: int) -> Iterator[None]:
    """A dashboard on the serve's state dir (after a day of finished history is written into
    it) and :data:`DASHBOARDS` clients loading its charts page every :data:`EVERY` s,
    staggered; their server times go to ``loads``."""
    fill(serve.state, runs=history, cards=history // 10, days=1, now=time.time(), finished=True)
    # As the shipped unit runs it (contrib/dispatch-web.service: Nice=10).
    niced = ["nice", "-n", "10", sys.executable, "-m", "dispatcher.cli.main"]
    web = WebProcess(serve.config, serve.state, serve.env(), program=niced)
    stop = threading.Event()

    def poll(offset: float) -> None:
        if stop.wait(offset):
            return
        while True:
            loads.append(_server(web.url + "/charts"))
            if stop.wait(EVERY):
                return

    threads = [
        threading.Thread(target=poll, args=(EVERY * i / DASHBOARDS,), daemon=True)
        for i in range(DASHBOARDS)
    ]
    try:
        for thread in threads:
            thread.start()
        # Every dashboard open (its first load done) before the cards are measured.
        deadline = time.monotonic() + EVERY + 60
        opened = len(loads) + DASHBOARDS
        while len(loads) < opened and time.monotonic() < deadline:
            time.sleep(0.1)  # bounded: the deadline above
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        web.stop()


def _polling_rows(rounds: int, count: int, history: int) -> list[Row]:
    from tests.support.systemd import ManagerUnavailable, acquire_manager

    figure = f"serve: ready -> worker running p50 with {DASHBOARDS} dashboards polling the charts"
    try:
        manager = acquire_manager(dict(os.environ))
    except ManagerUnavailable as exc:
        note = f"no systemd user manager: {exc.reason.splitlines()[0]}"
        return [Row(figure=figure, value=None, unit="ms", note=note)]
    plain: list[float] = []
    loaded: list[float] = []
    pages: list[float] = []
    load_before = _load()
    try:
        for _ in range(rounds):
            plain += _latency(manager, count)["latency"]
            busy = _latency(manager, count, lambda serve: _pollers(serve, pages, history))
            loaded += busy["latency"]
    finally:
        manager.close()
    value, base = median(loaded) * 1000, median(plain) * 1000
    slowdown = ratio(value, base)
    return [
        Row(
            figure=figure,
            value=value,
            unit="ms",
            baseline=base,
            ratio=slowdown,
            target=f"<= {TARGET_SLOWDOWN:.2f}x",
            met=slowdown is not None and slowdown <= TARGET_SLOWDOWN,
            note=f"n={len(loaded)} vs {len(plain)} cards in {rounds} alternating rounds; "
            f"p99 {percentile(loaded, 99) * 1000:.1f} vs {percentile(plain, 99) * 1000:.1f} ms; "
            f"{len(pages)} chart loads, p50 {median(pages) if pages else float('nan'):.1f} ms; "
            f"baseline: no dashboard; {load_before} before, {_load()} after",
        )
    ]


def run(quick: bool) -> list[Row]:
    """Every part (see the module docstring)."""
    if quick:
        return [*_history_rows(20_000, 2_000, 15), *_polling_rows(1, 12, 2_000)]
    return [*_history_rows(1_000_000, 100_000, 40), *_polling_rows(3, 40, 20_000)]
