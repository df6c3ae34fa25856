"""The thin impure layer under the placement table: is the caller inside a teardown unit?

A caller sits in a unit whose stop kills its children when its own cgroup (the v2 line of
``/proc/self/cgroup``) belongs to a ``*.service`` unit, or when ``INVOCATION_ID`` is set (systemd
sets it for every process it starts as a unit, and it survives where the cgroup is not visible,
e.g. in a container). ``init.scope`` and the root cgroup ``/`` do not count: nothing stops them.
A delegated sub-cgroup (``/x.service/worker``) counts as ``x.service``: stopping the service
kills it too.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass

from scope.cgroup import enclosing_unit, own_cgroup

__all__ = ["CallerUnit", "caller_unit", "login_name"]

INVOCATION_ENV = "INVOCATION_ID"


@dataclass(frozen=True, kw_only=True)
class CallerUnit:
    """Where the caller runs."""

    in_teardown_unit: bool
    unit: str | None
    """The unit name when known (``gw.service``), for messages."""
    cgroup: str | None
    """The caller's cgroup v2 path, None when it could not be read."""


def caller_unit(
    environ: Mapping[str, str], *, pid: int | str = "self", proc_root: str = "/proc"
) -> CallerUnit:
    """Classify the caller (see the module docstring); never raises for missing /proc facts."""
    try:
        cgroup: str | None = own_cgroup(pid, proc_root=proc_root)
    except (OSError, LookupError, ValueError):
        cgroup = None
    unit = enclosing_unit(cgroup) if cgroup else None
    in_service = unit is not None and unit.endswith(".service")
    invoked = bool(environ.get(INVOCATION_ENV))
    return CallerUnit(
        in_teardown_unit=in_service or invoked,
        unit=unit if (in_service or invoked) and unit != "init.scope" else None,
        cgroup=cgroup,
    )


def login_name(uid: int | None = None) -> str:
    """The user name for ``loginctl enable-linger`` (the uid as text when it has no name)."""
    uid = os.geteuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
