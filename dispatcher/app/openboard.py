"""A board opened for one command: cluster state and the validated actions, and at close a
poke to the state dir's gateway when the command changed the board.

This is all that adding a card or a worker's report needs; :class:`~dispatcher.app.workspace.
Workspace` builds on it with the registry and the dispatcher for the commands that read runs
or start workers. It imports neither, nor the config schema: the short write commands open it
from the config snapshot (:mod:`dispatcher.app.snapshot`) as well as from full settings.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dispatcher.app.clusterstate import ClusterState
from dispatcher.app.wake import poke
from dispatcher.kanban.board import Board, BoardSettings
from dispatcher.kanban.store import SqlBoardStore
from scope.foundation.clock import Clock

if TYPE_CHECKING:
    from registry.abc import Registry

__all__ = ["OpenBoard"]


class OpenBoard:
    """The board of ``cluster`` for one command (see the module docstring); closing it closes
    ``cluster``. ``registry`` opens the process registry when an action must stop a worker."""

    def __init__(
        self,
        cluster: ClusterState,
        settings: BoardSettings,
        *,
        state_dir: Path,
        registry: Callable[[], Registry] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.cluster = cluster
        # Cluster mode: the database's clock, so a defer's time or a claim's "now" mean the
        # same on every host.
        self.clock: Clock = clock or cluster.clock
        self.db = cluster.local
        self.store: SqlBoardStore = cluster.board
        try:
            self.board = Board(self.store, settings, registry=registry, state_dir=self.state_dir)
            self._opened_version = self.store.board_version()
        except BaseException:
            cluster.close()
            raise

    def now(self) -> float:
        """The current wall time (the cluster database's in cluster mode)."""
        return self.clock.time()

    def _release(self) -> None:
        """Close what a subclass opened beside the board (before the board's database)."""

    def close(self) -> None:
        """Close the database (after :meth:`_release`); when this command changed the board,
        poke the state dir's gateway so it looks at once."""
        try:
            changed = self.store.board_version() != self._opened_version
            self._release()
        finally:
            self.cluster.close()
        if changed:
            poke(self.state_dir)
