"""The config snapshot of the short write commands (issue 26), with the real console command.

Its promises: written after the file validated, private (0600 in a 0700 cache dir), used while
the file is unchanged (a snapshot that says more than the file proves it: a tampered assignee
is accepted), not used once the content changed even at the same size and mtime, nor when it
is corrupt (rebuilt), not ours, writable by others or a symlink, nor with
``DISPATCH_FAST_PATH=0`` (then nothing is written either).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatcher.app import snapshot
from dispatcher.app.database import open_state
from dispatcher.kanban.model import Limits
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.claimant import Claimant
from scope.foundation.digest import sha256_hex
from tests.support.cli import run_dispatch, state_env

CONFIG = "kanban:\n  assignees:\n    alpha: {command: [sh, -c, ':']}\n"


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    config, state = tmp_path / "config.yaml", tmp_path / "state"
    config.write_text(CONFIG)
    env = state_env(tmp_path)
    env.pop("DISPATCH_FAST_PATH", None)
    return config, state, env


def _add(config: Path, state: Path, env: dict[str, str], assignee: str) -> Any:
    return run_dispatch(
        config, state, env, "kanban", "add", "t", "--assignee", assignee, check=False
    )


def _tamper(path: Path, change: dict[str, Any]) -> None:
    """Change the snapshot's facts in place, keeping its key, owner and mode."""
    document = json.loads(path.read_text())
    document["facts"].update(change)
    path.write_text(json.dumps(document))


def _snapshot(config: Path, state: Path) -> Path:
    return snapshot.snapshot_file(state, config)


def test_written_private_and_used_while_the_file_is_unchanged(setup: Any) -> None:
    config, state, env = setup
    assert _add(config, state, env, "alpha").returncode == 0
    path = _snapshot(config, state)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text())["facts"]["assignees"] == ["alpha"]
    _tamper(path, {"assignees": ["alpha", "ghost"]})
    assert _add(config, state, env, "ghost").returncode == 0  # the snapshot, not the file


def test_a_changed_file_is_read_again_even_at_the_same_size_and_mtime(setup: Any) -> None:
    config, state, env = setup
    _add(config, state, env, "alpha")
    path = _snapshot(config, state)
    _tamper(path, {"assignees": ["alpha", "ghost"]})
    before = config.stat()
    config.write_text(CONFIG.replace("alpha", "gamma"))  # same length, same inode
    os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert config.stat().st_size == before.st_size
    refused = _add(config, state, env, "ghost")
    assert refused.returncode == 2 and "no assignee 'ghost'" in refused.stderr
    assert "(gamma)" in refused.stderr  # the file's assignees
    assert json.loads(path.read_text())["facts"]["assignees"] == ["gamma"]  # rebuilt


@pytest.mark.parametrize("damage", ["garbage", "symlink", "group-writable", "foreign"])
def test_an_untrusted_or_corrupt_snapshot_is_ignored(setup: Any, damage: str) -> None:
    config, state, env = setup
    _add(config, state, env, "alpha")
    path = _snapshot(config, state)
    _tamper(path, {"assignees": ["alpha", "ghost"]})
    if damage == "garbage":
        path.write_text('{"format": 1, "facts": [')
    elif damage == "symlink":
        target = path.with_name("elsewhere.json")
        path.rename(target)
        path.symlink_to(target)
    elif damage == "group-writable":
        path.chmod(0o620)
    elif os.geteuid() == 0:
        os.chown(path, 65534, 65534)
    else:
        pytest.skip("needs root to give the snapshot to another user (see the unit test below)")
    refused = _add(config, state, env, "ghost")
    assert refused.returncode == 2 and "no assignee 'ghost'" in refused.stderr
    if damage == "garbage":
        assert json.loads(path.read_text())["facts"]["assignees"] == ["alpha"]  # rebuilt


def test_a_snapshot_in_a_directory_of_another_user_is_not_read(
    setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, state, env = setup
    _add(config, state, env, "alpha")
    assert snapshot.load(state, config) is not None
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 1)
    assert snapshot.load(state, config) is None


def test_bypassed_nothing_is_read_or_written(setup: Any) -> None:
    config, state, env = setup
    off = {**env, "DISPATCH_FAST_PATH": "0"}
    assert _add(config, state, off, "alpha").returncode == 0
    assert not (state / "cache").exists()
    _add(config, state, env, "alpha")
    _tamper(_snapshot(config, state), {"assignees": ["alpha", "ghost"]})
    refused = _add(config, state, off, "ghost")
    assert refused.returncode == 2 and "no assignee 'ghost'" in refused.stderr


def test_a_worker_report_reads_the_snapshot_too(setup: Any) -> None:
    """Inside a worker the report takes ``kanban.transient_block`` from the snapshot."""
    config, state, env = setup
    card = run_dispatch(config, state, env, "kanban", "add", "t", "--assignee", "alpha")
    card_id = card.stdout.strip()
    db = open_state(state)
    try:
        claim = SqliteBoardStore(db).claim(
            card_id, now=1.0, claimer=Claimant.current(), limits=Limits(max_in_progress=1)
        )
    finally:
        db.close()
    assert claim.run is not None
    _tamper(_snapshot(config, state), {"transient_block": 4242.0})
    worker = {**env, "DISPATCH_RUN_ID": claim.run.run_id, "DISPATCH_HOST_ID": "h"}
    words = ["--json", "kanban", "block", card_id, "--kind", "transient", "--reason", "later"]
    blocked = run_dispatch(config, state, worker, *words)
    assert json.loads(blocked.stdout)["status"] == "blocked"
    db = open_state(state)
    try:
        stored = SqliteBoardStore(db).get_card(card_id)
    finally:
        db.close()
    assert stored.blocked_until is not None
    assert stored.blocked_until - stored.updated_at == 4242.0


@pytest.mark.parametrize("builtin", [True, False])
def test_the_digest_is_sha256_with_or_without_the_builtin_module(
    monkeypatch: pytest.MonkeyPatch, builtin: bool
) -> None:
    if not builtin:  # as on a Python built without its own SHA-256: hashlib's
        monkeypatch.setitem(sys.modules, "_sha2", None)
        monkeypatch.setitem(sys.modules, "_sha256", None)
    for data in (b"", b"abc", bytes(range(256)) * 99):
        assert sha256_hex(data) == hashlib.sha256(data).hexdigest()
