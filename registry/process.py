"""The real registry: keepers, real processes, durable sessions (see :mod:`registry.abc`).

Each session is a row in the state database (:mod:`registry.store.sessions`) plus a directory
of files shared with its keeper (:mod:`registry.keeper.files`). Any registry instance on the
same state dir can list, read, kill, wait for and finalize any session; a ``follow=True``
instance also runs one :class:`~registry.live.follower.Follower` thread that tails followed
sessions in memory and notices their end at once.

:class:`ProcessRegistry` is a facade: it builds the shared
:class:`~registry.lifecycle.parts.Parts` once and hands each operation to the part named by
what it does (all in ``registry/lifecycle/``)::

    ProcessRegistry  lookup, wait, lifetime; everything else delegated
      Spawner        spawn.py      spawn: directory, row, keeper launch, first look
      Finalizer      finalize.py   settle (the one place a session becomes final),
                                   final fields, completion draft, announce
      Reconciler     reconcile.py  refresh from files and processes, adopt, follow
      Stopper        stop.py       kill (intent, policy, final state)
      Viewer         view.py       output as text (hooks applied), the log read and followed
      OwnerDesk      owners.py     events, ack, pending completions, handoff, teardown

Events (:mod:`registry.store.events`): settling stores the completion event of a notifying
session in the same transaction as its final state; heartbeat and watch events of followed
sessions come from :class:`~registry.live.notifier.Notifier`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from registry.abc import (
    SESSION_IDS,
    AckResult,
    Event,
    EventListener,
    FinishListener,
    LogFollow,
    OutputTimes,
    OutputTransform,
    Owner,
    Registry,
    Session,
    SessionState,
    Snapshot,
    SpawnRequest,
    Stamp,
    TeardownReport,
    WaitOutcome,
    WaitResult,
)
from registry.errors import RegistryError
from registry.keeper.files import SessionDir
from registry.keeper.forkserver import ForkServer, ForkServerStats
from registry.keeper.start import KEEPER_SCRIPT, keeper_command
from registry.keeper.times import LogTimes
from registry.lifecycle.finalize import Finalizer
from registry.lifecycle.owners import MAX_NOTE_CHARS, OwnerDesk, owned_by
from registry.lifecycle.parts import LaunchOptions, Parts, Tracking
from registry.lifecycle.prune import prune_sessions
from registry.lifecycle.reconcile import STARTING_GRACE, Reconciler
from registry.lifecycle.spawn import Spawner, new_session_id
from registry.lifecycle.stop import Stopper
from registry.lifecycle.view import EXACT_CUT_BYTES, Viewer
from registry.live.follower import Follower
from registry.live.notifier import Notifier
from registry.output.hooks import OutputHooks
from registry.output.log import FileLog
from registry.proc.refusal import GatewayIdentity
from registry.settings import RegistrySettings
from registry.store.database import StateDB
from registry.store.events import EventStore
from registry.store.sessions import SessionStore
from scope.abc import Scoper, Starter
from scope.foundation.clock import Clock, SystemClock
from scope.foundation.ids import lookup

__all__ = [
    "EXACT_CUT_BYTES",
    "KEEPER_SCRIPT",
    "MAX_NOTE_CHARS",
    "STARTING_GRACE",
    "ForkServer",
    "ForkServerStats",
    "ProcessRegistry",
    "keeper_command",
    "new_session_id",
    "owned_by",
]

_log = logging.getLogger("dispatch.registry")


class ProcessRegistry(Registry):
    """Sessions of real processes under keepers (see the module docstring).

    ``follow``: run the follower thread for sessions this instance spawns or adopts (the
    gateway, ``dispatch run --wait``); without it, state is reconciled from the files whenever
    a session is read. ``protect_gateway``: refuse commands that would kill this process by
    name (set inside the gateway). ``python`` runs the keeper (default: this interpreter).
    ``hooks``: the output hooks (default: redaction as the settings say, no transform).
    ``starter``: starts keepers instead of ``Popen`` where the placement allows (the keeper
    fork server, :class:`~registry.keeper.forkserver.ForkServer`; its owner closes it).
    The tuning knobs end up in one :class:`~registry.lifecycle.parts.LaunchOptions` (``options``).
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
        starter: Starter | None = None,
    ) -> None:
        python = python or sys.executable
        self.options = LaunchOptions(
            python=python,
            keeper_argv=tuple(keeper_command(python, Path(state_dir) / "cache")),
            starter=starter,
            ready_timeout=ready_timeout,
            follow=follow,
            interval=interval,
            idle_interval=idle_interval,
        )
        self.parts = _parts(Path(state_dir), db, scoper, settings, clock, hooks)
        parts = self.parts
        self.viewer = Viewer(parts)
        self.finalizer = Finalizer(parts, self.viewer)
        self.reconciler = Reconciler(parts, self.finalizer)
        self.spawner = Spawner(
            parts,
            self.options,
            self.finalizer,
            self.reconciler,
            gateway=GatewayIdentity.current() if protect_gateway else None,
        )
        self.stopper = Stopper(parts, self.finalizer, self.reconciler, self.viewer)
        self.desk = OwnerDesk(parts, self.reconciler, self.kill)
        if follow:
            parts.tracking.follower = Follower(
                on_exit_record=self.reconciler.on_exit_record,
                on_keeper_gone=self.reconciler.on_keeper_gone,
                unit_alive=self.reconciler.unit_alive,
                periodic=self._periodic_prune,
                periodic_every=settings.prune_interval,
                interval=self.options.interval,
                idle_interval=self.options.idle_interval,
            )

    # The shared parts, by the names callers and tests know them.

    @property
    def state_dir(self) -> Path:
        """The state dir this registry keeps its sessions under."""
        return self.parts.state_dir

    @property
    def store(self) -> SessionStore:
        """The durable sessions (and their events)."""
        return self.parts.store

    @property
    def scoper(self) -> Scoper:
        """The scope layer that places keepers."""
        return self.parts.scoper

    @property
    def settings(self) -> RegistrySettings:
        """The registry settings."""
        return self.parts.settings

    @property
    def clock(self) -> Clock:
        """The injected clock."""
        return self.parts.clock

    @property
    def hooks(self) -> OutputHooks:
        """The output hooks (transform, redaction)."""
        return self.parts.hooks

    @property
    def notifier(self) -> Notifier:
        """Heartbeat and watch events of followed sessions."""
        return self.parts.notifier

    @property
    def tracking(self) -> Tracking:
        """This instance's in-memory view (children, follower, announced ids)."""
        return self.parts.tracking

    # -- spawn and lookup --------------------------------------------------------------------

    def spawn(self, request: SpawnRequest) -> Session:
        return self.spawner.spawn(request)

    def get(self, session_id: str) -> Session:
        return self.reconciler.refresh(self.parts.load(session_id)).session

    def resolve(self, prefix: str) -> Session:
        return self.get(lookup(prefix, SESSION_IDS, starting=self.store.ids_with_prefix))

    def list_sessions(self, *, include_finished: bool = False) -> list[Session]:
        found = []
        self.reconciler.reap_children()  # once per listing, not per session (was quadratic)
        for stored in self.store.sessions(include_finished=include_finished):
            session = self.reconciler.refresh(stored, reap=False).session
            if include_finished or not session.finished:
                found.append(session)
        return found

    def find(self, owner: Owner) -> Session | None:
        stored = self.store.by_owner(owner)
        return None if stored is None else self.reconciler.refresh(stored).session

    # -- output ------------------------------------------------------------------------------

    def poll(self, session_id: str) -> Snapshot:
        stored = self.reconciler.refresh(self.parts.load(session_id))
        return self.viewer.snapshot(stored, "poll")

    def set_output_transform(self, hook: OutputTransform | None) -> None:
        """Install the output-transform hook (runs before redaction; None removes it)."""
        self.hooks.set_transform(hook)

    def preview(self, session_id: str, chars: int = 200) -> str:
        stored = self.reconciler.refresh(self.parts.load(session_id))
        view = self.viewer.view(stored, max(0, chars))
        session = stored.session
        return self.viewer.handed(view.text, session, session.exit_code, "preview")

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
        return self.viewer.read_log(
            self.parts.load(session_id),
            head=head,
            tail_lines=tail_lines,
            byte_range=byte_range,
            since=since,
            stamp=stamp,
            hooks=hooks,
        )

    def log_size(self, session_id: str) -> int | None:
        return FileLog(self.parts.load(session_id).session.log_path).size()

    def follow_log(
        self,
        session_id: str,
        offset: int = 0,
        *,
        stamp: Stamp | None = None,
        hooks: bool = False,
        timeout: float | None = None,
    ) -> LogFollow:
        stored = self.parts.load(session_id)
        return self.viewer.follow(self, stored, offset, stamp=stamp, hooks=hooks, timeout=timeout)

    def output_times(self, session_id: str) -> OutputTimes:
        return LogTimes(self.parts.load(session_id).session.log_path)

    def apply_hooks(self, session: Session, text: str, *, purpose: str) -> str:
        return self.viewer.handed(text, session, session.exit_code, purpose)

    def tail(self, session_id: str, chars: int, *, purpose: str) -> Snapshot:
        stored = self.reconciler.refresh(self.parts.load(session_id))
        return self.viewer.tail(stored, max(0, chars), purpose)

    def write_stdin(self, session_id: str, data: bytes) -> None:
        stored = self.reconciler.refresh(self.parts.load(session_id))
        session = stored.session
        if session.finished:
            raise RegistryError(
                f"session {session_id} is {session.state.value}; its stdin is closed",
                session=session_id,
            )
        SessionDir(Path(stored.dir)).write_stdin(data, session_id=session_id)

    # -- wait and kill -----------------------------------------------------------------------

    def wait(
        self,
        session_id: str,
        *,
        timeout: float | None = None,
        interrupt: threading.Event | Callable[[], bool] | None = None,
    ) -> WaitResult:
        deadline = None if timeout is None else time.monotonic() + timeout
        tracking = self.tracking
        followed = tracking.followed(session_id)
        while True:
            stored = self.reconciler.refresh(self.parts.load(session_id))
            outcome = None
            remaining = None if deadline is None else deadline - time.monotonic()
            if stored.session.finished:
                outcome = WaitOutcome.FINISHED
            elif interrupt is not None and _fired(interrupt):
                outcome = WaitOutcome.INTERRUPTED
            elif remaining is not None and remaining <= 0:
                outcome = WaitOutcome.TIMEOUT
            if outcome is not None:
                return WaitResult(outcome=outcome, snapshot=self.viewer.snapshot(stored, "wait"))
            step = 0.25 if followed and interrupt is None else 0.05
            with tracking.changed:
                tracking.changed.wait(step if remaining is None else min(step, remaining))

    def kill(
        self,
        session_id: str,
        *,
        grace: float | None = None,
        state: SessionState = SessionState.KILLED,
        reason: str = "killed by request",
    ) -> Snapshot:
        return self.stopper.kill(session_id, grace=grace, state=state, reason=reason)

    # -- adoption and pruning ----------------------------------------------------------------

    def adopt(self) -> list[Session]:
        return self.reconciler.adopt()

    def prune(self, *, now: float | None = None) -> int:
        ids = prune_sessions(
            self.store, self.state_dir, self.settings, self.clock.time() if now is None else now
        )
        with self.tracking.lock:
            self.tracking.announced.difference_update(ids)
        return len(ids)

    def _periodic_prune(self) -> None:
        removed = self.prune()
        if removed:
            _log.info("pruned %d finished sessions", removed)

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
        return self.desk.events(
            owner=owner,
            include_acked=include_acked,
            session_id=session_id,
            after=after,
            limit=limit,
        )

    def ack(self, event_ids: Iterable[str]) -> AckResult:
        return self.desk.ack(event_ids)

    def pending_completions(self, owner: Owner | str | None = None) -> int:
        return self.desk.pending_completions(owner)

    def handoff(self, session_id: str, to: Owner, *, note: str, by: Owner | None = None) -> Session:
        return self.desk.handoff(session_id, to, note=note, by=by)

    def teardown_owner(
        self, owner: Owner, *, reason: str | None = None, grace: float | None = None
    ) -> TeardownReport:
        return self.desk.teardown_owner(owner, reason=reason, grace=grace)

    def add_event_listener(self, listener: EventListener) -> None:
        self.notifier.add_listener(listener)

    # -- listeners and lifetime --------------------------------------------------------------

    def add_finish_listener(self, listener: FinishListener) -> None:
        with self.tracking.lock:
            self.tracking.listeners.append(listener)

    def close(self) -> None:
        """Stop the threads and release handles; running workers keep running (closing is
        never a teardown of their owners)."""
        tracking = self.tracking
        with tracking.lock:
            if tracking.closed:
                return
            tracking.closed = True
        if tracking.follower is not None:
            tracking.follower.close()
        self.notifier.close()
        with tracking.lock:
            for child in tracking.children.values():
                child.poll()
            tracking.children.clear()

    def __enter__(self) -> ProcessRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parts(
    state_dir: Path,
    db: StateDB,
    scoper: Scoper,
    settings: RegistrySettings,
    clock: Clock | None,
    hooks: OutputHooks | None,
) -> Parts:
    store = SessionStore(
        db,
        EventStore(
            db,
            max_pending=settings.max_pending_events,
            max_unacked=settings.max_unacked_events,
        ),
    )
    used_clock: Clock = clock or SystemClock()
    used_hooks = hooks or OutputHooks.from_settings(settings)
    return Parts(
        state_dir=state_dir,
        store=store,
        scoper=scoper,
        settings=settings,
        clock=used_clock,
        hooks=used_hooks,
        notifier=Notifier(store=store, settings=settings, hooks=used_hooks, clock=used_clock),
        tracking=Tracking(),
    )


def _fired(interrupt: threading.Event | Callable[[], bool]) -> bool:
    return interrupt.is_set() if isinstance(interrupt, threading.Event) else bool(interrupt())
