"""A host's boot identity from /proc with the standard library alone (no psutil: see
docs/architecture.md, "Dependencies")."""

from __future__ import annotations

from pathlib import Path

from dispatcher.cluster.hosts import host_boot_id
from scope.foundation.procstat import boot_id, boot_time


def test_boot_time_is_the_btime_line_of_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nintr 5 6\nbtime 1767225600\nprocesses 42\n")
    assert boot_time(str(stat)) == 1767225600
    stat.write_text("cpu  1 2 3\n")
    assert boot_time(str(stat)) is None
    stat.write_text("btime soon\n")
    assert boot_time(str(stat)) is None
    assert boot_time(str(tmp_path / "missing")) is None


def test_this_machine_has_a_boot_time_in_the_past() -> None:
    import time

    found = boot_time()
    assert found is not None and 0 < found <= time.time()


def test_without_the_kernels_boot_id_the_boot_time_stands_in(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with_id = host_boot_id(state)
    assert with_id.startswith(f"{boot_id()}/")
    fallback = host_boot_id(state, boot_id_file=tmp_path / "no-boot-id")
    assert fallback.startswith(f"btime-{boot_time()}/")
    # The state dir is part of it either way: a second state dir is a second host.
    assert fallback.split("/")[1] == with_id.split("/")[1]
    assert host_boot_id(tmp_path / "other", boot_id_file=tmp_path / "no-boot-id") != fallback
