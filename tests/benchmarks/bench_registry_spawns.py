"""Handle hygiene over many sessions: fds, threads and RSS after N spawn/exit cycles, with
keepers started fresh and through the fork server (its client is the launcher measured)."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from registry.abc import Owner, SpawnRequest
from registry.process import ForkServer, ProcessRegistry
from registry.settings import RegistrySettings
from registry.store.database import StateDB
from registry.store.tables import COMPONENT
from scope.fake import FakeScoper
from tests.benchmarks.common import Row, timer

NAME = "registry_spawns"
DESCRIPTION = (
    "fds, threads and RSS after 10,000 spawn/exit cycles (quick: 200), fresh keepers and "
    "through the fork server"
)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(quick: bool) -> list[Row]:
    """Spawn ``true`` and wait for it, N times; compare handles before and after."""
    count = 200 if quick else 10_000
    return [*_cycles(count, forked=False), *_cycles(count, forked=True)]


def _cycles(count: int, *, forked: bool) -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        server = ForkServer(cache_dir=state / "cache") if forked else None
        if server is not None and not server.open():
            raise RuntimeError("the fork server did not start")
        db = StateDB.in_dir(state, [COMPONENT])
        registry = ProcessRegistry(
            state_dir=state,
            db=db,
            scoper=FakeScoper(probe_ok=False),
            settings=RegistrySettings(max_sessions=100_000),
            starter=server,
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
            stats = server.stats() if server is not None else None
        finally:
            registry.close()
            db.close()
            if server is not None:
                server.close()
    if stats is not None and (stats.fallbacks or stats.forked != count + 1):
        raise RuntimeError(f"not every spawn went through the fork server: {stats}")
    per_spawn = t.elapsed / count * 1000
    how = ", through the fork server" if forked else ""
    return [
        Row(
            figure=f"open fds after {count} sessions{how}",
            value=fds1,
            unit="fds",
            baseline=fds0,
            target="= baseline",
            met=fds1 <= fds0,
        ),
        Row(
            figure=f"threads after{how}",
            value=threads1,
            unit="threads",
            baseline=threads0,
            target="= baseline",
            met=threads1 <= threads0,
        ),
        Row(
            figure=f"RSS after{how}",
            value=rss1,
            unit="MB",
            baseline=rss0,
            target="<= baseline + 2 MB" if forked else None,
            met=rss1 <= rss0 + 2 if forked else None,
            note="the launcher" + ("" if forked else "; its baseline is taken after one spawn"),
        ),
        Row(figure=f"spawn + wait{how}", value=per_spawn, unit="ms", note=f"mean over {count}"),
    ]
