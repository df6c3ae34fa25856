"""The probe cache (scope.probe.Probe): TTL on an injected clock, single flight, retry, flip."""

from __future__ import annotations

import threading

from scope.abc import ProbeVerdict
from scope.foundation.clock import FakeClock
from scope.probe import Probe


class Check:
    """A scripted check: returns the queued verdicts in order, records the bounds it got."""

    def __init__(self, *verdicts: ProbeVerdict, gate: threading.Event | None = None) -> None:
        self.verdicts = list(verdicts)
        self.bounds: list[float] = []
        self.gate = gate
        self.entered = threading.Event()

    def __call__(self, bound: float) -> ProbeVerdict:
        self.bounds.append(bound)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        return self.verdicts.pop(0) if len(self.verdicts) > 1 else self.verdicts[0]


UP = ProbeVerdict(ok=True, backend="dbus", elapsed_ms=1.0)
DOWN = ProbeVerdict(ok=False, backend=None, elapsed_ms=1.0, detail="no manager")
SLOW = ProbeVerdict(ok=False, backend=None, elapsed_ms=3000.0, detail="slow", timed_out=True)


def make(check: Check, clock: FakeClock, **kw) -> Probe:
    return Probe(check, ttl=60, timeout=3, retry_timeout=10, clock=clock, **kw)


def test_both_verdicts_are_cached_until_the_ttl_passes():
    clock = FakeClock()
    check = Check(UP, DOWN)
    probe = make(check, clock)
    assert probe.verdict().ok
    clock.advance(59)
    assert probe.verdict().ok and probe.runs == 1
    clock.advance(1)
    assert not probe.verdict().ok and probe.runs == 2
    clock.advance(59.9)
    assert probe.verdict().detail == "no manager" and probe.runs == 2
    assert probe.verdict(force=True) and probe.runs == 3


def test_checked_at_comes_from_the_injected_clock():
    clock = FakeClock()
    probe = make(Check(UP), clock)
    assert probe.verdict().checked_at == clock.monotonic()


def test_single_flight_under_threads():
    clock = FakeClock()
    gate = threading.Event()
    check = Check(UP, gate=gate)
    probe = make(check, clock)
    results: list[ProbeVerdict] = []
    threads = [threading.Thread(target=lambda: results.append(probe.verdict())) for _ in range(8)]
    for thread in threads:
        thread.start()
    assert check.entered.wait(5)
    gate.set()
    for thread in threads:
        thread.join(10)
    assert len(results) == 8 and all(r.ok for r in results)
    assert probe.runs == 1 and check.bounds == [3]


def test_forced_probe_joins_the_one_in_flight():
    clock = FakeClock()
    gate = threading.Event()
    check = Check(UP, gate=gate)
    probe = make(check, clock)
    first = threading.Thread(target=probe.verdict)
    first.start()
    assert check.entered.wait(5)
    second: list[ProbeVerdict] = []
    joiner = threading.Thread(target=lambda: second.append(probe.verdict(force=True)))
    joiner.start()
    gate.set()
    first.join(10)
    joiner.join(10)
    assert second and second[0].ok and probe.runs == 1


def test_a_timeout_is_retried_once_with_the_longer_bound():
    clock = FakeClock()
    check = Check(SLOW, UP)
    probe = make(check, clock)
    assert probe.verdict().ok
    assert check.bounds == [3, 10] and probe.runs == 2


def test_a_second_timeout_is_cached_as_down():
    clock = FakeClock()
    check = Check(SLOW, SLOW, UP)
    probe = make(check, clock)
    verdict = probe.verdict()
    assert not verdict.ok and verdict.timed_out and check.bounds == [3, 10]
    assert not probe.verdict().ok and probe.runs == 2  # cached, not re-run


def test_a_plain_failure_is_not_retried():
    clock = FakeClock()
    check = Check(DOWN, UP)
    probe = make(check, clock)
    assert not probe.verdict().ok and check.bounds == [3]


def test_mark_down_flips_now_and_recovers_after_the_ttl():
    clock = FakeClock()
    changes: list[tuple[bool | None, bool]] = []
    probe = make(
        Check(UP),
        clock,
        on_change=lambda old, new: changes.append((None if old is None else old.ok, new.ok)),
    )
    assert probe.verdict().ok
    probe.mark_down("manager vanished")
    assert probe.verdict().ok is False and probe.verdict().detail == "manager vanished"
    assert probe.runs == 1
    clock.advance(60)
    assert probe.verdict().ok and probe.runs == 2
    assert changes == [(None, True), (True, False), (False, True)]
