"""The short-write relay (issue 26): ``dispatch kanban add`` and a worker's reports answered
by the gateway of their state dir, and run by the command itself whenever the gateway has not
started them. Real sockets, real ``dispatch`` processes, the gateway's real relay threads; the
fake gateways stand in for a gateway that dies at a given point or runs as another user."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.app.database import open_state
from dispatcher.app.relay import (
    decode_request,
    encode_request,
    expand,
    relay_address,
    state_dir_text,
)
from dispatcher.cli.relay_server import RelayServer
from dispatcher.kanban.model import Limits, NewCard
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.claimant import Claimant
from dispatcher.paths import resolve_state_dir

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "kanban:\n  assignees:\n    w:\n      command: [sh, -c, ':']\n"
NOBODY = 65534


class Board:
    """A state dir and config, with a current config snapshot (one card added locally)."""

    def __init__(self, tmp_path: Path) -> None:
        self.config = tmp_path / "config.yaml"
        self.config.write_text(CONFIG)
        self.state = tmp_path / "state"
        self.cwd = tmp_path
        self.env = {
            **os.environ,
            "DISPATCH_CONFIG": str(self.config),
            "DISPATCH_STATE_DIR": str(self.state),
            "PYTHONPATH": str(ROOT),
        }
        for name in ("DISPATCH_RELAY", "DISPATCH_FAST_PATH", "DISPATCH_DATABASE_URL"):
            self.env.pop(name, None)
        assert self.run("kanban", "add", "first", "--assignee", "w", relay=False).returncode == 0

    def run(
        self, *argv: str, relay: bool = True, extra: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``dispatch ARGV`` in its own process (``relay=False``: ``DISPATCH_RELAY=0``)."""
        env = {**self.env, **(extra or {})}
        if not relay:
            env["DISPATCH_RELAY"] = "0"
        return subprocess.run(
            [sys.executable, "-m", "dispatcher.cli.main", *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=self.cwd,
            timeout=60,
            check=False,
        )

    def titles(self) -> list[str]:
        """Every card's title, oldest first."""
        done = self.run("kanban", "list", "--json", relay=False)
        assert done.returncode == 0, done.stderr
        return [card["title"] for card in json.loads(done.stdout)]


@pytest.fixture()
def board(tmp_path: Path) -> Board:
    return Board(tmp_path)


@pytest.fixture()
def gateway(board: Board) -> Iterator[RelayServer]:
    server = RelayServer(board.state)
    try:
        yield server
    finally:
        server.close()


# -- the wire format and the paths -----------------------------------------------------------

texts = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)))


@given(
    cwd=texts,
    argv=st.lists(texts, max_size=6),
    environ=st.dictionaries(texts.filter(lambda n: n and "=" not in n), texts, max_size=6),
)
def test_a_request_decodes_to_what_was_encoded(
    cwd: str, argv: list[str], environ: dict[str, str]
) -> None:
    assert decode_request(encode_request(cwd, argv, environ)) == (cwd, argv, environ)


@pytest.mark.parametrize(
    "data",
    [b"", b"dispatch-relay/2\0/\x000", b"dispatch-relay/1\0/\0x", b"dispatch-relay/1\0/\x003\0a"],
)
def test_what_is_not_a_request_decodes_to_nothing(data: bytes) -> None:
    assert decode_request(data) is None


def test_paths_are_read_as_the_command_would(tmp_path: Path) -> None:
    env = {"HOME": "/home/u"}
    assert expand("~/s", env, "/w") == "/home/u/s"
    assert expand("s/../t", env, "/w") == "/w/t"
    assert expand("/abs", env, "/w") == "/abs"
    assert expand("~other/s", env, "/w") is None
    assert expand("~/s", {}, "/w") is None


@pytest.mark.parametrize(
    "explicit, environ",
    [
        (None, {"HOME": "/h"}),
        (None, {"HOME": "/h", "XDG_STATE_HOME": "/x"}),
        (None, {"HOME": "/h", "XDG_STATE_HOME": "relative"}),
        ("/abs/state", {}),
        (None, {"DISPATCH_STATE_DIR": "/env/state", "HOME": "/h"}),
        ("/given", {"DISPATCH_STATE_DIR": "/env/state"}),
    ],
)
def test_the_command_finds_the_state_dir_the_cli_would_use(
    explicit: str | None, environ: dict[str, str]
) -> None:
    want = os.path.realpath(resolve_state_dir(explicit, environ))
    assert state_dir_text(explicit, environ, "/") == want


# -- the gateway answers ------------------------------------------------------------------------


def test_kanban_add_is_answered_by_the_gateway(board: Board, gateway: RelayServer) -> None:
    done = board.run("kanban", "add", "relayed", "--assignee", "w")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("c_") and done.stderr == ""
    assert gateway.stats() == {"answered": 1, "declined": {}}
    assert board.titles() == ["first", "relayed"]


def test_a_relayed_command_imports_neither_the_board_nor_the_database(
    board: Board, gateway: RelayServer
) -> None:
    probe = "import runpy,sys; sys.argv=['dispatch',*sys.argv[1:]]\ntry:\n"
    probe += " runpy.run_module('dispatcher.cli.main', run_name='__main__')\n"
    probe += "except SystemExit: pass\nsys.stderr.write(' '.join(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", probe, "kanban", "add", "x", "--assignee", "w"],
        capture_output=True,
        text=True,
        env=board.env,
        cwd=board.cwd,
        timeout=60,
        check=False,
    )
    modules = set(done.stderr.split())
    assert "dispatcher.app.relay" in modules and gateway.stats()["answered"] == 1
    assert not modules & {"sqlite3", "dispatcher.kanban.store", "json", "dataclasses"}


def test_errors_are_the_ones_the_command_prints_itself(board: Board, gateway: RelayServer) -> None:
    argv = ("kanban", "add", "t", "--assignee", "nobody")
    relayed, local = board.run(*argv), board.run(*argv, relay=False)
    assert (relayed.returncode, relayed.stdout, relayed.stderr) == (
        local.returncode,
        local.stdout,
        local.stderr,
    )
    assert relayed.returncode == 2 and "no assignee 'nobody'" in relayed.stderr
    assert gateway.stats()["answered"] == 1


def test_a_workers_report_is_answered_with_its_json(board: Board, gateway: RelayServer) -> None:
    card, run = claimed(board)
    worker = {"DISPATCH_CARD_ID": card, "DISPATCH_RUN_ID": run, "DISPATCH_HOST_ID": "h"}
    done = board.run("--json", "kanban", "complete", extra=worker)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "done"
    assert gateway.stats()["answered"] == 1


def claimed(board: Board) -> tuple[str, str]:
    """A new card claimed through the board store, as a dispatcher would: (card, run)."""
    db = open_state(board.state)
    try:
        store, now = SqliteBoardStore(db), time.time()
        card, _ = store.add_card(NewCard(title="job", assignee="w"), now=now)
        limits = Limits(max_in_progress=10**9)
        claim = store.claim(card.id, now=now, claimer=Claimant.current(), limits=limits)
        return card.id, claim.run.run_id
    finally:
        db.close()


# -- the gateway declines, and the command runs itself ---------------------------------------


def test_a_changed_config_is_declined_and_the_command_reads_it(
    board: Board, gateway: RelayServer
) -> None:
    board.config.write_text(CONFIG + "    v:\n      command: [sh, -c, ':']\n")
    done = board.run("kanban", "add", "new", "--assignee", "v")
    assert done.returncode == 0, done.stderr
    assert gateway.stats() == {"answered": 0, "declined": {"config": 1}}
    assert board.titles() == ["first", "new"]
    # The command left a snapshot of the new file: the next one is answered.
    assert board.run("kanban", "add", "next", "--assignee", "v").returncode == 0
    assert gateway.stats()["answered"] == 1


def test_a_time_zone_of_its_own_is_declined_and_read_by_the_command(
    board: Board, gateway: RelayServer
) -> None:
    zone = "Asia/Kathmandu" if os.environ.get("TZ") != "Asia/Kathmandu" else "America/St_Johns"
    card, run = claimed(board)
    worker = {"DISPATCH_CARD_ID": card, "DISPATCH_RUN_ID": run, "DISPATCH_HOST_ID": "h"}
    done = board.run("kanban", "defer", "--until", "2099-01-02T03:04", extra={**worker, "TZ": zone})
    assert done.returncode == 0, done.stderr
    assert gateway.stats() == {"answered": 0, "declined": {"time zone": 1}}
    offset = "+05:45" if zone == "Asia/Kathmandu" else "-03:30"
    assert done.stdout == f"{card} deferred until 2099-01-02T03:04:00{offset}\n"


def test_another_state_dir_never_reaches_this_gateway(
    board: Board, gateway: RelayServer, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    done = board.run("--state-dir", str(other), "kanban", "add", "x", "--assignee", "w")
    assert done.returncode == 0, done.stderr
    assert gateway.stats() == {"answered": 0, "declined": {}}


def test_a_relative_state_dir_is_read_from_the_commands_directory(
    board: Board, gateway: RelayServer
) -> None:
    done = board.run("kanban", "add", "rel", "--assignee", "w", "--state-dir", "state")
    assert done.returncode == 0, done.stderr
    assert gateway.stats()["answered"] == 1


def test_a_body_from_stdin_stays_with_the_command(board: Board, gateway: RelayServer) -> None:
    body = board.cwd / "body.txt"
    body.write_text("words")
    done = board.run("kanban", "add", "b", "--assignee", "w", "--body-file", str(body))
    assert done.returncode == 0, done.stderr
    assert gateway.stats() == {"answered": 0, "declined": {}}


def test_an_unparsed_command_line_is_declined(board: Board, gateway: RelayServer) -> None:
    done = board.run("kanban", "add", "--assignee", "w")  # no title: argparse words it
    assert done.returncode == 2 and "required: TITLE" in done.stderr
    assert gateway.stats() == {"answered": 0, "declined": {"command line": 1}}


def test_relay_off_is_never_asked(board: Board, gateway: RelayServer) -> None:
    assert board.run("kanban", "add", "x", "--assignee", "w", relay=False).returncode == 0
    assert gateway.stats() == {"answered": 0, "declined": {}}


# -- gateways that end early or are not ours ----------------------------------------------------


class FakeGateway:
    """Listens on the relay address of ``state``; answers one command with ``reply`` (bytes
    sent after reading the whole request) and closes."""

    def __init__(self, state: Path, reply: bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(relay_address(os.path.realpath(state)))
        self.sock.listen(1)
        self.received = b""
        self.thread = threading.Thread(target=self._one, args=(reply,), daemon=True)
        self.thread.start()

    def _one(self, reply: bytes) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.settimeout(30)
            while chunk := conn.recv(65536):
                self.received += chunk
            conn.sendall(reply)

    def close(self) -> None:
        self.thread.join(30)
        self.sock.close()


def test_a_gateway_gone_before_it_started_leaves_the_command_to_itself(board: Board) -> None:
    fake = FakeGateway(board.state, b"")
    done = board.run("kanban", "add", "once", "--assignee", "w")
    fake.close()
    assert fake.received.startswith(b"dispatch-relay/1")
    assert done.returncode == 0, done.stderr
    assert board.titles() == ["first", "once"]


def test_a_gateway_gone_after_it_started_is_reported_and_not_repeated(board: Board) -> None:
    fake = FakeGateway(board.state, b"S")
    done = board.run("kanban", "add", "maybe", "--assignee", "w")
    fake.close()
    assert done.returncode == 1
    assert "may or may not have taken effect" in done.stderr
    assert board.titles() == ["first"]  # not run a second time here


def test_a_declining_gateway_leaves_the_command_to_itself(board: Board) -> None:
    fake = FakeGateway(board.state, b"Dbusy")
    done = board.run("kanban", "add", "mine", "--assignee", "w")
    fake.close()
    assert done.returncode == 0 and board.titles() == ["first", "mine"]


def other_users_python() -> str:
    """An interpreter another user may run (this one may live under root's home)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run as another user")
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            subprocess.run([candidate, "-c", "pass"], user=NOBODY, check=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        return candidate
    pytest.skip("no Python interpreter another user may run")


OTHER_GATEWAY = """
import os, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(bytes.fromhex(sys.argv[1]))
sock.listen(1)
print("ready", flush=True)
conn, _ = sock.accept()
conn.settimeout(30)
got = b""
while chunk := conn.recv(65536):
    got += chunk
print(len(got), flush=True)
"""


def test_a_gateway_of_another_user_is_never_told_anything(board: Board) -> None:
    address = relay_address(os.path.realpath(board.state)).hex()
    other = subprocess.Popen(
        [other_users_python(), "-c", OTHER_GATEWAY, address],
        stdout=subprocess.PIPE,
        text=True,
        user=NOBODY,
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "ready"
        done = board.run("kanban", "add", "secret", "--assignee", "w")
        assert done.returncode == 0, done.stderr
        assert other.stdout.readline().strip() == "0"  # not a byte of our environment
    finally:
        other.kill()
        other.wait(30)
    assert board.titles() == ["first", "secret"]


OTHER_COMMAND = """
import os, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(bytes.fromhex(sys.argv[1]))
sock.settimeout(30)
try:
    sock.sendall(bytes.fromhex(sys.argv[2]))
    sock.shutdown(socket.SHUT_WR)
    print(len(sock.recv(65536)))
except (BrokenPipeError, ConnectionResetError):
    print(0)  # closed unread
"""


def test_a_command_of_another_user_is_not_run(board: Board, gateway: RelayServer) -> None:
    request = encode_request(str(board.cwd), ["kanban", "add", "x", "--assignee", "w"], board.env)
    done = subprocess.run(
        [
            other_users_python(),
            "-c",
            OTHER_COMMAND,
            relay_address(os.path.realpath(board.state)).hex(),
            request.hex(),
        ],
        capture_output=True,
        text=True,
        user=NOBODY,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == "0", done.stderr
    assert gateway.stats() == {"answered": 0, "declined": {}}
    assert board.titles() == ["first"]
