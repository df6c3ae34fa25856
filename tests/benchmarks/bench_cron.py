"""Cron lateness with the real scheduler, APScheduler wake-ups and the real process registry.

(a) *spread*: N jobs ``every: P`` at N different phases (``offset``), so a fire is due every P/N
seconds. Figure: lateness from the nominal instant to the worker's start (the keeper's record),
p50/p99. Baseline, computed from the same nominal instants: the loop this replaces woke once
every 60 s, so a fire waited until the next minute boundary.

(b) *burst*: N jobs all due at the same second. Figures: lateness from the nominal instant to the
committed ledger decision rows (p50/p99), and the time until the last worker started (drain),
against N times the median cost of one bare registry spawn (a fresh keeper, one at a time)
measured in the same run. The burst runs twice: keepers forked by a fork server, as in
``dispatch serve``, then started fresh (``registry.fork_server: false``).

Full mode: N = 1000 (P = 60 s for the spread). Quick mode: N = 40, P = 4 s, burst of 40.
Workers run ``true`` without systemd (placement ``in_process``), so the figures are the
scheduler's and the registry's own cost; the spread forks keepers from a fork server, as
serve does. The machine's load is printed with every row.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatcher.app.runtime import Runtime, open_runtime
from dispatcher.cron.ledger import Ledger
from dispatcher.cron.records import FireRecord
from dispatcher.cron.scheduler import CronScheduler, TickReport
from dispatcher.cron.settings import CronJob, CronSettings, OverlapPolicy
from dispatcher.cron.waker import CronWaker
from dispatcher.cron.zones import fixed_zone
from dispatcher.settings import Settings
from registry.abc import Owner, SpawnRequest
from scope.abc import CallerKind
from tests.benchmarks.common import Row, median, percentile, ratio

NAME = "cron"
DESCRIPTION = "cron fire lateness: 1,000 jobs spread over a minute, and a burst due at once"

TARGET_MS = 100.0


def _env(root: Path) -> dict[str, str]:
    runtime_dir = root / "run"
    runtime_dir.mkdir(mode=0o700)
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(root),
        "XDG_RUNTIME_DIR": str(runtime_dir),
        "DBUS_SESSION_BUS_ADDRESS": f"unix:path={runtime_dir}/bus",
    }


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f}, {os.cpu_count()} cores"


class _Setup:
    """A temporary state dir, a runtime and a scheduler with ``jobs``."""

    def __init__(self, jobs: list[CronJob], *, forked: bool = True) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="bench-cron-"))
        self.env = _env(self.root)
        settings = Settings(cron=CronSettings(jobs=tuple(jobs), max_concurrent=len(jobs) + 1))
        self.runtime: Runtime = open_runtime(
            settings,
            self.root / "state",
            self.env,
            caller_kind=CallerKind.CRON,
            follow=True,
            fork_server=forked,
        )
        self.scheduler = CronScheduler(
            settings.cron,
            self.runtime.registry,
            self.runtime.db,
            environ=self.env,
            state_dir=self.root,
            zone_resolver=fixed_zone("UTC"),
        )
        self.waker = CronWaker(self.scheduler)
        self.ledger = Ledger(self.runtime.db)
        self.reports: list[TickReport] = []
        real_tick: Callable[..., TickReport] = self.scheduler.tick

        def recording_tick(now: float | None = None) -> TickReport:
            report = real_tick(now)
            self.reports.append(report)
            return report

        self.scheduler.tick = recording_tick  # type: ignore[method-assign]

    def started_rows(self) -> list[FireRecord]:
        return [r for r in self.ledger.history(limit=100_000) if r.session_id]

    def wait_started(self, count: int, deadline: float) -> list[FireRecord]:
        rows = self.started_rows()
        while len(rows) < count and time.monotonic() < deadline:
            time.sleep(0.1)
            rows = self.started_rows()
        return rows

    def started_at(self, row: FireRecord) -> float | None:
        return self.runtime.registry.get(row.session_id or "").started_at

    def close(self) -> None:
        self.waker.stop()
        deadline = time.monotonic() + 60
        while self.runtime.registry.list_sessions() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.runtime.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _ms_row(figure: str, values: list[float], pct: float, **extra: Any) -> Row:
    value = percentile(values, pct) * 1000
    baseline = extra.pop("baseline", None)
    target = extra.pop("target", None)
    return Row(
        figure=figure,
        value=value,
        unit="ms",
        baseline=baseline,
        ratio=ratio(value, baseline),
        target=target,
        met=None if target is None else value < TARGET_MS,
        note=extra.pop("note", ""),
    )


def _spread(quick: bool) -> list[Row]:
    count, period = (40, 4.0) if quick else (1000, 60.0)
    return spread_rows(count, period)


def spread_rows(count: int, period: float) -> list[Row]:
    """The spread scenario with ``count`` jobs over ``period`` seconds."""
    first = math.ceil(time.time()) + 2.0
    jobs = [
        CronJob(
            id=f"s{i}",
            every=period,
            offset=(first + i * period / count) % period,
            command=("true",),
            overlap=OverlapPolicy.ALLOW,
        )
        for i in range(count)
    ]
    setup = _Setup(jobs)
    try:
        setup.waker.start()
        rows = setup.wait_started(count, time.monotonic() + period + 60)
        setup.waker.stop()
        by_job: dict[str, FireRecord] = {}
        for row in sorted(rows, key=lambda r: r.nominal):
            by_job.setdefault(row.job_id, row)
        late = []
        for row in by_job.values():
            started = setup.started_at(row)
            if started is not None:
                late.append(started - row.nominal)
        anchor = [(-row.nominal) % 60.0 for row in by_job.values()]
        committed = {r.id: rep.committed for rep in setup.reports for r in rep.decided}
        decided = [
            (committed[row.id] or 0.0) - row.nominal
            for row in by_job.values()
            if committed.get(row.id) is not None
        ]
    finally:
        setup.close()
    if not late:
        return [
            Row(
                figure="spread: lateness to worker start",
                value=None,
                unit="ms",
                note="no fire started",
            )
        ]
    note = f"n={len(late)} fires, one every {period / count * 1000:.0f} ms; {_load()}"
    rows_out = [
        _ms_row(
            "spread: lateness to worker start p50",
            late,
            50,
            baseline=percentile(anchor, 50) * 1000,
            note=note,
        ),
        _ms_row(
            "spread: lateness to worker start p99",
            late,
            99,
            baseline=percentile(anchor, 99) * 1000,
            target="p99 < 100 ms",
            note=note,
        ),
    ]
    if decided:
        rows_out.append(
            _ms_row(
                "spread: lateness to decision row p99",
                decided,
                99,
                note="the scheduler's own part; the rest is the registry's spawn",
            )
        )
    return rows_out


def _spawn_cost(setup: _Setup, repeat: int) -> float:
    """Median seconds of one registry spawn of ``true`` (the drain baseline's unit)."""
    samples = []
    for i in range(repeat):
        start = time.perf_counter()
        setup.runtime.registry.spawn(
            SpawnRequest(
                argv=["true"],
                cwd=str(setup.root),
                env=setup.env,
                owner=Owner(kind="bench", id=str(i)),
                caller=CallerKind.CRON,
            )
        )
        samples.append(time.perf_counter() - start)
    return median(samples)


def _burst(quick: bool) -> list[Row]:
    count = 40 if quick else 1000
    fresh = _one_burst(count, forked=False)
    forked = _one_burst(count, forked=True)
    baseline = count * fresh.per_spawn * 1000
    out = []
    if forked.decided:
        out += [
            _ms_row("burst: lateness to decision row p50", forked.decided, 50, note=forked.note),
            _ms_row(
                "burst: lateness to decision row p99",
                forked.decided,
                99,
                target="p99 < 100 ms",
                note=forked.note,
            ),
        ]
    spawns = f"baseline = {count} x {fresh.per_spawn * 1000:.1f} ms median bare spawn"
    for result, how, target in ((fresh, ", fresh keepers", None), (forked, ", fork server", 0.35)):
        value = None if result.drain is None else result.drain * 1000
        measured = ratio(value, baseline)
        out.append(
            Row(
                figure=f"burst: drain (last worker start){how}",
                value=value,
                unit="ms",
                baseline=baseline,
                ratio=measured,
                target=None if target is None else f"<= {target}x",
                met=None if target is None or measured is None else measured <= target,
                note=f"{spawns}; {result.note}",
            )
        )
    return out


@dataclass(frozen=True, kw_only=True)
class _Burst:
    per_spawn: float
    """Median seconds of one registry spawn of ``true`` on this setup."""
    decided: list[float]
    drain: float | None
    note: str


def _one_burst(count: int, *, forked: bool) -> _Burst:
    due = math.ceil(time.time()) + 3.0
    jobs = [
        CronJob(id=f"b{i}", every=60.0, offset=due % 60.0, command=("true",)) for i in range(count)
    ]
    setup = _Setup(jobs, forked=forked)
    try:
        per_spawn = _spawn_cost(setup, 5 if count < 100 else 20)
        setup.waker.start()
        rows = setup.wait_started(count, time.monotonic() + 10 + count * per_spawn * 4)
        setup.waker.stop()
        committed = {r.id: rep.committed for rep in setup.reports for r in rep.decided}
        decided = [
            committed[r.id] - r.nominal
            for r in rows
            if r.nominal == due and committed.get(r.id) is not None
        ]
        burst = [rep for rep in setup.reports if any(r.nominal == due for r in rep.decided)]
        woke = [rep.now - due for rep in burst]
        transaction = [(rep.committed or rep.now) - rep.now for rep in burst]
        starts = [setup.started_at(r) for r in rows if r.nominal == due]
        drain = max(s for s in starts if s is not None) - due if starts else None
        keepers = setup.runtime.keeper_stats()
    finally:
        setup.close()
    if forked and (keepers is None or keepers["fallbacks"]):
        raise RuntimeError(f"keepers fell back from the fork server: {keepers}")
    parts = ""
    if woke:
        parts = (
            f"; tick woke {woke[0] * 1000:.1f} ms late, decisions took "
            f"{transaction[0] * 1000:.1f} ms"
        )
    note = f"n={len(decided)} due at once{parts}; {_load()}"
    return _Burst(per_spawn=per_spawn, decided=decided, drain=drain, note=note)


def run(quick: bool) -> list[Row]:
    """Both scenarios (see the module docstring)."""
    return [*_spread(quick), *_burst(quick)]
