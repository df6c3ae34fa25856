"""The placement table: one pure function from facts, caller kind and policy to a placement.

This module is the single statement of ARCHITECTURE.md's decision table. It does no I/O: the
facts (is the caller inside a unit whose stop kills its children, does scoping work now) are
gathered elsewhere (:mod:`scope.facts`, :mod:`scope.probe`) and handed in, so every row can be
tested with plain values.

=====================  ==============  =================================================
caller in a teardown   probe OK        result
unit?
=====================  ==============  =================================================
no                     either          ``scoped`` if the probe is OK and the caller wants
                                       isolation, else ``in_process``
yes                    yes             ``scoped``
yes                    no              cron: ``degraded`` (refused with
                                       ``cron.require_restart_safe_scope``);
                                       kanban and oneshot: refused (``degraded`` with
                                       ``kanban.degrade_without_scope``);
                                       cli: ``degraded``
=====================  ==============  =================================================

``wants_isolation`` only matters outside a teardown unit: inside one, a scope is the only way to
outlive the unit, so it is always wanted.
"""

from __future__ import annotations

from scope.abc import CallerKind, Decision, Facts, Placement, Policy
from scope.errors import ScopeUnavailable

__all__ = ["decide", "no_scope_cause", "no_scope_remedy"]

_CRON_KEY = "cron.require_restart_safe_scope"
_KANBAN_KEY = "kanban.degrade_without_scope"


def decide(facts: Facts, caller: CallerKind, policy: Policy, *, wants_isolation: bool) -> Decision:
    """Apply the placement table (see the module docstring).

    Returns ``scoped``, ``in_process`` or ``degraded`` (with ``warn`` set, and a cause and remedy
    naming the fix). Raises :class:`~scope.errors.ScopeUnavailable` when the caller's policy
    refuses to run without a restart-safe scope; its ``remedy`` names the same fixes.
    """
    caller = CallerKind(caller)
    if not facts.in_teardown_unit:
        if facts.probe_ok and wants_isolation:
            return Decision(placement=Placement.SCOPED)
        # A setsid'd process already outlives a shell or a CLI call: nothing is lost here.
        cause = "no isolation wanted" if not wants_isolation else _probe_cause(facts)
        return Decision(placement=Placement.IN_PROCESS, cause=cause)
    if facts.probe_ok:
        return Decision(placement=Placement.SCOPED)

    refuse = _refuses(caller, policy)
    cause = no_scope_cause(facts)
    remedy = no_scope_remedy(facts, caller, policy, refused=refuse)
    if refuse:
        raise ScopeUnavailable(
            cause,
            caller=caller.value,
            remedy=remedy,
            unit=facts.caller_unit,
            probe_detail=facts.probe_detail,
        )
    return Decision(placement=Placement.DEGRADED, cause=cause, remedy=remedy, warn=True)


def _refuses(caller: CallerKind, policy: Policy) -> bool:
    """The policy column of the "in a unit, probe not OK" row."""
    if caller is CallerKind.CRON:
        return policy.cron_require_restart_safe_scope
    if caller in (CallerKind.KANBAN, CallerKind.ONESHOT):
        return not policy.kanban_degrade_without_scope
    # `dispatch run` from inside a unit: the operator asked for this process now; run it.
    return False


def _probe_cause(facts: Facts) -> str:
    detail = facts.probe_detail or "no systemd scope can be made"
    return f"scoping unavailable ({detail})"


def _unit_phrase(facts: Facts) -> str:
    return facts.caller_unit or "the caller's unit"


def no_scope_cause(facts: Facts) -> str:
    """Why a process in a teardown unit gets no scope (stable text: it keys warn-once)."""
    detail = facts.probe_detail or "the scope probe failed"
    return (
        f"{_unit_phrase(facts)} kills its children when it stops and no scope can be made: {detail}"
    )


def no_scope_remedy(facts: Facts, caller: CallerKind, policy: Policy, *, refused: bool) -> str:
    """The fixes an operator can apply, most durable first, ending with the policy key."""
    user = facts.user or "<user>"
    runtime = f"/run/user/{facts.uid}" if facts.uid is not None else "/run/user/<uid>"
    unit = _unit_phrase(facts)
    fixes = [
        f"run 'loginctl enable-linger {user}' so the user manager runs without a login",
        f"export XDG_RUNTIME_DIR={runtime} and DBUS_SESSION_BUS_ADDRESS=unix:path={runtime}/bus "
        f"into {unit} (Environment=)",
        f"or set KillMode=process on {unit} so stopping it leaves workers running",
    ]
    if caller is CallerKind.CRON:
        if refused:
            fixes.append(f"or set {_CRON_KEY}: false to run degraded (workers die with the unit)")
        else:
            fixes.append(f"set {_CRON_KEY}: true to refuse instead of degrading")
    elif caller in (CallerKind.KANBAN, CallerKind.ONESHOT):
        if refused:
            fixes.append(f"or set {_KANBAN_KEY}: true to run degraded (workers die with the unit)")
        else:
            fixes.append(f"set {_KANBAN_KEY}: false to refuse instead of degrading")
    else:
        fixes.append("or run 'dispatch run' outside a systemd service")
    return "fix: " + "; ".join(fixes)
