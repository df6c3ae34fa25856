"""The gate: hold a freshly spawned child until its scope exists (see :mod:`scope.abc`).

The parent creates a pipe, the child inherits the read end (named by ``DISPATCH_SCOPE_GATE_FD``)
and blocks on it. After the child is attached to its scope the parent writes ``b"1"`` and closes
the write end; closing without writing means "abort: exit now". Programs that do not know the
protocol are started through :data:`WRAPPER`, a fixed shell script that waits on the gate and
then ``exec``s the real argv. User strings only ever reach it as positional parameters
(``"$@"``), never as script text, so nothing of the caller's is parsed by the shell.

dash (``/bin/sh`` on Debian) only handles file descriptors 0-9 in redirections, and a busy
process hands its children higher numbers, so :func:`holder` picks ``/bin/sh`` when every fd
involved is a single digit, else bash, else a few lines of ``python3 -I -S`` (slower to start,
but it exists wherever we run).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scope.abc import GATE_ENV

__all__ = ["PY_WRAPPER", "WRAPPER", "Gate", "holder", "resolve_program", "wrapped_argv"]

# $1 is the gate fd (our own integer, checked again here), the rest is the program's argv.
# `read` stops at EOF without a newline and still sets `go`; EOF alone leaves it empty.
WRAPPER = """\
fd=$1; shift
case $fd in ''|*[!0-9]*) exit 125;; esac
IFS= read -r go <&"$fd"
[ "$go" = 1 ] || exit 125
eval "exec $fd<&-"
unset DISPATCH_SCOPE_GATE_FD
exec "$@"
"""

# The same in Python, for when no shell can redirect the fd numbers involved.
PY_WRAPPER = """\
import os, sys
fd = int(sys.argv[1])
go = os.read(fd, 1)
os.close(fd)
if go != b"1":
    os._exit(125)
os.environ.pop("DISPATCH_SCOPE_GATE_FD", None)
os.execv(sys.argv[2], sys.argv[2:])
"""

_SHELL = "/bin/sh"
_BASH_CANDIDATES = (
    "/bin/bash",
    "/usr/bin/bash",
    "/usr/local/bin/bash",
    "/run/current-system/sw/bin/bash",
)


@functools.cache
def _bash() -> str | None:
    for path in _BASH_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return None


def holder(fds: Sequence[int]) -> list[str] | None:
    """The interpreter prefix for a wrapper script using ``fds``: ``[shell, "-c"]``, or None
    when only the Python variant can do it (then use ``[sys.executable, "-I", "-S", "-c"]``)."""
    if all(0 <= fd <= 9 for fd in fds):
        return [_SHELL, "-c"]
    bash = _bash()
    return [bash, "-c"] if bash else None


def python_prefix() -> list[str]:
    """How to run a Python wrapper: this interpreter, isolated, without site-packages."""
    return [sys.executable, "-I", "-S", "-c"]


@dataclass(kw_only=True)
class Gate:
    """One gate pipe. ``read_fd`` goes to the child; the parent keeps ``write_fd``."""

    read_fd: int
    write_fd: int

    @classmethod
    def open(cls) -> Gate:
        """A new pipe whose child end is never 0-2 (those are replaced by the child's stdio)."""
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        if read_fd < 3:
            moved = fcntl.fcntl(read_fd, fcntl.F_DUPFD_CLOEXEC, 3)
            os.close(read_fd)
            read_fd = moved
        return cls(read_fd=read_fd, write_fd=write_fd)

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The child's environment: ``base`` plus the gate variable."""
        env = dict(base)
        env[GATE_ENV] = str(self.read_fd)
        return env

    def after_spawn(self) -> None:
        """Close the parent's copy of the child's end (the child has its own now)."""
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1

    def release(self) -> None:
        """Let the child run (it is inside its scope now)."""
        if self.write_fd < 0:
            return
        try:
            os.write(self.write_fd, b"1")
        except BrokenPipeError:
            # The child died before we let it go; its exit is the caller's to observe.
            pass
        finally:
            self.close()

    def close(self) -> None:
        """Abort (if not yet released) and release both fds; idempotent."""
        for name in ("read_fd", "write_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)


def resolve_program(argv0: str, env: Mapping[str, str], cwd: str) -> str:
    """The absolute program the wrapper will exec, found the way ``execvp`` would.

    Resolving here makes a missing program fail at launch with ``FileNotFoundError`` (as a direct
    ``Popen`` would) rather than as an exit status 127 from the wrapper later.
    """
    if "/" in argv0:
        path = argv0 if os.path.isabs(argv0) else os.path.join(cwd, argv0)
        if not os.path.exists(path):
            raise FileNotFoundError(2, "No such file or directory", argv0)
        if not os.access(path, os.X_OK) or os.path.isdir(path):
            raise PermissionError(13, "Permission denied", argv0)
        return path
    found = shutil.which(argv0, path=env.get("PATH", os.defpath))
    if found is None:
        raise FileNotFoundError(2, "No such file or directory", argv0)
    return found if os.path.isabs(found) else os.path.join(cwd, found)


def wrapped_argv(argv: Sequence[str], gate_fd: int, env: Mapping[str, str], cwd: str) -> list[str]:
    """``/bin/sh -c WRAPPER`` holding ``argv`` until the gate opens."""
    program = resolve_program(argv[0], env, cwd)
    shell = holder([gate_fd])
    if shell is None:
        return [*python_prefix(), PY_WRAPPER, str(gate_fd), program, *argv[1:]]
    return [*shell, WRAPPER, "dispatch-gate", str(gate_fd), program, *argv[1:]]
