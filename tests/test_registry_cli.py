"""`dispatch run/ps/logs/kill/wait` as a user meets them: real `dispatch` processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import dispatch_bytes as dispatch
from tests.support.cli import state_env
from tests.support.procs import default_signals
from tests.support.wait import wait_for
from tests.test_registry_support import session_pids

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return state_env(tmp_path)


def test_run_wait_passes_the_exit_code_through(env: dict[str, str]) -> None:
    done = dispatch(env, "run", "--wait", "--", "sh", "-c", "exit 7")
    assert done.returncode == 7, done.stderr
    (line,) = done.stdout.decode().splitlines()
    assert line.startswith("s_") and len(line) == 14
    assert b"Traceback" not in done.stderr


def test_run_prints_only_the_id_and_logs_are_raw(env: dict[str, str]) -> None:
    done = dispatch(env, "run", "--", "sh", "-c", "printf 'a\\000b\\377\\n'; echo err >&2")
    assert done.returncode == 0, done.stderr
    session_id = done.stdout.decode().strip()
    assert "\n" not in session_id
    waited = dispatch(env, "wait", session_id, "--timeout", "20")
    assert waited.returncode == 0, waited.stderr
    logs = dispatch(env, "logs", session_id)
    assert logs.returncode == 0
    assert logs.stdout == b"a\x00b\xff\nerr\n"
    tail = dispatch(env, "logs", session_id[:6], "--tail", "1")
    assert tail.stdout == b"err\n"


def test_logs_of_an_unknown_id_is_one_line_exit_2(env: dict[str, str]) -> None:
    done = dispatch(env, "logs", "nosuch")
    assert done.returncode == 2
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and "nosuch" in lines[0]
    assert done.stdout == b""


def test_short_prefix_is_a_usage_error(env: dict[str, str]) -> None:
    done = dispatch(env, "wait", "s_a")
    assert done.returncode == 2
    assert "at least 4 characters" in done.stderr.decode()


def test_signal_exit_status_and_failed_start(env: dict[str, str]) -> None:
    killed = dispatch(env, "run", "--wait", "--", "sh", "-c", "kill -TERM $$")
    assert killed.returncode == 128 + signal.SIGTERM
    missing = dispatch(env, "run", "--wait", "--", "no-such-program-xyz")
    assert missing.returncode == 127
    assert "no-such-program-xyz" in missing.stderr.decode()


def test_run_wait_timeout_exits_124_and_the_worker_keeps_running(env: dict[str, str]) -> None:
    done = dispatch(env, "run", "--wait", "--timeout", "0.3", "--", "sleep", "30")
    assert done.returncode == 124
    session_id = done.stdout.decode().strip()
    assert session_pids(session_id)
    ps = dispatch(env, "ps", "--json")
    rows = json.loads(ps.stdout)
    assert [r["id"] for r in rows] == [session_id]
    row = rows[0]
    assert set(row) == {
        "id", "state", "argv", "pid", "placement", "unit", "owner", "started_at",
        "finished_at", "exit_code", "signal", "completion_reason", "log_path",
    }  # fmt: skip
    assert row["state"] == "running" and row["argv"] == ["sleep", "30"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", row["started_at"])
    killed = dispatch(env, "kill", session_id[2:8], "--grace", "1")
    assert killed.returncode == 0, killed.stderr
    assert b"killed" in killed.stdout
    assert session_pids(session_id) == []
    again = dispatch(env, "--json", "kill", session_id)
    assert again.returncode == 0
    assert json.loads(again.stdout)["state"] == "killed"
    assert json.loads(again.stdout)["signal"] == "SIGTERM"
    waited = dispatch(env, "wait", session_id, "--json")
    assert waited.returncode == 128 + signal.SIGTERM
    assert json.loads(waited.stdout)["outcome"] == "finished"


def test_run_follow_streams_output(env: dict[str, str]) -> None:
    done = dispatch(
        env, "run", "--follow", "--", "sh", "-c", "echo one; sleep 0.2; echo two; exit 3"
    )
    assert done.returncode == 3
    assert done.stdout == b"one\ntwo\n"
    assert b"session s_" in done.stderr


def test_ps_all_and_shell_and_cwd(env: dict[str, str], tmp_path: Path) -> None:
    done = dispatch(env, "run", "--wait", "--shell", "--cwd", str(tmp_path), "--", "pwd; exit 0")
    assert done.returncode == 0
    session_id = done.stdout.decode().strip()
    assert dispatch(env, "logs", session_id).stdout == f"{tmp_path}\n".encode()
    table = dispatch(env, "ps", "--all").stdout.decode()
    assert session_id in table and "exited" in table
    assert dispatch(env, "ps").stdout.decode().startswith("no running sessions")
    bad = dispatch(env, "run", "--shell", "--", "echo", "hi")
    assert bad.returncode == 2


def test_ctrl_c_on_wait_exits_130_and_leaves_the_worker(env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli.main", "run", "--wait", "--", "sleep", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
        preexec_fn=default_signals,  # Ctrl-C must work when the suite runs as a background job
    )
    assert proc.stdout is not None
    session_id = proc.stdout.readline().decode().strip()
    wait_for(lambda: session_pids(session_id), 10, what="worker")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 130
    proc.stdout.close()
    assert proc.stderr is not None
    proc.stderr.close()
    assert session_pids(session_id)
    assert dispatch(env, "kill", session_id).returncode == 0


def test_logs_follow_passes_the_workers_status_through(env: dict[str, str]) -> None:
    session_id = dispatch(env, "run", "--", "sh", "-c", "echo one; sleep 0.3; echo two; exit 4")
    sid = session_id.stdout.decode().strip()
    followed = dispatch(env, "logs", "-f", sid)
    assert followed.returncode == 4, followed.stderr
    assert followed.stdout == b"one\ntwo\n"
    streamed = dispatch(env, "logs", "-f", "--json", sid)
    assert streamed.returncode == 4, streamed.stderr
    lines = [json.loads(line) for line in streamed.stdout.decode().splitlines()]
    assert "".join(line.get("output", "") for line in lines[:-1]) == "one\ntwo\n"
    assert lines[-1]["id"] == sid and lines[-1]["exit_code"] == 4
    assert lines[-1]["state"] == "exited"
    assert dispatch(env, "logs", sid).returncode == 0  # without -f: the log was printed


@pytest.mark.parametrize("json_output", [False, True], ids=["plain", "json"])
def test_a_closed_stdout_ends_every_format_the_same_way(
    env: dict[str, str], json_output: bool
) -> None:
    assert dispatch(env, "run", "--wait", "--", "echo", "x").returncode == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte: `| head -c0` at its most
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dispatcher.cli.main", "ps", "--all"]
            + (["--json"] if json_output else []),
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=env,
            cwd=ROOT,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141
    assert done.stderr == b""


def test_run_env_sets_the_workers_environment_and_checks_names(env: dict[str, str]) -> None:
    done = dispatch(
        env,
        "run",
        "--wait",
        "-e",
        "GREETING=hi=there",
        "--env",
        "EMPTY=",
        "--",
        "sh",
        "-c",
        'printf "%s|%s|%s" "$GREETING" "${EMPTY-unset}" "${DISPATCH_SESSION_ID%_*}"',
    )
    assert done.returncode == 0, done.stderr
    sid = done.stdout.decode().strip()
    assert dispatch(env, "logs", sid).stdout == b"hi=there||s"
    for bad in ("1X=a", "NO_EQUALS", "A-B=c", "=v", "DISPATCH_SESSION_ID=x"):
        refused = dispatch(env, "run", "--env", bad, "--", "true")
        assert refused.returncode == 2, (bad, refused.stderr)
        assert len(refused.stderr.splitlines()) == 1 and b"--env" in refused.stderr


def test_logs_since_and_timestamps_use_the_keepers_output_times(
    env: dict[str, str], tmp_path: Path
) -> None:
    import datetime as dt
    import time

    gate = tmp_path / "gate"
    script = (
        f"echo one; printf 'half'; while [ ! -e {gate} ]; do sleep 0.02; done; "
        "echo ' line'; echo two"
    )
    started = dispatch(env, "run", "--", "sh", "-c", script)
    session_id = started.stdout.decode().strip()
    state = Path(env["DISPATCH_STATE_DIR"])
    log = state / "sessions" / session_id / "output.log"
    wait_for(lambda: log.exists() and b"half" in log.read_bytes(), 10, what="first output")
    noted = log.with_name("output.times")
    first = float(noted.read_text().splitlines()[-1].split()[1])
    # The keeper notes a time at most every 50 ms: let the clock pass that step (bounded).
    wait_for(lambda: time.time() > first + 0.1, 5, what="the clock past the first note")
    moment = time.time()
    gate.touch()
    assert dispatch(env, "wait", session_id, "--timeout", "20").returncode == 0

    since = dt.datetime.fromtimestamp(moment).astimezone().isoformat()
    selected = dispatch(env, "logs", session_id, "--since", since)
    assert selected.returncode == 0, selected.stderr
    # "half line" began before the moment, so only the line that began after it is shown.
    assert selected.stdout == b"two\n"
    assert dispatch(env, "logs", session_id, "--since", "1h").stdout == log.read_bytes()

    stamped = dispatch(env, "logs", session_id, "--timestamps").stdout.decode().splitlines()
    assert [line.split(" ", 1)[1] for line in stamped] == ["one", "half line", "two"]
    times = [dt.datetime.fromisoformat(line.split(" ", 1)[0]).timestamp() for line in stamped]
    # A line's time is that of the note before its first byte (notes come 50 ms apart at most).
    assert times[0] <= times[1] <= first + 0.001 < moment <= times[2] + 0.001
    bad = dispatch(env, "logs", session_id, "--since", "yesterday")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
