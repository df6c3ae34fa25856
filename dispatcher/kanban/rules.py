"""The board's decisions, stated once for every store.

Each board store (SQLite, in memory, and later PostgreSQL) reads what a change depends on inside
its own transaction, asks these pure functions what to do, and writes the answer. Keeping the
decisions here is what makes the stores interchangeable: the contract suite in
``tests/contracts/test_board_store.py`` checks the storage, this module holds the policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dispatcher.kanban.abc import ClaimVerdict
from dispatcher.kanban.errors import BadCard, StaleRun, WrongStatus
from dispatcher.kanban.model import (
    MOVE_TARGETS,
    BlockKind,
    Card,
    CardEdit,
    CardStatus,
    EventKind,
    Limits,
    NewCard,
)

EXPIRED_BLOCK_FIELDS: Mapping[str, Any] = {
    "status": CardStatus.READY,
    "block_kind": None,
    "blocked_until": None,
    "tempfail_count": 0,
}
"""What a transient block whose time is up changes (the card becomes ``ready``)."""


@dataclass(frozen=True, kw_only=True)
class Change:
    """Card fields to write and the one event that records them."""

    fields: Mapping[str, Any]
    kind: EventKind
    data: Mapping[str, Any]


def parent_counts_as_done(parent: Card) -> bool:
    """A parent counts as done when it is done, or was done before it was archived."""
    return parent.status is CardStatus.DONE or (
        parent.status is CardStatus.ARCHIVED and parent.completed_at is not None
    )


def status_after_parents(parents_done: bool) -> CardStatus:
    """Where a card without a run goes when it is (re)opened: ready, or todo behind a parent."""
    return CardStatus.READY if parents_done else CardStatus.TODO


def created_data(new: NewCard, status: CardStatus) -> dict[str, Any]:
    """The ``created`` event's data."""
    return {
        "title": new.title,
        "assignee": new.assignee,
        "priority": new.priority,
        "parents": list(dict.fromkeys(new.parents)),
        "status": status.value,
        "group": new.group,
    }


def edit_change(card: Card, edit: CardEdit) -> Change | None:
    """An operator's edit: None when nothing is set. WrongStatus on an archived card. A new
    group (``""``: none) is stored as None; the store then gives the card its turn there
    (:func:`joins_queue`)."""
    if card.status is CardStatus.ARCHIVED:
        raise WrongStatus(card.id, card.status.value, "edit")
    changed = edit.changed()
    if "group" in changed:
        changed["group"] = changed["group"] or None
    if not changed:
        return None
    fields = dict(changed)
    if "assignee" in fields:
        # A new assignee earns its own "unknown assignee" note if it is missing too.
        fields["assignee_noted"] = False
    data = {"fields": sorted(changed), **{k: v for k, v in changed.items() if k != "body"}}
    return Change(fields=fields, kind=EventKind.EDITED, data=data)


# -- groups and the claim order ----------------------------------------------------------------
#
# Ready cards are claimed by priority (highest first), then by *turn*, then by age. A card's
# turn is its place in its group's queue, given when it joins the queue (added, promoted from
# todo, or moved to another group): one after the group's last card, but never before the
# board's *round*, the highest turn claimed so far. So at one priority the groups take turns
# (round-robin: the first card of every group, then the second of every group, ...), a group
# that had nothing queued joins the current round instead of jumping ahead with old turns, and
# within a group cards keep their priority and order. The order is one index (priority DESC,
# turn, created_at, id) in every store, so a claim never scans a big group to reach a small one.


def turn_for(last: int | None, round_: int) -> int:
    """The turn of a card joining its group's queue, after the group's ``last`` turn (None:
    the group has no card yet) and not before the board's round."""
    return max(round_, (last if last is not None else 0) + 1)


def round_after(round_: int, claimed: Card) -> int:
    """The board's round once ``claimed`` is claimed."""
    return max(round_, claimed.turn)


def claim_order(card: Card) -> tuple[int, int, float, str]:
    """The claim order as a sort key: priority (highest first), turn, age, id (the SQL
    stores' ``ORDER BY priority DESC, turn, created_at, id``)."""
    return (-card.priority, card.turn, card.created_at, card.id)


def joins_queue(card: Card, fields: Mapping[str, Any]) -> bool:
    """Whether a change of ``card`` to ``fields`` puts it at the back of a queue (a new turn):
    a todo card becoming ready, or a card moving to another group."""
    promoted = card.status is CardStatus.TODO and fields.get("status") is CardStatus.READY
    regrouped = "group" in fields and fields["group"] != card.group
    return promoted or regrouped


def claim_refusal(
    card: Card,
    *,
    paused: bool,
    now: float,
    ignore_cooldown: bool,
) -> ClaimVerdict | None:
    """Why ``card`` may not be claimed now, from the card alone (budgets come after)."""
    if card.status is not CardStatus.READY or card.current_run_id is not None:
        return ClaimVerdict.NOT_READY
    if paused:
        return ClaimVerdict.PAUSED
    if card.retry_at is not None and card.retry_at > now:
        return ClaimVerdict.BACKOFF
    cooling = card.cooldown_until is not None and card.cooldown_until > now
    if cooling and not ignore_cooldown:
        return ClaimVerdict.COOLDOWN
    return None


def budget_refusal(
    limits: Limits, *, running: int, mine: int | None, host: int | None = None
) -> ClaimVerdict | None:
    """Whether the board-wide, the assignee's or this host's budget refuses one more run
    (``mine`` and ``host`` are the open runs of the card's assignee and of this host)."""
    if running >= limits.max_in_progress:
        return ClaimVerdict.BUDGET
    if limits.assignee_max is not None and mine is not None and mine >= limits.assignee_max:
        return ClaimVerdict.ASSIGNEE_BUDGET
    if limits.host_max is not None and host is not None and host >= limits.host_max:
        return ClaimVerdict.HOST_BUDGET
    return None


def claimed_fields(run_id: str, now: float) -> dict[str, Any]:
    """What a successful claim writes on the card."""
    return {
        "status": CardStatus.RUNNING,
        "current_run_id": run_id,
        "started_at": now,
        "cooldown_until": None,
        "retry_at": None,
    }


def worker_move_change(
    card: Card,
    run_id: str,
    *,
    run_card_id: str | None,
    run_open: bool,
    status: CardStatus,
    now: float,
    block_kind: BlockKind | None,
    blocked_until: float | None,
    reason: str | None,
    result: str | None,
) -> Change:
    """A worker reports on its own card. ``run_card_id`` is None when the run does not exist.

    StaleRun when ``run_id`` is not the card's open run; WrongStatus when the card is no longer
    ``running``."""
    if status not in (CardStatus.DONE, CardStatus.BLOCKED, CardStatus.REVIEW):
        raise ValueError(f"a worker cannot move its card to {status}")
    if run_card_id != card.id or not run_open or card.current_run_id != run_id:
        raise StaleRun(card.id, run_id, current=card.current_run_id)
    if card.status is not CardStatus.RUNNING:
        raise WrongStatus(
            card.id,
            card.status.value,
            {"done": "complete", "blocked": "block", "review": "review"}[status.value],
            remedy="the worker already reported on this card; nothing was changed",
        )
    # The report wins over a `defer` the worker made earlier in this run: no pending retry.
    fields: dict[str, Any] = {"status": status, "retry_at": None}
    data: dict[str, Any] = {"by": "worker"}
    kind = EventKind.REVIEW
    if status is CardStatus.DONE:
        fields |= {
            "completed_at": now,
            "result": result,
            "consecutive_failures": 0,
            "tempfail_count": 0,
            "last_failure_error": None,
        }
        kind = EventKind.COMPLETED
        if result is not None:
            data["result"] = result
    elif status is CardStatus.BLOCKED:
        fields |= {"block_kind": block_kind, "blocked_until": blocked_until}
        kind = EventKind.BLOCKED
        data |= {
            "block_kind": block_kind.value if block_kind else None,
            "reason": reason,
            "until": blocked_until,
        }
    return Change(fields=fields, kind=kind, data=data)


FRESH_START: dict[str, Any] = {
    "block_kind": None,
    "blocked_until": None,
    "consecutive_failures": 0,
    "tempfail_count": 0,
    "retry_at": None,
    "cooldown_until": None,
}
"""The card fields an operator's unblock or retry resets: no block, no counts, no waits."""


def unblock_change(card: Card, *, parents_done: bool) -> Change:
    """An operator's unblock: counts reset, back to ready (todo behind a parent)."""
    if card.status is not CardStatus.BLOCKED:
        raise WrongStatus(card.id, card.status.value, "unblock")
    status = status_after_parents(parents_done)
    fields = {"status": status, **FRESH_START}
    data = {"by": "operator", "status": status.value}
    return Change(fields=fields, kind=EventKind.UNBLOCKED, data=data)


RETRYABLE = (CardStatus.DONE, CardStatus.BLOCKED, CardStatus.REVIEW)
"""Statuses a card without an open run is always retried from."""


def waits(card: Card) -> bool:
    """Whether a ``ready`` card holds something an operator's retry resets: a retry time
    (backing off after a failure, or deferred by its worker), a cooldown, or counted tries."""
    held = (card.retry_at, card.cooldown_until)
    return any(t is not None for t in held) or card.consecutive_failures + card.tempfail_count > 0


def retry_change(card: Card, *, reason: str) -> Change:
    """An operator's retry: a ``done``, ``blocked`` or ``review`` card, or a ``ready`` one that
    waits (:func:`waits`), starts over: ``ready`` now, counts and waits reset, one ``moved``
    event (``action: retry``; ``waited_until`` the retry time it cut short). WrongStatus for
    a card with an open run, or a ready card with nothing to reset (it runs anyway)."""
    ready = card.status is CardStatus.READY
    if card.current_run_id is not None or not (card.status in RETRYABLE or (ready and waits(card))):
        raise WrongStatus(
            card.id,
            card.status.value,
            "retry",
            remedy="retry a done, blocked or review card, or a ready one backing off or "
            "deferred; a running card, or a ready one waiting for nothing, runs anyway "
            "('dispatch kanban move' overrides a status)",
        )
    data: dict[str, Any] = {
        "from": card.status.value,
        "to": CardStatus.READY.value,
        "by": "operator",
        "action": "retry",
        "reason": reason,
    }
    if ready and card.retry_at is not None:
        data["waited_until"] = card.retry_at
    fields = {"status": CardStatus.READY, **FRESH_START, "completed_at": None}
    return Change(fields=fields, kind=EventKind.MOVED, data=data)


def check_move_target(status: CardStatus) -> None:
    """BadCard unless an operator may move a card to ``status``."""
    if status not in MOVE_TARGETS:
        raise BadCard(
            "status",
            str(status),
            "cards can be moved to " + ", ".join(s.value for s in MOVE_TARGETS),
            remedy="'running' is reached only by a claim; use 'archive' to archive",
        )


def refuse_with_open_run(card: Card, action: str) -> None:
    """WrongStatus when ``card`` has an open run (operators may not move or archive it)."""
    if card.current_run_id is not None:
        raise WrongStatus(
            card.id, f"{card.status.value} with the open run {card.current_run_id}", action
        )
