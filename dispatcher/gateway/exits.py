"""``dispatch serve``'s exit statuses, and which failures ask its supervisor for a restart.

A supervisor (systemd's ``Restart=on-failure``) restarts on any non-zero status unless the unit
lists it in ``RestartPreventExitStatus=``; the shipped units list 1 and 2. So 75 is kept for the
failures that a restart can cure: a cluster database that is down at start, a full disk, an
internal error, a module missing only after the gateway ran (its files were upgraded under it).
Everything permanent until someone acts (a bad config, a missing module at start, an unusable
state dir, a duplicate live host id, another serve on the state dir) is one line on stderr and
its class's exit code, 1 or 2, so the unit stops instead of restarting forever.
"""

from __future__ import annotations

import logging

from scope.foundation.errors import DispatchError

log = logging.getLogger("dispatch.gateway")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_RESTART = 75
"""Asks the supervisor for a restart."""


def start_failure(err: DispatchError) -> int:
    """The exit status for an error that ended serve: 75 when ``err.restart_helps`` (logged
    in one line); anything else is raised again, to become its one line and exit code."""
    if not err.restart_helps:
        raise err
    log.error("%s; asking the supervisor for a restart (exit 75)", err)
    return EXIT_RESTART
