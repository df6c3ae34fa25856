"""Heartbeat and watch events of followed sessions, on one timer thread per registry.

The registry attaches every session it follows that has heartbeats or watch patterns. One
registry instance at a time *emits* a session's heartbeat and watch events: it claims the
session's ``emitter`` column (a compare-and-set; a claim held by a process that is gone is
taken over), so a gateway and a ``dispatch run --wait`` following the same session never both
publish. Completions do not need a claim: they are published by whoever finalizes the session.

* Watch: the follower hands each chunk it reads to :meth:`Notifier.sink` (cheap: whole lines
  are cut and matched under a lock); the timer thread delivers the matches, applying the
  cooldown, strikes, lifetime cap and the global breaker (:mod:`registry.live.watch`).
* Heartbeats: the timer thread wakes when the next one is due (:mod:`registry.live.heartbeat`).

Every publish is one state-database transaction guarded by the session still running and by
our claim, so nothing is published after the completion, and the completion follows the last
heartbeat. Times come from the injected clock; :meth:`Notifier.tick` is the single step the
thread repeats, and tests call it directly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from registry.abc import Event, EventListener, EventType, SessionState, WatchPattern
from registry.live.heartbeat import Slot, clamp_interval, read_delta
from registry.live.watch import Breaker, LineBuffer, Matcher, Verdict, WatchGate, decode_line
from registry.output.hooks import OutputHooks
from registry.proc.identity import Identity, alive
from registry.settings import RegistrySettings
from registry.store.events import EventDraft
from registry.store.sessions import HeartbeatMark, SessionStore, StoredSession, WatchMark
from scope.foundation.clock import Clock
from scope.foundation.procstat import read_stat

__all__ = ["Notifier", "emitter_alive"]

_log = logging.getLogger("dispatch.registry")

MAX_PENDING_LINES = 200
"""Matching lines kept for one delivery; more are counted (``matches``) but not carried."""
CLAIM_RETRY = 5.0
"""Seconds between attempts to take over sessions another live registry emits for."""
MAX_WAIT = 1.0
"""The thread re-checks at least this often (real seconds), so a fake clock moved by a test
is noticed without a wake-up."""
_FILL_LIMIT = 1 << 20

_LIVE_TOKENS: set[str] = set()
"""Emitter tokens of registry instances open in this process."""
_LIVE_LOCK = threading.Lock()


def _self_start() -> int:
    stat = read_stat(os.getpid())
    return stat.start_time if stat is not None else 0


def emitter_alive(emitter: str) -> bool:
    """Whether the registry instance named by ``emitter`` (``pid:start:token``) still runs."""
    try:
        pid_text, start_text, token = emitter.split(":", 2)
        ident = Identity(pid=int(pid_text), start=int(start_text))
    except ValueError:
        return False
    if ident.pid == os.getpid():
        with _LIVE_LOCK:
            return token in _LIVE_TOKENS
    return alive(ident)


@dataclass(eq=False, kw_only=True)
class _Watch:
    session_id: str
    log_path: str
    chars: int
    matcher: Matcher
    gate: WatchGate
    buffer: LineBuffer
    pending: list[tuple[str, WatchPattern]] = field(default_factory=list)
    overflow: int = 0


class Notifier:
    """Heartbeat schedules, watch state and event listeners of one registry instance."""

    def __init__(
        self,
        *,
        store: SessionStore,
        settings: RegistrySettings,
        hooks: OutputHooks,
        clock: Clock,
    ) -> None:
        self.store = store
        self.settings = settings
        self.hooks = hooks
        self.clock = clock
        token = secrets.token_hex(6)
        self.emitter = f"{os.getpid()}:{_self_start()}:{token}"
        self._token = token
        with _LIVE_LOCK:
            _LIVE_TOKENS.add(token)
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._deliver = threading.RLock()
        self._slots: dict[str, Slot] = {}
        self._watches: dict[str, _Watch] = {}
        self._candidates: dict[str, StoredSession] = {}
        self._listeners: list[EventListener] = []
        self._breaker = Breaker(settings.watch_global_limit)
        self._thread: threading.Thread | None = None
        self._kick = False
        self._stop = False
        self._next_claim = 0.0
        self._claimed = False

    # -- listeners ---------------------------------------------------------------------------

    def add_listener(self, listener: EventListener) -> None:
        """Call ``listener`` for every event this instance publishes."""
        with self._lock:
            self._listeners.append(listener)

    def emit(self, event: Event | None) -> None:
        """Hand a stored event to the listeners (never raises)."""
        if event is None:
            return
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                _log.exception("event listener failed for event %s", event.id)

    # -- attaching ---------------------------------------------------------------------------

    def attach(self, stored: StoredSession) -> Callable[[int, bytes], None] | None:
        """Start heartbeats and watching for a session this registry now follows; returns
        the follower's output sink when the session has watch patterns."""
        session = stored.session
        if session.heartbeat is None and not session.watch:
            return None
        if self._claim(stored):
            self._register(stored)
        else:
            with self._lock:
                self._candidates[session.id] = stored
        self._start()
        self.wake()
        if not session.watch:
            return None
        sid = session.id
        return lambda start, data: self.sink(sid, start, data)

    def detach(self, session_id: str) -> None:
        """The session is final: no more heartbeat or watch events for it."""
        with self._lock:
            self._slots.pop(session_id, None)
            self._watches.pop(session_id, None)
            self._candidates.pop(session_id, None)

    def _claim(self, stored: StoredSession) -> bool:
        current = stored.emitter
        stale = None
        if current is not None and current != self.emitter:
            if emitter_alive(current):
                return False
            stale = current
        self._claimed = True  # from now on, close() gives claims back
        return self.store.claim_emitter(stored.session.id, self.emitter, stale=stale)

    def _register(self, stored: StoredSession) -> None:
        session = stored.session
        chars = stored.output_chars
        if chars is None:
            chars = self.settings.output_chars
        now_mono, now_wall = self.clock.monotonic(), self.clock.time()
        with self._lock:
            if session.heartbeat is not None:
                interval = clamp_interval(session.heartbeat)
                last = stored.hb_at if stored.hb_at is not None else stored.created_at
                self._slots[session.id] = Slot(
                    session_id=session.id,
                    log_path=session.log_path,
                    interval=interval,
                    liveness=stored.heartbeat_liveness,
                    chars=chars,
                    offset=stored.hb_offset,
                    due=now_mono + max(0.0, last + interval - now_wall),
                )
            if session.watch:
                gate = WatchGate(
                    cooldown=self.settings.watch_cooldown,
                    strike_limit=self.settings.watch_strikes,
                    lifetime_cap=self.settings.watch_max_deliveries,
                )
                offset = gate.load(stored.watch_state)
                if gate.disabled is None:
                    path = session.log_path
                    self._watches[session.id] = _Watch(
                        session_id=session.id,
                        log_path=path,
                        chars=chars,
                        matcher=Matcher(session.watch),
                        gate=gate,
                        buffer=LineBuffer(offset, fill=lambda a, b: _read_range(path, a, b)),
                    )

    # -- watch input (follower thread) -------------------------------------------------------

    def sink(self, session_id: str, start: int, data: bytes) -> None:
        """Output the follower read at log position ``start``: cut lines, keep matches."""
        try:
            with self._lock:
                watch = self._watches.get(session_id)
                if watch is None:
                    return
                self._match(watch, watch.buffer.feed(start, data))
                if watch.pending or watch.overflow:
                    self._kick = True
                    self._cond.notify_all()
        except Exception:  # watching must never break following
            _log.exception("watch matching failed for session %s", session_id)

    def _match(self, watch: _Watch, lines: list[bytes]) -> None:
        for raw in lines:
            text = decode_line(raw)
            pattern = watch.matcher.match(text)
            if pattern is None:
                continue
            if len(watch.pending) < MAX_PENDING_LINES:
                watch.pending.append((text, pattern))
            else:
                watch.overflow += 1

    def before_final(self, session_id: str) -> None:
        """The session is about to be finalized: match the rest of its output (the last line
        may lack a newline) and deliver, so watch events precede the completion."""
        with self._deliver:
            with self._lock:
                watch = self._watches.get(session_id)
                if watch is None:
                    return
                size = _log_size(watch.log_path)
                lines = watch.buffer.feed(size, b"") + watch.buffer.flush()
                self._match(watch, lines)
            self._deliver_watch(watch, self.clock.monotonic())

    # -- the timer ---------------------------------------------------------------------------

    def tick(self) -> float:
        """Publish what is due now; returns seconds (clock time) until something is due."""
        now = self.clock.monotonic()
        if now >= self._next_claim:
            self._next_claim = now + CLAIM_RETRY
            self._retry_claims()
        with self._deliver:
            with self._lock:
                slots = [s for s in self._slots.values() if s.due <= now]
                watches = [w for w in self._watches.values() if w.pending or w.overflow]
            for slot in slots:
                self._beat(slot, now)
            for watch in watches:
                self._deliver_watch(watch, now)
            with self._lock:
                dues = [s.due for s in self._slots.values()]
                waiting = bool(self._candidates)
        wait = min(dues) - self.clock.monotonic() if dues else MAX_WAIT
        if waiting:
            wait = min(wait, CLAIM_RETRY)
        return max(0.0, wait)

    def _retry_claims(self) -> None:
        with self._lock:
            candidates = list(self._candidates)
        for sid in candidates:
            stored = self.store.get(sid)
            if stored is None or stored.session.finished:
                with self._lock:
                    self._candidates.pop(sid, None)
                continue
            if self._claim(stored):
                with self._lock:
                    self._candidates.pop(sid, None)
                self._register(self.store.get(sid) or stored)

    def _lost(self, session_id: str) -> None:
        """A guarded publish failed: the session ended, or another instance emits now."""
        stored = self.store.get(session_id)
        with self._lock:
            if stored is None or stored.session.finished:
                self._slots.pop(session_id, None)
                self._watches.pop(session_id, None)
                return
            if stored.emitter != self.emitter:
                self._slots.pop(session_id, None)
                self._watches.pop(session_id, None)
                self._candidates[session_id] = stored
                return
            slot = self._slots.get(session_id)
            if slot is not None:
                slot.offset = stored.hb_offset  # advanced elsewhere: continue from there

    def _beat(self, slot: Slot, now: float) -> None:
        delta = read_delta(slot.log_path, slot.offset, slot.chars)
        slot.due = now + slot.interval
        if delta.nbytes == 0 and not slot.liveness:
            return
        stored = self.store.get(slot.session_id)
        if stored is None or stored.session.finished:
            self.detach(slot.session_id)
            return
        output = self.hooks.apply(
            delta.text,
            session_id=slot.session_id,
            owner=stored.session.owner,
            exit_code=None,
            purpose="heartbeat",
        )
        wall = self.clock.time()
        draft = EventDraft(
            type=EventType.HEARTBEAT,
            state=SessionState.RUNNING,
            output=output,
            output_cut=delta.cut,
            log_path=slot.log_path,
            data={
                "bytes": delta.nbytes,
                "offset": delta.end,
                "interval": slot.interval,
                "liveness_only": delta.nbytes == 0,
            },
        )
        event = self.store.publish(
            slot.session_id,
            draft,
            now=wall,
            emitter=self.emitter,
            mark=HeartbeatMark(since=slot.offset, offset=delta.end, at=wall),
        )
        if event is None:
            self._lost(slot.session_id)
            return
        slot.offset = delta.end
        self.emit(event)

    def _deliver_watch(self, watch: _Watch, now: float) -> None:
        with self._lock:
            pending, watch.pending = watch.pending, []
            overflow, watch.overflow = watch.overflow, 0
            offset = watch.buffer.offset
        count = len(pending) + overflow
        if not count:
            return
        verdict = watch.gate.offer(now, count, breaker_open=self._breaker.is_open(now))
        if verdict is Verdict.SUPPRESS:
            return
        stored = self.store.get(watch.session_id)
        if stored is None or stored.session.finished:
            self.detach(watch.session_id)
            return
        if verdict is Verdict.DISABLE:
            self._disable_watch(watch, offset)
            return
        gate = watch.gate
        text = "\n".join(line for line, _ in pending)
        shown = text[: watch.chars] if watch.chars > 0 else ""
        cut = len(text) - len(shown)
        output = self.hooks.apply(
            shown,
            session_id=watch.session_id,
            owner=stored.session.owner,
            exit_code=None,
            purpose="watch",
        )
        patterns = sorted({str(p) for _, p in pending})
        draft = EventDraft(
            type=EventType.WATCH,
            state=SessionState.RUNNING,
            output=output,
            output_cut=cut,
            log_path=watch.log_path,
            data={
                "patterns": patterns,
                "matches": count,
                "suppressed": gate.take_suppressed(),
                "suppressed_total": gate.suppressed_total,
                "breaker_suppressed": gate.breaker_suppressed,
                "deliveries": gate.deliveries,
                "remaining": max(0, gate.lifetime_cap - gate.deliveries),
            },
        )
        event = self.store.publish(
            watch.session_id,
            draft,
            now=self.clock.time(),
            emitter=self.emitter,
            mark=WatchMark(state=json.dumps(gate.to_json(offset))),
        )
        if event is None:
            self._lost(watch.session_id)
            return
        self._breaker.record(now)
        self.emit(event)

    def _disable_watch(self, watch: _Watch, offset: int) -> None:
        """Watching stopped (strike limit, lifetime cap): say so; notify-on-complete follows."""
        gate = watch.gate
        draft = EventDraft(
            type=EventType.WATCH_DISABLED,
            state=SessionState.RUNNING,
            log_path=watch.log_path,
            data={
                "reason": gate.disabled,
                "deliveries": gate.deliveries,
                "suppressed_total": gate.suppressed_total,
                "fallback": "notify",
            },
        )
        event = self.store.publish(
            watch.session_id,
            draft,
            now=self.clock.time(),
            emitter=self.emitter,
            mark=WatchMark(state=json.dumps(gate.to_json(offset)), stopped=True),
        )
        _log.info("watching session %s stopped: %s", watch.session_id, gate.disabled)
        with self._lock:
            self._watches.pop(watch.session_id, None)
        if event is None:
            self._lost(watch.session_id)
        self.emit(event)

    # -- thread ------------------------------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stop:
                return
            self._thread = threading.Thread(
                target=self._loop, name="dispatch-registry-events", daemon=True
            )
            self._thread.start()

    def wake(self) -> None:
        """Make the thread run a tick now."""
        with self._cond:
            self._kick = True
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    return
                self._kick = False
            try:
                wait = self.tick()
            except Exception:  # a bug here must not stop every later event
                _log.exception("registry event timer tick failed")
                wait = MAX_WAIT
            with self._cond:
                if self._stop:
                    return
                idle = not (self._slots or self._watches or self._candidates)
                if not self._kick:
                    # Idle: nothing can become due until attach() wakes us.
                    self._cond.wait(None if idle else min(wait, MAX_WAIT))

    def close(self) -> None:
        """Stop the thread, persist watch positions and give up the emitter claims."""
        with self._cond:
            self._stop = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout=10)
        with self._lock:
            watches = list(self._watches.values())
            self._watches.clear()
            self._slots.clear()
            self._candidates.clear()
            self._thread = None
        if self._claimed:
            # Persist where watching got to, and let another registry take over at once.
            with contextlib.suppress(Exception):
                for watch in watches:
                    self.store.save_watch_state(
                        watch.session_id,
                        emitter=self.emitter,
                        state=json.dumps(watch.gate.to_json(watch.buffer.offset)),
                    )
                self.store.release_emitter(self.emitter)
        with _LIVE_LOCK:
            _LIVE_TOKENS.discard(self._token)


def _log_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _read_range(path: str, start: int, end: int) -> bytes:
    """Log bytes [start, end) for a watch that missed them (bounded: a huge gap keeps its
    last part, starting at a line boundary)."""
    begin = max(start, end - _FILL_LIMIT)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return b""
    try:
        data = os.pread(fd, max(0, end - begin), begin)
    finally:
        os.close(fd)
    if begin > start:
        newline = data.find(b"\n")
        data = data[newline + 1 :] if newline >= 0 else b""
    return data
