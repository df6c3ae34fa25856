"""Placing a process in a new systemd scope: our D-Bus backend vs a ``systemd-run`` subprocess.

Each sample is one complete placement of ``true``: from asking for the scope to the program
having run inside it and exited. The baseline is what a shell script would do,
``systemd-run --user --scope --quiet --collect true``; the figure is
:class:`scope.systemd.SystemdScoper` with the D-Bus backend (persistent connection, held child,
StartTransientUnit, gate). Our own systemd-run backend is reported too, for scale. Runs are
interleaved so load drift hits all three alike. Target: D-Bus <= 0.6x the baseline.

Two context rows say where an idle machine's placement time goes: the same D-Bus placement
after a pause of :data:`PAUSE` seconds (the gateway's case: one card at a time), and, with a
private manager run as root, the kernel's own part: moving one process between two cgroups of
the manager's subtree, back to back and after the same pause. The kernel takes the cgroup
migration lock in write mode, which waits for an RCU grace period unless another migration
happened within the last one or two (``rcu_sync``; cgroup2's ``favordynmods`` mount option
avoids it): on an idle machine every placement pays that wait.

Needs a systemd user manager: the host's when reachable, else a private one booted with the test
suite's code (tests/support/systemd_boot.py); without either, the rows say why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time

from scope.abc import BackendKind, CallerKind, LaunchSpec, Placement, Policy
from scope.settings import ScopeSettings
from scope.systemd import SystemdScoper
from tests.benchmarks.common import Row, median, percentile, ratio
from tests.support.systemd import ManagerUnavailable, SystemdManager, acquire_manager

NAME = "scope_placement"
DESCRIPTION = "200 scope placements of true: D-Bus backend vs systemd-run --user --scope"

TARGET = 0.6
PAUSE = 0.05
"""Seconds of idle before each sample of the "after a pause" rows."""


def _unavailable(reason: str) -> list[Row]:
    return [
        Row(
            figure="dbus placement vs systemd-run --scope",
            value=None,
            unit="ms",
            target=f"<= {TARGET}x",
            note=f"no systemd user manager: {reason}",
        )
    ]


def _measure(manager: SystemdManager, count: int) -> dict[str, list[float]]:
    true = shutil.which("true", path=manager.env.get("PATH")) or "true"
    env = dict(manager.env)
    scopers = {
        kind: SystemdScoper(ScopeSettings(backend=kind), Policy(), environ=env)
        for kind in (BackendKind.DBUS, BackendKind.SYSTEMD_RUN)
    }
    cwd = tempfile.gettempdir()
    spec = LaunchSpec(argv=[true], env=env, cwd=cwd, unit_parts=("bench",))
    baseline = ["systemd-run", "--user", "--scope", "--quiet", "--collect", true]

    def ours(scoper: SystemdScoper) -> None:
        launched = scoper.launch(spec, CallerKind.CLI)
        if launched.placement is not Placement.SCOPED:
            raise RuntimeError(f"placement {launched.placement}: {scoper.probe().detail}")
        launched.process.wait(timeout=10)

    def plain() -> None:
        subprocess.run(
            baseline,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
            timeout=10,
        )

    steps = {
        "systemd-run": plain,
        "dbus": lambda: ours(scopers[BackendKind.DBUS]),
        "backend systemd-run": lambda: ours(scopers[BackendKind.SYSTEMD_RUN]),
    }
    samples: dict[str, list[float]] = {name: [] for name in steps}
    samples["dbus after a pause"] = []
    try:
        for step in steps.values():  # warm-up: probe, connection, flag detection
            step()
        for _ in range(count):
            for name, step in steps.items():
                started = time.perf_counter()
                step()
                samples[name].append(time.perf_counter() - started)
        for _ in range(max(10, count // 4)):
            time.sleep(PAUSE)
            started = time.perf_counter()
            steps["dbus"]()
            samples["dbus after a pause"].append(time.perf_counter() - started)
    finally:
        for scoper in scopers.values():
            scoper.close()
    return samples


def _migrations(manager: SystemdManager, count: int) -> dict[str, list[float]] | None:
    """Seconds to move one process between two cgroups of a private manager's subtree, back
    to back and after :data:`PAUSE` (None: not a private manager run as root)."""
    private = manager.private
    if os.geteuid() != 0 or private is None or private.cgroup is None:
        return None
    base = private.cgroup.v2_mount / private.cgroup.name
    places = [base / "bench-migrate-a", base / "bench-migrate-b"]
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        for place in places:
            place.mkdir(exist_ok=True)
        found: dict[str, list[float]] = {"back to back": [], "after a pause": []}
        for index in range(2 * count + 2):
            paused = index % 2 == 1
            if paused:
                time.sleep(PAUSE)
            started = time.perf_counter()
            (places[index % 2] / "cgroup.procs").write_text(str(sleeper.pid))
            took = time.perf_counter() - started
            if index >= 2:  # the first two warm up
                found["after a pause" if paused else "back to back"].append(took)
        return found
    except OSError:
        return None
    finally:
        sleeper.kill()
        sleeper.wait()
        for place in places:
            with contextlib.suppress(OSError):
                place.rmdir()


def run(quick: bool) -> list[Row]:
    """Median per-placement time of each method and the D-Bus/baseline ratio."""
    count = 20 if quick else 200
    try:
        manager = acquire_manager()
    except ManagerUnavailable as exc:
        return _unavailable(exc.reason)
    try:
        samples = _measure(manager, count)
        moves = _migrations(manager, max(10, count // 4))
    finally:
        manager.close()
    base = median(samples["systemd-run"]) * 1000

    def row(figure: str, name: str, target: str | None = None) -> Row:
        value = median(samples[name]) * 1000
        share = ratio(value, base)
        return Row(
            figure=figure,
            value=value,
            unit="ms",
            baseline=base,
            ratio=share,
            target=target,
            met=None if target is None or share is None else share <= TARGET,
            note=f"n={len(samples[name])}, p90={percentile(samples[name], 90) * 1000:.1f} ms, "
            f"{manager.kind} manager {manager.version}",
        )

    rows = [
        row("systemd-run --user --scope true (baseline)", "systemd-run"),
        row("D-Bus backend placement of true", "dbus", f"<= {TARGET}x"),
        row("our systemd-run backend placement of true", "backend systemd-run"),
        row(
            f"D-Bus backend placement of true after {PAUSE * 1000:g} ms idle", "dbus after a pause"
        ),
    ]
    if moves is not None:
        for how, values in moves.items():
            rows.append(
                Row(
                    figure=f"kernel: moving a process between two cgroups, {how}"
                    + (f" ({PAUSE * 1000:g} ms)" if how == "after a pause" else ""),
                    value=median(values) * 1000,
                    unit="ms",
                    note=f"n={len(values)}, p90={percentile(values, 90) * 1000:.2f} ms; "
                    "a write to cgroup.procs, as the manager does for a scope's PIDs",
                )
            )
    return rows
