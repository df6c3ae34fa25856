"""registry/'s branch of the error tree (the root and tree drawing are in :mod:`scope.errors`).

::

    DispatchError
    ├── UsageError
    │   └── AmbiguousId          an id prefix matches several sessions/cards/runs (exit 2)
    └── RegistryError            spawning, killing or reading a session failed
        ├── StateError           the state database is unusable or from a newer version
        │   ├── StateDamaged     not a database / malformed (store/database.py)
        │   ├── StateFull        no space left for a write (store/database.py)
        │   └── UnsafeStatePath  a state path another user owns or may write (store/database.py)
        ├── SpawnRefused         the registry will not run this command (names the alternative)
        └── HandoffRefused       a session cannot be handed to another owner
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scope.foundation.errors import DispatchError, UsageError
from scope.foundation.text import quote


class RegistryError(DispatchError):
    """Spawning, killing, adopting or reading a session failed."""


class StateError(RegistryError):
    """The state database cannot be used (corrupt, unwritable, or written by a newer version)."""

    def __init__(self, problem: str, *, path: str, remedy: str | None = None, **fields: Any):
        super().__init__(remedy=remedy, problem=problem, path=path, **fields)

    def describe(self) -> str:
        return f"state database {self.fields['path']}: {self.fields['problem']}"


class SpawnRefused(RegistryError):
    """The registry refuses to run a command (for example one that would kill the gateway)."""

    exit_code = 2

    def __init__(self, reason: str, *, remedy: str | None = None, **fields: Any) -> None:
        super().__init__(remedy=remedy, reason=reason, **fields)

    def describe(self) -> str:
        return f"refused to run the command: {self.fields['reason']}"


class HandoffRefused(RegistryError):
    """A handoff was refused: the session is final, owned by someone else, or the owner used
    up its handoffs."""

    def __init__(
        self, reason: str, *, session: str, remedy: str | None = None, **fields: Any
    ) -> None:
        super().__init__(remedy=remedy, reason=reason, session=session, **fields)

    def describe(self) -> str:
        return f"cannot hand off session {self.fields['session']}: {self.fields['reason']}"


class AmbiguousId(UsageError):
    """An id prefix matches more than one object; lists the candidates."""

    def __init__(self, kind: str, prefix: str, candidates: Sequence[str]) -> None:
        super().__init__(kind=kind, prefix=prefix, candidates=list(candidates))

    def describe(self) -> str:
        shown = ", ".join(self.fields["candidates"][:10])
        more = len(self.fields["candidates"]) - 10
        tail = f" and {more} more" if more > 0 else ""
        return (
            f"ambiguous {self.fields['kind']} id {quote(self.fields['prefix'])}: matches "
            f"{shown}{tail}; give more characters"
        )
