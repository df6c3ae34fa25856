"""The small test helpers themselves: bounded polling and process identity."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.leaks import LeakGuard
from tests.support.procs import (
    ProcessIdentity,
    identify,
    is_alive,
    start_time,
    stop_child,
    terminate,
)
from tests.support.wait import WaitTimeout, wait_for

IGNORES_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_wait_for_returns_the_truthy_value() -> None:
    calls = iter([0, [], [3]])
    assert wait_for(lambda: next(calls), timeout=5) == [3]


def test_wait_for_times_out_with_what_and_last_value() -> None:
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"after 0.1 s waiting for the moon \(last value: 0\)"):
        wait_for(lambda: 0, timeout=0.1, what="the moon")
    assert time.monotonic() - started < 1.0


def test_wait_for_checks_once_even_with_zero_timeout() -> None:
    assert wait_for(lambda: "now", timeout=0) == "now"


def test_identity_of_this_process() -> None:
    me = identify(os.getpid())
    assert me.start_time == start_time(os.getpid()) and is_alive(me)
    assert not is_alive(ProcessIdentity(pid=me.pid, start_time=me.start_time + 1))
    assert ProcessIdentity.from_json(me.to_json()) == me


def test_missing_process_has_no_identity() -> None:
    assert start_time(2**22 + 1) is None
    with pytest.raises(ProcessLookupError):
        identify(2**22 + 1)


def test_terminate_a_non_child_and_refuse_a_stale_identity(leak_guard: LeakGuard) -> None:
    # sh prints the pid of a background sleep and exits: the sleep is re-parented, not our child.
    out = subprocess.run(
        ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        timeout=5,
        check=True,
    )
    orphan = identify(int(out.stdout))
    stale = ProcessIdentity(pid=orphan.pid, start_time=orphan.start_time - 1)
    assert terminate(stale, grace=0.1, kill_after=0.1)  # "gone": that process no longer exists
    assert is_alive(orphan), "a stale identity must not be signalled"
    assert terminate(orphan, grace=5, kill_after=5)
    assert not is_alive(orphan)


def test_stop_child_escalates_to_sigkill(leak_guard: LeakGuard) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE, text=True
    )
    with child:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        assert stop_child(child, grace=0.2, kill_after=5) == -signal.SIGKILL
