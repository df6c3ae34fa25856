"""The placement-latency check behind ``dispatch doctor`` (pure: mountinfo and features text)."""

from __future__ import annotations

from pathlib import Path

from scope.latency import placement_latency, read_placement_latency

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw{extra}
"""
UNIFIED = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate{extra}\n"
FEATURES = "nsdelegate\nfavordynmods\nmemory_localevents\n"


def test_without_the_option_the_remedy_names_the_cgroup2_mount() -> None:
    found = placement_latency(UNIFIED.format(extra=""), FEATURES)
    assert found.state == "off" and found.mounts == ("/sys/fs/cgroup",)
    assert "mounted without favordynmods" in found.detail
    assert found.remedy is not None
    assert "mount -o remount,favordynmods /sys/fs/cgroup " in found.remedy
    assert "cgroup_favordynmods=true" in found.remedy


def test_the_hybrid_layout_remounts_its_cgroup2_mount() -> None:
    found = placement_latency(HYBRID.format(extra=""), FEATURES)
    assert found.state == "off" and found.mounts == ("/sys/fs/cgroup/unified",)
    assert found.remedy and "remount,favordynmods /sys/fs/cgroup/unified " in found.remedy


def test_one_mount_with_the_option_is_enough() -> None:
    # The kernel switches its threadgroup lock for every hierarchy at once.
    for text in (UNIFIED.format(extra=",favordynmods"), HYBRID.format(extra=",favordynmods")):
        found = placement_latency(text, FEATURES)
        assert (found.state, found.remedy) == ("on", None)
    v1_only = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory,favordynmods\n"
    assert placement_latency(v1_only, None).state == "on"


def test_a_kernel_without_the_option_gets_no_remedy() -> None:
    found = placement_latency(UNIFIED.format(extra=""), "nsdelegate\nmemory_localevents\n")
    assert (found.state, found.remedy) == ("unsupported", None)
    assert placement_latency(UNIFIED.format(extra=""), None).state == "unsupported"


def test_nothing_readable_is_unknown_not_an_error() -> None:
    assert placement_latency("", None).state == "unknown"
    assert placement_latency("not a mountinfo line\n", None).state == "unknown"


def test_read_from_files(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(UNIFIED.format(extra=""))
    features = tmp_path / "features"
    features.write_text(FEATURES)
    assert read_placement_latency(mountinfo, features).state == "off"
    assert read_placement_latency(mountinfo, tmp_path / "missing").state == "unsupported"
    assert read_placement_latency(tmp_path / "missing", tmp_path / "missing").state == "unknown"
    doc = read_placement_latency(mountinfo, features).to_json()
    assert set(doc) == {"favordynmods", "mounts", "detail", "remedy"}
