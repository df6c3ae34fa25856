"""Who a session belongs to (:class:`Owner`, of an :class:`OwnerKind`) and what its output is
watched for (:class:`WatchPattern`): plain values of the registry's contract, re-exported by
:mod:`registry.abc`."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Owner", "OwnerKind", "WatchPattern"]


class OwnerKind(enum.StrEnum):
    """The kinds of owner the project itself uses (an :class:`Owner` may name others)."""

    KANBAN = "kanban"
    """A kanban run (``id`` is the run id)."""
    CRON = "cron"
    """A cron fire (``id`` is the fire key)."""
    CLI = "cli"
    """``dispatch run`` (``id`` is ``user:pid``)."""
    CLIENT = "client"
    """A library client (``id`` is its name)."""


@dataclass(frozen=True, kw_only=True)
class Owner:
    """Who a session belongs to: events are routed to the owner.

    ``kind`` is an :class:`OwnerKind` (a known kind given as a string becomes its member, so
    ``owner.kind is OwnerKind.KANBAN`` holds for both); other kinds stay strings (tests,
    users' own tools). ``id`` identifies the owner within its kind (a run id, a fire key, a
    client name)."""

    kind: OwnerKind | str
    id: str

    def __post_init__(self) -> None:
        if not isinstance(self.kind, OwnerKind) and self.kind in _OWNER_KINDS:
            object.__setattr__(self, "kind", OwnerKind(self.kind))

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}"

    @classmethod
    def parse(cls, text: str) -> Owner:
        """The inverse of ``str(owner)``."""
        kind, _, ident = text.partition(":")
        return cls(kind=kind, id=ident)


_OWNER_KINDS = frozenset(k.value for k in OwnerKind)


@dataclass(frozen=True, kw_only=True)
class WatchPattern:
    """A watch pattern: a substring (default) or a regular expression, matched against whole
    lines of a session's output."""

    pattern: str
    regex: bool = False

    def __str__(self) -> str:
        return f"re:{self.pattern}" if self.regex else self.pattern
