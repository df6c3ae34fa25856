"""The fallback backend: ``systemd-run [--user] --scope`` in front of the worker's argv.

``systemd-run --scope`` asks the manager for a scope holding *its own* pid, waits for the job, and
then execs the command, so nothing of the worker runs outside the scope and the pid we started
is the worker's. It reaches the manager through ``$XDG_RUNTIME_DIR/systemd/private`` when the
bus is gone (systemd 252), which is why it is the fallback and why the probe exercises it.

To tell "the scope exists and the program runs" from "systemd-run failed", the command it execs
is a fixed shell script (:data:`RUN_WRAPPER`) that first writes one byte to a status pipe, then
restores what systemd-run needed changed (its stderr, which we read for diagnostics, and the two
bus variables when the spec's environment had other values), then execs the real argv. User
strings reach that script only as positional parameters; nothing of theirs is parsed by a shell.
Operations on existing units (kill, cgroup lookup) use ``systemctl``.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal as signals
import subprocess
import threading
import time
from collections.abc import Callable, Mapping

from scope.abc import Launched, LaunchSpec, ManagerKind, Placement, ScopeProperties
from scope.backend import UnitBackend
from scope.bus import BUS_ENV, RUNTIME_ENV, BusInfo
from scope.cgroup import cgroup_procs
from scope.errors import BusError
from scope.gate import holder, python_prefix, resolve_program
from scope.resources import run_properties
from scope.spawn import abandon, popen
from scope.translate import ScopeStartFailed, ScopeTimeout, from_process, is_not_loaded

__all__ = ["PY_RUN_WRAPPER", "RUN_WRAPPER", "SystemdRunBackend"]

# $1: status fd, $2: fd for the program's stderr (1 means "same as stdout"), then -u NAME /
# -s NAME VALUE edits of the environment, then --, then the program's argv.
RUN_WRAPPER = """\
s=$1 e=$2; shift 2
case $s$e in ''|*[!0-9]*) exit 125;; esac
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do
  case $1 in
    -u) unset "$2"; shift 2;;
    -s) export "$2=$3"; shift 3;;
    *) exit 125;;
  esac
done
shift
printf 1 >&"$s"
eval "exec $s>&- 2>&$e"
[ "$e" = 1 ] || eval "exec $e>&-"
exec "$@"
"""

# RUN_WRAPPER in Python, for fd numbers no available shell can redirect.
PY_RUN_WRAPPER = """\
import os, sys
s, e = int(sys.argv[1]), int(sys.argv[2])
args = sys.argv[3:]
while args and args[0] != "--":
    if args[0] == "-u":
        os.environ.pop(args[1], None)
        args = args[2:]
    elif args[0] == "-s":
        os.environ[args[1]] = args[2]
        args = args[3:]
    else:
        os._exit(125)
args = args[1:]
os.write(s, b"1")
os.close(s)
os.dup2(e, 2)
if e != 1:
    os.close(e)
os.execv(args[0], args)
"""
_EXPAND_FLAG = "--expand-environment=no"
_ERR_LIMIT = 64 * 1024


class SystemdRunBackend(UnitBackend):
    """Scopes via ``systemd-run --scope`` (see the module docstring)."""

    name = "systemd-run"

    def __init__(self, discover: Callable[[], BusInfo], *, timeout: float = 10.0) -> None:
        self._discover = discover
        self.timeout = timeout
        self._lock = threading.Lock()
        self._expand_flag: bool | None = None  # None: not known yet

    # -- launch ------------------------------------------------------------------------------

    def _tool(self, name: str, env: Mapping[str, str]) -> str:
        path = shutil.which(name, path=env.get("PATH") or os.defpath)
        if path is None:
            raise BusError(
                f"{name} is not installed (not found on PATH)", backend=self.name, unit=None
            )
        return path

    def _info(self, unit: str | None) -> BusInfo:
        info = self._discover()
        if not info.usable:
            raise BusError(
                f"no usable runtime dir: {info.detail}",
                backend=self.name,
                unit=unit,
                detail=info.detail,
            )
        return info

    def launch(
        self,
        spec: LaunchSpec,
        unit: str,
        properties: ScopeProperties,
        *,
        timeout: float | None = None,
    ) -> Launched:
        """Start ``spec`` through systemd-run; return once the program runs inside ``unit``."""
        info = self._info(unit)
        bound = self.timeout if timeout is None else timeout
        with self._lock:
            expand = self._expand_flag is not False
        try:
            return self._launch(spec, unit, properties, info, bound, expand)
        except ScopeStartFailed as err:
            rejected = "expand-environment" in str(err.fields.get("detail", ""))
            if not (expand and rejected):
                raise
        # Older systemd (252 here) rejects the flag: remember that and retry without it.
        with self._lock:
            self._expand_flag = False
        return self._launch(spec, unit, properties, info, bound, False)

    def _command(
        self,
        info: BusInfo,
        unit: str,
        spec: LaunchSpec,
        properties: ScopeProperties,
        expand: bool,
    ) -> list[str]:
        argv = [self._tool("systemd-run", info.env)]
        if info.manager is not ManagerKind.SYSTEM:
            argv.append("--user")
        argv += ["--scope", "--quiet", "--collect", "--unit", unit]
        if expand:
            argv.append(_EXPAND_FLAG)
        description = " ".join(
            "".join(
                c if c.isprintable() else " " for c in (spec.description or " ".join(spec.argv))
            ).split()
        )[:200]
        argv.append(f"--description={description}")
        argv += run_properties(properties)
        return argv

    def _launch(
        self,
        spec: LaunchSpec,
        unit: str,
        properties: ScopeProperties,
        info: BusInfo,
        bound: float,
        expand: bool,
    ) -> Launched:
        program = resolve_program(spec.argv[0], spec.env, spec.cwd)
        command = self._command(info, unit, spec, properties, expand)
        run_env, edits = _bus_environment(spec, info)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        prog_err, pipe_reader = _program_stderr(spec.stderr)
        opened = [status_r, status_w, err_r, err_w]
        if prog_err is not None:
            opened.append(prog_err)
        if pipe_reader is not None:
            opened.append(pipe_reader)
        try:
            extra = (status_w, prog_err) if prog_err is not None else (status_w,)
            err_target = "1" if prog_err is None else str(prog_err)
            shell = holder(extra)
            if shell is None:
                script = [*python_prefix(), PY_RUN_WRAPPER]
            else:
                script = [*shell, RUN_WRAPPER, "dispatch-scope"]
            argv = [
                *command,
                "--",
                *script,
                str(status_w),
                err_target,
                *edits,
                "--",
                program,
                *spec.argv[1:],
            ]
            process = popen(
                spec, argv, run_env, extra_fds=extra, use_spec_stderr=False, stderr=err_w
            )
            for fd in (status_w, err_w, prog_err):
                if fd is not None:
                    os.close(fd)
                    opened.remove(fd)
            if pipe_reader is not None:
                # The caller asked for a stderr pipe: hand it the program's, not systemd-run's.
                process.stderr = open(pipe_reader, "rb")  # noqa: SIM115 - owned by process
                opened.remove(pipe_reader)
            started = _wait_status(status_r, bound)
            if started is None:
                abandon(process)
                raise ScopeTimeout(
                    f"systemd-run did not place the program within {bound:g} s",
                    backend=self.name,
                    unit=unit,
                )
            if not started:
                stderr = _read_all(err_r, 2.0)
                abandon(process)
                raise from_process(
                    "systemd-run", process.returncode, stderr, backend=self.name, unit=unit
                )
        finally:
            for fd in opened:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return Launched(
            process=process,
            pid=process.pid,
            placement=Placement.SCOPED,
            unit=unit,
            backend=self.name,
        )

    # -- existing units ----------------------------------------------------------------------

    def _systemctl(self, info: BusInfo, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [self._tool("systemctl", info.env)]
        if info.manager is not ManagerKind.SYSTEM:
            argv.append("--user")
        try:
            return subprocess.run(
                [*argv, *args],
                env=dict(info.env),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ScopeTimeout(
                f"systemctl {' '.join(args)} timed out", backend=self.name, unit=None
            ) from exc

    def kill_unit(self, unit: str, signal: int) -> None:
        """``systemctl kill --kill-whom=all``; a unit that is not loaded is a no-op."""
        info = self._info(unit)
        name = signals.Signals(signal).name
        done = self._systemctl(info, "kill", "--kill-whom=all", f"--signal={name}", unit)
        if done.returncode != 0 and "kill-whom" in done.stderr:
            done = self._systemctl(info, "kill", "--kill-who=all", f"--signal={name}", unit)
        if done.returncode != 0 and not is_not_loaded(done.stderr) and not _no_process(done):
            raise from_process(
                "systemctl kill", done.returncode, done.stderr, backend=self.name, unit=unit
            )

    def control_group(self, unit: str) -> str | None:
        """The unit's cgroup path ('' when none now), None when it is not loaded."""
        info = self._info(unit)
        done = self._systemctl(info, "show", "--property=LoadState,ControlGroup", unit)
        if done.returncode != 0:
            raise from_process(
                "systemctl show", done.returncode, done.stderr, backend=self.name, unit=unit
            )
        values = dict(line.partition("=")[::2] for line in done.stdout.splitlines())
        if values.get("LoadState", "not-found") != "loaded":
            return None
        return values.get("ControlGroup", "")

    def unit_pids(self, unit: str) -> list[int] | None:
        control_group = self.control_group(unit)
        if control_group is None:
            return None
        return cgroup_procs(control_group) if control_group else []

    def manager_version(self) -> str:
        """The manager's version, via ``systemctl show``."""
        return self._manager_property("Version")

    def manager_control_group(self) -> str:
        """The manager's ``ControlGroup``, via ``systemctl show``."""
        return self._manager_property("ControlGroup")

    def _manager_property(self, name: str) -> str:
        info = self._info(None)
        done = self._systemctl(info, "show", f"--property={name}", "--value")
        if done.returncode != 0:
            raise from_process(
                "systemctl show", done.returncode, done.stderr, backend=self.name, unit=None
            )
        return done.stdout.strip()


def _no_process(done: subprocess.CompletedProcess[str]) -> bool:
    # An empty (dying) scope: there is nothing left to signal.
    return "No process" in done.stderr or "no process" in done.stderr


def _program_stderr(target: int | None) -> tuple[int | None, int | None]:
    """An fd for the program's stderr (None: same as its stdout), and our read end when the
    caller asked for a pipe. The fd is always >= 3 and ours to close after the spawn."""
    if target == subprocess.STDOUT:
        return None, None
    if target == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC), None
    if target == subprocess.PIPE:
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        return write_end, read_end
    source = 2 if target is None else target
    return os.dup(source), None


def _wait_status(fd: int, bound: float) -> bool | None:
    """True: the wrapper reported the program starting; False: EOF first; None: timed out."""
    deadline = time.monotonic() + bound
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            return os.read(fd, 1) == b"1"


def _read_all(fd: int, bound: float) -> str:
    """What a failed systemd-run wrote on stderr (bounded in time and size)."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + bound
    size = 0
    while size < _ERR_LIMIT:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def _bus_environment(spec: LaunchSpec, info: BusInfo) -> tuple[dict[str, str], list[str]]:
    """systemd-run's environment and the wrapper's edits back to the spec's values.

    systemd-run must find the trusted manager (``info``'s runtime dir and bus); the program
    then gets exactly the spec's values again (``-u KEY`` to unset, ``-s KEY VALUE`` to set)."""
    run_env = dict(spec.env)
    edits: list[str] = []
    for key in (RUNTIME_ENV, BUS_ENV):
        want, have = spec.env.get(key), info.env.get(key)
        if have is None:
            run_env.pop(key, None)
        else:
            run_env[key] = have
        if want != have:
            edits += ["-u", key] if want is None else ["-s", key, want]
    return run_env, edits
