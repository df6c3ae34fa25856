"""Admission under pressure: the pure policy (table and properties), the /proc readers over
sample files and the real /proc, the settings' bad input, the cron hold, and the verdict kept
across processes."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.config import parse_config
from dispatcher.cron.hold import split_held, start_deadline
from dispatcher.cron.records import FireRecord, Kind, Status
from dispatcher.gateway.admission import HostAdmission, read_verdict
from dispatcher.launch.admission import (
    AdmissionSettings,
    AdmissionState,
    Readings,
    decide,
    reason_text,
)
from dispatcher.launch.pressure import PROC_ENV, parse_meminfo, parse_psi, read_readings
from scope.foundation.clock import FakeClock
from scope.foundation.errors import ConfigError

MiB = 2**20
S = AdmissionSettings(min_hold=30.0)  # memory 20 % / resume 10 %, MemAvailable 256/512 MiB
CALM = Readings(memory_pressure=1.0, memory_available=4096 * MiB, cpu_pressure=5.0)
FREE = AdmissionState()


def held(since: float, *reasons: str) -> AdmissionState:
    return AdmissionState(held=True, since=since, reasons=reasons)


# -- the policy, as a table ---------------------------------------------------------------------

TABLE = [
    # (previous, readings, now, settings, expected)
    ("calm stays free", FREE, CALM, 100.0, S, FREE),
    (
        "pressure at the threshold holds",
        FREE,
        Readings(memory_pressure=20.0, memory_available=4096 * MiB),
        100.0,
        S,
        held(100.0, "memory_pressure"),
    ),
    (
        "just below the threshold does not",
        FREE,
        Readings(memory_pressure=19.99, memory_available=4096 * MiB),
        100.0,
        S,
        FREE,
    ),
    (
        "MemAvailable under the floor holds",
        FREE,
        Readings(memory_pressure=0.0, memory_available=200 * MiB),
        100.0,
        S,
        held(100.0, "memory_available"),
    ),
    (
        "both at once, in signal order",
        FREE,
        Readings(memory_pressure=50.0, memory_available=100 * MiB),
        100.0,
        S,
        held(100.0, "memory_pressure", "memory_available"),
    ),
    (
        "between resume and hold stays held (hysteresis)",
        held(0.0, "memory_pressure"),
        Readings(memory_pressure=15.0, memory_available=4096 * MiB),
        100.0,
        S,
        held(0.0, "memory_pressure"),
    ),
    (
        "calm but inside the minimum hold stays held",
        held(90.0, "memory_pressure"),
        CALM,
        100.0,
        S,
        held(90.0, "memory_pressure"),
    ),
    (
        "calm after the minimum hold resumes",
        held(50.0, "memory_pressure"),
        CALM,
        100.0,
        S,
        AdmissionState(since=100.0),
    ),
    (
        "MemAvailable back over the floor but under resume stays held",
        held(0.0, "memory_available"),
        Readings(memory_pressure=0.0, memory_available=300 * MiB),
        100.0,
        S,
        held(0.0, "memory_available"),
    ),
    (
        "the reason follows what still holds",
        held(0.0, "memory_pressure", "memory_available"),
        Readings(memory_pressure=2.0, memory_available=300 * MiB),
        100.0,
        S,
        held(0.0, "memory_available"),
    ),
    (
        "cpu pressure is off by default",
        FREE,
        Readings(memory_pressure=0.0, memory_available=4096 * MiB, cpu_pressure=99.0),
        100.0,
        S,
        FREE,
    ),
    (
        "cpu pressure holds when set, resumes below half by default",
        held(0.0, "cpu_pressure"),
        Readings(memory_pressure=0.0, memory_available=4096 * MiB, cpu_pressure=35.0),
        100.0,
        AdmissionSettings(cpu_pressure=80.0),
        AdmissionState(since=100.0),
    ),
    (
        "no PSI: MemAvailable alone",
        FREE,
        Readings(memory_available=100 * MiB),
        100.0,
        S,
        held(100.0, "memory_available"),
    ),
    ("no readings at all never hold", FREE, Readings(), 100.0, S, FREE),
    (
        "readings gone while held: released after the minimum hold",
        held(0.0, "memory_pressure"),
        Readings(),
        100.0,
        S,
        AdmissionState(since=100.0),
    ),
    (
        "a clock stepped back does not hold forever",
        held(500.0, "memory_pressure"),
        CALM,
        100.0,
        S,
        AdmissionState(since=100.0),
    ),
    (
        "disabled never holds, and lets a hold go",
        held(99.0, "memory_pressure"),
        Readings(memory_pressure=90.0),
        100.0,
        AdmissionSettings(enabled=False),
        AdmissionState(since=100.0),
    ),
    (
        "memory_pressure: null ignores PSI",
        FREE,
        Readings(memory_pressure=90.0, memory_available=4096 * MiB),
        100.0,
        AdmissionSettings(memory_pressure=None),
        FREE,
    ),
]


@pytest.mark.parametrize(
    ("previous", "readings", "now", "settings", "expected"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)
def test_decide(previous, readings, now, settings, expected) -> None:
    assert decide(readings, settings, previous, now) == expected


def test_reason_text_names_each_reading() -> None:
    readings = Readings(memory_pressure=34.4, memory_available=200 * MiB, cpu_pressure=91.0)
    state = held(0.0, "memory_pressure", "memory_available", "cpu_pressure")
    assert reason_text(state, readings, S) == (
        "memory pressure 34 %, MemAvailable 200MiB (floor 256MiB), cpu pressure 91 %"
    )
    assert reason_text(FREE, readings, S) == ""


# -- the policy, as properties ------------------------------------------------------------------

pressure = st.one_of(st.none(), st.floats(min_value=0, max_value=100))
available = st.one_of(st.none(), st.integers(min_value=0, max_value=2048 * MiB))
readings = st.builds(Readings, memory_pressure=pressure, memory_available=available)
steps = st.lists(st.tuples(st.floats(min_value=0.01, max_value=20), readings), max_size=60)


@given(steps=steps, min_hold=st.floats(min_value=0, max_value=60))
def test_never_flaps_faster_than_the_minimum_hold(steps, min_hold) -> None:
    settings = AdmissionSettings(min_hold=min_hold)
    state, now = AdmissionState(), 1000.0
    holds: list[float] = []
    for gap, reading in steps:
        now += gap
        after = decide(reading, settings, state, now)
        if after.held and not state.held:
            # A hold starts only on a reading past a hold threshold.
            assert after.reasons and after.since == now
            holds.append(now)
        if state.held and not after.held:
            # A hold ends only after the minimum hold, on calm readings.
            assert state.since is not None and now - state.since >= min_hold
        state = after
    assert all(b - a >= min_hold for a, b in itertools.pairwise(holds))


@given(steps=steps)
def test_a_host_never_held_by_calm_readings(steps) -> None:
    state, now = AdmissionState(), 0.0
    for gap, reading in steps:
        now += gap
        calm = Readings(
            memory_pressure=min(reading.memory_pressure or 0.0, 19.9),
            memory_available=max(reading.memory_available or 0, 256 * MiB),
        )
        state = decide(calm, S, state, now)
        assert not state.held


# -- the settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("memory_pressure: 120%", "admission.memory_pressure: must be at most 100%"),
        ("memory_pressure: 20", "admission.memory_pressure: expected a percentage, got 20"),
        ("memory_pressure_resume: -1%", "admission.memory_pressure_resume: invalid percentage"),
        ("memory_pressure_resume: 30%", "admission.memory_pressure_resume: must be below"),
        (
            "cpu_pressure_resume: 5%",
            "admission.cpu_pressure_resume: is set but cpu_pressure is null, so it would never"
            " apply; set cpu_pressure or remove cpu_pressure_resume",
        ),
        (
            "memory_pressure: null\n  memory_pressure_resume: 5%",
            "admission.memory_pressure_resume: is set but memory_pressure is null",
        ),
        (
            "memory_available: null\n  memory_available_resume: 1GiB",
            "admission.memory_available_resume: is set but memory_available is null",
        ),
        (
            "cpu_pressure: 50%\n  cpu_pressure_resume: 50%",
            "admission.cpu_pressure_resume: must be below cpu_pressure",
        ),
        (
            "memory_available: 1GiB\n  memory_available_resume: 512MiB",
            "admission.memory_available_resume: must be at least",
        ),
        ("min_hold: soon", "admission.min_hold: invalid duration"),
        ("memory_presure: 20%", "unknown key 'memory_presure'; did you mean 'memory_pressure'?"),
    ],
)
def test_bad_admission_config_is_one_line(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f"admission:\n  {text}\n", "c.yaml")
    assert expected in info.value.message and "\n" not in info.value.message
    assert info.value.exit_code == 2


def test_a_threshold_alone_brings_its_resume_threshold_along() -> None:
    # Only the hold threshold set: its resume threshold follows it (half a pressure, twice a
    # floor), instead of an error about a key the file does not name.
    config = parse_config("admission:\n  memory_pressure: 5%\n  memory_available: 1GiB\n", "c")
    settings = config.admission
    assert (settings.memory_resume, settings.available_resume) == (2.5, 2048 * MiB)
    assert (S.memory_resume, S.available_resume) == (10.0, 512 * MiB)
    state = decide(Readings(memory_pressure=6.0), settings, FREE, 0.0)
    assert state.held and state.reasons == ("memory_pressure",)
    still = decide(Readings(memory_pressure=3.0, memory_available=4096 * MiB), settings, state, 99)
    assert still.held
    calm = Readings(memory_pressure=2.0, memory_available=1536 * MiB)
    assert decide(calm, settings, state, 99).held  # MemAvailable below twice its floor
    assert not decide(Readings(memory_pressure=2.0), settings, state, 99).held


# -- reading /proc ------------------------------------------------------------------------------

PSI = (
    "some avg10=34.41 avg60=20.00 avg300=5.10 total=123456\n"
    "full avg10=3.00 avg60=1.00 avg300=0.10 total=999\n"
)
MEMINFO = "MemTotal:       16318908 kB\nMemFree:          201212 kB\nMemAvailable:     204800 kB\n"


def test_parsers_over_sample_files() -> None:
    assert parse_psi(PSI) == 34.41
    assert parse_psi("full avg10=3.00 avg60=1 avg300=0 total=1\n") is None
    assert parse_psi("some avg10=nan avg60=0\n") is None and parse_psi("") is None
    assert parse_meminfo(MEMINFO) == 200 * MiB
    assert parse_meminfo("MemAvailable: lots kB\n") is None and parse_meminfo("") is None


def fake_proc(root: Path, *, memory: str | None, meminfo: str = MEMINFO) -> Path:
    (root / "pressure").mkdir(parents=True, exist_ok=True)
    if memory is not None:
        (root / "pressure" / "memory").write_text(memory)
    (root / "meminfo").write_text(meminfo)
    return root


def test_a_host_without_psi_reads_memavailable_only(tmp_path: Path) -> None:
    found = read_readings(fake_proc(tmp_path, memory=None))
    assert found == Readings(memory_available=200 * MiB) and not found.psi


def test_the_real_proc_pressure_memory() -> None:
    path = Path("/proc/pressure/memory")
    try:
        text = path.read_text()
    except OSError:
        pytest.skip("this kernel has no PSI")
    found = read_readings("/proc")
    assert found.psi and 0 <= (found.memory_pressure or 0) <= 100
    assert parse_psi(text) is not None and found.memory_available is not None


# -- the verdict across processes (kanban tick) -------------------------------------------------


def test_a_verdict_continues_across_instances_and_logs_each_change_once(
    tmp_path: Path, caplog
) -> None:
    proc = fake_proc(tmp_path / "proc", memory=PSI)
    state = tmp_path / "state"
    state.mkdir()
    clock = FakeClock(start=1_800_000_000.0)
    settings = AdmissionSettings(min_hold=10.0)

    def admission() -> HostAdmission:
        return HostAdmission(
            lambda: settings, state, {PROC_ENV: str(proc)}, clock, writer="kanban tick"
        )

    with caplog.at_level(logging.INFO, logger="dispatch.admission"):
        first = admission().check()
        assert (
            first.held
            and first.reason == "memory pressure 34 %, MemAvailable 200MiB (floor 256MiB)"
        )
        assert (state / "admission.json").stat().st_mode & 0o777 == 0o600
        fake_proc(
            proc,
            memory="some avg10=0.50 avg60=0 avg300=0 total=1\n",
            meminfo="MemAvailable: 8388608 kB\n",
        )
        clock.advance(5)
        assert admission().check().held  # a new process: still inside the minimum hold
        clock.advance(6)
        after = admission().check()
        assert not after.held and read_verdict(state) == after
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == (
        "admission: holding new work: memory pressure 34 %, MemAvailable 200MiB (floor "
        "256MiB); running workers continue"
    )
    assert lines[1].startswith("admission: taking new work again after 11 s (memory pressure 0 %")
    assert len(lines) == 2
    assert json.loads((state / "admission.json").read_text())["writer"] == "kanban tick"


# -- the cron hold ------------------------------------------------------------------------------


def fire(fire_id: int, nominal: float, *, kind: Kind = Kind.SCHEDULE, job: str = "j") -> FireRecord:
    return FireRecord(
        id=fire_id,
        fire_key=f"{job}@{fire_id}",
        job_id=job,
        kind=kind,
        nominal_wall="",
        fold=0,
        zone="UTC",
        nominal=nominal,
        decided_at=nominal,
        due_at=nominal,
        actual=None,
        status=Status.CLAIMED,
        outcome=None,
        catch_up=False,
        jitter=0.0,
        placement=None,
        session_id=None,
        exit_code=None,
        signal=None,
        started_at=None,
        ended_at=None,
        error=None,
        infrastructure=False,
        log_path=None,
        claimant="me",
        on_failure_session=None,
    )


def test_held_fires_wait_until_their_start_deadline() -> None:
    rows = [
        fire(1, 100.0),
        fire(2, 40.0),
        fire(3, 100.0, kind=Kind.MANUAL),
        fire(4, 100.0, job="gone"),
    ]
    waiting, overdue = split_held(rows, 150.0, {"j": 60.0})
    assert [r.id for r in waiting] == [1]
    # Past its deadline (40 + 60); a job no longer configured has no window left; a manual
    # fire is the operator's request and never held.
    assert [r.id for r in overdue] == [2, 4]
    assert start_deadline(rows[0], 60.0) == 160.0
    # The deadline itself is too late (a wake set for it records the miss, no busy loop).
    assert split_held(rows[:1], 160.0, {"j": 60.0}) == ([], [rows[0]])


def test_the_scheduler_holds_fires_queued_then_missed_with_the_reason(tmp_path: Path) -> None:
    from tests.test_cron_scheduler import World, job, utc

    world = World(tmp_path)
    try:
        reason: list[str | None] = ["memory pressure 34 %"]
        s = world.scheduler(job(catch_up_window=120.0), job("k", catch_up_window=600.0))
        s.set_hold(lambda _now: reason[0])
        s.tick()
        report = s.tick(world.at("2026-01-05T10:00:00.003"))
        assert report.started == () and len(report.decided) == 2
        assert world.outcomes() == [
            ("j@2026-01-05T10:00:00", "queued"),
            ("k@2026-01-05T10:00:00", "queued"),
        ]
        # The scheduler wakes by the first start deadline at the latest, to record it on time.
        assert report.next_wake is not None and report.next_wake <= utc("2026-01-05T10:02:00")
        # A manual run is the operator's: never held.
        manual = s.run_now("j")
        assert manual.status is Status.RUNNING
        report = s.tick(world.at("2026-01-05T10:02:00"))
        assert report.started == ()
        (missed,) = [r for r in world.rows("j") if r.kind is Kind.SCHEDULE]
        assert missed.shown_outcome == "missed" and missed.error == "memory pressure 34 %"
        reason[0] = None  # released: the waiting fire of k starts now
        report = s.tick(world.at("2026-01-05T10:03:00"))
        assert [r.fire_key for r in report.started] == ["k@2026-01-05T10:00:00"]
    finally:
        for scheduler in world.schedulers:
            scheduler.stop()
        world.db.close()


def test_a_held_cluster_host_decides_no_fires(tmp_path: Path) -> None:
    from tests.test_cron_scheduler import World, job

    world = World(tmp_path)
    try:
        s = world.scheduler(job())
        s.tick()
        s.set_hold(lambda _now: "memory pressure 50 %", decide=False)
        s.tick(world.at("2026-01-05T10:00:00.003"))
        assert world.rows() == []  # another host decides (and runs) it
        s.set_hold(None)
        report = s.tick(world.at("2026-01-05T10:00:01"))
        assert [r.fire_key for r in report.decided] == ["j@2026-01-05T10:00:00"]
    finally:
        for scheduler in world.schedulers:
            scheduler.stop()
        world.db.close()
