"""What a failed spawn means: the one classifier shared by cron and kanban.

:func:`classify_spawn_error` decides, for any exception raised while preparing or spawning a
worker, which outcome it is and whether it counts. The rules, decided once for every caller:

============================================  ===================  ==============  =========
what happened                                 outcome              infrastructure  retried
============================================  ===================  ==============  =========
no scope could be made (policy refuses)       ``spawn_refused``    yes             no
the systemd manager vanished mid-launch       ``spawn_refused``    yes             once
the host ran out of fds/processes/memory      ``spawn_refused``    yes             no
the state dir is (nearly) full                ``spawn_refused``    yes             no
the registry refuses the command              ``config_error``     no              no
the worker definition is unusable             ``config_error``     no              no
(missing cwd, bad env_file)
any other error of ours or of the OS          ``failed_start``     no              no
a bug (an exception that is none of these)    ``failed_start``     no              no
============================================  ===================  ==============  =========

Infrastructure is never the worker's fault: never counted against a card's failure limit,
never a failed cron job for the breaker's purposes; a card waits behind a cooldown instead. A
lost manager has already flipped the scope layer's cached verdict, so the one retry goes
through the new placement (degraded, or refused by policy). A command the registry refuses
(one that would kill the gateway) or a worker whose cwd or env_file is unusable will fail the
same way every time: a configuration error, which trips a card's breaker at once.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any

from dispatcher.errors import DispatcherError
from dispatcher.launch.outcome import Outcome, Result
from registry.errors import SpawnRefused
from registry.store.database import StateFull
from scope.errors import ManagerLost, ScopeUnavailable
from scope.foundation.errors import DispatchError

__all__ = [
    "HOST_LIMITS",
    "SpawnFailure",
    "WorkerSetupError",
    "classify_spawn_error",
    "host_out_of_space",
]

HOST_LIMITS = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM, errno.ENOSPC})
"""errno values of a spawn that failed for lack of host resources (infrastructure)."""


class WorkerSetupError(DispatcherError):
    """A worker's definition cannot be used as configured (a cwd that is not a directory, an
    unreadable, unsafe or malformed env_file): retrying cannot help, so it is a
    ``config_error``."""

    def __init__(
        self,
        problem: str,
        *,
        path: str | None = None,
        line: int | None = None,
        remedy: str | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(remedy=remedy, problem=problem, path=path, line=line, **fields)

    def describe(self) -> str:
        where = self.fields.get("path")
        if where and self.fields.get("line"):
            where = f"{where}:{self.fields['line']}"
        return f"{where}: {self.fields['problem']}" if where else self.fields["problem"]


@dataclass(frozen=True, kw_only=True)
class SpawnFailure:
    """The classification of one failed spawn (see the module docstring)."""

    outcome: Outcome
    error: str
    infrastructure: bool = False
    retry: bool = False
    """Worth one more attempt in the same slot (the manager was lost)."""
    unexpected: bool = False
    """A bug below us: the caller logs the traceback."""

    def result(self) -> Result:
        """The failure as the result a run or a fire is closed with."""
        return Result(outcome=self.outcome, error=self.error, infrastructure=self.infrastructure)


def classify_spawn_error(err: BaseException) -> SpawnFailure:
    """Classify an exception from preparing or spawning a worker (see the module docstring).

    Never raises; KeyboardInterrupt and SystemExit are not for this function (callers let
    them through)."""
    if isinstance(err, ManagerLost):
        return _infrastructure(err.message, retry=True)
    if isinstance(err, ScopeUnavailable | StateFull):
        return _infrastructure(err.message)
    if isinstance(err, SpawnRefused | WorkerSetupError):
        return SpawnFailure(outcome=Outcome.CONFIG_ERROR, error=err.message)
    if isinstance(err, DispatchError):
        return SpawnFailure(outcome=Outcome.FAILED_START, error=err.message)
    if isinstance(err, OSError):
        if err.errno in HOST_LIMITS:
            return _infrastructure(f"the host ran out of resources: {err.strerror or err}")
        return SpawnFailure(outcome=Outcome.FAILED_START, error=str(err))
    return SpawnFailure(
        outcome=Outcome.FAILED_START, error=f"{type(err).__name__}: {err}", unexpected=True
    )


def host_out_of_space(problem: str) -> SpawnFailure:
    """The failure of a launch skipped because the state dir is nearly full."""
    return _infrastructure(problem)


def _infrastructure(error: str, *, retry: bool = False) -> SpawnFailure:
    return SpawnFailure(
        outcome=Outcome.SPAWN_REFUSED, error=error, infrastructure=True, retry=retry
    )
