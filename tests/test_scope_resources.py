"""Resource classes: parsing, merging, and the unit properties both backends give a real scope."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dispatcher.config import load_config
from scope import open_scoper, policy_from
from scope.abc import BackendKind, CallerKind, LaunchSpec, Placement
from scope.foundation.errors import ConfigError
from scope.foundation.schema import Invalid, Record
from scope.foundation.values import format_percentage, parse_percentage
from scope.hierarchy import ineffective
from scope.resources import ScopeProperties, bus_properties, describe, run_properties
from scope.settings import ScopeSettings
from scope.systemd import SystemdScoper
from tests.support.systemd import SystemdManager
from tests.support.wait import wait_for

CLASS = {
    "memory_high": "48MiB",
    "memory_max": "64MiB",
    "memory_swap_max": "16MiB",
    "cpu_weight": 50,
    "cpu_quota": "150%",
    "tasks_max": 33,
    "io_weight": 200,
    "runtime_max": "1h",
}


def parse(mapping: dict[str, object]) -> ScopeProperties:
    value = Record(ScopeProperties).convert(mapping)
    assert isinstance(value, ScopeProperties)
    return value


# -- parsing ----------------------------------------------------------------------------------


def test_percentages_need_their_sign_and_round_trip() -> None:
    assert parse_percentage("150%") == 150.0 and parse_percentage(" 12.5 %") == 12.5
    assert format_percentage(parse_percentage("0.25%")) == "0.25%"
    for bad in ("150", 150, "1.234%", "x%", "-5%", "\uff11%", True):
        with pytest.raises(Invalid):
            parse_percentage(bad)


@pytest.mark.parametrize(
    ("mapping", "problem"),
    [
        ({"memory_maxx": "1G"}, "unknown key 'memory_maxx'; did you mean 'memory_max'?"),
        ({"cpu_quota": "150"}, "percent sign"),
        ({"cpu_quota": 150}, "expected a percentage"),
        ({"cpu_quota": "0%"}, "at least 0.01%"),
        ({"cpu_weight": 0}, "at least 1"),
        ({"io_weight": 10001}, "at most 10000"),
        ({"memory_max": "lots"}, "invalid size"),
        ({"memory_high": "2G", "memory_max": "1G"}, "memory_high 2GiB is above memory_max 1GiB"),
        ({"runtime_max": "0s"}, "at least 1s"),
        ({"best_effort": "yes"}, "expected true or false"),
    ],
)
def test_bad_classes_are_one_line_errors(mapping, problem) -> None:
    with pytest.raises(Invalid) as err:
        parse(mapping)
    assert problem in err.value.problem and "\n" not in err.value.problem


def test_bad_class_in_a_file_names_the_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "kanban:\n  assignees:\n    bot:\n      command: ['true']\n"
        "      resources:\n        cpu_quota: '150'\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert "config.yaml:6" in text and "kanban.assignees.bot.resources.cpu_quota" in text
    assert err.value.exit_code == 2 and "\n" not in text


def test_old_global_keys_are_aliases_and_never_both() -> None:
    settings = Record(ScopeSettings).convert({"memory_max": "1G", "resources": {"cpu_weight": 7}})
    assert settings.properties().memory_max == 2**30 and settings.properties().cpu_weight == 7
    with pytest.raises(Invalid) as err:
        Record(ScopeSettings).convert({"tasks_max": 5, "resources": {"tasks_max": 6}})
    assert "alias of scope.resources.tasks_max" in err.value.problem
    assert err.value.path == ("tasks_max",)
    # A class that clashes with an alias names the key that exists, and the alias it meets.
    with pytest.raises(Invalid) as err:
        Record(ScopeSettings).convert({"memory_max": "1G", "resources": {"memory_high": "2G"}})
    assert err.value.path == ("resources", "memory_high")
    assert err.value.problem.endswith("(over scope.memory_max)")


def test_a_class_overrides_the_default_key_by_key() -> None:
    default = parse({"memory_max": "1G", "cpu_weight": 10})
    mine = parse({"memory_max": "2G", "io_weight": 300})
    merged = mine.over(default)
    assert (merged.memory_max, merged.cpu_weight, merged.io_weight) == (2 * 2**30, 10, 300)
    # A class valid alone may clash with the default it lands on: the merge checks again.
    with pytest.raises(Invalid):
        parse({"memory_high": "1500M"}).over(default)
    assert describe(ScopeProperties()) == "default"
    assert describe(merged) == "memory_max 2GiB, cpu_weight 10, io_weight 300"


def test_both_backends_spell_the_same_properties() -> None:
    props = parse(CLASS)
    names = [name for name, _sig, _value in bus_properties(props)]
    spelled = run_properties(props)[1::2]
    assert len(names) == len(CLASS) == len(spelled)
    assert dict(zip(names, (sig for _n, sig, _v in bus_properties(props)), strict=True)) == {
        name: "t" for name in names
    }
    assert "CPUQuota=150%" in spelled and "CPUQuotaPerSecUSec" in names
    assert ("CPUQuotaPerSecUSec", "t", 1_500_000) in bus_properties(props)


# -- real scopes ------------------------------------------------------------------------------

# How `systemctl show` reports each property for CLASS (the manager's own formatting).
EXPECTED = {
    "MemoryHigh": str(48 * 2**20),
    "MemoryMax": str(64 * 2**20),
    "MemorySwapMax": str(16 * 2**20),
    "CPUWeight": "50",
    "CPUQuotaPerSecUSec": "1.500000s",
    "TasksMax": "33",
    "IOWeight": "200",
    "RuntimeMaxUSec": "1h",
}


def _scoper(manager: SystemdManager, backend: BackendKind) -> SystemdScoper:
    env = dict(manager.env)
    env.pop("INVOCATION_ID", None)
    scoper = open_scoper(
        ScopeSettings(backend=backend, resources=parse({"tasks_max": 99, "cpu_weight": 9})),
        policy_from(False, False),
        environ=env,
    )
    assert isinstance(scoper, SystemdScoper)
    return scoper


@pytest.mark.systemd
def test_every_property_reaches_the_scope_through_both_backends(
    systemd_manager: SystemdManager, tmp_path: Path, leak_guard
) -> None:
    reported: dict[str, dict[str, str]] = {}
    # The class overrides the scope default key by key (tasks_max, cpu_weight are the class's).
    # best_effort: the manager records every property even where this host does not enforce
    # it (MemoryHigh= on cgroup v1); what is enforced is doctor's business (test_hierarchy).
    spec = LaunchSpec(
        argv=["sleep", "30"],
        env={"PATH": "/usr/bin:/bin"},
        cwd=str(tmp_path),
        unit_parts=("res",),
        stdout=subprocess.DEVNULL,
        resources=parse({**CLASS, "best_effort": True}),
    )
    for backend in (BackendKind.DBUS, BackendKind.SYSTEMD_RUN):
        scoper = _scoper(systemd_manager, backend)
        try:
            launched = scoper.launch(spec, CallerKind.KANBAN)
            assert launched.placement is Placement.SCOPED and launched.unit
            assert launched.resources is not None and launched.resources.tasks_max == 33
            skipped = [i.key for i in ineffective(launched.resources, scoper.controllers())]
            assert list(launched.ineffective) == skipped
            unit = launched.unit
            wait_for(lambda u=unit: systemd_manager.unit_property(u, "ActiveState") == "active")
            reported[backend.value] = {
                name: systemd_manager.unit_property(unit, name) for name in EXPECTED
            }
            scoper.stop(unit, grace=1.0)
            launched.process.wait(timeout=10)
        finally:
            scoper.close()
    assert reported["dbus"] == reported["systemd-run"] == EXPECTED


def test_a_class_that_clashes_with_the_default_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "scope:\n  resources: {memory_max: 1GiB}\n"
        "cron:\n  jobs:\n    - id: a\n      every: 60\n      command: ['true']\n"
        "      resources:\n        memory_high: 2GiB\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert "config.yaml:9: cron.jobs[0].resources.memory_high" in text, text
    assert "above memory_max 1GiB" in text and "over scope.resources" in text
