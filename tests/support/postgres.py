"""A real PostgreSQL server for the cluster tier, started once per test session.

Debian's server binaries (``/usr/lib/postgresql/<N>/bin``) refuse to run as root, so the server
runs as the ``postgres`` user in a private temporary directory, listening on a unix socket there
and on a free 127.0.0.1 port, with fsync off (tests, not durability). Each test that asks for
``pg_url`` gets a fresh, empty database on that server.

Without the binaries (or as a non-root user without a ``postgres`` account) the tier skips with
the reason; ``DISPATCH_REQUIRE_POSTGRES=1`` (CI) turns that skip into a failure.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

#: Set to ``1`` to turn "no PostgreSQL" from a skip into a failure (CI).
ENV_REQUIRE = "DISPATCH_REQUIRE_POSTGRES"
_SUMMARY = pytest.StashKey[str]()


class PostgresUnavailable(Exception):
    """No PostgreSQL server can be started here (the reason says why)."""


@dataclass
class PostgresServer:
    """A running server: its data dir, port and an admin URL (trust auth on loopback)."""

    root: Path
    bin_dir: Path
    port: int
    user: str

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        """A URL for ``database`` as the superuser (tests only: trust auth, no password)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def pg_ctl(self, *args: str, timeout: float = 60) -> None:
        """Run ``pg_ctl`` as the server's user (``restart``, ``stop -m immediate``, ...)."""
        command = [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), *args]
        _as_user(self.user, command, timeout=timeout)

    def options(self) -> str:
        """The server options (``pg_ctl -o``): this port and socket dir, no durability."""
        return (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )

    def start(self) -> None:
        """Start (or start again after a stop) on the same port and socket dir."""
        self.pg_ctl("-l", str(self.root / "pg.log"), "-w", "-o", self.options(), "start")

    def restart(self) -> None:
        """Stop (fast: sessions are cut) and start again on the same port."""
        log = str(self.root / "pg.log")
        self.pg_ctl("-m", "fast", "-l", log, "-w", "-o", self.options(), "restart")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate`` for a crash)."""
        self.pg_ctl("-m", mode, "-w", "stop")

    def create_database(self) -> str:
        """A new empty database; returns its name."""
        name = "t_" + uuid.uuid4().hex[:12]
        _as_user(
            self.user,
            [str(self.bin_dir / "createdb"), "-h", str(self.root), "-p", str(self.port), name],
            timeout=30,
        )
        return name

    def describe(self) -> str:
        version = self.bin_dir.parent.name
        return f"PostgreSQL {version} on 127.0.0.1:{self.port} ({self.root})"


def require_postgres() -> bool:
    """Whether a missing server must fail the run (``DISPATCH_REQUIRE_POSTGRES=1``)."""
    return os.environ.get(ENV_REQUIRE, "") == "1"


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise PostgresUnavailable("no initdb (install Debian's postgresql package)")


def _as_user(user: str, command: list[str], *, timeout: float) -> None:
    if os.geteuid() == 0:
        command = ["runuser", "-u", user, "--", *command]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise PostgresUnavailable(
            f"{' '.join(command[-3:])} failed ({result.returncode}): {result.stderr.strip()[-500:]}"
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server() -> PostgresServer:
    """initdb + start in a new temporary directory (PostgresUnavailable when it cannot)."""
    bin_dir = _bin_dir()
    user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise PostgresUnavailable(f"no {user!r} user to run the server as") from None
    root = Path(tempfile.mkdtemp(prefix="dpg-"))
    os.chown(root, pw.pw_uid, pw.pw_gid)
    server = PostgresServer(root=root, bin_dir=bin_dir, port=_free_port(), user=user)
    try:
        _as_user(
            user,
            [str(bin_dir / "initdb"), "-D", str(server.data), "-A", "trust", "-U", "postgres"],
            timeout=120,
        )
        server.start()
    except (PostgresUnavailable, subprocess.TimeoutExpired, OSError) as exc:
        shutil.rmtree(root, ignore_errors=True)
        if isinstance(exc, PostgresUnavailable):
            raise
        raise PostgresUnavailable(str(exc)) from exc
    return server


@pytest.fixture(scope="session")
def postgres_server(request: pytest.FixtureRequest) -> Iterator[PostgresServer]:
    """The session's server (skips without one; fails under ``DISPATCH_REQUIRE_POSTGRES=1``)."""
    started = time.monotonic()
    try:
        server = start_server()
    except PostgresUnavailable as exc:
        request.config.stash[_SUMMARY] = f"unavailable ({exc})"
        if require_postgres():
            pytest.fail(f"{ENV_REQUIRE}=1 but no PostgreSQL server: {exc}", pytrace=False)
        pytest.skip(f"no PostgreSQL server: {exc}")
    request.config.stash[_SUMMARY] = (
        f"{server.describe()}, started in {time.monotonic() - started:.2f} s"
    )
    try:
        yield server
    finally:
        with contextlib.suppress(PostgresUnavailable, subprocess.TimeoutExpired):
            server.stop("immediate")
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> str:
    """A URL to a fresh, empty database on the session's server."""
    return postgres_server.url(postgres_server.create_database())


@pytest.fixture
def cluster_db(pg_url: str) -> Iterator[Any]:
    """A :class:`~dispatcher.cluster.database.ClusterDB` on a fresh database, schema in place."""
    from dispatcher.cluster.database import ClusterDB

    with ClusterDB(pg_url) as db:
        db.migrate()
        yield db


def summary_line(config: pytest.Config) -> str:
    """One line for the terminal summary: which server the run used, if any."""
    return "postgres tier: " + config.stash.get(_SUMMARY, "not used in this run")
