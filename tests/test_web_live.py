"""A real ``dispatch web`` process: live pushes over SSE (the board, resuming, a worker's log),
its start-up errors, a clean stop, and where the secret is (not) printed."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.browser import SseReader, WebHome, WebProcess, run_web
from tests.support.cli import run_dispatch

PRINTER = (
    "i=0; while [ $i -lt 40 ]; do i=$((i+1)); "
    "printf '\\\\033[1;32mline %s <script>x</script>\\\\033[0m\\\\n' $i; sleep 0.1; done"
)
CONFIG = f"""
kanban:
  degrade_without_scope: true
  assignees:
    echo:
      command: ["sh", "-c", "echo hi"]
    printer:
      command: ["sh", "-c", "{PRINTER}"]
"""


Home = WebHome


@pytest.fixture
def home(tmp_path: Path) -> WebHome:
    return WebHome(tmp_path, CONFIG)


@pytest.fixture
def web(home: Home) -> Iterator[WebProcess]:
    process = WebProcess(home.config, home.state, home.env)
    try:
        yield process
    finally:
        assert process.stop() == 0, process.errors


def _stream_of(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as answer:
        html = answer.read().decode()
    match = re.search(r'data-stream="([^"]+)"', html)
    assert match, "the page names no stream"
    return match.group(1).replace("&amp;", "&")


def test_a_card_added_with_the_cli_is_pushed_within_a_second(home: Home, web: WebProcess) -> None:
    stream = SseReader(web.url + _stream_of(web.url + "/"))
    try:
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        # Asked for gzip (as a browser asks), the stream is sent as it is: every message now.
        assert "content-encoding" not in stream.headers
        added = home.dispatch("kanban", "add", "from the CLI", "--assignee", "echo")
        exited = time.monotonic()
        card = added.stdout.strip()
        event = stream.next("cards", timeout=10)
        arrived = time.monotonic()
        assert [c["id"] for c in event["data"]["cards"]] == [card]
        assert event["data"]["cards"][0]["status"] == "ready"
        assert "from the CLI" in event["data"]["cards"][0]["html"]
        assert event["data"]["counts"]["ready"] == 1
        assert arrived - exited <= 1.0
        # The same path the CLI takes, timed from its commit.
        second, committed = home.add_fast("timed")
        event = stream.next("cards", timeout=10)
        assert [c["id"] for c in event["data"]["cards"]] == [second]
        assert time.monotonic() - committed <= 1.0
    finally:
        stream.close()


def test_a_reconnect_with_last_event_id_gets_what_it_missed(home: Home, web: WebProcess) -> None:
    first = home.dispatch("kanban", "add", "first", "--assignee", "echo").stdout.strip()
    stream = SseReader(web.url + "/live/board?after=0")
    seen = stream.next("cards")
    stream.close()
    assert [c["id"] for c in seen["data"]["cards"]] == [first]
    missed = [
        home.dispatch("kanban", "add", title, "--assignee", "echo").stdout.strip()
        for title in ("second", "third")
    ]
    again = SseReader(web.url + "/live/board?after=0", {"Last-Event-ID": seen["id"]})
    try:
        caught = again.next("cards")
        assert sorted(c["id"] for c in caught["data"]["cards"]) == sorted(missed)
        assert int(caught["id"]) > int(seen["id"])
    finally:
        again.close()


def test_a_workers_log_is_followed_live_and_made_inert(home: Home, web: WebProcess) -> None:
    card = home.dispatch("kanban", "add", "prints", "--assignee", "printer").stdout.strip()
    stream = SseReader(web.url + _stream_of(f"{web.url}/cards/{card}"))
    try:
        assert "content-encoding" not in stream.headers
        home.dispatch("kanban", "tick")
        regions = stream.next("regions", timeout=15)
        assert "card-head" in regions["data"] and "running" in regions["data"]["card-head"]
        texts = []
        while len("".join(texts).splitlines()) < 40:
            event = stream.next("log", timeout=15)
            texts.append(event["data"]["text"])
        joined = "".join(texts)
        assert "line 1 <script>x</script>\n" in joined and "line 40 " in joined
        assert "\x1b" not in joined and "[1;32m" not in joined
        assert len(texts) > 2  # it came as it was printed, not all at the end
        stream.next("logend", timeout=15)
    finally:
        stream.close()


def test_sigterm_stops_it_with_streams_open(home: Home) -> None:
    process = WebProcess(home.config, home.state, home.env)
    stream = SseReader(process.url + "/live/board?after=0")
    started = time.monotonic()
    assert process.stop(timeout=10) == 0
    assert time.monotonic() - started < 8
    stream.close()
    assert not [line for line in process.errors if "Traceback" in line]


def test_the_secret_is_kept_out_of_the_journal_and_url_prints_it(home: Home) -> None:
    journal = {**home.env, "JOURNAL_STREAM": "8:1234"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dispatcher.cli.main",
            "--config",
            str(home.config),
            "--state-dir",
            str(home.state),
            "web",
            "--listen",
            "127.0.0.1:0",
        ],
        env=journal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline(), process.stdout.readline()]
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    secret = (home.state / "web-secret").read_text().strip()
    assert "serving" in lines[0] and "dispatch web --url" in lines[1]
    assert secret not in "".join(lines) + out + err
    shown = run_web(home.config, home.state, home.env, "--url")
    assert (
        shown.returncode == 0 and shown.stdout.strip() == f"http://127.0.0.1:8470/?token={secret}"
    )


def test_a_port_in_use_is_one_line_and_exit_1(home: Home) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = run_web(home.config, home.state, home.env, "--listen", f"127.0.0.1:{port}")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"dispatch: error: cannot listen on 127.0.0.1:{port}: the address is already in use; "
        "stop the other server or pass --listen with another port"
    ]


@pytest.mark.parametrize(
    ("listen", "words"),
    [
        ("0.0.0.0:0", "not a loopback address"),
        ("8470", "write it as HOST:PORT"),
        ("127.0.0.1:99999", "port 99999 is out of range"),
        ("no-such-host.invalid:8470", "cannot resolve"),
    ],
)
def test_a_bad_or_remote_listen_is_refused_with_exit_2(home: Home, listen: str, words: str) -> None:
    done = run_web(home.config, home.state, home.env, "--listen", listen)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith(f"dispatch: error: --listen {listen}: ") and words in line


def test_allow_remote_serves_but_every_page_needs_the_secret(home: Home) -> None:
    process = WebProcess(home.config, home.state, home.env, "--allow-remote", listen="0.0.0.0:0")
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(process.url + "/", timeout=30)
        assert refused.value.code == 401
        secret = (home.state / "web-secret").read_text().strip()
        request = urllib.request.Request(
            process.url + "/metrics", headers={"Authorization": f"Bearer {secret}"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200 and b"dispatch_cards" in answer.read()
    finally:
        assert process.stop() == 0


def test_an_unusable_state_dir_gives_the_clis_one_line_errors(home: Home) -> None:
    blocker = home.root / "not-a-dir"
    blocker.write_text("")
    for state in (blocker, home.root / "not-a-dir" / "below"):
        cli = run_dispatch(home.config, state, home.env, "kanban", "list", check=False)
        web = run_web(home.config, state, home.env, "--listen", "127.0.0.1:0")
        assert web.returncode == cli.returncode != 0
        assert web.stderr == cli.stderr and len(web.stderr.splitlines()) == 1
        assert "Traceback" not in web.stderr


def test_a_state_dir_of_another_user_gives_the_clis_error(home: Home) -> None:
    import os
    import pwd

    if os.geteuid() != 0:
        pytest.skip("needs root to give the state dir to another user")
    home.dispatch("kanban", "list")
    nobody = pwd.getpwnam("nobody")
    os.chown(home.state, nobody.pw_uid, nobody.pw_gid)
    try:
        cli = home.dispatch("kanban", "list", check=False)
        web = run_web(home.config, home.state, home.env, "--listen", "127.0.0.1:0")
        assert web.returncode == cli.returncode != 0
        assert web.stderr == cli.stderr and len(web.stderr.splitlines()) == 1
        assert not (home.state / "web-secret").exists()  # nothing written into it
    finally:
        os.chown(home.state, 0, 0)
