"""Named limits and groups: what they cost a claim and a tick.

(a) *claim cost*: the claim transaction on a board of 100,000 ready cards in 1,000 groups with
50 limits defined (each card's assignee, one of 5, uses 3 of them, none full; a day of
released holds behind each limit, so the rate windows have starts to count) against a claim
with no limits on a board of 1,000 ready cards, interleaved, median per claim; on SQLite (the
single host; CPU time of this process, where the whole claim runs, so other load on a shared
machine does not count) and,
when a PostgreSQL server can be started, on PostgreSQL (wall time: the server does half the
work). Target <= 1.5x. For context, the same limited claim on a 1,000-card board: the ratio of
the two says whether a claim's cost grows with the board or the holds' history (the counts
are index ranges, so it must not).

(b) *dispatch rate*: one tick claiming and starting N cards whose workers are real processes
(the real registry and keepers, placed ``in_process``: no systemd needed) whose assignee uses a
limit that never binds (concurrency and rate far above N, and a per-group cap), against the
same tick without limits, alternating rounds; wall time. Target >= 0.9x. For context, the same
with the fake registry in CPU time: the dispatcher's own work, where a limit's two statements
per claim show most.

Full: 300 claims each, N = 60 real (200 fake), 3 rounds. Quick: 40 claims, 20,000 cards,
N = 10 real (50 fake), 1 round.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dispatcher.app.database import open_state
from dispatcher.app.runtime import open_runtime
from dispatcher.config import parse_config
from dispatcher.kanban.model import Limits, NewCard
from dispatcher.kanban.settings import Assignee, KanbanSettings
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.kanban.tick import KanbanDispatcher
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.limits import LimitSpec, PerGroup, Rate, Wants
from dispatcher.settings import Settings
from registry.fake import FakeRegistry
from scope.abc import CallerKind
from scope.fake import FakeScoper
from scope.foundation.clock import FakeClock
from tests.benchmarks.common import Row, median, ratio
from tests.support.env import no_bus_env

NAME = "limits"
DESCRIPTION = (
    "named limits: a claim with 50 limits at 100k ready cards in 1,000 groups vs no limits at "
    "1k (SQLite, PostgreSQL); dispatch rate with limits that never bind vs none"
)

TARGET_CLAIM = 1.5
TARGET_RATE = 0.9
GROUPS = 1000
LIMITS = 50
NOW = time.time()
ME = Claimant.current()


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f}, {os.cpu_count()} cores"


def _specs() -> dict[str, LimitSpec]:
    """50 limits none of which ever binds: a third concurrency, a third concurrency and
    rate, a third per group."""
    specs = {}
    for index in range(LIMITS):
        kind = index % 3
        if kind == 0:
            specs[f"l{index}"] = LimitSpec(concurrency=10**6)
        elif kind == 1:
            specs[f"l{index}"] = LimitSpec(concurrency=10**6, rate=Rate(10**6, 3600))
        else:
            specs[f"l{index}"] = LimitSpec(per_group=PerGroup(concurrency=10**6))
    return specs


ASSIGNEES = 5
"""Assignees of the limited boards, each using its own 3 of the 50 limits (as a config's
``uses`` lists them: a claim takes its card's assignee's)."""


def _uses(specs: dict[str, LimitSpec]) -> list[Wants]:
    rng = random.Random(11)
    names = sorted(specs)
    return [tuple((name, specs[name]) for name in rng.sample(names, 3)) for _ in range(ASSIGNEES)]


def _wants(uses: list[Wants], rng: random.Random) -> Wants:
    return rng.choice(uses)


def _cards(count: int, groups: int) -> list[tuple[Any, ...]]:
    """Ready cards in ``groups`` groups, with the turns the stores would have given them."""
    return [
        (f"c_{i:010x}", "t", "a", "ready", 0, i, i, f"g{i % groups}", i // groups)
        for i in range(1, count + 1)
    ]


_CARD_SQL = (
    "INSERT INTO kanban_cards (id, title, assignee, status, priority, created_at, updated_at,"
    " group_name, turn) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_HOLD_SQL = (
    "INSERT INTO limit_holds (limit_name, holder_kind, holder_id, host_id, group_name, taken_at,"
    " released_at) VALUES (?, 'run', ?, ?, ?, ?, ?)"
)


def _history(specs: dict[str, LimitSpec], host: str | None) -> list[tuple[Any, ...]]:
    """A day of released holds, 1,000 per limit (the last hour's counted by the rates)."""
    rows = []
    for name in specs:
        for index in range(1000):
            at = NOW - 86400 + index * 86.4
            rows.append((name, f"r_old{index}", host, f"g{index % GROUPS}", at, at + 1))
    return rows


BOARDS = (("small", 1000, 1, False), ("big", 0, GROUPS, True), ("same", 1000, 1, True))
"""(name, ready cards (0: the big size), groups, with a day of holds) of the claim boards:
"small" is claimed without limits, the others with 3 of the 50."""


def _claimers(stores: dict[str, Any], specs: dict[str, LimitSpec]) -> dict[str, Any]:
    rng = random.Random(5)
    uses = _uses(specs)
    plain = Limits(max_in_progress=10**6)

    def claimer(name: str) -> Callable[[str], None]:
        store = stores[name]

        def claim(card: str) -> None:
            limits = plain
            if name != "small":
                limits = Limits(max_in_progress=10**6, wants=_wants(uses, rng))
            if store.claim(card, now=NOW, claimer=ME, limits=limits).run is None:
                raise RuntimeError(f"{name}: {card} was not claimed")

        return claim

    return {name: claimer(name) for name in stores}


def _picks(big: int, claims: int) -> dict[str, list[str]]:
    rng = random.Random(3)
    sizes = {"small": 1000, "big": big, "same": 1000}
    return {
        name: [f"c_{i:010x}" for i in rng.sample(range(1, size), claims)]
        for name, size in sizes.items()
    }


def _measure(
    claimers: dict[str, Callable[[str], None]],
    picks: dict[str, list[str]],
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median milliseconds per claim of each board, the boards taking turns."""
    times: dict[str, list[float]] = {name: [] for name in claimers}
    for index in range(len(next(iter(picks.values())))):
        for name, claim in claimers.items():
            started = clock()
            claim(picks[name][index])
            times[name].append((clock() - started) * 1000)
    return {name: median(values) for name, values in times.items()}


def _claim_rows(where: str, found: dict[str, float], claims: int, big: int, how: str) -> list[Row]:
    note = f"n={claims} claims each, interleaved, {how}; {_load()}"
    small_ms, big_ms, same_ms = found["small"], found["big"], found["same"]
    return [
        Row(
            figure=f"{where}: claim, no limits, 1,000 ready cards",
            value=small_ms,
            unit="ms",
            note=note,
        ),
        Row(
            figure=f"{where}: claim, 3 of 50 limits, {big:,} ready cards in 1,000 groups",
            value=big_ms,
            unit="ms",
            baseline=small_ms,
            ratio=ratio(big_ms, small_ms),
            target=f"<= {TARGET_CLAIM:g}x",
            met=big_ms / small_ms <= TARGET_CLAIM,
            note=note,
        ),
        Row(
            figure=f"{where}: the same limited claim, {big:,} vs 1,000 ready cards",
            value=big_ms,
            unit="ms",
            baseline=same_ms,
            ratio=ratio(big_ms, same_ms),
            note=f"context: what the board's size costs a limited claim; {how}",
        ),
    ]


def _sqlite_claims(root: Path, big: int, claims: int) -> list[Row]:
    specs = _specs()
    dbs = {}
    for name, size, groups, history in BOARDS:
        db = open_state(root / name)
        with db.write() as conn:
            conn.executemany(_CARD_SQL, _cards(size or big, groups))
            if history:
                conn.executemany(_HOLD_SQL, _history(specs, None))
            conn.execute("ANALYZE")
        dbs[name] = db
    try:
        stores = {name: SqliteBoardStore(db) for name, db in dbs.items()}
        found = _measure(_claimers(stores, specs), _picks(big, claims), time.process_time)
    finally:
        for db in dbs.values():
            db.close()
    return _claim_rows("SQLite", found, claims, big, "CPU time")


@contextmanager
def _postgres() -> Iterator[Any]:
    from tests.support.postgres import start_server

    server = start_server()
    try:
        yield server
    finally:
        try:
            server.stop("immediate")
        finally:
            shutil.rmtree(server.root, ignore_errors=True)


def _pg_board(server: Any, size: int, groups: int, history: list[tuple[Any, ...]]) -> str:
    from dispatcher.cluster.database import ClusterDB
    from dispatcher.cluster.hosts import Hosts

    url = server.url(server.create_database())
    with ClusterDB(url, pooled=False) as db:
        db.migrate()
        Hosts(db, lease_ttl=3600).join("bench", boot_id="bench", version="0")
        with db.write(None) as conn:
            conn.executemany(_CARD_SQL, _cards(size, groups))
            if history:
                conn.executemany(_HOLD_SQL, history)
        with db.write(None) as conn:
            conn.execute("ANALYZE")
    return url


def _pg_claims(big: int, claims: int) -> list[Row]:
    from dispatcher.cluster.board import HostStamp, PgBoardStore
    from dispatcher.cluster.database import ClusterDB
    from tests.support.postgres import PostgresUnavailable

    specs = _specs()
    try:
        with _postgres() as server:
            urls = {
                name: _pg_board(
                    server, size or big, groups, _history(specs, "bench") if history else []
                )
                for name, size, groups, history in BOARDS
            }
            dbs = {name: ClusterDB(url, max_size=1) for name, url in urls.items()}
            try:
                stores = {
                    name: PgBoardStore(db, HostStamp(host_id="bench", epoch=1))
                    for name, db in dbs.items()
                }
                for store in stores.values():
                    store.board_version()  # warm the connection
                found = _measure(_claimers(stores, specs), _picks(big, claims))
            finally:
                for db in dbs.values():
                    db.close()
    except PostgresUnavailable as exc:
        note = f"no PostgreSQL: {exc}"
        return [Row(figure="PostgreSQL: claim", value=None, unit="ms", note=note)]
    return _claim_rows("PostgreSQL", found, claims, big, "wall time")


NEVER = {
    "api": LimitSpec(concurrency=10**6, rate=Rate(10**6, 60)),
    "tenants": LimitSpec(per_group=PerGroup(concurrency=10**6)),
}
"""Limits that never bind (the assignee uses both)."""


def _board(store: SqliteBoardStore, count: int) -> None:
    for index in range(count):
        new = NewCard(title=f"c{index}", assignee="a", group=f"g{index % 10}")
        store.add_card(new, now=NOW + index)


def _settings(count: int, limits: dict[str, LimitSpec]) -> Settings:
    uses = ", ".join(limits)
    text = (
        f"kanban:\n  max_in_progress: {count + 1}\n  degrade_without_scope: true\n"
        f"  assignees:\n    a: {{command: ['true'], uses: [{uses}]}}\n"
    )
    if limits:
        text += "limits:\n" + "".join(f"  {name}: {{concurrency: 1}}\n" for name in limits)
    settings = parse_config(text, "bench.yaml")
    return dataclasses.replace(settings, limits=dict(limits))


def _real_rate(root: Path, count: int, limits: dict[str, LimitSpec]) -> float:
    """Cards per second of one tick starting ``count`` real workers (``true``)."""
    settings = _settings(count, limits)
    root.mkdir(parents=True)
    environ = no_bus_env(root)
    runtime = open_runtime(settings, root / "state", environ, caller_kind=CallerKind.KANBAN)
    try:
        store = SqliteBoardStore(runtime.db)
        _board(store, count)
        dispatcher = KanbanDispatcher(
            store=store,
            registry=runtime.registry,
            settings=settings.kanban,
            state_dir=root / "state",
            caller=CallerKind.KANBAN,
            environ=environ,
            scoper=runtime.scoper,
            limits=settings.limits,
        )
        runtime.scoper.probe()  # not part of dispatching
        started = time.perf_counter()
        report = dispatcher.tick(time.time())
        took = time.perf_counter() - started
        for session in runtime.registry.list_sessions():
            runtime.registry.wait(session.id, timeout=30)
    finally:
        runtime.close()
    if len(report.dispatched) != count:
        raise RuntimeError(f"only {len(report.dispatched)} of {count} cards started")
    return count / took


def _fake_rate(root: Path, count: int, limits: dict[str, LimitSpec]) -> float:
    """Cards per CPU second of one tick starting ``count`` cards on the fake registry."""
    clock = FakeClock(NOW)
    scoper = FakeScoper(clock=clock)
    settings = KanbanSettings(
        max_in_progress=count + 1, assignees={"a": Assignee(command=("a",), uses=tuple(limits))}
    )
    with open_state(root) as db:
        store = SqliteBoardStore(db)
        _board(store, count)
        dispatcher = KanbanDispatcher(
            store=store,
            registry=FakeRegistry(scoper=scoper, clock=clock),
            settings=settings,
            state_dir=root,
            caller=CallerKind.KANBAN,
            environ={"PATH": "/usr/bin"},
            limits=limits,
        )
        started = time.process_time()
        report = dispatcher.tick(NOW + count)
        took = time.process_time() - started
    if len(report.dispatched) != count:
        raise RuntimeError(f"only {len(report.dispatched)} of {count} cards started")
    return count / took


def _rates(root: Path, real: int, fake: int, rounds: int) -> list[Row]:
    found: dict[str, list[float]] = {"plain": [], "limited": [], "fake": [], "fake_limited": []}
    for index in range(rounds):
        found["plain"].append(_real_rate(root / f"plain{index}", real, {}))
        found["limited"].append(_real_rate(root / f"limited{index}", real, NEVER))
        found["fake"].append(_fake_rate(root / f"fake{index}", fake, {}))
        found["fake_limited"].append(_fake_rate(root / f"fake_limited{index}", fake, NEVER))
    rates = {name: median(values) for name, values in found.items()}
    note = f"n={real} real workers, {rounds} rounds alternating, wall time; {_load()}"
    fake_note = f"n={fake} cards, fake registry, CPU time; {rounds} rounds"
    return [
        Row(
            figure="dispatch rate, real workers, no limits",
            value=rates["plain"],
            unit="cards/s",
            note=note,
        ),
        Row(
            figure="dispatch rate, real workers, limits that never bind",
            value=rates["limited"],
            unit="cards/s",
            baseline=rates["plain"],
            ratio=ratio(rates["limited"], rates["plain"]),
            target=f">= {TARGET_RATE:g}x",
            met=rates["limited"] / rates["plain"] >= TARGET_RATE,
            note=note,
        ),
        Row(
            figure="the dispatcher's own rate, limits that never bind",
            value=rates["fake_limited"],
            unit="cards/s",
            baseline=rates["fake"],
            ratio=ratio(rates["fake_limited"], rates["fake"]),
            note=f"context: no spawns, so the limits' statements show most; {fake_note}",
        ),
    ]


def run(quick: bool) -> list[Row]:
    """The claim rows (SQLite, PostgreSQL) and the dispatch rate rows."""
    root = Path(tempfile.mkdtemp(prefix="bench-limits-"))
    big, claims = (20_000, 40) if quick else (100_000, 300)
    try:
        rows = _sqlite_claims(root, big, claims)
        rows += _pg_claims(big, claims)
        rows += _rates(root, 10 if quick else 60, 50 if quick else 200, 1 if quick else 3)
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)
