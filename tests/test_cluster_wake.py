"""LISTEN/NOTIFY wake-ups on a real PostgreSQL: a board change wakes another host at once, a
dead LISTEN connection is noticed by the self-ping, and a server restart is survived."""

from __future__ import annotations

import threading
import time

import pytest

from dispatcher.cluster.board import PgBoardStore
from dispatcher.cluster.database import ClusterDB
from dispatcher.cluster.wake import Listener
from dispatcher.kanban.model import NewCard
from tests.support.postgres import PostgresServer
from tests.support.wait import wait_for

pytestmark = pytest.mark.postgres


@pytest.fixture
def db(cluster_db: ClusterDB) -> ClusterDB:
    return cluster_db


class Wakes:
    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.count += 1


def test_a_card_added_elsewhere_wakes_the_listener(db: ClusterDB, pg_url: str) -> None:
    wakes = Wakes()
    listener = Listener(db, wakes, ping_every=60)
    listener.start()
    try:
        assert listener.connected.wait(10)
        wait_for(lambda: wakes.count >= 1, timeout=5, what="the start-up wake")
        before = wakes.count
        with ClusterDB(pg_url) as other:
            started = time.monotonic()
            PgBoardStore(other).add_card(NewCard(title="t", assignee="a"), now=0.0)
        wait_for(lambda: wakes.count > before, timeout=5, what="a wake for the new card")
        assert time.monotonic() - started < 1.0
    finally:
        listener.stop()


def test_a_silent_connection_is_replaced(db: ClusterDB) -> None:
    wakes = Wakes()
    listener = Listener(db, wakes, ping_every=0.2, ping_timeout=0.5, retry=0.1)
    listener.start()
    try:
        assert listener.connected.wait(10)
        # Kill the listener's backend from the server side; the client is not told at once.
        with db.read() as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'dispatch-listen'"
            )
        wait_for(lambda: listener.connects >= 2, timeout=10, what="a reconnect")
        assert listener.connected.wait(10)
    finally:
        listener.stop()


def test_a_server_restart_is_survived(
    db: ClusterDB, pg_url: str, postgres_server: PostgresServer
) -> None:
    wakes = Wakes()
    listener = Listener(db, wakes, ping_every=0.5, ping_timeout=1.0, retry=0.2)
    listener.start()
    try:
        assert listener.connected.wait(10)
        postgres_server.restart()
        wait_for(lambda: listener.connects >= 2, timeout=20, what="a reconnect after restart")
        before = wakes.count
        wait_for(
            lambda: _add(pg_url) and wakes.count > before, timeout=20, what="a wake after restart"
        )
    finally:
        listener.stop()


def _add(url: str) -> bool:
    try:
        with ClusterDB(url, connect_timeout=2) as other:
            PgBoardStore(other).add_card(NewCard(title="t", assignee="a"), now=0.0)
    except Exception:
        return False
    return True
