"""The scope layer's contract: where a launched process may live, and how it gets there.

scope/ decides whether a process is started inside its own systemd scope (so it outlives the
unit of whoever launched it), starts it there, and later stops the scope. It knows nothing about
sessions, cards or cron jobs: callers hand it an argv and a caller kind and get back a running
process plus the placement that was used. It must not import registry/ or dispatcher/.

Vocabulary (shared with the rest of the project; use these exact values):

* :class:`Placement`: ``in_process`` (no scope wanted or possible, nothing lost: the caller is
  not in a unit whose stop kills its children), ``scoped`` (own transient ``.scope`` unit),
  ``degraded`` (a scope was wanted, none could be had, the process dies with the caller's unit).
  A refusal is not a placement: it raises :class:`~scope.errors.ScopeUnavailable` and callers
  record the outcome ``spawn_refused``.
* :class:`CallerKind`: ``cron``, ``kanban``, ``oneshot`` (``dispatch kanban tick`` from a
  ``Type=oneshot`` unit), ``cli`` (``dispatch run``).

Gate protocol: the D-Bus backend attaches an already spawned child to a new scope by PID. So that
no instruction of the worker runs outside the scope, the child is started with the environment
variable ``DISPATCH_SCOPE_GATE_FD`` naming an inherited pipe; it must read from that fd before
doing anything else and proceed only after reading the byte ``b"1"`` (EOF means "abort: exit
now"). Programs that honour this set :attr:`LaunchSpec.gated`; others are wrapped by the backend.
The systemd-run backend needs no gate (systemd-run creates the scope, then execs the program) and
does not set the variable.

Starters: a gated spec may name a :class:`Starter` that starts the program instead of ``Popen``
(the registry's keeper fork server). The D-Bus backend and unscoped launches use it, holding the
started process behind the gate as always; when the starter declines (:class:`StarterDeclined`),
that gate is closed, so anything it may have half-started exits without running, and the program
is started the usual way behind a new gate. A started process that is not our child comes back
as :attr:`Launched.process` ``None`` with its kernel start time (:attr:`Launched.start_time`):
callers follow it by pid and start time, as after a restart.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scope.resources import ScopeProperties

if TYPE_CHECKING:
    import subprocess

DEVNULL = -3
"""``subprocess.DEVNULL`` (its documented value; importing subprocess costs every command
start-up time, and most commands never start a process)."""

GATE_ENV = "DISPATCH_SCOPE_GATE_FD"
UNIT_ENV = "DISPATCH_SCOPE_UNIT"
"""With :attr:`LaunchSpec.manager_env`: the name of the scope the program was placed in."""
SYSTEMCTL_ENV = "DISPATCH_SCOPE_SYSTEMCTL"
"""With :attr:`LaunchSpec.manager_env`: the ``systemctl`` that reaches the scope's manager."""
MANAGER_ENV = "DISPATCH_SCOPE_MANAGER"
"""With :attr:`LaunchSpec.manager_env`: ``user`` or ``system`` (``systemctl --user`` or not)."""


class Placement(enum.StrEnum):
    """Where a launched process lives (see the module docstring)."""

    IN_PROCESS = "in_process"
    SCOPED = "scoped"
    DEGRADED = "degraded"


class CallerKind(enum.StrEnum):
    """Who is launching: decides the policy row of the placement table."""

    CRON = "cron"
    KANBAN = "kanban"
    ONESHOT = "oneshot"
    CLI = "cli"


class ManagerKind(enum.StrEnum):
    """Which systemd manager to use (``scope.manager``)."""

    AUTO = "auto"
    USER = "user"
    SYSTEM = "system"


class BackendKind(enum.StrEnum):
    """How scopes are created (``scope.backend``)."""

    AUTO = "auto"
    DBUS = "dbus"
    SYSTEMD_RUN = "systemd-run"


@dataclass(frozen=True, kw_only=True)
class Policy:
    """The caller policy keys that the placement table consults."""

    cron_require_restart_safe_scope: bool = False
    kanban_degrade_without_scope: bool = False


@dataclass(frozen=True, kw_only=True)
class Facts:
    """Everything the placement decision depends on, gathered by the thin impure layer."""

    in_teardown_unit: bool
    """The caller sits in a unit whose stop kills its children (``*.service`` leaf or
    ``INVOCATION_ID`` set; ``init.scope`` and ``/`` do not count)."""
    caller_unit: str | None
    """The caller's own unit name when known (for messages)."""
    probe_ok: bool
    """The (cached) probe verdict: a scope can be made now."""
    probe_detail: str = ""
    """Why the probe failed, for messages."""
    user: str = ""
    """The login name the manager runs for (for the ``loginctl enable-linger`` remedy)."""
    uid: int | None = None
    """The caller's uid (for the ``XDG_RUNTIME_DIR=/run/user/<uid>`` remedy)."""


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The outcome of the placement table (a refusal is raised, not returned)."""

    placement: Placement
    cause: str = ""
    """Why the result is not ``scoped`` (empty when it is)."""
    remedy: str = ""
    """What the operator can do about it (empty when nothing is wrong)."""
    warn: bool = False
    """True for ``degraded``: callers log the cause and remedy once per (caller kind, cause)."""


class StarterDeclined(Exception):
    """A :class:`Starter` started nothing that can ever run (see :meth:`Starter.start`).

    Never leaves scope/: the launch falls back to ``Popen``. ``reason`` is a short stable
    word for counting (``missing``, ``dead``, ``refused``, ``busy``, ``timeout``)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, kw_only=True)
class Started:
    """A process a launch started, before it is let through its gate."""

    pid: int
    process: subprocess.Popen[bytes] | None = None
    """Our child (``Popen``); None when a starter's process started it (not ours to reap)."""
    start_time: int | None = None
    """Kernel start time (clock ticks since boot) when known: with ``pid``, its identity."""


class Starter(abc.ABC):
    """Starts a gated program in place of ``Popen`` (the registry's keeper fork server)."""

    @abc.abstractmethod
    def start(self, spec: LaunchSpec, env: Mapping[str, str], pass_fds: Sequence[int]) -> Started:
        """Start ``spec.argv`` with ``env`` (which names the gate in ``DISPATCH_SCOPE_GATE_FD``),
        ``spec``'s cwd and stdio, a new session, and ``pass_fds`` at the same numbers.

        Returns only once the process exists and waits on its gate. Raises
        :class:`StarterDeclined` whenever it cannot say that: the caller then closes that gate
        (a process half-started meanwhile reads EOF and exits without running anything) and
        starts the program itself, so a program is never run twice. ``OSError`` as ``Popen``
        would raise it (the program cannot start at all)."""


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """What to start. ``argv`` is never passed through a shell."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    unit_parts: Sequence[str] = ()
    """Ids that go into the unit name after the caller kind, e.g. ``("c1", "run", "r7")`` gives
    ``dispatch-kanban-c1-run-r7.scope`` (sanitised and made unique by the scope layer)."""
    description: str = ""
    pass_fds: Sequence[int] = ()
    stdin: int | None = DEVNULL
    stdout: int | None = DEVNULL
    stderr: int | None = DEVNULL
    gated: bool = False
    """The program honours the gate protocol (reads ``DISPATCH_SCOPE_GATE_FD``)."""
    start_new_session: bool = True
    resources: ScopeProperties | None = None
    """This worker's resource class, over ``scope.resources`` key by key (None: the default
    class alone)."""
    starter: Starter | None = None
    """Starts a ``gated`` program instead of ``Popen`` where the placement allows it (see the
    module docstring); None: ``Popen``."""
    manager_env: bool = False
    """When the program gets a scope of its own whose class sets ``runtime_max``, name that
    scope and its manager in the program's environment (:data:`UNIT_ENV`,
    :data:`SYSTEMCTL_ENV`, :data:`MANAGER_ENV` and the bus variables), so that while it still
    lives in the scope it can read the unit's ``Result``: ``timeout`` once the manager is
    stopping the scope at ``RuntimeMaxSec=``, never after a stop by anyone else."""


@dataclass(frozen=True, kw_only=True)
class Launched:
    """A started process and where it was placed."""

    process: subprocess.Popen[bytes] | None
    """Our child; None when a :class:`Starter` started it (follow it by ``pid`` and
    ``start_time``, as an adopted process)."""
    pid: int
    placement: Placement
    unit: str | None = None
    backend: str | None = None
    warning: str | None = None
    """Set for ``degraded``: the cause and remedy (already logged once per caller kind/cause)."""
    start_time: int | None = None
    """Kernel start time of ``pid`` when the launch knows it (always when ``process`` is
    None)."""
    resources: ScopeProperties | None = None
    """The class the scope was given (the worker's over ``scope.resources``); None when the
    process has no scope of its own."""
    ineffective: tuple[str, ...] = ()
    """Keys of that class this host does not enforce (started anyway: ``best_effort``)."""


@dataclass(frozen=True, kw_only=True)
class ProbeVerdict:
    """The result of placing a real no-op through the backend real spawns use."""

    ok: bool
    backend: str | None
    elapsed_ms: float
    detail: str = ""
    timed_out: bool = False
    checked_at: float = 0.0
    """Monotonic time of the check (for the TTL)."""


@dataclass(frozen=True, kw_only=True)
class StopResult:
    """What stopping a scope achieved."""

    unit: str
    stopped: bool
    """True when nothing survives in the unit's cgroup (or the unit is not loaded)."""
    signal: str | None = None
    """The strongest signal that had to be sent (``"SIGTERM"``, ``"SIGKILL"``) or None."""
    survivors: Sequence[int] = field(default_factory=tuple)


class ScopeBackend(abc.ABC):
    """One way of creating and stopping transient scopes (D-Bus, systemd-run, fake)."""

    name: str

    @abc.abstractmethod
    def launch(self, spec: LaunchSpec, unit: str, properties: ScopeProperties) -> Launched:
        """Start ``spec`` inside a new scope called ``unit`` and return once the process is
        inside it. Raises :class:`~scope.errors.ScopeError` (nothing left running) on failure."""

    @abc.abstractmethod
    def kill_unit(self, unit: str, signal: int) -> None:
        """Signal every process in the unit's cgroup; a unit that is not loaded is a no-op."""

    @abc.abstractmethod
    def unit_pids(self, unit: str) -> list[int] | None:
        """Pids in the unit's cgroup, or None when the unit is not loaded."""

    def close(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release connections."""


class Scoper(abc.ABC):
    """The facade callers use: decide, launch, stop, probe, explain."""

    @abc.abstractmethod
    def decide(self, caller: CallerKind, *, wants_isolation: bool = True) -> Decision:
        """Run the placement table on fresh facts and the cached probe verdict.

        Raises :class:`~scope.errors.ScopeUnavailable` when the caller's policy refuses."""

    @abc.abstractmethod
    def launch(
        self, spec: LaunchSpec, caller: CallerKind, *, wants_isolation: bool = True
    ) -> Launched:
        """Decide, then start ``spec`` with the decided placement.

        Raises ScopeUnavailable (refused by policy; nothing started) or ManagerLost (a scoped
        launch failed because the manager vanished: the cached verdict is already flipped, so
        calling ``launch`` again follows the "probe not OK" row)."""

    @abc.abstractmethod
    def stop(self, unit: str, *, grace: float) -> StopResult:
        """SIGTERM everything in the unit, SIGKILL after ``grace`` seconds, then confirm from the
        unit's ``cgroup.procs`` that nothing survives. A unit that is not loaded is stopped."""

    @abc.abstractmethod
    def unit_pids(self, unit: str) -> list[int] | None:
        """Pids in the unit's cgroup, or None when the unit is not loaded."""

    @abc.abstractmethod
    def probe(self, *, force: bool = False) -> ProbeVerdict:
        """The cached probe verdict, probing when it expired (or ``force``)."""

    def close(self) -> None:  # noqa: B027 - optional hook with a no-op default
        """Release connections and threads."""
