"""The failure taxonomy and breaker: what a finished run does to its card. Pure functions.

Exit 0 → ``done``. Exit 75 (EX_TEMPFAIL) → back to ``ready`` with exponential back-off, never
counted, ``blocked`` (transient) after ``tempfail_limit`` in a row. Exit 78 (EX_CONFIG) → the
breaker trips at once. Any other non-zero exit, a signal, a timeout, a lost keeper or a worker
that could not start counts toward ``failure_limit``; at the limit the card is ``blocked`` with a
``gave_up`` event. A refused spawn (no restart-safe scope) is infrastructure: never counted, the
card stays ``ready`` behind a cooldown. Only a success or an explicit unblock resets the count.

How a finished session maps onto an outcome is the launch core's
:func:`dispatcher.launch.outcome.outcome_of`, the same for cron. Nothing here touches the
store or the clock: the store calls :func:`after_run` inside the
transaction that closes the run, with the card as it is at that moment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dispatcher.kanban.model import (
    BlockKind,
    Card,
    CardChange,
    CardStatus,
    EventKind,
    Run,
)
from dispatcher.kanban.settings import KanbanSettings
from dispatcher.launch.outcome import Outcome, Result

COUNTED = frozenset(
    {
        Outcome.FAILED,
        Outcome.TIMED_OUT,
        Outcome.LOST,
        Outcome.FAILED_START,
        Outcome.CONFIG_ERROR,
        Outcome.OOM_KILLED,
    }
)
"""Outcomes that count toward the breaker."""


@dataclass(frozen=True, kw_only=True)
class Breaker:
    """The knobs of the taxonomy (from ``kanban:`` settings)."""

    failure_limit: int = 2
    tempfail_limit: int = 10
    transient_block: float = 300.0
    infrastructure_cooldown: float = 300.0
    backoff_base: float = 30.0
    backoff_max: float = 3600.0

    @classmethod
    def from_settings(cls, settings: KanbanSettings) -> Breaker:
        """The breaker configured by the ``kanban:`` section."""
        return cls(
            failure_limit=settings.failure_limit,
            tempfail_limit=settings.tempfail_limit,
            transient_block=settings.transient_block,
            infrastructure_cooldown=settings.infrastructure_cooldown,
        )

    def backoff(self, count: int) -> float:
        """Delay before retry number ``count`` (1-based) of a temporary failure: 30 s doubling,
        capped at one hour."""
        if count < 1:
            return 0.0
        # Cap the exponent so a long streak cannot overflow the float.
        return min(self.backoff_base * 2 ** min(count - 1, 32), self.backoff_max)


def _run_data(run: Run, result: Result) -> dict[str, Any]:
    data: dict[str, Any] = {"outcome": result.outcome.value}
    if result.exit_code is not None:
        data["exit_code"] = result.exit_code
    if result.signal is not None:
        data["signal"] = result.signal
    if result.error:
        data["error"] = result.error
    if result.session_id or run.session_id:
        data["session_id"] = result.session_id or run.session_id
    return data


def after_run(card: Card, run: Run, result: Result, breaker: Breaker, now: float) -> CardChange:
    """What closing ``run`` with ``result`` does to ``card`` (see the module docstring)."""
    data = _run_data(run, result)
    if card.status is not CardStatus.RUNNING or card.current_run_id != run.run_id:
        # The worker (or an operator) already moved the card: the move wins; the exit is only
        # recorded. A clean exit after `complete` needs no event of its own.
        if result.outcome is Outcome.COMPLETED:
            return CardChange()
        data["card_status"] = card.status.value
        return CardChange(events=((EventKind.EXIT_IGNORED, data),))
    outcome = result.outcome
    if outcome is Outcome.COMPLETED:
        return CardChange(
            fields={
                "status": CardStatus.DONE,
                "completed_at": now,
                "consecutive_failures": 0,
                "tempfail_count": 0,
                "retry_at": None,
                "cooldown_until": None,
                "last_failure_error": None,
            },
            events=((EventKind.COMPLETED, data),),
        )
    if outcome is Outcome.TEMPFAIL:
        return _tempfail(card, data, result, breaker, now)
    if outcome is Outcome.SPAWN_REFUSED:
        until = now + breaker.infrastructure_cooldown
        data["cooldown_until"] = until
        data["infrastructure"] = True
        return CardChange(
            fields={
                "status": CardStatus.READY,
                "cooldown_until": until,
                "last_failure_error": result.error,
            },
            events=((EventKind.SPAWN_REFUSED, data),),
        )
    if result.infrastructure and outcome in (Outcome.FAILED, Outcome.LOST):
        # A degraded worker taken down by its gateway's stop: not the card's fault.
        data["infrastructure"] = True
        return CardChange(
            fields={"status": CardStatus.READY, "last_failure_error": result.error},
            events=((EventKind.INTERRUPTED, data),),
        )
    if outcome in (Outcome.RECLAIMED, Outcome.REPLACED):
        return CardChange(
            fields={"status": CardStatus.READY}, events=((EventKind.RECLAIMED, data),)
        )
    return _counted(card, data, result, breaker, now)


def _tempfail(
    card: Card, data: dict[str, Any], result: Result, breaker: Breaker, now: float
) -> CardChange:
    count = card.tempfail_count + 1
    data["tempfail_count"] = count
    fields: dict[str, Any] = {"tempfail_count": count, "last_failure_error": result.error}
    if count >= breaker.tempfail_limit:
        until = now + breaker.transient_block
        fields |= {
            "status": CardStatus.BLOCKED,
            "block_kind": BlockKind.TRANSIENT,
            "blocked_until": until,
            "retry_at": None,
        }
        reason = f"{count} temporary failures in a row (kanban.tempfail_limit)"
        return CardChange(
            fields=fields,
            events=(
                (EventKind.TEMPFAIL, data),
                (
                    EventKind.BLOCKED,
                    {"block_kind": BlockKind.TRANSIENT.value, "reason": reason, "until": until},
                ),
            ),
        )
    retry_at = now + breaker.backoff(count)
    data["retry_at"] = retry_at
    fields |= {"status": CardStatus.READY, "retry_at": retry_at}
    return CardChange(fields=fields, events=((EventKind.TEMPFAIL, data),))


def _counted(
    card: Card, data: dict[str, Any], result: Result, breaker: Breaker, now: float
) -> CardChange:
    failures = card.consecutive_failures + 1
    limit = card.failure_limit or breaker.failure_limit
    data["consecutive_failures"] = failures
    fields: dict[str, Any] = {
        "consecutive_failures": failures,
        # A counted failure ends any streak of temporary failures.
        "tempfail_count": 0,
        "retry_at": None,
        "last_failure_error": result.error,
    }
    events: list[tuple[EventKind, Mapping[str, Any]]] = [(EventKind.FAILED, data)]
    trip_now = result.outcome is Outcome.CONFIG_ERROR
    if trip_now or failures >= limit:
        reason = (
            "configuration error (exit 78): the breaker trips at once"
            if trip_now
            else f"{failures} consecutive failures (failure limit {limit})"
        )
        fields |= {"status": CardStatus.BLOCKED, "block_kind": None, "blocked_until": None}
        events.append((EventKind.BLOCKED, {"block_kind": None, "reason": reason}))
        events.append((EventKind.GAVE_UP, {"reason": reason, "last_error": result.error}))
    else:
        fields["status"] = CardStatus.READY
    return CardChange(fields=fields, events=tuple(events))
