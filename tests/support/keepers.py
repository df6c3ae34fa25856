"""Both ways a keeper starts: a fresh interpreter (``direct``) or forked by the fork server.

Test modules that must hold over both start paths parametrize on :data:`START_PATHS` with an
autouse fixture that enters :func:`start_path`; every registry :func:`open_registry` opens
meanwhile (and every launcher process :func:`start_launcher` starts) then uses that path. On
the fork-server path a spawn that fell back to a fresh interpreter fails the test: a test of
that path must have run on it.

:class:`KeeperRunner` runs the keeper script on its own, as the registry would, on either
path: a keeper forked by the server is not our child, so it is waited for by pidfd and its
exit status is the server's to collect (``returncode`` None); its stderr goes to a file.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import select
import signal
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from registry.keeper.forkserver import ForkServer
from registry.keeper.start import keeper_command
from scope.abc import LaunchSpec, Started
from scope.gate import Gate
from scope.spawn import start_held

__all__ = [
    "START_PATHS",
    "KeeperProcess",
    "KeeperRunner",
    "current",
    "keeper_starter",
    "over_both_start_paths",
    "start_path",
]

START_PATHS = ("direct", "fork_server")
PATIENCE = 30.0
"""Seconds a test's fork server may take to answer: a machine under load must not turn a slow
answer into a fallback, which the fork-server path counts as a failure."""

_current = ["direct"]


def current() -> str:
    """The start path registries opened now use."""
    return _current[-1]


@contextlib.contextmanager
def start_path(name: str) -> Iterator[str]:
    """Make registries opened inside the block start keepers this way."""
    assert name in START_PATHS, name
    _current.append(name)
    try:
        yield name
    finally:
        _current.pop()


@contextlib.contextmanager
def keeper_starter(state_dir: Path, path: str | None = None) -> Iterator[ForkServer | None]:
    """None on the direct path; else a started fork server for ``state_dir`` that must have
    taken every spawn offered to it (checked when the block ends without an error)."""
    if (path or current()) == "direct":
        yield None
        return
    server = ForkServer(
        cache_dir=Path(state_dir) / "cache", restart_after=math.inf, reply_timeout=PATIENCE
    )
    assert server.open(), "the fork server did not start"
    try:
        yield server
    except BaseException:
        server.close()
        raise
    stats = server.stats()
    server.close()
    assert not stats.fallbacks, f"spawns fell back from the fork server: {stats.fallbacks}"


@dataclass(kw_only=True)
class KeeperProcess:
    """A keeper started by :class:`KeeperRunner` (ours, or the fork server's child)."""

    pid: int
    process: subprocess.Popen[bytes] | None
    pidfd: int
    stderr_path: Path

    def alive(self) -> bool:
        """Whether it still runs (a zombie does not)."""
        if self.process is not None:
            return self.process.poll() is None
        return not select.select([self.pidfd], [], [], 0)[0]

    def wait(self, timeout: float) -> int | None:
        """Wait for its end; its exit status when ours, None when the server reaps it."""
        if self.process is not None:
            return self.process.wait(timeout=timeout)
        if not select.select([self.pidfd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(str(self.pid), timeout)
        return None

    def send_signal(self, sig: int) -> None:
        """Signal it through its pidfd (never a recycled pid)."""
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, sig)

    @property
    def stderr(self) -> str:
        """What it wrote to its stderr."""
        return self.stderr_path.read_text(errors="replace")

    def close(self) -> None:
        """End it if it still runs, and release the pidfd."""
        if self.alive():
            self.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.wait(10)
        os.close(self.pidfd)


@dataclass(frozen=True, kw_only=True)
class KeeperRun:
    """A finished keeper: its exit status (None: reaped by the fork server) and stderr."""

    returncode: int | None
    stderr: str

    @property
    def ok(self) -> bool:
        """It ended without an error of its own (status 0 when known, nothing on stderr)."""
        return self.returncode in (0, None) and not self.stderr


class KeeperRunner:
    """Runs the keeper script on a spec file, directly or through a fork server."""

    def __init__(self, path: str, work: Path) -> None:
        self.path = path
        self.work = work
        self.server: ForkServer | None = None
        self.command = keeper_command(None, work / "cache")

    def __enter__(self) -> KeeperRunner:
        if self.path == "fork_server":
            self.server = ForkServer(
                cache_dir=self.work / "cache", restart_after=math.inf, reply_timeout=PATIENCE
            )
            assert self.server.open(), "the fork server did not start"
            self.command = list(self.server.keeper_argv)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            stats = self.server.stats()
            self.server.close()
            assert not stats.fallbacks, stats.fallbacks

    def start(
        self,
        spec: Path,
        *,
        env: Mapping[str, str] | None = None,
        pass_fds: tuple[int, ...] = (),
        limits: Mapping[int, tuple[int, int]] | None = None,
        gate: bool = True,
    ) -> KeeperProcess:
        """Start the keeper on ``spec`` (``limits``: rlimits it starts with; ``gate=False``:
        hand it a gate that is closed unopened, so it must exit without doing anything)."""
        err = spec.with_name(f"keeper-{os.urandom(4).hex()}.err")
        err_fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        launch = LaunchSpec(
            argv=[*self.command, str(spec)],
            env=dict(env or {"PATH": os.defpath, "LC_ALL": "C.UTF-8"}),
            cwd=str(spec.parent),
            pass_fds=pass_fds,
            stderr=err_fd,
            gated=True,
            starter=self.server,
        )
        held = Gate.open()
        try:
            started, held = start_held(launch, launch.argv, held)
            # Opened while it waits at its gate: a fork server's child turned back there is
            # reaped by the server at once, and its pid could be gone (or another's) after.
            pidfd = os.pidfd_open(started.pid)
            _apply_limits(started, limits or {})
            if gate:
                held.release()
        finally:
            held.close()
            os.close(err_fd)
        return KeeperProcess(pid=started.pid, process=started.process, pidfd=pidfd, stderr_path=err)

    def run(
        self,
        spec: Mapping[str, object],
        *,
        limits: Mapping[int, tuple[int, int]] | None = None,
        timeout: float = 30.0,
    ) -> KeeperRun:
        """Write ``spec`` (and its stdin FIFO) into its directory, run the keeper to its end."""
        directory = Path(str(spec["dir"]))
        path = directory / "spec.json"
        path.write_text(json.dumps(dict(spec)))
        if not (directory / "stdin").exists():
            os.mkfifo(directory / "stdin", 0o600)
        keeper = self.start(path, limits=limits)
        try:
            code = keeper.wait(timeout)
            return KeeperRun(returncode=code, stderr=keeper.stderr)
        finally:
            keeper.close()


def _apply_limits(started: Started, limits: Mapping[int, tuple[int, int]]) -> None:
    """Resource limits for a process held at its gate (what a preexec_fn would have set)."""
    for which, value in limits.items():
        resource.prlimit(started.pid, which, value)


@pytest.fixture(autouse=True, params=START_PATHS)
def over_both_start_paths(request: pytest.FixtureRequest) -> Iterator[str]:
    """Imported into a test module: every test there runs once per start path."""
    with start_path(request.param) as name:
        yield name
