"""The placement table (scope.placement.decide): every row, every caller kind, every policy."""

from __future__ import annotations

import itertools

import pytest

from scope.abc import CallerKind, Facts, Placement, Policy
from scope.errors import ScopeUnavailable
from scope.placement import decide

SCOPED = Placement.SCOPED
IN_PROCESS = Placement.IN_PROCESS
DEGRADED = Placement.DEGRADED
REFUSED = "refused"

POLICIES = {
    "defaults": Policy(),
    "cron_strict": Policy(cron_require_restart_safe_scope=True),
    "kanban_degrade": Policy(kanban_degrade_without_scope=True),
    "both": Policy(cron_require_restart_safe_scope=True, kanban_degrade_without_scope=True),
}

# The "in a teardown unit, probe not OK" row, per caller and policy.
NO_SCOPE_IN_UNIT = {
    (CallerKind.CRON, "defaults"): DEGRADED,
    (CallerKind.CRON, "cron_strict"): REFUSED,
    (CallerKind.CRON, "kanban_degrade"): DEGRADED,
    (CallerKind.CRON, "both"): REFUSED,
    (CallerKind.KANBAN, "defaults"): REFUSED,
    (CallerKind.KANBAN, "cron_strict"): REFUSED,
    (CallerKind.KANBAN, "kanban_degrade"): DEGRADED,
    (CallerKind.KANBAN, "both"): DEGRADED,
    (CallerKind.ONESHOT, "defaults"): REFUSED,
    (CallerKind.ONESHOT, "cron_strict"): REFUSED,
    (CallerKind.ONESHOT, "kanban_degrade"): DEGRADED,
    (CallerKind.ONESHOT, "both"): DEGRADED,
    (CallerKind.CLI, "defaults"): DEGRADED,
    (CallerKind.CLI, "cron_strict"): DEGRADED,
    (CallerKind.CLI, "kanban_degrade"): DEGRADED,
    (CallerKind.CLI, "both"): DEGRADED,
}


def expected(in_unit: bool, probe_ok: bool, wants: bool, caller: CallerKind, policy: str) -> object:
    """The table of ARCHITECTURE.md, written out independently of the code under test."""
    if not in_unit:
        return SCOPED if (probe_ok and wants) else IN_PROCESS
    if probe_ok:
        return SCOPED
    return NO_SCOPE_IN_UNIT[(caller, policy)]


def facts(in_unit: bool, probe_ok: bool) -> Facts:
    return Facts(
        in_teardown_unit=in_unit,
        caller_unit="gw.service" if in_unit else None,
        probe_ok=probe_ok,
        probe_detail="" if probe_ok else "no user manager at /run/user/1000",
        user="alice",
        uid=1000,
    )


CASES = list(
    itertools.product([False, True], [False, True], [False, True], list(CallerKind), POLICIES)
)


@pytest.mark.parametrize(
    ("in_unit", "probe_ok", "wants", "caller", "policy"),
    CASES,
    ids=[f"unit={u}-probe={p}-iso={w}-{c.value}-{pol}" for u, p, w, c, pol in CASES],
)
def test_every_row(in_unit: bool, probe_ok: bool, wants: bool, caller: CallerKind, policy: str):
    want = expected(in_unit, probe_ok, wants, caller, policy)
    f = facts(in_unit, probe_ok)
    if want == REFUSED:
        with pytest.raises(ScopeUnavailable) as info:
            decide(f, caller, POLICIES[policy], wants_isolation=wants)
        assert info.value.caller == caller.value
        assert "loginctl enable-linger alice" in info.value.message
        return
    decision = decide(f, caller, POLICIES[policy], wants_isolation=wants)
    assert decision.placement is want
    assert decision.warn is (want is DEGRADED)
    if want is SCOPED:
        assert decision.cause == "" and decision.remedy == ""
    if want is IN_PROCESS:
        # Nothing is lost outside a unit: no warning, no remedy.
        assert decision.remedy == ""


@pytest.mark.parametrize("caller", list(CallerKind))
def test_degraded_and_refused_messages_name_cause_and_every_remedy(caller: CallerKind):
    f = facts(True, False)
    for policy in POLICIES.values():
        try:
            decision = decide(f, caller, policy, wants_isolation=True)
            text = f"{decision.cause}; {decision.remedy}"
        except ScopeUnavailable as err:
            text = err.message
        assert "gw.service" in text
        assert "no user manager at /run/user/1000" in text
        assert "loginctl enable-linger alice" in text
        assert "XDG_RUNTIME_DIR=/run/user/1000" in text
        assert "DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus" in text
        assert "KillMode=process" in text
        if caller is CallerKind.CRON:
            assert "cron.require_restart_safe_scope" in text
        elif caller in (CallerKind.KANBAN, CallerKind.ONESHOT):
            assert "kanban.degrade_without_scope" in text


def test_refusal_carries_structured_fields():
    with pytest.raises(ScopeUnavailable) as info:
        decide(facts(True, False), CallerKind.KANBAN, Policy(), wants_isolation=True)
    err = info.value
    assert err.unit == "gw.service"
    assert err.probe_detail == "no user manager at /run/user/1000"
    assert "kanban.degrade_without_scope: true" in err.remedy
    assert err.to_dict()["error"] == "ScopeUnavailable"
    assert "\n" not in err.message


def test_cause_is_stable_for_warn_once_keys():
    a = decide(facts(True, False), CallerKind.CRON, Policy(), wants_isolation=True)
    b = decide(facts(True, False), CallerKind.CRON, Policy(), wants_isolation=True)
    assert a.cause == b.cause and a.cause


def test_placeholders_when_user_unknown():
    f = Facts(in_teardown_unit=True, caller_unit=None, probe_ok=False)
    d = decide(f, CallerKind.CLI, Policy(), wants_isolation=True)
    assert "loginctl enable-linger <user>" in d.remedy
    assert "the caller's unit" in d.cause


def test_caller_kind_accepts_plain_strings():
    d = decide(facts(True, True), "cron", Policy(), wants_isolation=True)  # type: ignore[arg-type]
    assert d.placement is SCOPED
