"""What a worker reports through: the state captured when its run (or cron fire) was started.

A worker's ``dispatch kanban complete|block|review|defer`` must land even while the operator's
config is half edited, broken or changed (issue 19, section 3). So at spawn the launcher
(kanban's and cron's alike) writes into the worker's environment everything those commands
need to find the board or the ledger, and the commands read only that:

- ``DISPATCH_STATE_DIR``: the state dir (always, see :mod:`dispatcher.launch.setup`);
- ``DISPATCH_HOST_ID``: this host's id (always; it also marks an environment as captured);
- in cluster mode ``DISPATCH_DATABASE_URL`` (the URL in force, without any password) and,
  when ``cluster.password_file`` is set, ``DISPATCH_DATABASE_PASSWORD_FILE`` (its absolute
  path). The password itself is never put in the environment or on a command line: a
  password written inside the URL is dropped, so such a setup needs ``password_file`` (or
  libpq's own ``~/.pgpass``) for its workers to report.

A kanban worker is known by ``DISPATCH_RUN_ID``, a cron worker by ``DISPATCH_FIRE_KEY`` (its
``dispatch kanban defer`` defers its fire's next try: :func:`defer_fire`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dispatcher.cluster.url import ENV_URL, without_password

if TYPE_CHECKING:
    from dispatcher.cron.records import FireRecord
    from dispatcher.settings import Settings

__all__ = [
    "ENV_FIRE_KEY",
    "ENV_HOST_ID",
    "ENV_PASSWORD_FILE",
    "captured",
    "captured_settings",
    "defer_fire",
    "spawn_environ",
]

ENV_HOST_ID = "DISPATCH_HOST_ID"
ENV_PASSWORD_FILE = "DISPATCH_DATABASE_PASSWORD_FILE"  # noqa: S105 (a variable name)
ENV_FIRE_KEY = "DISPATCH_FIRE_KEY"


def spawn_environ(settings: Settings, environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the report variables set from the settings in force (see the module
    docstring); what a worker launcher passes on to its workers."""
    layered = {k: v for k, v in environ.items() if k not in (ENV_URL, ENV_PASSWORD_FILE)}
    cluster = settings.cluster
    layered[ENV_HOST_ID] = cluster.effective_host_id()
    url = cluster.url(environ)
    if url is not None:
        layered[ENV_URL] = without_password(url)
        if cluster.password_file:
            layered[ENV_PASSWORD_FILE] = str(Path(cluster.password_file).expanduser().absolute())
    return layered


def captured(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` is a worker's captured one: a run id or a fire key, and a host id."""
    worker = environ.get("DISPATCH_RUN_ID") or environ.get(ENV_FIRE_KEY)
    return bool(worker and environ.get(ENV_HOST_ID))


def captured_settings(settings: Settings, environ: Mapping[str, str]) -> Settings | None:
    """``settings`` with the cluster section replaced by what the run was started with, or
    None when ``environ`` is not a worker's captured one (no run id or fire key, or no host
    id).

    The config's own ``cluster.database`` is ignored: a worker started on one host's SQLite
    reports there even if the operator has since turned cluster mode on, and the other way
    round."""
    if not captured(environ):
        return None
    host_id = environ[ENV_HOST_ID]
    # Imported here: a worker's report with a current config snapshot never gets this far.
    from dispatcher.cluster.settings import ClusterSettings

    cluster = ClusterSettings(
        database=None, password_file=environ.get(ENV_PASSWORD_FILE) or None, host_id=host_id
    )
    return dataclasses.replace(settings, cluster=cluster)


def defer_fire(
    settings: Settings,
    state_dir: Path,
    environ: Mapping[str, str],
    *,
    until: Callable[[float], float],
    reason: str,
) -> tuple[FireRecord, float]:
    """Inside a cron worker (``DISPATCH_FIRE_KEY``): defer the fire's next try to
    ``until(now)``, ``now`` on the clock cluster state is compared on (the database's in
    cluster mode). Finds the ledger from the captured environment (``settings`` only when it
    is not one). Returns the row and the time; refusals are one line, exit 2."""
    from dispatcher.app.clusterstate import open_cluster_state
    from dispatcher.cron.deferral import defer_fire as defer
    from registry.environment import MARKER_ENV

    chosen = captured_settings(settings, environ) or settings
    with open_cluster_state(chosen, state_dir, environ) as state:
        now = state.clock.time()
        when = until(now)
        row = defer(
            state.ledger,
            environ[ENV_FIRE_KEY],
            session_id=environ.get(MARKER_ENV),
            until=when,
            reason=reason,
            now=now,
        )
    return row, when
