"""What a worker reports through: the state captured when its run was started.

A worker's ``dispatch kanban complete|block|review`` must land even while the operator's
config is half edited, broken or changed (issue 19, section 3). So at spawn the launcher
writes into the worker's environment everything those commands need to find the board, and
the commands read only that:

- ``DISPATCH_STATE_DIR``: the state dir (always, see :mod:`dispatcher.launch.setup`);
- ``DISPATCH_HOST_ID``: this host's id (always; it also marks an environment as captured);
- in cluster mode ``DISPATCH_DATABASE_URL`` (the URL in force, without any password) and,
  when ``cluster.password_file`` is set, ``DISPATCH_DATABASE_PASSWORD_FILE`` (its absolute
  path). The password itself is never put in the environment or on a command line: a
  password written inside the URL is dropped, so such a setup needs ``password_file`` (or
  libpq's own ``~/.pgpass``) for its workers to report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dispatcher.cluster.url import ENV_URL, without_password

if TYPE_CHECKING:
    from dispatcher.settings import Settings

__all__ = ["ENV_HOST_ID", "ENV_PASSWORD_FILE", "captured_settings", "spawn_environ"]

ENV_HOST_ID = "DISPATCH_HOST_ID"
ENV_PASSWORD_FILE = "DISPATCH_DATABASE_PASSWORD_FILE"  # noqa: S105 (a variable name)


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


def captured_settings(settings: Settings, environ: Mapping[str, str]) -> Settings | None:
    """``settings`` with the cluster section replaced by what the run was started with, or
    None when ``environ`` is not a worker's captured one (no run id or no host id).

    The config's own ``cluster.database`` is ignored: a worker started on one host's SQLite
    reports there even if the operator has since turned cluster mode on, and the other way
    round."""
    host_id = environ.get(ENV_HOST_ID)
    if not environ.get("DISPATCH_RUN_ID") or not host_id:
        return None
    # Imported here: a worker's report with a current config snapshot never gets this far.
    from dispatcher.cluster.settings import ClusterSettings

    cluster = ClusterSettings(
        database=None, password_file=environ.get(ENV_PASSWORD_FILE) or None, host_id=host_id
    )
    return dataclasses.replace(settings, cluster=cluster)
