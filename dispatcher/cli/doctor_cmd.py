"""`dispatch doctor`: check the systemd bus, manager and probe; explain placement and remedies.

Exit 0 when scoped placement works, 1 otherwise; with ``--json`` the report (see
:mod:`scope.doctor`) is printed either way.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dispatcher.app.runtime import policy_of
from dispatcher.cli.context import Context
from dispatcher.cli.parser import Parser, Subparsers, add_group, path_arg
from dispatcher.gateway.clusterview import cluster_check, cluster_lines
from dispatcher.gateway.doctor import doctor_report
from scope import open_scoper
from scope.systemd import SystemdScoper

EXIT_OK = 0
EXIT_UNHEALTHY = 1


def register(subparsers: Subparsers, common: Parser) -> None:
    """Add the `doctor` command."""
    parser = add_group(subparsers, "doctor", common)
    parser.add_argument(
        "--unit",
        action="append",
        type=path_arg,
        default=[],
        metavar="FILE",
        help="also check this unit file (installed dispatch*.service files are always checked)",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, ctx: Context) -> int:
    """Probe afresh and report; see the module docstring for the exit status."""
    settings = ctx.settings
    scoper = open_scoper(settings.scope, policy_of(settings), environ=ctx.environ)
    ctx.on_close(scoper)
    assert isinstance(scoper, SystemdScoper)
    report, ok = doctor_report(
        scoper,
        ctx.environ,
        degrade_without_scope=settings.kanban.degrade_without_scope,
        extra_units=[Path(p) for p in args.unit],
        classes=settings.classes(),
    )
    report["cluster"] = cluster_check(settings, ctx.state_dir, ctx.environ)
    ok = ok and (report["cluster"] is None or bool(report["cluster"]["ok"]))
    if ctx.json:
        ctx.emit_json(report)
    else:
        _print(ctx, report, ok)
    return EXIT_OK if ok else EXIT_UNHEALTHY


_LAYOUTS = {
    "v2": "cgroup v2 (unified)",
    "hybrid": "hybrid (controllers on cgroup v1, cgroup2 holds none)",
    "v1": "cgroup v1 (legacy)",
    "none": "no cgroup filesystem",
}


def _print_resources(ctx: Context, resources: dict[str, Any]) -> None:
    """The cgroup layout, the controllers our scopes get, which class keys take effect."""
    where = resources["manager_cgroup"] or "unknown"
    ctx.out(f"cgroups:   {_LAYOUTS.get(resources['layout'], resources['layout'])}")
    if resources["manager_cgroup"] is None and resources["layout"] != "none":
        ctx.out("           manager cgroup unknown (no manager answered): class keys not checked")
        return
    ctx.out(f"           manager cgroup {where}")
    usable = resources["controllers"]
    ctx.out(
        "           controllers for our scopes: "
        + ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in usable.items())
    )
    keys = resources["keys"]
    effective = [key for key, why in keys.items() if why is None]
    ctx.out(f"resources: take effect: {', '.join(effective) or 'none'}")
    for key, why in keys.items():
        if why is not None:
            ctx.out(f"           no effect:   {key} ({why})")
    for remedy in resources["remedies"]:
        ctx.out(f"           to apply:    {remedy}")
    for entry in resources.get("classes", []):
        if not entry["ineffective"]:
            state, tail = "ok", ""
        elif entry["refused"]:
            state, tail = "FAIL", "; its workers are refused"
        else:
            state, tail = "CHECK", "; its workers start without them (best_effort)"
        missing = ", ".join(entry["ineffective"])
        detail = f" ({missing} would not take effect{tail})" if missing else ""
        ctx.out(f"class:     {state}  {entry['name']}: {entry['class']}{detail}")


def _print(ctx: Context, report: dict[str, Any], ok: bool) -> None:
    bus, manager, probe = report["bus"], report["manager"], report["probe"]
    mark = {True: "ok", False: "FAIL"}
    system = report["system"]
    if not system["booted_with_systemd"]:
        ctx.out("system:    FAIL  not booted with systemd")
        ctx.out(f"           {system['detail']}")
    ctx.out(f"bus:       {mark[bool(bus['ok'])]}  {bus['path'] or '-'}")
    if bus["detail"]:
        ctx.out(f"           {bus['detail']}")
    version = manager["version"] or "unknown version"
    state = "reachable" if manager["reachable"] else "unreachable"
    ctx.out(
        f"manager:   {mark[bool(manager['reachable'])]}  {manager['kind']} manager {state}, "
        f"systemd {version}"
    )
    via = f"via {probe['backend']}" if probe["backend"] else "no backend worked"
    ctx.out(f"probe:     {mark[bool(probe['ok'])]}  {via}, {probe['elapsed_ms']:.1f} ms")
    if probe["detail"]:
        ctx.out(f"           {probe['detail']}")
    ctx.out("placement:")
    for key, value in report["placement"].items():
        ctx.out(f"  {key:<15} {value}")
    _print_resources(ctx, report["resources"])
    latency = report["resources"].get("placement_latency")
    if latency:
        ctx.out(f"latency:   {latency['detail']}")
        if latency["remedy"]:
            ctx.out(f"           {latency['remedy']}")
    ctx.out(f"admission: {report['admission']['detail']}")
    for unit in report.get("units", []):
        state = "ok" if unit["ok"] else "CHECK"
        ctx.out(f"unit:      {state}  {unit['path']} ({unit['manager']}, {unit['role']})")
        for name, check in unit["checks"].items():
            if not check["ok"]:
                ctx.out(f"           {name}: {check['detail']}")
    if report["problems"]:
        ctx.out("problems:")
        for problem in report["problems"]:
            ctx.out(f"  - {problem}")
    if report["remedies"]:
        ctx.out("remedies:")
        for remedy in report["remedies"]:
            ctx.out(f"  - {remedy}")
    cluster = report.get("cluster")
    for line in cluster_lines(cluster):
        ctx.out(line)
    if cluster is not None and not cluster["ok"]:
        ctx.out("unhealthy: this host cannot take its part in the cluster (see above)")
        return
    refused = [c["name"] for c in report["resources"].get("classes", []) if c["refused"]]
    if ok:
        ctx.out("healthy: scoped placement works")
    elif refused and report["probe"]["ok"]:
        ctx.out(f"unhealthy: workers of {', '.join(refused)} are refused (see above)")
    elif not system["booted_with_systemd"]:
        ctx.out("unhealthy: no restart-safe scopes without systemd; workers run in_process")
    else:
        ctx.out("unhealthy: no restart-safe scopes")
