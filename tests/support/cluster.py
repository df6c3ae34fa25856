"""Multi-host rigs on one machine: several "hosts" sharing one PostgreSQL server.

A host is one ``dispatch serve`` with its own ``cluster.host_id``, state dir and private systemd
user manager (so its workers live in its own scopes, and stopping that manager kills them, as a
dead machine's would), reaching the database through its own :class:`~tests.support.tcpproxy.
TcpProxy`, which the test can cut to partition it away. :class:`ClusterRig` makes the hosts on
one database of a private server the rig's module owns (so ``pg_ctl restart`` disturbs no
other test), and tears everything down, bounded, at the end.

Without the private managers (root, unshare, systemd, dbus-daemon) or the PostgreSQL binaries
the rig skips, or fails under ``DISPATCH_REQUIRE_SYSTEMD=1`` / ``DISPATCH_REQUIRE_POSTGRES=1``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.support.cli import dispatch_argv, run_dispatch
from tests.support.postgres import PostgresServer
from tests.support.systemd import (
    ENV_MODE,
    ManagerUnavailable,
    SystemdManager,
    acquire_manager,
    require_systemd,
)
from tests.support.tcpproxy import TcpProxy

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["ClusterHost", "ClusterRig"]


def private_manager() -> SystemdManager:
    """A private user manager of its own (skip, or fail when systemd is required)."""
    try:
        return acquire_manager({**os.environ, ENV_MODE: "private"})
    except ManagerUnavailable as exc:
        if require_systemd():
            pytest.fail(f"no private systemd manager for a cluster host: {exc.reason}")
        pytest.skip(f"no private systemd manager for a cluster host: {exc.reason}")


class ClusterHost:
    """One host of a rig (see the module docstring)."""

    def __init__(self, name: str, home: Path, server: PostgresServer, database: str, config: str):
        self.name = name
        self.home = home
        self.home.mkdir(parents=True)
        self.state = home / "state"
        self.config = home / "config.yaml"
        self.config.write_text(config.replace("{host}", name))
        self.log = home / "serve.log"
        self.proxy = TcpProxy(server.port)
        self.url = f"postgresql://postgres@127.0.0.1:{self.proxy.port}/{database}"
        self.manager: SystemdManager | None = private_manager()
        self.unit: str | None = None

    def unit_env(self) -> dict[str, str]:
        """What the serve unit (and so every worker) gets besides the manager's own."""
        return {
            "HOME": str(self.home),
            "PYTHONPATH": str(ROOT),
            "DISPATCH_DATABASE_URL": self.url,
            "DRILL_HOST": self.name,
        }

    def env(self) -> dict[str, str]:
        """An environment for commands run "on" this host."""
        assert self.manager is not None
        return {**self.manager.env, **self.unit_env()}

    def start(self) -> str:
        """Start serve as a Type=notify service (returns after READY=1)."""
        assert self.manager is not None
        self.unit = self.manager.run_transient_service(
            dispatch_argv(self.config, self.state, "serve"),
            env=self.unit_env(),
            type="notify",
            name=self.unit,
            properties={
                "StandardOutput": f"append:{self.log}",
                "StandardError": f"append:{self.log}",
                "TimeoutStopSec": "15s",
                "LimitNOFILE": "4096",
            },
            cwd=self.home,
            timeout=90,
        )
        return self.unit

    def active(self) -> bool:
        """Whether the serve unit is active."""
        if self.manager is None or self.unit is None:
            return False
        return self.manager.unit_property(self.unit, "ActiveState") == "active"

    def restart(self) -> None:
        """``systemctl --user restart`` the serve (its scoped workers keep running)."""
        assert self.manager is not None and self.unit is not None
        self.manager.restart_service(self.unit, timeout=60)

    def kill_serve(self) -> None:
        """SIGKILL the serve's main process (the manager names it: identity by unit)."""
        assert self.manager is not None and self.unit is not None
        self.manager.systemctl(
            "kill", "--signal=SIGKILL", "--kill-whom=main", self.unit, timeout=10
        )

    def die(self) -> None:
        """The machine dies: SIGKILL its serve, then stop its systemd manager (every worker in
        its scopes dies with it)."""
        self.kill_serve()
        manager, self.manager = self.manager, None
        if manager is not None:
            manager.close()

    def dispatch(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A ``dispatch`` command on this host."""
        return run_dispatch(self.config, self.state, self.env(), *args, check=check)

    def log_paths(self) -> dict[str, str]:
        """Session id -> output log of this host's registry."""
        path = self.state / "state.db"
        if not path.exists():
            return {}
        with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
            return dict(conn.execute("SELECT id, log_path FROM registry_sessions").fetchall())

    def log_text(self) -> str:
        """serve's log so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def close(self) -> None:
        """Stop serve and the manager (workers with it), close the proxy. Bounded."""
        manager, self.manager = self.manager, None
        if manager is not None:
            if self.unit is not None:
                with contextlib.suppress(subprocess.SubprocessError, OSError):
                    manager.systemctl("stop", self.unit, check=False, timeout=30)
            manager.close()
        self.proxy.close()


class ClusterRig:
    """Hosts named ``names`` on a new database of ``server`` (see the module docstring)."""

    def __init__(
        self, root: Path, server: PostgresServer, names: Sequence[str], config: str
    ) -> None:
        self.server = server
        self.database = server.create_database()
        self.url = server.url(self.database)
        self.hosts: dict[str, ClusterHost] = {}
        try:
            for name in names:
                self.hosts[name] = ClusterHost(name, root / name, server, self.database, config)
        except BaseException:
            self.close()
            raise

    def __getitem__(self, name: str) -> ClusterHost:
        return self.hosts[name]

    def start(self, *names: str) -> None:
        """Start these hosts' serves at once (all, by default); returns when all are ready."""
        chosen = [self.hosts[n] for n in (names or tuple(self.hosts))]
        errors: list[BaseException] = []

        def start(host: ClusterHost) -> None:
            try:
                host.start()
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=start, args=(h,)) for h in chosen]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        if errors:
            raise errors[0]

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        """Rows of one query on the cluster database (a connection of the test's own)."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            return [tuple(row) for row in conn.execute(sql.replace("?", "%s"), tuple(params))]

    def logs(self) -> dict[str, str]:
        """Every host's serve log by host name (for failure messages)."""
        return {name: host.log_text()[-4000:] for name, host in self.hosts.items()}

    def close(self) -> None:
        """Stop every host (bounded)."""
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                host.close()


@contextlib.contextmanager
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the caller's own (skip, or fail when PostgreSQL is required)."""
    from tests.support.postgres import PostgresUnavailable, require_postgres, start_server

    try:
        server = start_server()
    except PostgresUnavailable as exc:
        if require_postgres():
            pytest.fail(f"no PostgreSQL server: {exc}")
        pytest.skip(f"no PostgreSQL server: {exc}")
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop("immediate")
        import shutil

        shutil.rmtree(server.root, ignore_errors=True)
