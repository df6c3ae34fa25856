"""Starting a decided fire through the registry and settling its ledger row.

:class:`FireRunner` is shared by the scheduler and by ``dispatch cron run``: it turns a claimed
row into a session (placement by the scope layer, caller kind ``cron``), records the outcome once
the session ends, runs the job's ``on_failure`` command after a failure, and settles rows left
behind by a process that died between deciding and spawning. Every state change of a row is a
compare-and-set on its status, so two processes settling the same fire cannot both win (and only
the winner runs ``on_failure``).
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dispatcher.cron.ledger import (
    FAILURE_OUTCOMES,
    FireRecord,
    Ledger,
    Outcome,
    Status,
)
from dispatcher.cron.settings import CronJob
from dispatcher.envfile import read_env_file
from dispatcher.errors import EnvFileError
from registry.abc import Owner, Registry, Session, SessionState, SpawnRequest
from registry.state import space_problem
from scope.abc import CallerKind
from scope.errors import ManagerLost, ScopeUnavailable
from scope.foundation.errors import DispatchError, NotFoundError
from scope.foundation.procstat import start_time

log = logging.getLogger("dispatch.cron")

OWNER_KIND = "cron"
ON_FAILURE_SUFFIX = ":on_failure"


def claimant_token() -> str:
    """Identity of this process for claimed rows: pid, kernel start time and a random part."""
    pid = os.getpid()
    return f"{pid}:{start_time(pid) or 0}:{secrets.token_hex(4)}"


def claimant_alive(token: str | None) -> bool:
    """Whether the process that wrote ``token`` still runs (same pid *and* start time)."""
    if not token:
        return False
    try:
        pid_text, start_text, _ = token.split(":", 2)
        pid, started = int(pid_text), int(start_text)
    except ValueError:
        return False
    return start_time(pid) == started


def outcome_of(session: Session) -> tuple[Outcome, str | None]:
    """The fire outcome for a finished session, and an error text for anything but success."""
    reason = session.completion_reason
    if session.state is SessionState.EXITED:
        if session.exit_code == 0 and session.signal is None:
            return Outcome.COMPLETED, None
        return Outcome.FAILED, reason or _exit_text(session)
    if session.state is SessionState.TIMED_OUT:
        return Outcome.TIMED_OUT, reason or f"timed out after {session.timeout:g} s"
    if session.state is SessionState.LOST:
        return Outcome.LOST, reason or "the keeper vanished without an exit record"
    if session.state is SessionState.FAILED_START:
        return Outcome.FAILED_START, reason or "the worker could not be started"
    return Outcome.FAILED, reason or f"killed ({session.signal or 'no signal'})"


def _exit_text(session: Session) -> str:
    if session.signal:
        return f"killed by {session.signal}"
    return f"exited with code {session.exit_code}"


def job_environment(
    job: CronJob, environ: Mapping[str, str], extra: Mapping[str, str]
) -> dict[str, str]:
    """The worker's environment: the scheduler's, then ``env_file``, then ``env``, then
    ``extra`` (the DISPATCH_* variables). Raises :class:`EnvFileError`."""
    env = dict(environ)
    if job.env_file:
        env.update(read_env_file(job.env_file))
    env.update(job.env)
    env.update(extra)
    return env


def build_request(
    job: CronJob,
    fire_key: str,
    *,
    environ: Mapping[str, str],
    state_dir: Path,
) -> SpawnRequest:
    """The spawn request of one fire (raises :class:`EnvFileError` for a bad env_file)."""
    env = job_environment(job, environ, {"DISPATCH_JOB_ID": job.id, "DISPATCH_FIRE_KEY": fire_key})
    return SpawnRequest(
        argv=job.command,
        cwd=os.path.expanduser(job.cwd) if job.cwd else str(state_dir),
        env=env,
        owner=Owner(kind=OWNER_KIND, id=fire_key),
        caller=CallerKind.CRON,
        pty=job.pty,
        shell=job.shell,
        timeout=job.timeout,
        unit_parts=(job.id,),
        labels={"cron_job": job.id, "fire_key": fire_key},
    )


@dataclass(frozen=True, kw_only=True)
class Settled:
    """A row that reached a final outcome through this runner."""

    record: FireRecord
    on_failure_session: str | None = None


class FireRunner:
    """Spawns claimed fires and settles their rows (see the module docstring)."""

    def __init__(
        self,
        ledger: Ledger,
        registry: Registry,
        *,
        environ: Mapping[str, str],
        state_dir: Path,
        claimant: str,
        clock: Callable[[], float],
    ) -> None:
        self.ledger = ledger
        self.registry = registry
        self.environ = dict(environ)
        self.state_dir = Path(state_dir)
        self.claimant = claimant
        self.clock = clock

    # -- starting ----------------------------------------------------------------------------

    def start(self, row: FireRecord, job: CronJob | None, now: float) -> FireRecord:
        """:meth:`take` the row, then :meth:`launch` it; returns the fresh row (unchanged when
        it was replaced or taken by someone else meanwhile)."""
        if not self.take(row, now):
            return self.ledger.get(row.id)
        return self.launch(row, job, now)

    def take(self, row: FireRecord, now: float) -> bool:
        """Move a claimed row to ``spawning`` (compare-and-set); False when it is no longer
        claimed (replaced, or settled by someone else)."""
        return self.ledger.update(
            row.id, (Status.CLAIMED,), status=Status.SPAWNING, actual=now, claimant=self.claimant
        )

    def launch(self, row: FireRecord, job: CronJob | None, now: float) -> FireRecord:
        """Spawn the worker of a row this runner took; records the session or the failure."""
        if job is None:
            self.finalize(
                row.id,
                Outcome.FAILED_START,
                error="the job is no longer in the config",
                expect=(Status.SPAWNING,),
                job=None,
            )
            return self.ledger.get(row.id)
        try:
            request = build_request(
                job, row.fire_key, environ=self.environ, state_dir=self.state_dir
            )
        except EnvFileError as err:
            self.finalize(
                row.id, Outcome.FAILED_START, error=err.message, expect=(Status.SPAWNING,), job=job
            )
            return self.ledger.get(row.id)
        full = space_problem(self.state_dir)
        if full is not None:  # infrastructure, like a refused scope: never counted, next fire runs
            self.finalize(
                row.id,
                Outcome.SPAWN_REFUSED,
                error=full,
                infrastructure=True,
                expect=(Status.SPAWNING,),
                job=job,
            )
            return self.ledger.get(row.id)
        session = self._spawn(row, job, request)
        if session is None:
            return self.ledger.get(row.id)
        recorded = self.ledger.update(
            row.id,
            (Status.SPAWNING,),
            status=Status.RUNNING,
            session_id=session.id,
            placement=session.placement.value,
            started_at=session.started_at if session.started_at is not None else now,
            log_path=session.log_path,
        )
        if not recorded:
            # Replaced (or settled by someone else) while we were spawning: the new worker
            # must not outlive the decision.
            self._kill(session.id, f"fire {row.fire_key} was replaced while starting")
            return self.ledger.get(row.id)
        log.info("cron fire %s: started %s (%s)", row.fire_key, session.id, session.placement.value)
        fresh = self._fresh(session)
        if fresh.finished:
            self.settle(fresh, job=job)
        return self.ledger.get(row.id)

    def _spawn(self, row: FireRecord, job: CronJob, request: SpawnRequest) -> Session | None:
        for attempt in (1, 2):
            try:
                return self.registry.spawn(request)
            except ManagerLost as err:
                # The scope layer has already flipped its verdict, so one retry in the same
                # slot goes through the new placement (degraded, or refused by policy).
                if attempt == 1:
                    log.warning("cron fire %s: %s; retrying once", row.fire_key, err.message)
                    continue
                self.finalize(
                    row.id,
                    Outcome.SPAWN_REFUSED,
                    error=f"{err.message} (after one retry)",
                    infrastructure=True,
                    expect=(Status.SPAWNING,),
                    job=job,
                )
            except ScopeUnavailable as err:
                self.finalize(
                    row.id,
                    Outcome.SPAWN_REFUSED,
                    error=err.message,
                    infrastructure=True,
                    expect=(Status.SPAWNING,),
                    job=job,
                )
            except (DispatchError, OSError) as err:
                message = err.message if isinstance(err, DispatchError) else str(err)
                self.finalize(
                    row.id, Outcome.FAILED_START, error=message, expect=(Status.SPAWNING,), job=job
                )
            return None
        return None  # pragma: no cover - the loop always returns

    # -- settling ----------------------------------------------------------------------------

    def settle(self, session: Session, *, job: CronJob | None) -> Settled | None:
        """Record the outcome of a finished cron session (a no-op when its row is already
        settled, or when the session is not a fire's worker)."""
        if session.owner.kind != OWNER_KIND or not session.finished:
            return None
        row = self.ledger.by_key(session.owner.id)
        if row is None or row.session_id not in (None, session.id):
            return None
        outcome, error = outcome_of(session)
        return self.finalize(
            row.id,
            outcome,
            error=error,
            session=session,
            expect=(Status.RUNNING, Status.SPAWNING),
            job=job,
        )

    def finalize(
        self,
        row_id: int,
        outcome: Outcome,
        *,
        error: str | None = None,
        session: Session | None = None,
        infrastructure: bool = False,
        expect: tuple[Status, ...] = (Status.RUNNING,),
        job: CronJob | None,
    ) -> Settled | None:
        """Move a row to ``done`` with ``outcome`` (compare-and-set); run ``on_failure`` when
        this call settled a failure. Returns None when someone else settled it first."""
        now = self.clock()
        values: dict[str, object] = {
            "status": Status.DONE,
            "outcome": outcome,
            "error": error,
            "infrastructure": infrastructure,
        }
        if session is not None:
            values.update(
                session_id=session.id,
                placement=session.placement.value,
                exit_code=session.exit_code,
                signal=session.signal,
                started_at=session.started_at,
                ended_at=session.finished_at if session.finished_at is not None else now,
                log_path=session.log_path,
            )
        else:
            values["ended_at"] = now
        if not self.ledger.update(row_id, expect, **values):
            return None
        record = self.ledger.get(row_id)
        hook = None
        if outcome in FAILURE_OUTCOMES and job is not None and job.on_failure:
            hook = self._on_failure(record, job)
            if hook is not None:
                self.ledger.update(row_id, (Status.DONE,), on_failure_session=hook)
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
            env = job_environment(job, self.environ, details)
        except EnvFileError:
            # The failure may be the env_file itself; the hook still runs without it.
            env = {**self.environ, **job.env, **details}
        request = SpawnRequest(
            argv=job.on_failure,
            cwd=os.path.expanduser(job.cwd) if job.cwd else str(self.state_dir),
            env=env,
            owner=Owner(kind=OWNER_KIND, id=record.fire_key + ON_FAILURE_SUFFIX),
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
                if claimant_alive(row.claimant):
                    continue
                result = self._reconcile_orphan(row, job)
            else:
                continue
            if result is not None:
                settled.append(result)
        return settled

    def _reconcile_running(self, row: FireRecord, job: CronJob | None) -> Settled | None:
        assert row.session_id is not None
        try:
            session = self.registry.get(row.session_id)
        except NotFoundError:
            if row.claimant != self.claimant and claimant_alive(row.claimant):
                return None  # another live process owns a session this registry cannot see
            return self.finalize(
                row.id,
                Outcome.LOST,
                error=f"session {row.session_id} is no longer known to the registry",
                job=job,
            )
        if not session.finished:
            return None
        return self.settle(session, job=job)

    def _reconcile_orphan(self, row: FireRecord, job: CronJob | None) -> Settled | None:
        who = (row.claimant or "?").split(":", 1)[0]
        if row.status is Status.SPAWNING:
            session = self._find_session(row.fire_key)
            if session is not None:
                attached = self.ledger.update(
                    row.id,
                    (Status.SPAWNING,),
                    status=Status.RUNNING,
                    session_id=session.id,
                    placement=session.placement.value,
                    started_at=session.started_at,
                    log_path=session.log_path,
                )
                if attached and session.finished:
                    return self.settle(session, job=job)
                return None
        if row.status is Status.SPAWNING:
            what = "while starting it, and no session of it exists"
        else:
            what = "before starting it"
        return self.finalize(
            row.id,
            Outcome.FAILED_START,
            error=f"the process that decided this fire (pid {who}) exited {what}; not re-run",
            expect=(row.status,),
            job=job,
        )

    def _find_session(self, fire_key: str) -> Session | None:
        wanted = Owner(kind=OWNER_KIND, id=fire_key)
        for session in self.registry.list_sessions(include_finished=True):
            if session.owner == wanted:
                return session
        return None

    def _fresh(self, session: Session) -> Session:
        try:
            return self.registry.get(session.id)
        except NotFoundError:
            return session

    def _kill(self, session_id: str, reason: str) -> None:
        try:
            self.registry.kill(session_id, reason=reason)
        except (DispatchError, OSError) as err:
            log.warning("cron: could not stop session %s: %s", session_id, err)
