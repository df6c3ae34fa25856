"""A retry rule's ``resources``: the next try's class (kept in the failure's event), checked at
load against the worker's class, and a real OOM-killed worker that completes with more memory."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dispatcher.app.workspace import Workspace
from dispatcher.config import load_config, parse_config
from dispatcher.kanban.model import CardStatus, Event, EventKind
from dispatcher.kanban.taxonomy import Breaker, after_run, retry_class
from dispatcher.launch.outcome import Outcome, Result
from dispatcher.launch.retry import Action, RetryPolicy
from scope.foundation.errors import ConfigError, Invalid
from scope.foundation.schema import Record
from scope.resources import ScopeProperties
from tests.support.cards import NOW, RUN, card
from tests.support.systemd import SystemdManager

OOM_RULE = {"outcomes": ["oom_killed"], "action": "retry", "resources": {"memory_max": "256MiB"}}


def policy(*rules: dict[str, object]) -> RetryPolicy:
    value = Record(RetryPolicy).convert({"backoff": {"jitter": "none"}, "rules": list(rules)})
    assert isinstance(value, RetryPolicy)
    return value


OOM = Result(outcome=Outcome.OOM_KILLED, signal="SIGKILL", error="killed by the OOM killer")


def test_a_retrying_rule_puts_the_next_class_in_its_event() -> None:
    breaker = Breaker(retry=policy(OOM_RULE), failure_limit=3)
    change = after_run(card(), RUN, OOM, breaker, NOW)
    assert change.fields["status"] is CardStatus.READY
    ((kind, data),) = change.events
    assert kind is EventKind.FAILED and data["resources"] == {"memory_max": 256 << 20}
    assert data["rule"] == "rule oom_killed"
    # At the limit there is no next try: the class is recorded, the card gives up.
    last = after_run(card(consecutive_failures=2), RUN, OOM, breaker, NOW)
    assert [k for k, _ in last.events][-1] is EventKind.GAVE_UP
    # A failing rule names no next class (refused at load; built by hand it is ignored).
    fail = {**OOM_RULE, "action": "fail"}
    with pytest.raises(Invalid):
        policy(fail)
    (rule,) = policy(OOM_RULE).rules
    failing = RetryPolicy(rules=(dataclasses.replace(rule, action=Action.FAIL),))
    stop = after_run(card(), RUN, OOM, Breaker(retry=failing), NOW)
    assert "resources" not in stop.events[0][1]


def event(seq: int, kind: EventKind, **data: object) -> Event:
    return Event(seq=seq, card_id="c_1", kind=kind.value, at=NOW + seq, data=data)


CHOSE = event(3, EventKind.FAILED, resources={"memory_max": 256 << 20, "best_effort": True})
TABLE = [
    ([event(1, EventKind.CREATED), event(2, EventKind.CLAIMED)], None),
    ([CHOSE], ScopeProperties(memory_max=256 << 20, best_effort=True)),
    # Refusals, reclaims, interruptions, a new claim: the try is not used up.
    (
        [
            CHOSE,
            event(4, EventKind.CLAIMED),
            event(5, EventKind.SPAWN_REFUSED),
            event(6, EventKind.RECLAIMED),
            event(7, EventKind.INTERRUPTED),
            event(8, EventKind.CLAIMED),
        ],
        ScopeProperties(memory_max=256 << 20, best_effort=True),
    ),
    # A later failure decides for itself (no class: the worker's own).
    ([CHOSE, event(4, EventKind.SPAWNED), event(5, EventKind.FAILED)], None),
    ([CHOSE, event(4, EventKind.GAVE_UP)], None),
    ([CHOSE, event(4, EventKind.BLOCKED), event(5, EventKind.UNBLOCKED)], None),
    ([CHOSE, event(4, EventKind.COMPLETED)], None),
    ([CHOSE, event(4, EventKind.DEFERRED)], None),
    # Junk from another version: the worker's own class applies.
    ([event(3, EventKind.FAILED, resources={"memory_max": "lots"})], ScopeProperties()),
    ([event(3, EventKind.FAILED, resources=[1])], None),
    ([event(3, EventKind.TEMPFAIL, resources={"cpu_weight": 7})], ScopeProperties(cpu_weight=7)),
]


@pytest.mark.parametrize(("events", "expected"), TABLE)
def test_retry_class_comes_from_the_latest_failure(events, expected) -> None:
    assert retry_class(events) == expected


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            "kanban:\n  assignees:\n    a:\n      command: [x]\n"
            "      resources: {memory_max: 1GiB}\n"
            "      retry: {rules: [{outcomes: [oom_killed], resources: {memory_high: 2GiB}}]}\n",
            "c.yaml:6: kanban.assignees.a.retry.rules[0].resources.memory_high: memory_high "
            "2GiB is above memory_max 1GiB; lower memory_high or raise memory_max (over "
            "kanban.assignees.a.resources and scope.resources)",
        ),
        (
            "scope:\n  resources: {memory_max: 1GiB}\n"
            "kanban:\n  retry: {rules: [{outcomes: [failed], resources: {memory_high: 3GiB}}]}\n"
            "  assignees:\n    a: {command: [x]}\n",
            "kanban.retry.rules[0].resources.memory_high: memory_high 3GiB is above memory_max",
        ),
        (
            "kanban:\n  retry: {rules: [{resources: {cpu_quota: '150'}}]}\n",
            "kanban.retry.rules[0].resources.cpu_quota: invalid percentage '150'",
        ),
    ],
)
def test_a_rules_class_that_does_not_fit_is_a_load_error(config: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config, "c.yaml")
    assert expected in info.value.message and "\n" not in info.value.message
    assert info.value.exit_code == 2


def test_a_rules_class_that_fits_loads() -> None:
    settings = parse_config(
        "kanban:\n  assignees:\n    a:\n      command: [x]\n      resources: {memory_max: 48MiB}\n"
        f"      retry: {{rules: [{json.dumps(OOM_RULE)}]}}\n",
        "c.yaml",
    )
    (rule,) = settings.kanban.assignees["a"].retry.rules  # type: ignore[union-attr]
    assert rule.resources == ScopeProperties(memory_max=256 << 20)


# -- a real OOM kill, then a retry with more memory --------------------------------------------

# Touches 96 MiB page by page (bytes * n writes them): past 48 MiB, well within 256 MiB.
HOG = "chunks = [b'x' * (16 << 20) for _ in range(6)]; print('made it')"


@pytest.mark.systemd
def test_a_worker_oom_killed_at_48m_completes_with_256m_on_its_retry(
    systemd_manager: SystemdManager, tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "kanban:\n  assignees:\n    hog:\n"
        f"      command: [python3, -I, -c, {json.dumps(HOG)}]\n"
        "      resources: {memory_max: 48MiB}\n"
        "      retry:\n        attempts: 2\n"
        "        backoff: {initial: 0s, max: 0s, jitter: none}\n"
        f"        rules: [{json.dumps(OOM_RULE)}]\n"
    )
    env = {**systemd_manager.env, "HOME": str(tmp_path)}
    env.pop("INVOCATION_ID", None)
    board = Workspace(
        load_config(config).settings, tmp_path / "state", environ=env, config_path=config
    )
    try:
        card_id = board.board.add("hungry", assignee="hog", now=board.now())[0].id

        def runs_closed(count: int) -> bool:
            board.refresh()
            runs = board.store.runs_of(card_id)
            return len(runs) == count and runs[-1].outcome is not None

        assert len(board.tick().dispatched) == 1
        systemd_manager.wait_for(lambda: runs_closed(1), timeout=30, what="the OOM kill")
        assert len(board.tick().dispatched) == 1
        systemd_manager.wait_for(lambda: runs_closed(2), timeout=30, what="the retry's end")
        first, second = board.store.runs_of(card_id)
        assert first.outcome is Outcome.OOM_KILLED, first.error
        assert first.error and "at memory_max 48MiB" in first.error
        assert second.outcome is Outcome.COMPLETED, second.error
        assert board.store.get_card(card_id).status is CardStatus.DONE
        registry = board.registry()
        classes = [registry.get(r.session_id or "").resources for r in (first, second)]
        assert [c.limits if c else None for c in classes] == [
            {"memory_max": 48 << 20},
            {"memory_max": 256 << 20},
        ]
        assert registry.read_log(second.session_id or "") == b"made it\n"
        failed = [e for e in board.store.events_of(card_id) if e.kind == EventKind.FAILED]
        assert failed[-1].data["resources"] == {"memory_max": 256 << 20}
    finally:
        board.close()
