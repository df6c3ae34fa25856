"""Spawning: a worker under a keeper, placed by the scope layer, recorded before it runs.

The order matters for restart safety: the session directory and its spec are written, then
the row is stored (a draft with no keeper yet), then the keeper is launched (gated: it waits
until the scope layer placed it), then its placement and pid are recorded, and only then does
the keeper's record gate open: a worker never runs behind a draft row, so a claim whose row has
no keeper can be reclaimed without starting a card twice. Once the keeper says the worker
started (or could not), the session is followed or settled. A launch that raises leaves nothing
behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from dataclasses import dataclass

from registry.abc import SESSION_IDS, Session, SessionState, SpawnRequest
from registry.environment import MARKER_ENV, SERVICE_ENV
from registry.errors import RegistryError, SpawnRefused
from registry.keeper.files import KeeperInfo, SessionDir, keeper_spec
from registry.keeper.start import await_ready, keeper_command, worker_argv
from registry.lifecycle.finalize import Finalizer
from registry.lifecycle.parts import LaunchOptions, Parts
from registry.lifecycle.reconcile import Reconciler
from registry.live.heartbeat import clamp_interval
from registry.live.watch import parse_patterns
from registry.proc.identity import Identity, alive
from registry.proc.refusal import GatewayIdentity, gateway_kill_reason
from registry.store.sessions import Placed, Started
from registry.usage import ResourceClass
from scope.abc import GATE_ENV, Launched, LaunchSpec, Placement
from scope.foundation.errors import UsageError
from scope.foundation.procstat import read_stat

__all__ = ["Spawner", "new_session_id"]

_log = logging.getLogger("dispatch.registry")


def new_session_id() -> str:
    """``s_`` + 12 hex digits."""
    return SESSION_IDS.new()


@dataclass(frozen=True, kw_only=True)
class _Start:
    """A spawn between its launch and its first look at the keeper."""

    session_id: str
    sdir: SessionDir
    process: subprocess.Popen[bytes] | None
    """The keeper when it is our child; None when the fork server started it."""
    keeper: Identity | None
    started: bool
    """The keeper signalled that the worker started (or failed to)."""
    info: KeeperInfo | None
    """Who runs, as the keeper's ready message said (None: it did not say)."""

    def keeper_ended(self) -> bool:
        """Whether the keeper is gone (ours: reaped now; else by pid and start time)."""
        if self.process is not None:
            return self.process.poll() is not None
        return self.keeper is None or not alive(self.keeper)


class Spawner:
    """Starts workers under keepers (see the module docstring)."""

    def __init__(
        self,
        parts: Parts,
        options: LaunchOptions,
        finalizer: Finalizer,
        reconciler: Reconciler,
        *,
        gateway: GatewayIdentity | None = None,
    ) -> None:
        self.parts = parts
        self.options = options
        self.finalizer = finalizer
        self.reconciler = reconciler
        self.gateway = gateway
        """This process when it is the gateway: commands that would kill it are refused."""

    def spawn(self, request: SpawnRequest) -> Session:
        """Start a worker (see :meth:`registry.abc.Registry.spawn`)."""
        argv = worker_argv(request)
        draft = self._draft(request, argv)
        self._guard(argv)
        return self._first_look(self._start(request, argv, draft))

    def _guard(self, argv: list[str]) -> None:
        if self.gateway is None:
            return
        reason = gateway_kill_reason(argv, self.gateway)
        if reason is not None:
            raise SpawnRefused(
                f"{reason}; this registry runs inside the gateway",
                remedy="stop a session by id with 'dispatch kill ID' (ids: 'dispatch ps')",
                command=" ".join(argv),
            )

    def _start(self, request: SpawnRequest, argv: list[str], draft: Session) -> _Start:
        """Write the directory and the row, launch the keeper, record it, open its record
        gate, wait for its start signal."""
        parts = self.parts
        sdir = SessionDir.of(parts.state_dir, draft.id)
        ready_r, ready_w = os.pipe()
        # The record gate: the keeper starts no worker before its pid is in the row. Killed
        # between the scope gate and the record, this process leaves a draft whose keeper
        # exits on EOF, so "no keeper recorded" always means "nothing runs".
        record_r, record_w = os.pipe()
        try:
            self._create_dir(request, argv, draft, sdir, (ready_w, record_r))
            parts.store.insert(
                draft,
                dir=str(sdir.path),
                created_at=parts.clock.time(),
                output_chars=request.output_chars,
                heartbeat_liveness=request.heartbeat_liveness,
            )
            try:
                launched = self._launch(request, sdir, argv, (ready_w, record_r))
            except BaseException:
                parts.store.delete([draft.id])
                sdir.remove()
                raise
            for fd in (ready_w, record_r):
                os.close(fd)
            ready_w = record_r = -1
            keeper = _keeper_identity(launched)
            parts.store.update(
                draft.id,
                Placed(
                    placement=launched.placement,
                    unit=launched.unit,
                    keeper_pid=launched.pid,
                    keeper_start=keeper.start if keeper else None,
                    warning=launched.warning,
                    resources=None
                    if launched.resources is None
                    else ResourceClass.of(launched.resources, launched.ineffective),
                ),
            )
            _open_record_gate(record_w)
            if launched.process is not None:
                with parts.tracking.lock:
                    parts.tracking.children[draft.id] = launched.process
            started, info = await_ready(ready_r, self.options.ready_timeout)
        finally:
            for fd in (ready_r, ready_w, record_r, record_w):
                if fd >= 0:
                    os.close(fd)
        return _Start(
            session_id=draft.id,
            sdir=sdir,
            process=launched.process,
            keeper=keeper,
            started=started,
            info=info,
        )

    def _draft(self, request: SpawnRequest, argv: list[str]) -> Session:
        """The row as stored before the launch (in process, no keeper yet)."""
        watch = parse_patterns(request.watch)
        heartbeat = _heartbeat_of(request.heartbeat)
        session_id = new_session_id()
        return Session(
            id=session_id,
            argv=tuple(argv),
            cwd=request.cwd,
            owner=request.owner,
            caller=request.caller,
            placement=Placement.IN_PROCESS,
            unit=None,
            state=SessionState.RUNNING,
            log_path=str(SessionDir.of(self.parts.state_dir, session_id).log),
            pty=request.pty,
            timeout=request.timeout,
            labels=dict(request.labels),
            notify=request.notify or heartbeat is not None,
            heartbeat=heartbeat,
            watch=watch,
        )

    def _create_dir(
        self,
        request: SpawnRequest,
        argv: list[str],
        draft: Session,
        sdir: SessionDir,
        fds: tuple[int, int],
    ) -> None:
        """The session directory with the keeper's spec (removed again on failure)."""
        settings = self.parts.settings
        env = {k: v for k, v in request.env.items() if k != GATE_ENV and k not in SERVICE_ENV}
        env[MARKER_ENV] = draft.id
        if request.pty:
            env.setdefault("TERM", "xterm-256color")
        spec = keeper_spec(
            session_id=draft.id,
            directory=sdir.path,
            argv=argv,
            cwd=request.cwd,
            env=env,
            pty=request.pty,
            max_log_bytes=settings.max_log_bytes,
            timeout=request.timeout,
            kill_grace=settings.kill_grace,
            drain_time=settings.drain_time,
            ready_fd=fds[0],
            record_fd=fds[1],
        )
        try:
            sdir.create(spec)  # checks the sessions directory first
        except OSError as err:
            sdir.remove()
            raise RegistryError(
                f"cannot create the session directory {sdir.path}: {err.strerror}",
                remedy="check the state dir's permissions and free space",
                session=draft.id,
            ) from None

    def _launch(
        self, request: SpawnRequest, sdir: SessionDir, argv: list[str], fds: tuple[int, int]
    ) -> Launched:
        err_fd = os.open(
            sdir.keeper_err, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
        )
        cache = self.parts.state_dir / "cache"
        try:
            return self.parts.scoper.launch(
                LaunchSpec(
                    # Checked again at every spawn: the cached keeper is code we execute.
                    argv=[*keeper_command(self.options.python, cache), str(sdir.spec)],
                    env={"PATH": os.defpath, "LC_ALL": "C.UTF-8"},
                    cwd=str(sdir.path),
                    unit_parts=(*request.unit_parts, sdir.path.name),
                    description=f"dispatch {request.owner}: {os.path.basename(argv[0])}",
                    pass_fds=fds,  # the ready pipe's write end, the record gate's read end
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err_fd,
                    gated=True,
                    start_new_session=True,
                    resources=request.resources,
                    starter=self.options.starter,
                    # The keeper asks its unit's Result: a runtime_max stop is a timeout.
                    manager_env=True,
                ),
                request.caller,
                wants_isolation=request.wants_isolation,
            )
        finally:
            os.close(err_fd)

    def _first_look(self, start: _Start) -> Session:
        """Follow the started session, or settle one that ended (or never started)."""
        parts, process, sdir = self.parts, start.process, start.sdir
        following = parts.tracking.follower is not None
        info = start.info
        stored = None
        if info is not None:  # the ready message said who runs: one write, one read
            change = Started(
                worker_pid=info.worker_pid,
                worker_start=info.worker_start,
                started_at=info.started_at,
            )
            stored = parts.store.update_and_get(start.session_id, change)
        if stored is None:
            stored = self.reconciler.note_keeper_info(parts.load(start.session_id))
        if not start.started and not sdir.has_exit() and start.keeper_ended():
            # The keeper died before starting anything.
            reason = self.finalizer.lost_reason(stored, process)
            return self.finalizer.settle(start.session_id, lost=reason)
        if sdir.has_exit():
            # Failed to start, or already done. The keeper may still capture a descendant's
            # output for a while: a follower reaps it later; without one, refresh does.
            ended = start.keeper_ended()
            if not ended and following:
                # Followed first, so the follower's own look at the end is a repeat, not news.
                self.reconciler.follow(stored, process, fresh=True)
            elif ended:
                self.reconciler.forget_child(start.session_id)
            return self.finalizer.settle(start.session_id)
        if following:
            self.reconciler.follow(stored, process, fresh=True)
            return stored.session  # the follower notices its end from here on
        return self.reconciler.refresh(stored).session


def _open_record_gate(fd: int) -> None:
    """Let the keeper start its worker (its pid is stored). A keeper already gone leaves the
    pipe without a reader: nothing to tell it, and its start signal will not come either."""
    with contextlib.suppress(OSError):
        os.write(fd, b"1")


def _keeper_identity(launched: Launched) -> Identity | None:
    """The keeper's pid and start time: as the starter read them right after its fork (it
    is not our child, so its pid could be reused once it ends), else read now (our child's
    pid stays ours until we reap it)."""
    if launched.start_time is not None:
        return Identity(pid=launched.pid, start=launched.start_time)
    stat = read_stat(launched.pid)
    return Identity(pid=launched.pid, start=stat.start_time) if stat else None


def _heartbeat_of(value: float | None) -> float | None:
    if value is None:
        return None
    seconds = float(value)
    if not seconds > 0 or seconds == float("inf"):
        raise UsageError(
            f"heartbeat interval {value!r} is not a positive number of seconds",
            remedy="give seconds, e.g. 300",
        )
    used = clamp_interval(seconds)
    if used != seconds:
        _log.info("heartbeat interval %gs raised to the floor of %gs", seconds, used)
    return used
