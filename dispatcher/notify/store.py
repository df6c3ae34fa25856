"""Reading and settling the outbox: claim due deliveries, record what happened, list, retry.

The SQL is the one dialect both backends share (``?`` placeholders). A claim marks its rows
with ``claimed_until`` in a short transaction and delivers outside it, so a slow receiver holds
no lock; a sender that dies mid-delivery leaves rows whose claim expires and another sender
(or the same one after a restart) delivers them again: at least once. In cluster mode the claim
reads with ``FOR UPDATE SKIP LOCKED`` so two hosts never take the same row at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dispatcher.timefmt import iso
from scope.foundation.errors import NotFoundError
from scope.foundation.ids import MAX_CANDIDATES, IdKind, lookup

__all__ = ["MESSAGE_IDS", "Delivery", "NotifyStore"]

MESSAGE_IDS = IdKind(name="notification", prefix="", digits=32, listing="dispatch notify list")
"""Message ids (32 hex digits), found by a unique prefix like every other id."""

_COLUMNS = (
    "message_id, channel, event, created_at, body, state, attempts, next_at, since,"
    " last_error, delivered_at"
)


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """One message on one channel, as stored."""

    message_id: str
    channel: str
    event: str
    created_at: float
    body: str
    state: str
    attempts: int
    next_at: float
    since: float
    last_error: str | None
    delivered_at: float | None

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of ``dispatch notify list --json`` (the body stays out)."""
        return {
            "id": self.message_id,
            "channel": self.channel,
            "event": self.event,
            "created_at": iso(self.created_at),
            "state": self.state,
            "attempts": self.attempts,
            "next_at": iso(self.next_at),
            "last_error": self.last_error,
            "delivered_at": iso(self.delivered_at),
        }


def _delivery(row: Any) -> Delivery:
    return Delivery(
        message_id=row[0],
        channel=row[1],
        event=row[2],
        created_at=float(row[3]),
        body=row[4],
        state=row[5],
        attempts=int(row[6]),
        next_at=float(row[7]),
        since=float(row[8]),
        last_error=row[9],
        delivered_at=None if row[10] is None else float(row[10]),
    )


class NotifyStore:
    """The outbox in one database (see the module docstring).

    ``write`` opens a write transaction (the state database's ``write``, or the cluster
    database's without the board lock); ``skip_locked``: PostgreSQL's row locks guard claims.
    """

    def __init__(
        self,
        read: Callable[[], contextlib.AbstractContextManager[Any]],
        write: Callable[[], contextlib.AbstractContextManager[Any]],
        *,
        skip_locked: bool = False,
    ) -> None:
        self._read = read
        self._write = write
        self._lock_clause = " FOR UPDATE SKIP LOCKED" if skip_locked else ""
        self.shared = skip_locked
        """Other hosts' senders claim from this outbox too (cluster mode)."""

    def write(self) -> contextlib.AbstractContextManager[Any]:
        """A write transaction on the outbox's database."""
        return self._write()

    def release_claims(self) -> int:
        """Forget every claim (how many there were). Only for the one sender of an outbox
        nobody shares, at its start: any claim then is a killed predecessor's."""
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE notify_outbox SET claimed_until = NULL WHERE claimed_until IS NOT NULL"
            )
            return int(cursor.rowcount)

    def claim(
        self, *, now: float, lease: float, limit: int = 16, created_since: float | None = None
    ) -> list[Delivery]:
        """Due pending deliveries, fenced for ``lease`` seconds against other senders; with
        ``created_since`` only messages made since then (new ones, not a backlog's retries)."""
        fresh = "" if created_since is None else " AND created_at >= ?"
        since = () if created_since is None else (created_since,)
        with self._write() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM notify_outbox WHERE state = 'pending' AND next_at <= ?"  # noqa: S608
                f" AND (claimed_until IS NULL OR claimed_until < ?){fresh}"
                f" ORDER BY next_at LIMIT ?{self._lock_clause}",
                (now, now, *since, limit),
            ).fetchall()
            for row in rows:
                conn.execute(
                    "UPDATE notify_outbox SET claimed_until = ? WHERE message_id = ?"
                    " AND channel = ?",
                    (now + lease, row[0], row[1]),
                )
        return [_delivery(row) for row in rows]

    def settle(
        self, item: Delivery, *, now: float, error: str | None, retry_at: float | None
    ) -> None:
        """Record one attempt: delivered (``error`` None), retried at ``retry_at``, or dead
        (``retry_at`` None)."""
        if error is None:
            state, next_at, delivered = "delivered", item.next_at, now
        else:
            state = "pending" if retry_at is not None else "dead"
            next_at, delivered = (retry_at if retry_at is not None else now), None
        with self._write() as conn:
            conn.execute(
                "UPDATE notify_outbox SET state = ?, attempts = attempts + 1, next_at = ?,"
                " last_error = ?, delivered_at = ?, claimed_until = NULL"
                " WHERE message_id = ? AND channel = ?",
                (state, next_at, error, delivered, item.message_id, item.channel),
            )

    def list(self, *, state: str | None = None, limit: int = 100) -> list[Delivery]:
        """Deliveries, newest first; only those in ``state`` when given."""
        where, params = ("WHERE state = ? ", [state]) if state else ("", [])
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM notify_outbox {where}"  # noqa: S608 - constants
                "ORDER BY created_at DESC, message_id, channel LIMIT ?",
                (*params, limit),
            ).fetchall()
        return [_delivery(row) for row in rows]

    def ids_starting(self, prefix: str, limit: int) -> tuple[str, ...]:
        """Message ids that start with ``prefix``, sorted, at most ``limit`` (an index range:
        message ids are hex, so every id starting with it sorts below the prefix + ``g``)."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT DISTINCT message_id FROM notify_outbox"
                " WHERE message_id >= ? AND message_id < ? ORDER BY message_id LIMIT ?",
                (prefix, prefix + "g", limit),
            ).fetchall()
        return tuple(str(row[0]) for row in rows)

    def retry_named(self, text: str, *, now: float) -> tuple[str, int]:
        """``dispatch notify retry`` and the API's: the message ``text`` names (its id or a
        unique prefix, :data:`MESSAGE_IDS`) made due now; its id and the rows touched.
        NotFoundError when it names none or nothing of it is undelivered."""
        found = lookup(text, MESSAGE_IDS, starting=lambda p: self.ids_starting(p, MAX_CANDIDATES))
        touched = self.retry(found, now=now)
        if not touched:
            raise NotFoundError("undelivered notification", found)
        return found, touched

    def retry(self, message_id: str, *, now: float) -> int:
        """Make a message's dead (or pending) deliveries due now with a fresh deadline; how
        many rows that touched (0: no such message, or all delivered)."""
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE notify_outbox SET state = 'pending', next_at = ?, since = ?,"
                " claimed_until = NULL WHERE message_id = ? AND state != 'delivered'",
                (now, now, message_id),
            )
            return int(cursor.rowcount)
