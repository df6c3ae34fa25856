"""The real registry: keepers, real processes, durable sessions (see :mod:`registry.abc`).

Each session is a row in the state database (:mod:`registry.store`) plus a directory of files
shared with its keeper (:mod:`registry.sessiondir`). Any registry instance on the same state
dir can list, read, kill, wait for and finalize any session; a ``follow=True`` instance also
runs one :class:`~registry.follower.Follower` thread that tails followed sessions in memory and
notices their end at once.

Two seams stay in one place each, for completions and hooks built on top:

* :meth:`ProcessRegistry._settle` is where a session becomes final (compare-and-set on
  ``running``, so exactly one instance stores it and :meth:`_published` runs once per
  session); listeners are called from :meth:`_announce`.
* :meth:`ProcessRegistry._view` is where output text is read; :meth:`_handed` is where it
  is handed to a program, after the transform hook and redaction (:mod:`registry.hooks`).

Events (:mod:`registry.events`): ``_settle`` stores the completion event of a notifying
session in the same transaction as its final state; heartbeat and watch events of followed
sessions come from :class:`~registry.notifier.Notifier`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from registry.abc import (
    MAX_HANDOFFS,
    AckResult,
    Event,
    EventListener,
    EventType,
    FinishListener,
    OutputTransform,
    Owner,
    Registry,
    Session,
    SessionState,
    Snapshot,
    SpawnRequest,
    TeardownReport,
    WaitOutcome,
    WaitResult,
)
from registry.errors import AmbiguousId, HandoffRefused, RegistryError, SpawnRefused
from registry.events import EventDraft, EventStore
from registry.follower import Followed, Follower
from registry.guard import GatewayIdentity, gateway_kill_reason
from registry.heartbeat import clamp_interval
from registry.hooks import OutputHooks
from registry.kill import stop_session
from registry.launch import KEEPER_SCRIPT, await_ready, keeper_command, worker_argv
from registry.notifier import Notifier
from registry.output import LogReader, OutputTail, TailView, decode_tail
from registry.output import tail_lines as tail_lines_of
from registry.procinfo import MARKER_ENV, Identity, alive
from registry.prune import prune_sessions
from registry.sessiondir import ExitRecord, SessionDir, keeper_spec, sessions_root
from registry.settings import RegistrySettings
from registry.state import StateDB, ensure_private_dir
from registry.store import KillIntent, SessionStore, StoredSession
from registry.watch import parse_patterns
from scope.abc import GATE_ENV, Launched, LaunchSpec, Placement, Scoper
from scope.foundation.clock import Clock, SystemClock
from scope.foundation.errors import NotFoundError, UsageError
from scope.foundation.procstat import read_stat

__all__ = ["KEEPER_SCRIPT", "ProcessRegistry", "keeper_command", "new_session_id"]

_log = logging.getLogger("dispatch.registry")

STARTING_GRACE = 30.0
"""A row with no keeper yet is "starting" this long before it counts as lost."""
EXACT_CUT_BYTES = 1 << 20
"""Logs up to this size are decoded whole for an exact ``output_cut``."""
_HEX = set("0123456789abcdef")

SERVICE_ENV = (
    "INVOCATION_ID",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "JOURNAL_STREAM",
    "MANAGERPID",
)
"""systemd's per-service variables: a worker that inherited them (from a gateway run as a
service) would believe it is that service (sd_notify to the gateway's socket, socket
activation, a caller "inside a unit"), so spawn never passes them on."""
MAX_NOTE_CHARS = 2000


def new_session_id() -> str:
    """``s_`` + 12 hex digits."""
    return "s_" + secrets.token_hex(6)


class ProcessRegistry(Registry):
    """Sessions of real processes under keepers (see the module docstring).

    ``follow``: run the follower thread for sessions this instance spawns or adopts (the
    gateway, ``dispatch run --wait``); without it, state is reconciled from the files whenever
    a session is read. ``protect_gateway``: refuse commands that would kill this process by
    name (set inside the gateway). ``python`` runs the keeper (default: this interpreter).
    ``hooks``: the output hooks (default: redaction as the settings say, no transform).
    """

    def __init__(
        self,
        *,
        state_dir: Path,
        db: StateDB,
        scoper: Scoper,
        settings: RegistrySettings,
        clock: Clock | None = None,
        protect_gateway: bool = False,
        follow: bool = True,
        python: str | None = None,
        interval: float = 0.05,
        idle_interval: float = 1.0,
        ready_timeout: float = 30.0,
        hooks: OutputHooks | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.store = SessionStore(
            db,
            EventStore(
                db,
                max_pending=settings.max_pending_events,
                max_unacked=settings.max_unacked_events,
            ),
        )
        self.scoper = scoper
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.hooks = hooks or OutputHooks.from_settings(settings)
        self.notifier = Notifier(
            store=self.store, settings=settings, hooks=self.hooks, clock=self.clock
        )
        self.python = python or sys.executable
        self.keeper_argv = keeper_command(self.python, self.state_dir / "cache")
        self.ready_timeout = ready_timeout
        self._gateway = GatewayIdentity.current() if protect_gateway else None
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._listeners: list[FinishListener] = []
        self._announced: set[str] = set()
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._killing: set[str] = set()
        self._closed = False
        self._follower: Follower | None = None
        if follow:
            self._follower = Follower(
                on_exit_record=self._follower_exit_record,
                on_keeper_gone=self._follower_keeper_gone,
                unit_alive=self._unit_alive,
                periodic=self._periodic_prune,
                periodic_every=settings.prune_interval,
                interval=interval,
                idle_interval=idle_interval,
            )

    # -- spawn -------------------------------------------------------------------------------

    def spawn(self, request: SpawnRequest) -> Session:
        argv = worker_argv(request)
        watch = parse_patterns(request.watch)
        heartbeat = _heartbeat_of(request.heartbeat)
        if self._gateway is not None:
            reason = gateway_kill_reason(argv, self._gateway)
            if reason is not None:
                raise SpawnRefused(
                    f"{reason}; this registry runs inside the gateway",
                    remedy="stop a session by id with 'dispatch kill ID' (ids: 'dispatch ps')",
                    command=" ".join(argv),
                )
        session_id = new_session_id()
        sdir = SessionDir.of(self.state_dir, session_id)
        env = {k: v for k, v in request.env.items() if k != GATE_ENV and k not in SERVICE_ENV}
        env[MARKER_ENV] = session_id
        if request.pty:
            env.setdefault("TERM", "xterm-256color")
        ready_r, ready_w = os.pipe()
        try:
            spec = keeper_spec(
                session_id=session_id,
                directory=sdir.path,
                argv=argv,
                cwd=request.cwd,
                env=env,
                pty=request.pty,
                max_log_bytes=self.settings.max_log_bytes,
                timeout=request.timeout,
                kill_grace=self.settings.kill_grace,
                drain_time=self.settings.drain_time,
                ready_fd=ready_w,
            )
            try:
                ensure_private_dir(sessions_root(self.state_dir))
                sdir.create(spec)
            except OSError as err:
                sdir.remove()
                raise RegistryError(
                    f"cannot create the session directory {sdir.path}: {err.strerror}",
                    remedy="check the state dir's permissions and free space",
                    session=session_id,
                ) from None
            created = self.clock.time()
            draft = Session(
                id=session_id,
                argv=tuple(argv),
                cwd=request.cwd,
                owner=request.owner,
                caller=request.caller,
                placement=Placement.IN_PROCESS,
                unit=None,
                state=SessionState.RUNNING,
                log_path=str(sdir.log),
                pty=request.pty,
                timeout=request.timeout,
                labels=dict(request.labels),
                notify=request.notify or heartbeat is not None,
                heartbeat=heartbeat,
                watch=watch,
            )
            self.store.insert(
                draft,
                dir=str(sdir.path),
                created_at=created,
                output_chars=request.output_chars,
                heartbeat_liveness=request.heartbeat_liveness,
            )
            try:
                launched = self._launch(request, sdir, argv, ready_w)
            except BaseException:
                self.store.delete([session_id])
                sdir.remove()
                raise
            os.close(ready_w)
            ready_w = -1
            keeper = _identity_of(launched.pid)
            self.store.update(
                session_id,
                placement=launched.placement,
                unit=launched.unit,
                keeper_pid=launched.pid,
                keeper_start=keeper.start if keeper else None,
                warning=launched.warning,
            )
            with self._lock:
                self._children[session_id] = launched.process
            started = await_ready(ready_r, self.ready_timeout)
        finally:
            os.close(ready_r)
            if ready_w >= 0:
                os.close(ready_w)
        stored = self._note_keeper_info(self._load(session_id))
        if not started and not sdir.has_exit() and launched.process.poll() is not None:
            # The keeper died before starting anything.
            return self._settle(session_id, lost=self._lost_reason(stored, launched.process))
        if sdir.has_exit():
            # Failed to start, or already done. The keeper may still capture a descendant's
            # output for a while: a follower reaps it later; without one, _refresh does.
            if launched.process.poll() is None and self._follower is not None:
                # Followed first, so the follower's own look at the end is a repeat, not news.
                self._follow(stored, launched.process, fresh=True)
            elif launched.process.poll() is not None:
                self._forget_child(session_id)
            return self._settle(session_id)
        if self._follower is not None:
            self._follow(stored, launched.process, fresh=True)
        return self.get(session_id)

    def _launch(
        self, request: SpawnRequest, sdir: SessionDir, argv: list[str], ready_w: int
    ) -> Launched:
        err_fd = os.open(
            sdir.keeper_err, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
        )
        try:
            return self.scoper.launch(
                LaunchSpec(
                    argv=[*self.keeper_argv, str(sdir.spec)],
                    env={"PATH": os.defpath, "LC_ALL": "C.UTF-8"},
                    cwd=str(sdir.path),
                    unit_parts=(*request.unit_parts, sdir.path.name),
                    description=f"dispatch {request.owner}: {os.path.basename(argv[0])}",
                    pass_fds=(ready_w,),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err_fd,
                    gated=True,
                    start_new_session=True,
                ),
                request.caller,
                wants_isolation=request.wants_isolation,
            )
        finally:
            os.close(err_fd)

    # -- lookup ------------------------------------------------------------------------------

    def get(self, session_id: str) -> Session:
        return self._refresh(self._load(session_id)).session

    def resolve(self, prefix: str) -> Session:
        text = prefix.strip()
        body = text.removeprefix("s_")
        # "At least 4 characters" of the id as typed: s_3f9a and 3f9a both qualify.
        if len(text) < 4 or not body:
            raise UsageError(
                f"session id {prefix!r} is too short",
                remedy="give at least 4 characters of the id (see 'dispatch ps --all')",
            )
        if not set(body) <= _HEX:
            raise NotFoundError("session", prefix, remedy="see 'dispatch ps --all' for ids")
        matches = self.store.ids_with_prefix("s_" + body)
        if not matches:
            raise NotFoundError("session", prefix, remedy="see 'dispatch ps --all' for ids")
        if len(matches) > 1:
            raise AmbiguousId("session", prefix, matches)
        return self.get(matches[0])

    def list_sessions(self, *, include_finished: bool = False) -> list[Session]:
        found = []
        self._reap_children()  # once per listing, not once per session (that was quadratic)
        for stored in self.store.sessions(include_finished=include_finished):
            session = self._refresh(stored, reap=False).session
            if include_finished or not session.finished:
                found.append(session)
        return found

    def _load(self, session_id: str) -> StoredSession:
        stored = self.store.get(session_id)
        if stored is None:
            raise NotFoundError("session", session_id, remedy="see 'dispatch ps --all' for ids")
        return stored

    def _refresh(self, stored: StoredSession, *, reap: bool = True) -> StoredSession:
        """Reconcile a running session nobody here follows with its files and processes
        (``reap``: collect our ended keepers first; callers looping over sessions do it once)."""
        if reap:
            self._reap_children()
        session = stored.session
        if session.finished:
            return stored
        if self._follower is not None and session.id in self._follower:
            return stored
        stored = self._note_keeper_info(stored)
        session = stored.session
        sdir = SessionDir(Path(stored.dir))
        if sdir.has_exit():
            self._settle(session.id)
            return self._load(session.id)
        keeper = _identity(session.keeper_pid, session.keeper_start)
        child = self._children.get(session.id)
        if child is not None and child.poll() is None:
            return stored
        if keeper is not None and alive(keeper):
            return stored
        if keeper is None and self.clock.time() - stored.created_at < STARTING_GRACE:
            return stored
        if session.unit and self._unit_alive(session.unit):
            return stored
        if sdir.has_exit():  # written just before the keeper exited
            self._settle(session.id)
        else:
            self._settle(session.id, lost=self._lost_reason(stored, child))
        return self._load(session.id)

    def _note_keeper_info(self, stored: StoredSession) -> StoredSession:
        """Copy keeper.json's facts into the row when it does not have them yet."""
        session = stored.session
        if session.worker_pid is not None:
            return stored
        info = SessionDir(Path(stored.dir)).read_keeper()
        if info is None:
            return stored
        fields: dict[str, object] = {
            "worker_pid": info.worker_pid,
            "worker_start": info.worker_start,
            "started_at": info.started_at,
        }
        if session.keeper_pid is None:
            fields.update(keeper_pid=info.keeper_pid, keeper_start=info.keeper_start)
        self.store.update(session.id, **fields)
        return self._load(session.id)

    # -- output ------------------------------------------------------------------------------

    def poll(self, session_id: str) -> Snapshot:
        return self._snapshot(self._refresh(self._load(session_id)), "poll")

    def _snapshot(self, stored: StoredSession, purpose: str) -> Snapshot:
        chars = self._chars(stored)
        view = self._view(stored, chars)
        session = stored.session
        return Snapshot(
            session=session,
            output=self._handed(view.text, session, session.exit_code, purpose),
            output_cut=view.cut + session.dropped_bytes,
        )

    def _chars(self, stored: StoredSession) -> int:
        return self.settings.output_chars if stored.output_chars is None else stored.output_chars

    def _handed(self, text: str, session: Session, exit_code: int | None, purpose: str) -> str:
        """Output text on its way to a program: the transform hook, then redaction."""
        return self.hooks.apply(
            text,
            session_id=session.id,
            owner=session.owner,
            exit_code=exit_code,
            purpose=purpose,
        )

    def set_output_transform(self, hook: OutputTransform | None) -> None:
        """Install the output-transform hook (runs before redaction; None removes it)."""
        self.hooks.set_transform(hook)

    def preview(self, session_id: str, chars: int = 200) -> str:
        stored = self._refresh(self._load(session_id))
        view = self._view(stored, max(0, chars))
        session = stored.session
        return self._handed(view.text, session, session.exit_code, "preview")

    def _view(self, stored: StoredSession, chars: int, *, final: bool | None = None) -> TailView:
        """The end of a session's output as text (raw: hooks apply in :meth:`_handed`)."""
        if final is None:
            final = stored.session.finished
        if self._follower is not None:
            entry = self._follower.catch_up(stored.session.id)
            if entry is not None:
                with self._follower.lock:
                    return entry.tail.text(chars, final=final)
        path = stored.session.log_path
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                take = size if size <= EXACT_CUT_BYTES else min(size, chars * 4 + 4)
                f.seek(size - take)
                data = f.read(take)
        except FileNotFoundError:
            return TailView(text="", cut=0)
        return decode_tail(data, size - take, chars, final=final)

    def read_log(
        self,
        session_id: str,
        *,
        head: int | None = None,
        tail_lines: int | None = None,
        byte_range: tuple[int, int] | None = None,
    ) -> bytes:
        stored = self._load(session_id)
        try:
            with open(stored.session.log_path, "rb") as f:
                if byte_range is not None:
                    start, end = byte_range
                    f.seek(max(0, start))
                    return f.read(max(0, end - max(0, start)))
                if head is not None:
                    return f.read(max(0, head))
                if tail_lines is not None:
                    return tail_lines_of(f, tail_lines)
                return f.read()
        except FileNotFoundError:
            return b""

    def write_stdin(self, session_id: str, data: bytes) -> None:
        stored = self._refresh(self._load(session_id))
        session = stored.session
        if session.finished:
            raise RegistryError(
                f"session {session_id} is {session.state.value}; its stdin is closed",
                session=session_id,
            )
        SessionDir(Path(stored.dir)).write_stdin(data, session_id=session_id)

    # -- wait --------------------------------------------------------------------------------

    def wait(
        self,
        session_id: str,
        *,
        timeout: float | None = None,
        interrupt: threading.Event | Callable[[], bool] | None = None,
    ) -> WaitResult:
        deadline = None if timeout is None else time.monotonic() + timeout
        followed = self._follower is not None and session_id in self._follower
        while True:
            stored = self._refresh(self._load(session_id))
            if stored.session.finished:
                return WaitResult(
                    outcome=WaitOutcome.FINISHED, snapshot=self._snapshot(stored, "wait")
                )
            if interrupt is not None and _fired(interrupt):
                return WaitResult(
                    outcome=WaitOutcome.INTERRUPTED, snapshot=self._snapshot(stored, "wait")
                )
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return WaitResult(
                    outcome=WaitOutcome.TIMEOUT, snapshot=self._snapshot(stored, "wait")
                )
            step = 0.25 if followed and interrupt is None else 0.05
            with self._changed:
                self._changed.wait(step if remaining is None else min(step, remaining))

    # -- kill --------------------------------------------------------------------------------

    def kill(
        self,
        session_id: str,
        *,
        grace: float | None = None,
        state: SessionState = SessionState.KILLED,
        reason: str = "killed by request",
    ) -> Snapshot:
        stored = self._refresh(self._load(session_id))
        session = stored.session
        if session.finished:
            return self._snapshot(stored, "kill")
        grace = self.settings.kill_grace if grace is None else max(0.0, grace)
        state = SessionState(state)
        # Wall time of real processes (compared with the keeper's exit time), not the clock.
        intent = KillIntent(state=state, reason=reason, requested_at=time.time())
        self.store.record_kill(session.id, intent)
        with self._lock:
            self._killing.add(session.id)
        try:
            final = self._kill(stored, intent, grace)
        finally:
            with self._lock:
                self._killing.discard(session.id)
        if not final.finished:
            raise RegistryError(f"session {session.id} did not finish", session=session.id)
        return self._snapshot(self._load(session.id), "kill")

    def _kill(self, stored: StoredSession, intent: KillIntent, grace: float) -> Session:
        session = stored.session
        worker = _identity(session.worker_pid, session.worker_start)
        keeper = _identity(session.keeper_pid, session.keeper_start)
        outcome = stop_session(
            session_id=session.id,
            worker=worker,
            keeper=keeper,
            unit=session.unit if session.placement is Placement.SCOPED else None,
            scoper=self.scoper,
            grace=grace,
            before_signal=lambda: self.store.mark_signalled(session.id, time.time()),
        )
        if not outcome.stopped:
            pids = ", ".join(str(p.pid) for p in outcome.survivors)
            raise RegistryError(
                f"could not kill session {session.id}: {len(outcome.survivors)} process(es) "
                f"survive SIGKILL (pid {pids})",
                remedy="they may be stuck in the kernel (state D); check 'ps -o pid,stat,cmd'",
                session=session.id,
            )
        sdir = SessionDir(Path(stored.dir))
        child = self._children.get(session.id)
        _await(lambda: sdir.has_exit() or not _keeper_alive(keeper, child), 3.0)
        if sdir.has_exit():
            return self._settle(session.id)
        # The keeper went down with the worker (a scope stop SIGKILLs both) or is stuck:
        # record what we know; the strongest signal we had to send is what ended it.
        fallback = ExitRecord(
            state=intent.state.value,
            exit_code=None,
            signal=outcome.signal,
            reason=f"{intent.reason} ({outcome.signal})" if outcome.signal else intent.reason,
            started_at=session.started_at,
            finished_at=time.time(),
            total_bytes=sdir.log_size(),
            writer="registry",
        )
        if not _keeper_alive(keeper, child):
            with contextlib.suppress(OSError):
                sdir.write_exit(fallback)
        final = self._settle(session.id, fallback=fallback)
        if (
            final.state is intent.state
            and final.signal is None
            and final.exit_code is None
            and outcome.signal
        ):
            # Another instance finalized first without knowing the signal: correct the row
            # and its completion event together.
            self.store.amend_final(session.id, signal=outcome.signal)
            final = self._load(session.id).session
        return final

    # -- adoption and pruning ----------------------------------------------------------------

    def adopt(self) -> list[Session]:
        changed: list[Session] = []
        self._reap_children()
        for stored in self.store.running():
            session = stored.session
            if self._follower is not None and session.id in self._follower:
                continue
            refreshed = self._refresh(stored, reap=False)
            if refreshed.session.finished:
                changed.append(refreshed.session)
                continue
            if self._follower is not None:
                self._follow(refreshed, self._children.get(session.id), fresh=False)
                changed.append(refreshed.session)
        return changed

    def prune(self, *, now: float | None = None) -> int:
        ids = prune_sessions(
            self.store, self.state_dir, self.settings, self.clock.time() if now is None else now
        )
        with self._lock:
            self._announced.difference_update(ids)
        return len(ids)

    def _periodic_prune(self) -> None:
        removed = self.prune()
        if removed:
            _log.info("pruned %d finished sessions", removed)

    # -- following ---------------------------------------------------------------------------

    def _follow(
        self, stored: StoredSession, process: subprocess.Popen[bytes] | None, *, fresh: bool
    ) -> None:
        assert self._follower is not None
        session = stored.session
        reader = LogReader(session.log_path)
        tail = OutputTail(self.settings.tail_chars)
        if not fresh:
            # Adoption: the tail only needs the end of a log that may be large.
            size = reader.size()
            skip = max(0, size - 4 * self.settings.tail_chars)
            if skip:
                reader.offset = skip
                tail.skip(skip)
        keeper = _identity(session.keeper_pid, session.keeper_start)
        unit = None
        if keeper is None or not alive(keeper):
            unit = session.unit
        sink = self.notifier.attach(stored)
        self._follower.add(
            Followed(
                session_id=session.id,
                dir=SessionDir(Path(stored.dir)),
                reader=reader,
                tail=tail,
                keeper=keeper,
                worker=_identity(session.worker_pid, session.worker_start),
                process=process if process is not None and process.poll() is None else None,
                unit=unit,
                sink=sink,
            )
        )

    def _follower_exit_record(self, entry: Followed) -> bool:
        return self._settle(entry.session_id).finished

    def _follower_keeper_gone(self, entry: Followed) -> None:
        stored = self.store.get(entry.session_id)
        if stored is None:
            return
        if not stored.session.finished:
            if entry.dir.has_exit():
                self._settle(entry.session_id)
            elif entry.session_id in self._killing:
                pass  # kill() is finishing it with what it knows (the signal it sent)
            else:
                self._settle(entry.session_id, lost=self._lost_reason(stored, entry.process))
        else:
            self._announce(stored.session)
            self._settle_counts(stored, entry.dir)
        self._forget_child(entry.session_id)

    def _settle_counts(self, stored: StoredSession, sdir: SessionDir) -> None:
        """After the drain: the keeper's last record may count bytes that came late."""
        record = sdir.read_exit()
        if record is not None and record.final and record.total_bytes > stored.session.total_bytes:
            self.store.update(
                stored.session.id,
                total_bytes=record.total_bytes,
                dropped_bytes=record.dropped_bytes,
            )

    def _unit_alive(self, unit: str) -> bool:
        try:
            pids = self.scoper.unit_pids(unit)
        except Exception as err:  # the manager may be gone: then nothing can be confirmed alive
            _log.debug("unit_pids(%s) failed: %s", unit, err)
            return False
        return bool(pids)

    def _reap_children(self) -> None:
        """Collect keepers of ours that ended (nobody else can; a follower does its own)."""
        with self._lock:
            items = list(self._children.items())
        for session_id, child in items:
            if child.poll() is not None and (
                self._follower is None or session_id not in self._follower
            ):
                with self._lock:
                    self._children.pop(session_id, None)

    def _forget_child(self, session_id: str) -> None:
        with self._lock:
            child = self._children.pop(session_id, None)
        if child is not None:
            child.poll()

    # -- finalization ------------------------------------------------------------------------

    def _settle(
        self,
        session_id: str,
        *,
        fallback: ExitRecord | None = None,
        lost: str | None = None,
    ) -> Session:
        """Store the final state from the exit record (or ``fallback``, or ``lost``) unless
        another instance did already; the one place a session becomes final."""
        stored = self._load(session_id)
        if stored.session.finished:
            if self._follower is not None and session_id in self._follower:
                self._announce(stored.session)
            return stored.session
        sdir = SessionDir(Path(stored.dir))
        record = sdir.read_exit() or fallback
        if record is None and lost is not None:
            if stored.kill is not None:
                # The keeper went down with a kill (a scope stop reaches it too).
                state, lost = stored.kill.state, f"{stored.kill.reason} (no exit record: {lost})"
            else:
                state = SessionState.LOST
            record = ExitRecord(
                state=state.value,
                exit_code=None,
                signal=None,
                reason=lost,
                started_at=stored.session.started_at,
                finished_at=self.clock.time(),
                total_bytes=sdir.log_size(),
                writer="registry",
            )
            with contextlib.suppress(OSError):
                sdir.write_exit(record)
        if record is None:
            return stored.session
        final_record = record
        completion = None
        pending = stored.session
        if pending.notify or pending.heartbeat is not None or pending.watch:
            # Watch events of the last lines come before the completion.
            self.notifier.before_final(session_id)
            completion = self._completion_draft(stored, self._final_fields(stored, record))
        won, event = self.store.finalize(
            session_id,
            lambda current: self._final_fields(current, final_record),
            completion=completion,
            now=self.clock.time(),
        )
        self.notifier.detach(session_id)
        session = self._load(session_id).session
        if won:
            self._published(session, event)
        if won or (self._follower is not None and session_id in self._follower):
            self._announce(session)
        return session

    def _completion_draft(self, stored: StoredSession, fields: dict[str, Any]) -> EventDraft:
        """The completion event of a session about to be finalized with ``fields`` (stored
        only if the session notifies; the note and watch summary are added by the store)."""
        view = self._view(stored, self._chars(stored), final=True)
        exit_code = fields.get("exit_code")
        state = SessionState(fields["state"])
        dropped = int(fields.get("dropped_bytes") or 0)
        return EventDraft(
            type=EventType.COMPLETION,
            state=state,
            exit_code=exit_code,
            signal=fields.get("signal"),
            completion_reason=fields.get("completion_reason"),
            output=self._handed(view.text, stored.session, exit_code, "completion"),
            output_cut=view.cut + dropped,
            log_path=stored.session.log_path,
            data={
                "total_bytes": int(fields.get("total_bytes") or 0),
                "dropped_bytes": dropped,
                "finished_at": fields.get("finished_at"),
            },
        )

    def _final_fields(self, stored: StoredSession, record: ExitRecord) -> dict[str, Any]:
        try:
            state = SessionState(record.state)
        except ValueError:
            state = SessionState.EXITED
        reason = record.reason
        intent = stored.kill
        if (
            intent is not None
            and state is SessionState.EXITED
            and record.writer == "keeper"
            and intent.signalled_at is not None
            and (record.signal is not None or (record.finished_at or 0.0) >= intent.signalled_at)
        ):
            # Our signal ended it; an exit before the first signal went out stays an exit,
            # with its own code (the kill merely raced it).
            state = intent.state
            reason = f"{intent.reason} ({record.reason})"
        fields: dict[str, Any] = {
            "state": state,
            "exit_code": record.exit_code,
            "signal": record.signal,
            "finished_at": record.finished_at or self.clock.time(),
            "completion_reason": reason,
            "total_bytes": record.total_bytes,
            "dropped_bytes": record.dropped_bytes,
        }
        if stored.session.started_at is None and record.started_at is not None:
            fields["started_at"] = record.started_at
        return fields

    def _published(self, session: Session, event: Event | None) -> None:
        """Runs exactly once per session, in the instance that stored its final state (the
        publisher of its completion, already stored with that state)."""
        _log.debug("session %s finished: %s", session.id, session.completion_reason)
        self.notifier.emit(event)

    def _announce(self, session: Session) -> None:
        """Wake waiters and call the finish listeners (once per session per instance).

        The remembered ids are bounded by pruning (``registry.max_sessions``), which forgets
        the ids of the rows it deletes."""
        with self._lock:
            self._changed.notify_all()
            if session.id in self._announced:
                return
            self._announced.add(session.id)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(session)
            except Exception:
                _log.exception("finish listener failed for session %s", session.id)

    def _lost_reason(self, stored: StoredSession, process: subprocess.Popen[bytes] | None) -> str:
        parts = ["keeper vanished without an exit record"]
        if stored.session.keeper_pid is None and stored.session.worker_pid is None:
            parts = ["the keeper never started"]
        if process is not None and process.returncode is not None:
            code = process.returncode
            parts.append(
                f"keeper exit status {code}" if code >= 0 else f"keeper killed by signal {-code}"
            )
        detail = SessionDir(Path(stored.dir)).keeper_errors()
        if detail:
            parts.append(f"keeper said: {detail}")
        return "; ".join(parts)

    # -- events and ownership ----------------------------------------------------------------

    def events(
        self,
        *,
        owner: Owner | str | None = None,
        include_acked: bool = False,
        session_id: str | None = None,
        after: int | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        return self.store.events.list(
            owner=owner,
            include_acked=include_acked,
            session_id=session_id,
            after=after,
            limit=limit,
        )

    def ack(self, event_ids: Iterable[str]) -> AckResult:
        return self.store.events.ack(event_ids, now=self.clock.time())

    def pending_completions(self, owner: Owner | str | None = None) -> int:
        count = 0
        self._reap_children()
        for stored in self.store.running_notifying():
            if owner is not None and not owned_by(stored.session.owner, owner):
                continue
            followed = self._follower is not None and stored.session.id in self._follower
            if not followed:
                # Nobody here follows it: reconcile now (a recorded end is published at once).
                stored = self._refresh(stored, reap=False)
                if stored.session.finished:
                    continue
            if SessionDir(Path(stored.dir)).has_exit():
                count += 1
        return count

    def handoff(self, session_id: str, to: Owner, *, note: str, by: Owner | None = None) -> Session:
        text = note.strip()
        if not text:
            raise UsageError(
                "a handoff needs a purpose note", remedy="say why the new owner gets it"
            )
        if len(text) > MAX_NOTE_CHARS:
            raise UsageError(f"the handoff note is longer than {MAX_NOTE_CHARS} characters")
        stored = self._refresh(self._load(session_id))
        session = stored.session
        if session.finished:
            raise HandoffRefused(f"it is {session.state.value}", session=session.id)
        current = session.owner
        if by is not None and by != current:
            raise HandoffRefused(f"it is owned by {current}, not {by}", session=session.id)
        if to == current:
            raise HandoffRefused(f"it is already owned by {to}", session=session.id)
        draft = EventDraft(
            type=EventType.HANDOFF,
            state=SessionState.RUNNING,
            note=text,
            log_path=session.log_path,
            data={"from": str(current), "to": str(to)},
        )
        result, event = self.store.handoff(
            session.id,
            current=current,
            to=to,
            note=text,
            now=self.clock.time(),
            limit=MAX_HANDOFFS,
            draft=draft,
        )
        if result == "limit":
            raise HandoffRefused(
                f"owner {current} already handed off {MAX_HANDOFFS} sessions",
                session=session.id,
                remedy="let the new owner's own work continue it, or wait for it to finish",
            )
        if result != "ok":
            raise HandoffRefused(
                "it finished or changed owner while handing it off", session=session.id
            )
        self.notifier.emit(event)
        return self.get(session.id)

    def teardown_owner(
        self, owner: Owner, *, reason: str | None = None, grace: float | None = None
    ) -> TeardownReport:
        why = reason or f"owner {owner} tore down"
        orphaned: list[Snapshot] = []
        errors: list[str] = []
        for stored in self.store.owned_running(owner):
            stored = self._refresh(stored)
            session = stored.session
            if session.finished:
                continue
            notice = EventDraft(
                type=EventType.ORPHANED,
                state=SessionState.RUNNING,
                log_path=session.log_path,
                note=session.handoff_note,
                data={"reason": why},
            )
            self.notifier.emit(self.store.publish(session.id, notice, now=self.clock.time()))
            try:
                orphaned.append(self.kill(session.id, grace=grace, reason=f"orphaned: {why}"))
            except RegistryError as err:
                errors.append(f"{session.id}: {err}")
        pending = self.events(owner=owner)
        unread = tuple(e for e in pending if e.type is EventType.COMPLETION)
        # The owner is gone: its report carries what it never read, nobody else will.
        self.ack(e.id for e in pending)
        return TeardownReport(
            owner=owner, orphaned=tuple(orphaned), unread=unread, errors=tuple(errors)
        )

    def add_event_listener(self, listener: EventListener) -> None:
        self.notifier.add_listener(listener)

    # -- listeners and lifetime --------------------------------------------------------------

    def add_finish_listener(self, listener: FinishListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def close(self) -> None:
        """Stop the threads and release handles; running workers keep running (closing is
        never a teardown of their owners)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._follower is not None:
            self._follower.close()
        self.notifier.close()
        with self._lock:
            for child in self._children.values():
                child.poll()
            self._children.clear()

    def __enter__(self) -> ProcessRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- helpers ------------------------------------------------------------------------------------


def owned_by(owner: Owner, wanted: Owner | str) -> bool:
    """Whether ``owner`` is routed to ``wanted`` (exact, or a ``:``-bounded string prefix)."""
    if isinstance(wanted, Owner):
        return owner == wanted
    text = str(owner)
    return text == wanted or text.startswith(wanted + ":")


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


def _identity(pid: int | None, start: int | None) -> Identity | None:
    if pid is None or start is None:
        return None
    return Identity(pid=pid, start=start)


def _identity_of(pid: int) -> Identity | None:
    stat = read_stat(pid)
    return None if stat is None else Identity(pid=pid, start=stat.start_time)


def _keeper_alive(keeper: Identity | None, child: subprocess.Popen[bytes] | None) -> bool:
    if child is not None:
        return child.poll() is None
    return keeper is not None and alive(keeper)


def _await(predicate: Callable[[], bool], bound: float) -> bool:
    deadline = time.monotonic() + bound
    delay = 0.002
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        # A bounded poll for another process's file; no event tells us about it.
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True


def _fired(interrupt: threading.Event | Callable[[], bool]) -> bool:
    return interrupt.is_set() if isinstance(interrupt, threading.Event) else bool(interrupt())
