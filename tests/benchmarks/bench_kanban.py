"""Kanban dispatch throughput with scoping, against a plain `systemd-run --user --scope true` loop.

N cards whose worker is `true` are added to a fresh board; one tick then claims, places (each
worker in its own transient scope through the user manager) and spawns all of them. The rate is
cards per second of that tick. The baseline is a shell-free loop of `systemd-run --user --scope
--quiet true`, N times, measured in the same run against the same manager. The time until the
board shows every card done (reconcile of the exit records) is reported too.

Both keeper start paths are measured, interleaved: the tick forks keepers from a fork server
(as ``dispatch kanban tick`` does when it may start many workers) or starts each as a fresh
interpreter (``registry.fork_server: false``), in rounds of N/2 cards each, in the order fresh,
forked, forked, fresh, with half the baseline loop before and half after.

Needs a systemd user manager: the host's, or a private one booted like the test suite does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from dispatcher.app.runtime import open_runtime
from dispatcher.config import parse_config
from dispatcher.kanban.model import CardStatus, NewCard
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.kanban.tick import KanbanDispatcher
from scope.abc import CallerKind
from tests.benchmarks.common import Row, ratio
from tests.support.systemd import ManagerUnavailable, SystemdManager, acquire_manager

NAME = "kanban"
DESCRIPTION = "kanban dispatch of N `true` cards with scoping vs a `systemd-run --scope true` loop"

TARGET = 0.8
"""Fresh keepers (the issue 6 target)."""
FORKED_TARGET = 2.0
"""Through the fork server (issue 26)."""


def _baseline(manager: SystemdManager, count: int) -> float:
    """Seconds for ``count`` sequential ``systemd-run --user --scope true``."""
    argv = ["systemd-run", "--user", "--scope", "--quiet", "--collect", "true"]
    subprocess.run(argv, env=manager.env, check=True, timeout=30)  # warm-up
    start = time.perf_counter()
    for _ in range(count):
        subprocess.run(
            argv,
            env=manager.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            check=True,
            timeout=30,
        )
    return time.perf_counter() - start


def _dispatch(
    manager: SystemdManager, count: int, *, forked: bool
) -> tuple[float, float, dict[str, int]]:
    """Seconds for one tick that dispatches ``count`` cards, seconds until all are done, and
    the placements used (``forked``: keepers from a fork server)."""
    base = Path(tempfile.mkdtemp(prefix="bench-kanban-"))
    try:
        settings = parse_config(
            f"kanban:\n  max_in_progress: {count + 1}\n"
            '  assignees:\n    t:\n      command: ["true"]\n',
            "bench-config.yaml",
        )
        state_dir = base / "state"
        runtime = open_runtime(
            settings, state_dir, manager.env, caller_kind=CallerKind.ONESHOT, fork_server=forked
        )
        try:
            store = SqliteBoardStore(runtime.db)
            now = time.time()
            for index in range(count):
                store.add_card(NewCard(title=f"card {index}", assignee="t"), now=now)
            dispatcher = KanbanDispatcher(
                store=store,
                registry=runtime.registry,
                settings=settings.kanban,
                state_dir=state_dir,
                caller=CallerKind.ONESHOT,
                environ=manager.env,
                scoper=runtime.scoper,
            )
            runtime.scoper.probe()  # the first probe is not part of dispatching
            start = time.perf_counter()
            report = dispatcher.tick(time.time())
            dispatched = time.perf_counter() - start
            placements: dict[str, int] = {}
            for item in report.dispatched:
                placements[item.placement] = placements.get(item.placement, 0) + 1
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                dispatcher.tick(time.time())
                counts = store.status_counts()
                if counts[CardStatus.DONE] + counts[CardStatus.BLOCKED] >= count:
                    break
                time.sleep(0.05)
            finished = time.perf_counter() - start
            done = store.status_counts()[CardStatus.DONE]
            if done != count:
                raise RuntimeError(f"only {done} of {count} cards finished")
            keepers = runtime.keeper_stats()
            if forked and (keepers is None or keepers["fallbacks"]):
                raise RuntimeError(f"keepers fell back from the fork server: {keepers}")
            return dispatched, finished, placements
        finally:
            runtime.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


class _Path:
    """Totals of one start path over its rounds."""

    def __init__(self) -> None:
        self.cards = 0
        self.dispatched = 0.0
        self.finished = 0.0
        self.placements: dict[str, int] = {}

    def add(self, count: int, result: tuple[float, float, dict[str, int]]) -> None:
        dispatched, finished, placements = result
        self.cards += count
        self.dispatched += dispatched
        self.finished += finished
        for key, value in placements.items():
            self.placements[key] = self.placements.get(key, 0) + value


def run(quick: bool) -> list[Row]:
    """Rates in cards (or scopes) per second; the ratio is against the systemd-run loop."""
    count = 30 if quick else 1000
    half = count // 2
    try:
        manager = acquire_manager(dict(os.environ))
    except ManagerUnavailable as exc:
        note = f"no systemd user manager: {exc.reason.splitlines()[0]}"
        return [Row(figure="kanban dispatch rate", value=None, unit="cards/s", note=note)]
    fresh, forked = _Path(), _Path()
    try:
        base_seconds = _baseline(manager, half)
        for path in (fresh, forked, forked, fresh):
            path.add(half, _dispatch(manager, half, forked=path is forked))
        base_seconds += _baseline(manager, count - half)
    finally:
        manager.close()
    base_rate = count / base_seconds
    return [
        Row(
            figure="systemd-run --user --scope true loop",
            value=base_rate,
            unit="scopes/s",
            note=f"n={count} (half before, half after), {base_seconds * 1000 / count:.1f} ms each",
        ),
        *_path_rows(fresh, base_rate, "", TARGET),
        *_path_rows(forked, base_rate, ", fork server", FORKED_TARGET),
    ]


def _path_rows(path: _Path, base_rate: float, how: str, target: float) -> list[Row]:
    rate = path.cards / path.dispatched
    placed = ", ".join(f"{k}={v}" for k, v in sorted(path.placements.items()))
    measured = ratio(rate, base_rate)
    return [
        Row(
            figure=f"kanban dispatch rate (one tick, scoped{how})",
            value=rate,
            unit="cards/s",
            baseline=base_rate,
            ratio=measured,
            target=f">= {target}x",
            met=None if measured is None else measured >= target,
            note=f"n={path.cards} in 2 ticks (interleaved), "
            f"{path.dispatched * 1000 / path.cards:.1f} ms per card; placements {placed}",
        ),
        Row(
            figure=f"kanban rate until all done{how}",
            value=path.cards / path.finished,
            unit="cards/s",
            baseline=base_rate,
            ratio=ratio(path.cards / path.finished, base_rate),
            note=f"n={path.cards}, includes reconciling {path.cards} exit records",
        ),
    ]
