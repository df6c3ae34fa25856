"""Starting and abandoning child processes the way every backend does (no shell, ever)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Mapping, Sequence

from scope.abc import LaunchSpec

__all__ = ["abandon", "popen"]


def popen(
    spec: LaunchSpec,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    extra_fds: Sequence[int] = (),
    new_session: bool | None = None,
    stderr: int | None = None,
    use_spec_stderr: bool = True,
) -> subprocess.Popen[bytes]:
    """``Popen`` with the spec's cwd, stdio and fds plus ``extra_fds``; raises ``OSError`` when
    the program or cwd cannot be used (exactly as ``subprocess`` does)."""
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=spec.cwd,
        stdin=spec.stdin,
        stdout=spec.stdout,
        stderr=spec.stderr if use_spec_stderr else stderr,
        pass_fds=tuple(spec.pass_fds) + tuple(extra_fds),
        start_new_session=spec.start_new_session if new_session is None else new_session,
        close_fds=True,
    )


def abandon(process: subprocess.Popen[bytes], *, timeout: float = 2.0) -> None:
    """Make sure a child we started (and have not reaped, so its pid is still ours) is gone and
    reaped, and close our ends of its pipes. Used when its placement failed."""
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout)
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
