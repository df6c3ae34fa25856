"""Opening the state database with every package's tables.

Each package that stores something exposes a :class:`~registry.state.Component`; this is the
one place that lists them all, so every ``dispatch`` process migrates the same way.
"""

from __future__ import annotations

from pathlib import Path

from registry.state import Component, StateDB


def components() -> list[Component]:
    """All components, lowest package first."""
    found: list[Component] = []
    # Later issues append their components here (registry sessions/events, cron ledger,
    # kanban board).
    from registry.store import COMPONENT as REGISTRY_COMPONENT

    found.append(REGISTRY_COMPONENT)
    from dispatcher.kanban.schema import COMPONENT as KANBAN_COMPONENT

    found.append(KANBAN_COMPONENT)
    from dispatcher.cron.ledger import COMPONENT as CRON_COMPONENT

    found.append(CRON_COMPONENT)
    return found


def open_state(state_dir: Path) -> StateDB:
    """Open (creating and migrating) ``state_dir/state.db``."""
    return StateDB.in_dir(state_dir, components())
