"""dispatcher/'s branch of the error tree (the root and tree drawing are in :mod:`scope.errors`).

::

    DispatchError
    └── DispatcherError        cron, kanban or the gateway could not do what was asked
        └── GatewayError       ``dispatch serve`` cannot start or run (e.g. already running)
"""

from __future__ import annotations

from scope.errors import DispatchError


class DispatcherError(DispatchError):
    """Cron, kanban or the gateway could not do what was asked."""


class GatewayError(DispatcherError):
    """``dispatch serve`` cannot start or keep running."""
