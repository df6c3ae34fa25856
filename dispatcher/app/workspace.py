"""A board opened for one command (:class:`~dispatcher.app.openboard.OpenBoard`: database,
store, validated actions) with, only when needed, the registry and dispatcher.

Commands that merely add or edit cards never start the scope layer or the registry. Board reads
reconcile first (so a finished worker's card shows its final state), but open the registry
only when some run is actually open. ``tick`` always opens it.

The board is wherever cluster state lives (:mod:`dispatcher.app.clusterstate`): the state dir's
SQLite file, or the cluster database, where this command reconciles only this host's runs and
a tick claims only while this host's serve holds its lease.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dispatcher.app.clusterstate import open_cluster_state
from dispatcher.app.openboard import OpenBoard
from scope.abc import CallerKind
from scope.foundation.clock import Clock

if TYPE_CHECKING:
    from dispatcher.app.runtime import Runtime
    from dispatcher.kanban.report import Closed, TickReport
    from dispatcher.kanban.tick import KanbanDispatcher
    from dispatcher.settings import Settings
    from registry.abc import Registry


NO_LEASE_WARNING = (
    "cluster mode: no card was claimed, because this host holds no live lease (start dispatch "
    "serve on it: its lease renewals are what keeps other hosts from rescuing these runs)"
)


class Workspace(OpenBoard):
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
        self.environ = dict(environ)
        self.config_path = config_path
        self.caller = caller
        self._runtime: Runtime | None = None
        self._dispatcher: KanbanDispatcher | None = None
        super().__init__(
            open_cluster_state(settings, Path(state_dir), self.environ),
            settings.kanban,
            state_dir=state_dir,
            registry=self.registry,
            clock=clock,
        )

    def _open_runtime(self, *, fork_server: bool = False) -> Runtime:
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
                fork_server=fork_server,
            )
        return self._runtime

    def registry(self) -> Registry:
        """The process registry (opened on first use)."""
        return self._open_runtime().registry

    def dispatcher(self) -> KanbanDispatcher:
        """The dispatcher for this command (opens the registry)."""
        if self._dispatcher is None:
            # Imported here: adding or editing a card never needs the dispatcher.
            from dispatcher.kanban.faults import FaultPoint

            self._dispatcher = self._open_runtime().kanban_dispatcher(
                self.store,
                self.settings,
                self.environ,
                config_path=self.config_path,
                adopt=True,
                fault=FaultPoint.from_environ(self.environ),
            )
        return self._dispatcher

    def tick(self, *, max_claims: int | None = None, dry_run: bool = False) -> TickReport:
        """One dispatcher pass now. In cluster mode claims stop at this host's cap, and are
        made only while this host's serve holds a live lease (its renewals fence the runs)."""
        room = self.cluster.claim_room(
            self.settings.kanban.max_in_progress, self.settings.kanban.max_in_progress_per_host
        )
        warning = None
        if room is not None and not dry_run:
            if not self.cluster.lease_live():
                room, warning = 0, NO_LEASE_WARNING
            max_claims = room if max_claims is None else min(max_claims, room)
        if not dry_run and self._runtime is None:
            from dispatcher.app.keepers import MANY_WORKERS  # not on the path of 'kanban add'

            # Many workers to start: their keepers are forked, not started one by one.
            self._open_runtime(fork_server=self._may_start(max_claims) >= MANY_WORKERS)
        report = self.dispatcher().tick(self.now(), max_claims=max_claims, dry_run=dry_run)
        if warning is not None:
            report = dataclasses.replace(report, warnings=(*report.warnings, warning))
        return report

    def _may_start(self, max_claims: int | None) -> int:
        """At most how many workers a tick could start now: ready cards, within the room."""
        from dispatcher.kanban.model import CardStatus

        ready = self.store.status_counts().get(CardStatus.READY, 0)
        room = self.settings.kanban.max_in_progress
        return min(ready, room, ready if max_claims is None else max_claims)

    def run_hosts(self, card_id: str) -> dict[str, str | None]:
        """The host of each run of a card (cluster mode; empty for a single host)."""
        return self.cluster.run_hosts(card_id)

    def refresh(self) -> list[Closed]:
        """Reconcile finished runs and promote waiting cards before a board read."""
        closed: list[Closed] = []
        if self.store.open_runs():
            closed = self.dispatcher().reconcile(self.now())
        self.store.promote(now=self.now())
        return closed

    def _release(self) -> None:
        """Close the runtime (workers keep running)."""
        if self._runtime is not None:
            self._runtime.close()
