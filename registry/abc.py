"""The registry's contract: every launched process, its output, its kill and its completion.

The registry is shared by everything that launches a process (cron, kanban, ``dispatch run``,
library clients). Its defining promise: a worker's output and exit status survive the death or
restart of the process that launched it, byte for byte. It achieves that with a small *keeper*
process per session that lives in the worker's scope, owns the worker's output and writes an
exit record; any registry instance on the same state dir can adopt a keeper later.

A :class:`Registry` never imports dispatcher/; a :class:`~scope.abc.Scoper` places it. See
:class:`registry.process.ProcessRegistry` (real) and :class:`registry.fake.FakeRegistry` (fake).

Vocabulary (shared; use these exact values):

* :class:`SessionState`: ``running``, ``exited``, ``killed``, ``timed_out``, ``lost``,
  ``failed_start``.
* Placement values come from :class:`scope.abc.Placement`.
* :class:`EventType`: ``completion``, ``heartbeat``, ``watch``, ``watch_disabled``, ``handoff``,
  ``orphaned``.

Events (see docs/events.md): a session spawned with ``notify`` (or with heartbeats or watch
patterns) produces durable :class:`Event` rows routed to its :class:`Owner`. Exactly one
registry instance publishes a session's completion, in the same state-database transaction
that stores its final state; consumers read them with :meth:`Registry.events` and acknowledge
them by id with :meth:`Registry.ack` (idempotent), so a consumer that crashed before
acknowledging sees the same ids again and deduplicates by id.

Output hooks: every text of output the registry hands to a program (snapshots, previews, event
outputs) first passes the owner's transform hook (if any), then redaction of secrets. The hook
gets a :class:`HookContext` naming the *owning* session. Callers read a log only through the
registry (:meth:`Registry.read_log`, ``follow_log``, ``log_size``, ``output_times``,
``apply_hooks``), raw by default (``dispatch logs``), hooked on request.
"""

from __future__ import annotations

import abc
import enum
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from registry.owner import Owner, WatchPattern
from registry.owner import OwnerKind as OwnerKind  # re-exported: part of the contract
from registry.usage import ResourceClass, Usage
from scope.abc import CallerKind, Placement, ScopeProperties
from scope.foundation.ids import IdKind

SESSION_IDS = IdKind(name="session", prefix="s_", digits=12, listing="dispatch ps --all")
"""Session ids (``s_`` + 12 hex digits), found by prefix (:func:`scope.foundation.ids.lookup`)."""


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
    """None only while the session is a draft: recorded, its keeper not started yet (a launcher
    that dies then leaves a draft that never runs)."""
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
    notify: bool = False
    """A completion event is published for the owner when the session ends."""
    heartbeat: float | None = None
    """Seconds between heartbeat events (None: no heartbeats)."""
    watch: tuple[WatchPattern, ...] = ()
    """Watch patterns; a matching output line publishes a watch event."""
    handoff_note: str | None = None
    """The purpose note of the last handoff (rides on the completion event)."""
    handoff_from: Owner | None = None
    """The owner that handed the session to its current owner."""
    usage: Usage | None = None
    """What the worker used, read in its own scope as it ended (:mod:`registry.usage`)."""
    resources: ResourceClass | None = None

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
    """Characters of output carried by this session's completion and snapshots (default
    ``registry.output_chars``; e.g. 16000 for a bot reply)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    notify: bool = False
    """Publish a completion event for ``owner`` when the session ends."""
    heartbeat: float | None = None
    """Publish a heartbeat event every this many seconds while it runs (floor
    :data:`HEARTBEAT_FLOOR`; shorter values are raised to it), each carrying only the output
    written since the previous one. Implies ``notify``."""
    heartbeat_liveness: bool = False
    """Also publish a heartbeat (with empty output) when nothing new was written."""
    watch: Sequence[str | WatchPattern] = ()
    """Watch patterns (a plain string is a substring). Matching lines publish watch events,
    with a cooldown, a strike limit and a lifetime cap; once disabled the session falls back
    to notify-on-complete."""
    resources: ScopeProperties | None = None
    """The worker's resource class, over ``scope.resources`` key by key."""


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

HEARTBEAT_FLOOR = 60.0
"""The shortest heartbeat interval, in seconds."""

MAX_HANDOFFS = 3
"""How many sessions one owner may hand to others."""


class EventType(enum.StrEnum):
    """What an :class:`Event` reports."""

    COMPLETION = "completion"
    """The session reached its final state (exactly one per notifying session)."""
    HEARTBEAT = "heartbeat"
    """The session still runs; carries the output written since the previous heartbeat."""
    WATCH = "watch"
    """Output lines matched a watch pattern."""
    WATCH_DISABLED = "watch_disabled"
    """Watching stopped (strike limit, lifetime cap); the completion will still come."""
    HANDOFF = "handoff"
    """The session was handed to this owner (routed to the new owner)."""
    ORPHANED = "orphaned"
    """The owner tore down while the session ran; the session is being killed."""


@dataclass(frozen=True, kw_only=True)
class Event:
    """One durable event, routed to ``owner`` (the session's owner when it was published)."""

    id: str
    """``e_`` + 16 hex digits; unique; consumers deduplicate and acknowledge by it."""
    seq: int
    """Per-session sequence number (1, 2, ...): the order of a session's events."""
    type: EventType
    session_id: str
    owner: Owner
    created_at: float
    position: int = 0
    """Global insertion order (for ``events(after=...)``)."""
    state: SessionState | None = None
    """The session's state when the event was published (final for a completion)."""
    exit_code: int | None = None
    signal: str | None = None
    completion_reason: str | None = None
    output: str = ""
    """Output text with the hooks applied: the last N characters for a completion, the new
    output for a heartbeat, the matching lines for a watch event."""
    output_cut: int = 0
    """Characters of the relevant output not included in ``output``."""
    log_path: str | None = None
    """The raw log, for everything ``output`` does not carry."""
    note: str | None = None
    """The handoff purpose note (handoff and completion events)."""
    data: Mapping[str, Any] = field(default_factory=dict)
    """Type-specific facts: watch ``pattern``/``suppressed``, handoff ``from``/``to``, ..."""
    acked_at: float | None = None

    @property
    def acked(self) -> bool:
        """Whether a consumer acknowledged the event."""
        return self.acked_at is not None


EventListener = Callable[[Event], None]
"""Called (from a registry thread) for every event this registry instance publishes."""


@dataclass(frozen=True, kw_only=True)
class AckResult:
    """What :meth:`Registry.ack` did with each id."""

    acked: tuple[str, ...] = ()
    """Acknowledged by this call."""
    already: tuple[str, ...] = ()
    """Acknowledged before (a repeated ack is harmless)."""
    unknown: tuple[str, ...] = ()
    """No such event (never existed, or trimmed after it was acknowledged)."""


@dataclass(frozen=True, kw_only=True)
class HookContext:
    """What an output hook learns about the text it gets: always the *owning* session."""

    session_id: str
    owner: Owner
    exit_code: int | None
    """None while the session runs."""
    purpose: str
    """``poll``, ``wait``, ``kill``, ``preview``, ``completion``, ``heartbeat``, ``watch``,
    ``logs``, ``web``, ``notify``."""


OutputTransform = Callable[[str, HookContext], str]
"""An output-transform hook: runs before redaction on every output handed to a program."""


@dataclass(frozen=True, kw_only=True)
class TeardownReport:
    """The final report of an owner's teardown."""

    owner: Owner
    orphaned: tuple[Snapshot, ...] = ()
    """Sessions it still owned, killed by the teardown (final snapshots)."""
    unread: tuple[Event, ...] = ()
    """Completion events it never acknowledged (acknowledged by the teardown)."""
    errors: tuple[str, ...] = ()
    """Sessions that could not be killed, in words."""


class OutputTimes(abc.ABC):
    """When a session's output arrived (:meth:`Registry.output_times`): the keeper notes a log
    offset and the wall time at most every 50 ms, so a byte's time is that of the last note at
    or before its offset (output within one step shares the earlier time)."""

    @property
    @abc.abstractmethod
    def known(self) -> bool:
        """False for a session whose keeper kept no times (keepers before they did)."""

    @abc.abstractmethod
    def time_at(self, offset: int) -> float | None:
        """When the byte at ``offset`` arrived (None before the first note)."""

    @abc.abstractmethod
    def offset_since(self, moment: float) -> int | None:
        """The first log offset whose output arrived at or after ``moment`` (None: nothing
        arrived since)."""


Stamp = Callable[[float], str]
"""Formats the arrival time a line of ``dispatch logs --timestamps`` starts with."""


class LogFollow(Iterator[bytes]):
    """A session's log as it grows (:meth:`Registry.follow_log`).

    Iterating blocks until new bytes arrive and yields them (presented as asked), and stops
    once the session is final and everything it wrote was handed out (:attr:`session` is then
    the final session) or the timeout elapsed (:attr:`session` stays None; the worker keeps
    running). :meth:`read_new` is the same without waiting, for callers with a loop of their
    own."""

    session: Session | None = None
    """The final session, once the iteration ended because the session did."""

    @property
    @abc.abstractmethod
    def offset(self) -> int:
        """The log offset of the next byte to read."""

    @abc.abstractmethod
    def read_new(self, limit: int = 4 << 20) -> bytes:
        """What the log gained since the last read (at most ``limit`` raw bytes, presented);
        b"" when nothing is new. Never waits."""


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
        """The session whose id starts with ``prefix``, by the one id rule
        (:func:`scope.foundation.ids.lookup` with :data:`SESSION_IDS`: at least 4 characters
        as typed, the ``s_`` may be omitted). Raises IdTooShort, NotFoundError or AmbiguousId
        (all exit 2; AmbiguousId lists the candidates)."""

    @abc.abstractmethod
    def list_sessions(self, *, include_finished: bool = False) -> list[Session]:
        """Sessions, newest first; running ones only unless ``include_finished``."""

    @abc.abstractmethod
    def find(self, owner: Owner) -> Session | None:
        """The newest session of ``owner`` (running or finished), or None: an indexed lookup
        by owner, not a scan of every session. Used to find the worker of a claim whose
        launcher died before recording it."""

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

    # -- output: the one way to read a session's log ---------------------------------------

    @abc.abstractmethod
    def read_log(
        self,
        session_id: str,
        *,
        head: int | None = None,
        tail_lines: int | None = None,
        byte_range: tuple[int, int] | None = None,
        since: float | None = None,
        stamp: Stamp | None = None,
        hooks: bool = False,
    ) -> bytes:
        """Bytes of the session's log, raw (byte for byte what the worker wrote) unless asked.

        Selection, in this order: ``byte_range`` (start, end) narrows to those bytes (default:
        all); ``since`` keeps the lines that start at or after the first byte that arrived at
        or after that wall time; ``tail_lines`` keeps the last N lines (a last line without a
        newline counts), ``head`` the first N bytes. Presentation: ``stamp`` starts every line
        with the time its first byte arrived (``-`` when unknown); ``hooks`` then applies the
        output hooks (purpose ``logs``) to the text, decoded as UTF-8 (U+FFFD for bad bytes)."""

    @abc.abstractmethod
    def log_size(self, session_id: str) -> int | None:
        """Bytes in the session's log now; None when it has no log file (removed, or its
        keeper never started)."""

    @abc.abstractmethod
    def follow_log(
        self,
        session_id: str,
        offset: int = 0,
        *,
        stamp: Stamp | None = None,
        hooks: bool = False,
        timeout: float | None = None,
    ) -> LogFollow:
        """Follow the log from ``offset`` until the session ends (or ``timeout`` elapses),
        presented as :meth:`read_log` does; with ``hooks`` a line is handed out once whole (or
        at the end), so a secret split across two reads is masked whole."""

    @abc.abstractmethod
    def output_times(self, session_id: str) -> OutputTimes:
        """When the session's output arrived (``dispatch logs --since/--timestamps``)."""

    @abc.abstractmethod
    def apply_hooks(self, session: Session, text: str, *, purpose: str) -> str:
        """``text`` (output of ``session``) after the output hooks: the transform hook, then
        redaction, as every output a program gets (for callers that reshape raw log bytes
        first, such as a web page making them inert)."""

    @abc.abstractmethod
    def tail(self, session_id: str, chars: int, *, purpose: str) -> Snapshot:
        """The session and the last ``chars`` characters of its output, for a program that
        carries them on (a notification's message: purpose ``notify``). The hooks run on a
        wider end of the output than is kept, so a secret the cut runs through is still
        masked; ``output_cut`` counts the characters left out."""

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

    # -- events, ownership ---------------------------------------------------------------------

    @abc.abstractmethod
    def events(
        self,
        *,
        owner: Owner | str | None = None,
        include_acked: bool = False,
        session_id: str | None = None,
        after: int | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """Stored events, oldest first: unacknowledged ones unless ``include_acked``.

        ``owner`` routes: an :class:`Owner` or its string matches exactly, and a string also
        matches as a prefix ending at ``:`` (``"cli"``, ``"cli:alice"``). ``after``: only events
        with a larger :attr:`Event.position`."""

    @abc.abstractmethod
    def ack(self, event_ids: Iterable[str]) -> AckResult:
        """Acknowledge events by id. Idempotent: acknowledging twice changes nothing."""

    @abc.abstractmethod
    def pending_completions(self, owner: Owner | str | None = None) -> int:
        """Sessions that finished (exit record written, or final state) but whose completion
        event is not published yet. A short-lived caller waits for 0 before it exits."""

    @abc.abstractmethod
    def handoff(self, session_id: str, to: Owner, *, note: str, by: Owner | None = None) -> Session:
        """Give a running session to another owner with a purpose note (which rides on its
        completion); its later events are routed to ``to``. ``by`` (when given) must be the
        current owner. An owner may hand off at most :data:`MAX_HANDOFFS` sessions."""

    @abc.abstractmethod
    def teardown_owner(
        self, owner: Owner, *, reason: str | None = None, grace: float | None = None
    ) -> TeardownReport:
        """An owner's explicit end (a library client closing, a run archived): kill the
        sessions it still owns (reported as orphaned) and collect the completion events it
        never acknowledged. The exit of a launching process is never a teardown."""

    @abc.abstractmethod
    def add_event_listener(self, listener: EventListener) -> None:
        """Call ``listener`` for every event this instance publishes."""

    def preview(self, session_id: str, chars: int = 200) -> str:
        """The last ``chars`` characters of a session's output (hooks applied)."""
        text = self.poll(session_id).output
        return text[-chars:] if chars > 0 else ""

    def close(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Stop threads and release handles; running workers keep running."""
