"""The cron waker under a storm of wake requests: real APScheduler, real threads.

A wake job replaced or removed while APScheduler itself removes it after running it used to
raise ``JobLookupError`` in APScheduler's thread, which ends every later wake-up. The waker
never touches a job once armed, so the thread survives any number of early wake requests and
every request is answered by a step.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from dispatcher.cron.scheduler import TickReport
from dispatcher.cron.waker import CronWaker
from scope.foundation.clock import SystemClock
from tests.support.wait import wait_for


@dataclass
class CountingScheduler:
    """Stands in for CronScheduler: counts steps and asks for the next one soon."""

    clock: SystemClock = field(default_factory=SystemClock)
    wake_interval: float = 30.0
    steps: int = 0
    requests: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def use_executor(self, executor: object) -> None:
        pass

    def on_wake_request(self, callback: Any) -> None:
        self.requests = callback

    def catch_up(self) -> TickReport:
        return TickReport(now=self.clock.time(), next_wake=self.clock.time())

    def step(self, now: float) -> float:
        with self.lock:
            self.steps += 1
        return now + 0.002  # due again almost at once: arms job after job

    def stop(self) -> None:
        pass


def test_a_storm_of_wake_requests_never_stops_the_wakes(leak_guard) -> None:
    scheduler = CountingScheduler()
    waker = CronWaker(scheduler, spawn_threads=0)  # type: ignore[arg-type]
    waker.start()
    try:
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                waker.request(scheduler.clock.time())

        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            stop.wait(0.05)
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        aps_thread = waker._aps._thread
        assert aps_thread is not None and aps_thread.is_alive()
        # Wakes still arrive after the storm.
        before = scheduler.steps
        wait_for(lambda: scheduler.steps > before + 10, 10, what="wakes after the storm")
    finally:
        waker.stop()


def test_a_wake_job_removed_after_shutdown_is_no_error_in_apschedulers_thread() -> None:
    """APScheduler removes a date job after it ran; when ``shutdown`` marked the scheduler
    stopped in between, its ``remove_job`` raised ``JobLookupError`` in the scheduler thread
    (seen at a gateway's stop). Stopped, a missing job is no error; running, it still is."""
    import datetime as dt

    import pytest
    from apscheduler.jobstores.base import JobLookupError

    from dispatcher.cron.waker import _Scheduler

    aps = _Scheduler(timezone=dt.UTC)
    aps.start()
    try:
        with pytest.raises(JobLookupError):
            aps.remove_job("dispatch-cron-wake-missing")
    finally:
        aps.shutdown(wait=True)
    aps.remove_job("dispatch-cron-wake-missing")  # what the scheduler thread does at the race
