"""Adoption after a restart: a fresh registry re-attaches to N live sessions.

N sessions (``sleep``) are started by one registry instance without following them; a second
instance on the same state dir then runs ``adopt()`` (identity checks, pidfds, log offsets)
and is timed. The workers are stopped afterwards.
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

from registry.abc import Owner, SpawnRequest
from registry.proc.identity import Identity, send
from registry.process import ProcessRegistry
from registry.settings import RegistrySettings
from registry.store.database import StateDB
from registry.store.tables import COMPONENT
from scope.fake import FakeScoper
from tests.benchmarks.common import Row, timer

NAME = "registry_adopt"
DESCRIPTION = "adoption time for 500 live sessions (target <= 2 s)"


def _open(state: Path, follow: bool) -> tuple[StateDB, ProcessRegistry]:
    db = StateDB.in_dir(state, [COMPONENT])
    registry = ProcessRegistry(
        state_dir=state,
        db=db,
        scoper=FakeScoper(probe_ok=False),
        settings=RegistrySettings(),
        follow=follow,
    )
    return db, registry


def run(quick: bool) -> list[Row]:
    """Time one adopt() over N running sessions."""
    count = 20 if quick else 500
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        db, launcher = _open(state, follow=False)
        sessions = []
        try:
            for i in range(count):
                sessions.append(
                    launcher.spawn(
                        SpawnRequest(
                            argv=["sleep", "600"],
                            cwd="/",
                            env={"PATH": os.defpath},
                            owner=Owner(kind="bench", id=str(i)),
                        )
                    )
                )
            db2, fresh = _open(state, follow=True)
            try:
                with timer() as t:
                    adopted = fresh.adopt()
            finally:
                fresh.close()
                db2.close()
        finally:
            for s in sessions:
                if s.worker_pid and s.worker_start:
                    send(Identity(pid=s.worker_pid, start=s.worker_start), signal.SIGKILL)
            for s in sessions:
                child = launcher.tracking.child(s.id)
                if child is not None:
                    child.wait(timeout=30)
            launcher.close()
            db.close()
    if len(adopted) != count:
        raise RuntimeError(f"adopted {len(adopted)} of {count} sessions")
    return [
        Row(
            figure=f"adopt() of {count} live sessions",
            value=t.elapsed,
            unit="s",
            target="<= 2 s" if count >= 500 else None,
            met=t.elapsed <= 2 if count >= 500 else None,
            note="quick mode: fewer sessions" if quick else "",
        )
    ]
