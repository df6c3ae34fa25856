"""Typed changes to stored sessions: what :class:`~registry.store.sessions.SessionStore` writes.

Each record names one kind of change and the columns it sets (``columns()``), so the store
never takes free-form column names: the launch's placement (:class:`Placed`), the keeper's
start facts (:class:`Started`), late byte counts (:class:`Counted`), the final state
(:class:`FinalFields`), and the marks stored with heartbeat and watch events.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from registry.abc import SessionState
from registry.usage import ResourceClass, Usage
from scope.abc import Placement

__all__ = [
    "Counted",
    "FinalFields",
    "HandoffResult",
    "HeartbeatMark",
    "Placed",
    "SessionChange",
    "Started",
    "WatchMark",
]


class HandoffResult(enum.Enum):
    """What :meth:`SessionStore.handoff` did."""

    OK = "ok"
    """The owner changed and the handoff event is stored."""
    LIMIT = "limit"
    """The current owner used up its handoffs; nothing changed."""
    CHANGED = "changed"
    """The session ended or has another owner now; nothing changed."""


@dataclass(frozen=True, kw_only=True)
class Placed:
    """A change: the scope layer placed the keeper (after the launch)."""

    placement: Placement
    unit: str | None
    keeper_pid: int
    keeper_start: int | None
    warning: str | None
    resources: ResourceClass | None = None
    """The class the keeper's scope got (None: no scope of its own)."""

    def columns(self) -> dict[str, Any]:
        """The columns this change sets."""
        granted = self.resources
        return {
            "placement": self.placement,
            "unit": self.unit,
            "keeper_pid": self.keeper_pid,
            "keeper_start": self.keeper_start,
            "warning": self.warning,
            "resources": None if granted is None else json.dumps(granted.to_json()),
        }


@dataclass(frozen=True, kw_only=True)
class Started:
    """A change: the keeper started the worker (facts from ``keeper.json``). The keeper's
    own identity is set only when given (a row that lacks it)."""

    worker_pid: int
    worker_start: int | None
    started_at: float
    keeper_pid: int | None = None
    keeper_start: int | None = None

    def columns(self) -> dict[str, Any]:
        """The columns this change sets."""
        found: dict[str, Any] = {
            "worker_pid": self.worker_pid,
            "worker_start": self.worker_start,
            "started_at": self.started_at,
        }
        if self.keeper_pid is not None:
            found.update(keeper_pid=self.keeper_pid, keeper_start=self.keeper_start)
        return found


@dataclass(frozen=True, kw_only=True)
class Counted:
    """A change: the keeper's last record counts bytes that came after the final state."""

    total_bytes: int
    dropped_bytes: int

    def columns(self) -> dict[str, Any]:
        """The columns this change sets."""
        return {"total_bytes": self.total_bytes, "dropped_bytes": self.dropped_bytes}


SessionChange = Placed | Started | Counted
"""The changes :meth:`SessionStore.update` makes to a row (none of them a state change)."""


@dataclass(frozen=True, kw_only=True)
class FinalFields:
    """The final columns of a session (what :meth:`SessionStore.finalize` stores)."""

    state: SessionState
    exit_code: int | None
    signal: str | None
    finished_at: float
    completion_reason: str | None
    total_bytes: int
    dropped_bytes: int
    started_at: float | None = None
    """Set only when the row has no start time yet (None: left as it is)."""
    usage: Usage | None = None
    """What the worker used (the keeper's reading; None: none)."""

    def columns(self) -> dict[str, Any]:
        """The columns this change sets."""
        found: dict[str, Any] = {
            "usage": json.dumps(self.usage.to_json()) if self.usage is not None else None,
            "state": self.state,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "finished_at": self.finished_at,
            "completion_reason": self.completion_reason,
            "total_bytes": self.total_bytes,
            "dropped_bytes": self.dropped_bytes,
        }
        if self.started_at is not None:
            found["started_at"] = self.started_at
        return found


@dataclass(frozen=True, kw_only=True)
class HeartbeatMark:
    """Stored with a heartbeat event: the heartbeat offset moves from ``since`` (a
    compare-and-set: another publisher that moved it first wins) to ``offset``."""

    since: int
    offset: int
    at: float


@dataclass(frozen=True, kw_only=True)
class WatchMark:
    """Stored with a watch event: where watching got to (JSON of the watch gate);
    ``stopped`` also turns on notify-on-complete (watching was disabled)."""

    state: str
    stopped: bool = False
