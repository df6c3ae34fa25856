"""The health report behind ``dispatch doctor``: bus, manager, probe, placement per caller, fixes.

Built here rather than in the CLI so the gateway (``dispatch status``) can reuse it. The JSON
shape is fixed by the issue; other areas may add keys (the gateway adds ``units``)::

    {"bus": {"path", "ok", "detail"},
     "manager": {"reachable", "kind", "version"},
     "probe": {"ok", "backend", "elapsed_ms", "detail"},
     "placement": {"gateway_cron", "gateway_kanban", "oneshot", "cli"},   # value or "refused"
     "remedies": [str, ...]}
"""

from __future__ import annotations

import dataclasses
from typing import Any

from scope.abc import CallerKind, Placement
from scope.errors import ScopeUnavailable
from scope.facts import login_name
from scope.placement import decide
from scope.systemd import SystemdScoper

__all__ = ["REFUSED", "diagnose", "healthy"]

REFUSED = "refused"

# The gateway and a Type=oneshot tick run inside a service by definition; `dispatch run` is
# judged where doctor itself runs (a shell, or a unit when doctor is run from one).
_CALLERS = (
    ("gateway_cron", CallerKind.CRON, True),
    ("gateway_kanban", CallerKind.KANBAN, True),
    ("oneshot", CallerKind.ONESHOT, True),
    ("cli", CallerKind.CLI, None),
)


def diagnose(scoper: SystemdScoper, *, force_probe: bool = True) -> dict[str, Any]:
    """Collect the report (see the module docstring). Probes afresh unless told otherwise."""
    info = scoper.discover()
    verdict = scoper.probe(force=force_probe)
    manager = scoper.manager_status()
    facts = scoper.facts(probe=False)
    facts = dataclasses.replace(facts, probe_ok=verdict.ok, probe_detail=verdict.detail)

    placement: dict[str, str] = {}
    remedies: list[str] = []
    for key, caller, in_unit in _CALLERS:
        these = facts if in_unit is None else dataclasses.replace(facts, in_teardown_unit=in_unit)
        if in_unit and not these.caller_unit:
            these = dataclasses.replace(these, caller_unit="the gateway's or oneshot unit")
        try:
            decision = decide(these, caller, scoper.policy, wants_isolation=True)
        except ScopeUnavailable as err:
            placement[key] = REFUSED
            _add(remedies, err.remedy)
            continue
        placement[key] = decision.placement.value
        _add(remedies, decision.remedy)

    user = login_name(scoper.uid)
    if not verdict.ok:
        if info.detail:
            remedies.insert(0, f"bus: {info.detail}")
        if not manager.reachable:
            remedies.insert(
                0,
                f"no systemd manager is reachable: run 'loginctl enable-linger {user}' (a user "
                "manager that runs without a login session), then re-run 'dispatch doctor'",
            )
    return {
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
        "remedies": remedies,
    }


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
