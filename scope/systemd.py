"""The real scoper: facts, probe and placement over the D-Bus and systemd-run backends.

:class:`SystemdScoper` is what :func:`scope.open_scoper` returns. Per call it re-derives the bus
(:mod:`scope.bus`) and the caller's unit (:mod:`scope.facts`), consults the cached probe
(:mod:`scope.probe`), applies the placement table (:mod:`scope.placement`) and starts the process
accordingly. Backends are tried in order (``auto``: D-Bus, then systemd-run); when a scoped
launch fails on all of them it checks whether the manager itself vanished and, if so, flips the
probe verdict and raises :class:`~scope.errors.ManagerLost`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from scope.abc import (
    BackendKind,
    CallerKind,
    Decision,
    Facts,
    Launched,
    LaunchSpec,
    ManagerKind,
    Placement,
    Policy,
    ProbeVerdict,
    Scoper,
    StopResult,
)
from scope.backend import UnitBackend
from scope.bus import BusInfo, discover, manager_env, socket_reachable
from scope.cgroup import cgroup_procs
from scope.errors import BusError, ManagerLost, ScopeError
from scope.facts import caller_unit, login_name
from scope.foundation.clock import Clock, SystemClock
from scope.hierarchy import (
    CONTROLLERS,
    Controllers,
    Layout,
    admit,
    needs_controllers,
    read_controllers,
)
from scope.placement import decide
from scope.probe import Probe
from scope.resources import ScopeProperties
from scope.settings import ScopeSettings
from scope.spawn import abandon, popen, start_released
from scope.translate import ScopeStartFailed, ScopeTimeout
from scope.unitname import scope_name
from scope.warnings import WarnOnce

__all__ = ["ManagerStatus", "SystemdScoper"]

_log = logging.getLogger("dispatch.scope")

PROBE_ARGV = ("/bin/sh", "-c", ":")
"""The probe's no-op (NixOS has no /bin/true, every system has /bin/sh)."""

_KILL_CONFIRM = 1.0
"""How long to wait for SIGKILLed processes to leave the cgroup."""


@dataclass(frozen=True, kw_only=True)
class ManagerStatus:
    """What ``dispatch doctor`` reports about the manager."""

    reachable: bool
    kind: str
    version: str | None
    detail: str = ""


class SystemdScoper(Scoper):
    """Restart-safe placement with real systemd scopes (see the module docstring).

    ``environ`` is where the bus is discovered from and what the facts are read from; it is
    never mutated. ``uid``, ``user_runtime_root`` and ``proc_root`` exist for tests.
    """

    def __init__(
        self,
        settings: ScopeSettings,
        policy: Policy,
        *,
        environ: Mapping[str, str],
        clock: Clock | None = None,
        uid: int | None = None,
        user_runtime_root: str = "/run/user",
        proc_root: str = "/proc",
    ) -> None:
        self.settings = settings
        self.policy = policy
        self._environ = environ
        self.clock: Clock = clock or SystemClock()
        self.uid = os.geteuid() if uid is None else uid
        self._runtime_root = user_runtime_root
        self._proc_root = proc_root
        self.warnings = WarnOnce()
        self._user = login_name(self.uid)
        self._backends: list[UnitBackend] = []
        timeout = settings.probe_retry_timeout
        kind = BackendKind(settings.backend)
        from scope.run_backend import SystemdRunBackend

        self._run_backend = SystemdRunBackend(self.discover, timeout=timeout)
        self._dbus_backend: UnitBackend | None = None
        if kind in (BackendKind.AUTO, BackendKind.DBUS):
            from scope.dbus_backend import DbusBackend

            self._dbus_backend = DbusBackend(self.discover, timeout=timeout)
            self._backends.append(self._dbus_backend)
        if kind in (BackendKind.AUTO, BackendKind.SYSTEMD_RUN):
            self._backends.append(self._run_backend)
        self._controllers: tuple[float, Controllers] | None = None
        self._probe = Probe(
            self._check,
            ttl=settings.probe_ttl,
            timeout=settings.probe_timeout,
            retry_timeout=settings.probe_retry_timeout,
            clock=self.clock,
            on_change=self._verdict_changed,
        )

    # -- facts -------------------------------------------------------------------------------

    def discover(self) -> BusInfo:
        """Bus discovery from the scoper's environment, fresh on every call."""
        return discover(
            self._environ, self.settings.manager, uid=self.uid, user_runtime_root=self._runtime_root
        )

    def facts(self, *, probe: bool = True) -> Facts:
        """The placement inputs now (``probe=False``: without consulting the probe)."""
        where = caller_unit(self._environ, proc_root=self._proc_root)
        verdict = self.probe() if probe else None
        return Facts(
            in_teardown_unit=where.in_teardown_unit,
            caller_unit=where.unit,
            probe_ok=verdict.ok if verdict else False,
            probe_detail=verdict.detail if verdict else "not probed",
            user=self._user,
            uid=self.uid,
        )

    def probe(self, *, force: bool = False) -> ProbeVerdict:
        return self._probe.verdict(force=force)

    @property
    def probe_runs(self) -> int:
        """How many probe checks actually ran (for tests and doctor)."""
        return self._probe.runs

    def _verdict_changed(self, previous: ProbeVerdict | None, now: ProbeVerdict) -> None:
        if now.ok and previous is not None and not previous.ok:
            _log.info("systemd scopes are available again (%s)", now.backend)
            # A relapse after recovery is news again: warn anew.
            self.warnings.reset()

    def decide(self, caller: CallerKind, *, wants_isolation: bool = True) -> Decision:
        where = caller_unit(self._environ, proc_root=self._proc_root)
        # Outside a unit with no isolation wanted, the probe cannot change the answer.
        need_probe = wants_isolation or where.in_teardown_unit
        return decide(
            self.facts(probe=need_probe),
            CallerKind(caller),
            self.policy,
            wants_isolation=wants_isolation,
        )

    # -- launch ------------------------------------------------------------------------------

    def launch(
        self, spec: LaunchSpec, caller: CallerKind, *, wants_isolation: bool = True
    ) -> Launched:
        caller = CallerKind(caller)
        decision = self.decide(caller, wants_isolation=wants_isolation)
        if decision.placement is Placement.SCOPED:
            properties = self.class_of(spec)
            skipped: tuple[str, ...] = ()
            if needs_controllers(properties):
                skipped = admit(
                    properties,
                    self.controllers(),
                    caller=caller.value,
                    uid=self.uid,
                    warnings=self.warnings,
                )
            unit = scope_name(caller.value, spec.unit_parts)
            if spec.manager_env and properties.runtime_max is not None:
                extra = manager_env(self.discover(), unit)
                spec = dataclasses.replace(spec, env={**spec.env, **extra})
            try:
                launched = self._place(spec, unit, properties=properties)
            except ScopeError as err:
                raise self._after_failure(err, unit, caller) from err
            return dataclasses.replace(launched, resources=properties, ineffective=skipped)
        warning = None
        if decision.warn:
            warning = (
                f"{caller.value} worker runs degraded (it dies with its unit): "
                f"{decision.cause}; {decision.remedy}"
            )
            # Keyed on the row, not the detail text: the probe's wording changes while the
            # manager stays unreachable (vanished, then "no backend could reach it"), and that
            # must not repeat the warning. A recovery resets it, so a relapse warns again.
            self.warnings.warn(caller.value, "no restart-safe scope", warning)
        if spec.starter is not None and spec.gated:
            started = start_released(spec)
            return Launched(
                process=started.process,
                pid=started.pid,
                start_time=started.start_time,
                placement=decision.placement,
                warning=warning,
            )
        process = popen(spec, spec.argv, spec.env)
        return Launched(
            process=process, pid=process.pid, placement=decision.placement, warning=warning
        )

    def class_of(self, spec: LaunchSpec) -> ScopeProperties:
        """The class a scoped launch of ``spec`` gets: its own over ``scope.resources``."""
        properties = self.settings.properties()
        return properties if spec.resources is None else spec.resources.over(properties)

    def controllers(self, *, force: bool = False) -> Controllers:
        """This host's cgroup layout and the controllers the manager can use for our scopes,
        cached for ``scope.probe_ttl`` like the probe verdict (they change only when an
        operator delegates controllers or reboots)."""
        now = self.clock.monotonic()
        cached = self._controllers
        if not force and cached is not None and now - cached[0] < self.settings.probe_ttl:
            return cached[1]
        system = self.discover().manager is ManagerKind.SYSTEM
        root: str | None = None
        for backend in self._ops():
            try:
                root = backend.manager_control_group() or None
                break
            except ScopeError as err:
                _log.debug("%s: no ControlGroup of the manager: %s", backend.name, err)
        try:
            found = read_controllers(root, system=system, proc=self._proc_root)
        except (OSError, ValueError) as err:
            why = f"cannot read the cgroup layout: {err}"
            found = Controllers(layout=Layout.NONE, missing=dict.fromkeys(CONTROLLERS, why))
        if root is not None or system:
            # An unanswered question is asked again next time, not remembered for a TTL.
            self._controllers = (now, found)
        return found

    def _place(
        self,
        spec: LaunchSpec,
        unit: str,
        timeout: float | None = None,
        *,
        properties: ScopeProperties | None = None,
    ) -> Launched:
        """Try the configured backends in order within one bound; OSError (bad program or cwd)
        passes through untouched, as it would from ``Popen``."""
        bound = self.settings.probe_retry_timeout if timeout is None else timeout
        deadline = time.monotonic() + bound
        failures: list[tuple[str, ScopeError]] = []
        if properties is None:
            properties = self.class_of(spec)
        for backend in self._backends:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                failures.append(
                    (
                        backend.name,
                        ScopeTimeout(
                            f"no time left of {bound:g} s", backend=backend.name, unit=unit
                        ),
                    )
                )
                continue
            try:
                return backend.launch(spec, unit, properties, timeout=remaining)
            except ScopeError as err:
                _log.debug("%s could not place %s: %s", backend.name, unit, err)
                failures.append((backend.name, err))
        raise _combine(failures, unit)

    def _after_failure(self, err: ScopeError, unit: str, caller: CallerKind) -> ScopeError:
        """After a scoped launch failed: is the manager gone? Then flip the verdict now."""
        fresh = self.discover()  # re-derived from scratch, not from the failed spawn's env
        if socket_reachable(fresh.private_socket):
            return err
        gone = [f"the manager's socket {fresh.private_socket or '(no runtime dir)'} is unreachable"]
        if not fresh.bus_ok:
            gone.append(f"the bus {fresh.bus_path or ''} is gone".replace("  ", " "))
        if fresh.detail:
            gone.append(fresh.detail)
        vanished = "; ".join(gone)
        self._probe.mark_down(f"the systemd manager vanished ({vanished})")
        user = self._user
        lost = ManagerLost(
            vanished,
            remedy=(
                f"fix: check 'systemctl --user status' and run 'loginctl enable-linger {user}' so "
                "the user manager outlives logins; until it is back, new workers follow the "
                "'no scope' placement policy"
            ),
            unit=unit,
            caller=caller.value,
            cause=str(err),
        )
        _log.warning("%s", lost.message)
        return lost

    # -- probe -------------------------------------------------------------------------------

    def _check(self, timeout: float) -> ProbeVerdict:
        """Place ``/bin/sh -c :`` exactly as a real spawn would, bounded by ``timeout``."""
        started = time.perf_counter()
        info = self.discover()

        def verdict(ok: bool, backend: str | None, detail: str = "", timed_out: bool = False):
            elapsed = (time.perf_counter() - started) * 1000.0
            return ProbeVerdict(
                ok=ok,
                backend=backend,
                elapsed_ms=round(elapsed, 2),
                detail=detail,
                timed_out=timed_out,
            )

        if not info.usable:
            return verdict(False, None, info.detail)
        unit = scope_name("probe")
        spec = LaunchSpec(
            argv=PROBE_ARGV, env=info.env, cwd="/", description="dispatch scope probe"
        )
        try:
            launched = self._place(spec, unit, timeout=timeout)
        except ScopeTimeout as err:
            return verdict(False, None, _stable(err, unit), timed_out=True)
        except (ScopeError, OSError) as err:
            return verdict(False, None, _stable(err, unit))
        remaining = max(0.1, timeout - (time.perf_counter() - started))
        assert launched.process is not None  # the probe names no starter
        try:
            code = launched.process.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            abandon(launched.process, timeout=1.0)
            return verdict(False, launched.backend, "the probe no-op did not finish", True)
        if code != 0:
            return verdict(False, launched.backend, f"the probe no-op exited {code}")
        return verdict(True, launched.backend)

    # -- existing units ----------------------------------------------------------------------

    def _ops(self) -> list[UnitBackend]:
        # D-Bus when configured; systemctl whenever D-Bus cannot be used.
        ops: list[UnitBackend] = []
        if self._dbus_backend is not None:
            ops.append(self._dbus_backend)
        ops.append(self._run_backend)
        return ops

    def _control_group(self, unit: str) -> str | None:
        last: ScopeError | None = None
        for backend in self._ops():
            try:
                return backend.control_group(unit)
            except BusError as err:
                last = err
        assert last is not None
        raise last

    def _kill(self, unit: str, sig: int) -> None:
        last: ScopeError | None = None
        for backend in self._ops():
            try:
                backend.kill_unit(unit, sig)
                return
            except BusError as err:
                last = err
        assert last is not None
        raise last

    def unit_pids(self, unit: str) -> list[int] | None:
        control_group = self._control_group(unit)
        if control_group is None:
            return None
        return _procs(control_group, unit) if control_group else []

    def stop(self, unit: str, *, grace: float) -> StopResult:
        control_group = self._control_group(unit)
        if control_group is None:
            return StopResult(unit=unit, stopped=True)

        def left() -> list[int]:
            return _procs(control_group, unit) if control_group else []

        if not left():
            return StopResult(unit=unit, stopped=True)
        sent: str | None = None
        for sig, bound in ((signal.SIGTERM, grace), (signal.SIGKILL, _KILL_CONFIRM)):
            if sig is signal.SIGKILL:
                survivors = left()
                if not survivors:
                    break
                _log.warning(
                    "%s: pids %s ignored SIGTERM for %g s; sending SIGKILL (the caller's grace "
                    "decides how long to wait)",
                    unit,
                    survivors,
                    grace,
                )
            self._kill(unit, sig)
            sent = sig.name
            _wait_empty(left, bound)
        survivors = left()
        return StopResult(unit=unit, stopped=not survivors, signal=sent, survivors=tuple(survivors))

    # -- doctor ------------------------------------------------------------------------------

    def manager_status(self) -> ManagerStatus:
        """Reachability, kind and version of the manager (D-Bus first, then systemctl)."""
        info = self.discover()
        kind = info.manager.value
        problems: list[str] = []
        for backend in self._ops():
            try:
                version = backend.manager_version()
                return ManagerStatus(reachable=True, kind=kind, version=str(version))
            except ScopeError as err:
                problems.append(f"{backend.name}: {err.message}")
        reachable = socket_reachable(info.private_socket)
        return ManagerStatus(
            reachable=reachable, kind=kind, version=None, detail="; ".join(problems)
        )

    def close(self) -> None:
        for backend in {id(b): b for b in self._ops()}.values():
            backend.close()


def _combine(failures: list[tuple[str, ScopeError]], unit: str) -> ScopeError:
    if len(failures) == 1:
        return failures[0][1]
    detail = "; ".join(f"{name}: {err.describe()}" for name, err in failures)
    backends = "+".join(name for name, _ in failures)
    if all(isinstance(err, ScopeTimeout) for _, err in failures):
        return ScopeTimeout(detail, backend=backends, unit=unit)
    if all(isinstance(err, BusError) for _, err in failures):
        return BusError(
            f"no backend could reach the manager: {detail}",
            backend=backends,
            unit=unit,
            detail=detail,
        )
    return ScopeStartFailed(detail, backend=backends, unit=unit)


def _stable(err: BaseException, unit: str) -> str:
    """An error's text without the probe's random unit name (it keys warn-once)."""
    text = err.describe() if isinstance(err, ScopeError) else str(err)
    return text.replace(unit, "the probe scope")


def _procs(control_group: str, unit: str) -> list[int]:
    try:
        return cgroup_procs(control_group)
    except (LookupError, OSError, ValueError) as exc:
        raise ScopeStartFailed(
            f"cannot read the cgroup of {unit} ({control_group}): {exc}",
            backend="cgroup",
            unit=unit,
        ) from exc


def _wait_empty(left: Callable[[], list[int]], bound: float) -> None:
    """Poll the cgroup until it is empty or ``bound`` seconds pass (processes die in real time)."""
    deadline = time.monotonic() + max(0.0, bound)
    delay = 0.005
    while left() and time.monotonic() < deadline:
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.05)
