"""``dispatch state migrate`` logic: a single host's SQLite history moves into an empty cluster
database unchanged, a non-empty one is refused, and a failure writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.app.database import open_state
from dispatcher.cluster.board import PgBoardStore
from dispatcher.cluster.database import ClusterDB, ClusterError
from dispatcher.cluster.ledger import PgLedger
from dispatcher.cluster.migrate import migrate
from dispatcher.cron.ledger import Ledger
from dispatcher.cron.records import Kind, Status, Try, dump_tries
from dispatcher.kanban.model import (
    CardChange,
    CardStatus,
    Limits,
    NewCard,
)
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.limits import LimitSpec, Rate
from dispatcher.launch.outbox import Outbox, Route, Subject
from dispatcher.launch.outcome import Outcome, Result
from dispatcher.notify.store import NotifyStore
from dispatcher.tokens.store import TokenStore

pytestmark = pytest.mark.postgres
NOW = 1_800_000_000.0
API = LimitSpec(rate=Rate(starts=1, window=3600))


def _fill(state_dir: Path) -> tuple[str, str]:
    with open_state(state_dir) as db:
        board = SqliteBoardStore(db)
        parent, _ = board.add_card(NewCard(title="parent", assignee="a"), now=NOW)
        child, _ = board.add_card(
            NewCard(title="child", assignee="a", parents=(parent.id,), group="g"), now=NOW
        )
        run = board.claim(
            parent.id,
            now=NOW,
            claimer=Claimant(pid=1, start=1, boot=None),
            limits=Limits(max_in_progress=3, wants=(("api", API),)),
        ).run
        assert run is not None
        done = CardChange(fields={"status": CardStatus.DONE})
        board.close_run(
            run.run_id,
            Result(outcome=Outcome.COMPLETED, exit_code=0),
            lambda c, r: done,
            now=NOW + 1,
        )
        board.set_paused(True)
        ledger = Ledger(db)
        with ledger.transaction() as tx:
            tx.insert(
                fire_key="j@1",
                job_id="j",
                kind=Kind.SCHEDULE,
                nominal_wall="w",
                zone="UTC",
                nominal=NOW,
                decided_at=NOW,
                status=Status.DONE,
                outcome="completed",
                attempt=2,
                attempts=3,
                tries=dump_tries(
                    (
                        Try(attempt=1, outcome=Outcome.FAILED, exit_code=1),
                        Try(attempt=2, outcome=Outcome.COMPLETED, exit_code=0),
                    )
                ),
                retry_reason="no retry needed",
            )
        ledger.set_paused("j", True, NOW, "every attempt failed")
        return parent.id, child.id


def test_history_moves_unchanged(tmp_path: Path, pg_url: str) -> None:
    parent_id, child_id = _fill(tmp_path / "state")
    with open_state(tmp_path / "state") as db, ClusterDB(pg_url) as cluster:
        before = SqliteBoardStore(db)
        queued = Outbox([Route(events=frozenset({"card.done"}), channels=("hook",))])
        with db.write() as conn:  # an undelivered notification moves with the board
            queued.record(conn, "card.done", {"card": {"id": child_id}}, Subject(), 1.0)
        _token, text = TokenStore(db.read, db.write).create("ci", "read", now=NOW)
        result = migrate(db, cluster)
        after = PgBoardStore(cluster)
        # An API token made on the single host is accepted by every host of the cluster.
        assert TokenStore(cluster.read, cluster.write).authenticate(text, now=NOW).name == "ci"
        assert NotifyStore(cluster.read, cluster.write).list() == (
            NotifyStore(db.read, db.write).list()
        )
        assert result.counts == {
            "kanban_cards": 2,
            "kanban_parents": 1,
            "kanban_runs": 1,
            "kanban_events": len(before.events_of(parent_id)) + len(before.events_of(child_id)),
            "cron_fires": 1,
            "cron_jobs": 1,
            "notify_outbox": 1,
            "web_tokens": 1,
            "limit_holds": 1,
        }
        assert result.paused and after.paused()
        for card_id in (parent_id, child_id):
            assert after.get_card(card_id) == before.get_card(card_id)
            assert after.events_of(card_id) == before.events_of(card_id)
            assert after.runs_of(card_id) == before.runs_of(card_id)
        assert after.board_version() == before.board_version()
        assert after.get_card(child_id).group == "g"
        # The rate window's start moved with it (the database clock, moved to NOW, counts it).
        after.shift = lambda: NOW + 60 - __import__("time").time()
        _, tallies = after.limit_tallies((("api", API),), now=NOW + 60)
        assert (tallies["api"].starts, tallies["api"].nth_start) == (1, NOW)
        ledger = PgLedger(cluster)
        assert ledger.job_states() == Ledger(db).job_states()  # the pause reason included
        assert ledger.job_states()["j"].paused_reason == "every attempt failed"
        assert ledger.history() == Ledger(db).history()  # a fire's tries and attempts included
        assert [len(r.tries) for r in ledger.history()] == [2]
        # New events continue after the copied sequence.
        after.edit_card(
            child_id,
            __import__("dispatcher.kanban.model", fromlist=["CardEdit"]).CardEdit(title="x"),
            now=NOW,
        )
        seqs = [e.seq for e in after.events_of(child_id)]
        assert seqs == sorted(set(seqs))
        with pytest.raises(ClusterError, match="already has rows"):
            migrate(db, cluster)


def test_a_failure_writes_nothing(tmp_path: Path, pg_url: str) -> None:
    _fill(tmp_path / "state")
    with open_state(tmp_path / "state") as db, ClusterDB(pg_url) as cluster:
        cluster.migrate()
        with cluster.write(None) as conn:
            # The cron rows are copied last: the board's rows went in before this fails.
            conn.execute("ALTER TABLE cron_jobs ADD CONSTRAINT no_j CHECK (job_id <> 'j')")
        with pytest.raises(ClusterError):
            migrate(db, cluster)
        with cluster.read() as conn:
            assert conn.execute("SELECT count(*) FROM kanban_cards").fetchone()[0] == 0
