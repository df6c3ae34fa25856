"""Named limits: a cap on a shared resource that kanban runs and cron fires take together.

Configured as ``limits:`` and named in ``uses:`` by assignees and cron jobs::

    limits:
      openai:  {concurrency: 6, rate: 120/1m}   # every host of the database together
      gpu:     {concurrency: 1, scope: host}    # each host for itself
      deploys: {rate: 1/5m}
      tenants: {per_group: {concurrency: 2}}    # each card group for itself

The meaning, exactly (docs/kanban.md says the same for users):

* **concurrency** counts the open holds of the limit: one per run or fire that took it and has
  not ended (claimed, spawning or running). A start that would make it exceed the cap waits.
* **rate** ``N/W`` counts starts in a sliding window: a start at time ``t`` is allowed only
  while fewer than ``N`` starts of the limit happened in ``(t - W, t]``. So no window of
  length ``W`` ever holds more than ``N`` starts. A sliding window, not a token bucket: it is
  exact and checkable from the recorded starts alone (the rows say everything; a bucket's
  level is hidden state that a restart or a second host would have to agree on), and "120 a
  minute" means what it says with no burst above it.
* **per_group** caps the open holds of each card group separately (cards without a group form
  one group; cron fires belong to it too).
* **scope** ``cluster`` (default) counts the holds of every host on the database (on SQLite:
  the one host); ``host`` counts only this host's.

A start takes every limit its assignee or job ``uses`` at once, all or nothing, inside the
transaction that claims it: :func:`refusal` is the one check, a pure function of the
:class:`Tally` a store read in that transaction. Stores serialize the check and the taking
(SQLite's writer lock, PostgreSQL's budget lock), so two limits can neither deadlock nor be
half-taken. Times are the store's clock: the caller's ``now`` on one host, the database's in a
cluster.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatcher.timefmt import relative
from scope.foundation.errors import Invalid
from scope.foundation.schema import Choice, Int, Kind, Optional, Record, setting
from scope.foundation.text import quote, strip_blanks
from scope.foundation.values import format_duration, parse_duration

__all__ = [
    "MAX_WINDOW",
    "Held",
    "LimitScope",
    "LimitSpec",
    "LimitWait",
    "PerGroup",
    "Rate",
    "RateKind",
    "Tally",
    "Usage",
    "WaitKind",
    "Wants",
    "parse_rate",
    "refusal",
    "tally_of",
    "usage",
    "wants_of",
]

MAX_WINDOW = 7 * 86400.0
"""The longest rate window (a week): starts are kept at least that long, never forever."""
MAX_STARTS = 1_000_000
_RATE = re.compile(r"([0-9]{1,18})[ \t]*/[ \t]*(.*)")
RATE_HINT = "write STARTS/WINDOW, like 120/1m or 1/5m"


@dataclass(frozen=True)
class Rate:
    """At most ``starts`` starts in any window of ``window`` seconds."""

    starts: int
    window: float

    def __str__(self) -> str:
        return f"{self.starts}/{format_duration(self.window)}"


def parse_rate(value: Any) -> Rate:
    """``120/1m`` as a :class:`Rate` (at least 1 start, a window longer than 0 and at most
    :data:`MAX_WINDOW`); :class:`Invalid` otherwise."""
    if not isinstance(value, str):
        raise Invalid(f"expected a rate, got {quote(value)}; {RATE_HINT}")
    match = _RATE.fullmatch(strip_blanks(value))
    if match is None:
        raise Invalid(f"invalid rate {quote(value)}; {RATE_HINT}")
    starts = int(match.group(1))
    if not 1 <= starts <= MAX_STARTS:
        raise Invalid(f"rate {quote(value)}: allow between 1 and {MAX_STARTS} starts per window")
    try:
        window = parse_duration(match.group(2))
    except Invalid:
        raise Invalid(f"invalid rate {quote(value)}; {RATE_HINT}") from None
    if window <= 0:
        raise Invalid(f"rate {quote(value)}: the window must be longer than 0s")
    if window > MAX_WINDOW:
        raise Invalid(f"rate {quote(value)}: the window may be at most 7d")
    return Rate(starts=starts, window=window)


class RateKind(Kind):
    """A config value read by :func:`parse_rate`."""

    label = "rate (STARTS/WINDOW, like 120/1m)"

    def convert(self, value: Any) -> Any:
        return parse_rate(value)

    def dump(self, value: Any) -> Any:
        return str(value)


class LimitScope(enum.StrEnum):
    """Whose holds a limit counts."""

    CLUSTER = "cluster"
    """Every host's on the database (a single host's on SQLite)."""
    HOST = "host"
    """Only the holds of the host that is starting something."""


@dataclass(frozen=True, kw_only=True)
class PerGroup:
    """``limits.<name>.per_group``: a cap for each card group separately."""

    concurrency: int = setting(
        kind=Int(min=1, max=MAX_STARTS),
        doc="Open runs holding the limit at once within one card group.",
    )


@dataclass(frozen=True, kw_only=True)
class LimitSpec:
    """One entry of ``limits:``."""

    concurrency: int | None = setting(
        None,
        kind=Optional(Int(min=1, max=MAX_STARTS)),
        doc="Open runs and cron fires holding the limit at once (claimed, spawning or running).",
    )
    rate: Rate | None = setting(
        None,
        kind=Optional(RateKind()),
        doc="Starts allowed in any sliding window, as STARTS/WINDOW (120/1m, 1/5m; the window "
        "at most 7d).",
    )
    scope: LimitScope = setting(
        LimitScope.CLUSTER,
        kind=Choice(LimitScope),
        doc="cluster: counted over every host of the cluster database (on SQLite, the one "
        "host); host: each host counts only its own runs.",
    )
    per_group: PerGroup | None = setting(
        None,
        kind=Optional(Record(PerGroup)),
        doc="Caps for each card group separately (cards without a group form one group).",
    )

    def check(self) -> None:
        """A limit must limit something."""
        if self.concurrency is None and self.rate is None and self.per_group is None:
            raise Invalid("give concurrency, rate or per_group: this limit limits nothing")


Wants = tuple[tuple[str, LimitSpec], ...]
"""The limits one start takes: (name, spec) in the order its ``uses`` lists them."""


def wants_of(uses: Iterable[str], limits: Mapping[str, LimitSpec]) -> Wants:
    """The :data:`Wants` of a ``uses`` list (names the config does not define are left out:
    the config check refuses them, so only a stale caller can pass one)."""
    return tuple((name, limits[name]) for name in dict.fromkeys(uses) if name in limits)


@dataclass(frozen=True, kw_only=True)
class Tally:
    """One limit as a store counted it for a start on one host at one moment: its open holds
    (this host's only, for ``scope: host``), those of each group read, and the starts its
    rate window counts."""

    in_use: int = 0
    groups: Mapping[str | None, int] = field(default_factory=dict)
    """Open holds by card group (the groups read: the start's own, or every group)."""
    starts: int = 0
    """Starts in the rate window ending now."""
    nth_start: float | None = None
    """The ``rate.starts``-th most recent of those starts (None: fewer were counted): when it
    leaves the window, the window lets the next start in."""


@dataclass(frozen=True, kw_only=True)
class Held:
    """One hold as the pure functions see it (what the in-memory store keeps)."""

    host: str | None
    group: str | None
    taken_at: float
    released: bool = False


def tally_of(spec: LimitSpec, holds: Iterable[Held], *, host: str | None, now: float) -> Tally:
    """The :class:`Tally` of ``holds`` (one limit's) for a start on ``host`` at ``now``: the
    reference the SQL stores' counts follow. A host of None is the single host of a SQLite
    board: every hold is its own."""
    counted = [
        h for h in holds if spec.scope is LimitScope.CLUSTER or host is None or h.host == host
    ]
    opened = [h for h in counted if not h.released]
    groups: dict[str | None, int] = {}
    for hold in opened:
        groups[hold.group] = groups.get(hold.group, 0) + 1
    starts: list[float] = []
    if spec.rate is not None:
        since = now - spec.rate.window
        starts = sorted((h.taken_at for h in counted if h.taken_at > since), reverse=True)
    nth = None
    if spec.rate is not None and len(starts) >= spec.rate.starts:
        nth = starts[spec.rate.starts - 1]
    return Tally(in_use=len(opened), groups=groups, starts=len(starts), nth_start=nth)


@dataclass(frozen=True, kw_only=True)
class Usage:
    """One limit as a start in ``group`` sees it."""

    name: str
    spec: LimitSpec
    in_use: int
    """Open holds counted (this host's only, for ``scope: host``)."""
    group: str | None = None
    group_in_use: int = 0
    """Open holds of ``group`` counted (``per_group`` limits)."""
    starts: int = 0
    """Starts counted in the rate window ending now."""
    next_start: float | None = None
    """When the rate window next lets a start through (None: it does now)."""


def usage(name: str, spec: LimitSpec, tally: Tally, *, group: str | None) -> Usage:
    """How full ``name`` is for a start in ``group``, from the store's :class:`Tally`."""
    next_start = None
    if spec.rate is not None and tally.nth_start is not None:
        next_start = tally.nth_start + spec.rate.window
    return Usage(
        name=name,
        spec=spec,
        in_use=tally.in_use,
        group=group,
        group_in_use=tally.groups.get(group, 0),
        starts=tally.starts,
        next_start=next_start,
    )


class WaitKind(enum.StrEnum):
    """Which cap of a limit is full."""

    CONCURRENCY = "concurrency"
    GROUP = "group"
    RATE = "rate"


@dataclass(frozen=True, kw_only=True)
class LimitWait:
    """Why a start waits: the first full limit, in the order ``uses`` lists them."""

    limit: str
    kind: WaitKind
    in_use: int = 0
    capacity: int = 0
    group: str | None = None
    next_start: float | None = None

    @property
    def reason(self) -> str:
        """``limit openai``: what a missed cron fire records."""
        return f"limit {self.limit}"

    def describe(self, now: float) -> str:
        """``limit openai (6 of 6 running)``, ``limit tenants (2 of 2 running in group
        customer-42)`` or ``limit deploys (next start in 3m12s)``."""
        if self.kind is WaitKind.RATE and self.next_start is not None:
            return f"{self.reason} (next start {relative(self.next_start, now)})"
        running = f"{self.in_use} of {self.capacity} running"
        if self.kind is WaitKind.GROUP:
            running += " without a group" if self.group is None else f" in group {self.group}"
        return f"{self.reason} ({running})"

    def to_dict(self, now: float) -> dict[str, Any]:
        """The JSON form (``next_start_in``: seconds, or null)."""
        return {
            "limit": self.limit,
            "kind": self.kind.value,
            "in_use": self.in_use,
            "capacity": self.capacity,
            "group": self.group,
            "next_start_in": None
            if self.next_start is None
            else max(0, round(self.next_start - now)),
            "text": self.describe(now),
        }


def refusal(wants: Wants, tallies: Mapping[str, Tally], *, group: str | None) -> LimitWait | None:
    """Whether a start in ``group`` that takes ``wants`` must wait, from what the store
    counted for it (``tallies`` by name; a limit not read counts as empty). None: every limit
    has room, take them all. (Called in every claim: it reads the tallies directly.)"""
    empty = Tally()
    for name, spec in wants:
        tally = tallies.get(name, empty)
        if spec.concurrency is not None and tally.in_use >= spec.concurrency:
            return LimitWait(
                limit=name,
                kind=WaitKind.CONCURRENCY,
                in_use=tally.in_use,
                capacity=spec.concurrency,
            )
        if spec.per_group is not None:
            mine = tally.groups.get(group, 0)
            if mine >= spec.per_group.concurrency:
                return LimitWait(
                    limit=name,
                    kind=WaitKind.GROUP,
                    in_use=mine,
                    capacity=spec.per_group.concurrency,
                    group=group,
                )
        if spec.rate is not None and tally.nth_start is not None:
            return LimitWait(
                limit=name,
                kind=WaitKind.RATE,
                in_use=tally.starts,
                capacity=spec.rate.starts,
                next_start=tally.nth_start + spec.rate.window,
            )
    return None
