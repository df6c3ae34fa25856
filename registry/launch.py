"""Starting a keeper: the argv a request runs, the keeper's command line, its ready pipe.

Python never caches the compilation of a script it runs, and compiling ``keeper.py`` costs more
than all of the keeper's start-up work, so the keeper is compiled once per source version into
the private state dir and that bytecode file is run (``python file.pyc`` executes compiled code
directly). The source file is the fallback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import sys
from pathlib import Path

from registry.abc import SpawnRequest
from registry.state import ensure_private_dir
from scope.foundation.errors import UsageError

__all__ = ["KEEPER_SCRIPT", "await_ready", "keeper_command", "worker_argv"]

_log = logging.getLogger("dispatch.registry")

KEEPER_SCRIPT = Path(__file__).with_name("keeper.py")


def keeper_command(python: str | None = None, cache_dir: Path | None = None) -> list[str]:
    """The argv prefix that runs the keeper: ``<python> -I -S <keeper>`` (the spec follows).

    Python never caches the compilation of a script it runs, and compiling the keeper costs
    more than all its start-up work; so when ``python`` is this interpreter the keeper is
    compiled once into ``cache_dir`` (the private state dir) and the bytecode file is run
    (``python file.pyc`` runs compiled code directly). Falls back to the source file."""
    python = python or sys.executable
    if python == sys.executable and cache_dir is not None:
        compiled = _compiled_keeper(Path(cache_dir))
        if compiled is not None:
            return [python, "-I", "-S", str(compiled)]
    return [python, "-I", "-S", str(KEEPER_SCRIPT)]


def _compiled_keeper(cache_dir: Path) -> Path | None:
    import hashlib
    import py_compile

    try:
        source = KEEPER_SCRIPT.read_bytes()
        digest = hashlib.sha256(source).hexdigest()[:16]
        target = cache_dir / f"keeper-{digest}.{sys.implementation.cache_tag}.pyc"
        if target.exists():
            return target
        ensure_private_dir(cache_dir)
        tmp = cache_dir / f".{target.name}.{os.getpid()}.tmp"
        py_compile.compile(
            str(KEEPER_SCRIPT),
            cfile=str(tmp),
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
        for old in cache_dir.glob("keeper-*.pyc"):
            if old != target:
                # A running keeper already holds its code in memory; the file is not needed.
                with contextlib.suppress(OSError):
                    old.unlink()
        return target
    except (OSError, py_compile.PyCompileError) as err:
        _log.debug("running the keeper from source: %s", err)
        return None


def worker_argv(request: SpawnRequest) -> list[str]:
    """The worker's argv: a list as given, or ``/bin/sh -c STRING`` when ``shell`` is set."""
    if request.shell:
        if not isinstance(request.argv, str):
            raise UsageError(
                "shell=True takes the command as one string",
                remedy="pass argv as a list without shell, or one string with shell",
            )
        argv = ["/bin/sh", "-c", request.argv]
    else:
        if isinstance(request.argv, str):
            raise UsageError(
                f"argv is a single string ({request.argv!r})",
                remedy="give a list of arguments, or set shell=True to run it with /bin/sh -c",
            )
        argv = [str(a) for a in request.argv]
    if not argv or not argv[0]:
        raise UsageError("empty command", remedy="give the program to run")
    if any("\0" in a for a in argv):
        raise UsageError("an argument contains a NUL byte")
    return argv


def await_ready(fd: int, timeout: float) -> bool:
    """Wait for the keeper's ready byte; False on EOF (it died) or when the bound passed."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if not poller.poll(int(timeout * 1000)):
        return False
    try:
        return os.read(fd, 1) == b"1"
    except OSError:
        return False
