"""One decision transaction: every occurrence due for the given jobs becomes a ledger row.

Called by :meth:`~dispatcher.cron.scheduler.CronScheduler.tick` inside a single write
transaction, so the rows, the overlap bookkeeping and the watermarks commit together (or not at
all). Nothing here spawns or kills: rows that should run are inserted ``claimed`` (or ``queued``),
and workers a ``replace`` fire displaces are returned for the caller to stop after the commit.

A fire waiting for its next try (``retry``) is still the job's running fire: ``skip`` records
the new fire ``skipped_overlap``, ``queue_one`` queues it behind the retry, ``replace`` abandons
the retry (the old fire ends ``replaced``) and ``allow`` lets both go on. A fire that should run
is inserted with the tries its job's retry policy gives it (``attempts``).

The transaction holds the database's write lock from its first statement, so the keys already
in the ledger are read once up front and the new rows are written in one batch: a burst of a
thousand due jobs costs a handful of statements, not thousands.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dispatcher.cron.abc import LedgerTx
from dispatcher.cron.changes import FireChange
from dispatcher.cron.plan import JobPlan, job_active
from dispatcher.cron.policy import Judged, OverlapAction, Verdict, judge, overlap_action
from dispatcher.cron.records import BUSY, FireRecord, Kind, Status
from dispatcher.cron.settings import CronJob, CronSettings
from dispatcher.cron.timeline import Occurrence, format_wall, key_of
from dispatcher.launch.outcome import Outcome

log = logging.getLogger("dispatch.cron")

LOOKBACK_FLOOR = 86400.0
"""Occurrences older than max(catch_up_window, this) before now are not itemized one by one."""
MAX_ITEMIZED = 1000
"""At most this many occurrences of one job are recorded per tick (the most recent ones)."""


@dataclass(kw_only=True)
class Batch:
    """What one decision transaction did."""

    inserted: list[int] = field(default_factory=list)
    """Ids of the rows inserted (any outcome), in decision order."""
    kill: list[tuple[str, str]] = field(default_factory=list)
    """(session id, reason) of workers replaced by a newer fire, to stop after the commit."""
    watermarks: dict[str, float] = field(default_factory=dict)
    """The watermark of every job looked at, after the transaction."""


@dataclass(kw_only=True)
class _Open:
    """An unfinished fire of a job as the overlap rule sees it: a stored row (``id``) or a row
    decided earlier in this batch (``pending``, not written yet)."""

    status: Status
    fire_key: str
    id: int | None = None
    session_id: str | None = None
    pending: dict[str, Any] | None = None


class Decider:
    """Decides due occurrences for a set of jobs (see the module docstring)."""

    def __init__(self, settings: CronSettings, *, claimant: str, rng: random.Random) -> None:
        self.settings = settings
        self.claimant = claimant
        self.rng = rng

    def decide(self, tx: LedgerTx, plans: Iterable[JobPlan], now: float) -> Batch:
        """Decide every occurrence of ``plans`` due in (watermark, now]."""
        batch = Batch()
        chosen = list(plans)
        if not chosen:
            return batch
        states = tx.job_states([plan.job.id for plan in chosen])
        work: list[tuple[JobPlan, list[Judged]]] = []
        moved: list[str] = []
        for plan in chosen:
            job = plan.job
            state = states.get(job.id)
            watermark = state.watermark if state else None
            if watermark is not None and now <= watermark:
                batch.watermarks[job.id] = watermark
                continue
            batch.watermarks[job.id] = now
            moved.append(job.id)
            if watermark is None or not job_active(job, state):
                # First sight of a job starts its schedule now; a paused or disabled job's
                # fires are neither run nor recorded missed.
                continue
            judged = judge(
                self._due(plan, watermark, now),
                now=now,
                catch_up=job.catch_up,
                window=job.catch_up_window,
                limit=job.catch_up_max,
                grace=self.settings.on_time_grace,
            )
            if judged:
                work.append((plan, judged))
        tx.set_watermarks(moved, now)
        if not work:
            return batch
        opened: dict[str, list[_Open]] = collections.defaultdict(list)
        for row in tx.all_open_rows():
            opened[row.job_id].append(_stored(row))
        candidates = [
            [(verdict, _row_values(plan, verdict.occurrence, now)) for verdict in judged]
            for plan, judged in work
        ]
        taken = tx.existing_keys([values["fire_key"] for rows in candidates for _, values in rows])
        pending: list[dict[str, Any]] = []
        for (plan, _), rows in zip(work, candidates, strict=True):
            for verdict, values in rows:
                if values["fire_key"] in taken:
                    continue  # another scheduler decided this occurrence already
                taken.add(values["fire_key"])
                values["catch_up"] = verdict.catch_up
                if verdict.verdict is Verdict.RUN:
                    self._run_or_overlap(tx, plan.job, values, opened[plan.job.id], now, batch)
                else:
                    values.update(
                        status=Status.DONE,
                        outcome=Outcome(verdict.verdict.value),
                        error=verdict.note,
                        actual=now,
                    )
                pending.append(values)
        batch.inserted = tx.insert_many(pending)
        return batch

    def _due(self, plan: JobPlan, watermark: float, now: float) -> list[Occurrence]:
        job = plan.job
        lookback = max(self.settings.on_time_grace, job.catch_up_window, LOOKBACK_FLOOR)
        start = max(watermark, now - lookback)
        due = collections.deque(plan.schedule.between(start, now), maxlen=MAX_ITEMIZED)
        skipped_older = start > watermark and any(
            True for _ in plan.schedule.between(watermark, start)
        )
        if skipped_older or len(due) == MAX_ITEMIZED:
            log.warning(
                "cron job %s: fires since %s were missed; only the %d most recent are recorded",
                job.id,
                dt.datetime.fromtimestamp(watermark, dt.UTC).isoformat(timespec="seconds"),
                len(due),
            )
        return list(due)

    def _run_or_overlap(
        self,
        tx: LedgerTx,
        job: CronJob,
        values: dict[str, Any],
        opened: list[_Open],
        now: float,
        batch: Batch,
    ) -> None:
        """Fill in ``values`` for a fire that should run, after the overlap rule."""
        active = [r for r in opened if r.status in BUSY]
        queued = [r for r in opened if r.status is Status.QUEUED]
        action = overlap_action(job.overlap, active=len(active), queued=len(queued))
        key = values["fire_key"]
        if action is OverlapAction.SKIP:
            busy = (active or queued)[0]
            still = "waiting for its next try" if busy.status is Status.RETRY else "still running"
            values.update(
                status=Status.DONE,
                outcome=Outcome.SKIPPED_OVERLAP,
                actual=now,
                error=f"the job was {still} ({busy.fire_key})",
            )
            return
        policy = self.settings.policy(job)
        values["attempts"] = policy.attempts if policy is not None else None
        jitter = self.rng.uniform(0.0, job.jitter) if job.jitter else 0.0
        if action is OverlapAction.QUEUE:
            values.update(status=Status.QUEUED, jitter=jitter)
            opened.append(_Open(status=Status.QUEUED, fire_key=key, pending=values))
            return
        if action is OverlapAction.REPLACE:
            for old in list(opened):
                if self._replace(tx, old, key, now, batch):
                    opened.remove(old)
        values.update(
            status=Status.CLAIMED, claimant=self.claimant, due_at=now + jitter, jitter=jitter
        )
        opened.append(_Open(status=Status.CLAIMED, fire_key=key, pending=values))

    @staticmethod
    def _replace(tx: LedgerTx, old: _Open, key: str, now: float, batch: Batch) -> bool:
        done = {
            "status": Status.DONE,
            "outcome": Outcome.REPLACED,
            "ended_at": now,
            "error": f"replaced by {key}",
        }
        if old.pending is not None:
            old.pending.update(done, claimant=None)
            return True
        assert old.id is not None
        abandoned = old.status is Status.RETRY
        change = FireChange(
            status=Status.DONE,
            outcome=Outcome.REPLACED,
            ended_at=now,
            error=f"retry abandoned: replaced by {key}" if abandoned else f"replaced by {key}",
            retry_at=None,
            retry_kind=None,
        )
        if not tx.update(old.id, (old.status,), change):
            return False
        if old.status is Status.RUNNING and old.session_id:
            batch.kill.append((old.session_id, f"replaced by cron fire {key}"))
        return True


def _stored(row: FireRecord) -> _Open:
    return _Open(status=row.status, fire_key=row.fire_key, id=row.id, session_id=row.session_id)


def _row_values(plan: JobPlan, occ: Occurrence, now: float) -> dict[str, Any]:
    wall = format_wall(occ.wall)
    return {
        "fire_key": key_of(plan.job.id, wall, occ.fold),
        "job_id": plan.job.id,
        "kind": Kind.SCHEDULE,
        "nominal_wall": wall,
        "fold": occ.fold,
        "zone": plan.zone,
        "nominal": occ.at,
        "decided_at": now,
    }
