"""JSON-ready views of cron jobs and ledger rows (``dispatch cron list/history --json``).

Timestamps are ISO-8601 with a numeric offset and whole seconds, in the job's zone; ids are
strings; durations are numbers of seconds.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from dispatcher.cron.plan import JobPlan, job_active
from dispatcher.cron.records import FireRecord, JobState, RetryKind, Status, Try
from dispatcher.cron.zones import load_zone
from dispatcher.launch.outcome import Outcome
from dispatcher.launch.resources import resources_json
from dispatcher.timefmt import TimeView, relative
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


def policies(plan: JobPlan, attempts: int | None = None) -> dict[str, Any]:
    """The job's policies with every default spelled out (``attempts``: tries per fire its
    retry policy gives, None without one)."""
    job = plan.job
    return {
        "overlap": job.overlap.value,
        "catch_up": job.catch_up.value,
        "catch_up_window": job.catch_up_window,
        "catch_up_max": job.catch_up_max,
        "jitter": job.jitter,
        "timeout": job.timeout,
        "attempts": attempts,
        "on_exhausted": job.on_exhausted.value,
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
    if p.get("attempts"):
        text += f" attempts={p['attempts']}"
    if p.get("on_exhausted") not in (None, "none"):
        text += f" on_exhausted={p['on_exhausted']}"
    return text


def job_entry(
    plan: JobPlan,
    state: JobState | None,
    next_fire: float | None,
    last: FireRecord | None,
    warnings: list[str],
    attempts: int | None = None,
) -> dict[str, Any]:
    """One element of ``dispatch cron list --json``."""
    job = plan.job
    return {
        "id": job.id,
        "schedule": schedule_text(plan),
        "timezone": plan.zone,
        "enabled": job.enabled,
        "paused": bool(state is not None and state.paused),
        "paused_reason": state.paused_reason if state is not None else None,
        "active": job_active(job, state),
        "next_fire": iso_in(next_fire, plan.zone),
        "next_fire_at": next_fire,
        "last_outcome": last.shown_outcome if last else None,
        "last_fire": iso_in(last.nominal, last.zone) if last else None,
        "last_fire_at": last.nominal if last else None,
        **policies(plan, attempts),
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
        "attempt": row.attempt,
        "attempts": row.attempts,
        "tries": [try_entry(t, zone) for t in row.tries],
        "retry": retry_entry(row),
    }
    if sessions is not None:
        entry.update(resources_json(sessions.get(row.session_id or "")))
    return entry


def try_entry(tried: Try, zone: str) -> dict[str, Any]:
    """One ended try of a fire, as ``cron history --json`` shows it."""
    return {
        "attempt": tried.attempt,
        "outcome": tried.outcome.value,
        "counted": tried.counted,
        "exit_code": tried.exit_code,
        "signal": tried.signal,
        "session_id": tried.session_id,
        "started_at": iso_in(tried.started_at, zone),
        "ended_at": iso_in(tried.ended_at, zone),
        "error": tried.error,
    }


def retry_entry(row: FireRecord) -> dict[str, Any] | None:
    """The fire's pending next try (``attempt`` it will be, of ``attempts``; ``next_try_at``;
    ``kind`` backoff or deferred; ``reason``), or None when none is pending."""
    if row.status is not Status.RETRY or row.retry_at is None:
        return None
    kind = row.retry_kind or RetryKind.BACKOFF
    return {
        "attempt": row.attempt,
        "attempts": row.attempts,
        "next_try_at": iso_in(row.retry_at, row.zone),
        "kind": kind.value,
        "reason": row.retry_reason,
    }


def attempt_text(row: FireRecord) -> str:
    """``2 of 4`` (``1`` for a fire without a retry policy)."""
    return f"{row.attempt} of {row.attempts}" if row.attempts else str(row.attempt)


def next_try_text(row: FireRecord, view: TimeView) -> str | None:
    """``next try in 40s (backoff, attempt 3 of 4)`` or ``deferred until 14:05:00 CET by the
    worker: <reason>`` for a fire waiting for its next try; None otherwise."""
    if row.status is not Status.RETRY or row.retry_at is None:
        return None
    if row.retry_kind is RetryKind.DEFERRED:
        why = f": {row.retry_reason}" if row.retry_reason else ""
        return f"deferred until {view.at(row.retry_at, row.zone)} by the worker{why}"
    when = view.at(row.retry_at, row.zone) if view.stable else relative(row.retry_at, view.now)
    why = f" ({row.retry_reason})" if row.retry_reason else ""
    return f"next try {when}{why}"


def try_text(tried: Try, attempts: int | None) -> str:
    """One ended try on a line: ``attempt 2 of 4: failed (exit 3)``."""
    of = f" of {attempts}" if attempts else ""
    what = tried.outcome.value
    if tried.signal:
        what += f" ({tried.signal})"
    elif tried.exit_code is not None and tried.outcome is not Outcome.COMPLETED:
        what += f" (exit {tried.exit_code})"
    if not tried.counted:
        what += ", not counted"
    session = f", session {tried.session_id}" if tried.session_id else ""
    return f"attempt {tried.attempt}{of}: {what}{session}"


def history_lines(row: FireRecord, view: TimeView) -> list[str]:
    """The lines ``cron history`` prints under a fire that has retries: each ended try, then
    the pending next try (nothing for a fire of one try without a retry policy)."""
    failed_after_retries = row.attempts is not None and row.retry_reason is not None
    if len(row.tries) <= 1 and row.status is not Status.RETRY and not failed_after_retries:
        return []
    lines = [try_text(t, row.attempts) for t in row.tries]
    pending = next_try_text(row, view)
    if pending is not None:
        lines.append(pending)
    elif row.status is Status.DONE and row.retry_reason:
        lines.append(f"no further try: {row.retry_reason}")
    return lines


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
