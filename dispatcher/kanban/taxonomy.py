"""The failure taxonomy and breaker: what a finished run does to its card. Pure functions.

Exit 0 → ``done``. Exit 75 (EX_TEMPFAIL) → back to ``ready`` with exponential back-off, never
counted, ``blocked`` (transient) after ``tempfail_limit`` in a row. Exit 78 (EX_CONFIG) → the
breaker trips at once. Any other non-zero exit, a signal, a timeout, a lost keeper or a worker
that could not start counts toward ``failure_limit`` (the kanban meaning of the retry policy's
``attempts``) and goes back to ``ready`` behind the policy's back-off (``retry_at``); at the
limit the card is ``blocked`` with a ``gave_up`` event. The configured rules of the card's retry
policy (:mod:`dispatcher.launch.retry`) are consulted first: ``fail`` gives up at once, a
``retry`` with ``counted: false`` backs off without using an attempt; a retrying rule with
``resources`` records that class in its event, and :func:`retry_class` hands it to the next
try's spawn. A refused spawn (no
restart-safe scope) is infrastructure: never counted, the card stays ``ready`` behind a
cooldown. Only a success or an explicit unblock resets the count.

How a finished session maps onto an outcome is the launch core's
:func:`dispatcher.launch.outcome.outcome_of`, the same for cron. Nothing here touches the
store or the clock: the store calls :func:`after_run` inside the
transaction that closes the run, with the card as it is at that moment.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatcher.kanban.model import (
    BlockKind,
    Card,
    CardChange,
    CardStatus,
    Event,
    EventKind,
    Run,
)
from dispatcher.kanban.settings import KanbanSettings
from dispatcher.launch.outcome import Outcome, Result
from dispatcher.launch.retry import ANSWERED, Action, Random, RetryPolicy, Rule
from registry.usage import ResourceClass
from scope.foundation.errors import Invalid
from scope.resources import ScopeProperties

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
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """``kanban.retry``: the policy of every assignee without its own."""
    assignee_retry: Mapping[str, RetryPolicy] = field(default_factory=dict)
    rng: Random = random.random
    """The jitter's random source (injected by tests)."""

    @classmethod
    def from_settings(cls, settings: KanbanSettings, rng: Random | None = None) -> Breaker:
        """The breaker configured by the ``kanban:`` section."""
        return cls(
            failure_limit=settings.limit_for(),
            tempfail_limit=settings.tempfail_limit,
            transient_block=settings.transient_block,
            infrastructure_cooldown=settings.infrastructure_cooldown,
            retry=settings.retry or RetryPolicy(),
            assignee_retry={
                name: assignee.retry
                for name, assignee in settings.assignees.items()
                if assignee.retry is not None
            },
            rng=rng or random.random,
        )

    def policy(self, assignee: str) -> RetryPolicy:
        """The retry policy of ``assignee`` (its own, else ``kanban.retry``)."""
        return self.assignee_retry.get(assignee, self.retry)

    def limit(self, card: Card) -> int:
        """Tries in all for ``card``: its ``--failure-limit``, else its policy's ``attempts``,
        else ``kanban.failure_limit``."""
        return card.failure_limit or self.policy(card.assignee).attempts or self.failure_limit

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
    if outcome in ANSWERED and not result.infrastructure:
        # Infrastructure (a degraded worker stopped with its gateway) is never the policy's.
        rule = breaker.policy(card.assignee).configured(outcome, result.exit_code)
        if rule is not None:
            return _by_rule(card, data, result, breaker, now, rule)
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
    if outcome is Outcome.DEFERRED:
        # The worker's `defer` stored the time on the card; its reason is in that event.
        return CardChange(
            fields={"status": CardStatus.READY, "retry_at": card.retry_at or now},
        )
    if outcome in (Outcome.RECLAIMED, Outcome.REPLACED):
        return CardChange(
            fields={"status": CardStatus.READY}, events=((EventKind.RECLAIMED, data),)
        )
    return _counted(card, data, result, breaker, now)


def _by_rule(
    card: Card, data: dict[str, Any], result: Result, breaker: Breaker, now: float, rule: Rule
) -> CardChange:
    """A configured rule decides: fail now, a counted retry, or a retry that uses no attempt."""
    data["rule"] = rule.label
    if rule.resources is not None and rule.action is Action.RETRY:
        # The next try's class (kept in the event: the board has no column for it, and the
        # event says why that try ran with more). Canonical values: bytes, seconds, percent.
        data["resources"] = _spelled(rule.resources)
    if rule.action is Action.FAIL:
        return _counted(card, data, result, breaker, now, give_up=f"{data['rule']}: no retry")
    if rule.counted:
        # The configured rule replaces the built-in "78 trips at once" (a config may override it).
        return _counted(card, data, result, breaker, now, builtin=False)
    data["counted"] = False
    delay = breaker.policy(card.assignee).backoff.delay(card.tempfail_count + 1, breaker.rng)
    return _tempfail(card, data, result, breaker, now, delay=delay)


def _spelled(props: ScopeProperties) -> dict[str, Any]:
    found = dict(props.limits)
    if props.best_effort is not None:
        found["best_effort"] = props.best_effort
    return found


RETRY_CLASS_ENDS = frozenset(
    {
        EventKind.COMPLETED,
        EventKind.BLOCKED,
        EventKind.UNBLOCKED,
        EventKind.GAVE_UP,
        EventKind.DEFERRED,
        EventKind.EXIT_IGNORED,
        EventKind.MOVED,
    }
)
"""Events after which a retry rule's class no longer applies to the next try."""


def retry_class(events: Sequence[Event]) -> ScopeProperties | None:
    """The class a retry rule chose for the card's next try: from its latest ``failed`` or
    ``tempfail`` event, unless the card ended, was blocked, unblocked, deferred or moved since.
    Refusals, reclaims and interruptions in between do not use up the try (nor its class)."""
    for event in reversed(events):
        if event.kind in (EventKind.FAILED, EventKind.TEMPFAIL):
            return _class_of(event.data.get("resources"))
        if event.kind in RETRY_CLASS_ENDS:
            return None
    return None


def _class_of(chosen: Any) -> ScopeProperties | None:
    """The class stored in an event (None when absent or unusable: the worker's own applies)."""
    if not isinstance(chosen, Mapping):
        return None
    granted = ResourceClass.from_json({"limits": chosen})
    best_effort = chosen.get("best_effort")
    try:
        props = ScopeProperties(
            **(granted.limits if granted else {}),  # type: ignore[arg-type]
            best_effort=best_effort if isinstance(best_effort, bool) else None,
        )
        props.check()
    except (Invalid, TypeError):
        return None
    return props


def _tempfail(
    card: Card,
    data: dict[str, Any],
    result: Result,
    breaker: Breaker,
    now: float,
    *,
    delay: float | None = None,
) -> CardChange:
    """Back off without using an attempt (exit 75, or a rule with ``counted: false``)."""
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
    retry_at = now + (breaker.backoff(count) if delay is None else delay)
    data["retry_at"] = retry_at
    fields |= {"status": CardStatus.READY, "retry_at": retry_at}
    kind = EventKind.TEMPFAIL if result.outcome is Outcome.TEMPFAIL else EventKind.FAILED
    return CardChange(fields=fields, events=((kind, data),))


def _counted(
    card: Card,
    data: dict[str, Any],
    result: Result,
    breaker: Breaker,
    now: float,
    *,
    give_up: str | None = None,
    builtin: bool = True,
) -> CardChange:
    """A counted failure: back off before the next attempt, or give up at the limit
    (``builtin``: no configured rule decided, so a configuration error trips at once)."""
    failures = card.consecutive_failures + 1
    limit = breaker.limit(card)
    data["consecutive_failures"] = failures
    data["attempt"] = failures
    data["attempts"] = limit
    fields: dict[str, Any] = {
        "consecutive_failures": failures,
        # A counted failure ends any streak of temporary failures.
        "tempfail_count": 0,
        "retry_at": None,
        "last_failure_error": result.error,
    }
    events: list[tuple[EventKind, Mapping[str, Any]]] = [(EventKind.FAILED, data)]
    if give_up is None and builtin and result.outcome is Outcome.CONFIG_ERROR:
        give_up = "configuration error (exit 78): the breaker trips at once"
    if give_up is None and failures >= limit:
        give_up = f"{failures} consecutive failures (failure limit {limit})"
    if give_up is not None:
        fields |= {"status": CardStatus.BLOCKED, "block_kind": None, "blocked_until": None}
        events.append((EventKind.BLOCKED, {"block_kind": None, "reason": give_up}))
        events.append((EventKind.GAVE_UP, {"reason": give_up, "last_error": result.error}))
        return CardChange(fields=fields, events=tuple(events))
    delay = breaker.policy(card.assignee).backoff.delay(failures, breaker.rng)
    data["retry_at"] = fields["retry_at"] = now + delay
    data["reason"] = f"backoff, attempt {failures + 1} of {limit}"
    fields["status"] = CardStatus.READY
    return CardChange(fields=fields, events=tuple(events))
