"""Handle hygiene over many sessions: fds, threads and RSS after N spawn/exit cycles."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from registry.abc import Owner, SpawnRequest
from registry.process import ProcessRegistry
from registry.settings import RegistrySettings
from registry.store.database import StateDB
from registry.store.tables import COMPONENT
from scope.fake import FakeScoper
from tests.benchmarks.common import Row, timer

NAME = "registry_spawns"
DESCRIPTION = "fds, threads and RSS after 10,000 spawn/exit cycles (quick: 200)"


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(quick: bool) -> list[Row]:
    """Spawn ``true`` and wait for it, N times; compare handles before and after."""
    count = 200 if quick else 10_000
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        db = StateDB.in_dir(state, [COMPONENT])
        registry = ProcessRegistry(
            state_dir=state,
            db=db,
            scoper=FakeScoper(probe_ok=False),
            settings=RegistrySettings(max_sessions=100_000),
        )
        try:
            # One cycle first so lazily created handles (the follower thread) are in the baseline.
            warm = registry.spawn(
                SpawnRequest(argv=["true"], cwd="/", env={}, owner=Owner(kind="bench", id="w"))
            )
            registry.wait(warm.id, timeout=30)
            fds0 = len(os.listdir("/proc/self/fd"))
            threads0 = threading.active_count()
            rss0 = _rss_mb()
            with timer() as t:
                for i in range(count):
                    s = registry.spawn(
                        SpawnRequest(
                            argv=["true"], cwd="/", env={}, owner=Owner(kind="bench", id=str(i))
                        )
                    )
                    registry.wait(s.id, timeout=30)
            fds1 = len(os.listdir("/proc/self/fd"))
            threads1 = threading.active_count()
            rss1 = _rss_mb()
        finally:
            registry.close()
            db.close()
    per_spawn = t.elapsed / count * 1000
    return [
        Row(
            figure=f"open fds after {count} sessions",
            value=fds1,
            unit="fds",
            baseline=fds0,
            target="= baseline",
            met=fds1 <= fds0,
        ),
        Row(
            figure="threads after",
            value=threads1,
            unit="threads",
            baseline=threads0,
            target="= baseline",
            met=threads1 <= threads0,
        ),
        Row(figure="RSS after", value=rss1, unit="MB", baseline=rss0, note="the launcher"),
        Row(figure="spawn + wait", value=per_spawn, unit="ms", note=f"mean over {count}"),
    ]
