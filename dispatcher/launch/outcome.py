"""The one outcome vocabulary of runs and fires, and how a finished session maps onto it.

:class:`Outcome` holds every value of the shared vocabulary (``ARCHITECTURE.md``): cron ledger
rows and kanban runs store members of this one enum. Which members a policy ever records is
the policy's business: :data:`CRON_DECISIONS` are cron's alone (decisions about a fire that
never became a worker), ``tempfail``/``config_error``/``reclaimed`` matter most to the board,
and the rest (a worker's end, a refused spawn) mean the same whoever launched the worker.

:func:`outcome_of` is the single reading of a finished session: exit 0 is ``completed``, 75
(EX_TEMPFAIL) ``tempfail``, 78 (EX_CONFIG) ``config_error``, SIGKILL with an OOM kill counted
in the worker's own scope (and no kill by the registry) ``oom_killed``, any other exit or a signal
``failed``; the session states ``timed_out``, ``lost`` and ``failed_start`` carry over.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dispatcher.launch.outbox import Tail
    from registry.abc import Session

__all__ = [
    "CRON_DECISIONS",
    "EX_CONFIG",
    "EX_TEMPFAIL",
    "Outcome",
    "Result",
    "outcome_of",
]

EX_TEMPFAIL = 75
"""sysexits.h: temporary failure, try again later."""
EX_CONFIG = 78
"""sysexits.h: configuration error; retrying cannot help."""


class Outcome(enum.StrEnum):
    """How a run or a fire ended (the shared vocabulary; stored and printed as its value)."""

    COMPLETED = "completed"
    """The worker exited 0."""
    FAILED = "failed"
    """A non-zero exit (other than 75 and 78) or a signal."""
    TIMED_OUT = "timed_out"
    LOST = "lost"
    """The keeper vanished without an exit record, or the host's lease was taken over."""
    FAILED_START = "failed_start"
    """The worker could not be started (no such program, exec refused, ...)."""
    SPAWN_REFUSED = "spawn_refused"
    """No placement could be made (no scope, the host out of resources): infrastructure."""
    TEMPFAIL = "tempfail"
    """Exit 75: try again later."""
    CONFIG_ERROR = "config_error"
    """Exit 78, or a worker definition that cannot be used as configured."""
    RECLAIMED = "reclaimed"
    """The claim was taken back before any worker started (its claimant died)."""
    REPLACED = "replaced"
    """A newer fire or an operator replaced this one."""
    DEFERRED = "deferred"
    """The worker chose its own delay (``kanban defer``): not counted, tried again then."""
    SKIPPED_OVERLAP = "skipped_overlap"
    MISSED = "missed"
    COALESCED = "coalesced"
    QUEUED = "queued"
    OOM_KILLED = "oom_killed"
    """The kernel's OOM killer ended the worker at its scope's memory_max (counted)."""


CRON_DECISIONS = frozenset(
    {Outcome.SKIPPED_OVERLAP, Outcome.MISSED, Outcome.COALESCED, Outcome.QUEUED}
)
"""Cron-only decisions: a fire that was never meant to become a worker."""


@dataclass(frozen=True, kw_only=True)
class Result:
    """How one launch ended, as the launch core determined it."""

    outcome: Outcome
    exit_code: int | None = None
    signal: str | None = None
    error: str | None = None
    """Why, in words, for anything but a success."""
    infrastructure: bool = False
    """Not the worker's fault (no scope, the host out of resources, the host lost its lease,
    a degraded worker taken down by its gateway): never counted against a card or a job."""
    session_id: str | None = None
    output: Tail | None = None
    """The end of the worker's output for the messages the settle writes (read before its
    transaction, :meth:`~dispatcher.launch.outbox.Outbox.tail`); never stored on the run."""


def outcome_of(session: Session) -> Result:
    """Classify a finished session (raises ValueError for one still running)."""
    # Imported here: the board's vocabulary (which imports this module) is read by commands
    # that never see a session, and the registry's records cost start-up time.
    from registry.abc import SessionState
    from registry.usage import oom_reason

    state = session.state
    reason = session.completion_reason
    if state is SessionState.RUNNING:
        raise ValueError(f"session {session.id} is still running")
    seen = Result(
        outcome=Outcome.COMPLETED,
        exit_code=session.exit_code,
        signal=session.signal,
        session_id=session.id,
    )
    if state is SessionState.FAILED_START:
        return replace(
            seen, outcome=Outcome.FAILED_START, error=reason or "the worker could not start"
        )
    if state is SessionState.TIMED_OUT:
        after = f" after {session.timeout:g} s" if session.timeout else ""
        return replace(seen, outcome=Outcome.TIMED_OUT, error=reason or f"timed out{after}")
    if state is SessionState.LOST:
        text = reason or "the keeper vanished without an exit record"
        return replace(seen, outcome=Outcome.LOST, error=text)
    oom = oom_reason(
        exited=state is SessionState.EXITED,
        signal=session.signal,
        exit_code=session.exit_code,
        usage=session.usage,
    )
    if oom is not None:
        return replace(seen, outcome=Outcome.OOM_KILLED, error=oom)
    if session.signal is not None or state is SessionState.KILLED:
        text = reason or (f"killed by {session.signal}" if session.signal else "killed")
        return replace(seen, outcome=Outcome.FAILED, error=text)
    code = session.exit_code
    if code == 0:
        return seen
    if code == EX_TEMPFAIL:
        return replace(
            seen, outcome=Outcome.TEMPFAIL, error="exited with code 75 (temporary failure)"
        )
    if code == EX_CONFIG:
        return replace(
            seen, outcome=Outcome.CONFIG_ERROR, error="exited with code 78 (configuration error)"
        )
    return replace(seen, outcome=Outcome.FAILED, error=reason or f"exited with code {code}")
