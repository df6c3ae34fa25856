"""Boot and tear down a private systemd user manager for the real-systemd test tier.

The recipe is the one in SYSTEMD-TESTING.md, with three refinements learnt on systemd 252:

* **Mount namespace.** ``systemd --user`` refuses to start unless ``/run/systemd/system`` exists.
  Creating it on the host would make package scripts believe systemd is PID 1, so the manager
  gets its own mount namespace (``unshare -m --propagation private``) with a tmpfs over
  ``/run/systemd``. Nothing it mounts is visible on the host; the processes it starts live in that
  namespace, which tests do not notice because they only share TMPDIR and the runtime dir with it.
* **The bus belongs to the manager.** A user manager exposes its D-Bus API only while its own
  ``dbus.socket`` and ``dbus.service`` units run, and that ``dbus.socket`` unlinks and rebinds
  ``$XDG_RUNTIME_DIR/bus``. A dbus-daemon started beside the manager is therefore either replaced
  (then it only lingers) or never used by the manager. Instead we drop our own ``dbus.socket`` and
  ``dbus.service`` into ``$XDG_RUNTIME_DIR/systemd/user.control`` (the highest-priority unit
  directory, inside our private runtime dir) so the manager starts the session bus itself, on any
  distribution, and takes it down on exit.
* **A cgroup subtree of its own.** A user manager roots its units at its own cgroup minus
  ``/init.scope``; started from ``/init.scope`` it would create ``/app.slice`` at the top of the
  host hierarchy, shared with any concurrent run. We create ``/<runtime dir name>/init.scope`` in
  the cgroup2 hierarchy (and in the v1 ``name=systemd`` one on hybrid hosts) and move the manager
  there before it execs, so all its units live under one subtree that we can empty and remove.

Every run writes a record (owner pytest process, manager and bus pids with kernel start times,
runtime dir, cgroup) to a file under TMPDIR. A later run reaps records whose owner is dead:
it signals only processes whose pid *and* start time match, kills what is left in the recorded
cgroup subtree, and removes the runtime dir. Records of live owners (a concurrent run) are left
alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from scope.cgroup import MountInfoEntry, cgroup2_mount, parse_mountinfo

from .procs import ProcessIdentity, identify, is_alive, stop_child, terminate
from .wait import WaitTimeout, wait_for

__all__ = [
    "ManagerUnavailable",
    "PrivateCgroup",
    "PrivateManager",
    "boot_private_manager",
    "reap_leftovers",
]

# sun_path is 108 bytes including the terminating NUL.
_SUN_PATH_MAX = 107
_SYSTEMD_BINARIES = ("/lib/systemd/systemd", "/usr/lib/systemd/systemd")
_RUNTIME_PREFIX = "dsd-"
_RUNTIME_NAME = re.compile(r"^dsd-[A-Za-z0-9_]{1,32}$")

# Runs as the unshared process: join our cgroups, hide /run/systemd behind a tmpfs that says
# "booted with systemd", then become the manager (same pid, so the record stays valid).
_BOOT_SCRIPT = """\
for f do printf '%s\\n' "$$" > "$f" || exit 97; done
mount -t tmpfs -o mode=0755 tmpfs /run/systemd || exit 98
mkdir /run/systemd/system || exit 99
exec "$0" --user
"""

_DBUS_SOCKET_UNIT = """\
[Unit]
Description=D-Bus session bus socket (dispatch test fixture)

[Socket]
ListenStream=%t/bus
"""

# Type=simple rather than the distribution's Type=notify: it works with a dbus-daemon built
# without sd_notify support, and clients queue on the already-listening socket meanwhile.
_DBUS_SERVICE_UNIT = """\
[Unit]
Description=D-Bus session bus (dispatch test fixture)
Requires=dbus.socket

[Service]
ExecStart={dbus_daemon} --session --address=systemd: --nofork --nopidfile --systemd-activation
Slice=session.slice
"""


class ManagerUnavailable(Exception):
    """No systemd user manager can be had; ``reason`` says why, for a skip or failure message."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def _cgroup_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[MountInfoEntry]:
    """cgroup v1 and v2 mounts of a hierarchy's root (bind mounts of subtrees are skipped)."""
    text = Path(mountinfo).read_text(encoding="utf-8", errors="surrogateescape")
    return [e for e in parse_mountinfo(text) if e.fstype in ("cgroup", "cgroup2") and e.root == "/"]


@dataclass(frozen=True, kw_only=True)
class PrivateCgroup:
    """The cgroup subtree ``/<name>`` that holds one private manager and everything it starts."""

    name: str
    v2_mount: Path

    @property
    def path(self) -> str:
        """The subtree as a cgroup path (``/dsd-xyz``), as ``ControlGroup`` values begin."""
        return f"/{self.name}"

    @classmethod
    def create(cls, name: str) -> PrivateCgroup:
        """Create ``/<name>/init.scope`` in cgroup2 and, on hybrid hosts, in ``name=systemd``.

        Raises ``OSError`` when the hierarchy is not writable (not root, read-only cgroupfs).
        """
        cls._check_name(name)
        v2 = cgroup2_mount()
        if v2 is None:
            raise FileNotFoundError("cgroup2 is not mounted")
        made = cls(name=name, v2_mount=v2)
        try:
            for procs in made.join_files():
                procs.parent.mkdir(parents=True, exist_ok=True)
            for top in made.delegated_v1():
                top.mkdir(exist_ok=True)
        except OSError:
            made.remove()
            raise
        return made

    @classmethod
    def attach(cls, name: str) -> PrivateCgroup | None:
        """The subtree recorded by an earlier run, or None if cgroup2 is not mounted."""
        cls._check_name(name)
        v2 = cgroup2_mount()
        return None if v2 is None else cls(name=name, v2_mount=v2)

    @staticmethod
    def _check_name(name: str) -> None:
        # The name comes from a record file; it becomes a path under /sys/fs/cgroup.
        if not _RUNTIME_NAME.match(name):
            raise ValueError(f"not a fixture cgroup name: {name!r}")

    def join_files(self) -> list[Path]:
        """The ``cgroup.procs`` files the manager writes its pid to before it execs.

        systemd tracks processes in cgroup2 on hybrid hosts but also mirrors them into the v1
        ``name=systemd`` hierarchy, so the manager is moved in both to keep them consistent.
        """
        files = [self.v2_mount / self.name / "init.scope" / "cgroup.procs"]
        for entry in _cgroup_mounts():
            if entry.fstype == "cgroup" and "name=systemd" in entry.super_options.split(","):
                files.append(entry.mount_point / self.name / "init.scope" / "cgroup.procs")
        return files

    def delegated_v1(self) -> list[Path]:
        """``/<name>`` in the v1 memory hierarchy (hybrid hosts): the memory controller's grant.

        A user manager on a hybrid host uses a v1 controller only where its own root
        (``/<name>``, from ``name=systemd``) exists and is writable in that controller's
        hierarchy; without it ``MemoryMax=`` is recorded on the unit but never enforced. Only
        the manager's units move there; the manager itself stays where it was started.
        """
        return [
            entry.mount_point / self.name
            for entry in _cgroup_mounts()
            if entry.fstype == "cgroup" and "memory" in entry.super_options.split(",")
        ]

    def pids(self) -> list[int]:
        """Every pid anywhere in the subtree (cgroup2 view)."""
        root = self.v2_mount / self.name
        found: list[int] = []
        if not root.is_dir():
            return found
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                found.extend(int(word) for word in procs.read_text().split())
        return sorted(found)

    def kill_all(self, timeout: float = 5.0) -> None:
        """SIGKILL everything left in the subtree and wait (bounded) until it is empty.

        ``cgroup.kill`` (Linux 5.14+) kills the whole subtree atomically, with no pid to confirm.
        Without it, each pid is confirmed as ours by its pidfd-pinned membership in our subtree.
        """
        root = self.v2_mount / self.name
        if not root.is_dir():
            return
        kill_file = root / "cgroup.kill"
        if kill_file.exists():
            kill_file.write_text("1")
        else:
            for pid in self.pids():
                self._kill_if_member(pid)
        wait_for(lambda: not self.pids(), timeout, what=f"cgroup {self.path} to be empty")

    def _kill_if_member(self, pid: int) -> None:
        """SIGKILL ``pid`` only if, pinned by a pidfd, it is still inside our subtree."""
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            with contextlib.suppress(OSError):
                line = next(
                    ln
                    for ln in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                    if ln.startswith("0::")
                )
                if (line[3:] + "/").startswith(self.path + "/"):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            os.close(pidfd)

    def remove(self) -> None:
        """Remove the (empty) subtree from every cgroup hierarchy it was created in, deepest first.

        cgroupfs only lets empty directories go and ignores the control files inside, so
        ``rmdir`` on each directory is the whole job; a busy one is left and reported by the
        caller's emptiness check instead.
        """
        for entry in _cgroup_mounts():
            top = entry.mount_point / self.name
            if not top.is_dir():
                continue
            dirs = sorted(
                (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            )
            for directory in [*dirs, top]:
                with contextlib.suppress(OSError):
                    directory.rmdir()


@dataclass(kw_only=True)
class _Record:
    """What one run started, written to TMPDIR so a later run can clean up after a hard kill."""

    path: Path
    owner: ProcessIdentity
    runtime_dir: Path
    cgroup: str | None = None
    processes: dict[str, ProcessIdentity] = field(default_factory=dict)

    @staticmethod
    def directory() -> Path:
        """Where records live: TMPDIR (``tempfile.gettempdir()``)."""
        return Path(tempfile.gettempdir())

    @classmethod
    def pattern(cls) -> str:
        """Glob for this user's records."""
        return f"dispatch-systemd-fixture-{os.getuid()}-*.json"

    @classmethod
    def new(cls, runtime_dir: Path) -> _Record:
        """A record for the current process."""
        me = identify(os.getpid())
        path = cls.directory() / f"dispatch-systemd-fixture-{os.getuid()}-{me.pid}.json"
        return cls(path=path, owner=me, runtime_dir=runtime_dir)

    @classmethod
    def load(cls, path: Path) -> _Record:
        """Read a record; ``ValueError``/``KeyError``/``OSError`` when it is unreadable."""
        data = json.loads(path.read_text())
        return cls(
            path=path,
            owner=ProcessIdentity.from_json(data["owner"]),
            runtime_dir=Path(data["runtime_dir"]),
            cgroup=data.get("cgroup"),
            processes={
                role: ProcessIdentity.from_json(ident)
                for role, ident in data.get("processes", {}).items()
            },
        )

    def save(self) -> None:
        """Write atomically (temp + fsync + rename) so a reaper never reads half a record."""
        data = {
            "owner": self.owner.to_json(),
            "runtime_dir": str(self.runtime_dir),
            "cgroup": self.cgroup,
            "processes": {role: ident.to_json() for role, ident in self.processes.items()},
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def delete(self) -> None:
        """Remove the record once everything it lists is gone."""
        self.path.unlink(missing_ok=True)


def _cleanup(record: _Record) -> list[str]:
    """Stop and remove everything a record lists; returns problems (empty when all went)."""
    problems: list[str] = []
    # The manager first: its exit also stops the bus service it runs.
    for role in ("manager", "dbus"):
        ident = record.processes.get(role)
        if ident is not None and not terminate(ident, grace=5.0, kill_after=5.0):
            problems.append(f"{role} pid {ident.pid} survived SIGKILL")
    if record.cgroup is not None:
        cgroup = PrivateCgroup.attach(record.cgroup)
        if cgroup is not None:
            try:
                cgroup.kill_all()
            except WaitTimeout as exc:
                problems.append(str(exc))
            cgroup.remove()
    runtime = record.runtime_dir
    # The path comes from a file anyone in TMPDIR could have written: remove only our own shape.
    if runtime.parent == _Record.directory() and _RUNTIME_NAME.match(runtime.name):
        shutil.rmtree(runtime, ignore_errors=True)
    return problems


def reap_leftovers() -> list[str]:
    """Clean up after earlier runs that died without tearing down; returns one note per record."""
    notes: list[str] = []
    for path in sorted(_Record.directory().glob(_Record.pattern())):
        try:
            record = _Record.load(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if is_alive(record.owner):
            continue  # a concurrent run owns it
        problems = _cleanup(record)
        if not problems:
            record.delete()
        notes.append(f"reaped leftovers of pid {record.owner.pid}: {problems or 'clean'}")
    return notes


@dataclass(kw_only=True)
class PrivateManager:
    """A running private manager: its process, record, cgroup and runtime dir."""

    runtime_dir: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes]
    record: _Record
    cgroup: PrivateCgroup | None
    log_path: Path
    boot_seconds: float = 0.0
    shutdown_seconds: float | None = None
    notes: list[str] = field(default_factory=list)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the manager's own stdout/stderr, for failure messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no manager log)"
        return "\n".join(text.splitlines()[-lines:])

    def shutdown(self, *, exit_timeout: float = 10.0) -> list[str]:
        """Ask the manager to exit, escalate by pid, empty and remove the cgroup and runtime dir.

        Bounded throughout: ``systemctl --user exit`` and up to ``exit_timeout`` s for the manager
        to go, then SIGTERM/SIGKILL with 5 s each. Returns problems (empty on a clean exit).
        """
        started = time.monotonic()
        problems: list[str] = []
        if self.process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                subprocess.run(
                    ["systemctl", "--user", "exit"],
                    env=self.env,
                    capture_output=True,
                    timeout=5.0,
                    check=False,
                )
            try:
                self.process.wait(timeout=exit_timeout)
            except subprocess.TimeoutExpired:
                problems.append(f"manager did not exit within {exit_timeout:g} s; signalled")
                try:
                    stop_child(self.process, grace=5.0, kill_after=5.0)
                except subprocess.TimeoutExpired:
                    problems.append(f"manager pid {self.process.pid} survived SIGKILL")
        # The manager reaped; its pid must not be signalled again by the generic cleanup.
        self.record.processes.pop("manager", None)
        problems.extend(_cleanup(self.record))
        if not problems:
            self.record.delete()
        self.shutdown_seconds = time.monotonic() - started
        return problems


def _which_all(names: tuple[str, ...]) -> dict[str, str] | str:
    """Resolve tools on PATH; a reason string when one is missing."""
    found: dict[str, str] = {}
    for name in names:
        path = shutil.which(name)
        if path is None:
            return f"{name} not found on PATH"
        found[name] = path
    return found


def _preflight() -> tuple[dict[str, str], str]:
    """Check that a private manager can be booted here; returns (tools, systemd binary)."""
    if os.geteuid() != 0:
        raise ManagerUnavailable(
            "not root: a private manager needs a mount namespace (unshare -m) and cgroup writes"
        )
    tools = _which_all(("unshare", "systemctl", "systemd-run", "busctl", "dbus-daemon"))
    if isinstance(tools, str):
        raise ManagerUnavailable(tools)
    binary = next((b for b in _SYSTEMD_BINARIES if os.access(b, os.X_OK)), None)
    if binary is None:
        raise ManagerUnavailable(f"no systemd binary at {' or '.join(_SYSTEMD_BINARIES)}")
    if not Path("/run/systemd").is_dir():
        raise ManagerUnavailable("/run/systemd does not exist (nothing to cover with a tmpfs)")
    if cgroup2_mount() is None:
        raise ManagerUnavailable("cgroup2 is not mounted (see /proc/self/mountinfo)")
    return tools, binary


def _write_bus_units(runtime_dir: Path, dbus_daemon: str) -> None:
    """Put our session-bus units in the manager's highest-priority unit directory."""
    units = runtime_dir / "systemd" / "user.control"
    wants = units / "sockets.target.wants"
    wants.mkdir(parents=True)
    (units / "dbus.socket").write_text(_DBUS_SOCKET_UNIT)
    (units / "dbus.service").write_text(_DBUS_SERVICE_UNIT.format(dbus_daemon=dbus_daemon))
    (wants / "dbus.socket").symlink_to("../dbus.socket")


def _manager_ready(proc: subprocess.Popen[bytes], env: dict[str, str]) -> bool:
    """True once the manager answers on its private socket and on the session bus."""
    if proc.poll() is not None:
        raise ManagerUnavailable(f"systemd --user exited during boot with status {proc.returncode}")
    private = Path(env["XDG_RUNTIME_DIR"], "systemd", "private")
    if not private.is_socket():
        return False
    probes = (
        ["systemctl", "--user", "show", "--property=Version", "--value"],
        [
            "busctl",
            "--user",
            "get-property",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "Version",
        ],
    )
    for argv in probes:
        try:
            done = subprocess.run(argv, env=env, capture_output=True, timeout=5.0, check=False)
        except subprocess.TimeoutExpired:
            return False
        if done.returncode != 0:
            return False
    return True


def boot_private_manager(base_env: dict[str, str], *, timeout: float = 20.0) -> PrivateManager:
    """Boot a private user manager with its session bus; ``ManagerUnavailable`` if impossible.

    ``base_env`` is the environment to start from (normally a copy of ``os.environ``); the
    manager gets it plus ``XDG_RUNTIME_DIR`` and ``DBUS_SESSION_BUS_ADDRESS`` for the private
    runtime dir. Anything started before a failure is torn down before raising.
    """
    tools, binary = _preflight()
    notes = reap_leftovers()
    runtime_dir = Path(tempfile.mkdtemp(prefix=_RUNTIME_PREFIX))
    runtime_dir.chmod(0o700)
    record = _Record.new(runtime_dir)
    record.save()
    for sock in (runtime_dir / "bus", runtime_dir / "systemd" / "private"):
        if len(os.fsencode(sock)) > _SUN_PATH_MAX:
            _cleanup(record)
            record.delete()
            raise ManagerUnavailable(
                f"socket path {sock} is longer than {_SUN_PATH_MAX} bytes; set a shorter TMPDIR"
            )
    cgroup: PrivateCgroup | None
    try:
        cgroup = PrivateCgroup.create(runtime_dir.name)
    except OSError as exc:
        # Without a subtree of its own the manager still works; it roots its units next to ours.
        cgroup = None
        notes.append(f"no private cgroup subtree ({exc}); units share the parent cgroup")
    record.cgroup = None if cgroup is None else cgroup.name
    record.save()
    _write_bus_units(runtime_dir, tools["dbus-daemon"])
    env = dict(base_env)
    env["XDG_RUNTIME_DIR"] = str(runtime_dir)
    env["DBUS_SESSION_BUS_ADDRESS"] = f"unix:path={runtime_dir / 'bus'}"
    log_path = runtime_dir / "manager.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                tools["unshare"],
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                _BOOT_SCRIPT,
                binary,
                *(str(p) for p in (cgroup.join_files() if cgroup else [])),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C in the terminal reaches pytest, whose teardown then stops
            # the manager in order, instead of killing it mid-test.
            start_new_session=True,
        )
    # Unreaped, so the pid is still this child's; unshare and sh exec, keeping pid and start time.
    record.processes["manager"] = identify(process.pid)
    record.save()
    manager = PrivateManager(
        runtime_dir=runtime_dir,
        env=env,
        process=process,
        record=record,
        cgroup=cgroup,
        log_path=log_path,
        notes=notes,
    )
    try:
        wait_for(lambda: _manager_ready(process, env), timeout, what="the private manager")
        manager.boot_seconds = time.monotonic() - started
        dbus_pid = _main_pid(env, "dbus.service")
        if dbus_pid:
            with contextlib.suppress(ProcessLookupError):
                record.processes["dbus"] = identify(dbus_pid)
                record.save()
    except (ManagerUnavailable, WaitTimeout) as exc:
        tail = manager.log_tail()
        manager.shutdown(exit_timeout=2.0)
        raise ManagerUnavailable(f"private manager did not boot: {exc}\n{tail}") from exc
    return manager


def _main_pid(env: dict[str, str], unit: str) -> int:
    """MainPID of a unit (0 when it has none)."""
    done = subprocess.run(
        ["systemctl", "--user", "show", "--property=MainPID", "--value", unit],
        env=env,
        capture_output=True,
        text=True,
        timeout=5.0,
        check=False,
    )
    return int(done.stdout.strip() or 0) if done.returncode == 0 else 0


@contextlib.contextmanager
def renamed_away(*paths: Path, suffix: str = ".unreachable") -> Iterator[None]:
    """Rename paths aside for the duration of the block; always rename them back.

    A listening unix socket keeps working under any name, so renaming its file makes new
    connections fail (as if the service were gone) while restoring it makes them work again,
    without touching the server. Paths renamed before a failure are restored too.
    """
    moved: list[tuple[Path, Path]] = []
    try:
        for path in paths:
            hidden = path.with_name(path.name + suffix)
            os.rename(path, hidden)
            moved.append((path, hidden))
        yield
    finally:
        failures: list[str] = []
        for original, hidden in reversed(moved):
            try:
                os.replace(hidden, original)
            except OSError as exc:
                failures.append(f"{hidden} -> {original}: {exc}")
        if failures:
            raise RuntimeError("could not restore: " + "; ".join(failures))
