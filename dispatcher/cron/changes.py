"""Typed changes to a ledger row: what :meth:`LedgerStore.update` writes.

A :class:`FireChange` names the columns a compare-and-set sets, each typed; a field left at
:data:`UNSET` is not touched (``None`` stores NULL). The ledger never takes free-form column
names, so a misspelt column is a type error, not a runtime surprise.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from dispatcher.cron.records import RetryKind, Status, Try, dump_tries
from dispatcher.launch.outcome import Outcome

if TYPE_CHECKING:
    from dispatcher.launch.outbox import Tail

__all__ = ["UNSET", "FireChange", "Unset"]


class Unset(enum.Enum):
    """The type of :data:`UNSET`."""

    UNSET = "unset"


UNSET = Unset.UNSET
"""A :class:`FireChange` field that leaves its column as it is."""


@dataclass(frozen=True, kw_only=True)
class FireChange:
    """The columns one ledger update sets (see the module docstring)."""

    status: Status | Unset = UNSET
    outcome: Outcome | Unset | None = UNSET
    error: str | Unset | None = UNSET
    infrastructure: bool | Unset = UNSET
    claimant: str | Unset | None = UNSET
    """A :meth:`~dispatcher.launch.claimant.Claimant.token`."""
    due_at: float | Unset | None = UNSET
    jitter: float | Unset = UNSET
    actual: float | Unset | None = UNSET
    session_id: str | Unset | None = UNSET
    placement: str | Unset | None = UNSET
    started_at: float | Unset | None = UNSET
    ended_at: float | Unset | None = UNSET
    exit_code: int | Unset | None = UNSET
    signal: str | Unset | None = UNSET
    log_path: str | Unset | None = UNSET
    on_failure_session: str | Unset | None = UNSET
    attempt: int | Unset = UNSET
    attempts: int | Unset | None = UNSET
    retry_at: float | Unset | None = UNSET
    retry_kind: RetryKind | Unset | None = UNSET
    retry_reason: str | Unset | None = UNSET
    tries: tuple[Try, ...] | Unset = UNSET
    output: Tail | None = None
    """No column: the end of the worker's output for the message of the fire's end (read
    before the update's transaction, :meth:`~dispatcher.launch.outbox.Outbox.tail`)."""

    def columns(self) -> dict[str, Any]:
        """The columns this change sets, with their stored values."""
        found: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if value is UNSET or item.name == "output":
                continue
            if item.name == "tries":
                value = dump_tries(value)
            elif isinstance(value, enum.Enum):
                value = value.value
            elif isinstance(value, bool):
                value = int(value)
            found[item.name] = value
        return found
