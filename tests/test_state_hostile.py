"""A state dir that could run foreign code is refused (ssh's strict modes), and the cached keeper
bytecode is verified against what was compiled before every use."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from registry.keeper.start import KEEPER_SCRIPT, keeper_command
from registry.store.database import UnsafeStatePath
from tests.support.cli import dispatch_text as dispatch
from tests.support.cli import state_env

ROOT_ONLY = pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return state_env(tmp_path)


def one_line_refusal(done: subprocess.CompletedProcess[str], path: Path, fix: str) -> None:
    assert done.returncode == 1, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(path) in lines[0] and fix in lines[0] and "Traceback" not in done.stderr
    assert done.stdout == ""


def planted(tmp_path: Path) -> tuple[Path, Path]:
    """A marker path and a bytecode file that creates it when run."""
    marker = tmp_path / "pwned"
    source = tmp_path / "evil.py"
    source.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    import py_compile

    compiled = Path(py_compile.compile(str(source), cfile=str(tmp_path / "evil.pyc")))
    return marker, compiled


def cached_keeper(state: Path) -> Path:
    argv = keeper_command(sys.executable, state / "cache")
    return Path(argv[-1])


@ROOT_ONLY
def test_foreign_owned_state_dir_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(state, nobody, nobody)
    done = dispatch(env, "run", "--", "true")
    one_line_refusal(done, state, "chown")
    assert "owned by nobody" in done.stderr
    assert os.listdir(state) == []  # nothing created, nothing run


def test_group_writable_cache_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert dispatch(env, "run", "--wait", "--", "true").returncode == 0
    os.chmod(state / "cache", 0o770)
    done = dispatch(env, "run", "--", "true")
    one_line_refusal(done, state / "cache", "chmod 700")
    assert not (state / "sessions").exists() or len(os.listdir(state / "sessions")) == 1


def test_group_writable_state_dir_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    one_line_refusal(dispatch(env, "ps"), state, "chmod 700")


def test_symlinked_cache_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (state / "cache").symlink_to(elsewhere)
    done = dispatch(env, "run", "--", "true")
    one_line_refusal(done, state / "cache", "rm")
    assert os.listdir(elsewhere) == []


def test_swapped_bytecode_is_rebuilt_not_run(env: dict[str, str], tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert dispatch(env, "run", "--wait", "--", "true").returncode == 0
    target = cached_keeper(state)
    marker, evil = planted(tmp_path)
    os.replace(evil, target)
    os.chmod(target, 0o600)
    done = dispatch(env, "run", "--wait", "--", "sh", "-c", "echo fine")
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    assert "does not match" in done.stderr
    rebuilt = cached_keeper(state)
    assert rebuilt == target and b"evil" not in target.read_bytes()


@ROOT_ONLY
def test_foreign_owned_bytecode_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    """The reported attack: the cached keeper replaced by other bytecode owned by nobody."""
    state = tmp_path / "state"
    assert dispatch(env, "run", "--wait", "--", "true").returncode == 0
    target = cached_keeper(state)
    marker, evil = planted(tmp_path)
    os.replace(evil, target)
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(target, nobody, nobody)
    done = dispatch(env, "run", "--", "true")
    one_line_refusal(done, target, "chown")
    assert not marker.exists()


@pytest.mark.parametrize("which", ["bytecode", "record"])
def test_a_symlinked_bytecode_or_record_is_refused(tmp_path: Path, which: str) -> None:
    cache = tmp_path / "cache"
    target = Path(keeper_command(sys.executable, cache)[-1])
    path = target if which == "bytecode" else target.with_name(target.name + ".sha256")
    elsewhere = tmp_path / "elsewhere"
    os.replace(path, elsewhere)
    path.symlink_to(elsewhere)
    with pytest.raises(UnsafeStatePath, match="is not a regular file") as caught:
        keeper_command(sys.executable, cache)
    assert str(path) in str(caught.value) and f"rm {path}" in str(caught.value)


def test_keeper_command_checks_before_every_use(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = keeper_command(sys.executable, cache)
    target = Path(first[-1])
    assert target.parent == cache and target.suffix == ".pyc"
    record = target.with_name(target.name + ".sha256")
    assert oct(record.stat().st_mode & 0o777) == "0o600"
    original = target.read_bytes()
    target.write_bytes(original + b"\0")  # same owner, other content
    again = keeper_command(sys.executable, cache)
    assert again == first and target.read_bytes() == original
    os.chmod(target, 0o666)
    with pytest.raises(UnsafeStatePath, match="writable by group or others"):
        keeper_command(sys.executable, cache)
    os.chmod(target, 0o600)
    os.chmod(cache, 0o775)
    with pytest.raises(UnsafeStatePath, match="chmod 700"):
        keeper_command(sys.executable, cache)
    os.chmod(cache, 0o700)
    assert keeper_command(sys.executable, cache) == first
    assert KEEPER_SCRIPT.exists()


def test_a_new_keeper_source_is_compiled_at_the_next_spawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hashes are skipped while every file is the one last compared; an upgraded source
    # (another file at the same path) is noticed at the next spawn all the same.
    import registry.keeper.start as start

    source = tmp_path / "program.py"
    source.write_bytes(KEEPER_SCRIPT.read_bytes())
    monkeypatch.setattr(start, "KEEPER_SCRIPT", source)
    cache = tmp_path / "cache"
    first = keeper_command(sys.executable, cache)
    assert keeper_command(sys.executable, cache) == first
    source.write_bytes(KEEPER_SCRIPT.read_bytes() + b"\n# upgraded\n")
    upgraded = keeper_command(sys.executable, cache)
    assert upgraded != first and Path(upgraded[-1]).exists()
    assert not Path(first[-1]).exists()  # the old bytecode was cleared away
