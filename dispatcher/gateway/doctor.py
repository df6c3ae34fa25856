"""The report behind ``dispatch doctor``: the scope layer's diagnosis plus the installed units'
checks, their remedies merged into one list (the web's status page shows the same)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dispatcher.gateway.units import units_report
from dispatcher.launch.pressure import proc_root, read_readings
from scope.doctor import diagnose, healthy
from scope.hierarchy import ineffective, remedies
from scope.resources import ScopeProperties, describe
from scope.systemd import SystemdScoper


def doctor_report(
    scoper: SystemdScoper,
    environ: Mapping[str, str],
    *,
    degrade_without_scope: bool,
    extra_units: Sequence[Path] = (),
    force_probe: bool = True,
    classes: Mapping[str, ScopeProperties] | None = None,
) -> tuple[dict[str, Any], bool]:
    """The report (see :mod:`scope.doctor`, plus ``units`` and ``resources.classes``) and
    whether scoped placement works with every configured class. ``force_probe=False`` reuses a
    probe verdict still within its TTL; ``classes`` are the configured worker classes
    (:meth:`dispatcher.settings.Settings.classes`)."""
    report = diagnose(scoper, force_probe=force_probe)
    refused = _check_classes(scoper, report, classes or {})
    report["admission"] = _admission(environ)
    ok = healthy(report) and not refused
    report["units"] = units_report(
        environ, degrade_without_scope=degrade_without_scope, extra=list(extra_units)
    )
    # Without systemd as PID 1 the units' remedies (linger, KillMode) cannot apply.
    booted = report["system"]["booted_with_systemd"]
    for unit in report["units"] if booted else ():
        for remedy in unit["remedies"]:
            if remedy not in report["remedies"]:
                report["remedies"].append(remedy)
    return report, ok


def _check_classes(
    scoper: SystemdScoper, report: dict[str, Any], classes: Mapping[str, ScopeProperties]
) -> bool:
    """Add ``resources.classes`` (each configured class: what would not take effect, and
    whether its workers are refused) with their problems and remedies; True when a class's
    workers would be refused."""
    controllers = scoper.controllers()
    entries: list[dict[str, Any]] = []
    refused = False
    if not report["probe"]["ok"]:
        # No scope is made at all (workers run in_process or degraded): no class applies, and
        # the placement lines above already say why.
        classes = {}
    for name, props in classes.items():
        found = ineffective(props, controllers)
        entry = {
            "name": name,
            "class": describe(props),
            "best_effort": bool(props.best_effort),
            "ineffective": {item.key: item.reason for item in found},
            "refused": bool(found) and not props.best_effort,
        }
        entries.append(entry)
        if not found:
            continue
        keys = ", ".join(item.key for item in found)
        if entry["refused"]:
            refused = True
            report["problems"].append(
                f"{name}: {keys} cannot take effect here, so its workers are refused "
                "(spawn_refused)"
            )
        else:
            report["problems"].append(
                f"{name}: {keys} cannot take effect here; its workers start without (best_effort)"
            )
        for remedy in remedies(found, controllers, uid=scoper.uid):
            if remedy not in report["remedies"]:
                report["remedies"].append(remedy)
    report["resources"]["classes"] = entries
    return refused


def _admission(environ: Mapping[str, str]) -> dict[str, Any]:
    """Whether admission can see memory pressure here (PSI) or goes by MemAvailable alone."""
    where = proc_root(environ)
    readings = read_readings(where)
    if readings.psi:
        detail = f"PSI available ({where}/pressure/memory): admission watches memory pressure"
    else:
        detail = (
            f"no PSI here ({where}/pressure/memory cannot be read: a kernel without "
            "CONFIG_PSI, psi=0 on its command line, or a container hiding it): admission "
            "holds new work by MemAvailable alone"
        )
    return {"psi": readings.psi, "readings": asdict(readings), "detail": detail}
