"""Cron jobs as an operator sees and steers them: ``dispatch cron`` and ``dispatch web`` both
come here, so a job is listed, paused, resumed and run now one way whoever asks.

Reads need only the config and the ledger; settling fires whose worker ended while no
scheduler watched, and running a job now, need the registry, which the caller opens (the CLI
ties it to its command, the web to its process) and hands in as a callable.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatcher.app.reports import spawn_environ
from dispatcher.cron.firing import FireRunner
from dispatcher.cron.ledger import Ledger
from dispatcher.cron.plan import JobPlan, job_active, plan_job
from dispatcher.cron.records import FireRecord, JobState, Status
from dispatcher.cron.report import job_entry, known_job_entry
from dispatcher.cron.zones import fixed_zone, host_zone_name
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.failure import WorkerSetupError
from dispatcher.launch.setup import Workplace
from dispatcher.settings import Settings
from scope.foundation.clock import SystemClock
from scope.foundation.errors import NotFoundError

if TYPE_CHECKING:
    from dispatcher.app.runtime import Runtime
    from dispatcher.cron.scheduler import CronScheduler

OpenRuntime = Callable[[], "Runtime"]
"""Returns an open runtime (the caller owns and closes it)."""


@dataclass(frozen=True, kw_only=True)
class JobView:
    """One configured job as listed: its plan, the ``cron list --json`` entry, the next fire
    instants (epoch seconds, in the job's zone when shown) and env-file warnings."""

    plan: JobPlan
    entry: dict[str, Any]
    upcoming: tuple[float, ...]
    state: JobState | None
    last: FireRecord | None
    warnings: tuple[str, ...]


class CronJobs:
    """The configured jobs over one ledger (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        ledger: Callable[[], Ledger],
        *,
        environ: Mapping[str, str],
        state_dir: Path,
        config_path: Path | None = None,
        host_zone: str | None = None,
    ) -> None:
        self.settings = settings
        self._open_ledger = ledger
        self.environ = dict(environ)
        self.state_dir = state_dir
        self.config_path = config_path
        # A job without ``timezone`` fires in the scheduler's zone: the running gateway's when
        # the caller knows it, never a viewer's own TZ.
        zone = host_zone or host_zone_name({})
        self.host_zone = zone
        self.plans: dict[str, JobPlan] = {job.id: plan_job(job, zone) for job in settings.cron.jobs}

    @functools.cached_property
    def ledger(self) -> Ledger:
        """The ledger (opened on first use: ``cron next`` needs none)."""
        return self._open_ledger()

    def plan(self, job_id: str) -> JobPlan:
        """The configured job (NotFoundError naming the known ones)."""
        if job_id not in self.plans:
            known = ", ".join(sorted(self.plans)) or "none configured"
            raise NotFoundError("cron job", job_id, remedy=f"known jobs: {known}")
        return self.plans[job_id]

    def check_known(self, job_id: str) -> None:
        """A job that is configured or has ledger rows (its history can be shown)."""
        if job_id not in self.plans and not self.ledger.known_job(job_id):
            raise NotFoundError("cron job", job_id, remedy="see 'dispatch cron list'")

    def settle_open(self, runtime: OpenRuntime) -> None:
        """Record outcomes of fires whose worker ended while no scheduler was watching (a
        ``cron run`` without ``--wait``, a scheduler that is down)."""
        if not self.ledger.open_rows((Status.RUNNING, Status.CLAIMED, Status.SPAWNING)):
            return
        runner = FireRunner(
            self.ledger,
            runtime().registry,
            environ=self.environ,
            state_dir=self.state_dir,
            claimant=Claimant.current(instance=True).token(),
            clock=SystemClock(),
            config_path=self.config_path,
            settings=self.settings.cron,
        )
        runner.reconcile({job.id: job for job in self.settings.cron.jobs})

    def views(self, now: float, *, upcoming: int = 1) -> list[JobView]:
        """Every configured job with its state, next ``upcoming`` fires and last outcome."""
        states = self.ledger.job_states()
        last = self.ledger.last_rows()
        found = []
        for plan in self.plans.values():
            state = states.get(plan.job.id)
            fires: tuple[float, ...] = ()
            if job_active(plan.job, state):
                fires = tuple(plan.schedule.next_instants(now, upcoming))
            warnings = tuple(self._env_warnings(plan))
            retry = self.settings.cron.policy(plan.job)
            entry = job_entry(
                plan,
                state,
                fires[0] if fires else None,
                last.get(plan.job.id),
                list(warnings),
                attempts=retry.attempts if retry is not None else None,
            )
            found.append(
                JobView(
                    plan=plan,
                    entry=entry,
                    upcoming=fires,
                    state=state,
                    last=last.get(plan.job.id),
                    warnings=warnings,
                )
            )
        return found

    def unconfigured_entries(self) -> list[dict[str, Any]]:
        """What the ledger knows of jobs it has seen that the config does not name (shown
        while the config file is broken)."""
        states = self.ledger.job_states()
        last = self.ledger.last_rows()
        return [
            known_job_entry(job_id, states.get(job_id), last.get(job_id))
            for job_id in sorted((set(states) | set(last)) - set(self.plans))
        ]

    def set_paused(self, job_id: str, paused: bool, now: float) -> bool:
        """Pause or resume a configured job; False when it already was."""
        self.plan(job_id)
        return self.ledger.set_paused(job_id, paused, now)

    def scheduler(self, runtime: Runtime) -> CronScheduler:
        """A scheduler on ``runtime`` whose ``run_now`` and ``settle`` fire a job now under
        its own manual key (``dispatch cron run``, the web's "run now")."""
        # Imported on demand: listing and pausing need no APScheduler.
        from dispatcher.cron.scheduler import CronScheduler

        return CronScheduler(
            self.settings.cron,
            runtime.registry,
            runtime.db,
            # The worker's `kanban defer` finds its fire from these (dispatcher.app.reports).
            environ=spawn_environ(self.settings, self.environ),
            state_dir=self.state_dir,
            config_path=self.config_path,
            ledger=self.ledger,
            zone_resolver=fixed_zone(self.host_zone),
            limits=self.settings.limits,
        )

    def _env_warnings(self, plan: JobPlan) -> list[str]:
        if not plan.job.env_file:
            return []
        workplace = Workplace(state_dir=self.state_dir, config_path=self.config_path, environ={})
        try:
            workplace.read_env_file(plan.job.env_file)
        except WorkerSetupError as err:
            return [err.message]
        return []
