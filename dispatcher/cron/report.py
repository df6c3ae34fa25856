"""JSON-ready views of cron jobs and ledger rows (``dispatch cron list/history --json``).

Timestamps are ISO-8601 with a numeric offset and whole seconds, in the job's zone; ids are
strings; durations are numbers of seconds.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from dispatcher.cron.plan import JobPlan, job_active
from dispatcher.cron.records import FireRecord, JobState
from dispatcher.cron.zones import load_zone
from dispatcher.launch.resources import resources_json
from registry.abc import Session
from scope.foundation.schema import format_duration


def iso_in(at: float | None, zone: str) -> str | None:
    """``at`` (epoch seconds) as ISO-8601 in ``zone``, whole seconds; None stays None."""
    if at is None:
        return None
    moment = dt.datetime.fromtimestamp(int(at), load_zone(zone))
    return moment.isoformat(timespec="seconds")


def schedule_text(plan: JobPlan) -> str:
    """``*/5 * * * *`` or ``every 10m`` (``every 1h offset 5m``)."""
    job = plan.job
    if job.schedule is not None:
        return job.schedule
    assert job.every is not None
    text = f"every {format_duration(job.every)}"
    return f"{text} offset {format_duration(job.offset)}" if job.offset else text


def policies(plan: JobPlan) -> dict[str, Any]:
    """The job's policies with every default spelled out."""
    job = plan.job
    return {
        "overlap": job.overlap.value,
        "catch_up": job.catch_up.value,
        "catch_up_window": job.catch_up_window,
        "catch_up_max": job.catch_up_max,
        "jitter": job.jitter,
        "timeout": job.timeout,
    }


def policy_text(p: dict[str, Any]) -> str:
    """The policies of a :func:`policies` mapping on one line, as ``cron list`` and the web's
    cron job page show them (``overlap=skip catch_up=latest window=1h max=100``)."""
    text = (
        f"overlap={p['overlap']} catch_up={p['catch_up']} "
        f"window={format_duration(p['catch_up_window'])} max={p['catch_up_max']}"
    )
    if p["jitter"]:
        text += f" jitter={format_duration(p['jitter'])}"
    if p["timeout"]:
        text += f" timeout={format_duration(p['timeout'])}"
    return text


def job_entry(
    plan: JobPlan,
    state: JobState | None,
    next_fire: float | None,
    last: FireRecord | None,
    warnings: list[str],
) -> dict[str, Any]:
    """One element of ``dispatch cron list --json``."""
    job = plan.job
    return {
        "id": job.id,
        "schedule": schedule_text(plan),
        "timezone": plan.zone,
        "enabled": job.enabled,
        "paused": bool(state is not None and state.paused),
        "active": job_active(job, state),
        "next_fire": iso_in(next_fire, plan.zone),
        "next_fire_at": next_fire,
        "last_outcome": last.shown_outcome if last else None,
        "last_fire": iso_in(last.nominal, last.zone) if last else None,
        "last_fire_at": last.nominal if last else None,
        **policies(plan),
        "command": job.command if isinstance(job.command, str) else list(job.command),
        "warnings": warnings,
    }


def row_entry(row: FireRecord, sessions: Mapping[str, Session] | None = None) -> dict[str, Any]:
    """One element of ``dispatch cron history --json``; ``sessions`` (this host's, by id)
    adds the fire's ``resources``, ``memory_peak`` and ``cpu_time``."""
    zone = row.zone
    entry = {
        "job_id": row.job_id,
        "fire_key": row.fire_key,
        "kind": row.kind.value,
        "nominal": iso_in(row.nominal, zone),
        "actual": iso_in(row.actual, zone),
        "outcome": row.shown_outcome,
        "placement": row.placement,
        "session_id": row.session_id,
        "exit_code": row.exit_code,
        "signal": row.signal,
        "started_at": iso_in(row.started_at, zone),
        "ended_at": iso_in(row.ended_at, zone),
        "error": row.error,
        "infrastructure": row.infrastructure,
        "catch_up": row.catch_up,
        "jitter": row.jitter,
        "on_failure_session": row.on_failure_session,
    }
    if sessions is not None:
        entry.update(resources_json(sessions.get(row.session_id or "")))
    return entry


def known_job_entry(job_id: str, state: JobState | None, last: FireRecord | None) -> dict[str, Any]:
    """A ``cron list`` element for a job the ledger knows but the (unreadable) config does not
    describe: its pause state and last fire, nothing that needs the job's definition."""
    zone = last.zone if last else None
    return {
        "id": job_id,
        "schedule": None,
        "timezone": zone,
        "enabled": None,
        "paused": bool(state is not None and state.paused),
        "active": not bool(state is not None and state.paused),
        "next_fire": None,
        "next_fire_at": None,
        "last_outcome": last.shown_outcome if last else None,
        "last_fire": iso_in(last.nominal, last.zone) if last else None,
        "last_fire_at": last.nominal if last else None,
        "warnings": ["the config could not be read: schedule and policies unknown"],
    }
