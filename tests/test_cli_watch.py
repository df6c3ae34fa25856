"""``--watch``: redrawn in place on a real terminal (a PTY), one snapshot per change into a
pipe, and Ctrl-C ends it with exit 130 and nothing on stderr."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ptyprocess import PtyProcess

from tests.support.cli import dispatch_text as dispatch
from tests.support.cli import state_env
from tests.support.procs import default_signals
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return state_env(tmp_path, PYTHONPATH=str(ROOT), TZ="UTC")


@pytest.mark.parametrize("view", [["ps", "--all"], ["kanban", "board"], ["status"]])
def test_on_a_terminal_the_view_is_redrawn_in_place_and_ctrl_c_exits_130(
    env: dict[str, str], view: list[str]
) -> None:
    assert dispatch(env, "run", "--wait", "--", "echo", "hi").returncode == 0
    argv = [sys.executable, "-m", "dispatcher.cli.main", *view, "--watch", "--interval", "0.2"]
    proc = PtyProcess.spawn(
        argv, env=env, cwd=str(ROOT), dimensions=(40, 200), preexec_fn=default_signals
    )
    seen = b""
    try:

        def redrawn_twice() -> bool:
            nonlocal seen
            if proc.isalive():
                try:
                    seen += proc.read(65536)
                except EOFError:
                    return False
            return seen.count(b"\x1b[H") >= 2

        wait_for(redrawn_twice, 30, what="two redraws")
        text = seen.decode(errors="replace")
        assert "every 0.2s: dispatch" in text
        assert "\x1b[K" in text and "\x1b[J" in text  # lines and the rest cleared, no scrolling
        proc.write(b"\x03")  # Ctrl-C through the terminal's line discipline

        def ended() -> bool:
            # Keep reading, as a terminal does: a full PTY buffer would block the writer.
            ready, _, _ = select.select([proc.fd], [], [], 0.05)
            if ready:
                with contextlib.suppress(OSError):
                    os.read(proc.fd, 65536)
            return not proc.isalive()

        wait_for(ended, 20, what="exit after Ctrl-C")
        assert proc.exitstatus == 130
        assert b"Traceback" not in seen and b"interrupted" not in seen
    finally:
        if proc.isalive():
            proc.terminate(force=True)


def test_into_a_pipe_only_changes_are_printed(env: dict[str, str]) -> None:
    first = dispatch(env, "run", "--wait", "--", "echo", "one")
    assert first.returncode == 0
    watcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dispatcher.cli.main",
            "ps",
            "--all",
            "--watch",
            "--interval",
            "0.2",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,
    )
    assert watcher.stdout is not None and watcher.stderr is not None
    try:
        header = watcher.stdout.readline()
        assert header.startswith("ID ")
        assert first.stdout.strip() in watcher.stdout.readline()
        time.sleep(1.0)  # several intervals pass with nothing new: nothing may be printed
        second = dispatch(env, "run", "--wait", "--", "echo", "two").stdout.strip()
        # The next snapshot: a blank separator line, the header, both sessions.
        assert watcher.stdout.readline() == "\n"
        assert watcher.stdout.readline().startswith("ID ")
        assert second in watcher.stdout.readline()
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=20) == 130
        assert watcher.stderr.read() == ""
        assert "\x1b[" not in watcher.stdout.read()
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait(timeout=10)
        watcher.stdout.close()
        watcher.stderr.close()


def test_interval_is_bounded(env: dict[str, str]) -> None:
    for bad in ("0", "0.01", "2h", "soon"):
        done = dispatch(env, "ps", "--watch", "--interval", bad)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    done = dispatch(env, "ps", "--interval", "1")
    assert done.returncode == 2 and "--interval needs --watch" in done.stderr
