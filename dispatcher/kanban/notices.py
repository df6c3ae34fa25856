"""Which card events are notifications, and writing them to the outbox in the event's own
transaction (:meth:`dispatcher.kanban.sql.SqlBoard._event` calls :func:`record`).

Most card events map to one notification by kind. Three derive from the event's data: a
``blocked`` event the taxonomy wrote (no ``by``: neither the worker nor an operator) is also
``breaker.tripped``; a ``failed`` event whose outcome is ``oom_killed`` is also
``card.oom_killed``; and infrastructure refusals are reported once for the whole board, not per
card: the first infrastructure ``spawn_refused`` while none is outstanding is
``infrastructure.refusing``, and the next successful spawn is ``infrastructure.recovered``. The
outstanding refusal is the ``kanban_meta`` row :data:`REFUSING_KEY` (written under the board's
write lock, so two hosts of a cluster cannot both report the start).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.kanban.model import EventKind
from dispatcher.launch.outbox import ENDINGS, Outbox, Subject, Tail

__all__ = ["NOTIFIED", "REFUSING_KEY", "notify_events", "record"]

NOTIFIED: Mapping[EventKind, str] = {
    EventKind.CREATED: "card.added",
    EventKind.COMPLETED: "card.done",
    EventKind.REVIEW: "card.review",
    EventKind.BLOCKED: "card.blocked",
    EventKind.GAVE_UP: "card.gave_up",
    EventKind.FAILED: "card.failed",
    EventKind.DEFERRED: "card.deferred",
}
"""The card events a notification rule can listen to, by their notify name."""

_MOVED_TO = {"blocked": "card.blocked", "done": "card.done", "review": "card.review"}

REFUSING_KEY = "notify_infra_refusing_since"
"""``kanban_meta`` key: when the outstanding infrastructure refusal began (absent: none)."""


def notify_events(kind: EventKind, data: Mapping[str, Any]) -> tuple[str, ...]:
    """The card notifications a card event is (an operator's move counts as reaching its
    target; a block by the breaker is also ``breaker.tripped``; a counted failure that was an
    OOM kill is also ``card.oom_killed``)."""
    if kind is EventKind.MOVED:
        moved = _MOVED_TO.get(str(data.get("to")))
        return (moved,) if moved else ()
    found = NOTIFIED.get(kind)
    if found is None:
        return ()
    if kind is EventKind.BLOCKED and "by" not in data:
        return (found, "breaker.tripped")
    if kind is EventKind.FAILED and data.get("outcome") == "oom_killed":
        return (found, "card.oom_killed")
    return (found,)


def record(
    outbox: Outbox,
    conn: Any,
    card_id: str,
    kind: EventKind,
    data: Mapping[str, Any],
    now: float,
    run_id: str | None,
    output: Tail | None = None,
) -> None:
    """Queue what the card event ``kind`` notifies, on ``conn`` (the event's transaction);
    ``output`` goes with the messages of a run's end (:data:`~dispatcher.launch.outbox.
    ENDINGS`)."""
    events = [e for e in notify_events(kind, data) if outbox.wants(e)]
    if kind in (EventKind.SPAWN_REFUSED, EventKind.SPAWNED):
        _infrastructure(outbox, conn, card_id, kind, data, now)
    if not events:
        return
    row = conn.execute(
        "SELECT title, assignee, status, group_name FROM kanban_cards WHERE id = ?", (card_id,)
    ).fetchone()
    card = {"id": card_id, "title": row[0], "assignee": row[1], "status": row[2], "group": row[3]}
    fields = {"card": card, "run_id": run_id, "data": dict(data)}
    for event in events:
        told = fields | output.fields() if output is not None and event in ENDINGS else fields
        outbox.record(conn, event, told, Subject(assignee=row[1], group=row[3]), now)


def _infrastructure(
    outbox: Outbox,
    conn: Any,
    card_id: str,
    kind: EventKind,
    data: Mapping[str, Any],
    now: float,
) -> None:
    # Tracked while either end is listened to: "recovered" needs the start's row.
    if not (outbox.wants("infrastructure.refusing") or outbox.wants("infrastructure.recovered")):
        return
    refused = kind is EventKind.SPAWN_REFUSED
    event = "infrastructure.refusing" if refused else "infrastructure.recovered"
    if refused and not data.get("infrastructure"):
        return
    row = conn.execute("SELECT value FROM kanban_meta WHERE key = ?", (REFUSING_KEY,)).fetchone()
    if refused and row is None:
        conn.execute("INSERT INTO kanban_meta (key, value) VALUES (?, ?)", (REFUSING_KEY, int(now)))
        fields = {"since": now, "card_id": card_id, "error": data.get("error")}
        outbox.record(conn, event, fields, Subject(), now)
    elif not refused and row is not None:
        conn.execute("DELETE FROM kanban_meta WHERE key = ?", (REFUSING_KEY,))
        fields = {"since": float(row[0]), "card_id": card_id}
        outbox.record(conn, event, fields, Subject(), now)
