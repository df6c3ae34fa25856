"""Which ledger changes are notifications, written in the change's own transaction.

A fire that settles (``completed``, a failure, ``spawn_refused``) or is recorded ``missed``
queues its message on the connection that wrote the row, as does a pause (``cron pause``, or
``on_exhausted: pause``); the ledger
(:mod:`dispatcher.cron.ledger`, and the cluster's, which shares its transactions) calls these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dispatcher.cron.records import FireRecord
from dispatcher.launch.outbox import ENDINGS, Outbox, Subject, Tail

__all__ = ["NOTIFIED", "fires", "paused"]

NOTIFIED = {
    "completed": "cron.completed",
    "missed": "cron.missed",
    "spawn_refused": "cron.spawn_refused",
} | dict.fromkeys(("failed", "timed_out", "lost", "failed_start", "config_error"), "cron.failed")
"""The outcomes of a settled fire a notification rule can listen to, by their notify name."""


def fires(conn: Any, outbox: Outbox, row_ids: Sequence[int], output: Tail | None = None) -> None:
    """Queue the message of each of these rows that is settled with a notified outcome
    (``output``: the end of its worker's output, for a fire that ran)."""
    if not any(outbox.wants(event) for event in set(NOTIFIED.values())):
        return
    for row_id in row_ids:
        row = conn.execute("SELECT * FROM cron_fires WHERE id = ?", (row_id,)).fetchone()
        fire = FireRecord.from_row(row)
        event = NOTIFIED.get(fire.outcome.value if fire.outcome else "")
        if event is None or not outbox.wants(event):
            continue
        fields = {
            "job": fire.job_id,
            "fire": {
                "key": fire.fire_key,
                "nominal": fire.nominal,
                "outcome": fire.shown_outcome,
                "exit_code": fire.exit_code,
                "signal": fire.signal,
                "error": fire.error,
                "started_at": fire.started_at,
                "ended_at": fire.ended_at,
            },
        }
        if output is not None and event in ENDINGS:
            fields |= output.fields()
        at = fire.ended_at if fire.ended_at is not None else fire.decided_at
        outbox.record(conn, event, fields, Subject(job=fire.job_id), at)


def paused(conn: Any, outbox: Outbox, job_id: str, now: float, reason: str | None = None) -> None:
    """Queue ``cron.paused`` for ``job_id``: by ``dispatch cron pause`` (``by: operator``), or
    by dispatch itself after a fire failed every attempt (``by: dispatch`` and the reason)."""
    if outbox.wants("cron.paused"):
        fields = {"job": job_id, "by": "dispatch" if reason else "operator", "reason": reason}
        outbox.record(conn, "cron.paused", fields, Subject(job=job_id), now)
