"""The one watcher of a ``dispatch web`` process: the board's event sequence, logs, page watches.

Browsers are pushed, never left to poll: each open page holds one Server-Sent Events stream
(:mod:`~dispatcher.web.streams`), and every stream waits on this :class:`Hub`. The hub alone
looks at the state, in one task for the whole process (not one per client), every
:data:`INTERVAL` seconds while any stream is open:

* the board's version (:meth:`~dispatcher.kanban.abc.BoardStore.board_version`, one cheap read
  on whatever store the workspace opened); when it moved, the new events of the append-only
  sequence (:meth:`~dispatcher.kanban.abc.BoardStore.events_after`) become one :class:`Change`;
* each followed log, through the registry (:meth:`~registry.abc.Registry.follow_log`); new
  bytes are cut at line ends, made inert (:mod:`~dispatcher.web.text`) and passed through the
  registry's output hooks (:meth:`~registry.abc.Registry.apply_hooks`: redaction);
* the fingerprints of page watches (sessions, cron, status, hosts), each at its own pace.

Streams remember the hub's generation they last saw and take what is newer; a stream that fell
more than :data:`KEEP` changes behind reads from the store instead. Anything rendered for one
change (the board's tiles) is rendered once and shared by every stream (:meth:`Hub.memo`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread

from dispatcher.kanban.model import Event
from dispatcher.web.source import Source
from dispatcher.web.text import LogChunker, inert
from registry.abc import Session
from scope.foundation.clock import Clock, SystemClock

INTERVAL = 0.15
"""Seconds between two looks at the board (and the followed logs)."""
PARTIAL_AFTER = 1.0
"""A log line without its newline is shown after this many seconds all the same."""
REFRESH_EVERY = 1.0
"""Without a gateway, how often finished runs are reconciled while someone watches."""
KEEP = 512
"""Changes kept for streams that are a little behind."""
BATCH = 1000
READ_LIMIT = 1024 * 1024
"""The most of a followed log read in one look."""

_log = logging.getLogger("dispatch.web")


@dataclass(frozen=True, kw_only=True)
class Change:
    """What one look at the board found: the new events (in order) and the board-wide facts."""

    seq: int
    """The newest event's sequence number (unchanged when only the pause flag moved)."""
    version: int
    events: tuple[Event, ...]
    paused: bool
    counts: dict[str, int]


@dataclass(kw_only=True)
class Watch:
    """A page's fingerprint, re-read every ``interval`` seconds while a stream uses it."""

    read: Callable[[], Hashable]
    interval: float
    fingerprint: Hashable = None
    version: int = 0
    due: float = 0.0
    users: int = 0


class LogFollower:
    """Follows one session's log from ``offset`` (through the registry's
    :meth:`~registry.abc.Registry.follow_log`, raw); :meth:`take` hands out what was new."""

    def __init__(
        self,
        source: Source,
        session_id: str,
        offset: int,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.source = source
        self.session_id = session_id
        registry = source.registry()
        self.session = registry.get(session_id)
        self.ended = False
        self._clock: Clock = clock or SystemClock()
        # The hub's task reads it without waiting (read_new); it never iterates it.
        self._log = registry.follow_log(session_id, offset)
        self._chunker = LogChunker(offset)
        self._out: list[str] = []
        self._lock = threading.Lock()
        self._checked = 0.0
        self._moved = self._clock.monotonic()

    @property
    def offset(self) -> int:
        """Where the text handed out so far ends in the log file."""
        return self._chunker.offset

    def poll(self) -> bool:
        """Read what the log gained (called by the hub's task); True when there is news."""
        if self.ended:
            return False
        now = self._clock.monotonic()
        data = self._log.read_new(READ_LIMIT)
        news = self._feed(data, now)
        if self._chunker.pending and now - self._moved >= PARTIAL_AFTER:
            # An unfinished line (a prompt, progress dots) is shown rather than held forever.
            partial = self._chunker.flush_partial()
            self._moved = now
            if partial:
                self._push(present(self.source, self.session, partial))
                news = True
        if not data and now - self._checked >= 1.0:
            self._checked = now
            session = self.source.registry().get(self.session_id)
            if session.finished:
                rest = self._log.read_new(READ_LIMIT)
                if rest:  # written just before the end: shown now, the end on a later look
                    return self._feed(rest, now) or news
                self._push(present(self.source, session, self._chunker.finish()))
                self.ended = True
                news = True
        return news

    def _feed(self, data: bytes, now: float) -> bool:
        ready = self._chunker.feed(data) if data else b""
        if not ready:
            return False
        self._push(present(self.source, self.session, ready))
        self._moved = now
        return True

    def _push(self, text: str) -> None:
        with self._lock:
            self._out.append(text)

    def take(self) -> str:
        """The text gained since the last call (may be empty)."""
        with self._lock:
            text, self._out = "".join(self._out), []
        return text


def present(source: Source, session: Session, data: bytes) -> str:
    """Log bytes as a page shows them: inert text (:func:`~dispatcher.web.text.inert`), then
    the registry's output hooks (transform, redaction), as every output a program gets."""
    text = inert(data)
    if not text:
        return text
    return source.registry().apply_hooks(session, text, purpose="web")


@dataclass(kw_only=True)
class _State:
    seq: int = 0
    version: int = -1
    refreshed: float = 0.0
    problem: str | None = None
    logged: str | None = None
    logged_at: float = 0.0
    followers: set[LogFollower] = field(default_factory=set)
    watches: dict[str, Watch] = field(default_factory=dict)


class Hub:
    """The process's watcher (see the module docstring)."""

    def __init__(
        self,
        source: Source,
        *,
        interval: float = INTERVAL,
        clock: Clock | None = None,
    ) -> None:
        self.source = source
        self.interval = interval
        self.clock: Clock = clock or SystemClock()
        self.gen = 0
        self._changes: collections.deque[tuple[int, Change]] = collections.deque(maxlen=KEEP)
        self._state = _State()
        self._lock = threading.Lock()
        self._memo: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._building: dict[Hashable, asyncio.Task[Any]] = {}
        self._cond: asyncio.Condition | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._streams = 0
        self.closing = False

    # -- for streams -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def stream(self) -> AsyncIterator[int]:
        """Count one open stream while the block runs; yields the current generation."""
        self._streams += 1
        if self._task is None or self._task.done():
            # No await between the check and the assignment: one task, however many arrive.
            self._ready = asyncio.Event()
            self._task = asyncio.create_task(self._run(self._ready), name="dispatch-web-hub")
        try:
            # A stream reads what it missed from the store only after the hub took its own
            # starting point: whatever commits in between is in both, never in neither.
            await self._ready.wait()
            yield self.gen
        finally:
            self._streams -= 1

    async def next(self, gen: int, timeout: float) -> int:
        """Wait until something newer than ``gen`` happened (or ``timeout``); the current gen."""
        condition = self._condition()
        async with condition:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    condition.wait_for(lambda: self.gen > gen or self.closing), timeout
                )
            return self.gen

    def changes_since(self, gen: int) -> list[Change] | None:
        """Board changes after generation ``gen``; None when some were already dropped."""
        with self._lock:
            if not self._changes:
                return []
            if self._changes[0][0] > gen + 1 and self._dropped_since(gen):
                return None
            return [change for at, change in self._changes if at > gen]

    def _dropped_since(self, gen: int) -> bool:
        return self._changes[0][0] > gen + 1 and len(self._changes) == self._changes.maxlen

    def follow(self, follower: LogFollower) -> None:
        """Let the hub poll ``follower`` (until :meth:`unfollow`)."""
        with self._lock:
            self._state.followers.add(follower)

    def unfollow(self, follower: LogFollower) -> None:
        """Stop polling ``follower``."""
        with self._lock:
            self._state.followers.discard(follower)

    @contextlib.contextmanager
    def watching(self, key: str, read: Callable[[], Hashable], interval: float) -> Any:
        """Keep the watch ``key`` fresh while the block runs; yields the :class:`Watch`."""
        with self._lock:
            watch = self._state.watches.get(key)
            if watch is None:
                watch = self._state.watches[key] = Watch(read=read, interval=interval)
            watch.users += 1
        try:
            yield watch
        finally:
            with self._lock:
                watch.users -= 1
                if watch.users <= 0:
                    self._state.watches.pop(key, None)

    async def shared(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """``build()`` (in a worker thread) once for every stream that asks for ``key``, even
        when they all ask at the same moment; a stream that goes away meanwhile does not
        cancel it for the others."""
        with self._lock:
            if key in self._memo:
                return self._memo[key]
        task = self._building.get(key)
        if task is None:
            task = asyncio.create_task(anyio.to_thread.run_sync(self.memo, key, build))
            self._building[key] = task
            task.add_done_callback(lambda _: self._building.pop(key, None))
        return await asyncio.shield(task)

    def memo(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """``build()`` once per key for every stream (the last 64 keys are kept)."""
        with self._lock:
            if key in self._memo:
                return self._memo[key]
        value = build()
        with self._lock:
            self._memo[key] = value
            while len(self._memo) > 64:
                self._memo.popitem(last=False)
        return value

    @property
    def problem(self) -> str | None:
        """Why the last look at the state failed (None: it worked)."""
        return self._state.problem

    # -- the task ----------------------------------------------------------------------------

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    def _reset(self) -> None:
        """Start from the board as it is (streams catch up from the store themselves)."""
        store = self.source.store
        try:
            self._state.version = store.board_version()
            self._state.seq = store.last_event_seq()
        except Exception as err:  # an unusable database: the next look reports it
            self._note(err)

    async def _run(self, ready: asyncio.Event) -> None:
        try:
            await anyio.to_thread.run_sync(self._reset)
        finally:
            ready.set()
        while self._streams > 0 and not self.closing:
            try:
                news = await anyio.to_thread.run_sync(self._look)
            except Exception as err:  # keep watching; the streams show the problem
                self._note(err)
                news = True
            if news:
                await self._publish()
            await asyncio.sleep(self.interval)

    async def _publish(self) -> None:
        condition = self._condition()
        async with condition:
            self.gen += 1
            condition.notify_all()

    async def close(self) -> None:
        """Wake every stream so it ends, and stop the task."""
        self.closing = True
        await self._publish()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def _note(self, err: Exception) -> None:
        text = str(getattr(err, "message", None) or err) or type(err).__name__
        now = self.clock.monotonic()
        # Once per distinct problem and minute: a database that stays broken is not a log flood.
        if text != self._state.logged or now - self._state.logged_at >= 60:
            _log.warning("dispatch web: cannot read the state: %s", text)
            self._state.logged, self._state.logged_at = text, now
        self._state.problem = text

    def _look(self) -> bool:
        """One look at everything (runs in a worker thread); True when something changed."""
        news = False
        if self._look_at_board():
            news = True
        with self._lock:
            followers = list(self._state.followers)
            watches = list(self._state.watches.values())
        for follower in followers:
            if follower.poll():
                news = True
        now = self.clock.monotonic()
        for watch in watches:
            if now >= watch.due:
                watch.due = now + watch.interval
                fingerprint = watch.read()
                if fingerprint != watch.fingerprint:
                    watch.fingerprint = fingerprint
                    watch.version += 1
                    news = True
        if self._state.problem is not None:
            self._state.problem = None
            news = True
        return news

    def _look_at_board(self) -> bool:
        state = self._state
        now = self.clock.monotonic()
        if now - state.refreshed >= REFRESH_EVERY:
            state.refreshed = now
            if self.source.store.open_runs():
                self.source.refresh()
        store = self.source.store
        version = store.board_version()
        if version == state.version:
            return False
        events: list[Event] = []
        while True:
            batch = store.events_after(state.seq, limit=BATCH)
            events += batch
            if batch:
                state.seq = batch[-1].seq
            if len(batch) < BATCH:
                break
        counts = {status.value: count for status, count in store.status_counts().items()}
        change = Change(
            seq=state.seq,
            version=version,
            events=tuple(events),
            paused=store.paused(),
            counts=counts,
        )
        state.version = version
        with self._lock:
            self._changes.append((self.gen + 1, change))
        return True
