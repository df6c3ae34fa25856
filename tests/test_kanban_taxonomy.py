"""The failure taxonomy as a pure function: exit codes, signals and states → card changes."""

from __future__ import annotations

import pytest

from dispatcher.kanban.model import (
    BlockKind,
    CardStatus,
    EventKind,
)
from dispatcher.kanban.taxonomy import Breaker, after_run
from dispatcher.launch.outcome import Outcome, Result, outcome_of
from registry.abc import Owner, Session, SessionState
from scope.abc import CallerKind, Placement
from tests.support.cards import RUN, card

NOW = 1_800_000_000.0
BREAKER = Breaker()


def session(
    state: SessionState, exit_code: int | None = None, signal: str | None = None
) -> Session:
    return Session(
        id="s_000000000001",
        argv=("w",),
        cwd="/",
        owner=Owner(kind="kanban", id=RUN.run_id),
        caller=CallerKind.KANBAN,
        placement=Placement.SCOPED,
        unit=None,
        state=state,
        log_path="x",
        exit_code=exit_code,
        signal=signal,
    )


@pytest.mark.parametrize(
    ("state", "code", "signal", "outcome"),
    [
        (SessionState.EXITED, 0, None, Outcome.COMPLETED),
        (SessionState.EXITED, 75, None, Outcome.TEMPFAIL),
        (SessionState.EXITED, 78, None, Outcome.CONFIG_ERROR),
        (SessionState.EXITED, 1, None, Outcome.FAILED),
        (SessionState.EXITED, 255, None, Outcome.FAILED),
        (SessionState.EXITED, None, "SIGSEGV", Outcome.FAILED),
        (SessionState.KILLED, None, "SIGTERM", Outcome.FAILED),
        (SessionState.TIMED_OUT, None, "SIGTERM", Outcome.TIMED_OUT),
        (SessionState.LOST, None, None, Outcome.LOST),
        (SessionState.FAILED_START, None, None, Outcome.FAILED_START),
    ],
)
def test_sessions_classify_by_the_taxonomy(
    state: SessionState, code: int | None, signal: str | None, outcome: Outcome
) -> None:
    result = outcome_of(session(state, code, signal))
    assert result.outcome is outcome
    assert result.exit_code == code
    assert result.signal == signal
    assert result.session_id == "s_000000000001"


def test_a_running_session_cannot_be_classified() -> None:
    with pytest.raises(ValueError, match="still running"):
        outcome_of(session(SessionState.RUNNING))


def test_success_completes_and_resets_every_count() -> None:
    change = after_run(
        card(consecutive_failures=1, tempfail_count=3, last_failure_error="x"),
        RUN,
        Result(outcome=Outcome.COMPLETED, exit_code=0),
        BREAKER,
        NOW,
    )
    assert change.fields["status"] is CardStatus.DONE
    assert change.fields["completed_at"] == NOW
    assert change.fields["consecutive_failures"] == 0
    assert change.fields["tempfail_count"] == 0
    assert change.fields["last_failure_error"] is None
    assert [kind for kind, _ in change.events] == [EventKind.COMPLETED]


def test_counted_failures_trip_the_breaker_at_the_limit() -> None:
    failed = Result(outcome=Outcome.FAILED, exit_code=1, error="exited with code 1")
    first = after_run(card(), RUN, failed, BREAKER, NOW)
    assert first.fields["status"] is CardStatus.READY
    assert first.fields["consecutive_failures"] == 1
    second = after_run(card(consecutive_failures=1), RUN, failed, BREAKER, NOW)
    assert second.fields["status"] is CardStatus.BLOCKED
    assert second.fields["block_kind"] is None
    assert [k for k, _ in second.events] == [EventKind.FAILED, EventKind.BLOCKED, EventKind.GAVE_UP]
    assert second.fields["last_failure_error"] == "exited with code 1"


def test_a_per_card_failure_limit_overrides_the_default() -> None:
    failed = Result(outcome=Outcome.TIMED_OUT, error="timed out")
    change = after_run(card(consecutive_failures=1, failure_limit=3), RUN, failed, BREAKER, NOW)
    assert change.fields["status"] is CardStatus.READY
    change = after_run(card(consecutive_failures=2, failure_limit=3), RUN, failed, BREAKER, NOW)
    assert change.fields["status"] is CardStatus.BLOCKED


def test_config_error_trips_at_once() -> None:
    change = after_run(
        card(failure_limit=10), RUN, Result(outcome=Outcome.CONFIG_ERROR), BREAKER, NOW
    )
    assert change.fields["status"] is CardStatus.BLOCKED
    assert EventKind.GAVE_UP in [k for k, _ in change.events]


@pytest.mark.parametrize("outcome", [Outcome.LOST, Outcome.FAILED_START])
def test_lost_and_failed_start_count(outcome: Outcome) -> None:
    change = after_run(card(), RUN, Result(outcome=outcome), BREAKER, NOW)
    assert change.fields["consecutive_failures"] == 1


def test_tempfail_backs_off_exponentially_without_counting() -> None:
    retry_delays = []
    count = 0
    for _ in range(9):
        change = after_run(
            card(tempfail_count=count, consecutive_failures=1),
            RUN,
            Result(outcome=Outcome.TEMPFAIL, exit_code=75),
            BREAKER,
            NOW,
        )
        assert change.fields["status"] is CardStatus.READY
        assert "consecutive_failures" not in change.fields
        retry_delays.append(change.fields["retry_at"] - NOW)
        count = change.fields["tempfail_count"]
    assert retry_delays == [30, 60, 120, 240, 480, 960, 1920, 3600, 3600]


def test_the_tenth_tempfail_in_a_row_blocks_transiently() -> None:
    change = after_run(
        card(tempfail_count=9),
        RUN,
        Result(outcome=Outcome.TEMPFAIL, exit_code=75),
        BREAKER,
        NOW,
    )
    assert change.fields["status"] is CardStatus.BLOCKED
    assert change.fields["block_kind"] is BlockKind.TRANSIENT
    assert change.fields["blocked_until"] == NOW + 300
    assert EventKind.GAVE_UP not in [k for k, _ in change.events]


def test_infrastructure_refusal_keeps_the_card_ready_and_uncounted() -> None:
    change = after_run(
        card(consecutive_failures=1),
        RUN,
        Result(outcome=Outcome.SPAWN_REFUSED, error="no scope; fix: linger", infrastructure=True),
        BREAKER,
        NOW,
    )
    assert change.fields["status"] is CardStatus.READY
    assert "consecutive_failures" not in change.fields
    assert change.fields["cooldown_until"] == NOW + 300
    assert change.fields["last_failure_error"] == "no scope; fix: linger"


def test_a_card_the_worker_already_moved_keeps_its_status() -> None:
    done = card(status=CardStatus.DONE)
    change = after_run(done, RUN, Result(outcome=Outcome.FAILED, exit_code=3), BREAKER, NOW)
    assert change.fields == {}
    assert [k for k, _ in change.events] == [EventKind.EXIT_IGNORED]
    assert after_run(done, RUN, Result(outcome=Outcome.COMPLETED), BREAKER, NOW).events == ()


def test_backoff_is_capped_and_never_overflows() -> None:
    assert BREAKER.backoff(1) == 30
    assert BREAKER.backoff(10_000) == 3600
    assert BREAKER.backoff(0) == 0
