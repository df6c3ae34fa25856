"""Permanent start-up errors never ask for a restart (issue 19, section 2).

``dispatch serve`` exits 75 only when a restart can help (a cluster database that is down, a
full disk, an internal error); a bad config, a missing module, an unusable state dir or a
duplicate live host id end it with one line and exit 1 or 2, and the shipped units stop on
those (``RestartPreventExitStatus=1 2``). The state-dir errors are one family with one exit
code (1) in every command, and the remedy for a foreign owner pastes as it is.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.cluster.database import ClusterError, ClusterRefused, ClusterUnreachable
from dispatcher.cluster.hosts import DuplicateHost
from dispatcher.errors import GatewayError, MissingModule
from dispatcher.gateway.exits import EXIT_RESTART, start_failure
from dispatcher.gateway.units import parse_unit
from registry.store.database import StateDirUnusable, StateFull, UnsafeStatePath
from scope.foundation.errors import ConfigError, DispatchError
from tests.support.cli import REPO, state_env
from tests.support.systemd import SystemdManager, require_systemd

CONFIG = "kanban:\n  assignees:\n    w:\n      command: [sh, -c, 'echo hi']\n"
ROOT_ONLY = pytest.mark.skipif(os.getuid() != 0, reason="chown and mounts need root")


def no_module(module: str) -> list[str]:
    """``dispatch`` with ``module`` unimportable (as if a plain install lacked it)."""
    code = (
        f"import sys; sys.modules[{module!r}] = None; "
        "from dispatcher.cli.main import entry; entry()"
    )
    return [sys.executable, "-c", code]


def dispatch(
    env: dict[str, str], *args: str, program: list[str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    argv = [*(program or [sys.executable, "-m", "dispatcher.cli.main"]), *args]
    return subprocess.run(
        argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    """The single stderr line of a command that exited ``code`` without a traceback."""
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


# -- the rule ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ConfigError("bad", path="/c.yaml", line=3), 2),
        (DuplicateHost("held", url="postgresql://h/db"), 2),
        (ClusterRefused("password authentication failed", url="postgresql://h/db"), 2),
        (GatewayError("another dispatch serve is already running"), 1),
        (StateDirUnusable("/s", "is not writable (Read-only file system)", "fix it"), 1),
        (UnsafeStatePath("/s", "owned by nobody", "chown"), 1),
        (MissingModule("psutil", "No module named 'psutil'"), 1),
        (ClusterError("schema version 9 is newer", url="postgresql://h/db"), 1),
        (ClusterUnreachable("Connection refused", url="postgresql://h/db"), EXIT_RESTART),
        (StateFull("/s/state.db", "database or disk is full"), EXIT_RESTART),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, DispatchError) else str(value),
)
def test_only_a_restart_that_can_help_is_asked_for(error: DispatchError, status: int) -> None:
    if status == EXIT_RESTART:
        assert start_failure(error) == EXIT_RESTART
    else:
        with pytest.raises(DispatchError) as raised:
            start_failure(error)
        assert raised.value is error and error.exit_code == status


# -- serve at start, as a process ----------------------------------------------------------------


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "config.yaml").write_text(CONFIG)
    values = state_env(tmp_path)
    values["DISPATCH_CONFIG"] = str(tmp_path / "config.yaml")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    values.update(XDG_RUNTIME_DIR=str(runtime), DBUS_SESSION_BUS_ADDRESS=f"unix:path={runtime}/b")
    return values


def test_serve_with_a_broken_config_exits_2(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("kanban: [unclosed\n")
    assert "config.yaml:" in one_line(dispatch(env, "serve"), 2)


def test_serve_without_a_module_it_imports_first_exits_1(env: dict[str, str]) -> None:
    line = one_line(dispatch(env, "serve", program=no_module("apscheduler")), 1)
    assert "apscheduler" in line and "pip install --force-reinstall dispatch" in line


def test_serve_without_the_cluster_driver_exits_1(env: dict[str, str], tmp_path: Path) -> None:
    # The psutil defect's path: a module imported only once serve joins the cluster. It was
    # exit 75 with a traceback, a restart loop under Restart=on-failure.
    env = {**env, "DISPATCH_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    line = one_line(dispatch(env, "serve", program=no_module("psycopg")), 1)
    assert "cannot import psycopg" in line


def test_serve_asks_for_a_restart_when_the_database_is_down(env: dict[str, str]) -> None:
    env = {**env, "DISPATCH_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    line = one_line(dispatch(env, "serve"), EXIT_RESTART)
    assert "Connection refused" in line and "exit 75" in line


# -- the state-dir family ------------------------------------------------------------------------

COMMANDS = [("serve",), ("ps",), ("kanban", "add", "t", "--assignee", "w"), ("web", "--url")]


def _read_only(tmp_path: Path) -> list[str]:
    """A wrapper running a command with ``tmp_path/ro`` mounted read-only for it alone."""
    problem = None
    if os.getuid() != 0:
        problem = "a read-only bind mount needs root"
    elif shutil.which("unshare") is None:
        problem = "needs unshare (util-linux)"
    if problem:
        if require_systemd():
            pytest.fail(f"read-only state dir case required but unavailable: {problem}")
        pytest.skip(problem)
    place = tmp_path / "ro"
    place.mkdir(exist_ok=True)
    script = (
        'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" || exit 98; shift; exec "$@"'
    )
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(place)]


@pytest.mark.parametrize("case", ["a file", "cannot be created", "not writable"])
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_an_unusable_state_dir_is_one_line_and_exit_1(
    env: dict[str, str], tmp_path: Path, case: str, command: tuple[str, ...]
) -> None:
    wrapper: list[str] = []
    if case == "a file":
        state = tmp_path / "afile"
        state.write_text("")
    else:
        wrapper = _read_only(tmp_path)
        state = tmp_path / "ro" / "state"
        if case == "not writable":
            state.mkdir(mode=0o700)
    program = [*wrapper, sys.executable, "-m", "dispatcher.cli.main"]
    done = dispatch(env, "--state-dir", str(state), *command, program=program)
    line = one_line(done, 1)
    assert str(state) in line, line
    if case == "a file":
        assert "is not a directory" in line


@ROOT_ONLY
def test_the_remedy_for_a_foreign_owner_pastes_as_it_is(
    env: dict[str, str], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    nobody = pwd.getpwnam("nobody")
    os.chown(state, nobody.pw_uid, nobody.pw_gid)
    me = pwd.getpwuid(os.getuid()).pw_name
    for command in (("serve",), ("ps",), ("kanban", "list"), ("run", "--", "true")):
        line = one_line(dispatch(env, *command), 1)
        assert f"owned by nobody (uid {nobody.pw_uid}), not by the running user {me} (uid" in line
    found = re.search(r"'(chown -R [^']*)'", line)
    assert found, line
    assert found.group(1) == f"chown -R {me} {state}"
    subprocess.run(shlex.split(found.group(1)), check=True, timeout=30)
    assert dispatch(env, "ps").returncode == 0


# -- the shipped units ---------------------------------------------------------------------------


def test_every_shipped_unit_that_restarts_stops_on_permanent_errors() -> None:
    units = sorted((REPO / "contrib").rglob("*.service"))
    assert len(units) >= 5
    restarting = []
    for path in units:
        service = parse_unit(path.read_text()).get("Service", {})
        restart = (service.get("Restart") or ["no"])[-1]
        if restart == "no":
            continue
        restarting.append(path.name)
        prevented = " ".join(service.get("RestartPreventExitStatus", [])).split()
        assert {"1", "2"} <= set(prevented), f"{path}: RestartPreventExitStatus={prevented}"
    assert {"dispatch.service", "dispatch@.service", "dispatch-web.service"} <= set(restarting)


class ShippedUnit:
    """contrib/dispatch.service, as shipped, loaded into the test's user manager.

    The file is copied unchanged under a unique name into the manager's runtime unit dir
    (``$XDG_RUNTIME_DIR/systemd/user``); a drop-in replaces only what names the user's
    machine (``ExecStart=``/``ExecReload=`` with ``%h``, the home, the log), so ``Type=``,
    ``Restart=``, ``RestartPreventExitStatus=`` and the rest are the shipped ones."""

    def __init__(self, manager: SystemdManager, home: Path) -> None:
        self.manager = manager
        self.home = home
        self.name = manager.unique_name("dispatch-shipped")
        self.dir = manager.runtime_dir / "systemd" / "user"
        self.dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / "contrib" / "dispatch.service", self.dir / self.name)
        (self.dir / f"{self.name}.d").mkdir()
        self.config = home / "config.yaml"
        self.log = home / "serve.log"

    def use(self, program: list[str], **environment: str) -> None:
        """Point the unit at ``program`` (then ``--config ... serve``) and reload."""
        words = [*program, "--config", str(self.config), "--state-dir", str(self.home / "s")]
        start = " ".join(shlex.quote(w) for w in [*words, "serve"])
        reload = " ".join(shlex.quote(w) for w in [*words, "reload", "--pid"])
        lines = [
            "[Service]",
            "ExecStart=",
            f"ExecStart={start}",
            "ExecReload=",
            f"ExecReload={reload} $MAINPID",
            f"WorkingDirectory={self.home}",
            f"Environment=HOME={self.home}",
            f"StandardOutput=append:{self.log}",
            f"StandardError=append:{self.log}",
            *(f"Environment={key}={value}" for key, value in environment.items()),
        ]
        (self.dir / f"{self.name}.d" / "test.conf").write_text("\n".join(lines) + "\n")
        self.manager.systemctl("daemon-reload", timeout=30)
        self.manager.systemctl("reset-failed", self.name, check=False)

    def show(self) -> dict[str, str]:
        keys = "ActiveState,SubState,NRestarts,ExecMainStatus,Result"
        out = self.manager.systemctl("show", f"--property={keys}", self.name).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def start_and_settle(self) -> dict[str, str]:
        """Start without waiting for the job; return the state once it is decided: running,
        failed for good, or waiting to be restarted."""
        self.manager.systemctl("start", "--no-block", self.name)

        def settled() -> dict[str, str] | None:
            state = self.show()
            decided = state["ActiveState"] in ("active", "failed")
            return state if decided or state["SubState"] == "auto-restart" else None

        return self.manager.wait_for(settled, timeout=60, interval=0.1, what="the unit settled")

    def remove(self) -> None:
        self.manager.systemctl("stop", self.name, check=False, timeout=30)
        self.manager.systemctl("reset-failed", self.name, check=False)
        shutil.rmtree(self.dir / f"{self.name}.d", ignore_errors=True)
        (self.dir / self.name).unlink(missing_ok=True)
        self.manager.systemctl("daemon-reload", check=False, timeout=30)


def test_the_shipped_unit_stops_on_permanent_errors_and_runs_when_fixed(
    systemd_manager: SystemdManager, tmp_path: Path
) -> None:
    unit = ShippedUnit(systemd_manager, tmp_path)
    dev = [sys.executable, "-m", "dispatcher.cli.main"]
    try:
        # Permanent: one start, then failed (no auto-restart), whatever the cause.
        unit.config.write_text("kanban: [unclosed\n")
        unit.use(dev)
        for program, status in ((dev, "2"), (no_module("apscheduler"), "1")):
            if program is not dev:
                unit.config.write_text(CONFIG)
                unit.use(program)
            state = unit.start_and_settle()
            assert (state["ActiveState"], state["NRestarts"]) == ("failed", "0"), state
            assert state["ExecMainStatus"] == status, (state, unit.log.read_text())
        # A database that may come back: serve asks for a restart and gets it.
        unit.use(dev, DISPATCH_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none")
        state = unit.start_and_settle()
        assert state["SubState"] == "auto-restart" and state["ExecMainStatus"] == "75", state
        unit.manager.systemctl("stop", unit.name, timeout=30)
        # The same unit with a good config runs.
        unit.use(dev)
        state = unit.start_and_settle()
        assert state["ActiveState"] == "active", (state, unit.log.read_text())
        unit.manager.systemctl("stop", unit.name, timeout=30)
        assert unit.show()["ExecMainStatus"] == "0"
        assert "Traceback" not in unit.log.read_text(), unit.log.read_text()
    finally:
        unit.remove()
