"""Where named limits are kept: one *hold* per limit a run or a fire took.

A hold is a row (``limit_holds``): the limit's name, the holder (a kanban run or a cron fire),
the host and card group it was taken for, when it was taken (the store's clock) and when it was
released. Concurrency counts the holds not yet released; a rate counts the holds taken within
its window, released or not. Kanban and cron write the same table, so a cron fire and a kanban
run using one limit share it (:mod:`dispatcher.launch.limits` decides; this module stores).

Every operation runs inside the caller's transaction, so taking a limit commits with the claim
that takes it and releasing it with the run or fire that ends it:

* :func:`try_take`: read what the limits hold, ask :func:`~dispatcher.launch.limits.refusal`,
  and take them all or none. The caller must have serialized it against every other taking
  (SQLite: its single writer; PostgreSQL: the board's budget lock, which cron takes too);
* :func:`release`: the holder ended (same transaction as its outcome);
* :func:`prune`: released holds older than any window may go.

The SQL is written once in the dialect SQLite and PostgreSQL share (``?`` placeholders).
:class:`MemoryHolds` keeps the same promises in memory for the in-memory stores (one shared by
a memory board and a memory ledger makes them share limits, as one database does).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dispatcher.launch.limits import LimitWait, Tally, Wants, refusal

__all__ = [
    "Holder",
    "MemoryHolds",
    "Taking",
    "prune",
    "release",
    "tallies",
    "try_take",
]

PRUNE_HORIZON = 86400.0
"""Released holds are kept at least this long (longer for a longer rate window)."""


class _Connection(Protocol):
    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Any:
        """Run one statement with ``?`` placeholders."""


@dataclass(frozen=True)
class Holder:
    """What holds a limit: a kanban run (``run``, its run id) or a cron fire (``fire``, its
    ledger row id)."""

    kind: str
    id: str


@dataclass(frozen=True, kw_only=True)
class Taking:
    """One start asking for its limits: which (``wants``), for whom, on which host (None: the
    one host) and in which card group."""

    wants: Wants
    holder: Holder
    host: str | None = None
    group: str | None = None

    def names(self) -> list[str]:
        """The limits' names."""
        return [name for name, _ in self.wants]


def tallies(
    conn: _Connection, wants: Wants, now: float, *, since: Mapping[str, float] | None = None
) -> dict[str, Tally]:
    """What the holds of ``wants`` say at ``now``: open holds by (host, group), and for each
    rate the starts of its window (``since``: an earlier start per name, to read more)."""
    if not wants:
        return {}
    names = [name for name, _ in wants]
    marks = ", ".join("?" for _ in names)
    opened: dict[str, dict[tuple[str | None, str | None], int]] = {name: {} for name in names}
    for row in conn.execute(
        "SELECT limit_name, host_id, group_name, count(*) FROM limit_holds"  # noqa: S608
        f" WHERE released_at IS NULL AND limit_name IN ({marks})"
        " GROUP BY limit_name, host_id, group_name",
        names,
    ).fetchall():
        opened[row[0]][(row[1], row[2])] = int(row[3])
    found = {}
    for name, spec in wants:
        starts: tuple[tuple[float, str | None], ...] = ()
        if spec.rate is not None:
            begin = min(now - spec.rate.window, (since or {}).get(name, now))
            rows = conn.execute(
                "SELECT taken_at, host_id FROM limit_holds WHERE limit_name = ? AND taken_at > ?",
                (name, begin),
            ).fetchall()
            starts = tuple((float(row[0]), row[1]) for row in rows)
        found[name] = Tally(open=opened[name], starts=starts)
    return found


def try_take(conn: _Connection, taking: Taking, now: float) -> LimitWait | None:
    """Take every limit of ``taking`` at ``now``, or none: the wait when one is full. The
    caller holds the lock that serializes takings (see the module docstring)."""
    if not taking.wants:
        return None
    seen = tallies(conn, taking.wants, now)
    wait = refusal(taking.wants, seen, host=taking.host, group=taking.group, now=now)
    if wait is not None:
        return wait
    for name in taking.names():
        conn.execute(
            "INSERT INTO limit_holds (limit_name, holder_kind, holder_id, host_id, group_name,"
            " taken_at) VALUES (?, ?, ?, ?, ?, ?)",
            (name, taking.holder.kind, taking.holder.id, taking.host, taking.group, now),
        )
    return None


def release(conn: _Connection, holder: Holder, now: float) -> None:
    """The holder ended: its holds stop counting toward concurrency (a rate still counts
    their starts until its window passes)."""
    conn.execute(
        "UPDATE limit_holds SET released_at = ?"
        " WHERE holder_kind = ? AND holder_id = ? AND released_at IS NULL",
        (now, holder.kind, holder.id),
    )


def prune(conn: _Connection, before: float, *, chunk: int = 1000) -> int:
    """Delete released holds taken before ``before``, walking the table from its oldest rows
    and stopping at the first recent chunk (rows are added in time order). Returns how many."""
    removed, after = 0, 0
    while True:
        rows = conn.execute(
            "SELECT id, taken_at, released_at FROM limit_holds WHERE id > ? ORDER BY id LIMIT ?",
            (after, chunk),
        ).fetchall()
        old = [int(row[0]) for row in rows if row[1] < before and row[2] is not None]
        if old:
            marks = ", ".join("?" for _ in old)
            conn.execute(f"DELETE FROM limit_holds WHERE id IN ({marks})", old)  # noqa: S608
            removed += len(old)
        if len(rows) < chunk or rows[-1][1] >= before:
            return removed
        after = int(rows[-1][0])


def horizon(windows: Iterable[float]) -> float:
    """How long released holds are kept: a day, or the longest rate window if longer."""
    return max([PRUNE_HORIZON, *windows])


@dataclass(frozen=True, kw_only=True)
class _Hold:
    limit: str
    holder: Holder
    host: str | None
    group: str | None
    taken_at: float
    released_at: float | None = None


class MemoryHolds:
    """The holds in memory, with the same promises (see the module docstring); one lock makes
    every taking atomic."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._holds: list[_Hold] = []

    def tallies(self, wants: Wants, now: float) -> dict[str, Tally]:
        """As :func:`tallies`."""
        with self._lock:
            found = {}
            for name, spec in wants:
                opened: dict[tuple[str | None, str | None], int] = {}
                starts = []
                for hold in self._holds:
                    if hold.limit != name:
                        continue
                    if hold.released_at is None:
                        key = (hold.host, hold.group)
                        opened[key] = opened.get(key, 0) + 1
                    if spec.rate is not None and hold.taken_at > now - spec.rate.window:
                        starts.append((hold.taken_at, hold.host))
                found[name] = Tally(open=opened, starts=tuple(starts))
            return found

    def try_take(self, taking: Taking, now: float) -> LimitWait | None:
        """As :func:`try_take`."""
        with self._lock:
            seen = self.tallies(taking.wants, now)
            wait = refusal(taking.wants, seen, host=taking.host, group=taking.group, now=now)
            if wait is None:
                self._holds += [
                    _Hold(
                        limit=name,
                        holder=taking.holder,
                        host=taking.host,
                        group=taking.group,
                        taken_at=now,
                    )
                    for name in taking.names()
                ]
            return wait

    def release(self, holder: Holder, now: float) -> None:
        """As :func:`release`."""
        with self._lock:
            self._holds = [
                replace(h, released_at=now) if h.holder == holder and h.released_at is None else h
                for h in self._holds
            ]

    def prune(self, before: float) -> int:
        """As :func:`prune`."""
        with self._lock:
            kept = [h for h in self._holds if h.released_at is None or h.taken_at >= before]
            removed = len(self._holds) - len(kept)
            self._holds = kept
            return removed
