"""Starting a decided fire and settling its ledger row: cron's policy over the launch core.

:class:`FireRunner` is shared by the scheduler and by ``dispatch cron run``. It hands a claimed
row to :class:`~dispatcher.launch.core.LaunchCore` with the ledger's side of the launch
(:class:`_FireBooks`: record the session on the row, settle the row), runs the job's
``on_failure`` command after a failure, and settles rows a dead process left behind between
deciding and spawning (never re-run: ``failed_start``, or attached to the session the dead
process did start). Every state change of a row is a compare-and-set on its status, so two
processes settling the same fire cannot both win (and only the winner runs ``on_failure``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dispatcher.cron.abc import LedgerStore, Take
from dispatcher.cron.changes import UNSET, FireChange
from dispatcher.cron.records import FAILURE_OUTCOMES, FireRecord, Status
from dispatcher.cron.settings import CronJob
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.core import LaunchCore, Orphan, Recorded
from dispatcher.launch.failure import WorkerSetupError
from dispatcher.launch.limits import Wants
from dispatcher.launch.outcome import Outcome, Result, outcome_of
from dispatcher.launch.setup import Workplace
from registry.abc import Owner, OwnerKind, Registry, Session, SpawnRequest
from scope.abc import CallerKind
from scope.foundation.clock import Clock
from scope.foundation.errors import DispatchError

__all__ = ["ON_FAILURE_SUFFIX", "FireRunner", "Settled", "build_request"]

log = logging.getLogger("dispatch.cron")

ON_FAILURE_SUFFIX = ":on_failure"


def build_request(job: CronJob, fire_key: str, workplace: Workplace) -> SpawnRequest:
    """The spawn request of one fire (raises :class:`WorkerSetupError` for a bad cwd or
    env_file)."""
    env = workplace.environment(
        env_file=job.env_file,
        env=job.env,
        extra={"DISPATCH_JOB_ID": job.id, "DISPATCH_FIRE_KEY": fire_key},
    )
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
        labels={"cron_job": job.id, "fire_key": fire_key},
    )


@dataclass(frozen=True, kw_only=True)
class Settled:
    """A row that reached a final outcome through this runner."""

    record: FireRecord
    on_failure_session: str | None = None


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
    ) -> None:
        self.ledger = ledger
        self.registry = registry
        self.workplace = Workplace(
            state_dir=Path(state_dir), config_path=config_path, environ=dict(environ)
        )
        self.claimant = claimant
        self.clock = clock
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
            error=None if row.error else UNSET,
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
        self.core.launch(
            _FireBooks(self, row, job, now),
            lambda: build_request(job, row.fire_key, self.workplace),
            label=f"cron fire {row.fire_key}",
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
    ) -> Settled | None:
        """Move a row to ``done`` with ``result`` (compare-and-set); run ``on_failure`` when
        this call settled a failure. Returns None when someone else settled it first."""
        if not self.ledger.update(
            row_id, expect, _final_change(result, session, self.clock.time())
        ):
            return None
        record = self.ledger.get(row_id)
        hook = None
        if result.outcome in FAILURE_OUTCOMES and job is not None and job.on_failure:
            hook = self._on_failure(record, job)
            if hook is not None:
                self.ledger.update(row_id, (Status.DONE,), FireChange(on_failure_session=hook))
                record = self.ledger.get(row_id)
        return Settled(record=record, on_failure_session=hook)

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
        return self.finalize(row.id, result, expect=(row.status,), job=job)


def _final_change(result: Result, session: Session | None, now: float) -> FireChange:
    """The columns of a row reaching ``done`` with ``result``."""
    if session is None:
        return FireChange(
            status=Status.DONE,
            outcome=result.outcome,
            error=result.error,
            infrastructure=result.infrastructure,
            ended_at=now,
        )
    return FireChange(
        status=Status.DONE,
        outcome=result.outcome,
        error=result.error,
        infrastructure=result.infrastructure,
        session_id=session.id,
        placement=session.placement.value,
        exit_code=session.exit_code,
        signal=session.signal,
        started_at=session.started_at,
        ended_at=session.finished_at if session.finished_at is not None else now,
        log_path=session.log_path,
    )
