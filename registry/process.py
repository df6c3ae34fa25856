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
* :meth:`ProcessRegistry._view` is where output text is handed to a program.
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
from collections.abc import Callable
from pathlib import Path

from registry.abc import (
    FinishListener,
    Registry,
    Session,
    SessionState,
    Snapshot,
    SpawnRequest,
    WaitOutcome,
    WaitResult,
)
from registry.errors import AmbiguousId, RegistryError, SpawnRefused
from registry.follower import Followed, Follower
from registry.guard import GatewayIdentity, gateway_kill_reason
from registry.kill import stop_session
from registry.launch import KEEPER_SCRIPT, await_ready, keeper_command, worker_argv
from registry.output import LogReader, OutputTail, TailView, decode_tail
from registry.output import tail_lines as tail_lines_of
from registry.procinfo import MARKER_ENV, Identity, alive
from registry.prune import prune_sessions
from registry.sessiondir import ExitRecord, SessionDir, keeper_spec, sessions_root
from registry.settings import RegistrySettings
from registry.state import StateDB, ensure_private_dir
from registry.store import KillIntent, SessionStore, StoredSession
from scope.abc import GATE_ENV, Launched, LaunchSpec, Placement, Scoper
from scope.clock import Clock, SystemClock
from scope.errors import NotFoundError, UsageError
from scope.procstat import read_stat

__all__ = ["KEEPER_SCRIPT", "ProcessRegistry", "keeper_command", "new_session_id"]

_log = logging.getLogger("dispatch.registry")

STARTING_GRACE = 30.0
"""A row with no keeper yet is "starting" this long before it counts as lost."""
EXACT_CUT_BYTES = 1 << 20
"""Logs up to this size are decoded whole for an exact ``output_cut``."""
_HEX = set("0123456789abcdef")


def new_session_id() -> str:
    """``s_`` + 12 hex digits."""
    return "s_" + secrets.token_hex(6)


class ProcessRegistry(Registry):
    """Sessions of real processes under keepers (see the module docstring).

    ``follow``: run the follower thread for sessions this instance spawns or adopts (the
    gateway, ``dispatch run --wait``); without it, state is reconciled from the files whenever
    a session is read. ``protect_gateway``: refuse commands that would kill this process by
    name (set inside the gateway). ``python`` runs the keeper (default: this interpreter).
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
    ) -> None:
        self.state_dir = Path(state_dir)
        self.store = SessionStore(db)
        self.scoper = scoper
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
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
        env = {k: v for k, v in request.env.items() if k != GATE_ENV}
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
            )
            self.store.insert(
                draft, dir=str(sdir.path), created_at=created, output_chars=request.output_chars
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
        if len(body) < 4:
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
        for stored in self.store.sessions(include_finished=include_finished):
            session = self._refresh(stored).session
            if include_finished or not session.finished:
                found.append(session)
        return found

    def _load(self, session_id: str) -> StoredSession:
        stored = self.store.get(session_id)
        if stored is None:
            raise NotFoundError("session", session_id, remedy="see 'dispatch ps --all' for ids")
        return stored

    def _refresh(self, stored: StoredSession) -> StoredSession:
        """Reconcile a running session nobody here follows with its files and processes."""
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
        return self._snapshot(self._refresh(self._load(session_id)))

    def _snapshot(self, stored: StoredSession) -> Snapshot:
        chars = stored.output_chars
        if chars is None:
            chars = self.settings.output_chars
        view = self._view(stored, chars)
        return Snapshot(session=stored.session, output=view.text, output_cut=view.cut)

    def _view(self, stored: StoredSession, chars: int) -> TailView:
        """The end of a session's output as text: the one place output is handed out (the
        transform and redaction hooks of later work apply here)."""
        if self._follower is not None:
            entry = self._follower.catch_up(stored.session.id)
            if entry is not None:
                with self._follower.lock:
                    return entry.tail.text(chars, final=stored.session.finished)
        path = stored.session.log_path
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                take = size if size <= EXACT_CUT_BYTES else min(size, chars * 4 + 4)
                f.seek(size - take)
                data = f.read(take)
        except FileNotFoundError:
            return TailView(text="", cut=0)
        return decode_tail(data, size - take, chars, final=stored.session.finished)

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
                return WaitResult(outcome=WaitOutcome.FINISHED, snapshot=self._snapshot(stored))
            if interrupt is not None and _fired(interrupt):
                return WaitResult(outcome=WaitOutcome.INTERRUPTED, snapshot=self._snapshot(stored))
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return WaitResult(outcome=WaitOutcome.TIMEOUT, snapshot=self._snapshot(stored))
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
            return self._snapshot(stored)
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
        return self._snapshot(self._load(session.id))

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
        if final.state is intent.state and final.signal is None and outcome.signal:
            # Another instance finalized first without knowing the signal.
            self.store.update(session.id, signal=outcome.signal)
            final = self._load(session.id).session
        return final
        return self._snapshot(self._load(session.id))

    # -- adoption and pruning ----------------------------------------------------------------

    def adopt(self) -> list[Session]:
        changed: list[Session] = []
        for stored in self.store.running():
            session = stored.session
            if self._follower is not None and session.id in self._follower:
                continue
            refreshed = self._refresh(stored)
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
        won = self.store.finalize(session_id, **self._final_fields(stored, record))
        session = self._load(session_id).session
        if won:
            self._published(session)
        if won or (self._follower is not None and session_id in self._follower):
            self._announce(session)
        return session

    def _final_fields(self, stored: StoredSession, record: ExitRecord) -> dict[str, object]:
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
            and (record.signal is not None or (record.finished_at or 0.0) >= intent.requested_at)
        ):
            # Our signal ended it; an exit recorded before the signal was sent stays an exit.
            state = intent.state
            reason = f"{intent.reason} ({record.reason})"
        fields: dict[str, object] = {
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

    def _published(self, session: Session) -> None:
        """Runs exactly once per session, in the instance that stored its final state (the
        publisher of its completion)."""
        _log.debug("session %s finished: %s", session.id, session.completion_reason)

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

    # -- listeners and lifetime --------------------------------------------------------------

    def add_finish_listener(self, listener: FinishListener) -> None:
        with self._lock:
            self._listeners.append(listener)

    def close(self) -> None:
        """Stop the follower thread and release handles; running workers keep running."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._follower is not None:
            self._follower.close()
        with self._lock:
            for child in self._children.values():
                child.poll()
            self._children.clear()

    def __enter__(self) -> ProcessRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- helpers ------------------------------------------------------------------------------------


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
