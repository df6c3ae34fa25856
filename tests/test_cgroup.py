"""Unit tests for scope.cgroup: mountinfo parsing, /proc/PID/cgroup, cgroup.procs, unit names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scope.cgroup import (
    cgroup2_mount,
    cgroup_procs,
    enclosing_unit,
    leaf_unit,
    own_cgroup,
    parse_mountinfo,
    unescape_mountinfo,
)

# Taken from a Debian 12 host with hybrid cgroups (v1 controllers, cgroup2 at .../unified).
HYBRID = """\
23 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""

# A pure v2 host (systemd as PID 1), with several optional fields before the separator.
PURE_V2 = """\
22 28 0:20 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 22 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 master:1 - cgroup2 cgroup2 \
rw,nsdelegate,memory_recursiveprot
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mountinfo"
    path.write_text(text)
    return path


def test_hybrid_host_finds_unified(tmp_path: Path) -> None:
    assert cgroup2_mount(write(tmp_path, HYBRID)) == Path("/sys/fs/cgroup/unified")


def test_pure_v2_host_with_optional_fields(tmp_path: Path) -> None:
    assert cgroup2_mount(write(tmp_path, PURE_V2)) == Path("/sys/fs/cgroup")
    (entry,) = (e for e in parse_mountinfo(PURE_V2) if e.fstype == "cgroup2")
    assert entry.source == "cgroup2"
    assert entry.super_options == "rw,nsdelegate,memory_recursiveprot"
    assert (entry.mount_id, entry.parent_id, entry.root) == (26, 22, "/")


def test_no_cgroup2_mount(tmp_path: Path) -> None:
    v1_only = "\n".join(line for line in HYBRID.splitlines() if "cgroup2" not in line)
    assert cgroup2_mount(write(tmp_path, v1_only)) is None


def test_octal_escapes_in_mount_point(tmp_path: Path) -> None:
    # A mount point containing " - " must not be mistaken for the separator: the kernel escapes
    # the spaces, so the literal field is "/mnt/a\\040-\\040b".
    text = r"50 31 0:40 / /mnt/a\040-\040b\011c\134d rw - cgroup2 none rw" + "\n"
    assert cgroup2_mount(write(tmp_path, text)) == Path("/mnt/a - b\tc\\d")


def test_unescape_leaves_plain_text() -> None:
    assert unescape_mountinfo("/sys/fs/cgroup") == "/sys/fs/cgroup"
    assert unescape_mountinfo(r"x\040y\012z") == "x y\nz"


def test_whole_hierarchy_preferred_over_subtree_bind(tmp_path: Path) -> None:
    text = (
        "60 31 0:38 /docker/abc /mnt/sub rw - cgroup2 cgroup2 rw\n"
        "61 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    )
    assert cgroup2_mount(write(tmp_path, text)) == Path("/sys/fs/cgroup/unified")


def test_only_a_subtree_bind_is_still_reported(tmp_path: Path) -> None:
    text = "60 31 0:38 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert cgroup2_mount(write(tmp_path, text)) == Path("/sys/fs/cgroup")


def test_later_mount_over_the_same_point_wins(tmp_path: Path) -> None:
    text = (
        "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
        "70 31 0:55 / /sys/fs/cgroup/private rw - cgroup2 cgroup2 rw\n"
    )
    assert cgroup2_mount(write(tmp_path, text)) == Path("/sys/fs/cgroup/private")


@pytest.mark.parametrize(
    "line",
    [
        "41 31 0:38 / /sys/fs/cgroup/unified rw cgroup2 cgroup2 rw",  # no separator
        "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2",  # truncated after it
    ],
)
def test_malformed_lines_are_errors(line: str) -> None:
    with pytest.raises(ValueError, match="mountinfo line 1"):
        parse_mountinfo(line)


def test_blank_lines_ignored() -> None:
    assert len(parse_mountinfo("\n" + HYBRID + "\n\n")) == 6


def test_real_host_mountinfo_parses() -> None:
    entries = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    assert any(e.mount_point == Path("/") for e in entries)


def test_own_cgroup_reads_v2_line(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(
        "9:name=systemd:/init.scope\n1:cpu:/init.scope\n0::/app.slice/run-r1.scope\n"
    )
    assert own_cgroup(42, proc_root=proc) == "/app.slice/run-r1.scope"
    assert own_cgroup("42", proc_root=proc) == "/app.slice/run-r1.scope"


def test_own_cgroup_without_v2_line(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text("1:cpu:/\n")
    with pytest.raises(LookupError, match="no cgroup v2"):
        own_cgroup(7, proc_root=tmp_path)


@pytest.mark.parametrize("bad", ["../1", "1/..", "", "-3", 0, -1, True, "self/.."])
def test_own_cgroup_rejects_non_pids(bad: int | str) -> None:
    with pytest.raises(ValueError, match="not a pid"):
        own_cgroup(bad)


def test_own_cgroup_of_this_process() -> None:
    assert own_cgroup().startswith("/")
    assert own_cgroup(os.getpid()) == own_cgroup()


def test_own_cgroup_of_missing_process() -> None:
    with pytest.raises(OSError):
        own_cgroup(2**22 + 1)  # above the default pid_max of 4194304


def test_cgroup_procs_reads_sorted_pids(tmp_path: Path) -> None:
    unit = tmp_path / "app.slice" / "x.scope"
    unit.mkdir(parents=True)
    (unit / "cgroup.procs").write_text("120\n7\n")
    assert cgroup_procs("/app.slice/x.scope", tmp_path) == [7, 120]


def test_cgroup_procs_empty_file(tmp_path: Path) -> None:
    (tmp_path / "cgroup.procs").write_text("")
    assert cgroup_procs("/", tmp_path) == []


def test_cgroup_procs_missing_cgroup_is_empty(tmp_path: Path) -> None:
    assert cgroup_procs("/app.slice/gone.scope", tmp_path) == []


@pytest.mark.parametrize("bad", ["app.slice/x.scope", "/app.slice/../../etc", "/a\0b"])
def test_cgroup_procs_rejects_paths_leaving_the_mount(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError):
        cgroup_procs(bad, tmp_path)


def test_cgroup_procs_of_own_cgroup_contains_us() -> None:
    if cgroup2_mount() is None:
        pytest.skip("cgroup2 is not mounted here")
    assert os.getpid() in cgroup_procs(own_cgroup())


@pytest.mark.parametrize(
    ("path", "unit"),
    [
        ("/app.slice/run-r1.scope", "run-r1.scope"),
        ("/system.slice/gw.service", "gw.service"),
        ("/user.slice", "user.slice"),
        ("/init.scope", "init.scope"),
        ("/app.slice/run-r1.scope/", "run-r1.scope"),
        ("/", None),
        ("", None),
        ("/gw.service/worker", None),
        ("/x/.service", None),
        ("/some/dir", None),
        ("/a.target", None),
    ],
)
def test_leaf_unit(path: str, unit: str | None) -> None:
    assert leaf_unit(path) == unit


@pytest.mark.parametrize(
    ("path", "unit"),
    [
        ("/system.slice/gw.service/worker", "gw.service"),
        ("/user.slice/user-0.slice/user@0.service/app.slice/x.scope", "x.scope"),
        ("/", None),
        ("/plain/dirs", None),
    ],
)
def test_enclosing_unit(path: str, unit: str | None) -> None:
    assert enclosing_unit(path) == unit
