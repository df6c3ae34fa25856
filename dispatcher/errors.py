"""dispatcher/'s branch of the error tree (the root and the whole tree are drawn in
:mod:`scope.foundation.errors`).

::

    DispatchError
    └── DispatcherError        cron, kanban or the gateway could not do what was asked
        ├── EnvFileError       an env_file is unreadable, unsafe or malformed
        ├── GatewayError       ``dispatch serve`` cannot start or run (e.g. already running)
        └── MissingModule      the installation lacks a module the command imports

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


class MissingModule(DispatcherError):
    """A module the command needs cannot be imported (exit 1): the installation is incomplete
    or broken. Permanent until someone reinstalls, so ``dispatch serve`` stops on it at start
    instead of asking for a restart."""

    def __init__(self, module: str, detail: str) -> None:
        super().__init__(
            remedy="reinstall dispatch with its dependencies ('pip install --force-reinstall "
            "dispatch'), and report it if that does not help",
            module=module,
            detail=detail,
        )

    def describe(self) -> str:
        return f"dispatch cannot import {self.fields['module']} ({self.fields['detail']})"

    @classmethod
    def from_import_error(cls, err: ImportError) -> MissingModule:
        """Ours for ``err`` (its module name and Python's one-line reason)."""
        from scope.foundation.text import one_line

        return cls(err.name or "a module", one_line(str(err)) or type(err).__name__)
