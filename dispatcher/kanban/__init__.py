"""dispatcher/kanban: the board store, the dispatcher tick and the failure taxonomy.

Modules: :mod:`~dispatcher.kanban.model` (vocabulary and records), :mod:`~dispatcher.kanban.abc`
(the store contract), :mod:`~dispatcher.kanban.store` (SQLite), :mod:`~dispatcher.kanban.taxonomy`
(exit codes → card transitions, breaker), :mod:`~dispatcher.kanban.worker` (argv, env, body file),
:mod:`~dispatcher.kanban.dispatcher` (``tick(now)``), :mod:`~dispatcher.kanban.board` (validated
operator and worker actions), :mod:`~dispatcher.kanban.lookup` (card/run ids for ``dispatch
logs``), :mod:`~dispatcher.kanban.views` (JSON and text).

The names below are loaded on first use: ``dispatcher.settings`` imports this package for its
config section, and must stay cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Board": "dispatcher.kanban.board",
    "BoardStore": "dispatcher.kanban.abc",
    "KanbanDispatcher": "dispatcher.kanban.dispatcher",
    "SqliteBoardStore": "dispatcher.kanban.store",
    "TickReport": "dispatcher.kanban.report",
    "resolve_session_id": "dispatcher.kanban.lookup",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dispatcher.kanban' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
