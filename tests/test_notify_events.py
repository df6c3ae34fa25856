"""Notifications, the events beyond the basics: OOM kills and deferrals, infrastructure refusals
(once for the board), cron missed and spawn_refused, a host lost and rescued, a rejected reload;
and the delivery guarantees with real processes: serve SIGKILLed mid-delivery delivers after its
restart, and two cluster senders deliver every message, none by both."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.app.database import open_state
from dispatcher.config import parse_config
from dispatcher.cron.records import Kind, Status
from dispatcher.kanban.model import EventKind, NewCard
from dispatcher.kanban.notices import notify_events
from dispatcher.kanban.store import SqlBoardStore, SqliteBoardStore
from dispatcher.launch.outbox import Outbox, Route
from dispatcher.launch.outcome import Outcome
from dispatcher.notify.sender import Sender
from dispatcher.notify.store import NotifyStore
from tests.support.cli import dispatch_argv
from tests.support.wait import wait_for
from tests.test_notify import receiving

NOW = 1_800_000_000.0
ROOT = Path(__file__).resolve().parent.parent


def _routes(*events: str) -> Outbox:
    return Outbox([Route(events=frozenset(events), channels=("hook",))])


def _outbox(db: Any, clustered: bool) -> NotifyStore:
    if clustered:
        return NotifyStore(db.read, lambda: db.write(None), skip_locked=True)
    return NotifyStore(db.read, db.write)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def board(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[SqlBoardStore, Any]]:
    """A board store (SQLite, or PostgreSQL in cluster mode) and its database."""
    if request.param == "sqlite":
        with open_state(tmp_path / "state") as db:
            yield SqliteBoardStore(db), db
    else:
        from dispatcher.cluster.board import PgBoardStore
        from dispatcher.cluster.database import ClusterDB

        with ClusterDB(request.getfixturevalue("pg_url")) as cluster:
            cluster.migrate()
            yield PgBoardStore(cluster), cluster


def test_an_oom_kill_and_a_deferral_are_events_of_their_own() -> None:
    oom = {"outcome": "oom_killed", "error": "killed by the kernel's OOM killer at 64M"}
    assert notify_events(EventKind.FAILED, oom) == ("card.failed", "card.oom_killed")
    assert notify_events(EventKind.FAILED, {"outcome": "failed"}) == ("card.failed",)
    assert notify_events(EventKind.DEFERRED, {"by": "worker", "until": NOW}) == ("card.deferred",)
    events = "notify:\n  channels: {h: {command: [/bin/true]}}\n  rules: [{on: [%s], to: [h]}]\n"
    for name in ("card.oom_killed", "card.deferred"):
        assert parse_config(events % name, "c.yaml").notify.rules[0].on == (name,)


def test_infrastructure_refusals_are_told_once_for_the_board(
    board: tuple[SqlBoardStore, Any],
) -> None:
    store, db = board
    store.outbox = _routes("infrastructure.refusing", "infrastructure.recovered")
    cards = [store.add_card(NewCard(title=f"t{i}", assignee="a"), now=NOW)[0] for i in range(3)]
    refused = {"infrastructure": True, "error": "no user bus"}
    for offset, card in enumerate(cards):
        store.append_event(card.id, EventKind.SPAWN_REFUSED, refused, now=NOW + offset)
    # A refusal that is the worker's own (not infrastructure) starts nothing.
    store.append_event(cards[0].id, EventKind.SPAWN_REFUSED, {"error": "x"}, now=NOW + 5)
    store.append_event(cards[1].id, EventKind.SPAWNED, {}, now=NOW + 6)
    store.append_event(cards[2].id, EventKind.SPAWNED, {}, now=NOW + 7)
    rows = sorted(_outbox(db, False).list(), key=_at)
    assert [r.event for r in rows] == ["infrastructure.refusing", "infrastructure.recovered"]
    start, end = (json.loads(r.body) for r in rows)
    assert (start["since"], start["card_id"], start["error"]) == (NOW, cards[0].id, "no user bus")
    assert (end["since"], end["card_id"]) == (NOW, cards[1].id)
    # A new outage is a new start.
    store.append_event(cards[2].id, EventKind.SPAWN_REFUSED, refused, now=NOW + 9)
    assert len(_outbox(db, False).list()) == 3


def _at(row: Any) -> float:
    return float(row.created_at)


def test_missed_and_refused_cron_fires_are_told(board: tuple[SqlBoardStore, Any]) -> None:
    from dispatcher.cron.changes import FireChange
    from dispatcher.cron.ledger import Ledger

    store, db = board
    if isinstance(store, SqliteBoardStore):
        ledger = Ledger(db)
    else:
        from dispatcher.cluster.ledger import PgLedger

        ledger = PgLedger(db)
    ledger.outbox = _routes("cron.missed", "cron.spawn_refused")
    wall = "2027-01-15T09:00:00"
    with ledger.transaction() as tx:
        tx.insert(
            fire_key=f"nightly@{wall}", job_id="nightly", kind=Kind.SCHEDULE, nominal_wall=wall,
            zone="UTC", nominal=NOW, decided_at=NOW, status=Status.DONE,
            outcome=Outcome.MISSED.value, ended_at=NOW,
        )  # fmt: skip
        claimed = tx.insert(
            fire_key=f"hourly@{wall}", job_id="hourly", kind=Kind.SCHEDULE, nominal_wall=wall,
            zone="UTC", nominal=NOW, decided_at=NOW, status=Status.CLAIMED,
        )  # fmt: skip
    assert claimed is not None
    refused = FireChange(
        status=Status.DONE, outcome=Outcome.SPAWN_REFUSED, error="no user bus", ended_at=NOW + 1
    )
    assert ledger.update(claimed, [Status.CLAIMED], refused)
    rows = sorted(_outbox(db, False).list(), key=_at)
    assert [(r.event, json.loads(r.body)["job"]) for r in rows] == [
        ("cron.missed", "nightly"),
        ("cron.spawn_refused", "hourly"),
    ]
    assert json.loads(rows[1].body)["fire"]["error"] == "no user bus"


@pytest.mark.postgres
def test_a_host_lost_and_rescued_is_told_in_the_rescue_transaction(cluster_db: Any) -> None:
    from dispatcher.cluster.board import HostStamp, PgBoardStore
    from dispatcher.cluster.hosts import Hosts
    from dispatcher.cluster.rescue import Rescuer
    from dispatcher.kanban.model import Limits
    from dispatcher.launch.claimant import Claimant

    shift = [0.0]
    hosts = Hosts(cluster_db, lease_ttl=30.0, shift=lambda: shift[0])
    hosts.join("a", boot_id="boot-a", version="1")
    hosts.join("b", boot_id="boot-b", version="1")
    on_a = PgBoardStore(cluster_db, HostStamp(host_id="a", epoch=1))
    on_b = PgBoardStore(cluster_db, HostStamp(host_id="b", epoch=1))
    on_b.outbox = _routes("host.lost", "host.rescued")
    card, _ = on_a.add_card(NewCard(title="t", assignee="x"), now=NOW)
    me = Claimant(pid=1, start=1, boot=None)
    run = on_a.claim(card.id, now=NOW, claimer=me, limits=Limits(max_in_progress=5)).run
    assert run is not None
    shift[0] = 31.0
    hosts.renew("b", 1)
    assert Rescuer(on_b, hosts, on_b.stamp, heir_claimant="b:1:x").rescue("a", 1, now=NOW + 40)
    rows = {r.event: json.loads(r.body) for r in _outbox(cluster_db, True).list()}
    assert set(rows) == {"host.lost", "host.rescued"}
    assert (rows["host.lost"]["host"], rows["host.lost"]["epoch"]) == ("a", 2)
    assert rows["host.rescued"]["by"] == "b" and rows["host.rescued"]["runs"] == [run.run_id]


# -- real serve processes -------------------------------------------------------------------


class Hang:
    """A port that accepts connections and never answers: a sender posting to it is stuck in
    its delivery until its timeout."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


def _serve(home: Path, config: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, HOME=str(home), PYTHONPATH=str(ROOT))
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "INVOCATION_ID"):
        env.pop(name, None)
    argv = dispatch_argv(config, home / "state", "serve")
    with (home / "serve.err").open("ab") as err:
        return subprocess.Popen(argv, env=env, stderr=err, start_new_session=True)


def _stopped(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    proc.wait(timeout=20)


def _rows(home: Path) -> list[Any]:
    with open_state(home / "state") as db:
        return NotifyStore(db.read, db.write).list()


def test_serve_killed_mid_delivery_delivers_after_its_restart(tmp_path: Path) -> None:
    hang = Hang()
    config = tmp_path / "config.yaml"
    body = (
        "serve:\n  safety_tick: 30s\n"
        "kanban:\n  assignees:\n    a: {command: [sh, -c, 'exit 0']}\n"
        "notify:\n"
        f"  channels: {{hook: {{webhook: {{url: 'http://127.0.0.1:{hang.port}/',"
        " timeout: 60s}}}\n"
        "  rules: [{on: [card.added, reload.rejected], to: [hook]}]\n"
    )
    config.write_text(body)
    with open_state(tmp_path / "state") as db:
        SqliteBoardStore(db).set_paused(True)  # the message is the point, not a worker
    proc = _serve(tmp_path, config)
    try:
        add = dispatch_argv(config, tmp_path / "state", "kanban", "add", "hi", "--assignee", "a")
        env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(ROOT))
        subprocess.run(add, env=env, check=True, capture_output=True)
        # serve claimed the message and is stuck posting it: kill it there.
        wait_for(lambda: _claimed(tmp_path), timeout=20, what="serve's claim of the message")
        _stopped(proc, signal.SIGKILL)
        (row,) = _rows(tmp_path)
        assert (row.state, row.attempts) == ("pending", 0)
        hang.close()
        with receiving() as receiver:
            config.write_text(body.replace(str(hang.port), str(receiver.port)))
            proc = _serve(tmp_path, config)
            wait_for(lambda: receiver.got, timeout=15, what="the delivery after the restart")
            # A rejected reload is told too, through the same outbox.
            config.write_text(config.read_text() + "bogus: 1\n")
            os.kill(proc.pid, signal.SIGHUP)
            wait_for(lambda: len(receiver.got) >= 2, timeout=15, what="reload.rejected")
    finally:
        hang.close()
        _stopped(proc, signal.SIGTERM)
    ids = [json.loads(b)["id"] for _, b in receiver.got]
    events = [json.loads(b)["event"] for _, b in receiver.got]
    assert ids[0] == row.message_id and events == ["card.added", "reload.rejected"]
    assert "bogus" in json.loads(receiver.got[1][1])["error"]


def _claimed(home: Path) -> bool:
    with open_state(home / "state") as db, db.read() as conn:
        found = conn.execute(
            "SELECT count(*) FROM notify_outbox WHERE claimed_until IS NOT NULL"
        ).fetchone()
    return bool(found[0])


@pytest.mark.postgres
def test_two_cluster_senders_deliver_every_message_none_by_both(cluster_db: Any) -> None:
    from dispatcher.cluster.board import PgBoardStore

    with receiving() as receiver:
        text = (
            "notify:\n"
            f"  channels: {{hook: {{webhook: {{url: 'http://127.0.0.1:{receiver.port}/'}}}}}}\n"
            "  rules: [{on: [card.added], to: [hook]}]\n"
        )
        settings = parse_config(text, "c.yaml").notify
        store = PgBoardStore(cluster_db)
        store.outbox = Outbox(settings.routes())
        for i in range(60):
            store.add_card(NewCard(title=f"t{i}", assignee="a"), now=NOW)
        senders = [Sender(_outbox(cluster_db, True), settings) for _ in range(2)]
        counts = [0, 0]

        def drain(index: int) -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(receiver.got) < 60:
                counts[index] += senders[index].tick(NOW + 1)

        threads = [threading.Thread(target=drain, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(40)
    ids = [json.loads(body)["id"] for _, body in receiver.got]
    assert len(ids) == 60 and len(set(ids)) == 60, "a message was lost or delivered twice"
    assert sum(counts) == 60
    assert {r.state for r in _outbox(cluster_db, True).list()} == {"delivered"}
