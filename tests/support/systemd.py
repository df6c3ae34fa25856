"""The real-systemd test tier: a systemd user manager and session bus for tests, and its fixtures.

``systemd_manager`` (session scope) hands tests a :class:`SystemdManager`: the host's own user
manager when one answers, otherwise a private one booted by :mod:`tests.support.systemd_boot`.
When neither can be had the test is skipped with the reason, or fails when
``DISPATCH_REQUIRE_SYSTEMD=1`` (CI, where a skipped tier would hide a regression).
``DISPATCH_SYSTEMD_MANAGER=host|private|auto`` forces a choice (default ``auto``).

Tests never see a mutated ``os.environ``: the manager's environment is ``manager.env``, a copy to
pass to subprocesses and to the code under test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

import pytest

from scope.cgroup import cgroup2_mount, cgroup_procs, leaf_unit

from .systemd_boot import ManagerUnavailable, PrivateManager, boot_private_manager, renamed_away
from .wait import wait_for as _wait_for

__all__ = [
    "ENV_MODE",
    "ENV_REQUIRE",
    "CommandFailed",
    "ManagerUnavailable",
    "ServiceType",
    "SystemdManager",
    "acquire_manager",
    "mark_systemd_users",
    "summary_line",
    "systemd_manager",
    "systemd_marker_gate",
]

#: Set to ``1`` to turn "no systemd manager" from a skip into a failure (CI).
ENV_REQUIRE = "DISPATCH_REQUIRE_SYSTEMD"
#: ``auto`` (host if reachable, else private), ``host`` or ``private``.
ENV_MODE = "DISPATCH_SYSTEMD_MANAGER"

ServiceType = Literal["simple", "exec", "oneshot", "notify", "forking"]
_SERVICE_TYPES = ("simple", "exec", "oneshot", "notify", "forking")
T = TypeVar("T")

_SUMMARY = pytest.StashKey[str]()


def require_systemd() -> bool:
    """Whether a missing manager must fail the run (``DISPATCH_REQUIRE_SYSTEMD=1``)."""
    return os.environ.get(ENV_REQUIRE, "") == "1"


class CommandFailed(subprocess.CalledProcessError):
    """A ``systemctl``/``systemd-run`` call failed; unlike its base class, shows its stderr."""

    def __str__(self) -> str:
        err = self.stderr.strip() if isinstance(self.stderr, str) else self.stderr
        return f"{super().__str__()} stderr: {err!r}"


@dataclass(kw_only=True)
class SystemdManager:
    """A reachable systemd user manager with its session bus, plus helpers tests use on it.

    ``kind`` is ``"host"`` (the machine's own manager; never stopped by us) or ``"private"``
    (booted for this run; stopped at the end of the session). ``env`` is a copy of
    ``os.environ`` with ``XDG_RUNTIME_DIR`` and ``DBUS_SESSION_BUS_ADDRESS`` pointing at this
    manager; it is shared by all tests, so derive from it (``{**manager.env, "X": "1"}``)
    rather than changing it.
    """

    kind: Literal["host", "private"]
    runtime_dir: Path
    env: dict[str, str] = field(repr=False)
    bus_address: str
    version: str
    cgroup_mount: Path | None
    private: PrivateManager | None = field(default=None, repr=False)
    _units: set[str] = field(default_factory=set, repr=False)

    # -- facts -------------------------------------------------------------------------------

    @property
    def private_socket(self) -> Path:
        """The manager's private socket, ``$XDG_RUNTIME_DIR/systemd/private``."""
        return self.runtime_dir / "systemd" / "private"

    @property
    def bus_socket(self) -> Path:
        """Filesystem path of the session bus socket (from ``bus_address``)."""
        for part in self.bus_address.split(";")[0].split(":", 1)[-1].split(","):
            key, _, value = part.partition("=")
            if key == "path":
                return Path(value)
        return self.runtime_dir / "bus"

    @property
    def manager_pid(self) -> int | None:
        """Pid of a private manager; None for the host's."""
        return None if self.private is None else self.private.process.pid

    def describe(self) -> str:
        """One line for the terminal summary."""
        text = f"{self.kind} user manager, systemd {self.version}, runtime dir {self.runtime_dir}"
        if self.private is not None:
            cgroup = self.private.cgroup.path if self.private.cgroup else "shared"
            text += f", cgroup {cgroup}, boot {self.private.boot_seconds:.2f} s"
            if self.private.shutdown_seconds is not None:
                text += f", shutdown {self.private.shutdown_seconds:.2f} s"
            if self.private.notes:
                text += "; " + "; ".join(self.private.notes)
        return text

    # -- commands ----------------------------------------------------------------------------

    def _run(
        self, argv: list[str], check: bool, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise CommandFailed(done.returncode, argv, done.stdout, done.stderr)
        return done

    def systemctl(
        self, *args: str, check: bool = True, timeout: float = 10.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``systemctl --user ARGS`` against this manager; text output captured."""
        return self._run(["systemctl", "--user", *args], check, timeout)

    def systemd_run(
        self, *args: str, check: bool = True, timeout: float = 10.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``systemd-run --user ARGS`` against this manager; text output captured."""
        return self._run(["systemd-run", "--user", *args], check, timeout)

    def wait_for(
        self,
        predicate: Callable[[], T],
        timeout: float = 5.0,
        interval: float = 0.05,
        *,
        what: str | None = None,
    ) -> T:
        """Poll ``predicate`` until truthy (see :func:`tests.support.wait.wait_for`)."""
        return _wait_for(predicate, timeout, interval, what=what)

    # -- units -------------------------------------------------------------------------------

    @staticmethod
    def unique_name(prefix: str = "dsd-test", suffix: str = ".service") -> str:
        """A unit name no other test (or concurrent run) uses."""
        return f"{prefix}-{uuid.uuid4().hex[:12]}{suffix}"

    def run_transient_service(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        type: ServiceType = "simple",
        name: str | None = None,
        properties: Mapping[str, str] | Iterable[str] = (),
        wait: bool = False,
        *,
        cwd: str | Path | None = None,
        timeout: float = 10.0,
    ) -> str:
        """Start ``argv`` as a transient ``--collect`` service and return its unit name.

        The service runs in ``cwd`` (default: the current directory) with this manager's
        ``XDG_RUNTIME_DIR``, ``DBUS_SESSION_BUS_ADDRESS`` and ``PATH`` plus ``env``, so it can
        itself call ``systemd-run --user``. ``properties`` are ``-p`` assignments (a mapping or
        ``"Key=Value"`` strings); ``TimeoutStopSec=5s`` is the default so a stuck test unit cannot
        hold teardown for systemd's 90 s. ``type`` sets ``Type=``: ``systemd-run`` returns once the
        start job is done, i.e. at once for ``simple``, after exec for ``exec``, after
        ``READY=1`` for ``notify`` and after the process exited for ``oneshot``. ``wait=True``
        adds ``--wait``: return only after the service finished (the unit is then collected)
        and raise :class:`CommandFailed` if it failed. Relative ``argv[0]`` is resolved on PATH.
        """
        if type not in _SERVICE_TYPES:
            raise ValueError(f"unknown service type {type!r}; one of {_SERVICE_TYPES}")
        if not argv:
            raise ValueError("argv must not be empty")
        unit = name or self.unique_name()
        if leaf_unit("/" + unit) is None:
            unit += ".service"
        if isinstance(properties, Mapping):
            props = dict(properties)
        else:
            props = dict(p.split("=", 1) for p in properties)
        props.setdefault("Type", type)
        props.setdefault("TimeoutStopSec", "5s")
        service_env = {k: self.env[k] for k in ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")}
        if "PATH" in self.env:
            service_env["PATH"] = self.env["PATH"]
        service_env.update(env or {})
        program = argv[0]
        if not os.path.isabs(program):
            program = shutil.which(program, path=service_env.get("PATH")) or program
        args = ["--unit", unit, "--collect", "--quiet", f"--working-directory={cwd or os.getcwd()}"]
        for key, value in props.items():
            args += ["-p", f"{key}={value}"]
        for key, value in service_env.items():
            args += ["--setenv", f"{key}={value}"]
        if wait:
            args.append("--wait")
        self._units.add(unit)
        self.systemd_run(*args, "--", program, *argv[1:], timeout=timeout)
        if wait:
            self._units.discard(unit)
        return unit

    def stop_unit(self, name: str, *, timeout: float = 10.0) -> None:
        """``systemctl --user stop NAME`` (any unit type); returns when the stop job is done."""
        self.systemctl("stop", name, timeout=timeout)
        self._units.discard(name)

    def stop_service(self, name: str, *, timeout: float = 10.0) -> None:
        """Stop a service (``.service`` is appended when the name has no unit suffix)."""
        self.stop_unit(self._service_name(name), timeout=timeout)

    def restart_service(self, name: str, *, timeout: float = 10.0) -> None:
        """``systemctl --user restart``: stop (killing the unit's cgroup), then start again."""
        self.systemctl("restart", self._service_name(name), timeout=timeout)

    def unit_property(self, name: str, prop: str) -> str:
        """One property of a unit as ``systemctl show --value`` prints it ('' when unset)."""
        return self.systemctl("show", f"--property={prop}", "--value", name).stdout.strip()

    def manager_property(self, prop: str) -> str:
        """A property of the manager itself (``Version``, ``Environment``, ...)."""
        return self.systemctl("show", f"--property={prop}", "--value").stdout.strip()

    def unit_control_group(self, name: str) -> str:
        """The unit's cgroup path (``/.../app.slice/x.service``); '' when it has none now."""
        return self.unit_property(name, "ControlGroup")

    def unit_pids(self, name: str) -> list[int]:
        """Pids in the unit's cgroup (from ``ControlGroup`` and the cgroup2 mount), sorted."""
        control_group = self.unit_control_group(name)
        if not control_group:
            return []
        return cgroup_procs(control_group, self.cgroup_mount)

    @staticmethod
    def _service_name(name: str) -> str:
        return name if leaf_unit("/" + name) is not None else name + ".service"

    # -- fault injection ---------------------------------------------------------------------

    @contextlib.contextmanager
    def manager_unreachable(self) -> Iterator[None]:
        """Make the bus and the manager's private socket unreachable inside the block.

        Both socket files are renamed aside and renamed back on exit, even when the block
        raises; the manager and the bus keep running, so this is "the client cannot reach
        systemd", not "systemd died". On the host's manager this would cut the whole login
        session off its bus, so it is refused there (skip, or fail under ``DISPATCH_REQUIRE_
        SYSTEMD=1``): force a private one with ``DISPATCH_SYSTEMD_MANAGER=private``.
        """
        if self.kind != "private":
            reason = (
                "manager_unreachable() would break the host session bus; "
                f"run with {ENV_MODE}=private"
            )
            if require_systemd():
                pytest.fail(reason, pytrace=False)
            pytest.skip(reason)
        with renamed_away(self.bus_socket, self.private_socket):
            yield

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> list[str]:
        """Stop units our helpers started and still run; stop a private manager. Bounded."""
        problems: list[str] = []
        for unit in sorted(self._units):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                if self.unit_property(unit, "LoadState") == "loaded":
                    self.systemctl("stop", unit, check=False, timeout=10.0)
        self._units.clear()
        if self.private is not None:
            problems.extend(self.private.shutdown())
        return problems


def _host_manager(base_env: Mapping[str, str]) -> SystemdManager:
    """The host's own user manager, if its private socket and the session bus both answer."""
    runtime = base_env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    runtime_dir = Path(runtime)
    if not (runtime_dir / "systemd" / "private").is_socket():
        raise ManagerUnavailable(f"no host manager socket {runtime_dir}/systemd/private")
    env = dict(base_env)
    env["XDG_RUNTIME_DIR"] = runtime
    env.setdefault("DBUS_SESSION_BUS_ADDRESS", f"unix:path={runtime_dir / 'bus'}")
    manager = SystemdManager(
        kind="host",
        runtime_dir=runtime_dir,
        env=env,
        bus_address=env["DBUS_SESSION_BUS_ADDRESS"],
        version="",
        cgroup_mount=cgroup2_mount(),
    )
    try:
        manager.version = manager.manager_property("Version") or "?"
        manager._run(
            [
                "busctl",
                "--user",
                "get-property",
                "org.freedesktop.systemd1",
                "/org/freedesktop/systemd1",
                "org.freedesktop.systemd1.Manager",
                "Version",
            ],
            check=True,
            timeout=5.0,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        raise ManagerUnavailable(f"host manager in {runtime} does not answer: {exc}") from exc
    return manager


def _private_manager(base_env: Mapping[str, str]) -> SystemdManager:
    """Boot a private manager (see :mod:`tests.support.systemd_boot`)."""
    # A host bus address would point the private manager and our clients at the wrong bus.
    env = {k: v for k, v in base_env.items() if k != "DBUS_SESSION_BUS_ADDRESS"}
    private = boot_private_manager(env)
    manager = SystemdManager(
        kind="private",
        runtime_dir=private.runtime_dir,
        env=dict(private.env),
        bus_address=private.env["DBUS_SESSION_BUS_ADDRESS"],
        version="",
        cgroup_mount=cgroup2_mount(),
        private=private,
    )
    try:
        manager.version = manager.manager_property("Version")
    except (subprocess.SubprocessError, OSError) as exc:
        manager.close()
        raise ManagerUnavailable(f"private manager does not answer: {exc}") from exc
    return manager


def acquire_manager(base_env: Mapping[str, str] | None = None) -> SystemdManager:
    """A manager according to ``DISPATCH_SYSTEMD_MANAGER``; ``ManagerUnavailable`` with reasons."""
    env = dict(os.environ if base_env is None else base_env)
    # pytest's per-test marker would otherwise reach every unit the manager starts, frozen at
    # the name of whichever test happened to boot it.
    env.pop("PYTEST_CURRENT_TEST", None)
    mode = env.get(ENV_MODE, "auto") or "auto"
    if mode not in ("auto", "host", "private"):
        raise ManagerUnavailable(f"{ENV_MODE}={mode!r}: expected auto, host or private")
    reasons: list[str] = []
    if mode in ("auto", "host"):
        try:
            return _host_manager(env)
        except ManagerUnavailable as exc:
            reasons.append(f"host: {exc.reason}")
    if mode in ("auto", "private"):
        try:
            return _private_manager(env)
        except ManagerUnavailable as exc:
            reasons.append(f"private: {exc.reason}")
    raise ManagerUnavailable("; ".join(reasons))


# -- pytest integration (imported into tests/conftest.py) ---------------------------------------


@pytest.fixture(scope="session")
def systemd_manager(request: pytest.FixtureRequest) -> Iterator[SystemdManager]:
    """A systemd user manager for the whole session: the host's, or a private one.

    Skips when none can be had, fails instead under ``DISPATCH_REQUIRE_SYSTEMD=1``. A private
    manager (and whatever it still runs) is stopped at the end of the session.
    """
    started = time.monotonic()
    try:
        manager = acquire_manager()
    except ManagerUnavailable as exc:
        request.config.stash[_SUMMARY] = f"unavailable ({exc.reason.splitlines()[0]})"
        if require_systemd():
            pytest.fail(f"{ENV_REQUIRE}=1 but no systemd user manager: {exc.reason}", pytrace=False)
        pytest.skip(f"no systemd user manager: {exc.reason}")
    request.config.stash[_SUMMARY] = manager.describe()
    try:
        yield manager
    finally:
        problems = manager.close()
        summary = manager.describe()
        if manager.kind == "host":
            summary += f", acquired in {time.monotonic() - started:.2f} s"
        if problems:
            summary += f"; teardown problems: {problems}"
        request.config.stash[_SUMMARY] = summary
        if problems:
            # Leftovers would be reaped by the next run, but hiding them here would hide a bug.
            pytest.fail(f"systemd_manager teardown: {problems}", pytrace=False)


@pytest.fixture(autouse=True)
def systemd_marker_gate(request: pytest.FixtureRequest) -> None:
    """Give ``@pytest.mark.systemd`` tests the manager's skip/fail even if they do not use it.

    A marked test that forgot the fixture would otherwise run (and fail obscurely) where no
    manager exists, or pass vacuously; requesting the fixture applies the one policy.
    """
    if (
        request.node.get_closest_marker("systemd") is not None
        and "systemd_manager" not in request.fixturenames
    ):
        request.getfixturevalue("systemd_manager")


def mark_systemd_users(items: list[pytest.Item]) -> None:
    """Mark every test that uses ``systemd_manager`` as ``systemd``, so ``-m`` selects it.

    Called from ``pytest_collection_modifyitems`` with ``tryfirst``, so the marks exist before
    pytest's own ``-m`` deselection runs.
    """
    for item in items:
        fixturenames = getattr(item, "fixturenames", ())
        if "systemd_manager" in fixturenames and item.get_closest_marker("systemd") is None:
            item.add_marker(pytest.mark.systemd)


def summary_line(config: pytest.Config) -> str:
    """Which manager the systemd tier used (or why it had none), for the terminal summary."""
    return "systemd tier: " + config.stash.get(_SUMMARY, "not used in this run")
