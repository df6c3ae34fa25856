"""Opening the state database with every package's tables.

Each package that stores something exposes a
:class:`~registry.store.database.Component`; this is the one place that lists them all, so
every ``dispatch`` process migrates the same way.
"""

from __future__ import annotations

from pathlib import Path

from dispatcher.cron.tables import COMPONENT as CRON_COMPONENT
from dispatcher.kanban.tables import COMPONENT as KANBAN_COMPONENT
from dispatcher.launch.tables import COMPONENT as LIMITS_COMPONENT
from dispatcher.notify.tables import COMPONENT as NOTIFY_COMPONENT
from dispatcher.rolluptables import COMPONENT as HISTORY_COMPONENT
from dispatcher.tokens.tables import COMPONENT as TOKENS_COMPONENT
from registry.store.database import Component, StateDB
from registry.store.tables import COMPONENT as REGISTRY_COMPONENT


def components() -> list[Component]:
    """All components, lowest package first (the history rollup last: its triggers watch the
    board's and the ledger's tables)."""
    return [
        REGISTRY_COMPONENT,
        KANBAN_COMPONENT,
        CRON_COMPONENT,
        NOTIFY_COMPONENT,
        TOKENS_COMPONENT,
        LIMITS_COMPONENT,
        HISTORY_COMPONENT,
    ]


def open_state(state_dir: Path) -> StateDB:
    """Open (creating and migrating) ``state_dir/state.db``."""
    return StateDB.in_dir(state_dir, components())
