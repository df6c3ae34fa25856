"""OOM kills as their own outcome: the keeper's cgroup reader, the mapping, and real scopes."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.launch.outcome import Outcome, outcome_of
from dispatcher.launch.resources import human_size, resources_json, resources_text
from registry.abc import Session, SessionState
from registry.keeper.files import ExitRecord
from registry.keeper.program import cgroup_usage
from registry.usage import ResourceClass, Usage, oom_reason
from scope import open_scoper
from scope.abc import CallerKind, Placement, Policy
from scope.resources import ScopeProperties
from scope.settings import ScopeSettings
from tests.support.keepers import START_PATHS, start_path
from tests.support.systemd import SystemdManager
from tests.support.wait import wait_for
from tests.test_registry_support import OWNER, open_registry, request

SESSION = "s_0123456789ab"
UNIT = f"/user.slice/app.slice/dispatch-kanban-c1-{SESSION[2:]}.scope"
V2_MOUNT = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
HYBRID_MOUNTS = (
    "30 25 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    "31 25 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    "32 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
)


def fake_tree(tmp_path: Path, membership: str, mounts: str, files: dict[str, str]) -> Path:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text(membership)
    (tmp_path / "proc" / "self" / "mountinfo").write_text(mounts)
    for name, text in files.items():
        path = tmp_path / "root" / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def read(tree: Path) -> dict[str, object]:
    return cgroup_usage(SESSION, proc=str(tree / "proc"), root=str(tree / "root"))


# -- the keeper's reader over sample files ------------------------------------------------------


def test_v2_counts_oom_kills_and_reads_the_peak(tmp_path: Path) -> None:
    here = f"/sys/fs/cgroup{UNIT}"
    tree = fake_tree(
        tmp_path,
        f"0::{UNIT}\n",
        V2_MOUNT,
        {
            f"{here}/memory.events": "low 0\nhigh 4\nmax 9\noom 2\noom_kill 1\noom_group_kill 0\n",
            f"{here}/memory.peak": "536870912\n",
            f"{here}/memory.max": "536870912\n",
        },
    )
    assert read(tree) == {
        "cgroup": "v2",
        "oom_kills": 1,
        "memory_peak": 512 * 2**20,
        "memory_max": 512 * 2**20,
    }


def test_v2_without_memory_peak_or_limit(tmp_path: Path) -> None:
    here = f"/sys/fs/cgroup{UNIT}"
    files = {
        f"{here}/memory.events": "oom_kill 0\noom_group_kill 3\n",
        f"{here}/memory.max": "max\n",
    }
    tree = fake_tree(tmp_path, f"0::{UNIT}\n", V2_MOUNT, files)
    assert read(tree) == {"cgroup": "v2", "oom_kills": 3, "memory_peak": None, "memory_max": None}


def test_hybrid_falls_back_to_the_v1_memory_controller(tmp_path: Path) -> None:
    here = f"/sys/fs/cgroup/memory{UNIT}"
    membership = f"7:memory:{UNIT}\n1:name=systemd:{UNIT}\n0::{UNIT}\n"
    files = {
        f"{here}/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        f"{here}/memory.max_usage_in_bytes": "67108864\n",
        f"{here}/memory.limit_in_bytes": "67108864\n",
        # The unified hierarchy holds no controllers here: no memory.events.
        f"/sys/fs/cgroup/unified{UNIT}/cgroup.procs": "1\n",
    }
    tree = fake_tree(tmp_path, membership, HYBRID_MOUNTS, files)
    assert read(tree) == {
        "cgroup": "v1",
        "oom_kills": 2,
        "memory_peak": 64 * 2**20,
        "memory_max": 64 * 2**20,
    }


def test_v1_unlimited_is_no_limit(tmp_path: Path) -> None:
    here = f"/sys/fs/cgroup/memory{UNIT}"
    files = {
        f"{here}/memory.oom_control": "oom_kill 0\n",
        f"{here}/memory.limit_in_bytes": "9223372036854771712\n",
    }
    tree = fake_tree(tmp_path, f"7:memory:{UNIT}\n0::{UNIT}\n", HYBRID_MOUNTS, files)
    assert read(tree) == {"cgroup": "v1", "oom_kills": 0, "memory_peak": None, "memory_max": None}


@pytest.mark.parametrize(
    "membership",
    [
        # Our memory cgroup is the parent slice (no limit of our own): its count is not ours.
        f"7:memory:/user.slice\n0::{UNIT}\n",
        # Not our own scope at all (degraded, in_process).
        "7:memory:/system.slice/gw.service\n0::/system.slice/gw.service\n",
    ],
    ids=["shared-memory-cgroup", "not-our-scope"],
)
def test_a_cgroup_not_our_own_is_never_read(tmp_path: Path, membership: str) -> None:
    files = {
        "/sys/fs/cgroup/memory/user.slice/memory.oom_control": "oom_kill 5\n",
        "/sys/fs/cgroup/memory/system.slice/gw.service/memory.oom_control": "oom_kill 5\n",
    }
    assert read(fake_tree(tmp_path, membership, HYBRID_MOUNTS, files)) == {}


# -- the mapping --------------------------------------------------------------------------------

OOM = Usage(oom_kills=1, memory_peak=512 * 2**20, memory_max=512 * 2**20, cgroup="v2")


def test_oom_reason_needs_sigkill_a_count_and_no_kill_of_ours() -> None:
    text = "killed by the kernel's OOM killer at memory_max 512MiB (peak 512MiB)"
    assert oom_reason(exited=True, signal="SIGKILL", exit_code=None, usage=OOM) == text
    # A shell around the worker reports its child's SIGKILL as 137.
    assert oom_reason(exited=True, signal=None, exit_code=137, usage=OOM) == text
    # A registry or operator kill (state killed / timed_out) is never an OOM kill.
    assert oom_reason(exited=False, signal="SIGKILL", exit_code=None, usage=OOM) is None
    assert oom_reason(exited=True, signal="SIGTERM", exit_code=None, usage=OOM) is None
    assert oom_reason(exited=True, signal=None, exit_code=1, usage=OOM) is None
    none = Usage(oom_kills=0, memory_max=1)
    assert oom_reason(exited=True, signal="SIGKILL", exit_code=None, usage=none) is None
    assert oom_reason(exited=True, signal="SIGKILL", exit_code=None, usage=None) is None
    rss_only = Usage(oom_kills=1, max_rss=3 * 2**20)
    assert oom_reason(exited=True, signal="SIGKILL", exit_code=None, usage=rss_only) == (
        "killed by the kernel's OOM killer at memory_max its limit (peak 3MiB)"
    )


def _session(**fields: object) -> Session:
    base: dict[str, object] = {
        "id": SESSION,
        "argv": ("x",),
        "cwd": "/",
        "owner": OWNER,
        "caller": CallerKind.KANBAN,
        "placement": Placement.SCOPED,
        "unit": None,
        "state": SessionState.EXITED,
        "log_path": "/dev/null",
        "signal": "SIGKILL",
    }
    return Session(**{**base, **fields})  # type: ignore[arg-type]


def test_outcome_of_an_oom_kill_and_of_other_kills() -> None:
    result = outcome_of(_session(usage=OOM))
    assert result.outcome is Outcome.OOM_KILLED and not result.infrastructure
    assert result.error and result.error.startswith("killed by the kernel's OOM killer")
    assert outcome_of(_session(usage=Usage())).outcome is Outcome.FAILED
    killed = outcome_of(_session(state=SessionState.KILLED, usage=OOM))
    assert killed.outcome is Outcome.FAILED


def test_the_exit_record_carries_usage_and_tolerates_junk() -> None:
    data = {"state": "exited", "reason": "", "usage": {**OOM.to_json(), "cpu_time": 1.5}}
    record = ExitRecord.from_json(data)
    assert record.usage is not None and record.usage.cpu_time == 1.5
    assert ExitRecord.from_json(record.to_json()).usage == record.usage
    junk = ExitRecord.from_json({"state": "exited", "usage": {"oom_kills": "lots", "cgroup": 7}})
    assert junk.usage == Usage()
    assert ExitRecord.from_json({"state": "exited", "usage": None}).usage is None


def test_a_stored_class_round_trips_and_tolerates_junk() -> None:
    granted = ResourceClass.of(ScopeProperties(memory_max=2**30, cpu_quota=150.0), ("cpu_quota",))
    assert ResourceClass.from_json(granted.to_json()) == granted
    assert granted.describe() == "memory_max 1GiB, cpu_quota 150% (not enforced here: cpu_quota)"
    junk = {"limits": {"memory_max": "x", "nosuch": 5, "tasks_max": 7}, "ineffective": "no"}
    assert ResourceClass.from_json(junk) == ResourceClass(limits={"tasks_max": 7})
    assert ResourceClass.from_json(None) is None and ResourceClass.from_json({}) is None


def test_views_spell_the_class_peak_and_cpu_time() -> None:
    assert [human_size(n) for n in (512, 1536, 47 << 20, 300 << 20, 5 << 30)] == [
        "512B",
        "1.5KiB",
        "47.0MiB",
        "300MiB",
        "5.0GiB",
    ]
    ended = _session(
        usage=Usage(memory_peak=31 << 20, cpu_time=0.42),
        resources=ResourceClass.of(SMALL),
    )
    assert resources_text(ended) == "class memory_max 48MiB; peak 31.0MiB, cpu 0.4s"
    assert resources_json(ended) == {
        "resources": {
            "class": "memory_max 48MiB",
            "limits": {"memory_max": 48 << 20},
            "not_enforced": [],
        },
        "memory_peak": 31 << 20,
        "cpu_time": 0.42,
    }
    running = _session(state=SessionState.RUNNING, signal=None)
    assert resources_text(running) == "" and resources_text(None) == ""
    assert resources_json(None) == {"resources": None, "memory_peak": None, "cpu_time": None}


# -- real scopes --------------------------------------------------------------------------------

# Touches every page (bytes * n writes them), far past the class's memory_max; bounded at
# 512 MiB so a host that does not enforce the limit fails the test instead of running dry.
HOG = "chunks = []\nfor _ in range(32):\n    chunks.append(b'x' * (16 << 20))\n"
SLEEPER = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"
SMALL = ScopeProperties(memory_max=48 * 2**20)


@pytest.fixture(params=START_PATHS)
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Both keeper start paths: the keeper in the scope reads the OOM kill either way."""
    with start_path(request.param) as name:
        yield name


@pytest.mark.systemd
def test_a_worker_past_memory_max_ends_oom_killed_across_a_restart(
    tmp_path: Path, systemd_manager: SystemdManager, leak_guard, path: str
) -> None:
    state = tmp_path / "state"
    scoper = open_scoper(ScopeSettings(), Policy(), environ=systemd_manager.env)
    try:
        # The first registry goes away while the worker runs; the keeper's record outlives it.
        with open_registry(state, scoper, follow=False, cleanup=False) as first:
            session = first.spawn(request([sys.executable, "-I", "-c", HOG], resources=SMALL))
            assert session.placement is Placement.SCOPED
        exit_file = state / "sessions" / session.id / "exit.json"
        wait_for(exit_file.exists, 20, what="the keeper's exit record")
        with open_registry(state, scoper) as second:
            done = second.wait(session.id, timeout=20).snapshot.session
        assert done.state is SessionState.EXITED and done.signal == "SIGKILL"
        assert done.usage is not None and done.usage.oom_kills >= 1
        assert done.usage.memory_max == SMALL.memory_max
        assert done.usage.peak is not None and done.usage.peak >= (SMALL.memory_max or 0) * 0.9
        result = outcome_of(done)
        assert result.outcome is Outcome.OOM_KILLED
        assert result.error and "OOM killer at memory_max 48MiB (peak " in result.error
        assert done.completion_reason == result.error
        assert done.resources == ResourceClass.of(SMALL)
    finally:
        scoper.close()


@pytest.mark.systemd
def test_sigkill_by_a_test_or_by_dispatch_kill_is_never_oom(
    tmp_path: Path, systemd_manager: SystemdManager, leak_guard
) -> None:
    scoper = open_scoper(ScopeSettings(), Policy(), environ=systemd_manager.env)
    try:
        with open_registry(tmp_path / "state", scoper) as registry:
            argv = [sys.executable, "-I", "-c", SLEEPER]
            by_hand = registry.spawn(request(argv, resources=SMALL))
            by_kill = registry.spawn(request(argv, resources=SMALL))
            for started in (by_hand, by_kill):
                wait_for(lambda s=started: b"ready" in registry.read_log(s.id), 10, what="ready")
            assert by_hand.worker_pid is not None
            os.kill(by_hand.worker_pid, signal.SIGKILL)
            hand = registry.wait(by_hand.id, timeout=15).snapshot.session
            assert hand.signal == "SIGKILL" and hand.usage and hand.usage.oom_kills == 0
            assert hand.usage.cpu_time is not None
            assert outcome_of(hand).outcome is Outcome.FAILED
            killed = registry.kill(by_kill.id, grace=0.2).session
            assert killed.state is SessionState.KILLED
            assert outcome_of(killed).outcome is Outcome.FAILED
    finally:
        scoper.close()
