"""`dispatch events` and `dispatch run --notify/--heartbeat/--watch` as a user meets them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import dispatch_text as dispatch
from tests.support.cli import state_env
from tests.support.procs import stop_child
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parent.parent
EVENT_KEYS = {
    "id",
    "seq",
    "type",
    "session_id",
    "owner",
    "exit_code",
    "signal",
    "completion_reason",
    "output",
    "output_cut",
    "created_at",
}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return state_env(tmp_path)


def events(env: dict[str, str], *args: str) -> list[dict[str, object]]:
    done = dispatch(env, "events", "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_notify_list_and_acknowledge(env: dict[str, str]) -> None:
    run = dispatch(env, "run", "--notify", "--wait", "--", "sh", "-c", "echo hi; exit 3")
    assert run.returncode == 3, run.stderr
    sid = run.stdout.strip()
    (event,) = events(env)
    assert set(event) >= EVENT_KEYS
    assert event["type"] == "completion" and event["session_id"] == sid
    assert (event["exit_code"], event["signal"], event["output"]) == (3, None, "hi\n")
    assert event["output_cut"] == 0 and event["seq"] == 1
    assert str(event["owner"]).startswith("cli:")
    assert str(event["created_at"])[-6] in "+-"  # ISO-8601 with a numeric offset
    assert events(env, "--owner", "kanban") == []
    assert len(events(env, "--owner", "cli")) == 1
    eid = str(event["id"])
    acked = dispatch(env, "events", "--ack", eid)
    assert acked.returncode == 0 and eid in acked.stdout
    assert events(env) == []
    again = dispatch(env, "events", "--ack", eid)  # harmless
    assert again.returncode == 0 and "already" in again.stdout
    assert [e["id"] for e in events(env, "--all")] == [eid]
    unknown = dispatch(env, "events", "--ack", "e_0000000000000000")
    assert unknown.returncode == 2
    assert len(unknown.stderr.strip().splitlines()) == 1 and "e_0000000000000000" in unknown.stderr


def test_a_completion_nobody_followed_is_published_when_events_are_read(
    env: dict[str, str],
) -> None:
    run = dispatch(env, "run", "--notify", "--", "sh", "-c", "echo later")
    assert run.returncode == 0, run.stderr
    sid = run.stdout.strip()
    record = Path(env["DISPATCH_STATE_DIR"]) / "sessions" / sid / "exit.json"
    wait_for(record.exists, 10, what="the exit record")
    # No gateway and the launcher is gone: reading the events reconciles the recorded end.
    (event,) = events(env)
    assert event["session_id"] == sid and event["output"] == "later\n"


def test_follow_prints_new_events_as_json_lines(env: dict[str, str]) -> None:
    follower = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli.main", "events", "--follow", "--json"],
        stdout=subprocess.PIPE,
        env=env,
        cwd=ROOT,
        text=True,
    )
    try:
        run = dispatch(env, "run", "--notify", "--wait", "--", "sh", "-c", "exit 0")
        assert run.returncode == 0, run.stderr
        assert follower.stdout is not None
        line = follower.stdout.readline()  # bounded: the follower polls every 0.5 s
        event = json.loads(line)
        assert event["session_id"] == run.stdout.strip() and event["type"] == "completion"
    finally:
        stop_child(follower)


def test_run_flags_are_checked_and_explained(env: dict[str, str]) -> None:
    bad = dispatch(env, "run", "--heartbeat", "soon", "--", "true")
    assert bad.returncode == 2 and "--heartbeat" in bad.stderr
    regex = dispatch(env, "run", "--watch-regex", "(", "--", "true")
    assert regex.returncode == 2 and "invalid watch regex" in regex.stderr
    run = dispatch(env, "run", "--heartbeat", "5", "--watch", "x", "--", "true")
    assert run.returncode == 0, run.stderr
    assert "floor of 60s" in run.stderr and "--wait or --follow" in run.stderr
