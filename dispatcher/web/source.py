"""The state as ``dispatch web`` sees it: one long-lived reader, and a fresh workspace per action.

Reads (pages, the live watcher, ``/metrics``) share one :class:`~dispatcher.app.workspace.
Workspace` and one runtime for the life of the process, so a page costs queries, not database
opens. Whatever store the workspace opens (the embedded SQLite board, or the cluster database)
is what the web shows: nothing here names a backend.

Actions open their own workspace exactly as a ``dispatch kanban`` command does and close it
when done, which pokes the gateway when the board changed; cron actions go through
:class:`~dispatcher.app.cronjobs.CronJobs` like ``dispatch cron``.

When no gateway runs on this state dir, nobody else notices that a worker finished; reads then
reconcile first (:meth:`Source.refresh`), exactly as ``dispatch kanban list`` does.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatcher.app.cronjobs import CronJobs
from dispatcher.app.runtime import Runtime, open_runtime
from dispatcher.app.workspace import Workspace
from dispatcher.cron.ledger import Ledger
from dispatcher.gateway.lock import read_holder
from dispatcher.kanban.abc import BoardStore
from dispatcher.kanban.model import Card
from dispatcher.settings import Settings
from registry.abc import Registry
from scope.abc import CallerKind

if TYPE_CHECKING:
    from dispatcher.cluster.hosts import HostRow
    from dispatcher.gateway.statusfile import ServeStatus


DOCTOR_TTL = 30.0


class Source:
    """Reads and actions on one state dir (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        state_dir: Path,
        environ: Mapping[str, str],
        *,
        config_path: Path | None = None,
    ) -> None:
        self.settings = settings
        self.state_dir = Path(state_dir)
        self.environ = dict(environ)
        self.config_path = config_path
        self.reader = Workspace(
            settings, self.state_dir, environ=self.environ, config_path=config_path
        )
        self._runtime: Runtime | None = None
        self._lock = threading.RLock()
        self._doctor: tuple[float, dict[str, Any]] | None = None
        self.host_id = settings.cluster.effective_host_id()

    # -- reads -------------------------------------------------------------------------------

    @property
    def store(self) -> BoardStore:
        """The board store the workspace opened."""
        return self.reader.store

    def limit_waits(self, cards: Iterable[Card]) -> dict[str, str]:
        """The full named limit each of ``cards`` waits for (``kanban list``'s note)."""
        from dispatcher.app.limitview import card_waits

        stamp = self.reader.cluster.stamp
        host = None if stamp is None else stamp.host_id
        found = card_waits(self.settings, self.store, cards, now=time.time(), host=host)
        return found.texts()

    def limits(self) -> list[dict[str, Any]]:
        """``dispatch limits --json``'s document."""
        from dispatcher.app.limitview import limits_doc

        stamp = self.reader.cluster.stamp
        host = None if stamp is None else stamp.host_id
        return limits_doc(self.settings, self.store, self.ledger(), now=time.time(), host=host)

    def runtime(self) -> Runtime:
        """The shared runtime (database, lazily opened scoper, registry without a follower)."""
        with self._lock:
            if self._runtime is None:
                self._runtime = open_runtime(
                    self.settings, self.state_dir, self.environ, caller_kind=CallerKind.CLI
                )
            return self._runtime

    def registry(self) -> Registry:
        """The shared registry (sessions, logs)."""
        return self.runtime().registry

    def gateway_running(self) -> bool:
        """Whether a ``dispatch serve`` holds this state dir's lock."""
        return read_holder(self.state_dir) is not None

    def keepers(self) -> dict[str, Any] | None:
        """The running gateway's keeper fork server figures (its status file), or None."""
        status = self._served()
        return None if status is None else status.keepers

    def relay(self) -> dict[str, Any] | None:
        """The running gateway's short-write relay figures (its status file), or None."""
        status = self._served()
        return None if status is None else status.relay

    def _served(self) -> ServeStatus | None:
        """The running gateway's status file, or None (no gateway, or not its file)."""
        from dispatcher.gateway.statusfile import read_status

        holder = read_holder(self.state_dir)
        status = read_status(self.state_dir) if holder else None
        if status is None or holder is None or status.pid != holder.pid:
            return None
        return status

    def refresh(self) -> None:
        """Reconcile finished runs when no gateway does (``kanban list`` does the same)."""
        if self.gateway_running():
            return
        with self._lock:
            self.reader.refresh()

    def doctor(self) -> dict[str, Any]:
        """The doctor's report (placement per caller, remedies), reusing a probe verdict
        within its TTL; kept for :data:`DOCTOR_TTL` seconds."""
        with self._lock:
            cached = self._doctor
            if cached is not None and time.monotonic() - cached[0] < DOCTOR_TTL:
                return cached[1]
        from dispatcher.gateway.doctor import doctor_report

        scoper: Any = self.runtime().scoper
        real = scoper.real() if hasattr(scoper, "real") else scoper
        report, ok = doctor_report(
            real,
            self.environ,
            degrade_without_scope=self.settings.kanban.degrade_without_scope,
            force_probe=False,
            classes=self.settings.classes(),
        )
        report["healthy"] = ok
        with self._lock:
            self._doctor = (time.monotonic(), report)
        return report

    def ledger(self) -> Ledger:
        """The cron ledger, wherever cluster state lives (as ``dispatch cron`` reads it)."""
        return self.reader.cluster.ledger

    def cron(self) -> CronJobs:
        """The configured cron jobs over the ledger, made as ``dispatch cron`` makes them."""
        from dispatcher.gateway.statusfile import scheduler_zone

        return CronJobs(
            self.settings,
            self.ledger,
            environ=self.environ,
            state_dir=self.state_dir,
            config_path=self.config_path,
            host_zone=scheduler_zone(self.state_dir),
        )

    @property
    def cluster_configured(self) -> bool:
        """Whether cluster state is in a cluster database (``cluster.database``)."""
        return self.reader.cluster.clustered

    def hosts(self) -> list[HostRow]:
        """The cluster's hosts (cluster mode only; see :attr:`cluster_configured`)."""
        hosts = self.reader.cluster.hosts
        return [] if hosts is None else hosts.rows()

    def run_hosts(self, card_ids: Iterable[str]) -> dict[str, str | None]:
        """The host of each run of these cards (cluster mode; empty for a single host)."""
        found: dict[str, str | None] = {}
        for card_id in card_ids:
            found.update(self.reader.cluster.run_hosts(card_id))
        return found

    # -- actions -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def action(self) -> Iterator[Workspace]:
        """A workspace for one action, opened and closed as a ``dispatch kanban`` command
        does (closing pokes the gateway when the board changed)."""
        workspace = Workspace(
            self.settings,
            self.state_dir,
            environ=self.environ,
            config_path=self.config_path,
            caller=CallerKind.ONESHOT,
        )
        try:
            yield workspace
        finally:
            workspace.close()

    @contextlib.contextmanager
    def cron_runtime(self) -> Iterator[Runtime]:
        """A runtime for starting a cron fire now, as ``dispatch cron run`` opens one."""
        runtime = open_runtime(
            self.settings, self.state_dir, self.environ, caller_kind=CallerKind.CRON
        )
        try:
            yield runtime
        finally:
            runtime.close()

    def close(self) -> None:
        """Close what the reads opened (workers keep running)."""
        with self._lock:
            try:
                if self._runtime is not None:
                    self._runtime.close()
            finally:
                self.reader.close()
