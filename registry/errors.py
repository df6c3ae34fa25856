"""registry/'s branch of the error tree (the root and the whole tree are drawn in
:mod:`scope.foundation.errors`; an unknown, too short or ambiguous id is a usage error from
:mod:`scope.foundation.ids`).

::

    DispatchError
    └── RegistryError            spawning, killing or reading a session failed
        ├── StateError           the state database is unusable or from a newer version
        │   ├── StateDamaged     not a database / malformed (store/database.py)
        │   ├── StateFull        no space left for a write (store/database.py)
        │   └── UnsafeStatePath  a state path another user owns or may write (store/database.py)
        ├── SpawnRefused         the registry will not run this command (names the alternative)
        └── HandoffRefused       a session cannot be handed to another owner
"""

from __future__ import annotations

from typing import Any

from scope.foundation.errors import DispatchError


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
