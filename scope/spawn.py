"""Starting and abandoning child processes the way every backend does (no shell, ever)."""

from __future__ import annotations

import contextlib
import logging
import subprocess
from collections.abc import Mapping, Sequence

from scope.abc import LaunchSpec, Started, StarterDeclined
from scope.gate import Gate

__all__ = ["abandon", "abandon_started", "popen", "start_held", "start_released"]

_log = logging.getLogger("dispatch.scope")


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


def start_held(
    spec: LaunchSpec, argv: Sequence[str], gate: Gate, *, new_session: bool | None = None
) -> tuple[Started, Gate]:
    """Start ``argv`` held behind ``gate`` (its first act is to read it): through the spec's
    starter when it is gated and has one, else with ``Popen``.

    Returns the process and the gate it waits on, whose child end is closed here. A starter
    that declines gets its gate closed at once (anything it half-started reads EOF and exits
    without running), and the program is started with ``Popen`` behind a new gate, so it
    never runs twice. On an exception every gate made here is closed."""
    if spec.starter is not None and spec.gated:
        try:
            started = spec.starter.start(spec, gate.env(spec.env), (*spec.pass_fds, gate.read_fd))
        except StarterDeclined as declined:
            _log.debug("starting %s the usual way: %s", argv[0], declined)
            gate.close()
            gate = Gate.open()
        else:
            gate.after_spawn()
            return started, gate
    try:
        process = popen(
            spec, argv, gate.env(spec.env), extra_fds=(gate.read_fd,), new_session=new_session
        )
    except BaseException:
        gate.close()
        raise
    gate.after_spawn()
    return Started(pid=process.pid, process=process), gate


def start_released(spec: LaunchSpec) -> Started:
    """Start a gated spec through its starter (or ``Popen``) and let it run at once: for
    launches that place nothing, where the gate only proves whether it started."""
    gate = Gate.open()
    try:
        started, gate = start_held(spec, spec.argv, gate)
        gate.release()
    finally:
        gate.close()
    return started


def abandon_started(started: Started, *, timeout: float = 2.0) -> None:
    """After a failed placement, with its gate already closed: reap our child; a starter's
    process exits by itself on the closed gate and is reaped by its own parent."""
    if started.process is not None:
        abandon(started.process, timeout=timeout)


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
