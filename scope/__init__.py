"""scope/: where a launched process may live (systemd scopes, bus, probe, placement policy).

Uses nothing else of this project. See :mod:`scope.abc` for the contract. Entry points:

* :func:`open_scoper` builds the real :class:`~scope.systemd.SystemdScoper`;
* :class:`scope.fake.FakeScoper` is the in-memory one for tests;
* :func:`scope.placement.decide` is the placement table as a pure function.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs every CLI start-up; the annotations are strings anyway
    from collections.abc import Mapping

    from scope.abc import Policy, Scoper
    from scope.foundation.clock import Clock
    from scope.settings import ScopeSettings

__all__ = ["open_scoper", "policy_from"]

__version__ = "0.1.0"


def policy_from(
    cron_require_restart_safe_scope: bool, kanban_degrade_without_scope: bool
) -> Policy:
    """The placement policy from the two config keys (``cron.require_restart_safe_scope``,
    ``kanban.degrade_without_scope``)."""
    # Imported here: `import scope.foundation.errors` (every CLI start) must not pay for
    # scope.abc and its dataclasses.
    from scope.abc import Policy

    return Policy(
        cron_require_restart_safe_scope=bool(cron_require_restart_safe_scope),
        kanban_degrade_without_scope=bool(kanban_degrade_without_scope),
    )


def open_scoper(
    settings: ScopeSettings,
    policy: Policy,
    *,
    environ: Mapping[str, str],
    clock: Clock | None = None,
) -> Scoper:
    """The real scoper (systemd scopes via D-Bus or systemd-run).

    Nothing is contacted here: the bus is discovered, and the probe runs, on first use.
    ``environ`` is the environment to discover the bus from (never mutated); pass the test
    fixture's ``env`` in tests. Call ``close()`` when done.
    """
    # Imported here so `import scope` stays cheap and free of dbus-next for light users.
    from scope.systemd import SystemdScoper

    return SystemdScoper(settings, policy, environ=environ, clock=clock)
