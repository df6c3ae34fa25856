"""Cron retries: a fire's tries under the job's retry policy, with an injected clock.

The decision after a try (:func:`dispatcher.cron.retries.after_try`) as a table; then the
scheduler driven by ``tick(now)`` over a real SQLite ledger and FakeRegistry: back-off between
tries of one fire (same key, one session per try), the final outcome and every try on the row,
``on_exhausted: pause``, a worker's deferral, and each overlap policy meeting a retry still
pending at the next fire. Real processes: tests/test_cron_retry_process.py.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.cron.records import FireRecord, Kind, RetryKind, Status, Try
from dispatcher.cron.retries import after_try
from dispatcher.cron.scheduler import CronScheduler
from dispatcher.cron.settings import CronJob, OnExhausted, OverlapPolicy
from dispatcher.launch.outcome import Outcome, Result
from dispatcher.launch.retry import Jitter, RetryPolicy
from scope.foundation.schema import Record
from tests.test_cron_scheduler import World, job, utc

NOW = 1_800_000_000.0


def policy(**raw: Any) -> RetryPolicy:
    raw.setdefault("attempts", 3)
    raw.setdefault("backoff", {"initial": "10s", "factor": 2, "max": "10m", "jitter": "none"})
    value = Record(RetryPolicy).convert(raw)
    assert isinstance(value, RetryPolicy)
    return value


def fire(**values: Any) -> FireRecord:
    base: dict[str, Any] = dict.fromkeys(f.name for f in dataclasses.fields(FireRecord))
    base.update(
        id=1,
        fire_key="j@2026-01-05T10:00:00",
        job_id="j",
        kind=Kind.SCHEDULE,
        nominal_wall="2026-01-05T10:00:00",
        fold=0,
        zone="UTC",
        nominal=NOW,
        decided_at=NOW,
        status=Status.RUNNING,
        catch_up=False,
        jitter=0.0,
        infrastructure=False,
        attempt=1,
        attempts=3,
        tries=(),
    )
    base.update(values)
    return FireRecord(**base)


def ended(outcome: Outcome = Outcome.FAILED, code: int | None = 1, **extra: Any) -> Result:
    return Result(outcome=outcome, exit_code=code, error="e", **extra)


def half() -> float:
    return 0.5


UNCOUNTED = Try(attempt=1, outcome=Outcome.TEMPFAIL, counted=False)


@pytest.mark.parametrize(
    ("row", "result", "retry", "at", "attempt", "exhausted"),
    [
        # No retry policy on the row: one try, as before retries existed.
        ({"attempts": None}, ended(), False, None, 1, True),
        ({"attempts": None}, ended(Outcome.COMPLETED, 0), False, None, 1, False),
        # Counted failures back off (10 s, 20 s, no jitter) until the attempts are used.
        ({}, ended(), True, NOW + 10, 2, False),
        ({"attempt": 2}, ended(), True, NOW + 20, 3, False),
        ({"attempt": 3}, ended(), False, None, 3, True),
        # Exit 75 and exit 78 keep their built-in meaning; 75 repeats the attempt number.
        ({"attempt": 2}, ended(Outcome.TEMPFAIL, 75), True, NOW + 10, 2, False),
        ({}, ended(Outcome.CONFIG_ERROR, 78), False, None, 1, False),
        # Success ends the fire; a replaced try is never retried.
        ({"attempt": 2}, ended(Outcome.COMPLETED, 0), False, None, 2, False),
        ({}, ended(Outcome.REPLACED, None), False, None, 1, False),
        # Infrastructure never reaches the rules: not counted, never exhausts.
        ({}, ended(Outcome.SPAWN_REFUSED, None, infrastructure=True), True, NOW + 10, 1, False),
        # The worker deferred: at its time, not counted, whatever the exit was.
        (
            {"retry_at": NOW + 300, "retry_kind": RetryKind.DEFERRED, "retry_reason": "later"},
            ended(),
            True,
            NOW + 300,
            1,
            False,
        ),
        # The uncounted cap (tempfail_limit 3 below): the third in a row ends the fire.
        ({"tries": (UNCOUNTED, UNCOUNTED)}, ended(Outcome.TEMPFAIL, 75), False, None, 1, False),
        ({"tries": (UNCOUNTED,)}, ended(Outcome.TEMPFAIL, 75), True, NOW + 10, 1, False),
    ],
)
def test_after_a_try(
    row: dict[str, Any],
    result: Result,
    retry: bool,
    at: float | None,
    attempt: int,
    exhausted: bool,
) -> None:
    verdict = after_try(fire(**row), result, policy(), tempfail_limit=3, now=NOW, rng=half)
    assert (verdict.next is not None) is retry
    assert verdict.exhausted is exhausted
    if verdict.next is not None:
        assert (verdict.next.at, verdict.next.attempt) == (at, attempt)
    else:
        assert verdict.tried.attempt == attempt


def test_the_tried_record_and_the_reasons() -> None:
    row = fire(attempt=2, tries=(Try(attempt=1, outcome=Outcome.FAILED),))
    verdict = after_try(row, ended(code=3), policy(), tempfail_limit=10, now=NOW, rng=half)
    assert verdict.next is not None and verdict.next.reason == "backoff, attempt 3 of 3"
    assert verdict.tried == Try(
        attempt=2, outcome=Outcome.FAILED, exit_code=3, ended_at=NOW, error="e"
    )
    last = after_try(fire(attempt=3), ended(), policy(), tempfail_limit=10, now=NOW, rng=half)
    assert last.why == "3 of 3 attempts used" and last.exhausted
    usage = policy(rules=[{"exit_codes": ["2"], "action": "fail"}])
    stopped = after_try(fire(), ended(code=2), usage, tempfail_limit=10, now=NOW, rng=half)
    assert stopped.next is None and not stopped.exhausted and "no retry" in (stopped.why or "")
    deferred = fire(retry_at=NOW - 5, retry_kind=RetryKind.DEFERRED, retry_reason="quota")
    late = after_try(
        deferred, ended(Outcome.COMPLETED, 0), policy(), tempfail_limit=10, now=NOW, rng=half
    )
    assert late.tried.outcome is Outcome.DEFERRED and not late.tried.counted
    assert late.next is not None and (late.next.at, late.next.kind, late.next.reason) == (
        NOW,
        RetryKind.DEFERRED,
        "quota",
    )
    jittered = policy(backoff={"initial": "10s", "jitter": "full"})
    assert jittered.backoff.jitter is Jitter.FULL
    spread = after_try(fire(), ended(), jittered, tempfail_limit=10, now=NOW, rng=half)
    assert spread.next is not None and spread.next.at == NOW + 5


def test_what_history_says_of_a_fire_with_retries() -> None:
    from dispatcher.cron.report import attempt_text, history_lines, retry_entry
    from dispatcher.timefmt import TimeView

    view = TimeView(now=NOW, zone=None)
    first = Try(attempt=1, outcome=Outcome.FAILED, exit_code=3, session_id="s_1")
    second = Try(attempt=2, outcome=Outcome.FAILED, exit_code=3, session_id="s_2")
    waiting = fire(
        status=Status.RETRY,
        attempt=3,
        attempts=4,
        tries=(first, second),
        retry_at=NOW + 40,
        retry_kind=RetryKind.BACKOFF,
        retry_reason="backoff, attempt 3 of 4",
    )
    assert attempt_text(waiting) == "3 of 4" and attempt_text(fire(attempts=None)) == "1"
    assert history_lines(waiting, view) == [
        "attempt 1 of 4: failed (exit 3), session s_1",
        "attempt 2 of 4: failed (exit 3), session s_2",
        "next try in 40s (backoff, attempt 3 of 4)",
    ]
    deferred = fire(
        status=Status.RETRY,
        zone="Europe/Berlin",
        tries=(Try(attempt=1, outcome=Outcome.DEFERRED, counted=False),),
        retry_at=NOW + 600,
        retry_kind=RetryKind.DEFERRED,
        retry_reason="rate limited",
    )
    until = view.at(NOW + 600, "Europe/Berlin")
    assert (
        history_lines(deferred, view)[-1] == f"deferred until {until} by the worker: rate limited"
    )
    assert history_lines(deferred, view)[0] == "attempt 1 of 3: deferred, not counted"
    assert retry_entry(deferred) == {
        "attempt": 1,
        "attempts": 3,
        "next_try_at": "2027-01-15T09:10:00+01:00",
        "kind": "deferred",
        "reason": "rate limited",
    }
    # A fire of one try without a retry policy prints nothing more than before.
    assert history_lines(fire(attempts=None, status=Status.DONE, tries=(first,)), view) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  retry: {}\n", "cron.retry.attempts: a cron retry policy needs attempts"),
        ("  retry: {attempts: 0}\n", "cron.retry.attempts: must be at least 1"),
        ("  retry: {attempts: 2, backoff: {factor: 0.5}}\n", "cron.retry.backoff.factor: must"),
        (
            "  retry: {attempts: 2, backoff: {initial: 1m, max: 10s}}\n",
            "cron.retry.backoff.max: must be at least backoff.initial",
        ),
        (
            "  retry: {attempts: 2, rules: [{outcomes: [exploded]}]}\n",
            "cron.retry.rules[0].outcomes[0]: unknown outcome 'exploded'",
        ),
        (
            "  retry: {attempts: 2, rules: [{exit_codes: ['9-x']}]}\n",
            "cron.retry.rules[0].exit_codes[0]: invalid exit code",
        ),
        (
            "  jobs:\n    - {id: a, every: 1m, command: [x], retry: {backoff: {initial: 1s}}}\n",
            "cron.jobs[0].retry.attempts: a cron retry policy needs attempts",
        ),
        (
            "  jobs:\n    - {id: a, every: 1m, command: [x], on_exhausted: stop}\n",
            "cron.jobs[0].on_exhausted: invalid value 'stop'; use one of: none, pause",
        ),
        ("  tempfail_limit: 0\n", "cron.tempfail_limit: must be at least 1"),
        (
            "  retry: {attempts: 2, rules: [{outcomes: [oom_killed],"
            " resources: {memory_max: 1G}}]}\n",
            "cron.retry.rules[0].resources: a retry rule's resources apply to kanban workers only",
        ),
    ],
)
def test_bad_cron_retry_config_is_one_line_naming_the_key(text: str, expected: str) -> None:
    from dispatcher.config import parse_config
    from scope.foundation.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        parse_config(f"cron:\n{text}", "c.yaml")
    message = info.value.message
    assert expected in message and "\n" not in message, message
    assert info.value.exit_code == 2


def test_cron_retry_default_and_per_job() -> None:
    from dispatcher.config import parse_config

    settings = parse_config(
        "cron:\n  retry: {attempts: 3}\n  jobs:\n    - {id: a, every: 1m, command: [x]}\n"
        "    - {id: b, every: 1m, command: [x], retry: {attempts: 2}, on_exhausted: pause}\n",
        "c.yaml",
    ).cron
    a, b = settings.jobs
    assert settings.policy(a) is settings.retry and settings.policy(b) is b.retry
    assert (b.on_exhausted, a.on_exhausted) == (OnExhausted.PAUSE, OnExhausted.NONE)
    assert parse_config("cron: {}\n", "c.yaml").cron.retry is None  # one try per fire


# -- the scheduler ---------------------------------------------------------------------------

RETRY = policy()


def retrying(**values: Any) -> CronJob:
    values.setdefault("retry", RETRY)
    return job(**values)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    for scheduler in w.schedulers:
        scheduler.stop()
    w.db.close()


def fail_running(world: World, code: int = 1) -> None:
    world.finish_all(exit_code=code)


def test_a_failed_try_backs_off_then_runs_again_under_the_same_fire_key(world: World) -> None:
    s = world.scheduler(retrying(on_failure=("page",)))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    fail_running(world)
    report = s.tick(world.at("2026-01-05T10:00:01"))
    (row,) = report.retrying
    assert report.settled == ()
    assert (row.status, row.attempt, row.attempts, row.shown_outcome) == (
        Status.RETRY,
        2,
        3,
        "queued",
    )
    assert row.retry_at == utc("2026-01-05T10:00:11") and row.retry_reason == (
        "backoff, attempt 2 of 3"
    )
    assert report.next_wake == row.retry_at
    assert s.tick(world.at("2026-01-05T10:00:10")).started == ()
    started = s.tick(world.at("2026-01-05T10:00:11")).started
    assert [r.fire_key for r in started] == [row.fire_key]
    second = world.registry.running()[0]
    request = world.registry.requests[second.id]
    assert request.owner.id == row.fire_key and request.labels["try"] == "2"
    assert request.env["DISPATCH_FIRE_KEY"] == row.fire_key
    assert (request.env["DISPATCH_FIRE_ATTEMPT"], request.env["DISPATCH_FIRE_ATTEMPTS"]) == (
        "2",
        "3",
    )
    fail_running(world)
    s.tick(world.at("2026-01-05T10:00:12"))
    s.tick(world.at("2026-01-05T10:00:32"))  # 20 s after the second try ended
    fail_running(world)
    report = s.tick(world.at("2026-01-05T10:00:33"))
    (done,) = report.settled
    assert (done.outcome, done.attempt, done.retry_reason) == (
        Outcome.FAILED,
        3,
        "3 of 3 attempts used",
    )
    assert [(t.attempt, t.outcome, t.counted) for t in done.tries] == [
        (1, Outcome.FAILED, True),
        (2, Outcome.FAILED, True),
        (3, Outcome.FAILED, True),
    ]
    assert (
        len({t.session_id for t in done.tries}) == 3
        and done.session_id == done.tries[-1].session_id
    )
    # on_failure ran once, for the fire, not per try.
    hooks = [r for r in world.registry.requests.values() if r.labels.get("hook")]
    assert len(hooks) == 1 and done.on_failure_session is not None


def test_the_log_says_when_the_next_try_comes(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    from dispatcher.timefmt import iso

    s = world.scheduler(retrying())
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    fail_running(world)
    with caplog.at_level(logging.INFO, logger="dispatch.cron"):
        (row,) = s.tick(world.at("2026-01-05T10:00:01")).retrying
    assert row.retry_at is not None
    line = next(r.getMessage() for r in caplog.records if "next try" in r.getMessage())
    assert f"next try at {iso(row.retry_at)} (backoff, attempt 2 of 3)" in line, line


def test_a_fire_completed_on_its_second_try(world: World) -> None:
    s = world.scheduler(retrying())
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    fail_running(world, 2)
    s.tick(world.at("2026-01-05T10:00:01"))
    s.tick(world.at("2026-01-05T10:00:11"))
    world.finish_all(exit_code=0)
    (done,) = s.tick(world.at("2026-01-05T10:00:12")).settled
    assert (done.outcome, done.attempt) == (Outcome.COMPLETED, 2)
    assert [t.outcome for t in done.tries] == [Outcome.FAILED, Outcome.COMPLETED]
    assert done.tries[0].exit_code == 2 and done.exit_code == 0


def test_a_job_without_a_retry_policy_and_a_manual_run_have_one_try(world: World) -> None:
    s = world.scheduler(job(), job("k", retry=RETRY))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    manual = s.run_now("k")
    assert manual.attempts is None
    fail_running(world)
    report = s.tick(world.at("2026-01-05T10:00:01"))
    assert sorted(r.outcome or "" for r in report.settled) == ["failed", "failed"]
    assert [r.job_id for r in report.retrying] == ["k"]


def test_on_exhausted_pause_pauses_the_job_with_its_reason(world: World) -> None:
    s = world.scheduler(retrying(retry=policy(attempts=2), on_exhausted=OnExhausted.PAUSE))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    fail_running(world)
    s.tick(world.at("2026-01-05T10:00:01"))
    s.tick(world.at("2026-01-05T10:00:11"))
    fail_running(world)
    (done,) = s.tick(world.at("2026-01-05T10:00:12")).settled
    assert done.outcome is Outcome.FAILED
    state = world.ledger.job_states()["j"]
    assert state.paused is True and state.paused_reason == (
        "fire j@2026-01-05T10:00:00 failed every attempt (2 of 2 attempts used); 2 tries in all"
    )
    assert s.tick(world.at("2026-01-05T10:05:00")).decided == ()
    assert world.ledger.set_paused("j", False, world.clock.time())
    assert world.ledger.job_states()["j"].paused_reason is None
    (again,) = s.tick(world.at("2026-01-05T10:10:00")).decided
    assert again.fire_key == "j@2026-01-05T10:10:00" and again.status is Status.RUNNING


def test_a_paused_jobs_retry_waits_for_its_resume(world: World) -> None:
    s = world.scheduler(retrying())
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    fail_running(world)
    s.tick(world.at("2026-01-05T10:00:01"))
    world.ledger.set_paused("j", True, world.clock.time())
    assert s.tick(world.at("2026-01-05T10:00:30")).started == ()
    world.ledger.set_paused("j", False, world.clock.time())
    assert len(s.tick(world.at("2026-01-05T10:00:31")).started) == 1


def test_a_worker_defers_its_fires_next_try(world: World) -> None:
    s = world.scheduler(retrying())
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    (session,) = world.registry.running()
    until = utc("2026-01-05T10:03:00")
    assert world.ledger.defer(
        "j@2026-01-05T10:00:00", session_id=session.id, until=until, reason="rate limited"
    )
    world.finish_all(exit_code=0)
    (row,) = s.tick(world.at("2026-01-05T10:00:02")).retrying
    assert (row.retry_at, row.retry_kind, row.retry_reason, row.attempt) == (
        until,
        RetryKind.DEFERRED,
        "rate limited",
        1,
    )
    assert row.tries[0].outcome is Outcome.DEFERRED and not row.tries[0].counted
    assert s.tick(world.at("2026-01-05T10:02:59")).started == ()
    assert len(s.tick(world.at("2026-01-05T10:03:00")).started) == 1


def test_a_retry_claimed_but_never_started_waits_again_after_a_stop(world: World) -> None:
    s = world.scheduler(retrying())
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    fail_running(world)
    s.tick(world.at("2026-01-05T10:00:01"))
    (row,) = world.rows()
    s._promote_retries(world.at("2026-01-05T10:00:11"))  # claimed, then the scheduler stops
    assert world.ledger.get(row.id).status is Status.CLAIMED
    s.stop()
    back = world.ledger.get(row.id)
    assert back.status is Status.RETRY and back.retry_at == utc("2026-01-05T10:00:11")
    fresh = world.scheduler(retrying())
    assert len(fresh.tick(world.at("2026-01-05T10:00:12")).started) == 1


# -- overlap: the next fire comes while a retry is pending ------------------------------------


def _pending_at_next_fire(world: World, overlap: OverlapPolicy) -> CronScheduler:
    """10:00 fails; its retry is due at 10:06 (6 min back-off), after the 10:05 fire."""
    slow = policy(backoff={"initial": "6m", "jitter": "none"})
    s = world.scheduler(retrying(retry=slow, overlap=overlap))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    fail_running(world)
    s.tick(world.at("2026-01-05T10:00:00.5"))
    s.tick(world.at("2026-01-05T10:05:00"))
    return s


def test_overlap_skip_with_a_retry_pending(world: World) -> None:
    s = _pending_at_next_fire(world, OverlapPolicy.SKIP)
    first, second = world.rows()
    assert first.status is Status.RETRY
    assert (second.outcome, second.error) == (
        Outcome.SKIPPED_OVERLAP,
        "the job was waiting for its next try (j@2026-01-05T10:00:00)",
    )
    assert len(s.tick(world.at("2026-01-05T10:06:00.5")).started) == 1
    world.finish_all(exit_code=0)
    s.tick(world.at("2026-01-05T10:06:01"))
    assert world.outcomes()[0] == ("j@2026-01-05T10:00:00", "completed")


def test_overlap_replace_abandons_the_pending_retry(world: World) -> None:
    s = _pending_at_next_fire(world, OverlapPolicy.REPLACE)
    first, second = world.rows()
    assert (first.outcome, first.error) == (
        Outcome.REPLACED,
        "retry abandoned: replaced by j@2026-01-05T10:05:00",
    )
    assert [t.outcome for t in first.tries] == [Outcome.FAILED] and first.retry_at is None
    assert second.status is Status.RUNNING
    assert s.tick(world.at("2026-01-05T10:06:00.5")).started == ()
    assert len(world.registry.sessions) == 2


def test_overlap_allow_runs_the_next_fire_and_the_retry(world: World) -> None:
    s = _pending_at_next_fire(world, OverlapPolicy.ALLOW)
    first, second = world.rows()
    assert first.status is Status.RETRY and second.status is Status.RUNNING
    started = s.tick(world.at("2026-01-05T10:06:00.5")).started
    assert [r.fire_key for r in started] == [first.fire_key]
    assert len(world.registry.running()) == 2


def test_overlap_queue_one_waits_for_the_retry(world: World) -> None:
    s = _pending_at_next_fire(world, OverlapPolicy.QUEUE_ONE)
    first, second = world.rows()
    assert first.status is Status.RETRY and second.status is Status.QUEUED
    s.tick(world.at("2026-01-05T10:06:00.5"))
    assert world.ledger.get(second.id).status is Status.QUEUED  # behind the running retry
    world.finish_all(exit_code=0)
    s.tick(world.at("2026-01-05T10:06:02"))
    assert world.ledger.get(first.id).outcome is Outcome.COMPLETED
    assert world.ledger.get(second.id).status is Status.RUNNING


def test_a_retry_held_past_its_start_deadline_is_missed_without_a_try(world: World) -> None:
    s = world.scheduler(retrying())
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    fail_running(world)
    s.tick(world.at("2026-01-05T10:00:01"))
    s.set_hold(lambda now: "memory pressure 34 %")
    assert s.tick(world.at("2026-01-05T10:00:30")).started == ()  # held, still in its window
    s.tick(world.at("2026-01-05T11:00:00"))  # nominal + catch_up_window (1h)
    (row,) = [r for r in world.rows() if r.fire_key == "j@2026-01-05T10:00:00"]
    assert (row.outcome, row.error) == (Outcome.MISSED, "memory pressure 34 %")
    assert [t.outcome for t in row.tries] == [Outcome.FAILED]
