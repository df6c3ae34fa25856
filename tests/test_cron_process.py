"""Cron with real parts: the real process registry (keepers, real workers), real SQLite, real
APScheduler wake-ups, separate scheduler processes on one database, the ``dispatch cron`` CLI,
and degrade vs fail-closed on a real systemd user manager.

Decisions are still driven with a fake clock where the test is about a decision (overlap,
timeout); workers are real processes held open by a release file, so nothing sleeps to wait.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.app.runtime import Runtime, open_runtime
from dispatcher.cron.ledger import Ledger
from dispatcher.cron.records import FireRecord, Kind, Status
from dispatcher.cron.scheduler import CronScheduler
from dispatcher.cron.settings import CronJob, CronSettings, OverlapPolicy
from dispatcher.cron.waker import CronWaker
from dispatcher.cron.zones import fixed_zone
from dispatcher.settings import Settings
from registry.abc import SessionState
from scope.abc import CallerKind, Placement
from scope.foundation.clock import FakeClock
from scope.foundation.procstat import start_time
from tests.support.env import no_bus_env
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parent.parent
T0 = dt.datetime(2026, 1, 5, 9, 59, 30, tzinfo=dt.UTC).timestamp()
WAIT_FOR_FILE = 'while [ ! -e "$1" ]; do sleep 0.02; done'


def utc(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()


class Rig:
    """A real runtime (database, scoper, process registry) and one scheduler on it."""

    def __init__(
        self,
        tmp_path: Path,
        *jobs: CronJob,
        environ: dict[str, str] | None = None,
        clock: FakeClock | None = None,
        rng: random.Random | None = None,
        **cron: Any,
    ) -> None:
        self.state_dir = tmp_path / "state"
        self.environ = environ or no_bus_env(tmp_path)
        self.settings = Settings(cron=CronSettings(jobs=tuple(jobs), **cron))
        self.runtime: Runtime = open_runtime(
            self.settings,
            self.state_dir,
            self.environ,
            caller_kind=CallerKind.CRON,
            follow=True,
        )
        self.clock = clock
        self.scheduler = CronScheduler(
            self.settings.cron,
            self.runtime.registry,
            self.runtime.db,
            clock=clock,
            environ=self.environ,
            state_dir=self.state_dir,
            zone_resolver=fixed_zone("UTC"),
            rng=rng,
        )
        self.ledger = Ledger(self.runtime.db)
        self.wakers: list[CronWaker] = []

    def waker(self) -> CronWaker:
        """The APScheduler waker for this rig's scheduler (stopped by :meth:`close`)."""
        waker = CronWaker(self.scheduler)
        self.wakers.append(waker)
        return waker

    def at(self, text: str) -> float:
        assert self.clock is not None
        self.clock.set(utc(text))
        return self.clock.time()

    def rows(self, job_id: str | None = None) -> list[FireRecord]:
        return list(reversed(self.ledger.history(job_id, limit=1000)))

    def outcomes(self) -> list[str]:
        return [row.shown_outcome for row in self.rows()]

    def settle_until(self, expected: list[str], timeout: float = 10.0) -> None:
        """Tick (settling finished workers) until the ledger shows ``expected``."""

        def done() -> bool:
            self.scheduler.tick()
            return self.outcomes() == expected

        wait_for(done, timeout, what=f"ledger outcomes {expected}")

    def close(self) -> None:
        for waker in self.wakers:
            waker.stop()
        self.scheduler.stop()
        for session in self.runtime.registry.list_sessions():
            self.runtime.registry.kill(session.id, grace=0.5)
        self.runtime.close()


@pytest.fixture
def rigs(tmp_path: Path) -> Iterator[Any]:
    made: list[Rig] = []

    def make(*jobs: CronJob, **kwargs: Any) -> Rig:
        rig = Rig(tmp_path, *jobs, **kwargs)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.close()


def slow_job(release: Path, **values: Any) -> CronJob:
    return CronJob(
        id="slow",
        schedule="*/5 * * * *",
        command=("sh", "-c", WAIT_FOR_FILE, "sh", str(release)),
        **values,
    )


def alive(pid: int | None, started: int | None) -> bool:
    return pid is not None and started is not None and start_time(pid) == started


# -- overlap with a slow worker --------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "while_running", "after"),
    [
        (
            OverlapPolicy.SKIP,
            ["running", "skipped_overlap", "skipped_overlap"],
            ["completed", "skipped_overlap", "skipped_overlap"],
        ),
        (
            OverlapPolicy.QUEUE_ONE,
            ["running", "queued", "skipped_overlap"],
            ["completed", "completed", "skipped_overlap"],
        ),
        (OverlapPolicy.ALLOW, ["running"] * 3, ["completed"] * 3),
    ],
    ids=["skip", "queue_one", "allow"],
)
def test_overlap_with_a_slow_worker(leak_guard, rigs, tmp_path, policy, while_running, after):
    release = tmp_path / "release"
    rig = rigs(slow_job(release, overlap=policy), clock=FakeClock(T0))
    rig.scheduler.tick()
    for when in ("10:00", "10:05", "10:10"):
        rig.scheduler.tick(rig.at(f"2026-01-05T{when}:00"))
    assert rig.outcomes() == while_running
    running = rig.runtime.registry.list_sessions()
    assert len(running) == while_running.count("running")
    assert all(s.placement is Placement.IN_PROCESS for s in running)
    release.touch()
    rig.settle_until(after)
    for row in rig.rows():
        if row.outcome and row.outcome.value == "completed":
            assert row.exit_code == 0 and row.session_id and row.ended_at


def test_overlap_replace_kills_the_running_worker(leak_guard, rigs, tmp_path):
    release = tmp_path / "release"
    rig = rigs(slow_job(release, overlap=OverlapPolicy.REPLACE), clock=FakeClock(T0))
    rig.scheduler.tick()
    rig.scheduler.tick(rig.at("2026-01-05T10:00:00"))
    (first,) = rig.rows()
    old = rig.runtime.registry.get(first.session_id or "")
    wait_for(lambda: rig.runtime.registry.get(old.id).worker_pid, what="worker pid recorded")
    old = rig.runtime.registry.get(old.id)
    assert alive(old.worker_pid, old.worker_start)
    report = rig.scheduler.tick(rig.at("2026-01-05T10:05:00"))
    assert report.replaced == (old.id,)
    killed = rig.runtime.registry.get(old.id)
    assert killed.state is SessionState.KILLED
    assert not alive(old.worker_pid, old.worker_start)
    assert rig.outcomes() == ["replaced", "running"]
    release.touch()
    rig.settle_until(["replaced", "completed"])


def test_timeout_kills_through_the_registry(leak_guard, rigs, tmp_path):
    job = CronJob(id="hang", every=60.0, command=("sleep", "60"), timeout=1.0)
    rig = rigs(job, clock=FakeClock(T0))
    rig.scheduler.tick()
    rig.scheduler.tick(rig.at("2026-01-05T10:00:00"))
    (row,) = rig.rows()
    session_id = row.session_id or ""
    wait_for(lambda: rig.runtime.registry.get(session_id).worker_pid, what="worker started")
    worker = rig.runtime.registry.get(session_id)
    rig.settle_until(["timed_out"], timeout=15)
    (row,) = rig.rows()
    assert row.error
    assert not alive(worker.worker_pid, worker.worker_start)
    assert rig.runtime.registry.get(session_id).state is SessionState.TIMED_OUT


def test_failed_start_and_on_failure_with_real_processes(rigs, tmp_path):
    marker = tmp_path / "hook.json"
    hook = (
        "import json, os, sys; "
        "json.dump({k: v for k, v in os.environ.items() if k.startswith('DISPATCH_')}, "
        "open(sys.argv[1], 'w'))"
    )
    job = CronJob(
        id="bad",
        every=60.0,
        command=("sh", "-c", "echo oops >&2; exit 4"),
        on_failure=(sys.executable, "-c", hook, str(marker)),
    )
    rig = rigs(job, clock=FakeClock(T0))
    rig.scheduler.tick()
    rig.scheduler.tick(rig.at("2026-01-05T10:00:00"))
    rig.settle_until(["failed"])
    wait_for(marker.exists, what="on_failure hook output")
    wait_for(lambda: marker.read_text().endswith("}"), what="hook output complete")
    details = json.loads(marker.read_text())
    (row,) = rig.rows()
    assert details["DISPATCH_OUTCOME"] == "failed"
    assert details["DISPATCH_EXIT_CODE"] == "4"
    assert details["DISPATCH_FIRE_KEY"] == row.fire_key
    assert details["DISPATCH_FIRE_SESSION_ID"] == row.session_id
    assert Path(details["DISPATCH_LOG_PATH"]).read_bytes() == b"oops\n"


# -- APScheduler wakes the step -------------------------------------------------------------


def test_apscheduler_wakes_the_step_at_its_deadline(leak_guard, rigs):
    # The fake clock stands 0.3 s before a fire: the waker arms APScheduler 0.3 s from now, and
    # its wake-ups step the scheduler at whatever the clock says (nothing is due until it moves;
    # each wake re-arms the same deadline).
    clock = FakeClock(utc("2026-01-05T09:59:59.7"))
    job = CronJob(id="beat", schedule="* * * * *", command=("true",))
    rig = rigs(job, clock=clock)
    waker = rig.waker()
    waker.start()
    assert waker.running
    wait_for(lambda: waker.next_wake == utc("2026-01-05T10:00:00"), what="the fire armed")
    assert rig.rows() == []
    clock.set(utc("2026-01-05T10:00:00"))
    # The fire starts on APScheduler's thread; its worker's end asks for a wake at once, and
    # that step settles it.
    wait_for(lambda: rig.outcomes() == ["completed"], timeout=10, what="fire woken and settled")
    (row,) = rig.rows()
    assert row.fire_key == "beat@2026-01-05T10:00:00"
    # Next: the reconcile bound (wake_interval, 30 s), before the 10:01 fire.
    wait_for(lambda: waker.next_wake == utc("2026-01-05T10:00:30"), what="next wake armed")
    waker.stop()
    assert not waker.running and waker.next_wake is None


def test_a_late_wake_still_steps_and_the_late_fire_runs(leak_guard, rigs):
    clock = FakeClock(utc("2026-01-05T09:59:30"))
    job = CronJob(id="beat", schedule="* * * * *", command=("true",))
    rig = rigs(job, clock=clock)
    waker = rig.waker()
    waker.start()
    assert waker.next_wake == utc("2026-01-05T10:00:00")
    # APScheduler is late: the wake for 10:00:00 is delivered when the clock already says
    # 10:00:01.6, past APScheduler's own 1 s misfire default (which would drop it). The fire is
    # still within cron.on_time_grace, so it runs as a normal, late fire.
    clock.set(utc("2026-01-05T10:00:01.6"))
    waker.request(utc("2026-01-05T10:00:00"))
    wait_for(lambda: rig.outcomes() == ["completed"], timeout=10, what="the late fire")
    (row,) = rig.rows()
    assert row.fire_key == "beat@2026-01-05T10:00:00"
    assert row.kind is Kind.SCHEDULE
    waker.stop()


def test_stopping_the_waker_settles_claimed_fires_it_never_started(rigs):
    # A jitter delay keeps the claimed fire waiting; the waker stops before it ends.
    clock = FakeClock(utc("2026-01-05T09:59:59"))
    job = CronJob(id="late", schedule="* * * * *", command=("true",), jitter=30.0)
    rig = rigs(job, clock=clock, rng=random.Random(1))
    waker = rig.waker()
    waker.start()
    clock.set(utc("2026-01-05T10:00:00"))
    waker.request(clock.time())
    wait_for(
        lambda: [r.status for r in rig.rows()] == [Status.CLAIMED],
        what="a claimed fire waiting out its jitter",
    )
    (row,) = rig.rows()
    assert row.due_at is not None and row.due_at > clock.time()
    waker.stop()
    assert rig.outcomes() == ["failed_start"]
    assert rig.runtime.registry.list_sessions(include_finished=True) == []


# -- two scheduler processes on one database -------------------------------------------------

SCHEDULER_SCRIPT = textwrap.dedent(
    """
    import collections, os, sys, time
    from pathlib import Path
    from dispatcher.app.runtime import open_runtime
    from dispatcher.config import load_config
    from dispatcher.cron.ledger import Ledger
    from dispatcher.cron.scheduler import CronScheduler
    from dispatcher.cron.waker import CronWaker
    from scope.abc import CallerKind

    config, state, fires = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    settings = load_config(config).settings
    jobs = [job.id for job in settings.cron.jobs]
    env = dict(os.environ)

    def poll(done, seconds):
        deadline = time.monotonic() + seconds
        while not done() and time.monotonic() < deadline:
            time.sleep(0.05)

    with open_runtime(settings, state, env, caller_kind=CallerKind.CRON, follow=True) as rt:
        scheduler = CronScheduler(settings.cron, rt.registry, rt.db, environ=env, state_dir=state)
        ledger = Ledger(rt.db)

        def enough():
            started = collections.Counter(
                r.job_id for r in ledger.history(limit=10_000) if r.session_id
            )
            return all(started[job] >= fires for job in jobs)

        waker = CronWaker(scheduler)
        waker.start()
        poll(enough, 30)  # both processes run until the shared ledger holds enough fires
        waker.stop()

        def idle():
            scheduler.tick()
            return not rt.registry.list_sessions()

        poll(idle, 10)
        scheduler.tick()
    print("done")
    """
)


def test_two_scheduler_processes_never_run_a_fire_twice(leak_guard, tmp_path):
    config = tmp_path / "config.yaml"
    jobs = "\n".join(
        f'    - id: j{i}\n      every: 1s\n      overlap: allow\n      command: ["true"]'
        for i in range(3)
    )
    config.write_text(f"cron:\n  max_concurrent: 100\n  jobs:\n{jobs}\n")
    state = tmp_path / "state"
    env = {**no_bus_env(tmp_path), "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCHEDULER_SCRIPT, str(config), str(state), "3"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
        assert out.strip() == b"done"
    with open_runtime(Settings(), state, env) as rt:
        rows = list(reversed(Ledger(rt.db).history(limit=10_000)))
        sessions = rt.registry.list_sessions(include_finished=True)
    cron_sessions = [s for s in sessions if s.owner.kind == "cron"]
    owners = [s.owner.id for s in cron_sessions]
    assert len(owners) == len(set(owners)), "a fire key ran twice"
    ran = [r for r in rows if r.session_id]
    assert len(ran) >= 3 * 3  # three fires of each job, at least
    assert {r.fire_key for r in ran} == set(owners)
    claimants = {r.claimant.split(":")[0] for r in ran if r.claimant}
    assert len(claimants) >= 1
    assert all(r.status is Status.DONE for r in rows)


# -- the CLI ---------------------------------------------------------------------------------


def dispatch(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


def test_cron_run_cli(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "cron:\n  jobs:\n"
        "    - id: seven\n      schedule: '@daily'\n      command: [sh, -c, 'echo out; exit 7']\n"
        "    - id: ok\n      every: 1h\n      command: [sh, -c, 'exit 0']\n"
    )
    env = {**no_bus_env(tmp_path), "PYTHONPATH": str(ROOT)}
    base = ["--config", str(config), "--state-dir", str(tmp_path / "state")]
    waited = dispatch(*base, "cron", "run", "seven", "--wait", env=env)
    assert waited.returncode == 7, waited.stderr
    assert waited.stdout.strip().startswith("s_")
    started = dispatch(*base, "cron", "run", "ok", env=env)
    assert started.returncode == 0, started.stderr
    session_id = started.stdout.strip()
    assert session_id.startswith("s_") and "\n" not in session_id

    def settled() -> list[dict[str, Any]] | None:
        history = dispatch(*base, "cron", "history", "--json", env=env)
        assert history.returncode == 0, history.stderr
        rows = json.loads(history.stdout)
        return rows if rows[0]["outcome"] == "completed" else None

    rows = wait_for(settled, timeout=20, interval=0.2, what="manual run settled by history")
    assert [r["job_id"] for r in rows] == ["ok", "seven"]
    assert rows[0]["session_id"] == session_id
    assert rows[1]["outcome"] == "failed" and rows[1]["exit_code"] == 7
    for row in rows:
        assert set(row) >= {
            "job_id",
            "fire_key",
            "nominal",
            "actual",
            "outcome",
            "placement",
            "session_id",
            "exit_code",
            "started_at",
            "ended_at",
            "error",
        }
        assert row["fire_key"].startswith(f"{row['job_id']}@run:")
        assert row["placement"] == "in_process"
        assert dt.datetime.fromisoformat(row["started_at"]).utcoffset() is not None
    unknown = dispatch(*base, "cron", "run", "nosuch", env=env)
    assert unknown.returncode == 2
    assert len(unknown.stderr.strip().splitlines()) == 1


def test_cron_run_fails_when_the_fire_cannot_start(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "cron:\n  jobs:\n"
        "    - id: gone\n      every: 1h\n      command: [/nonexistent/dispatch-job]\n"
        "    - id: nowhere\n      every: 1h\n      command: [sh, -c, 'exit 0']\n"
        "      cwd: no-such-dir\n"
    )
    env = {**no_bus_env(tmp_path), "PYTHONPATH": str(ROOT)}
    base = ["--config", str(config), "--state-dir", str(tmp_path / "state")]
    missing = dispatch(*base, "cron", "run", "gone", env=env)
    assert missing.returncode == 1, (missing.stdout, missing.stderr)
    (line,) = missing.stderr.strip().splitlines()
    assert "failed_start" in line
    assert dispatch(*base, "cron", "run", "gone", "--wait", env=env).returncode == 127
    unusable = dispatch(*base, "cron", "run", "nowhere", env=env)
    assert unusable.returncode == 1
    (line,) = unusable.stderr.strip().splitlines()
    assert "config_error" in line and "not a directory" in line


# -- the real-systemd tier -------------------------------------------------------------------


@pytest.mark.parametrize("strict", [False, True], ids=["degrade", "fail-closed"])
def test_degrade_vs_fail_closed_when_the_manager_vanishes(
    systemd_manager, tmp_path, strict, caplog
):
    # INVOCATION_ID makes the scheduler a caller inside a unit whose stop kills its children:
    # the row of the placement table where cron degrades or, strictly, refuses.
    env = {**systemd_manager.env, "INVOCATION_ID": "0123456789abcdef", "HOME": str(tmp_path)}
    job = CronJob(id="tick", schedule="*/5 * * * *", command=("sh", "-c", "exit 0"))
    rig = Rig(
        tmp_path,
        job,
        environ=env,
        clock=FakeClock(T0),
        require_restart_safe_scope=strict,
    )
    try:
        rig.scheduler.tick()
        rig.scheduler.tick(rig.at("2026-01-05T10:00:00"))
        rig.settle_until(["completed"], timeout=20)
        assert rig.rows()[0].placement == "scoped"
        with systemd_manager.manager_unreachable(), caplog.at_level("WARNING", "dispatch.cron"):
            rig.scheduler.tick(rig.at("2026-01-05T10:05:00"))
            second = rig.rows()[1]
            # The scoped attempt found the manager gone; the same slot was retried once.
            assert any("retrying once" in r.getMessage() for r in caplog.records)
            assert second.fire_key == "tick@2026-01-05T10:05:00"
            if strict:
                assert second.shown_outcome == "spawn_refused"
                assert second.infrastructure is True
                assert "require_restart_safe_scope" in (second.error or "")
                assert second.session_id is None
            else:
                assert second.placement == "degraded"
                rig.settle_until(["completed", "completed"], timeout=20)
        sessions = rig.runtime.registry.list_sessions(include_finished=True)
        assert len([s for s in sessions if s.owner.id == "tick@2026-01-05T10:05:00"]) == (
            0 if strict else 1
        )
    finally:
        rig.close()
