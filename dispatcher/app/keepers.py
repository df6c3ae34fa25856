"""The keeper fork server of a command that starts many workers (serve, a large kanban tick).

A keeper started from the fork server costs a ``fork`` instead of an interpreter start, which
on a busy host is most of a spawn's CPU (see docs/registry.md). The server is a separate
program, exec'd fresh (``python -I -S``), so it never inherits a lock or thread state of the
command that starts it; it ends with that command, and its keepers do not. Whether a command
uses one is decided here; ``registry.fork_server: false`` turns it off everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dispatcher.settings import Settings
from registry.process import ForkServer

__all__ = ["MANY_WORKERS", "keeper_stats", "open_fork_server"]

MANY_WORKERS = 8
"""A ``kanban tick`` that may start this many workers starts a fork server first: it costs
about what three fresh keepers do, and saves most of every keeper after that."""


def open_fork_server(
    settings: Settings, state_dir: Path, environ: Mapping[str, str]
) -> ForkServer | None:
    """A started fork server, or None when ``registry.fork_server`` is off. One that cannot
    start is still returned: its spawns fall back (counted), and it is tried again later."""
    if not settings.registry.fork_server:
        return None
    server = ForkServer(cache_dir=Path(state_dir) / "cache", environ=environ)
    server.open()
    return server


def keeper_stats(server: ForkServer | None) -> dict[str, Any] | None:
    """What the fork server did, as the status file keeps it (None without one)."""
    return None if server is None else server.stats().to_dict()
