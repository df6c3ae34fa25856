"""What every part of :class:`~registry.process.ProcessRegistry` works with.

The process registry is a facade over parts named by what they do (spawning, finalizing,
reconciling, stopping, viewing output, the owner desk). They share one :class:`Parts`
record: the durable store, the scope layer, the settings, the clock, the output hooks, the
event notifier, and the in-memory :class:`Tracking` of this instance (its keeper children,
the follower thread, the sessions it announced or is killing). Nothing here decides
anything; it only holds what the parts need and answers "is this session followed here?".
"""

from __future__ import annotations

import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from registry.abc import FinishListener
from registry.live.follower import Follower
from registry.live.notifier import Notifier
from registry.output.hooks import OutputHooks
from registry.settings import RegistrySettings
from registry.store.sessions import SessionStore, StoredSession
from scope.abc import Scoper, Starter
from scope.foundation.clock import Clock
from scope.foundation.errors import NotFoundError

__all__ = ["LaunchOptions", "Parts", "Tracking"]


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """How this instance runs keepers and follows them (the constructor's tuning knobs)."""

    python: str
    """The interpreter that runs the keeper."""
    keeper_argv: tuple[str, ...]
    """The keeper command (interpreter, flags, script), before the spec path."""
    starter: Starter | None = None
    """Starts keepers instead of ``Popen`` (the keeper fork server), None: ``Popen``."""
    ready_timeout: float = 30.0
    """Seconds a spawn waits for the keeper's "started" signal."""
    follow: bool = True
    """Run the follower thread for sessions this instance spawns or adopts."""
    interval: float = 0.05
    """Follower poll interval while a followed session is busy (seconds)."""
    idle_interval: float = 1.0
    """Follower poll interval while nothing is followed (seconds)."""


@dataclass(kw_only=True)
class Tracking:
    """This instance's in-memory view: what it launched, follows, announced, is killing.

    Every field is guarded by ``lock`` (``changed`` wakes waiters when a session ends)."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    changed: threading.Condition = field(init=False)
    listeners: list[FinishListener] = field(default_factory=list)
    announced: set[str] = field(default_factory=set)
    """Sessions whose end this instance announced (bounded by pruning)."""
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    """Keepers this instance started and has not reaped yet."""
    killing: set[str] = field(default_factory=set)
    """Sessions a ``kill`` of this instance is finishing (the follower leaves them to it)."""
    follower: Follower | None = None
    closed: bool = False

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    def followed(self, session_id: str) -> bool:
        """Whether this instance's follower tails the session."""
        return self.follower is not None and session_id in self.follower

    def child(self, session_id: str) -> subprocess.Popen[bytes] | None:
        """The keeper process this instance started for the session, if not reaped."""
        with self.lock:
            return self.children.get(session_id)


@dataclass(frozen=True, kw_only=True)
class Parts:
    """The shared pieces, built once by the facade and handed to every part."""

    state_dir: Path
    store: SessionStore
    scoper: Scoper
    settings: RegistrySettings
    clock: Clock
    hooks: OutputHooks
    notifier: Notifier
    tracking: Tracking

    def load(self, session_id: str) -> StoredSession:
        """The stored row of a session (raises NotFoundError, exit 2)."""
        stored = self.store.get(session_id)
        if stored is None:
            raise NotFoundError("session", session_id, remedy="see 'dispatch ps --all' for ids")
        return stored
