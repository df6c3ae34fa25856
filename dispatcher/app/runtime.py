"""The real parts a command works with: state database, scoper and process registry.

CLI commands, the gateway, cron and kanban all build them the same way here, from settings, a
state dir and an environment (never ``os.environ`` behind the caller's back)::

    with open_runtime(settings, state_dir, environ, caller_kind=CallerKind.CRON,
                      follow=True, protect_gateway=True) as rt:
        rt.registry.spawn(...)

The scoper is opened lazily: commands that only read sessions (``ps``, ``logs``) never import
the D-Bus client or touch the bus unless a session's unit has to be asked about.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dispatcher.app.database import open_state
from dispatcher.app.keepers import keeper_stats, open_fork_server
from dispatcher.settings import Settings
from registry.process import ForkServer, ProcessRegistry
from registry.store.database import StateDB
from scope import open_scoper, policy_from
from scope.abc import (
    CallerKind,
    Decision,
    Launched,
    LaunchSpec,
    Policy,
    ProbeVerdict,
    Scoper,
    StopResult,
)
from scope.foundation.clock import Clock

if TYPE_CHECKING:
    from dispatcher.kanban.abc import BoardStore
    from dispatcher.kanban.faults import FaultPoint
    from dispatcher.kanban.tick import KanbanDispatcher

__all__ = ["CommandScope", "Runtime", "open_runtime", "policy_of", "runtime_from_context"]


class CommandScope(Protocol):
    """What :func:`runtime_from_context` needs from a command's context (the CLI's
    ``Context`` is one; this layer must not import the CLI above it)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def state_dir(self) -> Path: ...

    @property
    def environ(self) -> Mapping[str, str]: ...

    def on_close(self, closer: Any) -> None: ...


def policy_of(settings: Settings) -> Policy:
    """The placement policy from ``cron.require_restart_safe_scope`` and
    ``kanban.degrade_without_scope``."""
    return policy_from(
        settings.cron.require_restart_safe_scope, settings.kanban.degrade_without_scope
    )


class LazyScoper(Scoper):
    """Opens the real scoper on first use (bus discovery and dbus-next cost start-up time)."""

    def __init__(
        self,
        settings: Settings,
        environ: Mapping[str, str],
        clock: Clock | None,
    ) -> None:
        self._settings = settings
        self._environ = dict(environ)
        self._clock = clock
        self._real: Scoper | None = None
        self._lock = threading.Lock()

    @property
    def opened(self) -> bool:
        """Whether the real scoper exists yet."""
        return self._real is not None

    def real(self) -> Scoper:
        """The real scoper (opened now if needed)."""
        with self._lock:
            if self._real is None:
                self._real = open_scoper(
                    self._settings.scope,
                    policy_of(self._settings),
                    environ=self._environ,
                    clock=self._clock,
                )
            return self._real

    def decide(self, caller: CallerKind, *, wants_isolation: bool = True) -> Decision:
        return self.real().decide(caller, wants_isolation=wants_isolation)

    def launch(
        self, spec: LaunchSpec, caller: CallerKind, *, wants_isolation: bool = True
    ) -> Launched:
        return self.real().launch(spec, caller, wants_isolation=wants_isolation)

    def stop(self, unit: str, *, grace: float) -> StopResult:
        return self.real().stop(unit, grace=grace)

    def unit_pids(self, unit: str) -> list[int] | None:
        return self.real().unit_pids(unit)

    def probe(self, *, force: bool = False) -> ProbeVerdict:
        return self.real().probe(force=force)

    def close(self) -> None:
        with self._lock:
            real, self._real = self._real, None
        if real is not None:
            real.close()


@dataclass(kw_only=True)
class Runtime:
    """An open database, scoper and registry; :meth:`close` closes all three."""

    settings: Settings
    state_dir: Path
    db: StateDB
    scoper: Scoper
    registry: ProcessRegistry
    caller_kind: CallerKind
    owns_scoper: bool = True
    """False when the caller handed in the scoper (then the caller closes it)."""
    fork_server: ForkServer | None = None
    """The keeper fork server this runtime started (closed with it; its keepers live on)."""
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        """Stop the registry's thread, release the bus connection, close the database.

        Running workers keep running (that is the point of keepers)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.registry.close()
        finally:
            try:
                if self.owns_scoper:
                    self.scoper.close()
            finally:
                try:
                    if self.fork_server is not None:
                        self.fork_server.close()
                finally:
                    self.db.close()

    def keeper_stats(self) -> dict[str, Any] | None:
        """What the fork server did (None without one), as the status file keeps it."""
        return keeper_stats(self.fork_server)

    def kanban_dispatcher(
        self,
        store: BoardStore,
        settings: Settings,
        environ: Mapping[str, str],
        *,
        config_path: Path | None,
        adopt: bool,
        fault: FaultPoint | None = None,
    ) -> KanbanDispatcher:
        """The kanban dispatcher on this runtime's registry and scoper, for ``settings`` (its
        kanban section and named limits): the gateway's and a command's are made alike."""
        from dispatcher.app.reports import spawn_environ
        from dispatcher.kanban.tick import KanbanDispatcher

        return KanbanDispatcher(
            store=store,
            registry=self.registry,
            settings=settings.kanban,
            state_dir=self.state_dir,
            caller=self.caller_kind,
            config_path=config_path,
            environ=spawn_environ(settings, environ),
            scoper=self.scoper,
            adopt=adopt,
            fault=fault,
            limits=settings.limits,
        )

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_runtime(
    settings: Settings,
    state_dir: Path,
    environ: Mapping[str, str],
    *,
    caller_kind: CallerKind = CallerKind.CLI,
    follow: bool = False,
    protect_gateway: bool = False,
    clock: Clock | None = None,
    scoper: Scoper | None = None,
    fork_server: bool = False,
) -> Runtime:
    """Open the state database (migrating it), a lazily opened real scoper (or ``scoper``,
    which the caller keeps and closes) and a :class:`~registry.process.ProcessRegistry` on
    ``state_dir``.

    ``follow``: run the registry's follower thread (long-lived callers and ``--wait``).
    ``protect_gateway``: refuse commands that would kill this process by name (the gateway).
    ``environ`` is where the bus is discovered from; it is copied, never mutated.
    ``fork_server``: start keepers from a fork server (:mod:`dispatcher.app.keepers`; unless
    ``registry.fork_server`` is off), started here before any thread of the runtime.
    """
    db = open_state(Path(state_dir))
    try:
        # Before the registry and the scoper exist, so before any thread of theirs (the
        # server is exec'd fresh anyway: nothing of this process's threads reaches it).
        server = open_fork_server(settings, Path(state_dir), environ) if fork_server else None
    except BaseException:
        db.close()
        raise
    own_scoper = scoper is None
    chosen: Scoper = scoper if scoper is not None else LazyScoper(settings, environ, clock)
    try:
        registry = ProcessRegistry(
            state_dir=Path(state_dir),
            db=db,
            scoper=chosen,
            settings=settings.registry,
            clock=clock,
            protect_gateway=protect_gateway,
            follow=follow,
            starter=server,
        )
    except BaseException:
        if own_scoper:
            chosen.close()
        if server is not None:
            server.close()
        db.close()
        raise
    return Runtime(
        settings=settings,
        state_dir=Path(state_dir),
        db=db,
        scoper=chosen,
        registry=registry,
        caller_kind=caller_kind,
        owns_scoper=own_scoper,
        fork_server=server,
    )


def runtime_from_context(
    ctx: CommandScope,
    *,
    caller_kind: CallerKind = CallerKind.CLI,
    follow: bool = False,
    protect_gateway: bool = False,
    clock: Clock | None = None,
) -> Runtime:
    """:func:`open_runtime` from a CLI context; closed when the command ends."""
    runtime = open_runtime(
        ctx.settings,
        ctx.state_dir,
        ctx.environ,
        caller_kind=caller_kind,
        follow=follow,
        protect_gateway=protect_gateway,
        clock=clock,
    )
    ctx.on_close(runtime)
    return runtime
