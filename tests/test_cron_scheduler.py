"""The scheduler's decisions with an injected clock, a real SQLite ledger and FakeRegistry.

Every test drives ``tick(now)`` directly; nothing sleeps. Real processes, real APScheduler wake-ups
and the real systemd tier are in test_cron_process.py.
"""

from __future__ import annotations

import datetime as dt
import os
import random
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import pytest

from dispatcher.app.database import open_state
from dispatcher.cron.abc import LedgerStore
from dispatcher.cron.errors import CronError
from dispatcher.cron.ledger import Ledger
from dispatcher.cron.memory import MemoryLedger
from dispatcher.cron.records import FireRecord, Kind, Status
from dispatcher.cron.scheduler import CronScheduler
from dispatcher.cron.settings import CatchUpPolicy, CronJob, CronSettings, OverlapPolicy
from dispatcher.cron.zones import fixed_zone
from registry.abc import SessionState
from registry.fake import FakeRegistry
from registry.store.database import StateDB
from scope.abc import CallerKind, Placement
from scope.errors import ManagerLost, ScopeUnavailable
from scope.foundation.clock import FakeClock
from scope.foundation.errors import NotFoundError

T0 = dt.datetime(2026, 1, 5, 9, 59, 30, tzinfo=dt.UTC).timestamp()  # a Monday


def utc(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()


def job(job_id: str = "j", **values: Any) -> CronJob:
    values.setdefault("command", ("work",))
    if "every" not in values:
        values.setdefault("schedule", "*/5 * * * *")
    return CronJob(id=job_id, **values)


class World:
    """A database, a fake clock, a fake registry and schedulers on them."""

    def __init__(self, tmp_path: Path, *, ledger: LedgerStore | None = None) -> None:
        self.tmp_path = tmp_path
        self.db: StateDB = open_state(tmp_path / "state")
        self.clock = FakeClock(T0)
        self.registry = FakeRegistry(clock=self.clock)
        self.ledger = ledger if ledger is not None else Ledger(self.db)
        self.schedulers: list[CronScheduler] = []

    def scheduler(self, *jobs: CronJob, zone: str = "UTC", **settings: Any) -> CronScheduler:
        scheduler = CronScheduler(
            CronSettings(jobs=tuple(jobs), **settings),
            self.registry,
            self.db,
            clock=self.clock,
            environ={"PATH": "/usr/bin:/bin", "HOME": str(self.tmp_path)},
            state_dir=self.tmp_path / "state",
            zone_resolver=fixed_zone(zone),
            rng=random.Random(5),
            ledger=self.ledger,
        )
        self.schedulers.append(scheduler)
        return scheduler

    def at(self, when: str | float) -> float:
        target = utc(when) if isinstance(when, str) else when
        self.clock.set(target)
        return target

    def rows(self, job_id: str | None = None) -> list[FireRecord]:
        return list(reversed(self.ledger.history(job_id, limit=10_000)))

    def outcomes(self, job_id: str | None = None) -> list[tuple[str, str]]:
        return [(r.fire_key, r.shown_outcome) for r in self.rows(job_id)]

    def finish_all(self, exit_code: int = 0) -> None:
        for session in self.registry.running():
            self.registry.finish(session.id, exit_code=exit_code)


@pytest.fixture
def world(tmp_path: Path):
    w = World(tmp_path)
    yield w
    for scheduler in w.schedulers:
        scheduler.stop()
    w.db.close()


# -- basics ----------------------------------------------------------------------------------


def test_a_new_job_starts_from_now_and_fires_on_schedule(world: World) -> None:
    s = world.scheduler(job(timeout=30.0, pty=True))
    report = s.tick()
    assert report.decided == () and world.rows() == []
    assert report.next_wake == utc("2026-01-05T10:00:00")
    report = s.tick(world.at("2026-01-05T10:00:00.003"))
    assert [r.fire_key for r in report.decided] == ["j@2026-01-05T10:00:00"]
    (row,) = world.rows()
    assert row.status is Status.RUNNING and row.outcome is None
    assert row.nominal == utc("2026-01-05T10:00:00")
    assert row.actual == pytest.approx(utc("2026-01-05T10:00:00.003"))
    request = world.registry.requests[row.session_id]
    assert request.caller is CallerKind.CRON
    assert request.owner.kind == "cron" and request.owner.id == row.fire_key
    assert request.timeout == 30.0 and request.pty is True
    assert request.env["DISPATCH_JOB_ID"] == "j"
    assert request.env["DISPATCH_FIRE_KEY"] == row.fire_key
    assert request.cwd == str(world.tmp_path / "state")
    assert tuple(request.argv) == ("work",)
    assert row.placement == "in_process"


def test_the_scheduler_runs_over_the_in_memory_ledger(tmp_path: Path) -> None:
    world = World(tmp_path, ledger=MemoryLedger())
    try:
        s = world.scheduler(job())
        s.tick()
        report = s.tick(world.at("2026-01-05T10:00:00.003"))
        assert [r.fire_key for r in report.decided] == ["j@2026-01-05T10:00:00"]
        world.finish_all(exit_code=3)
        s.tick(world.at("2026-01-05T10:00:01"))
        assert world.outcomes() == [("j@2026-01-05T10:00:00", "failed")]
        with world.db.read() as conn:  # nothing went to the SQLite ledger
            assert conn.execute("SELECT count(*) FROM cron_fires").fetchone()[0] == 0
    finally:
        for scheduler in world.schedulers:
            scheduler.stop()
        world.db.close()


@pytest.mark.parametrize(
    ("finish", "outcome", "exit_code", "signal"),
    [
        ({"exit_code": 0}, "completed", 0, None),
        ({"exit_code": 3}, "failed", 3, None),
        ({"exit_code": None, "signal": "SIGKILL"}, "failed", None, "SIGKILL"),
        (
            {"exit_code": None, "signal": "SIGTERM", "state": SessionState.TIMED_OUT},
            "timed_out",
            None,
            "SIGTERM",
        ),
        ({"exit_code": None, "state": SessionState.LOST}, "lost", None, None),
    ],
)
def test_outcomes_from_finished_sessions(world: World, finish, outcome, exit_code, signal) -> None:
    s = world.scheduler(job(timeout=10.0))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    (session,) = world.registry.running()
    world.clock.advance(4)
    world.registry.finish(session.id, **finish)
    report = s.tick()
    assert [r.shown_outcome for r in report.settled] == [outcome]
    (row,) = world.rows()
    assert row.outcome is not None and row.outcome.value == outcome
    assert (row.exit_code, row.signal) == (exit_code, signal)
    assert row.started_at == utc("2026-01-05T10:00:00")
    assert row.ended_at == utc("2026-01-05T10:00:04")
    assert (row.error is None) == (outcome == "completed")


def test_a_worker_that_cannot_start_is_failed_start(world: World) -> None:
    world.registry.failed_start_argv0.add("nosuch")
    s = world.scheduler(job(command=("nosuch",)))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    (row,) = world.rows()
    assert row.shown_outcome == "failed_start"
    assert "nosuch" in (row.error or "")


# -- the step seam ---------------------------------------------------------------------------


def test_step_answers_when_it_next_needs_to_run(world: World) -> None:
    s = world.scheduler(job(), job("j2", schedule="7 10 * * *"))
    # The next fire, never more than wake_interval (30 s) away.
    assert s.step(world.clock.time()) == utc("2026-01-05T10:00:00")
    assert s.step(world.at("2026-01-05T09:59:45")) == utc("2026-01-05T10:00:00")
    assert s.step(world.at("2026-01-05T10:00:00")) == utc("2026-01-05T10:00:30")
    assert len(world.registry.running()) == 1
    assert s.step(world.at("2026-01-05T10:04:50")) == utc("2026-01-05T10:05:00")


def test_step_answers_the_end_of_a_jitter_delay(world: World) -> None:
    s = world.scheduler(job(jitter=20.0))
    s.step(world.clock.time())
    deadline = s.step(world.at("2026-01-05T10:00:00"))
    (row,) = world.rows()
    assert row.status is Status.CLAIMED and row.due_at is not None
    assert deadline == row.due_at and utc("2026-01-05T10:00:00") < deadline
    assert world.registry.running() == []
    s.step(world.at(deadline))
    assert len(world.registry.running()) == 1


def test_a_finished_worker_and_a_reload_ask_for_an_early_step(world: World) -> None:
    s = world.scheduler(job())
    asked: list[float] = []
    s.on_wake_request(asked.append)
    s.step(world.clock.time())
    s.step(world.at("2026-01-05T10:00:00"))
    assert asked == [] and len(world.registry.running()) == 1
    world.at("2026-01-05T10:00:02")
    world.finish_all()
    assert asked == [utc("2026-01-05T10:00:02")]
    s.reload(CronSettings(jobs=(job(schedule="*/10 * * * *"),)))
    assert asked[-1] == utc("2026-01-05T10:00:02")
    assert len(asked) == 2
    s.on_wake_request(None)
    s.reload(CronSettings(jobs=(job(),)))
    assert len(asked) == 2


def test_spawns_go_to_the_executor_it_is_handed(world: World) -> None:
    submitted: list[Any] = []

    class Recorder(Executor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
            submitted.append(fn)
            future: Future[Any] = Future()
            future.set_result(fn(*args, **kwargs))
            return future

    s = world.scheduler(job())
    s.use_executor(Recorder())
    s.tick()
    report = s.tick(world.at("2026-01-05T10:00:00"))
    assert len(submitted) == 1 and len(report.started) == 1
    assert len(world.registry.running()) == 1
    s.use_executor(None)
    world.finish_all()
    s.tick(world.at("2026-01-05T10:05:00"))
    # Started inline this time.
    assert len(submitted) == 1 and len(world.registry.running()) == 1


# -- overlap ---------------------------------------------------------------------------------


def _three_fires(world: World, s: CronScheduler) -> None:
    s.tick()
    for when in ("10:00", "10:05", "10:10"):
        s.tick(world.at(f"2026-01-05T{when}:00"))


def test_overlap_skip(world: World) -> None:
    s = world.scheduler(job())
    _three_fires(world, s)
    assert world.outcomes() == [
        ("j@2026-01-05T10:00:00", "running"),
        ("j@2026-01-05T10:05:00", "skipped_overlap"),
        ("j@2026-01-05T10:10:00", "skipped_overlap"),
    ]
    assert len(world.registry.sessions) == 1


def test_overlap_queue_one(world: World) -> None:
    s = world.scheduler(job(overlap=OverlapPolicy.QUEUE_ONE))
    _three_fires(world, s)
    assert world.outcomes() == [
        ("j@2026-01-05T10:00:00", "running"),
        ("j@2026-01-05T10:05:00", "queued"),
        ("j@2026-01-05T10:10:00", "skipped_overlap"),
    ]
    world.at("2026-01-05T10:11:00")
    world.finish_all()
    s.tick()
    assert world.outcomes() == [
        ("j@2026-01-05T10:00:00", "completed"),
        ("j@2026-01-05T10:05:00", "running"),
        ("j@2026-01-05T10:10:00", "skipped_overlap"),
    ]
    queued = world.rows()[1]
    assert queued.actual == utc("2026-01-05T10:11:00")
    assert len(world.registry.sessions) == 2


def test_overlap_replace(world: World) -> None:
    s = world.scheduler(job(overlap=OverlapPolicy.REPLACE))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    (first,) = world.rows()
    report = s.tick(world.at("2026-01-05T10:05:00"))
    assert report.replaced == (first.session_id,)
    killed = world.registry.get(first.session_id or "")
    assert killed.state is SessionState.KILLED
    assert "replaced" in (killed.completion_reason or "")
    s.tick()
    assert world.outcomes() == [
        ("j@2026-01-05T10:00:00", "replaced"),
        ("j@2026-01-05T10:05:00", "running"),
    ]
    assert "j@2026-01-05T10:05:00" in (world.rows()[0].error or "")


def test_overlap_allow(world: World) -> None:
    s = world.scheduler(job(overlap=OverlapPolicy.ALLOW))
    _three_fires(world, s)
    assert [o for _, o in world.outcomes()] == ["running"] * 3
    assert len(world.registry.running()) == 3


# -- catch-up after downtime -----------------------------------------------------------------


def _downtime(world: World, catch_up: CatchUpPolicy, **extra: Any) -> list[tuple[str, str]]:
    """A */15 job; the scheduler ran at 08:00, then nothing until 10:07 (fires 08:15..10:00)."""
    world.at("2026-01-05T08:00:00")
    world.scheduler(job(schedule="*/15 * * * *", catch_up=catch_up, **extra)).tick()
    world.schedulers[-1].stop()
    restarted = world.scheduler(job(schedule="*/15 * * * *", catch_up=catch_up, **extra))
    restarted.catch_up(world.at("2026-01-05T10:07:00"))
    return [(key.split("T")[1], outcome) for key, outcome in world.outcomes()]


MISSED_BEFORE_WINDOW = [
    ("08:15:00", "missed"),
    ("08:30:00", "missed"),
    ("08:45:00", "missed"),
    ("09:00:00", "missed"),
]


def test_catch_up_latest(world: World) -> None:
    rows = _downtime(world, CatchUpPolicy.LATEST)
    assert rows == [
        *MISSED_BEFORE_WINDOW,
        ("09:15:00", "coalesced"),
        ("09:30:00", "coalesced"),
        ("09:45:00", "coalesced"),
        ("10:00:00", "running"),
    ]
    assert world.rows()[-1].catch_up is True
    assert world.rows()[-1].nominal == utc("2026-01-05T10:00:00")
    assert world.rows()[-1].actual == utc("2026-01-05T10:07:00")


def test_catch_up_skip(world: World) -> None:
    rows = _downtime(world, CatchUpPolicy.SKIP)
    assert [o for _, o in rows] == ["missed"] * 8
    assert world.registry.sessions == {}


def test_catch_up_all(world: World) -> None:
    rows = _downtime(world, CatchUpPolicy.ALL, overlap=OverlapPolicy.ALLOW)
    assert rows == [
        *MISSED_BEFORE_WINDOW,
        ("09:15:00", "running"),
        ("09:30:00", "running"),
        ("09:45:00", "running"),
        ("10:00:00", "running"),
    ]
    assert all(r.catch_up for r in world.rows()[4:])


def test_catch_up_all_respects_catch_up_max(world: World) -> None:
    rows = _downtime(world, CatchUpPolicy.ALL, overlap=OverlapPolicy.ALLOW, catch_up_max=2)
    assert [o for _, o in rows] == ["missed"] * 6 + ["running"] * 2
    assert "catch_up_max" in (world.rows()[5].error or "")


def test_catch_up_all_with_the_default_overlap_runs_one(world: World) -> None:
    rows = _downtime(world, CatchUpPolicy.ALL)
    assert [o for _, o in rows][4:] == ["running"] + ["skipped_overlap"] * 3


def test_catch_up_window(world: World) -> None:
    rows = _downtime(world, CatchUpPolicy.LATEST, catch_up_window=7200.0)
    assert [o for _, o in rows] == ["coalesced"] * 7 + ["running"]


def test_a_late_wake_within_the_grace_is_a_normal_fire(world: World) -> None:
    s = world.scheduler(job(catch_up=CatchUpPolicy.SKIP))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:45"))  # 45 s late: not downtime
    assert world.outcomes() == [("j@2026-01-05T10:00:00", "running")]
    assert world.rows()[0].catch_up is False


def test_long_downtime_is_bounded(world: World) -> None:
    world.at("2026-01-05T08:00:00")
    world.scheduler(job(schedule="* * * * *")).tick()
    s = world.scheduler(job(schedule="* * * * *"))
    s.catch_up(world.at("2026-03-05T08:00:30"))
    rows = world.rows()
    assert 0 < len(rows) <= 1000
    assert rows[-1].shown_outcome == "running"


# -- pause, enabled --------------------------------------------------------------------------


def test_pause_resume(world: World) -> None:
    s = world.scheduler(job())
    s.tick()
    world.ledger.set_paused("j", True, world.clock.time())
    for when in ("10:00", "10:05", "10:10"):
        s.tick(world.at(f"2026-01-05T{when}:00"))
    assert world.rows() == []
    assert s.next_fires(3) == []
    # Paused survives a restart (it lives in the database).
    s2 = world.scheduler(job())
    s2.catch_up(world.at("2026-01-05T10:30:00"))
    assert world.rows() == []
    world.at("2026-01-05T10:31:00")
    world.ledger.set_paused("j", False, world.clock.time())
    s2.tick(world.at("2026-01-05T10:33:00"))
    assert world.rows() == []  # nothing of the pause is caught up or recorded missed
    s2.tick(world.at("2026-01-05T10:35:00"))
    assert world.outcomes() == [("j@2026-01-05T10:35:00", "running")]


def test_disabled_jobs_never_fire_and_resume_overrides(world: World) -> None:
    s = world.scheduler(job(enabled=False))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    assert world.rows() == []
    world.ledger.set_paused("j", False, world.clock.time())
    s.tick(world.at("2026-01-05T10:05:00"))
    assert world.outcomes() == [("j@2026-01-05T10:05:00", "running")]


# -- jitter, concurrency ---------------------------------------------------------------------


def test_jitter_is_recorded_and_delays_the_start(world: World) -> None:
    s = world.scheduler(job(jitter=20.0))
    s.tick()
    report = s.tick(world.at("2026-01-05T10:00:00"))
    (row,) = report.decided
    expected = random.Random(5).uniform(0.0, 20.0)
    assert row.jitter == pytest.approx(expected)
    assert row.status is Status.CLAIMED and world.registry.sessions == {}
    assert report.next_wake == pytest.approx(utc("2026-01-05T10:00:00") + expected)
    s.tick(world.at(utc("2026-01-05T10:00:00") + expected / 2))
    assert world.registry.sessions == {}
    s.tick(world.at(utc("2026-01-05T10:00:00") + expected))
    (row,) = world.rows()
    assert row.status is Status.RUNNING
    assert row.actual == pytest.approx(row.nominal + expected)


def test_max_concurrent_caps_workers_host_wide(world: World) -> None:
    jobs = [job(f"j{i}") for i in range(3)]
    s = world.scheduler(*jobs, max_concurrent=2)
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    assert len(world.registry.running()) == 2
    waiting = [r for r in world.rows() if r.status is Status.CLAIMED]
    assert len(waiting) == 1 and waiting[0].shown_outcome == "queued"
    world.registry.finish(world.registry.running()[0].id)
    s.tick(world.at("2026-01-05T10:00:02"))
    assert len(world.registry.running()) == 2
    assert [r.shown_outcome for r in world.rows()].count("completed") == 1


# -- placement -------------------------------------------------------------------------------


def test_refused_placement_is_spawn_refused_infrastructure(world: World) -> None:
    world.registry.spawn_errors.append(
        ScopeUnavailable(
            "no systemd user manager", caller="cron", remedy="run loginctl enable-linger me"
        )
    )
    s = world.scheduler(job())
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    (row,) = world.rows()
    assert row.shown_outcome == "spawn_refused"
    assert row.infrastructure is True
    assert "enable-linger" in (row.error or "")


def test_lost_manager_is_retried_once_in_the_same_slot(world: World) -> None:
    world.registry.spawn_errors.append(ManagerLost("bus socket gone"))
    s = world.scheduler(job())
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    (row,) = world.rows()
    assert row.status is Status.RUNNING
    assert row.fire_key == "j@2026-01-05T10:00:00"


def test_lost_manager_twice_is_refused(world: World) -> None:
    world.registry.spawn_errors.extend([ManagerLost("gone"), ManagerLost("still gone")])
    s = world.scheduler(job())
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    (row,) = world.rows()
    assert row.shown_outcome == "spawn_refused" and row.infrastructure
    assert "retry" in (row.error or "")


# -- on_failure, env_file --------------------------------------------------------------------


def test_on_failure_runs_with_the_fire_details(world: World) -> None:
    s = world.scheduler(job(on_failure=("notify", "--job")))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    (worker,) = world.registry.running()
    world.registry.finish(worker.id, exit_code=9)
    s.tick()
    (row,) = world.rows()
    assert row.on_failure_session is not None
    request = world.registry.requests[row.on_failure_session]
    assert tuple(request.argv) == ("notify", "--job")
    assert request.caller is CallerKind.CLI  # placed like `dispatch run`: degrades, not refused
    assert request.env["DISPATCH_JOB_ID"] == "j"
    assert request.env["DISPATCH_FIRE_KEY"] == row.fire_key
    assert request.env["DISPATCH_OUTCOME"] == "failed"
    assert request.env["DISPATCH_EXIT_CODE"] == "9"
    assert request.env["DISPATCH_FIRE_SESSION_ID"] == worker.id
    assert request.env["DISPATCH_LOG_PATH"] == worker.log_path
    assert request.env["DISPATCH_ERROR"] == "exited with code 9"
    # The hook's own end is not a fire and changes nothing.
    world.registry.finish(row.on_failure_session, exit_code=1)
    s.tick()
    assert world.outcomes() == [(row.fire_key, "failed")]


def test_on_failure_not_after_success_but_after_refusal(world: World) -> None:
    s = world.scheduler(job(on_failure=("notify",)))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    world.finish_all(0)
    s.tick()
    assert world.rows()[0].on_failure_session is None
    world.registry.spawn_errors.append(ScopeUnavailable("no scope", caller="cron"))
    s.tick(world.at("2026-01-05T10:05:00"))
    refused = world.rows()[1]
    assert refused.shown_outcome == "spawn_refused"
    request = world.registry.requests[refused.on_failure_session or ""]
    assert request.env["DISPATCH_OUTCOME"] == "spawn_refused"
    assert request.env["DISPATCH_EXIT_CODE"] == ""


def test_env_file(world: World) -> None:
    env_file = world.tmp_path / "secrets.env"
    env_file.write_text("# secrets\nTOKEN=abc\nexport QUOTED='x y'\n")
    os.chmod(env_file, 0o600)
    s = world.scheduler(job(env_file=str(env_file), env={"QUOTED": "from-config"}))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    (row,) = world.rows()
    request = world.registry.requests[row.session_id or ""]
    assert request.env["TOKEN"] == "abc"
    assert request.env["QUOTED"] == "from-config"
    world.finish_all()
    os.chmod(env_file, 0o644)
    s.tick(world.at("2026-01-05T10:05:00"))
    bad = world.rows()[1]
    assert bad.shown_outcome == "config_error"  # retrying cannot help
    assert "chmod 600" in (bad.error or "") and str(env_file) in (bad.error or "")


# -- two schedulers, crashes -----------------------------------------------------------------


def test_two_schedulers_on_one_database_never_run_a_key_twice(world: World) -> None:
    jobs = [job(f"j{i}", schedule="* * * * *", overlap=OverlapPolicy.ALLOW) for i in range(5)]
    a = world.scheduler(*jobs, max_concurrent=100)
    b = world.scheduler(*jobs, max_concurrent=100)
    a.tick()
    b.tick()
    for minute in range(10):
        now = world.at(utc("2026-01-05T10:00:00") + 60 * minute)
        (a if minute % 2 else b).tick(now)
        (b if minute % 2 else a).tick(now)
    keys = [s.owner.id for s in world.registry.sessions.values()]
    assert len(keys) == len(set(keys)) == 50


def test_a_claim_left_by_a_dead_process_is_settled_not_rerun(world: World) -> None:
    s = world.scheduler(job())
    s.tick()
    with world.ledger.transaction() as tx:
        tx.insert(
            fire_key="j@2026-01-05T09:55:00",
            job_id="j",
            kind=Kind.SCHEDULE,
            nominal_wall="2026-01-05T09:55:00",
            fold=0,
            zone="UTC",
            nominal=utc("2026-01-05T09:55:00"),
            decided_at=utc("2026-01-05T09:55:00"),
            due_at=utc("2026-01-05T09:55:00"),
            status=Status.CLAIMED,
            claimant="999999999:1:dead",
        )
    fresh = world.scheduler(job())
    report = fresh.catch_up(world.at("2026-01-05T09:59:40"))
    (row,) = world.rows()
    assert row.shown_outcome == "failed_start"
    assert "not re-run" in (row.error or "")
    assert report.settled[0].fire_key == row.fire_key
    assert world.registry.sessions == {}


def test_a_spawn_in_flight_when_its_process_died_is_adopted(world: World) -> None:
    s = world.scheduler(job())
    s.tick()
    key = "j@2026-01-05T09:55:00"
    with world.ledger.transaction() as tx:
        tx.insert(
            fire_key=key,
            job_id="j",
            kind=Kind.SCHEDULE,
            nominal_wall="2026-01-05T09:55:00",
            fold=0,
            zone="UTC",
            nominal=utc("2026-01-05T09:55:00"),
            decided_at=utc("2026-01-05T09:55:00"),
            status=Status.SPAWNING,
            claimant="999999999:1:dead",
        )
    # The dead process did start the worker before it could record the session.
    from registry.abc import Owner, SpawnRequest

    session = world.registry.spawn(
        SpawnRequest(argv=["work"], cwd="/", env={}, owner=Owner(kind="cron", id=key))
    )
    world.registry.finish(session.id, exit_code=0)
    world.scheduler(job()).catch_up()
    (row,) = world.rows()
    assert row.session_id == session.id
    assert row.shown_outcome == "completed"


def test_stop_settles_claims_that_never_started(world: World) -> None:
    s = world.scheduler(job(jitter=30.0))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    s.stop()
    (row,) = world.rows()
    assert row.shown_outcome == "failed_start"
    assert "stopped" in (row.error or "")
    world.scheduler(job(jitter=30.0)).catch_up(world.at("2026-01-05T10:01:00"))
    assert world.registry.sessions == {}


# -- DST in the ledger -----------------------------------------------------------------------


def test_dst_gap_fires_in_the_ledger(world: World) -> None:
    zone = "Europe/Berlin"
    world.at("2026-03-28T23:00:00")
    s = world.scheduler(job(schedule="0,30 2 * * *", timezone=zone, overlap=OverlapPolicy.ALLOW))
    s.tick()
    # 02:00 and 02:30 do not exist that night: both are due at 03:00 CEST, the end of the gap.
    assert [f.at for f in s.next_fires(1)] == [utc("2026-03-29T01:00:00")]
    s.tick(world.at("2026-03-29T01:00:00"))
    assert world.outcomes() == [
        ("j@2026-03-29T02:00:00", "running"),
        ("j@2026-03-29T02:30:00", "coalesced"),
    ]
    assert world.rows()[1].error and "DST" in world.rows()[1].error


def test_dst_repeated_hour_keys_in_the_ledger(world: World) -> None:
    zone = "Europe/Berlin"
    world.at("2026-10-24T23:20:00")
    s = world.scheduler(
        job("w", schedule="30 * * * *", timezone=zone, overlap=OverlapPolicy.ALLOW),
        job("f", schedule="30 2 * * *", timezone=zone, overlap=OverlapPolicy.ALLOW),
    )
    s.tick()
    for hour in range(4):
        s.tick(world.at(utc("2026-10-24T23:30:00") + 3600 * hour))
    assert [k for k, _ in world.outcomes("w")] == [
        "w@2026-10-25T01:30:00",
        "w@2026-10-25T02:30:00",
        "w@2026-10-25T02:30:00,fold=1",
        "w@2026-10-25T03:30:00",
    ]
    assert [k for k, _ in world.outcomes("f")] == ["f@2026-10-25T02:30:00"]
    first = world.rows("f")[0]
    assert first.nominal == utc("2026-10-25T00:30:00")  # 02:30 CEST, the first pass


# -- manual runs, reload, next ---------------------------------------------------------------


def test_run_now_has_its_own_key_and_ignores_overlap(world: World) -> None:
    s = world.scheduler(job())
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    manual = s.run_now("j", world.at("2026-01-05T10:01:00"))
    assert manual.kind is Kind.MANUAL
    assert manual.fire_key.startswith("j@run:2026-01-05T10:01:00:")
    assert manual.status is Status.RUNNING
    assert len(world.registry.running()) == 2
    with pytest.raises(NotFoundError):
        s.run_now("nosuch")


def test_run_now_respects_max_concurrent(world: World) -> None:
    s = world.scheduler(job(), max_concurrent=1)
    s.run_now("j")
    with pytest.raises(CronError, match="max_concurrent"):
        s.run_now("j")


def test_reload_adds_and_removes_jobs(world: World) -> None:
    s = world.scheduler(job("a"))
    s.tick()
    s.reload(CronSettings(jobs=(job("b", schedule="*/10 * * * *"),)))
    s.tick(world.at("2026-01-05T09:59:50"))
    s.tick(world.at("2026-01-05T10:00:00"))
    assert [k for k, _ in world.outcomes()] == ["b@2026-01-05T10:00:00"]


def test_a_changed_schedule_does_not_invent_missed_fires(world: World) -> None:
    s = world.scheduler(job(schedule="0 * * * *"))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    world.finish_all()
    s.tick(world.at("2026-01-05T10:29:50"))
    s.reload(CronSettings(jobs=(job(schedule="*/5 * * * *"),)))
    s.tick(world.at("2026-01-05T10:30:10"))
    assert world.outcomes() == [
        ("j@2026-01-05T10:00:00", "completed"),
        ("j@2026-01-05T10:30:00", "running"),
    ]
    assert world.rows()[-1].catch_up is False


def test_next_fires(world: World) -> None:
    s = world.scheduler(job("a", schedule="0 * * * *"), job("b", every=1800.0, offset=60.0))
    fires = s.next_fires(3, after=utc("2026-01-05T10:00:00"))
    assert [(f.job_id, f.at) for f in fires] == [
        ("b", utc("2026-01-05T10:01:00")),
        ("b", utc("2026-01-05T10:31:00")),
        ("a", utc("2026-01-05T11:00:00")),
    ]
    only_a = s.next_fires(2, job_id="a", after=utc("2026-01-05T10:00:00"))
    assert [f.fire_key for f in only_a] == ["a@2026-01-05T11:00:00", "a@2026-01-05T12:00:00"]


def test_interval_jobs_resume_on_the_same_grid_after_a_restart(world: World) -> None:
    world.at(utc("2026-01-05T10:00:05"))
    first = world.scheduler(job("i", every=600.0, catch_up=CatchUpPolicy.SKIP))
    first.tick()
    first.tick(world.at("2026-01-05T10:10:00"))
    world.finish_all()
    first.stop()
    second = world.scheduler(job("i", every=600.0, catch_up=CatchUpPolicy.SKIP))
    second.catch_up(world.at("2026-01-05T10:35:00"))
    second.tick(world.at("2026-01-05T10:40:00"))
    assert world.outcomes() == [
        ("i@2026-01-05T10:10:00", "completed"),
        ("i@2026-01-05T10:20:00", "missed"),
        ("i@2026-01-05T10:30:00", "missed"),
        ("i@2026-01-05T10:40:00", "running"),
    ]


def test_a_claimed_row_of_a_removed_job_fails_to_start(world: World) -> None:
    s = world.scheduler(job(jitter=10.0))
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    s.reload(CronSettings(jobs=()))
    s.tick(world.at("2026-01-05T10:00:30"))
    (row,) = world.rows()
    assert row.shown_outcome == "failed_start"
    assert "no longer in the config" in (row.error or "")


def test_placement_is_recorded(world: World) -> None:
    from scope.fake import FakeScoper

    world.registry.scoper = FakeScoper(in_teardown_unit=True, probe_ok=False)
    s = world.scheduler(job())
    s.tick()
    s.tick(world.at("2026-01-05T10:00:00"))
    (row,) = world.rows()
    assert row.placement == Placement.DEGRADED.value


def test_old_ledger_rows_are_pruned_but_each_job_keeps_its_last(world: World) -> None:
    s = world.scheduler(job("a", schedule="* * * * *"), job("b", schedule="0 0 1 1 *"))
    s.tick(world.at("2025-12-31T23:58:30"))
    s.tick(world.at("2026-01-01T00:00:00"))
    for minute in range(1, 30):
        world.finish_all()
        s.tick(world.at(utc("2026-01-01T00:00:00") + 60 * minute))
    world.finish_all()
    s.tick()
    # a: 23:59 (30 s late at the 00:00 tick, still on time), 00:00 (skipped: 23:59 ran), ...
    assert len(world.rows("a")) == 31 and len(world.rows("b")) == 1
    removed = world.ledger.prune(utc("2026-01-01T00:10:30"))
    assert removed == 12  # a's 23:59..00:10; b's only row is kept although it is old
    assert [r.fire_key for r in world.rows("b")] == ["b@2026-01-01T00:00:00"]
    assert world.rows("a")[0].fire_key == "a@2026-01-01T00:11:00"
    assert world.ledger.prune(utc("2026-01-01T00:10:30")) == 0
