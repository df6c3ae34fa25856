"""Cluster mode on one machine: hosts are serves with their own private systemd managers and
state dirs, sharing one private PostgreSQL server (tests/support/cluster.py).

(a) *cross-host latency*: a card committed on host A (a process configured as host "a" with no
serve) runs on host B, whose serve learns of it through LISTEN/NOTIFY (the board poll is 2 s, and
host A's poke cannot reach B). The worker's first instruction writes ``$EPOCHREALTIME``; the
sample is that instant minus ``time.time()`` right after the adding commit returned, one card
at a time, p50/p99.

(b) *dispatch rate*: N cards of a worker that exits at once, added in one go; rate = N / (time
from the first add to the last card done), for three hosts and for one host on the same machine
with the same per-host cap. The machine has two cores, so the hosts share them: the ratio says
what a second and third host cost and bring here, not what separate machines would.

(c) *claim cost*: the claim transaction (skip-locked pick, counts, lease check, the write) on a
board of 100,000 ready cards against one of 1,000, interleaved, median per claim; the ratio
shows whether the claim's cost grows with the board (target <= 1.5x). For context, the time
to list the ready cards once (what the dispatcher's walk costs today) on the same boards.

(d) *connections per host*: the most connections one host held at once (pool plus LISTEN,
``pg_stat_activity`` sampled every 0.1 s during (b)); target <= 5 (a pool of 4 + 1).

Full: 200 latency samples, 300 cards, 100,000 vs 1,000 cards. Quick: 20, 60, 20,000 vs 1,000.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest

from dispatcher.app.workspace import Workspace
from dispatcher.config import load_config
from dispatcher.kanban.tick import WALK_PAGE
from dispatcher.settings import Settings
from tests.benchmarks.common import Row, median, percentile, ratio
from tests.support.cluster import ClusterRig
from tests.support.postgres import PostgresServer, PostgresUnavailable, start_server
from tests.support.wait import wait_for

NAME = "cluster"
DESCRIPTION = (
    "cluster mode on one PostgreSQL: card on host A -> worker on host B p50/p99, dispatch rate "
    "3 hosts vs 1, claim cost at 100k vs 1k ready cards, connections per host"
)

TARGET_P50_MS, TARGET_P99_MS = 60.0, 300.0
TARGET_CLAIM_RATIO = 1.5
TARGET_CONNECTIONS = 5
STAMP = 'printf "%s\\n" "$EPOCHREALTIME" > "$OUT/$DISPATCH_CARD_ID"'


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f}, {os.cpu_count()} cores"


def _config(out: Path, *, per_host: int) -> str:
    env = f"{{OUT: {json.dumps(str(out))}}}"
    return (
        "cluster:\n  host_id: '{host}'\n  heartbeat: 2s\n  lease_ttl: 10s\n"
        f"kanban:\n  max_in_progress: {3 * per_host}\n  max_in_progress_per_host: {per_host}\n"
        "  spawn_concurrency: 4\n  assignees:\n"
        f"    stamp:\n      command: [bash, -c, {json.dumps(STAMP)}]\n      env: {env}\n"
        "    quick:\n      command: [sh, -c, 'exit 0']\n"
    )


@contextmanager
def _server() -> Iterator[PostgresServer]:
    server = start_server()
    try:
        yield server
    finally:
        try:
            server.stop("immediate")
        finally:
            shutil.rmtree(server.root, ignore_errors=True)


class _Adder:
    """A process on "host" ``name`` (no serve) adding cards to the cluster board."""

    def __init__(self, rig: ClusterRig, root: Path, name: str) -> None:
        settings: Settings = load_config(next(iter(rig.hosts.values())).config).settings
        settings = dataclasses.replace(
            settings, cluster=dataclasses.replace(settings.cluster, host_id=name)
        )
        self.board = Workspace(
            settings,
            root / f"adder-{name}",
            environ={**os.environ, "DISPATCH_DATABASE_URL": rig.url},
        )

    def add(self, assignee: str, title: str = "card") -> str:
        return self.board.board.add(title, assignee=assignee, now=time.time())[0].id

    def close(self) -> None:
        self.board.close()


def _done(rig: ClusterRig) -> int:
    return int(rig.query("SELECT count(*) FROM kanban_cards WHERE status = 'done'")[0][0])  # type: ignore[call-overload]


def _stamped(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def _all_done(rig: ClusterRig, count: int) -> bool:
    return _done(rig) == count


def _latency(server: PostgresServer, root: Path, samples: int) -> list[Row]:
    out = root / "out"
    out.mkdir()
    rig = ClusterRig(root / "lat", server, ("b",), _config(out, per_host=8))
    try:
        rig.start()
        adder = _Adder(rig, root, "a")
        try:
            waits = []
            for i in range(samples + 3):  # three warm-up cards
                card = adder.add("stamp", f"c{i}")
                committed = time.time()
                stamp = out / card
                wait_for(partial(_stamped, stamp), timeout=30)
                wait_for(partial(_all_done, rig, i + 1), timeout=30, interval=0.01)
                if i >= 3:
                    waits.append((float(stamp.read_text()) - committed) * 1000)
        finally:
            adder.close()
    finally:
        rig.close()
    note = f"n={samples}, one card at a time, NOTIFY path only; {_load()}"
    p50, p99 = median(waits), percentile(waits, 99)
    return [
        Row(
            figure="card on host A -> worker running on host B p50",
            value=p50,
            unit="ms",
            target=f"<= {TARGET_P50_MS:g} ms",
            met=p50 <= TARGET_P50_MS,
            note=note,
        ),
        Row(
            figure="card on host A -> worker running on host B p99",
            value=p99,
            unit="ms",
            target=f"<= {TARGET_P99_MS:g} ms",
            met=p99 <= TARGET_P99_MS,
            note=note,
        ),
    ]


def _rate(
    server: PostgresServer, root: Path, names: tuple[str, ...], cards: int
) -> tuple[float, dict[str, int]]:
    rig = ClusterRig(root / f"rate{len(names)}", server, names, _config(root, per_host=16))
    peaks: dict[str, int] = {}
    stop = threading.Event()
    try:
        rig.start()
        adder = _Adder(rig, root, "adder")
        watcher = threading.Thread(target=_sample_hosts, args=(rig, names, peaks, stop))
        watcher.start()
        try:
            started = time.monotonic()
            for i in range(cards):
                adder.add("quick", f"r{i}")
            wait_for(lambda: _done(rig) == cards, timeout=600, interval=0.1)
            took = time.monotonic() - started
        finally:
            stop.set()
            watcher.join(10)
            adder.close()
    finally:
        rig.close()
    return cards / took, peaks


def _sample_hosts(
    rig: ClusterRig, names: tuple[str, ...], peaks: dict[str, int], stop: threading.Event
) -> None:
    """Most connections each host held at once (its pool's "dispatch HOST" plus its
    "dispatch-listen HOST")."""
    while not stop.is_set():
        now: dict[str, int] = {}
        for app, held in rig.query(
            "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = ? GROUP BY 1",
            (rig.database,),
        ):
            parts = str(app).split(" ", 1)
            if len(parts) == 2 and parts[1] in names:
                now[parts[1]] = now.get(parts[1], 0) + int(held)  # type: ignore[call-overload]
        for host, held in now.items():
            peaks[host] = max(peaks.get(host, 0), held)
        stop.wait(0.1)


def _rates(server: PostgresServer, root: Path, cards: int) -> list[Row]:
    one, _ = _rate(server, root, ("solo",), cards)
    three, peaks = _rate(server, root, ("a", "b", "c"), cards)
    note = f"n={cards} cards exiting at once, per-host cap 16; {_load()}"
    peak = max(peaks.values()) if peaks else None
    return [
        Row(figure="dispatch rate, 1 host", value=one, unit="cards/s", note=note),
        Row(
            figure="dispatch rate, 3 hosts on the same 2 cores",
            value=three,
            unit="cards/s",
            baseline=one,
            ratio=ratio(three, one),
            note=note,
        ),
        Row(
            figure="connections held per host (pool + LISTEN), peak",
            value=None if peak is None else float(peak),
            unit="connections",
            target=f"<= {TARGET_CONNECTIONS}",
            met=None if peak is None else peak <= TARGET_CONNECTIONS,
            note=f"pg_stat_activity every 0.1 s during the 3-host run: {peaks}",
        ),
    ]


def _board(server: PostgresServer, cards: int) -> str:
    from dispatcher.cluster.database import ClusterDB
    from dispatcher.cluster.hosts import Hosts

    url = server.url(server.create_database())
    with ClusterDB(url, pooled=False) as db:
        db.migrate()
        Hosts(db, lease_ttl=3600).join("bench", boot_id="bench", version="0")
        with db.write(None) as conn:
            conn.execute(
                "INSERT INTO kanban_cards (id, title, assignee, status, created_at, updated_at)"
                " SELECT 'c_' || lpad(to_hex(g), 10, '0'), 't', 'a', 'ready', g, g"
                " FROM generate_series(1, ?) g",
                (cards,),
            )
        with db.write(None) as conn:
            conn.execute("ANALYZE")
    return url


def _claims(server: PostgresServer, small: int, big: int, claims: int) -> list[Row]:
    from dispatcher.cluster.board import HostStamp, PgBoardStore
    from dispatcher.cluster.database import ClusterDB
    from dispatcher.kanban.model import Limits
    from dispatcher.launch.claimant import Claimant

    boards = {}
    for size in (small, big):
        db = ClusterDB(_board(server, size), max_size=1)
        boards[size] = (db, PgBoardStore(db, HostStamp(host_id="bench", epoch=1)))
    picks = random.Random(7).sample(range(1, small), claims)
    times: dict[int, list[float]] = {small: [], big: []}
    listing: dict[int, list[float]] = {small: [], big: []}
    unlimited = Limits(max_in_progress=10**6)
    me = Claimant.current()
    try:
        for _, store in boards.values():  # warm the pools and caches
            store.board_version()
        for pick in picks:
            card = "c_" + f"{pick:x}".rjust(10, "0")
            for size, (_, store) in boards.items():
                started = time.perf_counter()
                store.claim(card, now=1.0, claimer=me, limits=unlimited)
                times[size].append((time.perf_counter() - started) * 1000)
        for _ in range(3):
            for size, (_, store) in boards.items():
                started = time.perf_counter()
                store.ready_cards(limit=WALK_PAGE)
                listing[size].append((time.perf_counter() - started) * 1000)
    finally:
        for db, _ in boards.values():
            db.close()
    small_ms, big_ms = median(times[small]), median(times[big])
    note = f"n={claims} claims each, interleaved, pooled connection; {_load()}"
    return [
        Row(figure=f"claim at {small:,} ready cards", value=small_ms, unit="ms", note=note),
        Row(
            figure=f"claim at {big:,} ready cards",
            value=big_ms,
            unit="ms",
            baseline=small_ms,
            ratio=ratio(big_ms, small_ms),
            target=f"<= {TARGET_CLAIM_RATIO:g}x",
            met=big_ms / small_ms <= TARGET_CLAIM_RATIO,
            note=note,
        ),
        Row(
            figure=f"a tick's first page of ready cards at {big:,} ready cards",
            value=median(listing[big]),
            unit="ms",
            baseline=median(listing[small]),
            ratio=ratio(median(listing[big]), median(listing[small])),
            note=f"n=3; the walk reads {WALK_PAGE} cards a page and stops once the budget is full",
        ),
    ]


def run(quick: bool) -> list[Row]:
    """All four parts (rows without a value when PostgreSQL or systemd is missing)."""
    root = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    rows: list[Row] = []
    try:
        with _server() as server:
            rows += _claims(server, 1000, 20_000 if quick else 100_000, 50 if quick else 300)
            try:
                rows += _latency(server, root, 20 if quick else 200)
                rows += _rates(server, root, 60 if quick else 300)
            except (pytest.skip.Exception, pytest.fail.Exception) as exc:
                rows.append(Row(figure="multi-host parts", value=None, unit="-", note=str(exc)))
    except PostgresUnavailable as exc:
        rows.append(Row(figure="cluster", value=None, unit="-", note=f"no PostgreSQL: {exc}"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows
