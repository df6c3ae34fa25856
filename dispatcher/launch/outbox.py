"""The notification outbox's write side: routing an event to channels, in the event's own
transaction.

A board or ledger change that people want to hear about (a card blocked, a cron fire failed)
writes one ``notify_outbox`` row per channel its rules route it to, with the same connection
and inside the same transaction as the event it reports: the event and its message commit
together or not at all, so a crash between "it happened" and "tell someone" cannot lose the
message. Delivery (the sender in ``dispatch serve``) reads the outbox later.

A message about the end of a run or a fire (:data:`ENDINGS`) carries the end of the worker's
output (``output``, and ``output_cut: true`` when it was cut), at most ``notify.output_tail``
bytes. It is read through the registry (:meth:`Outbox.tail`: the transform and redaction hooks
applied, purpose ``notify``) before the settle's transaction opens, and handed to the store with
the result, so no database lock is held while a log is read.

This lives in the launch core because both cron and kanban write it and neither may import the
other; the table itself is the ``notify`` component's (:mod:`dispatcher.notify.tables`), and
the routing rules are built from the ``notify:`` config section by :mod:`dispatcher.notify`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from scope.foundation.errors import DispatchError

if TYPE_CHECKING:
    from registry.abc import Registry

__all__ = ["ENDINGS", "EVENTS", "OUTPUT_TAIL", "Outbox", "Route", "Subject", "Tail", "capped"]

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

ENDINGS = frozenset(
    {
        "card.done",
        "card.review",
        "card.blocked",
        "card.gave_up",
        "card.failed",
        "card.oom_killed",
        "card.deferred",
        "breaker.tripped",
        "cron.completed",
        "cron.failed",
    }
)
"""The events a run's or a fire's end may write: their messages carry the worker's output."""

OUTPUT_TAIL = 2048
"""Bytes of a worker's output a message carries by default (``notify.output_tail``)."""


@dataclass(frozen=True, kw_only=True)
class Tail:
    """The end of a worker's output as a message carries it."""

    text: str
    cut: bool
    """Earlier output was left out (the message's ``output_cut``)."""

    def fields(self) -> dict[str, Any]:
        """The message's ``output`` and ``output_cut``."""
        return {"output": self.text, "output_cut": self.cut}


def capped(text: str, cut: bool, limit: int) -> Tail:
    """The end of ``text`` in at most ``limit`` bytes of UTF-8; when anything before it is
    left out (``cut``: already by the reader), it starts at a whole line if one fits."""
    data = text.encode()
    if len(data) > limit:
        # A character split by the byte cut is dropped whole ("ignore" at the start only:
        # the rest was encoded from text).
        text = data[len(data) - limit :].decode("utf-8", "ignore") if limit > 0 else ""
        cut = True
    if cut:
        newline = text.find("\n")
        if 0 <= newline < len(text) - 1:
            text = text[newline + 1 :]
    return Tail(text=text, cut=cut)


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

    def __init__(self, routes: Sequence[Route], *, output_tail: int = OUTPUT_TAIL) -> None:
        self.routes = tuple(routes)
        """Replaced in place by a reload: every store holding this outbox routes the new way."""
        self.output_tail = output_tail
        """Bytes of a worker's output the message of its run's or fire's end carries (0: no
        output); replaced by a reload as the routes are."""

    def wants(self, event: str) -> bool:
        """Whether any rule listens to ``event`` (cheap: saves building the message)."""
        return any(event in route.events for route in self.routes)

    def tail(self, registry: Registry, session_id: str | None) -> Tail | None:
        """The end of a finished worker's output for the messages its run's or fire's end
        writes: read through ``registry`` (its hooks applied, purpose ``notify``), capped at
        :attr:`output_tail` bytes. None when no rule listens to any of :data:`ENDINGS`, no
        worker ran, or its session is gone. Call it before the settle's transaction opens."""
        if session_id is None or self.output_tail <= 0:
            return None
        if not any(route.events & ENDINGS for route in self.routes):
            return None
        try:
            snapshot = registry.tail(session_id, self.output_tail, purpose="notify")
        except (DispatchError, OSError) as err:
            # The message still goes, without output: the event matters more than its tail.
            # (logging is imported here: the short write commands load this module, not it.)
            import logging

            logging.getLogger("dispatch.notify").warning(
                "output of session %s for a notification: %s", session_id, err
            )
            return None
        return capped(snapshot.output, snapshot.output_cut > 0, self.output_tail)

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
