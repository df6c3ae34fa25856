"""Does a resource class take effect here: the host's cgroup layout and the controllers a systemd
manager can use for the scopes it makes.

A manager records every property it is given (``systemctl show`` reports ``MemoryMax=`` either
way), but the kernel enforces one only where the manager may use its controller. Three layouts
exist, told apart the way systemd itself does at boot:

* ``v2`` (unified): cgroup2 holds every controller; a manager may use those listed in its own
  root's ``cgroup.controllers`` (for a user manager: what ``user@.service``'s ``Delegate=``
  handed down, often ``pids memory`` or ``pids memory cpu``, rarely ``io``).
* ``hybrid``: v1 controller hierarchies plus a cgroup2 mount that holds no controller (systemd
  tracks processes on it); ``v1`` (legacy): v1 hierarchies alone. A manager uses a v1 controller
  only where its root exists and is writable in that controller's hierarchy. ``MemoryHigh=`` and
  ``MemorySwapMax=`` have no v1 counterpart and never take effect there.
* ``none``: no cgroup filesystem is visible (a container without ``/sys/fs/cgroup``).

:func:`read_controllers` reads the facts (mountinfo, the cgroup files below the manager's root;
``proc`` and ``root`` let tests point it at sample files); :func:`ineffective` and
:func:`remedies` are pure. Errors: ``OSError`` and ``ValueError`` pass through, as in
:mod:`scope.cgroup`; the scoper translates them.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from scope.cgroup import parse_mountinfo
from scope.errors import ClassUnavailable
from scope.resources import LIMIT_KEYS, ScopeProperties
from scope.warnings import WarnOnce

__all__ = [
    "CONTROLLERS",
    "Controllers",
    "Ineffective",
    "Layout",
    "admit",
    "ineffective",
    "read_controllers",
    "remedies",
]


class Layout(enum.StrEnum):
    """How this host's cgroups are laid out (see the module docstring)."""

    V2 = "v2"
    HYBRID = "hybrid"
    V1 = "v1"
    NONE = "none"


CONTROLLERS = ("memory", "cpu", "io", "pids")
"""The controllers a resource class can need, by their cgroup v2 names (v1 ``blkio`` is
``io`` here)."""

NEEDS: Mapping[str, str | None] = {
    "memory_high": "memory",
    "memory_max": "memory",
    "memory_swap_max": "memory",
    "cpu_weight": "cpu",
    "cpu_quota": "cpu",
    "tasks_max": "pids",
    "io_weight": "io",
    "runtime_max": None,
}
"""The controller each class key needs (``runtime_max`` is the manager's own timer)."""

V2_ONLY = {"memory_high": "MemoryHigh=", "memory_swap_max": "MemorySwapMax="}
"""Keys whose limit exists only in cgroup v2's memory controller."""

_V1_NAMES = {"memory": "memory", "cpu": "cpu", "blkio": "io", "pids": "pids"}

DROP_IN = "/etc/systemd/system/user@.service.d/delegate.conf"
"""Where the delegation drop-in for every user manager goes."""


@dataclass(frozen=True, kw_only=True)
class Controllers:
    """What one manager can use for its scopes on this host."""

    layout: Layout
    manager_cgroup: str | None = None
    """The manager's root cgroup (its ``ControlGroup`` property), when known."""
    system: bool = False
    """The system manager (its controllers are the kernel's, nothing is delegated)."""
    usable: frozenset[str] = frozenset()
    """Controllers (v2 names) the manager can use for the scopes it makes."""
    missing: Mapping[str, str] = field(default_factory=dict)
    """Why each controller of :data:`CONTROLLERS` that is not usable is not."""
    v2_mount: str | None = None
    kernel: frozenset[str] = frozenset()
    """Controllers the kernel offers at all (mounted v1 hierarchies, the v2 root's list)."""

    def to_json(self) -> dict[str, object]:
        """The doctor's view: layout, the manager's cgroup, each controller usable or why not."""
        return {
            "layout": self.layout.value,
            "cgroup2_mount": self.v2_mount,
            "manager_cgroup": self.manager_cgroup,
            "controllers": {name: name in self.usable for name in CONTROLLERS},
            "missing": dict(self.missing),
        }


@dataclass(frozen=True, kw_only=True)
class Ineffective:
    """A class key that would not take effect, and why."""

    key: str
    reason: str
    controller: str | None = None
    """The controller it lacks; None when no controller could help (a v2-only limit on v1)."""


def read_controllers(
    manager_cgroup: str | None,
    *,
    system: bool,
    proc: str | Path = "/proc",
    root: str | Path = "",
) -> Controllers:
    """The layout and the controllers the manager rooted at ``manager_cgroup`` can use.

    ``system``: the system manager (root cgroup ``/``). ``manager_cgroup`` None means the root
    could not be asked; then nothing is usable beyond what the layout alone decides.
    ``root`` prefixes every mount point (tests point it at a tree of sample files)."""
    text = Path(proc, "self", "mountinfo").read_text(encoding="utf-8", errors="surrogateescape")
    entries = [e for e in parse_mountinfo(text) if e.fstype in ("cgroup", "cgroup2")]
    v2 = next((str(e.mount_point) for e in reversed(entries) if e.fstype == "cgroup2"), None)
    v1: dict[str, str] = {}
    tracking = False
    for entry in entries:
        if entry.fstype != "cgroup" or entry.root != "/":
            continue
        options = entry.super_options.split(",")
        tracking = tracking or "name=systemd" in options
        for name, ours in _V1_NAMES.items():
            if name in options:
                v1[ours] = str(entry.mount_point)
    cgroup = "/" if system else manager_cgroup
    if tracking or (v1 and v2 is None):
        layout = Layout.HYBRID if v2 is not None else Layout.V1
        return _v1(layout, v1, cgroup, system=system, root=str(root), v2=v2)
    if v2 is None:
        missing = {name: "no cgroup filesystem is mounted here" for name in CONTROLLERS}
        return Controllers(
            layout=Layout.NONE, manager_cgroup=cgroup, system=system, missing=missing
        )
    return _v2(v2, cgroup, system=system, root=str(root))


def _v2(mount: str, cgroup: str | None, *, system: bool, root: str) -> Controllers:
    kernel = _words(f"{root}{mount}/cgroup.controllers")
    usable: set[str] = set()
    missing: dict[str, str] = {}
    here = (
        None if cgroup is None else _words(f"{root}{mount}{cgroup.rstrip('/')}/cgroup.controllers")
    )
    for name in CONTROLLERS:
        if name not in kernel:
            missing[name] = f"the kernel offers no {name} controller in cgroup v2"
        elif here is None:
            missing[name] = "the manager's cgroup is unknown"
        elif name in here:
            usable.add(name)
        else:
            missing[name] = f"not delegated to the manager ({cgroup}/cgroup.controllers)"
    return Controllers(
        layout=Layout.V2,
        manager_cgroup=cgroup,
        system=system,
        usable=frozenset(usable),
        missing=missing,
        v2_mount=mount,
        kernel=frozenset(kernel),
    )


def _v1(
    layout: Layout,
    mounts: Mapping[str, str],
    cgroup: str | None,
    *,
    system: bool,
    root: str,
    v2: str | None,
) -> Controllers:
    usable: set[str] = set()
    missing: dict[str, str] = {}
    for name in CONTROLLERS:
        mount = mounts.get(name)
        if mount is None:
            missing[name] = f"no cgroup v1 {_v1_name(name)} hierarchy is mounted"
            continue
        if cgroup is None:
            missing[name] = "the manager's cgroup is unknown"
            continue
        where = f"{root}{mount}{cgroup.rstrip('/')}"
        # A manager creates its units' cgroups below its root; it can only where that root
        # exists and it may write (Delegate= chowns it to a user manager).
        if os.path.isdir(where) and os.access(where, os.W_OK):
            usable.add(name)
        else:
            state = "missing" if not os.path.isdir(where) else "not writable"
            missing[name] = f"not delegated to the manager ({mount}{cgroup} is {state})"
    return Controllers(
        layout=layout,
        manager_cgroup=cgroup,
        system=system,
        usable=frozenset(usable),
        missing=missing,
        v2_mount=v2,
        kernel=frozenset(mounts),
    )


def ineffective(props: ScopeProperties, controllers: Controllers) -> list[Ineffective]:
    """The set keys of ``props`` that would not take effect under ``controllers``, in key
    order (empty: the whole class applies)."""
    out: list[Ineffective] = []
    for key in LIMIT_KEYS:
        if getattr(props, key) is None:
            continue
        needed = NEEDS[key]
        if needed is None:
            continue
        if key in V2_ONLY and controllers.layout in (Layout.V1, Layout.HYBRID):
            layout = controllers.layout.value
            out.append(
                Ineffective(key=key, reason=f"cgroup v1 ({layout} here) has no {V2_ONLY[key]}")
            )
        elif needed not in controllers.usable:
            why = controllers.missing.get(needed, "not available")
            out.append(
                Ineffective(
                    key=key,
                    reason=f"no {needed} controller for our scopes: {why}",
                    controller=needed,
                )
            )
    return out


def remedies(found: list[Ineffective], controllers: Controllers, *, uid: int | None) -> list[str]:
    """What makes these keys take effect, most durable first (each remedy once)."""
    out: list[str] = []
    lacking = sorted({i.controller for i in found if i.controller is not None})
    v2_keys = sorted(i.key for i in found if i.controller is None)
    if v2_keys:
        out.append(
            "boot with the unified cgroup hierarchy (kernel command line "
            "systemd.unified_cgroup_hierarchy=1) for "
            + ", ".join(v2_keys)
            + f", or drop {'it' if len(v2_keys) == 1 else 'them'} from the class"
        )
    offered = [name for name in lacking if name in controllers.kernel]
    if offered and not controllers.system:
        names = " ".join(
            _delegate_name(n, controllers.layout) for n in ("pids", "memory", "cpu", "io")
        )
        restart = (
            f"'systemctl restart user@{uid}.service'" if uid is not None else "logging in again"
        )
        out.append(
            f"delegate the controllers to user managers: create {DROP_IN} containing "
            f"'[Service]' and 'Delegate={names}', run 'systemctl daemon-reload', then restart "
            f"the user manager ({restart}, which stops that user's services and workers)"
        )
    absent = [name for name in lacking if name not in controllers.kernel or controllers.system]
    if absent:
        word = "controller" if len(absent) == 1 else "controllers"
        out.append(
            f"enable the {', '.join(absent)} {word} in the kernel (see /proc/cgroups and "
            "cgroup_disable= on the kernel command line)"
        )
    return out


def needs_controllers(props: ScopeProperties) -> bool:
    """Whether any set key of ``props`` needs a controller (else nothing needs checking)."""
    return any(NEEDS[key] is not None for key in props.limits)


def admit(
    props: ScopeProperties,
    controllers: Controllers,
    *,
    caller: str,
    uid: int | None,
    warnings: WarnOnce,
) -> tuple[str, ...]:
    """Check a class before its scope is made. Returns the keys that will not take effect
    (empty: all of them will); raises :class:`ClassUnavailable` when some would not and
    ``best_effort`` is off. With ``best_effort`` the worker starts with the whole class (the
    manager applies what this host supports) and the cause is logged once per caller kind."""
    found = ineffective(props, controllers)
    if not found:
        return ()
    cause = ", ".join(f"{i.key} ({i.reason})" for i in found)
    fixes = remedies(found, controllers, uid=uid)
    if not props.best_effort:
        fixes.append("or set resources.best_effort: true to start it with what applies here")
        raise ClassUnavailable(cause, caller=caller, remedy="fix: " + "; ".join(fixes))
    keys = tuple(i.key for i in found)
    warnings.warn(
        caller,
        "class:" + ",".join(keys),
        f"{caller} workers start without {', '.join(keys)} (resources.best_effort: true): "
        f"{cause}; to apply them: {'; '.join(fixes)}",
    )
    return keys


def _delegate_name(name: str, layout: Layout) -> str:
    return _v1_name(name) if layout in (Layout.V1, Layout.HYBRID) else name


def _v1_name(name: str) -> str:
    return "blkio" if name == "io" else name


def _words(path: str) -> set[str]:
    try:
        return set(Path(path).read_text(encoding="ascii", errors="replace").split())
    except OSError:
        return set()
