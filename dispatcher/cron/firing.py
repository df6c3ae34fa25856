"""Starting a decided fire and settling its ledger row: cron's policy over the launch core.

:class:`FireRunner` is shared by the scheduler and by ``dispatch cron run``. It hands a claimed
row to :class:`~dispatcher.launch.core.LaunchCore` with the ledger's side of the launch
(:class:`_FireBooks`: record the session on the row, settle the row). When a try ends, the
job's retry policy (:mod:`dispatcher.cron.retries`) either gives the fire another try (the row
waits as ``retry`` until its time; the scheduler starts it under the same fire key, one
session per try) or ends it: then the job's ``on_failure`` command runs after a failure, and
``on_exhausted: pause`` pauses the job in the same transaction as the outcome. Rows a dead
process left behind between deciding and spawning are settled (never re-run: ``failed_start``,
or attached to the session the dead process did start; a retry that was never started waits
for its try again). Every state change of a row is a compare-and-set on its status, so two
processes settling the same fire cannot both win (and only the winner runs ``on_failure``).
"""

from __future__ import annotations

import logging
import random
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from dispatcher.cron.abc import LedgerStore, Take
from dispatcher.cron.changes import UNSET, FireChange
from dispatcher.cron.records import FAILURE_OUTCOMES, WAITING, FireRecord, RetryKind, Status
from dispatcher.cron.retries import Verdict, after_try
from dispatcher.cron.settings import CronJob, CronSettings, OnExhausted
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.core import LaunchCore, Orphan, Recorded
from dispatcher.launch.failure import WorkerSetupError
from dispatcher.launch.limits import Wants
from dispatcher.launch.outcome import CRON_DECISIONS, Outcome, Result, outcome_of
from dispatcher.launch.setup import Workplace
from dispatcher.timefmt import iso
from registry.abc import Owner, OwnerKind, Registry, Session, SpawnRequest
from scope.abc import CallerKind
from scope.foundation.clock import Clock
from scope.foundation.errors import DispatchError

__all__ = ["ON_FAILURE_SUFFIX", "FireRunner", "Settled", "build_request", "try_of"]

log = logging.getLogger("dispatch.cron")

ON_FAILURE_SUFFIX = ":on_failure"


def try_of(session: Session) -> int:
    """Which try of its fire a worker's session is (sessions from before retries: the first)."""
    text = session.labels.get("try", "1")
    return int(text) if text.isdigit() else 1


def build_request(
    job: CronJob, fire_key: str, workplace: Workplace, row: FireRecord | None = None
) -> SpawnRequest:
    """The spawn request of one try of a fire (raises :class:`WorkerSetupError` for a bad cwd
    or env_file). Every try is owned by the fire key; its label ``try`` tells them apart."""
    extra = {"DISPATCH_JOB_ID": job.id, "DISPATCH_FIRE_KEY": fire_key}
    number = 1 if row is None else row.try_number
    if row is not None and row.attempts is not None:
        extra |= {
            "DISPATCH_FIRE_ATTEMPT": str(row.attempt),
            "DISPATCH_FIRE_ATTEMPTS": str(row.attempts),
        }
    env = workplace.environment(env_file=job.env_file, env=job.env, extra=extra)
    return SpawnRequest(
        argv=job.command,
        cwd=workplace.cwd(job.cwd, key=f"cron.jobs[{job.id}].cwd"),
        env=env,
        owner=Owner(kind=OwnerKind.CRON, id=fire_key),
        caller=CallerKind.CRON,
        pty=job.pty,
        shell=job.shell,
        timeout=job.timeout,
        resources=job.resources,
        unit_parts=(job.id,),
        labels={"cron_job": job.id, "fire_key": fire_key, "try": str(number)},
    )


@dataclass(frozen=True, kw_only=True)
class Settled:
    """A row whose try ended through this runner: final, or waiting for its next try."""

    record: FireRecord
    on_failure_session: str | None = None

    @property
    def retrying(self) -> bool:
        """The fire waits for its next try (not final)."""
        return self.record.status is Status.RETRY


class _FireBooks:
    """The ledger's side of one fire's launch (see :class:`~dispatcher.launch.core.Books`)."""

    def __init__(self, runner: FireRunner, row: FireRecord, job: CronJob, now: float) -> None:
        self.runner = runner
        self.row = row
        self.job = job
        self.now = now

    def record(self, session: Session) -> Recorded:
        change = FireChange(
            status=Status.RUNNING,
            session_id=session.id,
            placement=session.placement.value,
            started_at=session.started_at if session.started_at is not None else self.now,
            log_path=session.log_path,
        )
        if self.runner.ledger.update(self.row.id, (Status.SPAWNING,), change):
            return Recorded.RECORDED
        # Replaced, or settled by someone else, while we were spawning.
        current = self.runner.ledger.get(self.row.id)
        return Recorded.ALREADY if current.session_id == session.id else Recorded.CLOSED

    def settle(self, result: Result, session: Session | None) -> Settled | None:
        expect = (Status.SPAWNING,) if session is None else (Status.RUNNING, Status.SPAWNING)
        return self.runner.finalize(
            self.row.id, result, session=session, expect=expect, job=self.job
        )


class FireRunner:
    """Spawns claimed fires and settles their rows (see the module docstring).

    ``claimant`` is the :meth:`~dispatcher.launch.claimant.Claimant.token` this runner writes
    on the rows it takes."""

    def __init__(
        self,
        ledger: LedgerStore,
        registry: Registry,
        *,
        environ: Mapping[str, str],
        state_dir: Path,
        claimant: str,
        clock: Clock,
        config_path: Path | None = None,
        settings: CronSettings | None = None,
        rng: Callable[[], float] | None = None,
    ) -> None:
        self.ledger = ledger
        self.registry = registry
        self.workplace = Workplace(
            state_dir=Path(state_dir), config_path=config_path, environ=dict(environ)
        )
        self.claimant = claimant
        self.clock = clock
        self.settings = settings or CronSettings()
        """The ``cron:`` section in force: each job's retry policy and the uncounted cap."""
        # Back-off jitter needs spread, not secrecy.
        self.rng = rng or random.Random(secrets.randbits(64)).random  # noqa: S311
        self.on_retry: Callable[[float], None] | None = None
        """Called with the time of a fire's next try whenever a try ends in a retry."""
        self.core = LaunchCore(registry, state_dir=Path(state_dir), log=log)

    # -- starting ----------------------------------------------------------------------------

    def start(
        self, row: FireRecord, job: CronJob | None, now: float, wants: Wants = ()
    ) -> FireRecord:
        """:meth:`take` the row, then :meth:`launch` it; returns the fresh row (unchanged when
        it was replaced or taken by someone else meanwhile; ``missed`` with the limit's name
        when one it ``wants`` filled up meanwhile: a started-by-hand fire does not queue)."""
        took = self.take(row, now, wants)
        if took.wait is not None:
            missed = Result(outcome=Outcome.MISSED, error=took.wait.reason)
            self.finalize(row.id, missed, expect=(Status.CLAIMED,), job=job)
        if not took.taken:
            return self.ledger.get(row.id)
        return self.launch(row, job, now)

    def take(self, row: FireRecord, now: float, wants: Wants = ()) -> Take:
        """Move a claimed row to ``spawning`` (compare-and-set), taking the named limits
        ``wants`` for it, all or none; not taken when the row is no longer claimed (replaced,
        or settled by someone else) or a limit is full (the take's ``wait``)."""
        change = FireChange(
            status=Status.SPAWNING,
            actual=now,
            claimant=self.claimant,
            # The note of a fire a limit held back goes; another try's error stays.
            error=None if (row.error or "").startswith(WAITING) else UNSET,
        )
        return self.ledger.take(row.id, change, wants, now=now)

    def launch(self, row: FireRecord, job: CronJob | None, now: float) -> FireRecord:
        """Spawn the worker of a row this runner took; records the session or the failure."""
        if job is None:
            result = Result(
                outcome=Outcome.FAILED_START, error="the job is no longer in the config"
            )
            self.finalize(row.id, result, expect=(Status.SPAWNING,), job=None)
            return self.ledger.get(row.id)
        label = f"cron fire {row.fire_key}"
        if row.try_number > 1:
            label += f" (try {row.try_number})"
        self.core.launch(
            _FireBooks(self, row, job, now),
            lambda: build_request(job, row.fire_key, self.workplace, row),
            label=label,
        )
        return self.ledger.get(row.id)

    # -- settling ----------------------------------------------------------------------------

    def settle(self, session: Session, *, job: CronJob | None) -> Settled | None:
        """Record the outcome of a finished cron session (a no-op when its row is already
        settled, or when the session is not a fire's worker)."""
        if session.owner.kind is not OwnerKind.CRON or not session.finished:
            return None
        row = self.ledger.by_key(session.owner.id)
        if row is None or row.session_id not in (None, session.id):
            return None
        if row.session_id is None and try_of(session) != row.try_number:
            return None  # an earlier try's worker, reported again
        return self.finalize(
            row.id,
            outcome_of(session),
            session=session,
            expect=(Status.RUNNING, Status.SPAWNING),
            job=job,
        )

    def finalize(
        self,
        row_id: int,
        result: Result,
        *,
        session: Session | None = None,
        expect: tuple[Status, ...] = (Status.RUNNING,),
        job: CronJob | None,
        retry: bool = True,
    ) -> Settled | None:
        """End the row's current try with ``result`` (compare-and-set): the fire waits for its
        next try when the job's retry policy gives one (``retry`` False: never, for recovery
        verdicts), else moves to ``done``; then ``on_failure`` runs when this call settled a
        failure. Returns None when someone else settled it first."""
        row = self.ledger.get(row_id)
        if row.status not in expect:
            return None
        now = self.clock.time()
        policy = self.settings.policy(job) if job is not None and retry else None
        verdict = after_try(
            row,
            result,
            policy,
            tempfail_limit=self.settings.tempfail_limit,
            now=now,
            rng=self.rng,
            started_at=session.started_at if session is not None else None,
            ended_at=session.finished_at if session is not None else None,
        )
        if verdict.next is not None:
            return self._retry(row, verdict, result, session, expect)
        change = _final_change(row, result, session, now, verdict)
        outbox = self.ledger.outbox
        if outbox is not None and session is not None:
            # Read before the transaction opens: no lock is held while a log is read.
            change = replace(change, output=outbox.tail(self.registry, session.id))
        pause = job is not None and verdict.exhausted and job.on_exhausted is OnExhausted.PAUSE
        paused = False
        with self.ledger.transaction() as tx:
            if not tx.update(row_id, expect, change):
                return None
            if pause and job is not None:
                paused = tx.set_paused(job.id, True, now, _exhausted(row, verdict))
        if paused and job is not None:
            log.warning("cron job %s paused: %s", job.id, _exhausted(row, verdict))
        record = self.ledger.get(row_id)
        hook = None
        if record.outcome in FAILURE_OUTCOMES and job is not None and job.on_failure:
            hook = self._on_failure(record, job)
            if hook is not None:
                self.ledger.update(row_id, (Status.DONE,), FireChange(on_failure_session=hook))
                record = self.ledger.get(row_id)
        return Settled(record=record, on_failure_session=hook)

    def _retry(
        self,
        row: FireRecord,
        verdict: Verdict,
        result: Result,
        session: Session | None,
        expect: tuple[Status, ...],
    ) -> Settled | None:
        """The fire waits for its next try (the try just ended is kept in ``tries``)."""
        assert verdict.next is not None
        following = verdict.next
        change = _with_session(
            FireChange(
                status=Status.RETRY,
                attempt=following.attempt,
                tries=(*row.tries, verdict.tried),
                retry_at=following.at,
                retry_kind=following.kind,
                retry_reason=following.reason,
                error=result.error,
                infrastructure=result.infrastructure,
                exit_code=result.exit_code,
                signal=result.signal,
                ended_at=verdict.tried.ended_at,
            ),
            session,
        )
        if not self.ledger.update(row.id, expect, change):
            return None
        log.info(
            "cron fire %s: try %d %s; next try at %s (%s)",
            row.fire_key,
            row.try_number,
            verdict.tried.outcome.value,
            iso(following.at),
            following.reason or following.kind.value,
        )
        if self.on_retry is not None:
            self.on_retry(following.at)
        return Settled(record=self.ledger.get(row.id))

    def _on_failure(self, record: FireRecord, job: CronJob) -> str | None:
        assert job.on_failure is not None
        details = {
            "DISPATCH_JOB_ID": record.job_id,
            "DISPATCH_FIRE_KEY": record.fire_key,
            "DISPATCH_OUTCOME": record.outcome.value if record.outcome else "",
            "DISPATCH_EXIT_CODE": "" if record.exit_code is None else str(record.exit_code),
            "DISPATCH_SIGNAL": record.signal or "",
            "DISPATCH_FIRE_SESSION_ID": record.session_id or "",
            "DISPATCH_LOG_PATH": record.log_path or "",
            "DISPATCH_ERROR": record.error or "",
            "DISPATCH_INFRASTRUCTURE": "1" if record.infrastructure else "0",
        }
        try:
            env = self.workplace.environment(env_file=job.env_file, env=job.env, extra=details)
            cwd = self.workplace.cwd(job.cwd, key=f"cron.jobs[{job.id}].cwd")
        except WorkerSetupError:
            # The failure may be the env_file or the cwd itself; the hook still runs without.
            env = self.workplace.environment(env_file=None, env=job.env, extra=details)
            cwd = str(self.workplace.state_dir.absolute())
        request = SpawnRequest(
            argv=job.on_failure,
            cwd=cwd,
            env=env,
            owner=Owner(kind=OwnerKind.CRON, id=record.fire_key + ON_FAILURE_SUFFIX),
            # Placed like `dispatch run` (degrades instead of refusing): the hook must still be
            # able to report a fire that failed closed for want of a scope.
            caller=CallerKind.CLI,
            timeout=job.timeout,
            unit_parts=(job.id, "on-failure"),
            labels={"cron_job": job.id, "fire_key": record.fire_key, "hook": "on_failure"},
        )
        try:
            return self.registry.spawn(request).id
        except (DispatchError, OSError) as err:
            log.warning("cron job %s: on_failure could not start: %s", job.id, err)
            return None

    # -- recovery ----------------------------------------------------------------------------

    def reconcile(
        self, jobs: Mapping[str, CronJob], *, foreign_only: bool = False
    ) -> list[Settled]:
        """Settle open rows whose worker finished unseen, and rows a dead process left
        between deciding and spawning (never re-run: ``failed_start``, or attached to the
        session the dead process did start). ``foreign_only`` skips this runner's own running
        rows (their ends arrive through the registry's finish listener)."""
        settled: list[Settled] = []
        for row in self.ledger.open_rows((Status.RUNNING, Status.CLAIMED, Status.SPAWNING)):
            if foreign_only and row.claimant == self.claimant:
                continue
            job = jobs.get(row.job_id)
            if row.status is Status.RUNNING and row.session_id:
                result = self._reconcile_running(row, job)
            elif row.status in (Status.CLAIMED, Status.SPAWNING):
                result = self._reconcile_orphan(row, job)
            else:
                continue
            if result is not None:
                settled.append(result)
        return settled

    def _reconcile_running(self, row: FireRecord, job: CronJob | None) -> Settled | None:
        assert row.session_id is not None
        found = self.core.session(row.session_id)
        if isinstance(found, Result):
            claimant = Claimant.parse(row.claimant)
            if row.claimant != self.claimant and claimant is not None and claimant.alive():
                return None  # another live process owns a session this registry cannot see
            return self.finalize(row.id, found, job=job)
        if not found.finished:
            return None
        return self.settle(found, job=job)

    def _reconcile_orphan(self, row: FireRecord, job: CronJob | None) -> Settled | None:
        claimant = Claimant.parse(row.claimant)
        owner = Owner(kind=OwnerKind.CRON, id=row.fire_key)
        verdict, session = self.core.orphan(owner, claimant)
        if verdict is Orphan.WAIT:
            return None
        if session is not None and try_of(session) != row.try_number:
            verdict, session = Orphan.GONE, None  # the newest session is an earlier try's
        if verdict is Orphan.ATTACH and session is not None:
            change = FireChange(
                status=Status.RUNNING,
                session_id=session.id,
                placement=session.placement.value,
                started_at=session.started_at,
                log_path=session.log_path,
            )
            attached = self.ledger.update(row.id, (Status.SPAWNING,), change)
            if attached and session.finished:
                return self.settle(session, job=job)
            return None
        if row.status is Status.CLAIMED and self.requeue(row):
            return None
        who = str(claimant) if claimant is not None else "unknown"
        what = (
            "while starting it, and no session of it exists"
            if row.status is Status.SPAWNING
            else "before starting it"
        )
        result = Result(
            outcome=Outcome.FAILED_START,
            error=f"the process that decided this fire ({who}) exited {what}; not re-run",
        )
        return self.finalize(row.id, result, expect=(row.status,), job=job, retry=False)

    def requeue(self, row: FireRecord) -> bool:
        """A retry taken for starting but never started (its process stopped or died first)
        waits for its try again, due at once; False for a first try (never re-run) or a row
        no longer claimed."""
        if row.try_number == 1:
            return False
        change = FireChange(
            status=Status.RETRY,
            retry_at=row.due_at if row.due_at is not None else self.clock.time(),
            retry_kind=RetryKind.BACKOFF,
            retry_reason="taken by a process that stopped before starting it",
            claimant=None,
        )
        return self.ledger.update(row.id, (Status.CLAIMED,), change)


def _with_session(change: FireChange, session: Session | None) -> FireChange:
    """``change`` also setting the columns that describe the latest try's worker."""
    if session is None:
        return change
    return replace(
        change,
        session_id=session.id,
        placement=session.placement.value,
        started_at=session.started_at,
        log_path=session.log_path,
    )


def _final_change(
    row: FireRecord, result: Result, session: Session | None, now: float, verdict: Verdict
) -> FireChange:
    """The columns of a row reaching ``done`` with ``result`` after its last try."""
    # A decision about a try that never started (held past its deadline: missed) is no try.
    tried = () if result.outcome in CRON_DECISIONS else (verdict.tried,)
    tries = FireChange(
        status=Status.DONE,
        outcome=verdict.tried.outcome,
        tries=(*row.tries, *tried),
        error=result.error,
        infrastructure=result.infrastructure,
        attempt=verdict.tried.attempt,
        retry_at=None,
        retry_kind=None,
        retry_reason=verdict.why,
    )
    if session is None:
        return replace(tries, ended_at=now)
    ended = session.finished_at if session.finished_at is not None else now
    finished = replace(tries, exit_code=session.exit_code, signal=session.signal, ended_at=ended)
    return _with_session(finished, session)


def _exhausted(row: FireRecord, verdict: Verdict) -> str:
    """Why ``on_exhausted: pause`` paused the job."""
    tries = len(row.tries) + 1
    used = f"every attempt ({verdict.why})" if verdict.why else "its one attempt"
    return f"fire {row.fire_key} failed {used}; {tries} tries in all"
