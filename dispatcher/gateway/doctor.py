"""The report behind ``dispatch doctor``: the scope layer's diagnosis plus the installed units'
checks, their remedies merged into one list (the web's status page shows the same)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dispatcher.gateway.units import units_report
from scope.doctor import diagnose, healthy
from scope.systemd import SystemdScoper


def doctor_report(
    scoper: SystemdScoper,
    environ: Mapping[str, str],
    *,
    degrade_without_scope: bool,
    extra_units: Sequence[Path] = (),
    force_probe: bool = True,
) -> tuple[dict[str, Any], bool]:
    """The report (see :mod:`scope.doctor`, plus ``units``) and whether scoped placement
    works. ``force_probe=False`` reuses a probe verdict still within its TTL."""
    report = diagnose(scoper, force_probe=force_probe)
    ok = healthy(report)
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
