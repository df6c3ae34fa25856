"""A configured job with its schedule resolved: the zone, the crontab or interval timeline."""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.cron.crontab import parse as parse_crontab
from dispatcher.cron.records import JobState
from dispatcher.cron.settings import CronJob
from dispatcher.cron.timeline import CronSchedule, IntervalSchedule, Schedule
from dispatcher.cron.zones import load_zone


@dataclass(frozen=True, kw_only=True)
class JobPlan:
    """A configured job with its schedule resolved in its zone."""

    job: CronJob
    schedule: Schedule
    zone: str
    host_zone: bool
    """The zone is the host's (re-resolved when the host zone changes)."""


def plan_job(job: CronJob, host_zone: str) -> JobPlan:
    """Resolve a job's zone and schedule (the config was validated, so this does not fail for a
    loaded config; a bad zone or expression raises the one-line errors)."""
    zone_name = job.timezone or host_zone
    zone = load_zone(zone_name)
    schedule: Schedule
    if job.schedule is not None:
        schedule = CronSchedule(parse_crontab(job.schedule), zone)
    else:
        assert job.every is not None
        schedule = IntervalSchedule(job.every, zone, job.offset)
    return JobPlan(job=job, schedule=schedule, zone=zone_name, host_zone=job.timezone is None)


def job_active(job: CronJob, state: JobState | None) -> bool:
    """Paused state from the database overrides ``enabled`` from the config."""
    if state is not None and state.paused is not None:
        return not state.paused
    return job.enabled
