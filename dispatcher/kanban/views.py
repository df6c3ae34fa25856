"""How cards, runs, events and tick reports look: JSON documents and terminal text.

JSON follows the CLI conventions: ids are strings, timestamps ISO-8601 with a numeric offset
and whole seconds, signals are names or null.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from dispatcher.kanban.model import Card, CardStatus, Event, Run
from dispatcher.kanban.report import TickReport
from dispatcher.launch.resources import resources_json
from dispatcher.timefmt import TimeView, iso, relative
from registry.abc import Session

BOARD_ORDER = (
    CardStatus.TODO,
    CardStatus.READY,
    CardStatus.RUNNING,
    CardStatus.BLOCKED,
    CardStatus.REVIEW,
    CardStatus.DONE,
)
DONE_SHOWN = 10
"""The board view lists only the most recent done cards."""


def card_json(card: Card) -> dict[str, Any]:
    """A card as ``list``/``show`` print it."""
    return {
        "id": card.id,
        "title": card.title,
        "body": card.body,
        "assignee": card.assignee,
        "group": card.group,
        "status": card.status.value,
        "priority": card.priority,
        "created_at": iso(card.created_at),
        "updated_at": iso(card.updated_at),
        "started_at": iso(card.started_at),
        "completed_at": iso(card.completed_at),
        "consecutive_failures": card.consecutive_failures,
        "failure_limit": card.failure_limit,
        "last_failure_error": card.last_failure_error,
        "block_kind": card.block_kind.value if card.block_kind else None,
        "blocked_until": iso(card.blocked_until),
        "current_run_id": card.current_run_id,
        "idempotency_key": card.idempotency_key,
        "parents": list(card.parents),
        "tempfail_count": card.tempfail_count,
        "retry_at": iso(card.retry_at),
        "cooldown_until": iso(card.cooldown_until),
        "result": card.result,
    }


def run_json(run: Run) -> dict[str, Any]:
    """A run as ``show`` prints it."""
    return {
        "run_id": run.run_id,
        "card_id": run.card_id,
        "attempt": run.attempt,
        "outcome": run.outcome.value if run.outcome else None,
        "exit_code": run.exit_code,
        "signal": run.signal,
        "session_id": run.session_id,
        "placement": run.placement,
        "unit": run.unit,
        "claimed_at": iso(run.claimed_at),
        "started_at": iso(run.started_at),
        "ended_at": iso(run.ended_at),
        "error": run.error,
        "infrastructure": run.infrastructure,
    }


EVENT_TIMES = ("until", "retry_at", "cooldown_until", "waited_until")
"""Event data keys holding epoch seconds (a deferral's time, the back-off, the cooldown, the
retry time an operator's retry cut short)."""


def event_data(event: Event, at: Callable[[float], str | None] = iso) -> dict[str, Any]:
    """An event's data with its :data:`EVENT_TIMES` spelled by ``at`` (ISO-8601 by default)."""
    data = dict(event.data)
    for key in EVENT_TIMES:
        if isinstance(data.get(key), int | float) and not isinstance(data[key], bool):
            data[key] = at(data[key])
    return data


def event_pairs(event: Event, at: Callable[[float], str | None] = iso) -> str:
    """An event's data as ``key=value`` pairs (None values left out, times by ``at``)."""
    return ", ".join(f"{k}={v}" for k, v in event_data(event, at).items() if v is not None)


def event_json(event: Event) -> dict[str, Any]:
    """An event as ``show`` prints it."""
    data = event_data(event)
    return {
        "id": str(event.seq),
        "card_id": event.card_id,
        "run_id": event.run_id,
        "kind": event.kind,
        "at": iso(event.at),
        "data": data,
    }


def _retry_mark(event: Event) -> bool:
    """An event that sets or ends a retry state (an operator's ``retry`` starts over; other
    moves keep the count, so they leave the state as it was)."""
    if event.kind == "moved":
        return event.data.get("action") == "retry"
    return event.kind in ("failed", "tempfail", "deferred", "completed", "unblocked")


def retry_state(
    card: Card, events: Sequence[Event], limit: int | None = None
) -> dict[str, Any] | None:
    """Where the card stands in its retry policy, from the last failure's event: ``attempt``
    (the try that runs next), ``attempts`` (tries in all; ``limit``, the assignee's, when no
    event and no ``--failure-limit`` says), ``next_try_at`` and ``reason``; None for a card
    that has not failed since its last success, unblock or ``retry``."""
    last = next((e for e in reversed(events) if _retry_mark(e)), None)
    if last is None or last.kind in ("completed", "unblocked", "moved"):
        return None
    data = last.data
    pending = card.status is CardStatus.READY and card.retry_at is not None
    if last.kind == "deferred":
        why = f": {data['reason']}" if data.get("reason") else ""
        return {
            "attempt": card.consecutive_failures + 1,
            "attempts": card.failure_limit or limit,
            "counted": False,
            "next_try_at": iso(card.retry_at),
            "deferred_until": iso(data.get("until")),
            "reason": f"deferred by the worker{why}",
        }
    return {
        "attempt": card.consecutive_failures + (1 if pending else 0),
        "attempts": data.get("attempts") or card.failure_limit or limit,
        "counted": data.get("counted", last.kind == "failed"),
        "next_try_at": iso(card.retry_at) if pending else None,
        "reason": data.get("reason")
        or ("temporary failure (exit 75)" if last.kind == "tempfail" else None),
    }


def show_json(
    card: Card,
    runs: Sequence[Run],
    events: Sequence[Event],
    sessions: Mapping[str, Session] | None = None,
    *,
    limit: int | None = None,
) -> dict[str, Any]:
    """``show --json``: the card's fields plus ``runs``, ``events`` and ``retry``
    (:func:`retry_state`, ``limit`` the tries its assignee's cards get). ``sessions`` (this
    host's, by id: see :func:`dispatcher.launch.resources.sessions_of`) adds each run's
    ``resources``, ``memory_peak`` and ``cpu_time``."""
    doc = card_json(card)
    doc["retry"] = retry_state(card, events, limit)
    doc["runs"] = [run_json(r) for r in runs]
    if sessions is not None:
        for run, entry in zip(runs, doc["runs"], strict=True):
            entry.update(resources_json(sessions.get(run.session_id or "")))
    doc["events"] = [event_json(e) for e in events]
    return doc


def tick_json(report: TickReport) -> dict[str, Any]:
    """``tick --json``."""
    return {"at": iso(report.now), **report.to_dict()}


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


UNCONFIGURED_NOTE = "[assignee not configured]"
"""Marks a card that still needs an assignee the config no longer names."""


def unconfigured(card: Card, assignees: Collection[str] | None) -> bool:
    """Whether ``card`` waits for (or runs under) an assignee not in ``assignees`` (None: the
    config is not loaded, so nothing can be said). Done and archived cards need none."""
    if assignees is None or card.status in (CardStatus.DONE, CardStatus.ARCHIVED):
        return False
    return card.assignee not in assignees


def card_table(
    cards: Sequence[Card],
    *,
    times: TimeView | None = None,
    assignees: Collection[str] | None = None,
    waits: Mapping[str, str] | None = None,
    deferred: Collection[str] = (),
) -> list[str]:
    """``list`` as aligned lines; UPDATED is relative (``3h ago``), for scanning. A card
    whose assignee is not among ``assignees`` ends with :data:`UNCONFIGURED_NOTE`; one a full
    named limit holds back with ``[waiting: limit openai (6 of 6 running)]`` (``waits``); one
    waiting for its next try says so (``deferred``: those their worker deferred)."""
    view = times or TimeView.local()
    lines = [
        f"{'ID':<12}  {'STATUS':<8}  {'PRI':>4}  {'ASSIGNEE':<12}  {'GROUP':<12}  {'FAILS':>5}  "
        f"{'UPDATED':<10}  TITLE"
    ]
    for card in cards:
        status = card.status.value
        if card.block_kind is not None:
            status += f"({card.block_kind.value})"
        lines.append(
            f"{card.id:<12}  {status:<8}  {card.priority:>4}  {_cut(card.assignee, 12):<12}  "
            f"{_cut(card.group or '-', 12):<12}  "
            f"{card.consecutive_failures:>5}  {view.ago(card.updated_at):<10}  "
            f"{_cut(card.title, 60)}{backing_off(card, view.now, deferred=card.id in deferred)}"
            f"{waiting(card, waits)}"
            + (f"  {UNCONFIGURED_NOTE}" if unconfigured(card, assignees) else "")
        )
    return lines


SORT_KEYS: dict[str, Callable[[Card], Any]] = {
    "priority": lambda c: (-c.priority, c.created_at, c.id),
    "created": lambda c: (c.created_at, c.id),
    "updated": lambda c: (-(c.updated_at or 0), c.id),
    "status": lambda c: (BOARD_ORDER.index(c.status) if c.status in BOARD_ORDER else 99, c.id),
    "id": lambda c: c.id,
}
"""``kanban list --sort``: priority (highest first), created (oldest first), updated (newest
first), status (board order), id."""


def sorted_cards(cards: Sequence[Card], key: str, limit: int | None = None) -> list[Card]:
    """``cards`` in the order ``key`` names (:data:`SORT_KEYS`), at most ``limit``."""
    ordered = sorted(cards, key=SORT_KEYS[key])
    return ordered if limit is None else ordered[:limit]


def show_text(
    card: Card,
    runs: Sequence[Run],
    events: Sequence[Event],
    *,
    times: TimeView | None = None,
    hosts: Mapping[str, str | None] | None = None,
    used: Mapping[str, str] | None = None,
    wait: str | None = None,
    limit: int | None = None,
) -> list[str]:
    """``show`` as text: fields, runs, events (times as ``times`` shows them). ``hosts``
    (cluster mode): each run's host, shown after its placement (``host alpha``); ``used``:
    each run's class and use (:func:`dispatcher.launch.resources.resources_text`), on a line
    of its own below the run; ``wait``: the full named limit the card waits for; ``limit``:
    the tries its assignee's cards get."""
    view = times or TimeView.local()
    short = view.at
    lines = [
        f"card      {card.id}  {card.title}",
        f"status    {card.status.value}"
        + (f" ({card.block_kind.value})" if card.block_kind else "")
        + (f" until {view.both(card.blocked_until)}" if card.blocked_until else ""),
        f"assignee  {card.assignee}   "
        + (f"group {card.group}   " if card.group else "")
        + f"priority {card.priority}   failures "
        f"{card.consecutive_failures}"
        + (f"/{card.failure_limit}" if card.failure_limit else "")
        + f"   tempfails {card.tempfail_count}",
        f"created   {short(card.created_at)}   started {short(card.started_at)}   completed "
        f"{short(card.completed_at)}",
    ]
    if card.parents:
        lines.append("parents   " + " ".join(card.parents))
    if wait:
        lines.append(f"waiting   {wait}")
    if card.retry_at:
        lines.append(f"retry at  {view.both(card.retry_at)}")
    lines += _retry_lines(card, events, view, limit)
    if card.cooldown_until:
        lines.append(f"cooldown  until {view.both(card.cooldown_until)}")
    if card.last_failure_error:
        lines.append(f"error     {card.last_failure_error}")
    if card.result:
        lines.append(f"result    {card.result}")
    if card.body:
        lines.append("body")
        lines += ["  " + line for line in card.body.splitlines()[:20]]
    lines.append("runs")
    for run in runs:
        detail = run.outcome.value if run.outcome else "open"
        if run.exit_code is not None:
            detail += f" exit {run.exit_code}"
        if run.signal:
            detail += f" {run.signal}"
        if run.infrastructure:
            detail += " (infrastructure)"
        lines.append(
            f"  {run.run_id}  #{run.attempt}  {short(run.claimed_at)}  {detail:<24}  "
            f"{run.session_id or '-'}  {run.placement or '-'}"
            + (f"  host {hosts.get(run.run_id) or '-'}" if hosts is not None else "")
        )
        if used and used.get(run.run_id):
            lines.append(f"      {used[run.run_id]}")
    lines.append("events")
    for event in events:
        extra = event_pairs(event, short)
        lines.append(f"  {short(event.at)}  {event.kind:<16}  {_cut(extra, 80)}")
    return lines


def _retry_lines(
    card: Card, events: Sequence[Event], view: TimeView, limit: int | None
) -> list[str]:
    state = retry_state(card, events, limit)
    if state is None:
        return []
    of = f" of {state['attempts']}" if state["attempts"] else ""
    lines = [f"attempt   {state['attempt']}{of}"]
    if "deferred_until" in state and card.retry_at is not None:
        reason = state["reason"].removeprefix("deferred by the worker")
        lines.append(f"next try deferred until {view.at(card.retry_at)} by the worker{reason}")
    elif state["next_try_at"] and card.retry_at is not None:
        when = relative(card.retry_at, view.now)
        why = f" ({state['reason']})" if state["reason"] else ""
        lines.append(f"next try {when}{why}")
    return lines


def waiting(card: Card, waits: Mapping[str, str] | None) -> str:
    """`` [waiting: limit openai (6 of 6 running)]`` for a card a full limit holds back."""
    note = (waits or {}).get(card.id)
    return f" [waiting: {note}]" if note else ""


def retry_pending(card: Card, now: float) -> bool:
    """Whether ``card`` is ready but behind its ``retry_at`` (backing off, or deferred)."""
    return card.status is CardStatus.READY and card.retry_at is not None and card.retry_at > now


def deferred_cards(
    cards: Sequence[Card], runs_of: Callable[[str], Sequence[Run]], now: float
) -> frozenset[str]:
    """The cards among ``cards`` waiting because their worker deferred them (their latest run
    ended ``deferred``), as opposed to backing off after a failure. Only waiting cards are
    looked up (``runs_of``: the store's), so a board of cards that wait for nothing costs
    nothing."""
    found = set()
    for card in cards:
        if retry_pending(card, now):
            runs = runs_of(card.id)
            if runs and runs[-1].outcome == "deferred":  # Outcome.DEFERRED (a StrEnum)
                found.add(card.id)
    return frozenset(found)


def backing_off(card: Card, now: float, *, deferred: bool = False) -> str:
    """`` [backing off, next try in 40s]`` for a ready card behind its ``retry_at`` (``[deferred,
    ...]`` when its worker chose the time), else ""."""
    if not retry_pending(card, now):
        return ""
    assert card.retry_at is not None
    why = "deferred" if deferred else "backing off"
    return f" [{why}, next try {relative(card.retry_at, now)}]"


def board_text(
    cards: Sequence[Card],
    *,
    paused: bool,
    times: TimeView | None = None,
    assignees: Collection[str] | None = None,
    waits: Mapping[str, str] | None = None,
    deferred: Collection[str] = (),
) -> list[str]:
    """A compact view by status (the newest done cards only); unconfigured assignees, cards
    waiting for a limit and cards waiting for their next try marked as in :func:`card_table`."""
    view = times or TimeView.local()
    lines = ["claiming is PAUSED ('dispatch kanban resume' to resume)"] if paused else []
    for status in BOARD_ORDER:
        group = [c for c in cards if c.status is status]
        if status is CardStatus.DONE:
            group = sorted(group, key=lambda c: c.completed_at or 0, reverse=True)
        lines.append(f"{status.value.upper()} ({len(group)})")
        shown = group[:DONE_SHOWN] if status is CardStatus.DONE else group
        for card in shown:
            note = ""
            if card.block_kind:
                note = f" [{card.block_kind.value}]"
            elif status is CardStatus.BLOCKED:
                note = " [breaker]"
            note += backing_off(card, view.now, deferred=card.id in deferred)
            note += waiting(card, waits)
            if unconfigured(card, assignees):
                note += f" {UNCONFIGURED_NOTE}"
            group_note = f" [{_cut(card.group, 24)}]" if card.group else ""
            lines.append(
                f"  {card.id}  p{card.priority:<3} {_cut(card.assignee, 12):<12} "
                f"{_cut(card.title, 56)}{group_note}{note}"
            )
        if len(group) > len(shown):
            lines.append(f"  ... {len(group) - len(shown)} more")
    return lines


def tick_text(report: TickReport) -> list[str]:
    """``tick`` as text: one line per started or refused card, then a summary."""
    lines = []
    for item in report.dispatched:
        unit = f" {item.unit}" if item.unit else ""
        lines.append(
            f"started {item.card_id} run {item.run_id}: {item.session_id} ({item.placement}{unit})"
        )
    for closed in report.refused:
        lines.append(
            f"refused {closed.card_id} run {closed.run_id}: {closed.outcome.value}: {closed.error}"
        )
    for card_id in report.planned:
        lines.append(f"would start {card_id}")
    for card_id, wait in report.limited:
        lines.append(f"waiting {card_id}: {wait}")
    summary = (
        f"{len(report.dispatched)} started, {len(report.refused)} refused, "
        f"{len(report.reconciled)} finished, {len(report.promoted)} promoted, "
        f"{len(report.deferred)} waiting for room, {len(report.guarded)} in cooldown, "
        f"{len(report.backing_off)} backing off"
    )
    if report.limited:
        summary += f", {len(report.limited)} waiting on limits"
    if report.paused:
        summary += "; claiming is paused"
    if report.dry_run:
        summary += " (dry run: nothing changed)"
    lines.append(summary)
    return lines
