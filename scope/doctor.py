"""The health report behind ``dispatch doctor``: bus, manager, probe, placement per caller, fixes.

Built here rather than in the CLI so the gateway (``dispatch status``) can reuse it. The JSON
shape is fixed by the issue; other areas may add keys (the gateway adds ``units``)::

    {"system": {"booted_with_systemd", "detail"},
     "bus": {"path", "ok", "detail"},
     "manager": {"reachable", "kind", "version"},
     "probe": {"ok", "backend", "elapsed_ms", "detail"},
     "placement": {"gateway_cron", "gateway_kanban", "oneshot", "cli"},   # value or "refused"
     "resources": {"layout", "cgroup2_mount", "manager_cgroup", "controllers", "missing",
                   "keys": {key: null (takes effect) or why not}, "remedies",
                   "placement_latency": {"favordynmods", "mounts", "detail", "remedy"}},
     "problems": [str, ...],     # symptoms: what is wrong (not what to do)
     "remedies": [str, ...]}     # what to do, most durable first, each once
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from scope.abc import CallerKind, Placement
from scope.errors import ScopeUnavailable
from scope.hierarchy import ineffective, remedies
from scope.latency import read_placement_latency
from scope.placement import decide
from scope.resources import LIMIT_KEYS, ScopeProperties
from scope.systemd import SystemdScoper

__all__ = ["REFUSED", "booted_with_systemd", "diagnose", "healthy", "resources_report"]

REFUSED = "refused"

# The gateway and a Type=oneshot tick run inside a service by definition; `dispatch run` is
# judged where doctor itself runs (a shell, or a unit when doctor is run from one).
_CALLERS = (
    ("gateway_cron", CallerKind.CRON, True),
    ("gateway_kanban", CallerKind.KANBAN, True),
    ("oneshot", CallerKind.ONESHOT, True),
    ("cli", CallerKind.CLI, None),
)


SYSTEMD_MARKER = "/run/systemd/system"
"""Exists exactly when the machine was booted with systemd as PID 1 (sd_booted(3))."""


def booted_with_systemd(marker: str = SYSTEMD_MARKER) -> bool:
    """Whether systemd is the init system here (sd_booted's test)."""
    return os.path.isdir(marker)


def diagnose(
    scoper: SystemdScoper, *, force_probe: bool = True, marker: str = SYSTEMD_MARKER
) -> dict[str, Any]:
    """Collect the report (see the module docstring). Probes afresh unless told otherwise."""
    info = scoper.discover()
    verdict = scoper.probe(force=force_probe)
    manager = scoper.manager_status()
    # A manager that answers wins over the marker (a test's private manager lives in a mount
    # namespace of its own): only "no marker and nobody answers" means "no systemd here".
    booted = booted_with_systemd(marker) or verdict.ok or manager.reachable
    facts = scoper.facts(probe=False)
    facts = dataclasses.replace(facts, probe_ok=verdict.ok, probe_detail=verdict.detail)

    placement: dict[str, str] = {}
    remedies: list[str] = []
    for key, caller, in_unit in _CALLERS:
        # Without systemd there are no units that could kill their children: judge every
        # caller as it really runs (a shell, a container entry point, a supervisor).
        judged = (False if not booted else in_unit) if in_unit is not None else None
        these = facts if judged is None else dataclasses.replace(facts, in_teardown_unit=judged)
        if judged and not these.caller_unit:
            these = dataclasses.replace(these, caller_unit="the gateway's or oneshot unit")
        try:
            decision = decide(these, caller, scoper.policy, wants_isolation=True)
        except ScopeUnavailable as err:
            placement[key] = REFUSED
            _add(remedies, err.remedy)
            continue
        placement[key] = decision.placement.value
        _add(remedies, decision.remedy)

    problems: list[str] = []
    if not verdict.ok:
        if info.detail:
            problems.append(f"bus: {info.detail}")
        if not manager.reachable:
            problems.append(f"no systemd {manager.kind} manager is reachable")
    if not booted:
        remedies = list(_UNBOOTED_REMEDIES)
    system = {
        "booted_with_systemd": booted,
        "detail": None if booted else _UNBOOTED,
    }
    return {
        "system": system,
        "bus": {"path": info.bus_path, "ok": info.bus_ok, "detail": info.detail},
        "manager": {
            "reachable": manager.reachable,
            "kind": manager.kind,
            "version": manager.version,
        },
        "probe": {
            "ok": verdict.ok,
            "backend": verdict.backend,
            "elapsed_ms": verdict.elapsed_ms,
            "detail": verdict.detail,
        },
        "placement": placement,
        "resources": resources_report(scoper),
        "problems": problems,
        "remedies": remedies,
    }


_UNBOOTED = (
    f"this machine was not booted with systemd ({SYSTEMD_MARKER} is missing: a container, "
    "WSL or a minimal VM), so no systemd manager can hold scopes and no unit can kill "
    "workers either: every worker runs in_process, in its own session under its keeper; it "
    "outlives the gateway, a oneshot tick and the shell that started it, but not a reboot or "
    "the container's stop"
)
_UNBOOTED_REMEDIES = (
    "nothing to fix for in_process workers: start 'dispatch serve' from a shell, tmux or the "
    "container's entry point",
    "for restart-safe scopes, run dispatch on a host booted with systemd (then "
    "'dispatch doctor' there names what is missing)",
    "under a service manager that kills its children on stop (not systemd), set "
    "kanban.degrade_without_scope: true or keep the gateway outside it",
)


# Every key set: which of them the manager's scopes would enforce on this host.
_EVERY_KEY = ScopeProperties(
    memory_high=1,
    memory_max=1,
    memory_swap_max=0,
    cpu_weight=1,
    cpu_quota=1.0,
    tasks_max=1,
    io_weight=1,
    runtime_max=1.0,
)


def resources_report(scoper: SystemdScoper) -> dict[str, Any]:
    """Which class keys take effect for this host's scopes, and what makes the rest work."""
    controllers = scoper.controllers(force=True)
    found = ineffective(_EVERY_KEY, controllers)
    why = {item.key: item.reason for item in found}
    report = controllers.to_json()
    report["keys"] = {key: why.get(key) for key in LIMIT_KEYS}
    report["remedies"] = remedies(found, controllers, uid=scoper.uid)
    # Not a health problem (placement works either way), so not in "remedies": doctor prints
    # it on its own line.
    report["placement_latency"] = read_placement_latency().to_json()
    return report


def healthy(report: dict[str, Any]) -> bool:
    """Scoped placement works: the probe placed its no-op in a scope."""
    return (
        bool(report["probe"]["ok"])
        and report["placement"].get("gateway_kanban") == Placement.SCOPED.value
    )


def _add(remedies: list[str], remedy: str | None) -> None:
    """Split a "fix: a; b; c" remedy into its items, without duplicates."""
    if not remedy:
        return
    text = remedy.removeprefix("fix: ")
    for item in (part.strip().removeprefix("or ") for part in text.split("; ")):
        if item and item not in remedies:
            remedies.append(item)
