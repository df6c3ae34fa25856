"""The registry's contract: every launched process, its output, its kill and its completion.

The registry is shared by everything that launches a process (cron, kanban, ``dispatch run``,
library clients). Its defining promise: a worker's output and exit status survive the death or
restart of the process that launched it, byte for byte. It achieves that with a small *keeper*
process per session that lives in the worker's scope, owns the worker's output and writes an
exit record; any registry instance on the same state dir can adopt a keeper later.

A :class:`Registry` never imports dispatcher/. It uses scope/ (a :class:`~scope.abc.Scoper`)
for placement. Implementations: :class:`registry.process.ProcessRegistry` (real keepers, real
processes) and :class:`registry.fake.FakeRegistry` (in memory, nothing runs; for unit tests of
callers).

Vocabulary (shared; use these exact values):

* :class:`SessionState`: ``running``, ``exited``, ``killed``, ``timed_out``, ``lost``,
  ``failed_start``.
* Placement values come from :class:`scope.abc.Placement`.
"""

from __future__ import annotations

import abc
import enum
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from scope.abc import CallerKind, Placement


class SessionState(enum.StrEnum):
    """Lifecycle of a session. Only ``running`` is not final."""

    RUNNING = "running"
    EXITED = "exited"
    """The worker ended by itself (any exit code, or a signal nobody in the registry sent)."""
    KILLED = "killed"
    """Ended by a registry kill (``dispatch kill``, an owner's teardown, a cron replace)."""
    TIMED_OUT = "timed_out"
    """Killed because its timeout elapsed."""
    LOST = "lost"
    """The keeper vanished without writing an exit record."""
    FAILED_START = "failed_start"
    """The worker could not be started (missing binary, bad cwd, ...)."""

    @property
    def final(self) -> bool:
        """True for every state except ``running``."""
        return self is not SessionState.RUNNING


@dataclass(frozen=True, kw_only=True)
class Owner:
    """Who a session belongs to: events are routed to the owner.

    ``kind`` is e.g. ``"kanban"``, ``"cron"``, ``"cli"``, ``"client"``; ``id`` identifies the
    owner within its kind (a run id, a fire key, a client name)."""

    kind: str
    id: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"

    @classmethod
    def parse(cls, text: str) -> Owner:
        """The inverse of ``str(owner)``."""
        kind, _, ident = text.partition(":")
        return cls(kind=kind, id=ident)


@dataclass(frozen=True, kw_only=True)
class Session:
    """A snapshot of one launched process (immutable; ask the registry for a fresh one)."""

    id: str
    """``s_`` + 12 hex digits."""
    argv: tuple[str, ...]
    cwd: str
    owner: Owner
    caller: CallerKind
    placement: Placement
    unit: str | None
    state: SessionState
    log_path: str
    pty: bool = False
    keeper_pid: int | None = None
    keeper_start: int | None = None
    """Kernel start time of the keeper (clock ticks since boot, /proc/PID/stat field 22)."""
    worker_pid: int | None = None
    worker_start: int | None = None
    started_at: float | None = None
    """Wall time (epoch seconds) the worker started."""
    finished_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    """Signal name (``"SIGKILL"``) when the worker died of a signal, else None."""
    completion_reason: str | None = None
    """Why it ended, in words (``"exited with code 3"``, ``"killed by dispatch kill"``,
    ``"keeper vanished without an exit record"``, ``"No such file or directory: 'nosuch'"``)."""
    total_bytes: int = 0
    """Bytes the worker wrote in all (including any dropped beyond the log cap)."""
    dropped_bytes: int = 0
    """Bytes the worker wrote that are not in the log (beyond the log cap, or lost to a full
    disk)."""
    timeout: float | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    """Free-form caller data stored with the session (card id, job id, ...)."""
    warning: str | None = None
    """Why the placement is ``degraded`` (cause and remedy), else None."""

    @property
    def finished(self) -> bool:
        """True when the session reached a final state."""
        return self.state.final


@dataclass(frozen=True, kw_only=True)
class SpawnRequest:
    """Everything :meth:`Registry.spawn` needs. ``argv`` never passes through a shell unless
    ``shell`` is set, in which case ``argv`` must be a single string run by ``/bin/sh -c``."""

    argv: Sequence[str] | str
    cwd: str
    env: Mapping[str, str]
    owner: Owner
    caller: CallerKind = CallerKind.CLI
    pty: bool = False
    shell: bool = False
    timeout: float | None = None
    """Kill after this many seconds (state ``timed_out``). Enforced by the keeper, so it holds
    even when the launcher is gone."""
    unit_parts: Sequence[str] = ()
    """Ids for the scope's unit name (``("c1", "run", "r7")``)."""
    wants_isolation: bool = True
    output_chars: int | None = None
    """Characters of output carried by this session's completion (default from settings)."""
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """A session plus the end of its output (hooks applied), as poll/wait/kill return it."""

    session: Session
    output: str
    output_cut: int
    """Characters of output not included (measured against everything ever written)."""


class WaitOutcome(enum.StrEnum):
    """How :meth:`Registry.wait` returned."""

    FINISHED = "finished"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True, kw_only=True)
class WaitResult:
    """The result of a bounded wait; the process is untouched unless it finished."""

    outcome: WaitOutcome
    snapshot: Snapshot


FinishListener = Callable[[Session], None]
"""Called (from a registry thread) once per session after its final state is stored."""


class Registry(abc.ABC):
    """The shared process registry (see the module docstring)."""

    @abc.abstractmethod
    def spawn(self, request: SpawnRequest) -> Session:
        """Start a worker under a keeper placed by the scope layer; return its session.

        A worker that cannot start becomes a ``failed_start`` session (returned, not raised).
        Raises :class:`~scope.errors.ScopeUnavailable` when placement is refused by policy and
        :class:`~scope.errors.ManagerLost` when a scoped launch failed because the manager
        vanished (nothing runs in either case), :class:`~registry.errors.SpawnRefused` for a
        command the registry will not run."""

    @abc.abstractmethod
    def get(self, session_id: str) -> Session:
        """The session with exactly this id (raises NotFoundError)."""

    @abc.abstractmethod
    def resolve(self, prefix: str) -> Session:
        """The session whose id starts with ``prefix`` (at least 4 characters; the ``s_`` may
        be omitted). Raises NotFoundError or AmbiguousId (exit 2, lists candidates)."""

    @abc.abstractmethod
    def list_sessions(self, *, include_finished: bool = False) -> list[Session]:
        """Sessions, newest first; running ones only unless ``include_finished``."""

    @abc.abstractmethod
    def poll(self, session_id: str) -> Snapshot:
        """The session's current state and output tail (never blocks)."""

    @abc.abstractmethod
    def wait(
        self,
        session_id: str,
        *,
        timeout: float | None = None,
        interrupt: threading.Event | Callable[[], bool] | None = None,
    ) -> WaitResult:
        """Block until the session finishes, ``timeout`` elapses or ``interrupt`` fires.

        Never kills anything: on timeout or interrupt the worker keeps running and stays
        tracked."""

    @abc.abstractmethod
    def read_log(
        self,
        session_id: str,
        *,
        head: int | None = None,
        tail_lines: int | None = None,
        byte_range: tuple[int, int] | None = None,
    ) -> bytes:
        """Raw bytes of the session's log (all of it when no selector is given)."""

    @abc.abstractmethod
    def write_stdin(self, session_id: str, data: bytes) -> None:
        """Send bytes to the worker's stdin (PTY sessions at least)."""

    @abc.abstractmethod
    def kill(
        self,
        session_id: str,
        *,
        grace: float | None = None,
        state: SessionState = SessionState.KILLED,
        reason: str = "killed by request",
    ) -> Snapshot:
        """Stop the worker and everything it started; return its final snapshot.

        Scoped: stop the unit. Otherwise SIGTERM the worker's process group, wait ``grace``
        (default ``registry.kill_grace``), SIGKILL survivors, confirm nothing survives. Never
        reports ``killed`` while anything survives; killing a finished session is success and
        changes nothing; a pid whose start time changed is never signalled. ``state`` may be
        ``timed_out`` for timeouts."""

    @abc.abstractmethod
    def adopt(self) -> list[Session]:
        """Re-attach to every session recorded as running: follow live keepers, finalize
        those that wrote an exit record meanwhile, mark vanished ones ``lost``. Returns the
        sessions whose state changed or that are followed again."""

    @abc.abstractmethod
    def prune(self, *, now: float | None = None) -> int:
        """Delete finished sessions past ``registry.finished_ttl`` (and beyond the cap);
        returns how many were removed."""

    @abc.abstractmethod
    def add_finish_listener(self, listener: FinishListener) -> None:
        """Call ``listener`` once for every session that reaches a final state while this
        registry instance is watching (including those finalized by :meth:`adopt`)."""

    def close(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Stop threads and release handles; running workers keep running."""
