"""A cron worker chooses when its fire's next try starts: ``dispatch kanban defer`` inside it.

The worker finds its fire from its environment alone (``DISPATCH_FIRE_KEY``, its own
``DISPATCH_SESSION_ID``), as a kanban worker finds its run, so a broken or changed config never
stops it. The deferral is stored on the fire's row while the try runs
(:meth:`~dispatcher.cron.abc.LedgerStore.defer`); when the try ends, the fire runner makes it a
``deferred`` try (not counted) and the fire waits for that time. A fire takes a deferral only
while it has a retry window: a retry policy (the row's ``attempts``) and a try in progress,
this worker's.
"""

from __future__ import annotations

from dispatcher.cron.abc import LedgerStore
from dispatcher.cron.errors import DeferRefused
from dispatcher.cron.records import FireRecord, Status
from scope.foundation.errors import NotFoundError
from scope.foundation.text import strip_blanks, unsafe_char

__all__ = ["MAX_REASON", "defer_fire"]

MAX_REASON = 4096
"""Characters of a deferral's reason (it is shown on one line)."""


def defer_fire(
    ledger: LedgerStore,
    fire_key: str,
    *,
    session_id: str | None,
    until: float,
    reason: str,
    now: float,
) -> FireRecord:
    """Store the worker's deferral on its fire (see the module docstring); the row as it is
    now. :class:`DeferRefused` or :class:`NotFoundError` (exit 2) change nothing."""
    text = strip_blanks(reason) or None
    if text is not None:
        bad = unsafe_char(text)
        if len(text) > MAX_REASON or bad is not None:
            problem = f"contains {bad}" if bad else f"longer than {MAX_REASON} characters"
            raise DeferRefused(fire_key, f"--reason {problem}; give one line of text")
    if until <= now:
        raise DeferRefused(fire_key, "the time must be in the future")
    if ledger.defer(fire_key, session_id=session_id, until=until, reason=text):
        row = ledger.by_key(fire_key)
        assert row is not None
        return row
    row = ledger.by_key(fire_key)
    if row is None:
        raise NotFoundError("cron fire", fire_key)
    if row.attempts is None:
        raise DeferRefused(
            fire_key,
            "it has no retry policy (one try): nothing was changed",
            remedy=f"give job {row.job_id} a retry policy (its retry:, or cron.retry) to let its "
            "worker defer",
        )
    if row.status not in (Status.SPAWNING, Status.RUNNING):
        raise DeferRefused(
            fire_key, f"no try is in progress ({row.shown_outcome}); nothing was changed"
        )
    raise DeferRefused(
        fire_key,
        f"another try's worker runs now (session {row.session_id}); nothing was changed",
    )
