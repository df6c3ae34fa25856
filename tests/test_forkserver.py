"""The keeper fork server: its own promises, and every way it can fail a spawn.

Whatever happens to the server (killed before, during or after a fork, stopped with a request
queued, its queue full, its socket replaced by a stale, foreign or another user's one), a spawn
still starts its worker exactly once: on the fork server, or the usual way, counted by reason.
Everything else a keeper promises is tested over both start paths by the registry, keeper,
PTY, signal, systemd and drill modules (tests/support/keepers.py).
"""

from __future__ import annotations

import ast
import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.abc import SessionState
from registry.keeper.forkserver import FAULT_ENV, SERVER_SCRIPT, ForkServer
from registry.keeper.server import BACKLOG, FAULTS
from registry.process import ProcessRegistry
from scope.abc import LaunchSpec, StarterDeclined
from scope.foundation.procstat import read_stat
from tests.support.keepers import PATIENCE
from tests.support.wait import wait_for
from tests.test_registry_support import SLEEPER, open_registry, request, start_launcher, stop_all


@contextlib.contextmanager
def served(
    tmp_path: Path, *, fault: str | None = None, **options: float
) -> Iterator[tuple[ForkServer, ProcessRegistry]]:
    """A fork server (with a crash point) and a registry whose keepers it starts."""
    state = tmp_path / "state"
    environ = {FAULT_ENV: fault} if fault else {}
    options.setdefault("restart_after", math.inf)
    options.setdefault("reply_timeout", PATIENCE)
    server = ForkServer(cache_dir=state / "cache", environ=environ, **options)
    try:
        assert server.open()
        with open_registry(state, starter=server) as registry:
            yield server, registry
    finally:
        server.close()


def counting(tmp_path: Path) -> tuple[list[str], Path]:
    """A worker that notes each run of itself in a file."""
    marks = tmp_path / "runs"
    return ["sh", "-c", f"echo ran >> {marks}"], marks


def runs(marks: Path) -> int:
    return len(marks.read_text().splitlines()) if marks.exists() else 0


def gone(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is None or stat.state in ("Z", "X")


def nobody_in(directory: str) -> bool:
    """No process works in the session directory any more (a keeper's cwd)."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{name}/cwd") == directory:
                    return False
    return True


def test_the_server_imports_only_c_modules() -> None:
    # Every keeper shares the server's pages: a Python-level module here is memory in each.
    tree = ast.parse(SERVER_SCRIPT.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    assert names <= {"__future__", "_signal", "_socket", "errno", "fcntl", "marshal", "posix",
                     "select", "sys", "termios", "typing"}  # fmt: skip


def test_a_keeper_is_forked_by_the_server_and_outlives_it(tmp_path: Path) -> None:
    with served(tmp_path) as (server, registry):
        session = registry.spawn(request(SLEEPER))
        assert server.stats().forked == 1 and server.stats().fallbacks == {}
        keeper = read_stat(session.keeper_pid or 0)
        assert keeper is not None and keeper.ppid == server.pid
        # Its own session, as a fresh keeper's (setsid), not the server's.
        assert keeper.session == keeper.pid == session.keeper_pid
        server_pid = server.pid
        assert server_pid is not None
        server.close()  # its lifeline closes: the server goes, the keeper stays
        wait_for(lambda: gone(server_pid), 5, what="the server gone")
        assert registry.get(session.id).state is SessionState.RUNNING
        done = registry.kill(session.id, grace=1.0).session
        assert done.state is SessionState.KILLED and done.signal == "SIGTERM"
        assert not os.path.exists(str(server.socket_path or "/nonexistent"))


def test_the_server_ends_with_its_client_and_its_keepers_do_not(tmp_path: Path) -> None:
    from tests.support.keepers import start_path

    state = tmp_path / "state"
    with start_path("fork_server"):
        launcher, info = start_launcher(state, SLEEPER)
    try:
        assert info["forked"] == 1
        with open_registry(state, follow=False, cleanup=False) as registry:
            keeper_pid = registry.get(info["id"]).keeper_pid or 0
        keeper = read_stat(keeper_pid)
        assert keeper is not None
        server_pid = keeper.ppid
        directory = Path(f"/proc/{server_pid}/cmdline").read_bytes().split(b"\0")[-3].decode()
        assert (Path(directory) / "sock").exists()
        launcher.kill()  # SIGKILL: nothing of the launcher runs any more
        launcher.wait(timeout=10)
        wait_for(lambda: gone(server_pid), 5, what="the fork server gone")
        assert not gone(keeper_pid)
        assert not Path(directory).exists()  # it cleaned up after itself
        with open_registry(state) as fresh:
            (adopted,) = fresh.adopt()
            assert adopted.id == info["id"] and adopted.state is SessionState.RUNNING
            assert fresh.kill(adopted.id, grace=1.0).session.state is SessionState.KILLED
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        stop_all(state)


@pytest.mark.parametrize("point", ["before_fork", "after_fork"])
def test_a_server_killed_before_answering_loses_nothing_and_runs_nothing_twice(
    tmp_path: Path, point: str
) -> None:
    argv, marks = counting(tmp_path)
    with served(tmp_path, fault=point) as (server, registry):
        session = registry.spawn(request(argv))
        done = registry.wait(session.id, timeout=15).snapshot.session
        assert done.state is SessionState.EXITED and done.exit_code == 0
        assert server.stats().fallbacks == {"dead": 1} and server.stats().forked == 0
        assert server.pid is None
        # A child forked before the server died read EOF at its gate and left without a trace.
        directory = str(Path(done.log_path).parent)
        wait_for(lambda: nobody_in(directory), 5, what="no process left in the session dir")
    assert runs(marks) == 1


def test_a_server_killed_after_answering_leaves_a_keeper_that_runs(tmp_path: Path) -> None:
    argv, marks = counting(tmp_path)
    with served(tmp_path, fault="after_reply") as (server, registry):
        session = registry.spawn(request(argv))
        done = registry.wait(session.id, timeout=15).snapshot.session
        assert done.state is SessionState.EXITED and done.exit_code == 0
        assert server.stats().forked == 1 and server.stats().fallbacks == {}
        wait_for(lambda: server.pid is None, 5, what="the server gone")
    assert runs(marks) == 1


def test_a_refusing_server_is_counted_and_the_spawn_starts_the_usual_way(tmp_path: Path) -> None:
    argv, marks = counting(tmp_path)
    with served(tmp_path, fault="refuse") as (server, registry):
        session = registry.spawn(request(argv))
        assert registry.wait(session.id, timeout=15).snapshot.session.exit_code == 0
        assert server.stats().fallbacks == {"refused": 1}
    assert runs(marks) == 1


def test_a_server_that_does_not_answer_is_ended_and_the_spawn_runs_once(tmp_path: Path) -> None:
    # The server is stopped with the request in its queue: the spawn gives up, closes the
    # gate, ends the server and starts the worker itself; nothing the server held ever runs.
    argv, marks = counting(tmp_path)
    with served(tmp_path, reply_timeout=0.3, restart_after=0.0) as (server, registry):
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            session = registry.spawn(request(argv))
            done = registry.wait(session.id, timeout=15).snapshot.session
            assert done.exit_code == 0 and server.stats().fallbacks == {"timeout": 1}
            wait_for(lambda: gone(pid), 5, what="the hung server ended")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        directory = str(Path(done.log_path).parent)
        wait_for(lambda: nobody_in(directory), 5, what="nothing left in the session dir")
        again = registry.spawn(request(argv))  # a new server takes it
        assert registry.wait(again.id, timeout=15).snapshot.session.exit_code == 0
        stats = server.stats()
        assert stats.forked == 1 and stats.restarts == 1 and server.pid not in (None, pid)
    assert runs(marks) == 2


def test_a_full_queue_falls_back_at_once(tmp_path: Path) -> None:
    argv, marks = counting(tmp_path)
    with served(tmp_path, reply_timeout=30) as (server, registry):
        pid = server.pid
        assert pid is not None and server.socket_path is not None
        os.kill(pid, signal.SIGSTOP)
        fillers: list[socket.socket] = []
        try:
            while True:  # connections nobody accepts, until the kernel refuses more
                filler = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                filler.setblocking(False)
                fillers.append(filler)
                try:
                    filler.connect(str(server.socket_path))
                except BlockingIOError:
                    break
                assert len(fillers) <= BACKLOG + 2
            session = registry.spawn(request(argv))  # not 30 s: busy is known at once
            assert registry.wait(session.id, timeout=15).snapshot.session.exit_code == 0
            assert server.stats().fallbacks == {"busy": 1}
        finally:
            for filler in fillers:
                filler.close()
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: _room(server), 5, what="the queue drained")
        again = registry.spawn(request(argv))
        assert registry.wait(again.id, timeout=15).snapshot.session.exit_code == 0
        assert server.stats().forked == 1
    assert runs(marks) == 2


def _room(server: ForkServer) -> bool:
    """Whether the server's queue takes a connection again."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    probe.setblocking(False)
    try:
        probe.connect(str(server.socket_path))
    except BlockingIOError:
        return False
    finally:
        probe.close()
    return True


def _replace_socket(server: ForkServer, *, listen: bool) -> socket.socket:
    """Our server keeps running, but its socket path now holds another (this test's)."""
    path = server.socket_path
    assert path is not None
    path.unlink()
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    impostor.bind(str(path))
    os.chmod(path, 0o600)
    if listen:
        impostor.listen(4)
    return impostor


@pytest.mark.parametrize(
    ("listening", "reason"), [(False, "dead"), (True, "refused")], ids=["stale", "impostor"]
)
def test_a_stale_or_impostor_socket_is_refused(
    tmp_path: Path, listening: bool, reason: str
) -> None:
    argv, marks = counting(tmp_path)
    with served(tmp_path) as (server, registry):
        impostor = _replace_socket(server, listen=listening)
        try:
            session = registry.spawn(request(argv))
            assert registry.wait(session.id, timeout=15).snapshot.session.exit_code == 0
        finally:
            impostor.close()
        assert server.stats().fallbacks == {reason: 1}
    assert runs(marks) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a socket to another user needs root")
@pytest.mark.parametrize("change", ["owner", "mode"])
def test_a_socket_of_another_user_or_open_to_others_is_refused(tmp_path: Path, change: str) -> None:
    argv, marks = counting(tmp_path)
    with served(tmp_path) as (server, registry):
        path = server.socket_path
        assert path is not None
        if change == "owner":
            impostor = _replace_socket(server, listen=True)
            os.chown(path, 65534, 65534)
        else:
            impostor = None
            os.chmod(path.parent, 0o755)
        try:
            session = registry.spawn(request(argv))
            assert registry.wait(session.id, timeout=15).snapshot.session.exit_code == 0
        finally:
            if impostor is not None:
                impostor.close()
        assert server.stats().fallbacks == {"refused": 1}
    assert runs(marks) == 1


STRANGER = """
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
sock.connect(sys.argv[1])
request = {"spec": "/nonexistent", "cwd": "/", "env": {}, "fds": []}
try:
    sock.sendmsg([json.dumps(request).encode()])
    sock.settimeout(10)
    print(repr(sock.recv(4096)) if sock.recv(4096, socket.MSG_PEEK) else "closed")
except (BrokenPipeError, ConnectionResetError):
    print("closed")
"""


def test_the_server_answers_nobody_but_its_client(tmp_path: Path) -> None:
    with served(tmp_path) as (server, _registry):
        done = subprocess.run(
            [sys.executable, "-c", STRANGER, str(server.socket_path)],
            capture_output=True,
            text=True,
            timeout=15,
            check=True,
        )
        assert done.stdout.strip() == "closed", done.stderr  # closed unanswered
        assert server.pid is not None and server.stats().forked == 0


def test_a_dead_server_is_started_again_after_its_pause(tmp_path: Path) -> None:
    argv, marks = counting(tmp_path)
    with served(tmp_path, restart_after=0.0) as (server, registry):
        first = server.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: server.pid is None, 5, what="the server gone")
        session = registry.spawn(request(argv))
        assert registry.wait(session.id, timeout=15).snapshot.session.exit_code == 0
        stats = server.stats()
        assert stats.restarts == 1 and stats.forked == 1 and stats.fallbacks == {}
        assert server.pid not in (None, first)
    assert runs(marks) == 1


def test_only_the_keeper_it_runs_is_taken(tmp_path: Path) -> None:
    server = ForkServer(cache_dir=tmp_path / "cache", restart_after=math.inf)
    try:
        assert server.open()
        other = LaunchSpec(argv=["/bin/true"], env={}, cwd="/", gated=True)
        with pytest.raises(StarterDeclined) as declined:
            server.start(other, {}, ())
        assert declined.value.reason == "other"
        assert server.stats().fallbacks == {"other": 1}
    finally:
        server.close()


def test_every_crash_point_is_tested() -> None:
    assert set(FAULTS) == {"before_fork", "after_fork", "after_reply", "refuse"}


@pytest.mark.parametrize(("cards", "forked"), [(8, True), (2, False)])
def test_a_tick_that_may_start_many_workers_forks_their_keepers(
    tmp_path: Path, cards: int, forked: bool
) -> None:
    from dispatcher.app.workspace import Workspace
    from dispatcher.config import parse_config

    # The worker reports its keeper's command line: the fork server's, or the keeper's own.
    settings = parse_config(
        "kanban:\n  assignees:\n    w:\n"
        '      command: [sh, -c, \'tr "\\\\0" " " < /proc/$PPID/cmdline\']\n',
        "config.yaml",
    )
    environ = {"PATH": os.defpath, "XDG_RUNTIME_DIR": str(tmp_path / "no-run")}
    board = Workspace(settings, tmp_path / "state", environ=environ)
    try:
        ids = [board.board.add(f"c{i}", assignee="w", now=board.now())[0].id for i in range(cards)]
        report = board.tick()
        assert len(report.dispatched) == cards
        registry = board.registry()
        for item in report.dispatched:
            registry.wait(item.session_id, timeout=15)
        logs = [registry.read_log(item.session_id) for item in report.dispatched]
    finally:
        board.close()
    assert len(ids) == cards
    assert all((b"server.py" in log) is forked for log in logs), logs


def test_the_status_line_names_every_fallback_reason() -> None:
    from dispatcher.cli.status_cmd import _keepers_text

    running = {"pid": 42, "running": True, "forked": 812, "fallbacks": {}, "restarts": 0}
    assert _keepers_text(running) == "fork server pid 42, 812 forked"
    fell = {**running, "running": False, "fallbacks": {"timeout": 1, "dead": 2}, "restarts": 1}
    assert _keepers_text(fell) == (
        "fork server not running, 812 forked; started the usual way: 3 (dead 2, timeout 1); "
        "restarted 1x"
    )
