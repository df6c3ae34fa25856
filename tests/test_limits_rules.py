"""Named limits as pure functions: the rate grammar, the one check (:func:`refusal`), how a
wait reads, and the config rules (a limit used but not defined, zero caps, bad rates)."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.config import parse_config
from dispatcher.launch import holds
from dispatcher.launch.limits import (
    Held,
    LimitScope,
    LimitSpec,
    LimitWait,
    PerGroup,
    Rate,
    Tally,
    WaitKind,
    parse_rate,
    refusal,
    tally_of,
    wants_of,
)
from dispatcher.launch.tables import HOLDS_TABLE
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


def tally(spec: LimitSpec, *holds: Held, host: str | None = "alpha") -> Tally:
    return tally_of(spec, holds, host=host, now=NOW)


def held(host: str | None = "alpha", group: str | None = None, at: float = NOW - 1) -> Held:
    return Held(host=host, group=group, taken_at=at)


def check(
    wants: dict[str, LimitSpec], holds: dict[str, list[Held]], *, group: str | None = None
) -> object:
    tallies = {name: tally(wants[name], *found) for name, found in holds.items()}
    return refusal(tuple(wants.items()), tallies, group=group)


def test_concurrency_waits_at_the_cap_and_counts_every_host() -> None:
    five = [held()] * 3 + [held("beta", "g")] * 2
    assert check({"openai": OPENAI}, {"openai": five}) is None
    wait = check({"openai": OPENAI}, {"openai": [*five, held("beta")]})
    assert wait == LimitWait(limit="openai", kind=WaitKind.CONCURRENCY, in_use=6, capacity=6)
    assert wait.describe(NOW) == "limit openai (6 of 6 running)"


def test_a_host_scoped_limit_counts_only_this_host() -> None:
    assert check({"gpu": GPU}, {"gpu": [held("beta")]}) is None
    assert check({"gpu": GPU}, {"gpu": [held("alpha")]}) is not None
    # A single host (None) owns every hold on its board.
    assert tally(GPU, held(None), held("beta"), host=None).in_use == 2
    # Released holds no longer count toward concurrency.
    assert tally(GPU, Held(host="alpha", group=None, taken_at=NOW, released=True)).in_use == 0


def test_per_group_caps_each_group_separately() -> None:
    busy = [held(group="customer-42")] * 2 + [held()]
    wait = check({"tenants": TENANTS}, {"tenants": busy}, group="customer-42")
    assert isinstance(wait, LimitWait) and wait.kind is WaitKind.GROUP
    assert wait.describe(NOW) == "limit tenants (2 of 2 running in group customer-42)"
    assert check({"tenants": TENANTS}, {"tenants": busy}, group="customer-7") is None
    assert check({"tenants": TENANTS}, {"tenants": busy}, group=None) is None


def test_a_rate_waits_until_its_oldest_counted_start_leaves_the_window() -> None:
    ended = Held(host="alpha", group=None, taken_at=NOW - 100, released=True)
    wait = check({"deploys": DEPLOYS}, {"deploys": [ended]})  # an ended run's start counts
    assert isinstance(wait, LimitWait) and wait.next_start == NOW + 200
    assert wait.describe(NOW) == "limit deploys (next start in 3m20s)"
    assert check({"deploys": DEPLOYS}, {"deploys": [held(at=NOW - 300)]}) is None
    # Three of five: the window lets the next start through when the third-newest leaves.
    three = LimitSpec(rate=Rate(3, 60))
    starts = [held(at=NOW - age) for age in (50, 40, 30, 20, 10)]
    wait = check({"r": three}, {"r": starts})
    assert isinstance(wait, LimitWait) and wait.next_start == NOW - 30 + 60


def test_the_first_full_limit_in_uses_order_is_named() -> None:
    full = {"openai": [held()] * 6, "deploys": [held(at=NOW)]}
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
    holds: list[Held] = []
    started: list[float] = []
    for gap, end_one, group in steps:
        now += gap
        opened = [i for i, h in enumerate(holds) if not h.released]
        if end_one and opened:
            holds[opened[0]] = replace(holds[opened[0]], released=True)
        seen = tally_of(spec, holds, host=None, now=now)
        wait = refusal((("x", spec),), {"x": seen}, group=group)
        live = [h for h in holds if not h.released]
        free = (
            len(live) < cap
            and sum(1 for h in live if h.group == group) < group_cap
            and sum(1 for at in started if at > now - window) < starts
        )
        assert (wait is None) == free  # refuses exactly when a cap is full
        if wait is None:
            holds.append(Held(host=None, group=group, taken_at=now))
            started.append(now)
        live = [h for h in holds if not h.released]
        assert len(live) <= cap and all(
            sum(1 for h in live if h.group == g) <= group_cap for g in "gh"
        )
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


# -- the SQL counts follow the reference ------------------------------------------------------

hold_rows = st.lists(
    st.tuples(
        st.sampled_from([None, "alpha", "beta"]),
        st.sampled_from([None, "g", "h"]),
        st.integers(min_value=0, max_value=120),
        st.booleans(),
    ),
    max_size=30,
)


@given(
    hold_rows,
    st.sampled_from(list(LimitScope)),
    st.integers(min_value=1, max_value=4),
    st.sampled_from([None, "alpha", "beta"]),
    st.sampled_from([None, "g", "h"]),
)
def test_the_sql_counts_equal_the_reference(
    rows: list[tuple[str | None, str | None, int, bool]],
    scope: LimitScope,
    starts: int,
    host: str | None,
    group: str | None,
) -> None:
    spec = LimitSpec(
        concurrency=9, rate=Rate(starts, 60), scope=scope, per_group=PerGroup(concurrency=2)
    )
    conn = sqlite3.connect(":memory:")
    conn.executescript(HOLDS_TABLE.format(id="INTEGER PRIMARY KEY", text="TEXT", real="REAL"))
    for where, grp, age, ended in rows:
        conn.execute(
            "INSERT INTO limit_holds (limit_name, holder_kind, holder_id, host_id, group_name,"
            " taken_at, released_at) VALUES ('x', 'run', 'r', ?, ?, ?, ?)",
            (where, grp, NOW - age, NOW if ended else None),
        )
    reference = tally_of(
        spec,
        [Held(host=w, group=g, taken_at=NOW - a, released=e) for w, g, a, e in rows],
        host=host,
        now=NOW,
    )
    (found,) = holds.tallies(conn, (("x", spec),), NOW, host=host, group=group).values()
    assert (found.in_use, found.starts, found.nth_start) == (
        reference.in_use,
        reference.starts,
        reference.nth_start,
    )
    uncapped = replace(spec, concurrency=None)  # the claim skips a count it does not check
    (lean,) = holds.tallies(conn, (("x", uncapped),), NOW, host=host, group=group).values()
    assert (lean.in_use, lean.groups) == (0, found.groups)
    assert found.groups == {group: reference.groups.get(group, 0)}
    (every,) = holds.tallies(conn, (("x", spec),), NOW, host=host, every_group=True).values()
    assert every.groups == reference.groups
