"""A claim on a board where half the ready cards back off, against a claim on a small board.

A *claim* is what a kanban tick does for the first card it takes: read the walk's first page of
claimable ready cards (``ready_cards(now=...)``, which leaves out cards backing off through two
partial indexes) and claim the first of them. Boards of 1,000 and of 100,000 ready cards, half
of each backing off (``retry_at`` far ahead) and those ahead of the others in pick order, so a
walk that skipped them one by one would read 50,000 cards first. Median per claim, the two
boards interleaved; target: the big board at most 1.5x the small one, on SQLite (the state
database) and on PostgreSQL (cluster mode; its row has no value without PostgreSQL binaries).

For context, the same search the way the walk did it before the indexes (read pages in pick
order, skip cards backing off in Python) on the big board.

Full: 100,000 vs 1,000 cards, 200 claims each. Quick: 10,000 vs 1,000, 30 claims.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dispatcher.app.database import open_state
from dispatcher.kanban.abc import BoardStore
from dispatcher.kanban.model import Limits
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.kanban.tick import WALK_PAGE
from dispatcher.launch.claimant import Claimant
from tests.benchmarks.common import Row, median, ratio
from tests.support.postgres import PostgresUnavailable, start_server

NAME = "backoff"
DESCRIPTION = (
    "a claim on 100,000 ready cards of which half back off vs on 1,000 (SQLite, PostgreSQL)"
)

TARGET = 1.5
NOW = 2_000_000_000.0
LATER = 4_000_000_000.0
UNLIMITED = Limits(max_in_progress=10**9)

# Cards 1..N; the even ones back off and come first (priority 5).
_SQLITE_FILL = (
    "WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < ?)"
    " INSERT INTO kanban_cards (id, title, assignee, status, priority, created_at, updated_at,"
    " retry_at) SELECT printf('c_%010x', x), 't', 'a', 'ready', (x % 2 = 0) * 5, x, x,"
    " CASE WHEN x % 2 = 0 THEN ? END FROM g"
)
_PG_FILL = (
    "INSERT INTO kanban_cards (id, title, assignee, status, priority, created_at, updated_at,"
    " retry_at) SELECT 'c_' || lpad(to_hex(g), 10, '0'), 't', 'a', 'ready',"
    " CASE WHEN g %% 2 = 0 THEN 5 ELSE 0 END, g, g, CASE WHEN g %% 2 = 0 THEN %s END"
    " FROM generate_series(1, %s) g"
)


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f}, {os.cpu_count()} cores"


def _claim(store: BoardStore, me: Claimant) -> None:
    """The tick's first claim: its first page of claimable cards, then the claim."""
    page = store.ready_cards(limit=WALK_PAGE, now=NOW)
    store.claim(page[0].id, now=NOW, claimer=me, limits=UNLIMITED)


def _old_walk(store: BoardStore) -> None:
    """The first claimable card found as the walk did before: pages, skipping in Python."""
    after = None
    while True:
        page = store.ready_cards(after=after, limit=WALK_PAGE)
        if any(c.retry_at is None or c.retry_at <= NOW for c in page):
            return
        after = page[-1]


def _compare(boards: dict[int, BoardStore], claims: int) -> tuple[float, float, float]:
    """Median ms per claim on the small and the big board (interleaved), and the old walk's
    median ms on the big board."""
    me = Claimant.current()
    small, big = sorted(boards)
    times: dict[int, list[float]] = {small: [], big: []}
    for store in boards.values():
        _claim(store, me)  # warm caches and connections
    for _ in range(claims):
        for size, store in boards.items():
            started = time.perf_counter()
            _claim(store, me)
            times[size].append((time.perf_counter() - started) * 1000)
    old: list[float] = []
    for _ in range(3):
        started = time.perf_counter()
        _old_walk(boards[big])
        old.append((time.perf_counter() - started) * 1000)
    return median(times[small]), median(times[big]), median(old)


def _rows(backend: str, sizes: tuple[int, int], claims: int, got: tuple[float, ...]) -> list[Row]:
    small, big = sizes
    small_ms, big_ms, old_ms = got
    note = f"n={claims} claims each, interleaved, half the cards backing off; {_load()}"
    return [
        Row(
            figure=f"{backend}: claim at {small:,} ready cards",
            value=small_ms,
            unit="ms",
            note=note,
        ),
        Row(
            figure=f"{backend}: claim at {big:,} ready cards",
            value=big_ms,
            unit="ms",
            baseline=small_ms,
            ratio=ratio(big_ms, small_ms),
            target=f"<= {TARGET:g}x",
            met=big_ms / small_ms <= TARGET,
            note=note,
        ),
        Row(
            figure=f"{backend}: finding it by skipping backed-off cards one by one at {big:,}",
            value=old_ms,
            unit="ms",
            baseline=big_ms,
            ratio=ratio(old_ms, big_ms),
            note=f"n=3; the walk before the indexes, for context ({WALK_PAGE} cards a page)",
        ),
    ]


@contextmanager
def _sqlite(root: Path, sizes: tuple[int, int]) -> Iterator[dict[int, BoardStore]]:
    states = []
    boards: dict[int, BoardStore] = {}
    try:
        for size in sizes:
            db = open_state(root / f"sqlite-{size}")
            states.append(db)
            with db.write() as conn:
                conn.execute(_SQLITE_FILL, (size, LATER))
            with db.write() as conn:
                conn.execute("ANALYZE")
            boards[size] = SqliteBoardStore(db)
        yield boards
    finally:
        for db in states:
            db.close()


@contextmanager
def _postgres(sizes: tuple[int, int]) -> Iterator[dict[int, BoardStore]]:
    from dispatcher.cluster.board import PgBoardStore
    from dispatcher.cluster.database import ClusterDB

    server = start_server()
    opened: list[Any] = []
    try:
        boards: dict[int, BoardStore] = {}
        for size in sizes:
            db = ClusterDB(server.url(server.create_database()), max_size=1)
            opened.append(db)
            db.migrate()
            with db.write(None) as conn:
                conn.raw.execute(_PG_FILL, (LATER, size))
            with db.write(None) as conn:
                conn.execute("ANALYZE")
            boards[size] = PgBoardStore(db)
        yield boards
    finally:
        for db in opened:
            db.close()
        try:
            server.stop("immediate")
        finally:
            shutil.rmtree(server.root, ignore_errors=True)


def _measure(
    backend: str,
    boards: Callable[[], Any],
    sizes: tuple[int, int],
    claims: int,
) -> list[Row]:
    with boards() as opened:
        return _rows(backend, sizes, claims, _compare(opened, claims))


def run(quick: bool) -> list[Row]:
    """Both backends (PostgreSQL's rows have no value when it cannot be started)."""
    sizes = (1000, 10_000 if quick else 100_000)
    claims = 30 if quick else 200
    root = Path(tempfile.mkdtemp(prefix="bench-backoff-"))
    try:
        rows = _measure("SQLite", lambda: _sqlite(root, sizes), sizes, claims)
        try:
            rows += _measure("PostgreSQL", lambda: _postgres(sizes), sizes, claims)
        except PostgresUnavailable as exc:
            rows.append(
                Row(figure="PostgreSQL", value=None, unit="-", note=f"no PostgreSQL: {exc}")
            )
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)
