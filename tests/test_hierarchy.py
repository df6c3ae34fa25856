"""Which class keys take effect: the cgroup layout and the manager's controllers, read from
sample /proc and /sys trees for each layout, and the admission of a class before a launch."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from scope.errors import ClassUnavailable, ScopeUnavailable
from scope.hierarchy import (
    DROP_IN,
    Controllers,
    Layout,
    admit,
    ineffective,
    read_controllers,
    remedies,
)
from scope.resources import ScopeProperties
from scope.warnings import WarnOnce

USER = "/user.slice/user-1000.slice/user@1000.service"

V2_MOUNTS = "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
HYBRID_MOUNTS = (
    "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    "38 31 0:35 / /sys/fs/cgroup/blkio rw - cgroup cgroup rw,blkio\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
)
# Legacy: v1 alone, cpu and cpuacct joined in one hierarchy.
V1_MOUNTS = (
    "40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
)
NO_CGROUPS = "22 1 0:5 / /proc rw - proc proc rw\n"

EVERY = ScopeProperties(
    memory_high=1,
    memory_max=2,
    memory_swap_max=0,
    cpu_weight=5,
    cpu_quota=50.0,
    tasks_max=9,
    io_weight=7,
    runtime_max=60.0,
)


def tree(tmp_path: Path, mounts: str, files: dict[str, str] = {}, dirs: tuple[str, ...] = ()):  # noqa: B006
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "mountinfo").write_text(mounts)
    for name, text in files.items():
        path = tmp_path / "root" / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for name in dirs:
        (tmp_path / "root" / name.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return {"proc": tmp_path / "proc", "root": tmp_path / "root"}


def keys(found) -> dict[str, str | None]:
    return {item.key: item.controller for item in found}


# -- reading the layout and the controllers ----------------------------------------------------


def test_v2_user_manager_gets_what_delegate_hands_down(tmp_path: Path) -> None:
    where = tree(
        tmp_path,
        V2_MOUNTS,
        {
            "/sys/fs/cgroup/cgroup.controllers": "cpuset cpu io memory hugetlb pids rdma\n",
            # Debian's user@.service: Delegate=pids memory cpu (no io).
            f"/sys/fs/cgroup{USER}/cgroup.controllers": "cpu memory pids\n",
        },
    )
    found = read_controllers(USER, system=False, **where)
    assert found.layout is Layout.V2 and found.v2_mount == "/sys/fs/cgroup"
    assert found.usable == {"cpu", "memory", "pids"}
    assert "not delegated" in found.missing["io"]
    assert keys(ineffective(EVERY, found)) == {"io_weight": "io"}
    (fix,) = remedies(ineffective(EVERY, found), found, uid=1000)
    assert DROP_IN in fix and "Delegate=pids memory cpu io" in fix
    assert "systemctl restart user@1000.service" in fix and "; " not in fix


def test_v2_system_manager_uses_every_controller_the_kernel_offers(tmp_path: Path) -> None:
    where = tree(tmp_path, V2_MOUNTS, {"/sys/fs/cgroup/cgroup.controllers": "cpu memory pids\n"})
    found = read_controllers("/", system=True, **where)
    assert found.usable == {"cpu", "memory", "pids"}
    assert "kernel offers no io" in found.missing["io"]
    assert remedies(ineffective(EVERY, found), found, uid=0) == [
        "enable the io controller in the kernel (see /proc/cgroups and cgroup_disable= on the "
        "kernel command line)"
    ]


def test_v2_user_manager_without_any_delegation(tmp_path: Path) -> None:
    where = tree(
        tmp_path,
        V2_MOUNTS,
        {
            "/sys/fs/cgroup/cgroup.controllers": "cpu io memory pids\n",
            f"/sys/fs/cgroup{USER}/cgroup.controllers": "\n",
        },
    )
    found = read_controllers(USER, system=False, **where)
    assert found.usable == frozenset()
    assert set(keys(ineffective(EVERY, found))) == set(EVERY.limits) - {"runtime_max"}


def test_hybrid_uses_v1_where_the_managers_root_exists(tmp_path: Path) -> None:
    # Like this machine's test manager: only the memory hierarchy holds the manager's root.
    where = tree(
        tmp_path,
        HYBRID_MOUNTS,
        {"/sys/fs/cgroup/unified/cgroup.controllers": "hugetlb\n"},
        dirs=("/sys/fs/cgroup/memory/dsd-x", "/sys/fs/cgroup/unified/dsd-x"),
    )
    found = read_controllers("/dsd-x", system=False, **where)
    assert found.layout is Layout.HYBRID and found.v2_mount == "/sys/fs/cgroup/unified"
    assert found.usable == {"memory"}
    assert found.missing["pids"] == (
        "not delegated to the manager (/sys/fs/cgroup/pids/dsd-x is missing)"
    )
    found_keys = keys(ineffective(EVERY, found))
    assert found_keys == {
        "memory_high": None,
        "memory_swap_max": None,
        "cpu_weight": "cpu",
        "cpu_quota": "cpu",
        "tasks_max": "pids",
        "io_weight": "io",
    }
    reasons = {i.key: i.reason for i in ineffective(EVERY, found)}
    assert reasons["memory_high"] == "cgroup v1 (hybrid here) has no MemoryHigh="
    unified, delegate = remedies(ineffective(EVERY, found), found, uid=None)
    assert "systemd.unified_cgroup_hierarchy=1" in unified and "memory_high" in unified
    assert "Delegate=pids memory cpu blkio" in delegate and "logging in again" in delegate


def test_v1_legacy_and_a_joined_cpu_hierarchy(tmp_path: Path) -> None:
    hierarchies = ("systemd", "cpu,cpuacct", "memory", "pids")
    where = tree(tmp_path, V1_MOUNTS, dirs=tuple(f"/sys/fs/cgroup/{h}" for h in hierarchies))
    found = read_controllers("/", system=True, **where)
    assert found.layout is Layout.V1 and found.v2_mount is None
    assert found.usable == {"cpu", "memory", "pids"}
    assert found.missing["io"] == "no cgroup v1 blkio hierarchy is mounted"


def test_no_cgroup_filesystem_at_all(tmp_path: Path) -> None:
    found = read_controllers(None, system=False, **tree(tmp_path, NO_CGROUPS))
    assert found.layout is Layout.NONE and found.usable == frozenset()
    # runtime_max is the manager's own timer: it needs no controller.
    assert "runtime_max" not in keys(ineffective(EVERY, found))
    assert found.to_json()["controllers"] == dict.fromkeys(("memory", "cpu", "io", "pids"), False)


def test_an_unknown_manager_cgroup_makes_nothing_usable(tmp_path: Path) -> None:
    where = tree(tmp_path, V2_MOUNTS, {"/sys/fs/cgroup/cgroup.controllers": "memory\n"})
    found = read_controllers(None, system=False, **where)
    assert found.missing["memory"] == "the manager's cgroup is unknown"


# -- admitting a class -------------------------------------------------------------------------

HYBRID_MEMORY = Controllers(
    layout=Layout.HYBRID,
    usable=frozenset({"memory"}),
    missing={"cpu": "not delegated to the manager (x)"},
    kernel=frozenset({"memory", "cpu", "io", "pids"}),
)


def test_a_class_that_fits_is_admitted_without_a_word(caplog) -> None:
    props = ScopeProperties(memory_max=2**20, runtime_max=5.0)
    assert admit(props, HYBRID_MEMORY, caller="kanban", uid=0, warnings=WarnOnce()) == ()
    assert not caplog.records


def test_a_class_that_cannot_apply_is_refused_with_the_remedy() -> None:
    props = ScopeProperties(memory_max=2**20, cpu_quota=150.0)
    with pytest.raises(ClassUnavailable) as err:
        admit(props, HYBRID_MEMORY, caller="kanban", uid=1000, warnings=WarnOnce())
    assert isinstance(err.value, ScopeUnavailable)  # recorded as spawn_refused
    text = err.value.message
    assert text.startswith("refused to start a kanban worker: its resource class cannot take")
    assert "cpu_quota (no cpu controller for our scopes: not delegated" in text
    assert "Delegate=pids memory cpu blkio" in text and "resources.best_effort: true" in text
    assert "\n" not in text and "memory_max" not in text.partition("; fix")[0]


def test_best_effort_starts_and_warns_once_per_cause(caplog) -> None:
    warnings = WarnOnce(logging.getLogger("test.hierarchy"))
    props = ScopeProperties(memory_high=2**20, cpu_weight=5, best_effort=True)
    with caplog.at_level(logging.WARNING, logger="test.hierarchy"):
        for _ in range(3):
            skipped = admit(props, HYBRID_MEMORY, caller="cron", uid=0, warnings=warnings)
            assert skipped == ("memory_high", "cpu_weight")
        admit(
            ScopeProperties(cpu_weight=5, best_effort=True),
            HYBRID_MEMORY,
            caller="cron",
            uid=0,
            warnings=warnings,
        )
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("cron workers start without memory_high, cpu_weight")
    assert "systemd.unified_cgroup_hierarchy=1" in lines[0]
