"""Notifications in ``dispatch serve``: the sender thread, config reloads, and the events that
are no database change (a rejected reload).

The outbox object is shared by the board and the ledger of the process (see
:class:`dispatcher.app.clusterstate.ClusterState`), so a reload replaces its routes in place
and every later event is routed the new way. A reload whose notify section cannot be applied
(a secret file unreadable or not private) raises before anything changes: the gateway rejects
the reload and keeps the old config.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dispatcher.launch.outbox import Outbox, Subject
from dispatcher.notify.sender import Sender, load_secrets
from dispatcher.notify.settings import NotifySettings
from dispatcher.notify.store import NotifyStore

__all__ = ["Notifications"]


class Notifications:
    """The serve side of notifications (see the module docstring)."""

    def __init__(
        self,
        settings: NotifySettings,
        outbox: Outbox,
        store: NotifyStore,
        source: str | os.PathLike[str] | None = None,
    ) -> None:
        self.outbox = outbox
        self.store = store
        self.source = source
        """The config file, named by a refusal of a secret file."""
        self.sender: Sender | None = None
        self.apply(settings)

    def apply(self, settings: NotifySettings) -> None:
        """Route and deliver by ``settings`` from now on (a ``ConfigError`` changes nothing)."""
        secrets = load_secrets(settings, self.source)
        self.outbox.routes = tuple(settings.routes())
        self.outbox.output_tail = settings.output_tail
        if not settings.rules:
            self.close()
            return
        if self.sender is None:
            if not self.store.shared:
                # serve's lock makes this the outbox's only sender: a claim is a dead one's.
                self.store.release_claims()
            self.sender = Sender(self.store, settings)
            self.sender.start()
        else:
            self.sender.settings, self.sender.secrets = settings, secrets

    def event(self, event: str, fields: Mapping[str, Any], now: float) -> None:
        """Queue ``event`` (no database change of its own) in a transaction of its own."""
        self.outbox.record_new(self.store.write, event, fields, Subject(), now)

    def wake(self) -> None:
        """Deliver now what the board's last change queued (instead of at the next poll)."""
        if self.sender is not None:
            self.sender.wake()

    def close(self) -> None:
        """Stop the sender thread (undelivered messages wait in the outbox)."""
        sender, self.sender = self.sender, None
        if sender is not None:
            sender.close()
