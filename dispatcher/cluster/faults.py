"""Crash points of the cluster protocols, driven by tests: ``DISPATCH_CLUSTER_FAULT=STEP``.

Like ``DISPATCH_KANBAN_FAULT`` (:mod:`dispatcher.kanban.faults`), the process that reads the
variable kills itself with SIGKILL the first time it reaches STEP, so a test can prove that a
serve dying at any step of a join, a claim, a rescue or a supersede leaves nothing half done:
every step below is inside a transaction (which the server rolls back) or between two steps
that are each safe to repeat. Unset, it does nothing.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

ENV_CLUSTER_FAULT = "DISPATCH_CLUSTER_FAULT"

CLUSTER_STEPS = {
    "joined": "the join committed; the stale runs of an older epoch are not rescued yet",
    "claim_counted": "inside a claim: the card is locked and the budget counted, not written",
    "rescue_taken": "inside a rescue: the epoch is bumped, the runs are not closed yet",
    "superseded": "foreign workers were killed; the host has not rejoined yet",
}


class ClusterFault:
    """SIGKILL this process at ``step`` (None: never)."""

    def __init__(self, step: str | None = None) -> None:
        if step is not None and step not in CLUSTER_STEPS:
            raise ValueError(f"unknown cluster fault step {step!r}; one of {sorted(CLUSTER_STEPS)}")
        self.step = step

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ClusterFault:
        """The step named by ``DISPATCH_CLUSTER_FAULT`` (an unknown name means none)."""
        wanted = environ.get(ENV_CLUSTER_FAULT)
        return cls(wanted if wanted in CLUSTER_STEPS else None)

    def reach(self, step: str) -> None:
        """Called at each crash point."""
        if step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
