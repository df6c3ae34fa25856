"""The board's vocabulary and records: statuses, event kinds, cards, runs, events.

Pure data: no I/O, no clock. Records are frozen; the store hands out fresh ones after every
change. The string values are the shared vocabulary (ARCHITECTURE.md): JSON output, the state
database and the docs use exactly these.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: every short write command loads these records
    from dispatcher.launch.claimant import Claimant
    from dispatcher.launch.limits import Wants
    from dispatcher.launch.outcome import Outcome


class CardStatus(enum.StrEnum):
    """Where a card is on the board."""

    TODO = "todo"
    """Waits for its parents; becomes ``ready`` when every parent is done."""
    READY = "ready"
    RUNNING = "running"
    BLOCKED = "blocked"
    REVIEW = "review"
    DONE = "done"
    ARCHIVED = "archived"


MOVE_TARGETS = (
    CardStatus.TODO,
    CardStatus.READY,
    CardStatus.BLOCKED,
    CardStatus.REVIEW,
    CardStatus.DONE,
)
"""Statuses an operator may ``move`` a card into (never ``running``; ``archive`` has its own
command)."""


class BlockKind(enum.StrEnum):
    """Why a blocked card is blocked (a breaker block has no kind: ``None``)."""

    NEEDS_INPUT = "needs_input"
    """Until an operator unblocks it."""
    TRANSIENT = "transient"
    """Back to ``ready`` after ``kanban.transient_block``."""


class EventKind(enum.StrEnum):
    """Kinds of the append-only card events."""

    CREATED = "created"
    PROMOTED = "promoted"
    CLAIMED = "claimed"
    SPAWNED = "spawned"
    COMPLETED = "completed"
    FAILED = "failed"
    TEMPFAIL = "tempfail"
    SPAWN_REFUSED = "spawn_refused"
    RESPAWN_GUARDED = "respawn_guarded"
    COOLDOWN_ENDED = "cooldown_ended"
    RECLAIMED = "reclaimed"
    BLOCKED = "blocked"
    UNBLOCKED = "unblocked"
    GAVE_UP = "gave_up"
    REVIEW = "review"
    EDITED = "edited"
    MOVED = "moved"
    ARCHIVED = "archived"
    STOPPED = "stopped"
    """An operator action (archive, move) stopped the card's live worker."""
    EXIT_IGNORED = "exit_ignored"
    """The worker had already moved its card (complete, block, review); its later exit is
    recorded here and changes nothing."""
    ASSIGNEE_UNKNOWN = "assignee_unknown"
    """The card's assignee is not in the config: it is never spawned (recorded once)."""
    DEFERRED = "deferred"
    """The worker chose when its card runs again (``kanban defer``)."""
    INTERRUPTED = "interrupted"
    """The gateway stopped while this run's worker was degraded (unscoped), so the worker was
    expected to die with the gateway's unit; its death is infrastructure, not counted."""


@dataclass(frozen=True, kw_only=True)
class Card:
    """One card as stored."""

    id: str
    title: str
    body: str
    assignee: str
    status: CardStatus
    priority: int
    created_at: float
    updated_at: float
    started_at: float | None = None
    completed_at: float | None = None
    consecutive_failures: int = 0
    failure_limit: int | None = None
    """Per-card override of ``kanban.failure_limit`` (None: the config default)."""
    last_failure_error: str | None = None
    block_kind: BlockKind | None = None
    blocked_until: float | None = None
    """When a transient block ends (None for other blocks)."""
    current_run_id: str | None = None
    """The open run (its worker may still live even after the worker moved the card)."""
    idempotency_key: str | None = None
    parents: tuple[str, ...] = ()
    tempfail_count: int = 0
    """Exit-75 results in a row (not counted toward the breaker)."""
    retry_at: float | None = None
    """Back-off after a temporary failure: not claimed before this time."""
    cooldown_until: float | None = None
    """Infrastructure cooldown after a refused spawn (a successful probe ends it early)."""
    result: str | None = None
    """Text the worker passed to ``complete --result``."""
    assignee_noted: bool = False
    """The "assignee unknown" event was already recorded."""
    group: str | None = None
    """The card's group (a customer, a tenant): claims rotate between groups, and a limit's
    ``per_group`` caps each group separately. None: the cards without a group, one group."""
    turn: int = 0
    """The card's place in its group's queue (:func:`dispatcher.kanban.rules.turn_for`): ready
    cards are claimed by priority, then turn, so groups take turns."""


@dataclass(frozen=True, kw_only=True)
class Run:
    """One attempt to run a card."""

    run_id: str
    card_id: str
    attempt: int
    claimed_at: float
    outcome: Outcome | None = None
    """None while the run is open (claimed, spawning or running)."""
    exit_code: int | None = None
    signal: str | None = None
    session_id: str | None = None
    placement: str | None = None
    unit: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    error: str | None = None
    infrastructure: bool = False
    claimant: Claimant | None = None
    """The claiming process (pid + start time + boot id); None on rows that lack it."""
    ready_at: float | None = None
    """When the card last became ready before this claim (its latest status change, or its
    worker's ``defer``): the start of the run's wait. None on rows older than the column."""

    @property
    def open(self) -> bool:
        """True until the run has an outcome."""
        return self.outcome is None


@dataclass(frozen=True, kw_only=True)
class Event:
    """One append-only board event."""

    seq: int
    card_id: str
    kind: str
    at: float
    run_id: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class NewCard:
    """What ``add`` stores (validated by the caller: the assignee exists, parents resolved)."""

    title: str
    assignee: str
    body: str = ""
    priority: int = 0
    parents: tuple[str, ...] = ()
    idempotency_key: str | None = None
    failure_limit: int | None = None
    group: str | None = None


@dataclass(frozen=True, kw_only=True)
class CardEdit:
    """Fields an operator changes with ``edit`` (None: unchanged)."""

    title: str | None = None
    body: str | None = None
    priority: int | None = None
    assignee: str | None = None
    failure_limit: int | None = None
    group: str | None = None
    """A new group; the empty string takes the card out of every group."""

    def changed(self) -> dict[str, Any]:
        """The fields that are set."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Budget checked inside the claim transaction."""

    max_in_progress: int
    assignee_max: int | None = None
    host_max: int | None = None
    """Cluster mode: open runs this host may hold (``kanban.max_in_progress_per_host``)."""
    wants: Wants = ()
    """The named limits the run takes (its assignee's ``uses``), all or none."""


@dataclass(frozen=True, kw_only=True)
class CardChange:
    """What closing a run does to its card (computed by :mod:`dispatcher.kanban.taxonomy`).

    ``fields`` maps card column names to new values; ``events`` are (kind, data) pairs
    appended in order."""

    fields: Mapping[str, Any] = field(default_factory=dict)
    events: tuple[tuple[EventKind, Mapping[str, Any]], ...] = ()


def move_fields(card: Card, status: CardStatus, now: float) -> dict[str, Any]:
    """Card fields an operator move to ``status`` sets."""
    fields: dict[str, Any] = {"status": status}
    if status is CardStatus.DONE:
        fields["completed_at"] = now
    if status is CardStatus.BLOCKED:
        # An operator's block waits for an operator's unblock.
        fields |= {"block_kind": BlockKind.NEEDS_INPUT, "blocked_until": None}
    elif card.status is CardStatus.BLOCKED:
        fields |= {"block_kind": None, "blocked_until": None}
    return fields
