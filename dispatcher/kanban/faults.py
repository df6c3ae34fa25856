"""Fault injection for crash tests: SIGKILL this process at a named step of a dispatch.

``DISPATCH_KANBAN_FAULT=STEP`` (read from the environment the CLI was given, never at import)
makes the dispatcher kill itself with SIGKILL when it reaches STEP for the first time. It exists
so tests can prove that a dispatcher dying at any point between claim and recorded spawn leaves
no card stuck in ``running`` without a live keeper and never two live workers for one card.
Harmless in production: unset, it does nothing; set, it can only kill the process that reads it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

ENV_FAULT = "DISPATCH_KANBAN_FAULT"

STEPS = ("claimed", "prepared", "spawned", "recorded")
"""In order: the claim committed; the body file written and the request built (not spawned);
the registry returned a session that is not recorded on the run yet; the spawn recorded."""


class FaultPoint:
    """Kill the process at ``step`` (None: never)."""

    def __init__(self, step: str | None = None) -> None:
        if step is not None and step not in STEPS:
            raise ValueError(f"unknown fault step {step!r}; one of {', '.join(STEPS)}")
        self.step = step

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> FaultPoint:
        """The fault named by ``DISPATCH_KANBAN_FAULT`` (unknown names are ignored)."""
        step = environ.get(ENV_FAULT) or None
        return cls(step if step in STEPS else None)

    def reach(self, step: str) -> None:
        """Called by the dispatcher at each step."""
        if self.step is not None and step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
