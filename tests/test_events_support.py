"""Shared pieces of the event tests: registries with an injected clock, small helpers.

No tests live here; the other test_events_* modules import from it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from registry.abc import Event, EventType
from registry.output.hooks import OutputHooks
from registry.process import ProcessRegistry
from scope.foundation.clock import FakeClock
from tests.support.wait import wait_for
from tests.test_registry_support import open_registry

# A worker that prints each line it reads (so a test decides when output appears) and exits
# on a line "quit".
ECHO = [
    "sh",
    "-c",
    'while read -r line; do [ "$line" = quit ] && exit 0; printf "%s\\n" "$line"; done',
]


def fake_clock() -> FakeClock:
    """A fake clock that starts at the real wall time (keepers write real times)."""
    return FakeClock(start=time.time())


@contextmanager
def registry_at(
    state_dir: Path,
    clock: FakeClock | None = None,
    *,
    follow: bool = True,
    cleanup: bool = True,
    hooks: OutputHooks | None = None,
    **overrides: object,
) -> Iterator[ProcessRegistry]:
    """A ProcessRegistry on ``state_dir`` with its own database connection and clock."""
    with open_registry(
        state_dir, follow=follow, cleanup=cleanup, clock=clock, hooks=hooks, **overrides
    ) as registry:
        yield registry


def of_type(registry: ProcessRegistry, session_id: str, kind: EventType) -> list[Event]:
    """A session's events of one type (acknowledged ones too), oldest first."""
    return [e for e in registry.events(session_id=session_id, include_acked=True) if e.type is kind]


def wait_log(registry: ProcessRegistry, session_id: str, expected: bytes) -> None:
    """Wait until the session's log is exactly ``expected``."""
    wait_for(lambda: registry.read_log(session_id) == expected, 5, what=f"log {expected!r}")


def wait_seen(registry: ProcessRegistry, session_id: str, ending: str) -> None:
    """Wait until the registry's own view of the output ends with ``ending`` (a poll makes a
    following registry read the log, so watch matching has seen it too)."""
    wait_for(
        lambda: registry.poll(session_id).output.endswith(ending), 5, what=f"output {ending!r}"
    )
