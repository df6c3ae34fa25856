"""The cron scheduler: every decision in :meth:`CronScheduler.tick`; something else wakes it.

``tick(now)`` is one deterministic step with an injected clock: settle finished tries (a failed
one may give its fire another try: the row waits as ``retry``), promote a queued fire whose job
went idle and a retry whose time has come, decide every occurrence due since the job's
watermark (catch-up and overlap policies, one write transaction, rows claimed *before* anything
is spawned; a fire waiting for its next try meets the overlap policy as a running one would),
stop replaced workers, then start claimed fires whose jitter delay has passed, within
``cron.max_concurrent``. ``step(now)`` is the same pass answering only when it next needs to run
(a fire, a jitter delay ending, a retry due, or at most ``wake_interval`` away). Tests drive
both directly.

This module never sleeps and never starts a thread. :mod:`dispatcher.cron.waker` arms
APScheduler to call :meth:`CronScheduler.step` at that instant, hands the scheduler a spawn pool
(:meth:`CronScheduler.use_executor`) and listens for early wake requests (a finished worker, a
reload: :meth:`CronScheduler.on_wake_request`). Without a pool, ``tick`` spawns inline.

What this module must not do: run a fire twice (the ledger's keys and compare-and-set prevent it),
or kill anything but a ``replace`` policy's previous worker.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import queue
import random
import secrets
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from dispatcher.cron.abc import LedgerStore
from dispatcher.cron.changes import FireChange
from dispatcher.cron.decisions import Batch, Decider
from dispatcher.cron.errors import CronError
from dispatcher.cron.firing import FireRunner, Settled
from dispatcher.cron.hold import HeldFires, Hold, Waiting, split_held, start_deadline
from dispatcher.cron.ledger import Ledger
from dispatcher.cron.plan import JobPlan, job_active, plan_job
from dispatcher.cron.records import BUSY, FireRecord, Kind, Status
from dispatcher.cron.settings import CronJob, CronSettings
from dispatcher.cron.timeline import fire_key, format_wall, local_wall
from dispatcher.cron.zones import ZoneResolver, resolver_for
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.limits import LimitSpec, Wants, wants_of
from dispatcher.launch.outcome import Outcome, Result
from registry.abc import OwnerKind, Registry, Session
from registry.store.database import StateDB
from scope.foundation.clock import Clock, SystemClock
from scope.foundation.errors import DispatchError, NotFoundError

__all__ = ["CronScheduler", "JobPlan", "PlannedFire", "TickReport", "job_active", "plan_job"]

log = logging.getLogger("dispatch.cron")

_PRUNE_EVERY = 3600.0
_FULL_RECONCILE_EVERY = 10
"""Own running rows are re-checked against the registry every this many reconcile rounds (their
ends normally arrive through the finish listener); other processes' rows every round."""


@dataclass(frozen=True, kw_only=True)
class PlannedFire:
    """A future fire as :meth:`CronScheduler.next_fires` reports it."""

    job_id: str
    at: float
    wall: dt.datetime
    fold: int
    zone: str
    fire_key: str


@dataclass(frozen=True, kw_only=True)
class TickReport:
    """What one :meth:`CronScheduler.tick` did."""

    now: float
    decided: tuple[FireRecord, ...] = ()
    """Rows this tick inserted (every outcome, including claimed and queued ones)."""
    started: tuple[FireRecord, ...] = ()
    """Rows whose worker this tick started (or, under a waker's spawn pool, handed to it)."""
    settled: tuple[FireRecord, ...] = ()
    """Rows this tick moved to a final outcome from a finished session or a recovery."""
    retrying: tuple[FireRecord, ...] = ()
    """Rows whose try ended this tick and that wait for their next try (status ``retry``)."""
    replaced: tuple[str, ...] = ()
    """Session ids this tick stopped because a newer fire replaced them."""
    committed: float | None = None
    """Clock time at which this tick's decisions were committed to the ledger."""
    next_wake: float | None = None


class CronScheduler:
    """Cron for one config (see the module docstring). Thread-safe; one instance per process
    is typical, several on one database (even in several processes) never run a fire twice."""

    def __init__(
        self,
        settings: CronSettings,
        registry: Registry,
        db: StateDB,
        *,
        clock: Clock | None = None,
        environ: Mapping[str, str] | None = None,
        state_dir: Path | str | None = None,
        config_path: Path | None = None,
        zone_resolver: ZoneResolver | None = None,
        rng: random.Random | None = None,
        wake_interval: float = 30.0,
        ledger: LedgerStore | None = None,
        limits: Mapping[str, LimitSpec] | None = None,
    ) -> None:
        self.registry = registry
        # Cluster state may live elsewhere than the host's database (dispatcher.app.clusterstate).
        self.ledger: LedgerStore = ledger if ledger is not None else Ledger(db)
        self.clock: Clock = clock or SystemClock()
        # The workers' base environment (and where TZ is read from): the caller's, else ours.
        self.environ = dict(os.environ if environ is None else environ)
        self.zone_resolver = zone_resolver or resolver_for(self.environ)
        # Jitter needs spread, not secrecy.
        self.rng = rng or random.Random(secrets.randbits(64))  # noqa: S311
        self.wake_interval = wake_interval
        self.claimant = Claimant.current(instance=True).token()
        self.runner = FireRunner(
            self.ledger,
            registry,
            environ=self.environ,
            state_dir=Path(state_dir) if state_dir is not None else db.path.parent,
            claimant=self.claimant,
            clock=self.clock,
            config_path=config_path,
            settings=settings,
            rng=self.rng.random,
        )
        self.runner.on_retry = self._want_wake
        self._lock = threading.RLock()
        self._finished: queue.SimpleQueue[Session] = queue.SimpleQueue()
        self._next_at: dict[str, float] = {}
        self._last_reconcile: float | None = None
        self._last_now: float | None = None
        self._last_prune: float | None = None
        self._reconcile_round = 0
        self._spawner: Executor | None = None
        self._wake_request: Callable[[float], None] | None = None
        self._plans: dict[str, JobPlan] = {}
        self.limits = dict(limits or {})
        """The named limits (``limits:``) the jobs' ``uses`` name."""
        self.held = HeldFires(self.ledger, self.runner)
        self._hold: Hold | None = None
        self._decide_held = True
        self._held_reason: str | None = None
        self._apply_settings(settings)
        registry.add_finish_listener(self._on_finish)

    # -- configuration -----------------------------------------------------------------------

    def _apply_settings(self, settings: CronSettings) -> None:
        self.settings = settings
        self.runner.settings = settings
        self._host_zone = self.zone_resolver()
        old = self._plans
        self._plans = {job.id: plan_job(job, self._host_zone) for job in settings.jobs}
        self._decider = Decider(settings, claimant=self.claimant, rng=self.rng)
        changed = [
            job_id
            for job_id, plan in self._plans.items()
            if job_id in old and (old[job_id].job != plan.job or old[job_id].zone != plan.zone)
        ]
        if changed and self._last_now is not None:
            # Everything up to the last tick was decided under the old schedule; without this
            # a changed schedule would see its new fires before that instant as "missed".
            with self.ledger.transaction() as tx:
                tx.set_watermarks(changed, self._last_now)
        # Every job is looked at in the next tick (first sight, catch-up, changed schedules).
        self._next_at.clear()

    @property
    def plans(self) -> dict[str, JobPlan]:
        """The configured jobs by id."""
        return dict(self._plans)

    def reload(
        self, settings: CronSettings, *, limits: Mapping[str, LimitSpec] | None = None
    ) -> None:
        """Use a new ``cron:`` section (and ``limits:``, when given); new jobs start from now,
        removed jobs stop firing; a lowered limit holds new fires, never stops a running one."""
        with self._lock:
            if limits is not None:
                self.limits = dict(limits)
            self._apply_settings(settings)
        self._want_wake(self.clock.time())

    # -- what wakes it -----------------------------------------------------------------------

    def on_wake_request(self, callback: Callable[[float], None] | None) -> None:
        """Call ``callback(at)`` when the scheduler wants a :meth:`step` before the deadline it
        last returned (a worker finished, the settings changed). Called from any thread,
        never with the tick lock held. None: nobody listens."""
        self._wake_request = callback

    def use_executor(self, executor: Executor | None) -> None:
        """Start workers and stop replaced ones on ``executor`` (None: inline, in ``tick``).
        A spawn costs tens of milliseconds; fires due together must not queue behind it."""
        with self._lock:
            self._spawner = executor

    def set_hold(self, hold: Hold | None, *, decide: bool = True) -> None:
        """Ask ``hold`` before starting scheduled fires (:mod:`dispatcher.cron.hold`): while it
        gives a reason they wait, ``queued``, until their start deadline, then are recorded
        ``missed`` with that reason. ``decide=False`` (cluster mode): while held, decide no
        new fires either, so another host claims them."""
        with self._lock:
            self._hold, self._decide_held = hold, decide

    def _want_wake(self, at: float) -> None:
        callback = self._wake_request
        if callback is not None:
            callback(at)

    # -- the step ----------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> TickReport:
        """Make every decision due at ``now`` (default: the clock) and start what may start."""
        with self._lock:
            now = self.clock.time() if now is None else now
            self._follow_host_zone()
            self._last_now = now
            ended = self._drain_finished()
            ended.extend(self._reconcile(now))
            self._promote_queued(now)
            retries = self._promote_retries(now)
            held = self._hold(now) if self._hold is not None else None
            due = [
                plan
                for job_id, plan in self._plans.items()
                if self._next_at.get(job_id, -math.inf) <= now
                and (held is None or self._decide_held)
            ]
            batch = Batch()
            if due:  # a tick a finished worker asked for often has nothing to decide
                with self.ledger.transaction() as tx:
                    batch = self._decider.decide(tx, due, now)
            committed = self.clock.time()
            for plan in due:
                after = max(now, batch.watermarks.get(plan.job.id, now))
                self._next_at[plan.job.id] = next(iter(plan.schedule.occurrences(after))).at
            replaced = self._stop_replaced(batch.kill)
            ended.extend(self._drain_finished())
            started, pending = self._start_due(now, held)
            waits = [now + self.wake_interval, *pending, *retries, *self._next_at.values()]
            return TickReport(
                now=now,
                decided=tuple(self.ledger.get_many(batch.inserted)) if batch.inserted else (),
                started=tuple(started),
                settled=tuple(e.record for e in ended if not e.retrying),
                retrying=tuple(e.record for e in ended if e.retrying),
                replaced=tuple(replaced),
                committed=committed,
                next_wake=min(waits),
            )

    def step(self, now: float) -> float:
        """One :meth:`tick` at ``now``; returns the clock time at which it next needs to run."""
        report = self.tick(now)
        assert report.next_wake is not None
        return report.next_wake

    def catch_up(self, now: float | None = None) -> TickReport:
        """Settle leftovers of a previous run and apply each job's catch-up policy to the
        fires missed while no scheduler ran (what the waker's ``start()`` does first)."""
        with self._lock:
            self._last_reconcile = None
            self._reconcile_round = 0
            return self.tick(now)

    def _jobs(self) -> dict[str, CronJob]:
        return {job_id: plan.job for job_id, plan in self._plans.items()}

    def _reconcile(self, now: float) -> list[Settled]:
        if self._last_reconcile is not None and now - self._last_reconcile < self.wake_interval:
            return []
        self._last_reconcile = now
        full = self._reconcile_round % _FULL_RECONCILE_EVERY == 0
        self._reconcile_round += 1
        settled = self.runner.reconcile(self._jobs(), foreign_only=not full)
        if self._last_prune is None or now - self._last_prune >= _PRUNE_EVERY:
            self._last_prune = now
            removed = self.ledger.prune(now - self.settings.history_ttl)
            if removed:
                log.info("cron: pruned %d ledger rows older than cron.history_ttl", removed)
        return settled

    def _follow_host_zone(self) -> None:
        current = self.zone_resolver()
        if current != self._host_zone:
            log.info("cron: host time zone changed from %s to %s", self._host_zone, current)
            self._apply_settings(self.settings)

    def _drain_finished(self) -> list[Settled]:
        settled: list[Settled] = []
        while True:
            try:
                session = self._finished.get_nowait()
            except queue.Empty:
                return settled
            plan = self._plans.get(session.labels.get("cron_job", ""))
            result = self.runner.settle(session, job=plan.job if plan else None)
            if result is not None:
                settled.append(result)

    def _promote_queued(self, now: float) -> None:
        queued = self.ledger.open_rows((Status.QUEUED,))
        if not queued:
            return
        with self.ledger.transaction() as tx:
            for row in queued:
                if any(r.status in BUSY for r in tx.open_rows(row.job_id)):
                    continue
                tx.update(
                    row.id,
                    (Status.QUEUED,),
                    FireChange(
                        status=Status.CLAIMED, claimant=self.claimant, due_at=now + row.jitter
                    ),
                )

    def _promote_retries(self, now: float) -> list[float]:
        """Claim every fire whose next try is due (compare-and-set: one scheduler takes it; a
        paused job's retry waits for its resume); the times of the retries still ahead."""
        waiting = self.ledger.open_rows((Status.RETRY,))
        if not waiting:
            return []
        states = self.ledger.job_states()
        ahead: list[float] = []
        due: list[FireRecord] = []
        for row in waiting:
            plan = self._plans.get(row.job_id)
            if plan is not None and not job_active(plan.job, states.get(row.job_id)):
                continue
            at = row.retry_at if row.retry_at is not None else now
            if at <= now:
                due.append(row)
            else:
                ahead.append(at)
        if due:
            with self.ledger.transaction() as tx:
                for row in due:
                    tx.update(row.id, (Status.RETRY,), _take_retry(row, self.claimant, now))
        return ahead

    def _stop_replaced(self, kills: list[tuple[str, str]]) -> list[str]:
        for session_id, reason in kills:
            if self._spawner is not None:
                # A kill waits out the grace period; fires due now must not wait for it.
                self._spawner.submit(self._kill, session_id, reason)
            else:
                self._kill(session_id, reason)
        return [session_id for session_id, _ in kills]

    def _kill(self, session_id: str, reason: str) -> None:
        try:
            self.registry.kill(session_id, reason=reason)
        except (DispatchError, OSError) as err:
            log.warning("cron: could not stop replaced session %s: %s", session_id, err)

    def _start_due(
        self, now: float, held: str | None = None
    ) -> tuple[list[FireRecord], list[float]]:
        mine = self.ledger.open_rows((Status.CLAIMED,))
        claimed = sorted(
            (r for r in mine if r.claimant == self.claimant),
            key=lambda r: (r.due_at or 0.0, r.id),
        )
        pending = [r.due_at for r in claimed if r.due_at is not None and r.due_at > now]
        ready = [r for r in claimed if r.due_at is None or r.due_at <= now]
        if held is not None or self._held_reason is not None:
            ready = self._hold_back(ready, now, held, pending)
        started: list[FireRecord] = []
        if not ready:
            return started, pending
        workers = self.ledger.count_workers()
        for index, row in enumerate(ready):
            if workers >= self.settings.max_concurrent:
                log.info(
                    "cron: %d fire(s) wait for a free cron.max_concurrent slot (%d running)",
                    len(ready) - index,
                    workers,
                )
                break
            plan = self._plans.get(row.job_id)
            job = plan.job if plan else None
            took = self.runner.take(row, now, self._wants(job))
            if took.wait is not None:
                look = self.held.hold(row, Waiting.of_limit(took.wait, now), job=job, now=now)
                pending += [] if look is None else [look]
                # A fire `dispatch cron run` started (it does not wait) holds the limit until
                # settled, even once ended: the next look settles such fires first.
                self._last_reconcile = None
                continue
            if not took.taken:
                continue
            workers += 1
            if self._spawner is not None:
                # Spawning costs tens of milliseconds (a keeper starts); other fires due now
                # must not wait in line behind it.
                self._spawner.submit(self._launch, row, job, now)
                started.append(row)
            else:
                started.append(self.runner.launch(row, job, now))
        return started, pending

    def _wants(self, job: CronJob | None) -> Wants:
        """The named limits a fire of ``job`` takes."""
        return () if job is None else wants_of(job.uses, self.limits)

    def _hold_back(
        self, ready: list[FireRecord], now: float, held: str | None, pending: list[float]
    ) -> list[FireRecord]:
        """While ``held``: the fires that may start anyway (manual ones); the others wait, and
        those past their start deadline are recorded ``missed`` with the reason. ``pending``
        gets the deadlines of the waiting ones (a wake to record them on time)."""
        if held != self._held_reason:
            if held is None:
                log.debug("cron: fires start again (the hold was lifted)")
            self._held_reason = held
        if held is None:
            return ready
        windows = {job_id: plan.job.catch_up_window for job_id, plan in self._plans.items()}
        waiting, overdue = split_held(ready, now, windows)
        for row in overdue:
            plan = self._plans.get(row.job_id)
            missed = Result(outcome=Outcome.MISSED, error=held)
            if self.runner.finalize(
                row.id, missed, expect=(Status.CLAIMED,), job=plan.job if plan else None
            ):
                log.warning("cron: fire %s missed its start deadline: %s", row.fire_key, held)
        if waiting:
            log.debug("cron: %d fire(s) held: %s", len(waiting), held)
        pending.extend(start_deadline(r, windows.get(r.job_id, 0.0)) for r in waiting)
        return [r for r in ready if r.kind is Kind.MANUAL]

    def _launch(self, row: FireRecord, job: CronJob | None, now: float) -> None:
        try:
            self.runner.launch(row, job, now)
        except Exception:
            log.exception("cron: starting fire %s failed", row.fire_key)
            failed = Result(
                outcome=Outcome.FAILED_START,
                error="internal error while starting the worker (see the log)",
            )
            self.runner.finalize(row.id, failed, expect=(Status.SPAWNING,), job=job)

    # -- manual runs -------------------------------------------------------------------------

    def run_now(self, job_id: str, now: float | None = None) -> FireRecord:
        """Start a fire of ``job_id`` now under its own manual key (``dispatch cron run``).

        Ignores pause, ``enabled`` and the overlap policy (the operator asked for it), but not
        ``cron.max_concurrent``. Raises NotFoundError for an unknown job, CronError at the cap."""
        with self._lock:
            plan = self._plans.get(job_id)
            if plan is None:
                raise NotFoundError("cron job", job_id, remedy="see 'dispatch cron list'")
            now = self.clock.time() if now is None else now
            running = self.ledger.count_workers()
            if running >= self.settings.max_concurrent:
                raise CronError(
                    f"{running} cron workers are running, the cron.max_concurrent limit",
                    job_id=job_id,
                    remedy="wait for one to finish or raise cron.max_concurrent",
                )
            self._refuse_full_limit(plan.job, job_id)
            wall, fold = local_wall(now, plan.schedule.zone)
            key = f"{job_id}@run:{format_wall(wall)}:{secrets.token_hex(3)}"
            with self.ledger.transaction() as tx:
                row_id = tx.insert(
                    fire_key=key,
                    job_id=job_id,
                    kind=Kind.MANUAL,
                    nominal_wall=format_wall(wall),
                    fold=fold,
                    zone=plan.zone,
                    nominal=now,
                    decided_at=now,
                    due_at=now,
                    status=Status.CLAIMED,
                    claimant=self.claimant,
                )
            assert row_id is not None
            return self.runner.start(self.ledger.get(row_id), plan.job, now, self._wants(plan.job))

    def _refuse_full_limit(self, job: CronJob, job_id: str) -> None:
        """CronError naming the first full limit ``job`` uses (a manual run is not queued)."""
        wait = self.held.full_limit(self._wants(job), now=self.clock.time())
        if wait is not None:
            raise CronError(wait, job_id=job_id, remedy="try again when a run holding it ends")

    def settle(self, session: Session) -> FireRecord | None:
        """Record the outcome of a finished fire's session now (e.g. after waiting for it)."""
        with self._lock:
            plan = self._plans.get(session.labels.get("cron_job", ""))
            result = self.runner.settle(session, job=plan.job if plan else None)
            return result.record if result else None

    # -- looking ahead -----------------------------------------------------------------------

    def next_fires(
        self, count: int, *, job_id: str | None = None, after: float | None = None
    ) -> list[PlannedFire]:
        """The next ``count`` fires (of one job or of all, active jobs only when all), in time
        order; coalesced DST-gap fires are left out."""
        after = self.clock.time() if after is None else after
        states = self.ledger.job_states()
        found: list[PlannedFire] = []
        for plan in self._plans.values():
            if job_id is not None and plan.job.id != job_id:
                continue
            if job_id is None and not job_active(plan.job, states.get(plan.job.id)):
                continue
            taken = 0
            for occ in plan.schedule.occurrences(after):
                if taken >= count:
                    break
                if occ.coalesced:
                    continue
                taken += 1
                found.append(
                    PlannedFire(
                        job_id=plan.job.id,
                        at=occ.at,
                        wall=occ.wall,
                        fold=occ.fold,
                        zone=plan.zone,
                        fire_key=fire_key(plan.job.id, occ.wall, occ.fold),
                    )
                )
        found.sort(key=lambda fire: (fire.at, fire.job_id))
        return found[:count]

    # -- stopping ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop deciding. Fires this instance claimed but had not started yet are settled
        ``failed_start`` (they are never run twice), retries among them wait for their try
        again; running workers keep running. Stop the waker first
        (:meth:`dispatcher.cron.waker.CronWaker.stop` does both)."""
        with self._lock:
            for row in self.ledger.open_rows((Status.CLAIMED,)):
                if row.claimant != self.claimant or self.runner.requeue(row):
                    continue
                plan = self._plans.get(row.job_id)
                stopped = Result(
                    outcome=Outcome.FAILED_START,
                    error="the scheduler stopped before starting this fire; not re-run",
                )
                self.runner.finalize(
                    row.id,
                    stopped,
                    expect=(Status.CLAIMED,),
                    job=plan.job if plan else None,
                    retry=False,
                )

    close = stop

    def _on_finish(self, session: Session) -> None:
        # Called from a registry thread: never take the tick lock here (a tick may be waiting
        # on that very thread), just hand the session over and ask for a wake.
        if session.owner.kind is not OwnerKind.CRON:
            return
        self._finished.put(session)
        self._want_wake(self.clock.time())


def _take_retry(row: FireRecord, claimant: str, now: float) -> FireChange:
    """A fire's next try claimed for starting; the last try's worker columns are cleared (it
    is kept in ``tries``)."""
    return FireChange(
        status=Status.CLAIMED,
        claimant=claimant,
        due_at=row.retry_at if row.retry_at is not None else now,
        retry_at=None,
        retry_kind=None,
        retry_reason=None,
        session_id=None,
        placement=None,
        exit_code=None,
        signal=None,
        started_at=None,
        ended_at=None,
        log_path=None,
        error=None,
        infrastructure=False,
    )
