"""Named limits as pure functions: the rate grammar, the one check (:func:`refusal`), how a
wait reads, and the config rules (a limit used but not defined, zero caps, bad rates)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.config import parse_config
from dispatcher.launch.limits import (
    LimitScope,
    LimitSpec,
    LimitWait,
    PerGroup,
    Rate,
    Tally,
    WaitKind,
    parse_rate,
    refusal,
    usage,
    wants_of,
)
from scope.foundation.errors import ConfigError, Invalid
from tests.support.cli import dispatch_text, state_env

NOW = 1_800_000_000.0
OPENAI = LimitSpec(concurrency=6, rate=Rate(starts=120, window=60))
GPU = LimitSpec(concurrency=1, scope=LimitScope.HOST)
DEPLOYS = LimitSpec(rate=Rate(starts=1, window=300))
TENANTS = LimitSpec(per_group=PerGroup(concurrency=2))


# -- the rate grammar -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("120/1m", Rate(120, 60)),
        ("1/5m", Rate(1, 300)),
        (" 3 / 1h30m ", Rate(3, 5400)),
        ("10/90", Rate(10, 90)),
        ("1/7d", Rate(1, 7 * 86400)),
    ],
)
def test_rates_read_as_starts_per_window(text: str, rate: Rate) -> None:
    assert parse_rate(text) == rate
    assert parse_rate(str(rate)) == rate


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("5/0s", "the window must be longer than 0s"),
        ("abc", "invalid rate 'abc'"),
        ("0/1m", "between 1 and"),
        ("5/", "invalid rate"),
        ("5/8d", "at most 7d"),
        ("٣/1m", "invalid rate"),
        ("5/1m/2", "invalid rate"),
    ],
)
def test_bad_rates_are_one_line_naming_the_form(text: str, problem: str) -> None:
    with pytest.raises(Invalid) as err:
        parse_rate(text)
    assert problem in err.value.problem and "\n" not in err.value.problem


# -- the check --------------------------------------------------------------------------------


def tally(open_: dict[tuple[str | None, str | None], int] | None = None, *starts: float) -> Tally:
    return Tally(open=open_ or {}, starts=tuple((at, None) for at in starts))


def check(wants: dict[str, LimitSpec], tallies: dict[str, Tally], **kw: object) -> object:
    where = {"host": "alpha", "group": None, "now": NOW, **kw}
    return refusal(tuple(wants.items()), tallies, **where)  # type: ignore[arg-type]


def test_concurrency_waits_at_the_cap_and_counts_every_host() -> None:
    five = tally({("alpha", None): 3, ("beta", "g"): 2})
    six = tally({("alpha", None): 3, ("beta", "g"): 3})
    assert check({"openai": OPENAI}, {"openai": five}) is None
    wait = check({"openai": OPENAI}, {"openai": six})
    assert wait == LimitWait(limit="openai", kind=WaitKind.CONCURRENCY, in_use=6, capacity=6)
    assert wait.describe(NOW) == "limit openai (6 of 6 running)"


def test_a_host_scoped_limit_counts_only_this_host() -> None:
    other = tally({("beta", None): 1})
    assert check({"gpu": GPU}, {"gpu": other}) is None
    mine = tally({("alpha", None): 1})
    assert check({"gpu": GPU}, {"gpu": mine}) is not None


def test_per_group_caps_each_group_separately() -> None:
    busy = tally({("alpha", "customer-42"): 2, ("alpha", None): 1})
    wait = check({"tenants": TENANTS}, {"tenants": busy}, group="customer-42")
    assert isinstance(wait, LimitWait) and wait.kind is WaitKind.GROUP
    assert wait.describe(NOW) == "limit tenants (2 of 2 running in group customer-42)"
    assert check({"tenants": TENANTS}, {"tenants": busy}, group="customer-7") is None
    assert check({"tenants": TENANTS}, {"tenants": busy}, group=None) is None


def test_a_rate_waits_until_its_oldest_counted_start_leaves_the_window() -> None:
    recent = tally({}, NOW - 100)
    wait = check({"deploys": DEPLOYS}, {"deploys": recent})
    assert isinstance(wait, LimitWait) and wait.next_start == NOW + 200
    assert wait.describe(NOW) == "limit deploys (next start in 3m20s)"
    assert check({"deploys": DEPLOYS}, {"deploys": tally({}, NOW - 300)}) is None
    # Three of five: the window lets the next start through when the third-newest leaves.
    three = LimitSpec(rate=Rate(3, 60))
    starts = tally({}, NOW - 50, NOW - 40, NOW - 30, NOW - 20, NOW - 10)
    wait = check({"r": three}, {"r": starts})
    assert isinstance(wait, LimitWait) and wait.next_start == NOW - 30 + 60


def test_the_first_full_limit_in_uses_order_is_named() -> None:
    full = {"openai": tally({("alpha", None): 6}), "deploys": tally({}, NOW)}
    first = check({"deploys": DEPLOYS, "openai": OPENAI}, full)
    assert isinstance(first, LimitWait) and first.limit == "deploys"
    assert first.reason == "limit deploys"
    assert first.to_dict(NOW)["next_start_in"] == 300


def test_wants_keep_the_uses_order_once_each() -> None:
    limits = {"a": OPENAI, "b": GPU}
    assert [name for name, _ in wants_of(["b", "a", "b", "gone"], limits)] == ["b", "a"]


# -- properties: starting only when refusal() says so keeps every promise ---------------------

events = st.lists(
    st.tuples(st.floats(min_value=0, max_value=30), st.booleans(), st.sampled_from("gh")),
    min_size=1,
    max_size=60,
)


@given(
    events,
    st.integers(min_value=1, max_value=4),
    st.integers(min_value=1, max_value=3),
    st.integers(min_value=1, max_value=5),
    st.floats(min_value=0.5, max_value=20),
)
def test_starting_when_allowed_never_breaks_a_cap(
    steps: list[tuple[float, bool, str]], cap: int, group_cap: int, starts: int, window: float
) -> None:
    spec = LimitSpec(
        concurrency=cap, rate=Rate(starts, window), per_group=PerGroup(concurrency=group_cap)
    )
    now = NOW
    held: list[str] = []
    started: list[float] = []
    for gap, end_one, group in steps:
        now += gap
        if end_one and held:
            held.pop(0)
        opened: dict[tuple[str | None, str | None], int] = {}
        for g in held:
            opened[(None, g)] = opened.get((None, g), 0) + 1
        seen = Tally(open=opened, starts=tuple((at, None) for at in started))
        wait = refusal((("x", spec),), {"x": seen}, host=None, group=group, now=now)
        counted = usage("x", spec, seen, host=None, group=group, now=now)
        free = (
            counted.in_use < cap
            and counted.group_in_use < group_cap
            and sum(1 for at in started if at > now - window) < starts
        )
        assert (wait is None) == free  # refuses exactly when a cap is full
        if wait is None:
            held.append(group)
            started.append(now)
        assert len(held) <= cap and all(held.count(g) <= group_cap for g in "gh")
    for index in range(len(started) - starts):
        # No window (t - W, t] holds more than N starts (compared as the check compares).
        assert started[index] <= started[index + starts] - window


# -- config -----------------------------------------------------------------------------------

CONFIG = """\
limits:
  openai: {concurrency: 6, rate: 120/1m}
  gpu: {concurrency: 1, scope: host}
  deploys: {rate: 1/5m}
  tenants: {per_group: {concurrency: 2}}
kanban:
  assignees:
    coder: {command: [run-coder], uses: [openai, tenants]}
    trainer: {command: [train], uses: [gpu, openai]}
cron:
  jobs:
    - {id: release, schedule: "0 * * * *", command: [release], uses: [deploys]}
"""


def test_the_issues_example_config_loads() -> None:
    settings = parse_config(CONFIG, "config.yaml")
    assert settings.limits["openai"] == OPENAI and settings.limits["tenants"] == TENANTS
    assert settings.kanban.assignees["trainer"].uses == ("gpu", "openai")
    assert settings.cron.jobs[0].uses == ("deploys",)


@pytest.mark.parametrize(
    ("change", "where", "problem"),
    [
        (("[openai, tenants]", "[openai, tpu]"), "kanban.assignees.coder.uses[1]", "'tpu'"),
        (("uses: [deploys]", "uses: [deploy]"), "cron.jobs[0].uses[0]", "'deploy'"),
        (("concurrency: 6", "concurrency: 0"), "limits.openai.concurrency", "at least 1"),
        (("rate: 1/5m", "rate: 5/0s"), "limits.deploys.rate", "longer than 0s"),
        (("rate: 1/5m", "rate: abc"), "limits.deploys.rate", "invalid rate"),
        (("scope: host", "scope: rack"), "limits.gpu.scope", "cluster, host"),
        (("{rate: 1/5m}", "{}"), "limits.deploys", "limits nothing"),
    ],
)
def test_bad_limits_are_one_line_naming_the_key(
    change: tuple[str, str], where: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(CONFIG.replace(*change), "config.yaml")
    line = err.value.message
    assert where in line and problem in line and "\n" not in line


def test_the_cli_refuses_an_undefined_limit_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.replace("[gpu, openai]", "[gpu, opnai]"))
    proc = dispatch_text(state_env(tmp_path), "--config", str(path), "config", "check")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "kanban.assignees.trainer.uses[1]" in proc.stderr and "'opnai'" in proc.stderr
