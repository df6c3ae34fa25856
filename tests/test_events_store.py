"""The event table on real SQLite: ids, sequence numbers, acknowledgement, bounds, migration."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from registry.abc import EventType, Owner, Session, SessionState
from registry.store.database import Component, Migration, StateDB
from registry.store.events import EventDraft, EventStore
from registry.store.sessions import HeartbeatMark, SessionStore
from registry.store.tables import COMPONENT, V1_SCHEMA
from scope.abc import CallerKind, Placement

ALICE = Owner(kind="cli", id="alice:1")
BOB = Owner(kind="kanban", id="r7")


def session(sid: str, owner: Owner = ALICE, *, notify: bool = True) -> Session:
    return Session(
        id=sid,
        argv=("true",),
        cwd="/",
        owner=owner,
        caller=CallerKind.CLI,
        placement=Placement.IN_PROCESS,
        unit=None,
        state=SessionState.RUNNING,
        log_path=f"/nowhere/{sid}.log",
        notify=notify,
    )


def open_store(path: Path, **limits: int) -> SessionStore:
    db = StateDB.in_dir(path, [COMPONENT])
    return SessionStore(
        db,
        EventStore(
            db,
            max_pending=limits.get("max_pending", 100),
            max_unacked=limits.get("max_unacked", 1000),
        ),
    )


def add(store: SessionStore, sid: str, owner: Owner = ALICE) -> None:
    store.insert(session(sid, owner), dir="/nowhere", created_at=1.0, output_chars=None)


def heartbeat(store: SessionStore, sid: str) -> str:
    event = store.publish(sid, EventDraft(type=EventType.HEARTBEAT, output="x"), now=2.0)
    assert event is not None
    return event.id


def test_ids_sequences_and_idempotent_ack(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    add(store, "s_000000000001")
    add(store, "s_000000000002")
    first = store.publish("s_000000000001", EventDraft(type=EventType.HEARTBEAT), now=1.0)
    second = store.publish("s_000000000001", EventDraft(type=EventType.HEARTBEAT), now=2.0)
    other = store.publish("s_000000000002", EventDraft(type=EventType.HEARTBEAT), now=3.0)
    assert first and second and other
    assert (first.seq, second.seq, other.seq) == (1, 2, 1)
    assert len({first.id, second.id, other.id}) == 3
    assert all(e.id.startswith("e_") and len(e.id) == 18 for e in (first, second, other))
    assert first.position < second.position < other.position
    result = store.events.ack([first.id, first.id, "e_nope"], now=5.0)
    assert result.acked == (first.id,) and result.unknown == ("e_nope",)
    again = store.events.ack([first.id], now=6.0)
    assert again.acked == () and again.already == (first.id,)
    pending = store.events.list()
    assert [e.id for e in pending] == [second.id, other.id]
    everything = store.events.list(include_acked=True)
    assert everything[0].acked_at == 5.0  # the second ack changed nothing


def test_routing_by_owner_exact_and_prefix(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    add(store, "s_000000000001", ALICE)
    add(store, "s_000000000002", BOB)
    add(store, "s_000000000003", Owner(kind="cli", id="alicex"))
    for sid in ("s_000000000001", "s_000000000002", "s_000000000003"):
        heartbeat(store, sid)
    assert [e.session_id for e in store.events.list(owner=ALICE)] == ["s_000000000001"]
    assert [e.session_id for e in store.events.list(owner="cli:alice")] == ["s_000000000001"]
    assert len(store.events.list(owner="cli")) == 2
    assert [e.owner for e in store.events.list(owner="kanban:r7")] == [BOB]


def test_guarded_publish_writes_nothing_when_the_guard_fails(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    add(store, "s_000000000001")
    draft = EventDraft(type=EventType.HEARTBEAT)
    assert store.publish("s_000000000001", draft, now=1.0, emitter="someone") is None
    late = HeartbeatMark(since=5, offset=9, at=1.0)
    assert store.publish("s_000000000001", draft, now=1.0, mark=late) is None
    assert store.publish("s_nosuchsessio", draft, now=1.0) is None
    assert store.events.list() == []
    mark = HeartbeatMark(since=0, offset=9, at=1.0)
    event = store.publish("s_000000000001", draft, now=1.0, mark=mark)
    assert event is not None and event.seq == 1
    stored = store.get("s_000000000001")
    assert stored is not None and stored.hb_offset == 9


def test_oldest_acknowledged_go_first_and_the_hard_cap_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(tmp_path, max_pending=10, max_unacked=12)
    add(store, "s_000000000001")
    ids = [heartbeat(store, "s_000000000001") for _ in range(10)]
    store.events.ack(ids[:3], now=1.0)
    more = [heartbeat(store, "s_000000000001") for _ in range(3)]
    remaining = {e.id for e in store.events.list(include_acked=True)}
    assert remaining == set(ids[3:] + more)  # the three acknowledged ones made room
    with caplog.at_level(logging.WARNING, logger="dispatch.registry"):
        extra = [heartbeat(store, "s_000000000001") for _ in range(5)]
    kept = [e.id for e in store.events.list()]
    assert len(kept) == 12  # beyond the hard cap the oldest unacknowledged go, loudly
    assert kept[-5:] == extra
    assert "unacknowledged" in caplog.text and "registry.max_unacked_events" in caplog.text
    # Sequence numbers keep counting after trimming.
    assert store.events.list()[-1].seq == 18


def test_a_v1_database_upgrades_and_keeps_its_sessions(tmp_path: Path) -> None:
    old = Component(name="registry", migrations=[Migration(version=1, apply=V1_SCHEMA)])
    with StateDB.in_dir(tmp_path, [old]) as db, db.write() as conn:
        conn.execute(
            "INSERT INTO registry_sessions (id, argv, cwd, owner_kind, owner_id, caller,"
            " placement, state, dir, log_path, created_at) VALUES ('s_aaaaaaaaaaaa',"
            " '[\"true\"]', '/', 'cli', 'x', 'cli', 'in_process', 'exited', '/d', '/d/l', 1)"
        )
    store = open_store(tmp_path)
    stored = store.get("s_aaaaaaaaaaaa")
    assert stored is not None
    assert stored.session.state is SessionState.EXITED
    assert stored.session.notify is False and stored.session.watch == ()
    assert store.db.versions()["registry"] == COMPONENT.latest
    with pytest.raises(sqlite3.IntegrityError), store.db.write() as conn:  # one (session, seq)
        for _ in range(2):
            conn.execute(
                "INSERT INTO registry_events (id, session_id, seq, type, owner, created_at)"
                " VALUES (hex(randomblob(8)), 's_aaaaaaaaaaaa', 1, 'heartbeat', 'cli:x', 1)"
            )


def test_update_and_get_changes_the_row_and_reads_it_back_in_one_go(tmp_path: Path) -> None:
    from registry.store.sessions import Started

    store = open_store(tmp_path)
    add(store, "s_000000000001")
    change = Started(worker_pid=4242, worker_start=77, started_at=3.5)
    updated = store.update_and_get("s_000000000001", change)
    assert updated is not None and updated == store.get("s_000000000001")
    assert (updated.session.worker_pid, updated.session.worker_start) == (4242, 77)
    assert updated.session.started_at == 3.5 and updated.session.keeper_pid is None
    assert store.update_and_get("s_00000000dead", change) is None
