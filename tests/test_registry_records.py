"""Registry records as enums and typed changes, with their stored forms unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from registry.abc import Owner, OwnerKind, SessionState
from registry.keeper.files import ExitRecord, SessionDir
from registry.store.changes import FinalFields, Started


def test_known_owner_kinds_become_enum_members_and_print_as_before() -> None:
    owner = Owner(kind="kanban", id="r7")
    assert owner.kind is OwnerKind.KANBAN
    assert str(owner) == "kanban:r7" and Owner.parse("kanban:r7") == owner
    assert Owner.parse("cli:alice:42").kind is OwnerKind.CLI
    other = Owner(kind="bench", id="b1")
    assert other.kind == "bench" and not isinstance(other.kind, OwnerKind)
    assert json.dumps({"kind": owner.kind}) == '{"kind": "kanban"}'


def test_exit_record_state_is_an_enum_and_its_file_is_unchanged(tmp_path: Path) -> None:
    sdir = SessionDir(tmp_path)
    record = ExitRecord(
        state=SessionState.KILLED,
        exit_code=None,
        signal="SIGKILL",
        reason="killed by request (SIGKILL)",
        started_at=1.0,
        finished_at=2.0,
        writer="registry",
    )
    sdir.write_exit(record)
    assert json.loads(sdir.exit.read_text())["state"] == "killed"
    again = sdir.read_exit()
    assert again is not None and again.state is SessionState.KILLED
    # A record from a keeper that knows a state we do not reads as a plain exit.
    odd = ExitRecord.from_json({"state": "vanished_into_thin_air", "exit_code": 0})
    assert odd.state is SessionState.EXITED


def test_changes_name_their_columns() -> None:
    first = Started(worker_pid=5, worker_start=9, started_at=1.5, keeper_pid=4, keeper_start=8)
    assert first.columns() == {
        "worker_pid": 5,
        "worker_start": 9,
        "started_at": 1.5,
        "keeper_pid": 4,
        "keeper_start": 8,
    }
    assert "keeper_pid" not in Started(worker_pid=5, worker_start=9, started_at=1.5).columns()
    final = FinalFields(
        state=SessionState.EXITED,
        exit_code=0,
        signal=None,
        finished_at=3.0,
        completion_reason="exited with code 0",
        total_bytes=10,
        dropped_bytes=0,
    )
    assert "started_at" not in final.columns()
    assert final.columns()["state"] is SessionState.EXITED
