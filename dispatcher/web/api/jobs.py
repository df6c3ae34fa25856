"""Cron jobs: what ``dispatch cron`` does, through :class:`~dispatcher.app.cronjobs.CronJobs`
as the CLI and the dashboard use it, answering with ``cron ... --json``."""

from __future__ import annotations

import time
from typing import Any

from dispatcher.app.documents import cron_entries, history_document, paused_document
from dispatcher.cron.report import row_entry
from dispatcher.launch.resources import sessions_of
from dispatcher.web.api.spec import Call


def list_jobs(call: Call) -> list[dict[str, Any]]:
    """``GET /cron``: ``cron list --json`` (fires whose worker ended unseen are settled
    first, as the CLI does)."""
    source = call.site.source
    jobs = source.cron()
    jobs.settle_open(source.runtime)
    return cron_entries(view.entry for view in jobs.views(time.time()))


def history(call: Call) -> list[dict[str, Any]]:
    """``GET /cron/history``: ``cron history [JOB] --json``, newest first."""
    source = call.site.source
    jobs = source.cron()
    job_id = call.params["job"]
    if job_id is not None:
        jobs.check_known(job_id)
    jobs.settle_open(source.runtime)
    rows = jobs.ledger.history(job_id, call.params["limit"])
    fire_hosts = getattr(jobs.ledger, "fire_hosts", None)
    hosts = fire_hosts([row.id for row in rows]) if fire_hosts is not None else None
    ran = [row.session_id for row in rows if row.session_id]
    sessions = sessions_of(source.registry(), ran) if ran else {}
    return history_document(rows, hosts, sessions)


def run_now(call: Call) -> dict[str, Any]:
    """``POST /cron/{job_id}/run``: ``cron run --json`` (its own manual fire key; the answer
    is the ledger row as decided, not waited for)."""
    source = call.site.source
    jobs = source.cron()
    job_id = call.params["job_id"]
    jobs.plan(job_id)
    with source.cron_runtime() as runtime:
        record = jobs.scheduler(runtime).run_now(job_id)
    return row_entry(record)


def pause(call: Call) -> dict[str, Any]:
    """``POST /cron/{job_id}/pause``: ``cron pause --json``."""
    return _paused(call, True)


def resume(call: Call) -> dict[str, Any]:
    """``POST /cron/{job_id}/resume``: ``cron resume --json``."""
    return _paused(call, False)


def _paused(call: Call, paused: bool) -> dict[str, Any]:
    job_id = call.params["job_id"]
    changed = call.site.source.cron().set_paused(job_id, paused, time.time())
    return paused_document(job_id, paused, changed)
