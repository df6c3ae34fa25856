"""CPU the registry's follower thread spends while a worker writes 10 MB/s.

A paced worker writes 64 KiB every 6.25 ms for a few seconds; the benchmark process follows it
(tail, counters, UTF-8 decoding) and waits. Its own CPU time over the wall time is the figure
(the main thread only sleeps in ``wait``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from registry.abc import Owner, SpawnRequest
from registry.process import ProcessRegistry
from registry.settings import RegistrySettings
from registry.store.database import StateDB
from registry.store.tables import COMPONENT
from scope.fake import FakeScoper
from tests.benchmarks.common import Row

NAME = "registry_follower"
DESCRIPTION = "follower CPU while a worker writes 10 MB/s (target <= 5% of a core)"

WRITER = """
import os, sys, time
chunk = (b"log line with some text 0123456789\\n" * 2000)[:65536]
seconds = float(sys.argv[1])
period = len(chunk) / 10e6
start = time.monotonic()
n = 0
while time.monotonic() - start < seconds:
    os.write(1, chunk)
    n += 1
    delay = start + n * period - time.monotonic()
    if delay > 0:
        time.sleep(delay)
"""


def run(quick: bool) -> list[Row]:
    """CPU share of this process while following one 10 MB/s worker."""
    seconds = 2.0 if quick else 10.0
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        db = StateDB.in_dir(state, [COMPONENT])
        registry = ProcessRegistry(
            state_dir=state,
            db=db,
            scoper=FakeScoper(probe_ok=False),
            settings=RegistrySettings(max_log_bytes=1 << 40),
        )
        try:
            session = registry.spawn(
                SpawnRequest(
                    argv=[sys.executable, "-c", WRITER, str(seconds)],
                    cwd="/",
                    env=dict(os.environ),
                    owner=Owner(kind="bench", id="follower"),
                )
            )
            cpu0, wall0 = time.process_time(), time.monotonic()
            result = registry.wait(session.id, timeout=seconds + 30)
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            done = result.snapshot.session
        finally:
            registry.close()
            db.close()
    rate = done.total_bytes / wall / 1e6
    share = cpu / wall * 100
    return [
        Row(
            figure="follower CPU at ~10 MB/s",
            value=share,
            unit="% core",
            target="<= 5%",
            met=share <= 5,
            note=f"{done.total_bytes / 1e6:.0f} MB in {wall:.1f} s ({rate:.1f} MB/s)",
        )
    ]
