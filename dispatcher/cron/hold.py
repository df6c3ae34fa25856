"""Holding cron fires back: a fire that may not start now waits, ``queued``, until its start
deadline, then is recorded ``missed`` with the reason it was held. Never dropped silently.

Two things hold fires back, through this one piece:

* whatever keeps this host from starting new work (memory pressure) plugs in as a
  :data:`Hold`: called with ``now``, it answers the reason in words (``memory pressure 34 %``)
  or None. The scheduler asks it before starting claimed fires
  (:meth:`dispatcher.cron.scheduler.CronScheduler.set_hold`); :func:`split_held` sorts the
  fires ready to start into those that wait and those past their deadline. Manual fires
  (``dispatch cron run``) are the operator's request and are never held by it;
* a full named limit: the compare-and-set that starts a fire takes its job's limits, or says
  which one is full (:meth:`dispatcher.cron.abc.LedgerStore.take`). :class:`Waiting` carries
  why (``limit openai``), what the fire's row shows meanwhile (``waiting: limit openai (6 of
  6 running)``) and when the hold may end by itself (a rate window); :func:`decide` says wait
  or miss, and :class:`HeldFires` applies that to the ledger.

A fire's start deadline is its nominal time plus its job's ``catch_up_window``: a fire later
than that would have been recorded ``missed`` had no scheduler been running at all, so a held
fire is recorded the same way instead of running hours late. :func:`split_held` and
:func:`decide` are pure.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dispatcher.cron.abc import LedgerStore
from dispatcher.cron.changes import FireChange
from dispatcher.cron.firing import FireRunner
from dispatcher.cron.records import WAITING, FireRecord, Kind, Status
from dispatcher.cron.settings import CronJob
from dispatcher.launch.limits import LimitWait, Wants, refusal
from dispatcher.launch.outcome import Outcome, Result

__all__ = [
    "HELD_POLL",
    "Decision",
    "HeldFires",
    "Hold",
    "Verdict",
    "Waiting",
    "decide",
    "split_held",
    "start_deadline",
]

Hold = Callable[[float], "str | None"]
"""Why new fires may not start at ``now`` (None: they may)."""

HELD_POLL = 5.0
"""Seconds between looks at a fire held by something that does not say when it frees (a
concurrency slot ends whenever a run ends; a finished cron worker wakes the scheduler anyway)."""


def start_deadline(row: FireRecord, window: float) -> float:
    """The latest instant ``row`` may start: its nominal time plus ``window`` (its job's
    ``catch_up_window``)."""
    return row.nominal + window


def split_held(
    rows: Sequence[FireRecord], now: float, windows: Mapping[str, float]
) -> tuple[list[FireRecord], list[FireRecord]]:
    """Split fires ready to start while held into (waiting, overdue): overdue ones reached their
    start deadline (``windows``: each job's ``catch_up_window``; a job no longer configured has
    none left) and are recorded ``missed``; manual fires are never held, so they are in
    neither list."""
    waiting: list[FireRecord] = []
    overdue: list[FireRecord] = []
    for row in rows:
        if row.kind is Kind.MANUAL:
            continue
        window = windows.get(row.job_id, 0.0)
        (overdue if now >= start_deadline(row, window) else waiting).append(row)
    return waiting, overdue


@dataclass(frozen=True, kw_only=True)
class Waiting:
    """Why one due fire cannot start now."""

    reason: str
    """What a miss records: ``limit openai``."""
    detail: str
    """What the row shows while it waits: ``limit openai (6 of 6 running)``."""
    retry_at: float | None = None
    """When the hold may end by itself (a rate window); None: unknown."""

    @classmethod
    def of_limit(cls, wait: LimitWait, now: float) -> Waiting:
        """The wait of a full named limit."""
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


def decide(waiting: Waiting, *, deadline: float, now: float) -> Decision:
    """A held fire waits until its start ``deadline``, then it is missed (see the module
    docstring)."""
    if now >= deadline:
        return Decision(verdict=Verdict.MISS, look_at=now)
    again = waiting.retry_at if waiting.retry_at is not None else now + HELD_POLL
    return Decision(verdict=Verdict.WAIT, look_at=max(now, min(deadline, again)))


class HeldFires:
    """Applies :func:`decide` to ledger rows: the wait is written on the row once (and again
    only when it changes), a miss is settled through the runner, so the history, ``cron.missed``
    notifications and ``/metrics`` say why."""

    def __init__(self, ledger: LedgerStore, runner: FireRunner) -> None:
        self.ledger = ledger
        self.runner = runner

    def full_limit(self, wants: Wants, *, now: float) -> str | None:
        """What a start of ``wants`` would wait for now (``limit deploys (1 of 1 running):
        the job waits for it``), or None: what ``dispatch cron run`` refuses with, since a
        manual fire does not queue."""
        if not wants:
            return None
        stamp = getattr(self.ledger, "stamp", None)  # a cluster ledger counts for its host
        host = getattr(stamp, "host_id", None)
        clock, tallies = self.ledger.limit_tallies(wants, now=now, host=host)
        wait = refusal(wants, tallies, group=None)
        return None if wait is None else f"{wait.describe(clock)}: the job waits for it"

    def hold(
        self, row: FireRecord, waiting: Waiting, *, job: CronJob | None, now: float
    ) -> float | None:
        """Keep ``row`` queued with ``waiting`` noted on it, returning when to look again;
        or settle it ``missed`` past its start deadline (None)."""
        window = job.catch_up_window if job is not None else 0.0
        decision = decide(waiting, deadline=start_deadline(row, window), now=now)
        if decision.verdict is Verdict.MISS:
            missed = Result(outcome=Outcome.MISSED, error=waiting.reason)
            self.runner.finalize(row.id, missed, expect=(Status.CLAIMED,), job=job)
            return None
        note = WAITING + waiting.detail
        if row.error != note:
            self.ledger.update(row.id, (Status.CLAIMED,), FireChange(error=note))
        return decision.look_at
