"""The client of the keeper fork server (:mod:`registry.keeper.server`): start it, hand it
spawns, count what fell back.

A :class:`ForkServer` is a :class:`~scope.abc.Starter`: the registry names it in the keeper's
launch spec, and the scope layer asks it to start the keeper, held behind the scope gate,
wherever the placement can take an already started process (the D-Bus backend, and unscoped
launches). Each spawn is one connection: the request (the spec path, cwd, environment, and the
descriptors with the numbers they must have) goes out with the descriptors as ``SCM_RIGHTS``,
the answer is the child's pid and kernel start time.

Anything short of that answer declines (:class:`~scope.abc.StarterDeclined`, counted by
reason): no server (``missing``), it died or closed the connection (``dead``), its queue is
full (``busy``), it did not answer in time (``timeout``), the socket or its peer is not ours or
it answered with an error (``refused``), or the spawn is not one it can do (``other``); a server
that did not answer in time is ended (and started again later), so a hung one costs one wait. The
scope layer then closes the gate that request carried, so a keeper the server may have forked
meanwhile reads EOF and exits without touching anything, and starts the keeper the usual way
behind a new gate: a spawn is never lost and never run twice.

The socket is ours alone: ``sock`` (0600 from its bind) in a fresh 0700 directory, checked
before every connection (a socket, owned by us, private; its directory too), and the peer
checked after it (``SO_PEERCRED``: our uid and the server's pid; the server checks us the same
way). A dead server is started again at most every ``restart_after`` seconds.
"""

from __future__ import annotations

import array
import contextlib
import json
import logging
import os
import select
import socket
import stat
import struct
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from registry.keeper.start import keeper_command
from scope.abc import DEVNULL, LaunchSpec, Started, Starter, StarterDeclined
from scope.foundation.clock import Clock, SystemClock

__all__ = ["FAULT_ENV", "SERVER_SCRIPT", "ForkServer", "ForkServerStats"]

_log = logging.getLogger("dispatch.registry")

SERVER_SCRIPT = Path(__file__).with_name("server.py")
FAULT_ENV = "DISPATCH_FORKSERVER_FAULT"
"""Crash points for tests, passed on to the server (see ``server.FAULTS``)."""
START_TIMEOUT = 10.0
"""Seconds the server gets to load the keeper and listen."""


@dataclass(frozen=True, kw_only=True)
class ForkServerStats:
    """What the fork server did (for ``dispatch status`` and ``/metrics``)."""

    pid: int | None
    """The server's pid while it runs."""
    running: bool
    forked: int = 0
    """Keepers it started."""
    fallbacks: dict[str, int] = field(default_factory=dict)
    """Spawns started the usual way instead, by reason."""
    restarts: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the status file."""
        return {
            "pid": self.pid,
            "running": self.running,
            "forked": self.forked,
            "fallbacks": dict(sorted(self.fallbacks.items())),
            "restarts": self.restarts,
        }


class ForkServer(Starter):
    """One fork server process and the spawns it takes (see the module docstring).

    ``python`` and ``cache_dir`` give the keeper command exactly as the registry builds it
    (:func:`~registry.keeper.start.keeper_command`); only spawns of that command are taken.
    ``environ`` passes :data:`FAULT_ENV` on (the server's environment is otherwise fixed).
    """

    def __init__(
        self,
        *,
        python: str | None = None,
        cache_dir: Path,
        environ: Mapping[str, str] | None = None,
        reply_timeout: float = 3.0,
        restart_after: float = 30.0,
        clock: Clock | None = None,
    ) -> None:
        self.python = python or sys.executable
        self.cache_dir = Path(cache_dir)
        self.reply_timeout = reply_timeout
        self.restart_after = restart_after
        self.clock: Clock = clock or SystemClock()
        fault = (environ or {}).get(FAULT_ENV)
        self._env = {"PATH": os.defpath, "LC_ALL": "C.UTF-8"}
        if fault:
            self._env[FAULT_ENV] = fault
        self.keeper_argv: tuple[str, ...] = ()
        self._lock = threading.Lock()
        self._counting = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._dir_fd = -1
        """An ``O_PATH`` descriptor of the directory: connecting through
        ``/proc/self/fd/N/sock`` keeps the socket address short, wherever the directory is."""
        self._started_at: float | None = None
        self._forked = 0
        self._fallbacks: dict[str, int] = {}
        self._restarts = 0
        self._warned: set[str] = set()
        self._closed = False

    # -- life --------------------------------------------------------------------------------

    @property
    def socket_path(self) -> Path | None:
        """Where the server listens (None before it ever started)."""
        return None if self._dir is None else self._dir / "sock"

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def open(self) -> bool:
        """Start the server now; False (logged, spawns fall back) when it could not start."""
        with self._lock:
            return self._launch()

    def _launch(self) -> bool:
        self._started_at = self.clock.monotonic()
        self._stop_process()
        try:
            self.keeper_argv = tuple(keeper_command(self.python, self.cache_dir))
            if self._dir is None:
                import tempfile  # only where a fork server starts: not on every command's path

                self._dir = Path(tempfile.mkdtemp(prefix="dispatch-keepers-"))
                self._dir_fd = os.open(self._dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            path = self._dir / "sock"
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a socket of a server of ours that died
            process = subprocess.Popen(
                [
                    self.python,
                    "-I",
                    "-S",
                    str(SERVER_SCRIPT),
                    self.keeper_argv[-1],
                    str(self._dir),
                    str(os.getpid()),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=self._env,
                cwd="/",
                close_fds=True,
                start_new_session=True,
            )
        except Exception as err:  # a fork server is an optimisation: never fail a start on it
            _log.warning("no keeper fork server (%s); keepers start the usual way", err)
            return False
        if not _await_listening(process, START_TIMEOUT):
            _log.warning("the keeper fork server did not start; keepers start the usual way")
            _end(process)
            return False
        self._process = process
        _log.debug("keeper fork server %d listening on %s", process.pid, path)
        return True

    def _server(self) -> subprocess.Popen[bytes]:
        """The live server, started again when it died and ``restart_after`` has passed."""
        with self._lock:
            if self._closed:
                self._decline("missing", "closed")
            process = self._process
            if process is not None and process.poll() is None:
                return process
            last = self._started_at
            if last is not None and self.clock.monotonic() - last < self.restart_after:
                self._decline("dead" if process is not None else "missing")
            if process is not None:
                _log.warning("the keeper fork server %d died; starting it again", process.pid)
                self._restarts += 1
            if not self._launch():
                self._decline("missing", "could not start")
            assert self._process is not None
            return self._process

    def stats(self) -> ForkServerStats:
        """Counters so far."""
        pid = self.pid
        with self._counting:
            return ForkServerStats(
                pid=pid,
                running=pid is not None,
                forked=self._forked,
                fallbacks=dict(self._fallbacks),
                restarts=self._restarts,
            )

    def close(self) -> None:
        """End the server (its keepers keep running) and remove its directory."""
        with self._lock:
            self._closed = True
            self._stop_process()
            if self._dir is not None:
                import shutil

                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
            if self._dir_fd >= 0:
                os.close(self._dir_fd)
                self._dir_fd = -1

    def _stop_process(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            _end(process)

    # -- spawns ------------------------------------------------------------------------------

    def start(self, spec: LaunchSpec, env: Mapping[str, str], pass_fds: Sequence[int]) -> Started:
        """Have the server fork the keeper ``spec`` runs (see the module docstring)."""
        argv = tuple(spec.argv)
        if not self.keeper_argv or argv[:-1] != self.keeper_argv or not spec.start_new_session:
            self._decline("other", "not the keeper this server runs")
        fds, targets = _descriptors(spec, pass_fds)
        if fds is None:
            self._decline("other", "stdio the server cannot give")
        server = self._server()
        request = json.dumps(
            {"spec": argv[-1], "cwd": spec.cwd, "env": dict(env), "fds": targets}
        ).encode()
        reply = self._exchange(server, request, fds)
        answer: Any = None
        try:
            answer = json.loads(reply)
            pid, start = int(answer["pid"]), int(answer["start"])
        except (ValueError, KeyError, TypeError):
            error = answer.get("error") if isinstance(answer, dict) else None
            self._decline("refused", str(error or reply[:200]))
        with self._counting:
            self._forked += 1
        return Started(pid=pid, start_time=start)

    def _exchange(self, server: subprocess.Popen[bytes], request: bytes, fds: list[int]) -> bytes:
        """One connection: checks, request with descriptors, the answer."""
        path = self.socket_path
        problem = _unsafe(self._dir_fd)
        if problem is not None:
            self._warn_once(problem, f"keeper fork server socket {path} refused: {problem}")
            self._decline("refused", problem)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK)
        try:
            try:
                sock.connect(f"/proc/self/fd/{self._dir_fd}/sock")
            except BlockingIOError:
                self._decline("busy", "its queue is full")
            except FileNotFoundError:
                self._decline("missing", "no socket")
            except OSError as err:
                self._decline("dead", err.strerror or str(err))
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.geteuid() or pid != server.pid:
                problem = f"its peer is pid {pid} uid {uid}, not our server {server.pid}"
                self._warn_once("peer", f"keeper fork server socket {path} refused: {problem}")
                self._decline("refused", problem)
            sock.settimeout(self.reply_timeout)
            try:
                sock.sendmsg(
                    [request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                )
                reply = sock.recv(4096)
            except TimeoutError:
                self._hung(server)
                self._decline("timeout", f"no answer in {self.reply_timeout:g} s")
            except OSError as err:
                self._decline("dead", err.strerror or str(err))
            if not reply:
                self._decline("dead", "it closed the connection")
            return reply
        finally:
            sock.close()

    def _hung(self, server: subprocess.Popen[bytes]) -> None:
        """A server that does not answer in time is ended, so that the next spawns do not wait
        for it too; it is started again after ``restart_after``. Its keepers are untouched;
        requests it still held get EOF, and their clients fall back as this one does."""
        _log.warning(
            "the keeper fork server %d did not answer in %g s; ending it (keepers start the "
            "usual way until it is started again)",
            server.pid,
            self.reply_timeout,
        )
        with contextlib.suppress(ProcessLookupError):
            server.kill()  # our child, not yet reaped: the pid is still this process

    def _decline(self, reason: str, detail: str = "") -> NoReturn:
        """Count the fallback and tell the scope layer (called with or without ``_lock``)."""
        with self._counting:
            self._fallbacks[reason] = self._fallbacks.get(reason, 0) + 1
        raise StarterDeclined(reason, detail)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _log.warning("%s; keepers start the usual way", message)


def _descriptors(
    spec: LaunchSpec, pass_fds: Sequence[int]
) -> tuple[list[int], list[int]] | tuple[None, None]:
    """The descriptors to pass and the number each must have in the keeper (stdio 0-2 as the
    spec says: an fd, ours when None, /dev/null when left out)."""
    fds: list[int] = []
    targets: list[int] = []
    for std, value in ((0, spec.stdin), (1, spec.stdout), (2, spec.stderr)):
        if value == DEVNULL:
            continue
        if value is None:
            fds.append(std)
        elif isinstance(value, int) and value >= 0:
            fds.append(value)
        else:
            return None, None  # a pipe to us: only Popen can make that
        targets.append(std)
    for fd in pass_fds:
        if fd in targets:
            return None, None
        fds.append(fd)
        targets.append(fd)
    return fds, targets


def _unsafe(dir_fd: int) -> str | None:
    """Why the socket or its directory (by our descriptor of it) is not ours alone (None:
    it is, or there is no socket, which the connection then reports)."""
    try:
        found = [("directory", os.fstat(dir_fd), stat.S_ISDIR)]
        found.append(
            ("socket", os.stat("sock", dir_fd=dir_fd, follow_symlinks=False), stat.S_ISSOCK)
        )
    except FileNotFoundError:
        pass
    except OSError as err:
        return f"cannot check it: {err.strerror}"
    for name, info, kind in found:
        if not kind(info.st_mode):
            return f"its {name} is not a {name}"
        if info.st_uid != os.geteuid():
            return f"its {name} belongs to uid {info.st_uid}"
        if info.st_mode & 0o077:
            return f"its {name} is open to others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _await_listening(process: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait (bounded) for the server's "listening" line on its stdout."""
    assert process.stdout is not None
    try:
        poller = select.poll()
        poller.register(process.stdout.fileno(), select.POLLIN)
        if not poller.poll(int(timeout * 1000)):
            return False
        line = os.read(process.stdout.fileno(), 64)
        return line.strip() == str(process.pid).encode()
    finally:
        process.stdout.close()


def _end(process: subprocess.Popen[bytes]) -> None:
    """Close the lifeline (the server exits at EOF), then make sure it is gone and reaped."""
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    try:
        process.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=2.0)
