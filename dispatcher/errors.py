"""dispatcher/'s branch of the error tree (the root and the whole tree are drawn in
:mod:`scope.foundation.errors`).

::

    DispatchError
    └── DispatcherError        cron, kanban or the gateway could not do what was asked
        ├── EnvFileError       an env_file is unreadable, unsafe or malformed
        └── GatewayError       ``dispatch serve`` cannot start or run (e.g. already running)

cron and kanban add their own branches (dispatcher/cron/errors.py, dispatcher/kanban/errors.py).
"""

from __future__ import annotations

from typing import Any

from scope.foundation.errors import DispatchError


class DispatcherError(DispatchError):
    """Cron, kanban or the gateway could not do what was asked."""


class GatewayError(DispatcherError):
    """``dispatch serve`` cannot start or keep running."""


class EnvFileError(DispatcherError):
    """An ``env_file`` cannot be used (missing, unsafe permissions, malformed line)."""

    def __init__(self, path: str, problem: str, *, remedy: str | None = None, **fields: Any):
        super().__init__(remedy=remedy, path=path, problem=problem, **fields)

    def describe(self) -> str:
        return f"env_file {self.fields['path']}: {self.fields['problem']}"
