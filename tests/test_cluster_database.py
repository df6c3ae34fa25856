"""The cluster database on real PostgreSQL: schema versions, URLs, secrets, concurrent hosts."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dispatcher.cluster import tables
from dispatcher.cluster.board import PgBoardStore
from dispatcher.cluster.database import (
    ClusterDB,
    ClusterError,
    check_url,
    password_from_file,
    redact,
)
from dispatcher.kanban.abc import ClaimVerdict
from dispatcher.kanban.model import Limits, NewCard
from dispatcher.launch.claimant import Claimant
from scope.foundation.errors import ConfigError

NOW = 1_800_000_000.0


def test_redact_never_shows_a_password() -> None:
    shown = redact("postgresql://alice:s3cret@db.example:5433/board?password=x&sslmode=require")
    assert shown == "postgresql://alice@db.example:5433/board"
    assert "s3cret" not in shown and "password" not in shown


def test_a_url_that_is_not_postgresql_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        check_url("mysql://root:pw@h/db")
    assert err.value.exit_code == 2
    assert "pw" not in err.value.message and "postgresql://" in err.value.message


def test_the_password_file_must_be_private(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("hunter2\n")
    secret.chmod(0o600)
    assert password_from_file(secret) == "hunter2"
    secret.chmod(0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        password_from_file(secret)
    with pytest.raises(ConfigError, match="cannot read"):
        password_from_file(tmp_path / "missing")


@pytest.mark.postgres
def test_migrate_is_idempotent_and_refuses_a_newer_schema(pg_url: str) -> None:
    with ClusterDB(pg_url) as db:
        assert db.migrate() == tables.VERSION
        assert db.migrate() == tables.VERSION
        with db.write(None) as conn:
            conn.execute(
                "INSERT INTO dispatch_schema (version, note) VALUES (?, 'from the future')",
                (tables.VERSION + 1,),
            )
        with pytest.raises(ClusterError, match="newer") as err:
            db.migrate()
        assert err.value.exit_code == 1
        with db.read() as conn:
            count = conn.execute("SELECT count(*) FROM dispatch_schema").fetchone()[0]
        assert count == len(tables.MIGRATIONS) + 1


@pytest.mark.postgres
def test_an_unreachable_server_is_one_clear_error(postgres_server: object) -> None:
    url = "postgresql://nobody:topsecret@127.0.0.1:1/none"
    with ClusterDB(url, connect_timeout=1) as db, pytest.raises(ClusterError) as err:
        db.migrate()
    assert "topsecret" not in err.value.message
    assert "127.0.0.1:1" in err.value.message


@pytest.mark.postgres
def test_hosts_racing_for_one_card_open_one_run(pg_url: str) -> None:
    with ClusterDB(pg_url) as setup:
        setup.migrate()
        card, _ = PgBoardStore(setup).add_card(NewCard(title="t", assignee="a"), now=NOW)
    winners: list[str] = []
    barrier = threading.Barrier(4)

    def host(n: int) -> None:
        # Each "host" has its own pool, as separate serves do.
        with ClusterDB(pg_url, max_size=1) as db:
            barrier.wait(timeout=10)
            claim = PgBoardStore(db).claim(
                card.id,
                now=NOW,
                claimer=Claimant(pid=n, start=n, boot=None),
                limits=Limits(max_in_progress=9),
            )
            if claim.verdict is ClaimVerdict.CLAIMED:
                winners.append(str(n))

    threads = [threading.Thread(target=host, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(winners) == 1


@pytest.mark.postgres
def test_the_cluster_wide_cap_holds_under_concurrent_claims(pg_url: str) -> None:
    with ClusterDB(pg_url) as setup:
        setup.migrate()
        store = PgBoardStore(setup)
        ids = [
            store.add_card(NewCard(title=f"c{i}", assignee="a"), now=NOW)[0].id for i in range(12)
        ]
    barrier = threading.Barrier(3)

    def host(n: int) -> None:
        with ClusterDB(pg_url, max_size=1) as db:
            mine = PgBoardStore(db)
            barrier.wait(timeout=10)
            for card_id in ids:
                mine.claim(
                    card_id,
                    now=NOW,
                    claimer=Claimant(pid=n, start=n, boot=None),
                    limits=Limits(max_in_progress=5),
                )

    threads = [threading.Thread(target=host, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    with ClusterDB(pg_url) as db:
        assert len(PgBoardStore(db).open_runs()) == 5
