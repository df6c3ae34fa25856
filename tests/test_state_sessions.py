"""A damaged session directory makes that one session ``lost`` with a reason; the others and
the files of the damaged one are left as they were (`ps`, `logs`, `wait`, adoption)."""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from registry.keeper.files import SessionDir
from tests.support.cli import dispatch_text as dispatch
from tests.support.cli import state_env
from tests.support.wait import wait_for
from tests.test_registry_support import open_registry, request, session_pids


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return state_env(tmp_path)


@pytest.fixture
def stop_flag(tmp_path: Path) -> Iterator[Path]:
    """Workers run until this file exists; created at the end so none outlives the test."""
    flag = tmp_path / "stop"
    yield flag
    flag.touch()


def spawn(state: Path, argv: list[str]) -> SessionDir:
    with open_registry(state, follow=False, cleanup=False) as registry:
        session = registry.spawn(request(argv))
    sdir = SessionDir(Path(session.log_path).parent)
    wait_for(sdir.keeper.exists, 10, what="keeper.json")
    return sdir


def ended(state: Path) -> SessionDir:
    """A session that ended while no registry watched it, so its stored state is still
    ``running`` and the next reader takes its end from the exit record (a worker that ended
    during ``spawn`` could be recorded by the spawning registry before the damage is done)."""
    gate = state.parent / f"gate-{os.urandom(4).hex()}"
    sdir = spawn(state, ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done; echo done"])
    gate.touch()
    wait_for(sdir.has_exit, 10, what="exit record")
    return sdir


def sessions(env: dict[str, str]) -> dict[str, dict[str, object]]:
    done = dispatch(env, "ps", "--all", "--json")
    assert done.returncode == 0, done.stderr
    return {item["id"]: item for item in json.loads(done.stdout)}


def snapshot(path: Path) -> dict[str, tuple[int, int, int, bytes | None]]:
    out = {}
    for entry in sorted(path.iterdir()):
        info = entry.lstat()
        data = entry.read_bytes() if entry.is_file() else None
        out[entry.name] = (info.st_uid, info.st_mode, info.st_size, data)
    return out


DAMAGE: dict[str, tuple[Callable[[SessionDir], None], str]] = {
    "garbage exit record": (lambda d: d.exit.write_bytes(b"\x00\xffgarbage"), "not JSON"),
    "truncated exit record": (
        lambda d: d.exit.write_bytes(d.exit.read_bytes()[:20]),
        "truncated",
    ),
    "exit record of the wrong shape": (lambda d: d.exit.write_text('{"a": 1}'), "lacks"),
    "group-writable directory": (lambda d: os.chmod(d.path, 0o770), "writable by group"),
    "world-writable exit record": (lambda d: os.chmod(d.exit, 0o666), "writable by group"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_finished_session_is_lost_and_the_others_carry_on(
    kind: str, env: dict[str, str], state: Path
) -> None:
    damage, words = DAMAGE[kind]
    good = ended(state)
    bad = ended(state)
    damage(bad)
    before = snapshot(bad.path)
    listed = sessions(env)
    lost = listed[bad.path.name]
    assert lost["state"] == "lost", lost
    assert words in str(lost["completion_reason"]) and str(bad.path) in str(
        lost["completion_reason"]
    )
    assert listed[good.path.name]["state"] == "exited"
    assert snapshot(bad.path) == before  # nothing in the damaged directory was touched
    waited = dispatch(env, "wait", bad.path.name, "--timeout", "5")
    assert waited.returncode == 1 and "lost" in waited.stdout + waited.stderr


def test_missing_log_of_a_running_session(
    env: dict[str, str], state: Path, stop_flag: Path
) -> None:
    loop = ["sh", "-c", f"while [ ! -e {stop_flag} ]; do sleep 0.05; done"]
    good = spawn(state, loop)
    bad = spawn(state, loop)
    bad.log.unlink()
    listed = sessions(env)
    assert listed[good.path.name]["state"] == "running"
    lost = listed[bad.path.name]
    assert lost["state"] == "lost" and "output log missing" in str(lost["completion_reason"])
    assert not bad.has_exit()  # no record written into a damaged directory
    logs = dispatch(env, "logs", bad.path.name)
    assert logs.returncode == 1
    (line,) = logs.stderr.strip().splitlines()
    assert "output log" in line and str(bad.log) in line
    assert session_pids(bad.path.name)  # its processes were not touched either
    stop_flag.touch()
    wait_for(lambda: not session_pids(bad.path.name), 10, what="worker ends on the flag")
    waited = dispatch(env, "wait", good.path.name, "--timeout", "10")
    assert waited.returncode == 0, waited.stderr


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_foreign_owned_session_is_lost_on_adoption(state: Path, stop_flag: Path) -> None:
    loop = ["sh", "-c", f"while [ ! -e {stop_flag} ]; do sleep 0.05; done"]
    good = spawn(state, loop)
    bad = spawn(state, loop)
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(bad.path, nobody, nobody)
    before = snapshot(bad.path)
    with open_registry(state, follow=True, cleanup=False) as registry:
        adopted = {s.id: s for s in registry.adopt()}
        assert adopted[bad.path.name].state.value == "lost"
        assert "owned by uid" in (adopted[bad.path.name].completion_reason or "")
        assert registry.get(good.path.name).state.value == "running"
        assert snapshot(bad.path) == before  # nothing written into the foreign directory
        assert session_pids(bad.path.name)  # and its processes were not signalled
        stop_flag.touch()
        registry.wait(good.path.name, timeout=10)
        assert registry.get(good.path.name).state.value == "exited"
