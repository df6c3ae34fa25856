"""Held fires: a fire that is due but held back by something outside its job.

Today a full named limit holds fires back; the admission policy (memory pressure) is meant to
reuse the same piece. A :class:`Hold` says why a fire cannot start now: the line its row shows
while it waits (``waiting: limit openai (6 of 6 running)``), the reason it records if it never
starts (``limit openai``, ``memory pressure 34 %``) and when asking again is worth it.

:func:`decide` is the policy, a pure function: a held fire stays ``queued`` (its row claimed,
not started) until its *start deadline*, its due time plus the job's ``start_deadline``; then
it is settled ``missed`` with the hold's reason. Never dropped silently: every held fire either
starts (when :class:`HeldFires`'s caller finds a slot at a later step) or ends ``missed``.
:class:`HeldFires` applies it to the ledger: it writes the wait on the row once (and again
only when it changes) and settles the misses through the runner, so the ``cron.missed``
notification and the history say why.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from dispatcher.cron.abc import LedgerStore
from dispatcher.cron.changes import FireChange
from dispatcher.cron.firing import FireRunner
from dispatcher.cron.records import WAITING, FireRecord, Status
from dispatcher.cron.settings import CronJob
from dispatcher.launch.limits import LimitWait
from dispatcher.launch.outcome import Outcome, Result

__all__ = ["HELD_POLL", "Decision", "HeldFires", "Hold", "Verdict", "decide"]

HELD_POLL = 5.0
"""Seconds between looks at a fire held by something that does not say when it frees (a
concurrency slot ends whenever a run ends; a finished cron worker wakes the scheduler anyway)."""


@dataclass(frozen=True, kw_only=True)
class Hold:
    """Why a due fire cannot start now (see the module docstring)."""

    reason: str
    """What a miss records: ``limit openai``."""
    detail: str
    """What the row shows while it waits: ``limit openai (6 of 6 running)``."""
    retry_at: float | None = None
    """When the hold may end by itself (a rate window); None: unknown."""

    @classmethod
    def of_limit(cls, wait: LimitWait, now: float) -> Hold:
        """The hold of a full named limit."""
        return cls(reason=wait.reason, detail=wait.describe(now), retry_at=wait.next_start)


class Verdict(enum.StrEnum):
    """What becomes of a held fire now."""

    WAIT = "wait"
    MISS = "miss"


@dataclass(frozen=True, kw_only=True)
class Decision:
    """A verdict and, for WAIT, when to look again (never later than the deadline)."""

    verdict: Verdict
    look_at: float


def decide(hold: Hold, *, due: float, deadline: float, now: float) -> Decision:
    """A held fire waits until ``due + deadline``, then it is missed (see the module
    docstring)."""
    ends = due + deadline
    if now >= ends:
        return Decision(verdict=Verdict.MISS, look_at=now)
    again = hold.retry_at if hold.retry_at is not None else now + HELD_POLL
    return Decision(verdict=Verdict.WAIT, look_at=max(now, min(ends, again)))


class HeldFires:
    """Applies :func:`decide` to ledger rows (see the module docstring)."""

    def __init__(self, ledger: LedgerStore, runner: FireRunner, *, start_deadline: float) -> None:
        self.ledger = ledger
        self.runner = runner
        self.start_deadline = start_deadline
        """``cron.start_deadline``: a job's own ``start_deadline`` overrides it."""

    def deadline(self, job: CronJob | None) -> float:
        """The job's start deadline."""
        if job is not None and job.start_deadline is not None:
            return job.start_deadline
        return self.start_deadline

    def hold(self, row: FireRecord, hold: Hold, *, job: CronJob | None, now: float) -> float | None:
        """Keep ``row`` queued with ``hold`` noted on it, returning when to look again; or
        settle it ``missed`` past its deadline (None)."""
        due = row.due_at if row.due_at is not None else row.nominal
        decision = decide(hold, due=due, deadline=self.deadline(job), now=now)
        if decision.verdict is Verdict.MISS:
            missed = Result(outcome=Outcome.MISSED, error=hold.reason)
            self.runner.finalize(row.id, missed, expect=(Status.CLAIMED,), job=job)
            return None
        note = WAITING + hold.detail
        if row.error != note:
            self.ledger.update(row.id, (Status.CLAIMED,), FireChange(error=note))
        return decision.look_at
