"""The notification outbox's write side: routing an event to channels, in the event's own
transaction.

A board or ledger change that people want to hear about (a card blocked, a cron fire failed)
writes one ``notify_outbox`` row per channel its rules route it to, with the same connection
and inside the same transaction as the event it reports: the event and its message commit
together or not at all, so a crash between "it happened" and "tell someone" cannot lose the
message. Delivery (the sender in ``dispatch serve``) reads the outbox later.

This lives in the launch core because both cron and kanban write it and neither may import the
other; the table itself is the ``notify`` component's (:mod:`dispatcher.notify.tables`), and
the routing rules are built from the ``notify:`` config section by :mod:`dispatcher.notify`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["EVENTS", "Outbox", "Route", "Subject"]

EVENTS: tuple[str, ...] = (
    "card.added",
    "card.done",
    "card.review",
    "card.blocked",
    "card.gave_up",
    "card.failed",
    "card.oom_killed",
    "card.deferred",
    "breaker.tripped",
    "infrastructure.refusing",
    "infrastructure.recovered",
    "cron.completed",
    "cron.failed",
    "cron.missed",
    "cron.spawn_refused",
    "cron.paused",
    "host.lost",
    "host.rescued",
    "reload.rejected",
)
"""The event names a rule's ``on:`` may list (docs/notify.md shows each message's JSON)."""


class _Connection(Protocol):
    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Any:
        """Run one statement with ``?`` placeholders."""


@dataclass(frozen=True, kw_only=True)
class Subject:
    """What a rule's filters look at: the card's assignee and group, or the cron job's id."""

    assignee: str | None = None
    job: str | None = None
    group: str | None = None
    """The card's group (None: a card without one, or not a card)."""


@dataclass(frozen=True, kw_only=True)
class Route:
    """One rule: these events, narrowed by the filters (empty: any), go to these channels."""

    events: frozenset[str]
    channels: tuple[str, ...]
    assignees: frozenset[str] = frozenset()
    jobs: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()

    def matches(self, event: str, subject: Subject) -> bool:
        """Whether a message about ``event`` on ``subject`` goes this route's way."""
        if event not in self.events:
            return False
        if self.assignees and subject.assignee not in self.assignees:
            return False
        if self.groups and subject.group not in self.groups:
            return False
        return not (self.jobs and subject.job not in self.jobs)


def channels_for(routes: Sequence[Route], event: str, subject: Subject) -> list[str]:
    """The channels ``event`` goes to, each once, in the order rules name them."""
    found: list[str] = []
    for route in routes:
        if route.matches(event, subject):
            found += [c for c in route.channels if c not in found]
    return found


class Outbox:
    """Writes messages for routed events into ``notify_outbox`` (see the module docstring)."""

    def __init__(self, routes: Sequence[Route]) -> None:
        self.routes = tuple(routes)
        """Replaced in place by a reload: every store holding this outbox routes the new way."""

    def wants(self, event: str) -> bool:
        """Whether any rule listens to ``event`` (cheap: saves building the message)."""
        return any(event in route.events for route in self.routes)

    def record(
        self,
        conn: _Connection,
        event: str,
        fields: Mapping[str, Any],
        subject: Subject,
        now: float,
    ) -> str | None:
        """Queue the message for ``event`` on every routed channel, on ``conn`` (the caller's
        open transaction); its id (shared by every channel's row), None if no rule routes it."""
        channels = channels_for(self.routes, event, subject)
        if not channels:
            return None
        import uuid  # here: every short write command loads this module, few route a message

        message_id = uuid.uuid4().hex
        body = json.dumps(
            {"id": message_id, "event": event, "at": now, **fields}, default=str, sort_keys=True
        )
        for channel in channels:
            conn.execute(
                "INSERT INTO notify_outbox (message_id, channel, event, created_at, body,"
                " state, attempts, next_at, since) VALUES (?, ?, ?, ?, ?, 'pending', 0, ?, ?)",
                (message_id, channel, event, now, body, now, now),
            )
        return message_id

    def record_new(
        self,
        write: Callable[[], AbstractContextManager[Any]],
        event: str,
        fields: Mapping[str, Any],
        subject: Subject,
        now: float,
    ) -> str | None:
        """:meth:`record` in a transaction of its own (``write`` opens one), for an event that
        is no database change (a rejected reload); None when no rule routes it."""
        if not self.wants(event):
            return None
        with write() as conn:
            return self.record(conn, event, fields, subject, now)
