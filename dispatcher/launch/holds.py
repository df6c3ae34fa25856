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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dispatcher.launch.limits import (
    Held,
    LimitScope,
    LimitSpec,
    LimitWait,
    Tally,
    Wants,
    refusal,
    tally_of,
)

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
    conn: _Connection,
    wants: Wants,
    now: float,
    *,
    host: str | None = None,
    group: str | None = None,
    every_group: bool = False,
) -> dict[str, Tally]:
    """What the holds of ``wants`` count for a start on ``host`` in ``group`` at ``now`` (as
    :func:`~dispatcher.launch.limits.tally_of` defines it, apart from ``in_use`` of a limit
    without a concurrency cap, which a claim does not need: it stays 0): one statement for
    every limit together, each count an index range (``every_group``: everything, with the
    open holds of every group, for views, one statement per limit)."""
    if every_group:
        return {name: _tally_of_all(conn, name, spec, now, host) for name, spec in wants}
    parts, params = counts(wants, now, host=host, group=group)
    values = list(conn.execute("SELECT " + ", ".join(parts), params).fetchone()) if parts else []
    return read_counts(conn, values, wants, now, host=host, group=group)


def counts(
    wants: Wants,
    now: float,
    *,
    host: str | None,
    group: str | None,
    clock: str | None = None,
) -> tuple[list[str], list[Any]]:
    """The counts a claim of ``wants`` needs, as SELECT expressions and their parameters (so a
    store may put them into a statement of its own; :func:`read_counts` reads them back).
    ``clock``: an SQL expression for now (a cluster's statement clock); None: ``now``."""
    parts: list[str] = []
    params: list[Any] = []
    for name, spec in wants:
        where, extra = _counted(spec, host)
        if spec.concurrency is not None:
            parts.append(_count(_OPEN + where))
            params += [name, *extra]
        if spec.per_group is not None:
            parts.append(_count(_OPEN + _group(group) + where))
            params += [name, *([] if group is None else [group]), *extra]
        if spec.rate is not None:
            since = "?" if clock is None else f"{clock} - ?"
            parts.append(_count(f"limit_name = ? AND taken_at > {since}{where}"))
            window = now - spec.rate.window if clock is None else spec.rate.window
            params += [name, window, *extra]
    return parts, params


def read_counts(
    conn: _Connection,
    values: list[Any],
    wants: Wants,
    now: float,
    *,
    host: str | None,
    group: str | None,
) -> dict[str, Tally]:
    """The tallies from the values of :func:`counts` (in order), reading a full rate window's
    oldest counted start (the time the next start waits for) only when a window is full."""
    found = {}
    for name, spec in wants:
        in_use = int(values.pop(0)) if spec.concurrency is not None else 0
        groups = {group: int(values.pop(0))} if spec.per_group is not None else {}
        starts = int(values.pop(0)) if spec.rate is not None else 0
        nth = None
        if spec.rate is not None and starts >= spec.rate.starts:
            where, extra = _counted(spec, host)
            nth = _nth_start(conn, name, where, extra, now - spec.rate.window, spec.rate.starts)
        found[name] = Tally(in_use=in_use, groups=groups, starts=starts, nth_start=nth)
    return found


def _tally_of_all(
    conn: _Connection, name: str, spec: LimitSpec, now: float, host: str | None
) -> Tally:
    """Everything about one limit (views): its open holds, by group, and its window."""
    where, extra = _counted(spec, host)
    groups: dict[str | None, int] = {}
    for counted in conn.execute(
        f"SELECT group_name, count(*) FROM limit_holds WHERE {_OPEN}{where}"  # noqa: S608
        " GROUP BY group_name",
        [name, *extra],
    ).fetchall():
        groups[counted[0]] = int(counted[1])
    starts, nth = 0, None
    if spec.rate is not None:
        since = now - spec.rate.window
        row = conn.execute(f"SELECT {_count(_STARTED + where)}", [name, since, *extra]).fetchone()
        starts = int(row[0])
        if starts >= spec.rate.starts:
            nth = _nth_start(conn, name, where, extra, since, spec.rate.starts)
    return Tally(in_use=sum(groups.values()), groups=groups, starts=starts, nth_start=nth)


def _nth_start(
    conn: _Connection, name: str, where: str, extra: list[Any], since: float, nth: int
) -> float:
    """The ``nth`` most recent start of ``name`` after ``since`` (read only when the window is
    full: the time the next start waits for)."""
    row = conn.execute(
        f"SELECT taken_at FROM limit_holds WHERE {_STARTED}{where}"  # noqa: S608
        " ORDER BY taken_at DESC LIMIT 1 OFFSET ?",
        [name, since, *extra, nth - 1],
    ).fetchone()
    return float(row[0])


def _count(condition: str) -> str:
    # Conditions are built from the constants here, never from input.
    return f"(SELECT count(*) FROM limit_holds WHERE {condition})"  # noqa: S608


_OPEN = "limit_name = ? AND released_at IS NULL"
_STARTED = "limit_name = ? AND taken_at > ?"


def _counted(spec: LimitSpec, host: str | None) -> tuple[str, list[Any]]:
    """The condition that keeps only the holds ``spec`` counts for ``host`` (a host-scoped
    limit counts its own host's; a host of None is a single host, whose holds are all its)."""
    if spec.scope is LimitScope.HOST and host is not None:
        return " AND host_id = ?", [host]
    return "", []


def _group(group: str | None) -> str:
    return " AND group_name IS NULL" if group is None else " AND group_name = ?"


def check(conn: _Connection, taking: Taking, now: float) -> LimitWait | None:
    """Whether ``taking`` must wait (the first full limit), read inside the caller's lock."""
    if not taking.wants:
        return None
    seen = tallies(conn, taking.wants, now, host=taking.host, group=taking.group)
    return refusal(taking.wants, seen, group=taking.group)


def rows(taking: Taking, now: float) -> tuple[str, list[Any]]:
    """``VALUES`` marks for ``limit_holds (HOLD_COLUMNS)`` and their values: one hold per limit
    of ``taking``, taken at ``now`` (a PostgreSQL claim writes them in its one statement)."""
    marks = ", ".join("(?, ?, ?, ?, ?, ?)" for _ in taking.wants)
    holder = taking.holder
    values = [
        value
        for name in taking.names()
        for value in (name, holder.kind, holder.id, taking.host, taking.group, now)
    ]
    return marks, values


HOLD_COLUMNS = "limit_name, holder_kind, holder_id, host_id, group_name, taken_at"


def try_take(conn: _Connection, taking: Taking, now: float) -> LimitWait | None:
    """Take every limit of ``taking`` at ``now``, or none: the wait when one is full. The
    caller holds the lock that serializes takings (see the module docstring)."""
    wait = check(conn, taking, now)
    if wait is None and taking.wants:
        marks, values = rows(taking, now)
        conn.execute(f"INSERT INTO limit_holds ({HOLD_COLUMNS}) VALUES {marks}", values)  # noqa: S608
    return wait


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
    held: Held


class MemoryHolds:
    """The holds in memory, with the same promises (see the module docstring); one lock makes
    every taking atomic."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._holds: list[_Hold] = []

    def tallies(
        self,
        wants: Wants,
        now: float,
        *,
        host: str | None = None,
        group: str | None = None,
        every_group: bool = False,
    ) -> dict[str, Tally]:
        """As :func:`tallies`."""
        with self._lock:
            found = {}
            for name, spec in wants:
                mine = [h.held for h in self._holds if h.limit == name]
                tally = tally_of(spec, mine, host=host, now=now)
                if not every_group:
                    wanted = {group: tally.groups.get(group, 0)} if spec.per_group else {}
                    tally = replace(tally, groups=wanted)
                found[name] = tally
            return found

    def try_take(self, taking: Taking, now: float) -> LimitWait | None:
        """As :func:`try_take`."""
        with self._lock:
            seen = self.tallies(taking.wants, now, host=taking.host, group=taking.group)
            wait = refusal(taking.wants, seen, group=taking.group)
            if wait is None:
                held = Held(host=taking.host, group=taking.group, taken_at=now)
                self._holds += [
                    _Hold(limit=name, holder=taking.holder, held=held) for name in taking.names()
                ]
            return wait

    def release(self, holder: Holder, now: float) -> None:
        """As :func:`release`."""
        with self._lock:
            self._holds = [
                replace(h, held=replace(h.held, released=True)) if h.holder == holder else h
                for h in self._holds
            ]

    def prune(self, before: float) -> int:
        """As :func:`prune`."""
        with self._lock:
            kept = [h for h in self._holds if not h.held.released or h.held.taken_at >= before]
            removed = len(self._holds) - len(kept)
            self._holds = kept
            return removed
