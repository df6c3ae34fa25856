"""A board opened for one command: database, store, validated actions and, only when needed,
the registry and dispatcher.

Commands that merely add or edit cards never start the scope layer or the registry. Board reads
reconcile first (so a finished worker's card shows its final state), but open the registry
only when some run is actually open. ``tick`` always opens it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dispatcher.app.database import open_state
from dispatcher.app.wake import poke
from dispatcher.kanban.board import Board
from dispatcher.kanban.report import Closed
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.settings import Settings
from registry.abc import Registry
from scope.abc import CallerKind
from scope.foundation.clock import Clock, SystemClock

if TYPE_CHECKING:
    from dispatcher.app.runtime import Runtime
    from dispatcher.kanban.dispatcher import KanbanDispatcher


class Workspace:
    """Everything a ``dispatch kanban`` command works with (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        state_dir: Path,
        *,
        environ: Mapping[str, str],
        config_path: Path | None = None,
        caller: CallerKind = CallerKind.ONESHOT,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.state_dir = Path(state_dir)
        self.environ = dict(environ)
        self.config_path = config_path
        self.caller = caller
        self.clock: Clock = clock or SystemClock()
        self.db = open_state(self.state_dir)
        self.store = SqliteBoardStore(self.db)
        self.board = Board(
            self.store, settings.kanban, registry=self.registry, state_dir=self.state_dir
        )
        self._runtime: Runtime | None = None
        self._dispatcher: KanbanDispatcher | None = None
        self._opened_version = self.store.board_version()

    def now(self) -> float:
        """The current wall time."""
        return self.clock.time()

    def _open_runtime(self) -> Runtime:
        if self._runtime is None:
            # Imported on demand: adding a card must not pay for the registry and scope layer.
            from dispatcher.app.runtime import open_runtime

            self._runtime = open_runtime(
                self.settings,
                self.state_dir,
                self.environ,
                caller_kind=self.caller,
                follow=False,
                protect_gateway=False,
                clock=self.clock,
            )
        return self._runtime

    def registry(self) -> Registry:
        """The process registry (opened on first use)."""
        return self._open_runtime().registry

    def dispatcher(self) -> KanbanDispatcher:
        """The dispatcher for this command (opens the registry)."""
        if self._dispatcher is None:
            # Imported here: adding or editing a card never needs the dispatcher.
            from dispatcher.kanban.dispatcher import KanbanDispatcher
            from dispatcher.kanban.faults import FaultPoint

            runtime = self._open_runtime()
            self._dispatcher = KanbanDispatcher(
                store=self.store,
                registry=runtime.registry,
                settings=self.settings.kanban,
                state_dir=self.state_dir,
                caller=self.caller,
                config_path=self.config_path,
                environ=self.environ,
                scoper=runtime.scoper,
                adopt=True,
                fault=FaultPoint.from_environ(self.environ),
            )
        return self._dispatcher

    def refresh(self) -> list[Closed]:
        """Reconcile finished runs and promote waiting cards before a board read."""
        closed: list[Closed] = []
        if self.store.open_runs():
            closed = self.dispatcher().reconcile(self.now())
        self.store.promote(now=self.now())
        return closed

    def close(self) -> None:
        """Close the runtime (workers keep running) and the database; when this command
        changed the board, poke the state dir's gateway so it looks at once."""
        try:
            changed = self.store.board_version() != self._opened_version
            if self._runtime is not None:
                self._runtime.close()
        finally:
            self.db.close()
        if changed:
            poke(self.state_dir)
