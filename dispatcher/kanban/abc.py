"""The board store's contract: cards, runs and events, changed only by compare-and-set.

Every method that changes something is one writer transaction: it re-reads what it depends on
inside the transaction and changes nothing when the state moved underneath (a card that is no
longer ``ready``, a run that is no longer open, a worker whose run is not the card's open run).
That is what lets several ``dispatch`` processes (the gateway, a oneshot tick, operators, the
workers themselves) share one board without a card ever getting two runs at once.

Every change bumps :meth:`BoardStore.board_version`, a counter the gateway polls to learn
cheaply that something happened (a card was added, became ready, a run closed).

Implementations, all checked by ``tests/contracts/test_board_store.py``:
:class:`dispatcher.kanban.memory.MemoryBoardStore` (in memory),
:class:`dispatcher.kanban.store.SqliteBoardStore` (the state database) and
:class:`dispatcher.cluster.board.PgBoardStore` (PostgreSQL in cluster mode: ``FOR UPDATE SKIP
LOCKED`` claims, every write about a run fenced by its host's lease epoch).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dispatcher.kanban.model import (
    BlockKind,
    Card,
    CardChange,
    CardEdit,
    CardStatus,
    Event,
    EventKind,
    Limits,
    NewCard,
    Run,
)

if TYPE_CHECKING:  # annotations only: every short write command loads this contract
    from dispatcher.buckets import Bucket, Flows, Window
    from dispatcher.kanban.history import RunLine
    from dispatcher.kanban.search import CardPage, CardQuery
    from dispatcher.launch.claimant import Claimant
    from dispatcher.launch.limits import LimitWait, Tally, Wants
    from dispatcher.launch.outbox import Outbox
    from dispatcher.launch.outcome import Outcome, Result


class ClaimVerdict(enum.StrEnum):
    """Why :meth:`BoardStore.claim` did or did not open a run."""

    CLAIMED = "claimed"
    NOT_READY = "not_ready"
    """The card is not ``ready`` any more, or already has an open run."""
    PAUSED = "paused"
    BACKOFF = "backoff"
    COOLDOWN = "cooldown"
    BUDGET = "budget"
    """``kanban.max_in_progress`` reached."""
    ASSIGNEE_BUDGET = "assignee_budget"
    """The assignee's ``max_in_progress`` reached."""
    HOST_BUDGET = "host_budget"
    """Cluster mode: this host's ``kanban.max_in_progress_per_host`` reached."""
    NO_LEASE = "no_lease"
    """Cluster mode: this host holds no live lease at the epoch it claims under."""
    LIMIT = "limit"
    """A named limit the assignee ``uses`` is full (:attr:`Claim.wait` says which)."""


@dataclass(frozen=True, kw_only=True)
class Claim:
    """The result of a claim attempt (``run`` is set exactly when ``verdict`` is CLAIMED;
    ``wait`` exactly when it is LIMIT)."""

    verdict: ClaimVerdict
    run: Run | None = None
    wait: LimitWait | None = None


Decide = Callable[[Card, Run], CardChange]
"""Computes a card's change from the card and run as they are inside the closing transaction."""


class BoardStore(abc.ABC):
    """Cards, runs and events (see the module docstring)."""

    outbox: Outbox | None = None
    """Where events queue their notifications in their own transaction (None: nowhere; the
    memory store never queues any)."""

    # -- cards -------------------------------------------------------------------------------

    @abc.abstractmethod
    def add_card(self, new: NewCard, *, now: float) -> tuple[Card, bool]:
        """Store a card (``todo`` when a parent is not done, else ``ready``) with a ``created``
        event. A repeated ``idempotency_key`` returns the existing card and ``False``; every
        parent must exist (NotFoundError otherwise, nothing stored)."""

    @abc.abstractmethod
    def get_card(self, card_id: str) -> Card:
        """The card with exactly this id (NotFoundError)."""

    @abc.abstractmethod
    def resolve_card(self, text: str) -> Card:
        """The card whose id starts with ``text``, by the one id rule
        (:func:`scope.foundation.ids.lookup`: ``c_`` optional, at least 4 characters as typed).
        IdTooShort, NotFoundError (unknown or malformed) or AmbiguousId (lists candidates),
        all exit 2."""

    @abc.abstractmethod
    def list_cards(
        self,
        *,
        statuses: Sequence[CardStatus] | None = None,
        assignee: str | None = None,
        include_archived: bool = False,
        limit: int | None = None,
    ) -> list[Card]:
        """Cards by priority (highest first), then age (oldest first); the first ``limit``."""

    @abc.abstractmethod
    def done_cards(self, *, offset: int = 0, limit: int = 50) -> list[Card]:
        """One page of ``done`` cards, most recently completed first (then by id): what a
        board shows of a done column that keeps growing."""

    @abc.abstractmethod
    def edit_card(self, card_id: str, edit: CardEdit, *, now: float) -> Card:
        """Change title, body, priority, assignee or failure limit (an ``edited`` event naming
        the fields). Takes effect from the next run."""

    # -- runs and events ---------------------------------------------------------------------

    @abc.abstractmethod
    def get_run(self, run_id: str) -> Run:
        """The run with exactly this id (NotFoundError)."""

    @abc.abstractmethod
    def resolve_run(self, text: str) -> Run:
        """The run whose id starts with ``text`` (``r_`` optional; as :meth:`resolve_card`)."""

    @abc.abstractmethod
    def runs_of(self, card_id: str) -> list[Run]:
        """The card's runs, oldest first."""

    @abc.abstractmethod
    def open_runs(self) -> list[Run]:
        """Every run without an outcome (claimed, spawning or running)."""

    @abc.abstractmethod
    def events_of(self, card_id: str) -> list[Event]:
        """The card's events in order."""

    @abc.abstractmethod
    def events_after(self, seq: int, *, limit: int = 500) -> list[Event]:
        """Board-wide events with a sequence number above ``seq``, in order, at most ``limit``
        (readers follow the board by asking again from the last one they saw)."""

    @abc.abstractmethod
    def last_event_seq(self) -> int:
        """The sequence number of the newest event (0 on an empty board)."""

    @abc.abstractmethod
    def append_event(
        self,
        card_id: str,
        kind: EventKind,
        data: Mapping[str, Any],
        *,
        now: float,
        run_id: str | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        """Append one event, optionally changing card ``fields`` in the same transaction."""

    # -- the dispatcher's steps --------------------------------------------------------------

    @abc.abstractmethod
    def promote(self, *, now: float) -> list[tuple[str, EventKind]]:
        """``todo`` cards whose parents are all done → ``ready`` (``promoted``); transient
        blocks whose time is up → ``ready`` (``unblocked``). Returns (card id, event kind)."""

    @abc.abstractmethod
    def ready_cards(
        self, *, after: Card | None = None, limit: int | None = None, now: float | None = None
    ) -> list[Card]:
        """``ready`` cards without an open run, by priority then age then id: at most
        ``limit``, the ones after ``after`` in that order (a page; the walk of a big board
        reads pages). With ``now``, cards backing off (``retry_at`` after ``now``) are left
        out, through an index: a page costs the same however many cards back off. Cooldown is
        never filtered here (the dispatcher decides it)."""

    @abc.abstractmethod
    def backing_off(self, *, now: float, limit: int) -> list[str]:
        """Ids of ``ready`` cards without an open run whose ``retry_at`` is after ``now``,
        next try first, at most ``limit`` (what a tick reports; through an index)."""

    @abc.abstractmethod
    def claim(
        self,
        card_id: str,
        *,
        now: float,
        claimer: Claimant,
        limits: Limits,
        ignore_cooldown: bool = False,
    ) -> Claim:
        """Compare-and-set ``ready`` → ``running`` and open a run, checking the pause flag,
        back-off, cooldown and both budgets inside the same transaction (``claimed`` event);
        then takes every named limit of ``limits.wants`` for the run, all or none
        (:func:`dispatcher.launch.holds.try_take`: LIMIT with the wait when one is full). The
        run's holds are released in the transaction that closes it. Limit times are the
        store's clock (:meth:`limit_tallies`)."""

    @abc.abstractmethod
    def limit_tallies(
        self, wants: Wants, *, now: float, host: str | None = None
    ) -> tuple[float, dict[str, Tally]]:
        """What the holds of ``wants`` count for a start on ``host`` now (the open holds of
        every group), and the time they were read at: ``now`` on one host, the database's
        clock in a cluster (rates count on it there)."""

    @abc.abstractmethod
    def prune_holds(self, before: float) -> int:
        """Forget released holds taken before ``before`` (no rate window reaches that far)."""

    @abc.abstractmethod
    def record_spawn(
        self,
        run_id: str,
        *,
        session_id: str,
        placement: str,
        unit: str | None,
        now: float,
    ) -> bool:
        """Record the run's session (``spawned`` event). False, changing nothing, when the run
        was closed meanwhile (archived, reclaimed): the caller must then stop the session."""

    @abc.abstractmethod
    def close_run(
        self, run_id: str, result: Result, decide: Decide, *, now: float
    ) -> tuple[Run, Card] | None:
        """Give an open run its outcome and apply ``decide(card, run)`` to the card, in one
        transaction. None (nothing changed) when the run was already closed."""

    # -- fenced worker commands --------------------------------------------------------------

    @abc.abstractmethod
    def worker_move(
        self,
        card_id: str,
        run_id: str,
        status: CardStatus,
        *,
        now: float,
        block_kind: BlockKind | None = None,
        blocked_until: float | None = None,
        reason: str | None = None,
        result: str | None = None,
    ) -> Card:
        """A worker moves its own ``running`` card to ``done``, ``blocked`` or ``review``.
        StaleRun when ``run_id`` is not the card's open run; WrongStatus when the card is no
        longer ``running``. Nothing changes in either case."""

    # -- operator commands -------------------------------------------------------------------

    @abc.abstractmethod
    def unblock(self, card_id: str, *, now: float) -> Card:
        """``blocked`` → ``ready`` (``todo`` while a parent is not done); resets the failure
        and temporary-failure counts (``unblocked``). WrongStatus when not blocked."""

    @abc.abstractmethod
    def retry(self, card_id: str, *, reason: str, now: float) -> Card:
        """Compare-and-set: a ``done``, ``blocked`` or ``review`` card, or a ``ready`` one
        backing off, deferred, cooling down or counting failures, → ``ready`` now with its
        counts and waits reset, one ``moved`` event (``action: retry``). WrongStatus, nothing
        changed, when the card (as it is inside the transaction) has an open run or is a
        ``ready`` card with nothing to reset."""

    @abc.abstractmethod
    def move(self, card_id: str, status: CardStatus, *, now: float) -> Card:
        """Operator override among todo/ready/blocked/review/done for a card without an open
        run (``moved``). WrongStatus when the card has an open run or the target is
        ``running``/``archived``."""

    @abc.abstractmethod
    def archive(self, card_id: str, *, now: float) -> Card:
        """Archive a card without an open run (``archived``). WrongStatus when it has one."""

    # -- board-wide --------------------------------------------------------------------------

    @abc.abstractmethod
    def paused(self) -> bool:
        """Whether claiming is paused (stored; survives restarts)."""

    @abc.abstractmethod
    def set_paused(self, paused: bool) -> bool:
        """Pause or resume claiming; True when that changed something."""

    @abc.abstractmethod
    def board_version(self) -> int:
        """A counter bumped by every change (cheap to poll)."""

    @abc.abstractmethod
    def status_counts(self) -> dict[CardStatus, int]:
        """How many cards are in each status."""

    @abc.abstractmethod
    def outcome_counts(self) -> dict[tuple[Outcome, bool], int]:
        """How many closed runs ended with each (outcome, infrastructure flag)."""

    # -- history and search (the web's charts, timeline and search pages) ------------------

    @abc.abstractmethod
    def run_buckets(self, window: Window, *, assignee: str | None = None) -> list[Bucket]:
        """Per bucket of ``window``, the closed runs that ended in it (of ``assignee``'s
        cards): counts by outcome, and the spreads ``wait`` (from the card last becoming ready
        to the worker starting) and ``run`` (worker start to end) of those that started
        (:mod:`dispatcher.kanban.history`). A range read on the runs' end time."""

    @abc.abstractmethod
    def status_flows(self, window: Window) -> tuple[dict[str, int], list[Flows]]:
        """The cards per status now, and per bucket of ``window`` the status changes whose
        events fall in it, by (from, to) (:func:`dispatcher.kanban.history.transition`), read
        in one snapshot: :func:`dispatcher.buckets.depth` turns them into the counts at each
        bucket's end. A range read of the events in the window, not of the whole log."""

    @abc.abstractmethod
    def roll_up(self, now: float, *, spans: int = 12) -> int:
        """Store the answers of settled buckets of :data:`dispatcher.rolluptables.STEPS` that
        have none yet (newest first, at most ``spans`` spans of two hours, in short write
        transactions; forgetting those past the horizon) and return how many were stored: 0
        when the rollup is current. It never changes what :meth:`run_buckets` and
        :meth:`status_flows` answer, only how much they count (:mod:`dispatcher.rollup`); a
        store that counts in memory keeps nothing and returns 0."""

    @abc.abstractmethod
    def runs_in(
        self,
        start: float,
        end: float,
        *,
        ended: bool = False,
        outcome: str | None = None,
        assignee: str | None = None,
        limit: int = 500,
    ) -> list[RunLine]:
        """At most ``limit`` runs with their card's assignee and title: with ``ended``, those
        that ended in ``[start, end)`` (by end time); else those open at some time in it
        (claimed before ``end``, ended at or after ``start`` or still open; by claim time)."""

    @abc.abstractmethod
    def search_cards(self, query: CardQuery) -> CardPage:
        """One page of the cards ``query`` finds, in its order, and how many it finds in all
        (:mod:`dispatcher.kanban.search`; archived cards only when a status term asks)."""
