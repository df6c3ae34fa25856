"""An in-memory :class:`~dispatcher.kanban.abc.BoardStore` for tests and embedding.

Same contract as the SQLite store (the contract suite in ``tests/contracts/`` runs against both)
with the same decisions (:mod:`dispatcher.kanban.rules`); one lock stands in for the database's
writer transaction, so every method is atomic against the others. Nothing survives the process:
use it for users' own tests of dispatch policies, never as a board of record.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from dispatcher.buckets import Bucket, Flows, Window
from dispatcher.kanban import history, rules, search
from dispatcher.kanban.abc import BoardStore, Claim, ClaimVerdict, Decide
from dispatcher.kanban.history import RunLine
from dispatcher.kanban.model import (
    BlockKind,
    Card,
    CardEdit,
    CardStatus,
    Event,
    EventKind,
    Limits,
    NewCard,
    Run,
    move_fields,
)
from dispatcher.kanban.rows import CARD_FIELDS, CARD_IDS, RUN_IDS
from dispatcher.kanban.search import CardPage, CardQuery
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.holds import Holder, MemoryHolds, Taking
from dispatcher.launch.limits import Tally, Wants
from dispatcher.launch.outcome import Outcome, Result
from scope.foundation.errors import NotFoundError
from scope.foundation.ids import MAX_CANDIDATES, IdKind, lookup


class MemoryBoardStore(BoardStore):
    """Cards, runs and events in dictionaries, guarded by one lock."""

    def __init__(self, holds: MemoryHolds | None = None) -> None:
        self._lock = threading.RLock()
        self._cards: dict[str, Card] = {}
        self._runs: dict[str, Run] = {}
        self._events: list[Event] = []
        self._keys: dict[str, str] = {}
        self._paused = False
        self._version = 0
        self._round = 0
        self.holds = holds or MemoryHolds()
        """The named limits' holds (share one with a memory ledger to share the limits)."""

    # -- helpers -----------------------------------------------------------------------------

    def _card(self, card_id: str) -> Card:
        try:
            return self._cards[card_id]
        except KeyError:
            raise NotFoundError("card", card_id) from None

    def _run(self, run_id: str) -> Run:
        try:
            return self._runs[run_id]
        except KeyError:
            raise NotFoundError("run", run_id) from None

    def _update(self, card_id: str, fields: Mapping[str, Any], now: float) -> Card:
        unknown = set(fields) - CARD_FIELDS
        if unknown:
            raise ValueError(f"unknown card fields {sorted(unknown)}")
        card = dataclasses.replace(self._cards[card_id], **fields, updated_at=now)
        self._cards[card_id] = card
        return card

    def _event(
        self,
        card_id: str,
        kind: EventKind,
        data: Mapping[str, Any],
        now: float,
        run_id: str | None = None,
    ) -> None:
        # Round-trip through JSON as the SQLite store's column does, so readers see the same.
        plain = json.loads(json.dumps(dict(data), default=str))
        seq = len(self._events) + 1
        self._events.append(
            Event(seq=seq, card_id=card_id, run_id=run_id, kind=kind.value, at=now, data=plain)
        )

    def _apply(
        self, card_id: str, change: rules.Change, now: float, run_id: str | None = None
    ) -> Card:
        card = self._update(card_id, change.fields, now)
        self._event(card_id, change.kind, change.data, now, run_id)
        self._version += 1
        return card

    def _parents_done(self, card: Card) -> bool:
        return all(rules.parent_counts_as_done(self._cards[p]) for p in card.parents)

    def _open_count(self, assignee: str | None = None) -> int:
        return sum(
            1
            for run in self._runs.values()
            if run.open and (assignee is None or self._cards[run.card_id].assignee == assignee)
        )

    def _turn(self, group: str | None) -> int:
        """The turn of a card joining ``group``'s queue now (:func:`rules.turn_for`)."""
        turns = [c.turn for c in self._cards.values() if c.group == group]
        return rules.turn_for(max(turns) if turns else None, self._round)

    def _resolve(self, text: str, kind: IdKind, ids: Sequence[str]) -> str:
        """The id ``text`` names, by the one id rule (:func:`scope.foundation.ids.lookup`)."""
        return lookup(
            text,
            kind,
            starting=lambda full: sorted(i for i in ids if i.startswith(full))[:MAX_CANDIDATES],
        )

    # -- cards -------------------------------------------------------------------------------

    def add_card(self, new: NewCard, *, now: float) -> tuple[Card, bool]:
        with self._lock:
            if new.idempotency_key is not None and new.idempotency_key in self._keys:
                return self._cards[self._keys[new.idempotency_key]], False
            for parent in new.parents:
                if parent not in self._cards:
                    raise NotFoundError("card", parent, remedy="check the --parent ids")
            card_id = CARD_IDS.new()
            while card_id in self._cards:
                card_id = CARD_IDS.new()
            card = Card(
                id=card_id,
                title=new.title,
                body=new.body,
                assignee=new.assignee,
                status=CardStatus.TODO,
                priority=new.priority,
                created_at=now,
                updated_at=now,
                idempotency_key=new.idempotency_key,
                failure_limit=new.failure_limit,
                parents=tuple(dict.fromkeys(new.parents)),
                group=new.group,
                turn=self._turn(new.group),
            )
            status = rules.status_after_parents(self._parents_done(card))
            self._cards[card_id] = dataclasses.replace(card, status=status)
            if new.idempotency_key is not None:
                self._keys[new.idempotency_key] = card_id
            self._event(card_id, EventKind.CREATED, rules.created_data(new, status), now)
            self._version += 1
            return self._cards[card_id], True

    def get_card(self, card_id: str) -> Card:
        with self._lock:
            return self._card(card_id)

    def resolve_card(self, text: str) -> Card:
        with self._lock:
            return self._card(self._resolve(text, CARD_IDS, list(self._cards)))

    def list_cards(
        self,
        *,
        statuses: Sequence[CardStatus] | None = None,
        assignee: str | None = None,
        include_archived: bool = False,
        limit: int | None = None,
    ) -> list[Card]:
        def wanted(card: Card) -> bool:
            if statuses:
                if card.status not in statuses:
                    return False
            elif not include_archived and card.status is CardStatus.ARCHIVED:
                return False
            return assignee is None or card.assignee == assignee

        with self._lock:
            cards = [c for c in self._cards.values() if wanted(c)]
        ordered = sorted(cards, key=_board_order)
        return ordered if limit is None else ordered[: max(0, limit)]

    def done_cards(self, *, offset: int = 0, limit: int = 50) -> list[Card]:
        with self._lock:
            done = [c for c in self._cards.values() if c.status is CardStatus.DONE]
        done.sort(key=lambda c: (-(c.completed_at or 0), c.id))
        return done[max(0, offset) : max(0, offset) + max(0, limit)]

    def edit_card(self, card_id: str, edit: CardEdit, *, now: float) -> Card:
        with self._lock:
            card = self._card(card_id)
            change = rules.edit_change(card, edit)
            if change is None:
                return card
            if rules.joins_queue(card, change.fields):
                turn = self._turn(change.fields["group"])
                change = dataclasses.replace(change, fields={**change.fields, "turn": turn})
            return self._apply(card_id, change, now)

    # -- runs and events ---------------------------------------------------------------------

    def get_run(self, run_id: str) -> Run:
        with self._lock:
            return self._run(run_id)

    def resolve_run(self, text: str) -> Run:
        with self._lock:
            return self._run(self._resolve(text, RUN_IDS, list(self._runs)))

    def runs_of(self, card_id: str) -> list[Run]:
        with self._lock:
            runs = [r for r in self._runs.values() if r.card_id == card_id]
        return sorted(runs, key=lambda r: r.attempt)

    def open_runs(self) -> list[Run]:
        with self._lock:
            runs = [r for r in self._runs.values() if r.open]
        return sorted(runs, key=lambda r: r.claimed_at)

    def events_of(self, card_id: str) -> list[Event]:
        with self._lock:
            return [e for e in self._events if e.card_id == card_id]

    def events_after(self, seq: int, *, limit: int = 500) -> list[Event]:
        with self._lock:
            # Sequence numbers are list positions + 1.
            return self._events[max(seq, 0) : max(seq, 0) + max(limit, 0)]

    def last_event_seq(self) -> int:
        with self._lock:
            return len(self._events)

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
        with self._lock:
            self._card(card_id)
            if fields:
                self._update(card_id, fields, now)
            self._event(card_id, kind, data, now, run_id)
            self._version += 1

    # -- the dispatcher's steps --------------------------------------------------------------

    def promote(self, *, now: float) -> list[tuple[str, EventKind]]:
        done: list[tuple[str, EventKind]] = []
        with self._lock:
            for card in list(self._cards.values()):
                if card.status is CardStatus.TODO and self._parents_done(card):
                    turn = self._turn(card.group)
                    self._update(card.id, {"status": CardStatus.READY, "turn": turn}, now)
                    self._event(card.id, EventKind.PROMOTED, {"reason": "parents done"}, now)
                    done.append((card.id, EventKind.PROMOTED))
            for card in list(self._cards.values()):
                if (
                    card.status is CardStatus.BLOCKED
                    and card.block_kind is BlockKind.TRANSIENT
                    and card.blocked_until is not None
                    and card.blocked_until <= now
                ):
                    self._update(card.id, rules.EXPIRED_BLOCK_FIELDS, now)
                    reason = {"reason": "transient block ended"}
                    self._event(card.id, EventKind.UNBLOCKED, reason, now)
                    done.append((card.id, EventKind.UNBLOCKED))
            if done:
                self._version += 1
        return done

    def ready_cards(
        self, *, after: Card | None = None, limit: int | None = None, now: float | None = None
    ) -> list[Card]:
        with self._lock:
            cards = [
                dataclasses.replace(c, parents=())
                for c in self._cards.values()
                if c.status is CardStatus.READY
                and c.current_run_id is None
                and (now is None or c.retry_at is None or c.retry_at <= now)
            ]
        ordered = sorted(cards, key=rules.claim_order)
        if after is not None:
            ordered = [c for c in ordered if rules.claim_order(c) > rules.claim_order(after)]
        return ordered if limit is None else ordered[: max(0, limit)]

    def backing_off(self, *, now: float, limit: int) -> list[str]:
        with self._lock:
            waiting = [
                c
                for c in self._cards.values()
                if c.status is CardStatus.READY
                and c.current_run_id is None
                and c.retry_at is not None
                and c.retry_at > now
            ]
        waiting.sort(key=lambda c: (c.retry_at, c.id))
        return [c.id for c in waiting[: max(0, limit)]]

    def claim(
        self,
        card_id: str,
        *,
        now: float,
        claimer: Claimant,
        limits: Limits,
        ignore_cooldown: bool = False,
    ) -> Claim:
        with self._lock:
            card = self._card(card_id)
            refusal = rules.claim_refusal(
                card, paused=self._paused, now=now, ignore_cooldown=ignore_cooldown
            )
            if refusal is None:
                mine = None if limits.assignee_max is None else self._open_count(card.assignee)
                refusal = rules.budget_refusal(limits, running=self._open_count(), mine=mine)
            if refusal is not None:
                return Claim(verdict=refusal)
            run_id = RUN_IDS.new()
            taking = Taking(wants=limits.wants, holder=Holder("run", run_id), group=card.group)
            wait = self.holds.try_take(taking, now)
            if wait is not None:
                return Claim(verdict=ClaimVerdict.LIMIT, wait=wait)
            attempt = 1 + sum(1 for r in self._runs.values() if r.card_id == card_id)
            run = Run(
                run_id=run_id,
                card_id=card_id,
                attempt=attempt,
                claimed_at=now,
                claimant=claimer,
                ready_at=max(
                    (
                        e.at
                        for e in self._events
                        if e.card_id == card_id and e.kind in history.READY_KINDS
                    ),
                    default=None,
                ),
            )
            self._runs[run.run_id] = run
            self._round = rules.round_after(self._round, card)
            self._update(card_id, rules.claimed_fields(run.run_id, now), now)
            data = {"attempt": attempt, "claimer_pid": claimer.pid}
            self._event(card_id, EventKind.CLAIMED, data, now, run.run_id)
            self._version += 1
            return Claim(verdict=ClaimVerdict.CLAIMED, run=run)

    def limit_tallies(
        self, wants: Wants, *, now: float, host: str | None = None
    ) -> tuple[float, dict[str, Tally]]:
        return now, self.holds.tallies(wants, now, host=host, every_group=True)

    def prune_holds(self, before: float) -> int:
        return self.holds.prune(before)

    def record_spawn(
        self,
        run_id: str,
        *,
        session_id: str,
        placement: str,
        unit: str | None,
        now: float,
    ) -> bool:
        with self._lock:
            run = self._run(run_id)
            if not run.open or run.session_id is not None:
                return False
            self._runs[run_id] = dataclasses.replace(
                run, session_id=session_id, placement=placement, unit=unit, started_at=now
            )
            data = {"session_id": session_id, "placement": placement, "unit": unit}
            self._event(run.card_id, EventKind.SPAWNED, data, now, run_id)
            self._version += 1
            return True

    def close_run(
        self, run_id: str, result: Result, decide: Decide, *, now: float
    ) -> tuple[Run, Card] | None:
        with self._lock:
            run = self._run(run_id)
            if not run.open:
                return None
            card = self._card(run.card_id)
            change = decide(card, run)
            run = dataclasses.replace(
                run,
                outcome=result.outcome,
                exit_code=result.exit_code,
                signal=result.signal,
                error=result.error,
                infrastructure=result.infrastructure,
                ended_at=now,
                session_id=run.session_id or result.session_id,
            )
            self._runs[run_id] = run
            self.holds.release(Holder("run", run_id), now)
            fields = dict(change.fields)
            if card.current_run_id == run_id:
                fields["current_run_id"] = None
            if fields:
                card = self._update(card.id, fields, now)
            for kind, data in change.events:
                self._event(card.id, kind, data, now, run_id)
            self._version += 1
            return run, card

    # -- fenced worker commands --------------------------------------------------------------

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
        with self._lock:
            card = self._card(card_id)
            run = self._runs.get(run_id)
            change = rules.worker_move_change(
                card,
                run_id,
                run_card_id=None if run is None else run.card_id,
                run_open=run is not None and run.open,
                status=status,
                now=now,
                block_kind=block_kind,
                blocked_until=blocked_until,
                reason=reason,
                result=result,
            )
            return self._apply(card_id, change, now, run_id)

    # -- operator commands -------------------------------------------------------------------

    def unblock(self, card_id: str, *, now: float) -> Card:
        with self._lock:
            card = self._card(card_id)
            change = rules.unblock_change(card, parents_done=self._parents_done(card))
            return self._apply(card_id, change, now)

    def retry(self, card_id: str, *, reason: str, now: float) -> Card:
        with self._lock:
            change = rules.retry_change(self._card(card_id), reason=reason)
            return self._apply(card_id, change, now)

    def move(self, card_id: str, status: CardStatus, *, now: float) -> Card:
        rules.check_move_target(status)
        with self._lock:
            card = self._card(card_id)
            rules.refuse_with_open_run(card, "move")
            if card.status is status:
                return card
            data = {"from": card.status.value, "to": status.value, "by": "operator"}
            fields = move_fields(card, status, now)
            if rules.joins_queue(card, fields):
                fields["turn"] = self._turn(card.group)
            change = rules.Change(fields=fields, kind=EventKind.MOVED, data=data)
            return self._apply(card_id, change, now)

    def archive(self, card_id: str, *, now: float) -> Card:
        with self._lock:
            card = self._card(card_id)
            if card.status is CardStatus.ARCHIVED:
                return card
            rules.refuse_with_open_run(card, "archive")
            change = rules.Change(
                fields={"status": CardStatus.ARCHIVED},
                kind=EventKind.ARCHIVED,
                data={"from": card.status.value},
            )
            return self._apply(card_id, change, now)

    # -- board-wide --------------------------------------------------------------------------

    def paused(self) -> bool:
        with self._lock:
            return self._paused

    def set_paused(self, paused: bool) -> bool:
        with self._lock:
            if self._paused is bool(paused):
                return False
            self._paused = bool(paused)
            self._version += 1
            return True

    def board_version(self) -> int:
        with self._lock:
            return self._version

    def status_counts(self) -> dict[CardStatus, int]:
        counts = dict.fromkeys(CardStatus, 0)
        with self._lock:
            for card in self._cards.values():
                counts[card.status] += 1
        return counts

    def outcome_counts(self) -> dict[tuple[Outcome, bool], int]:
        counts: dict[tuple[Outcome, bool], int] = {}
        with self._lock:
            for run in self._runs.values():
                if run.outcome is not None:
                    key = (run.outcome, run.infrastructure)
                    counts[key] = counts.get(key, 0) + 1
        return counts

    # -- history and search ------------------------------------------------------------------

    def run_buckets(self, window: Window, *, assignee: str | None = None) -> list[Bucket]:
        with self._lock:
            return history.run_buckets(window, list(self._runs.values()), self._cards, assignee)

    def status_flows(self, window: Window) -> tuple[dict[str, int], list[Flows]]:
        with self._lock:
            counts = {s.value: n for s, n in self.status_counts().items()}
            inside = [e for e in self._events if window.start <= e.at < window.end]
            return counts, history.status_flows(window, inside, self._runs.values())

    def roll_up(self, now: float, *, spans: int = 12) -> int:
        return 0

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
        with self._lock:
            return history.lines_in(
                self._runs.values(),
                self._cards,
                start,
                end,
                ended=ended,
                outcome=outcome,
                assignee=assignee,
                limit=limit,
            )

    def search_cards(self, query: CardQuery) -> CardPage:
        with self._lock:
            found = search.order(
                [c for c in self._cards.values() if search.matches(c, query)], query
            )
        return CardPage(found[query.offset : query.offset + query.limit], len(found))


def _board_order(card: Card) -> tuple[int, float, str]:
    """Priority (highest first), then age (oldest first), then id: the SQLite store's order."""
    return (-card.priority, card.created_at, card.id)
