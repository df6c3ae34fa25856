"""`dispatch kanban` commands that need no worker: add/list/show/edit/move/pause, the worker
fences, and bad input (exit 2, one line, the database unchanged)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.app.database import open_state
from dispatcher.cli.main import main
from dispatcher.kanban.lookup import resolve_session_id
from dispatcher.kanban.model import (
    CardChange,
    CardStatus,
    Limits,
)
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.outcome import Outcome, Result
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parent.parent

REPORT = f"{sys.executable} -m dispatcher.cli.main kanban complete --result from-worker && exit 3"
DEFER = (
    f"{sys.executable} -m dispatcher.cli.main kanban defer --for 1h --reason 'rate limited'"
    " && exit 3"
)
# Fails twice (exit 1), then exits 2 for a title ending in "usage", else succeeds.
FLAKY = (
    'n=$(cat \\"$DISPATCH_CARD_TITLE\\" 2>/dev/null || echo 0); n=$((n+1)); '
    'echo $n > \\"$DISPATCH_CARD_TITLE\\"; case $DISPATCH_CARD_TITLE in *usage) exit 2;; esac; '
    "test $n -ge 3"
)
# degrade_without_scope: a test runner inside a systemd service must still start workers.
CONFIG = f"""
kanban:
  degrade_without_scope: true
  assignees:
    echo:
      command: ["sh", "-c", "echo hi $DISPATCH_CARD_TITLE"]
    other:
      command: ["true"]
    sleeper:
      command: ["sleep", "30"]
    slow:
      command: ["sleep", "30"]
      timeout: 1s
    missing:
      command: ["/nonexistent/worker-binary"]
      retry: {{backoff: {{initial: 0s, max: 0s}}}}   # re-run at once: the test counts two tries
    reporter:
      command: ["sh", "-c", "{REPORT}"]
    deferrer:
      command: ["sh", "-c", "{DEFER}"]
    flaky:
      command: ["sh", "-c", "{FLAKY}"]
      retry:
        attempts: 4
        backoff: {{initial: 300ms, factor: 2, max: 10m, jitter: none}}
        rules: [{{exit_codes: ["2", "64-77"], action: fail}}]
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "config.yaml").write_text(CONFIG)
    return tmp_path


class Cli:
    def __init__(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.home = home
        self.capsys = capsys

    def __call__(self, *argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(
            [
                "--config",
                str(self.home / "config.yaml"),
                "--state-dir",
                str(self.home / "state"),
                *argv,
            ],
            environ={"HOME": str(self.home), **(env or {})},
        )
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str) -> object:
        code, out, err = self(*argv, "--json")
        assert code == 0, err
        return json.loads(out)

    def add(self, title: str = "t", *extra: str) -> str:
        code, out, err = self("kanban", "add", title, "--assignee", "echo", *extra)
        assert code == 0, err
        return out.strip()

    def dump(self) -> list[str]:
        conn = sqlite3.connect(self.home / "state" / "state.db")
        try:
            return [line for line in conn.iterdump() if "kanban" in line]
        finally:
            conn.close()


@pytest.fixture
def cli(home: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(home, capsys)


def test_add_prints_the_id_and_json(cli: Cli) -> None:
    card_id = cli.add("First")
    assert card_id.startswith("c_")
    doc = cli.json("kanban", "add", "Second", "--assignee", "echo", "--priority", "4")
    assert isinstance(doc, dict) and set(doc) == {"id"} and doc["id"] != card_id
    cards = cli.json("kanban", "list")
    assert isinstance(cards, list)
    assert [c["title"] for c in cards] == ["Second", "First"]
    assert cards[0]["priority"] == 4 and cards[0]["status"] == "ready"
    assert cards[0]["created_at"].endswith(("+00:00", "Z")) or "+" in cards[0]["created_at"]


def test_idempotency_key_repeats_return_the_same_id(cli: Cli) -> None:
    first = cli.add("x", "--idempotency-key", "job-1")
    again = cli.add("y", "--idempotency-key", "job-1")
    assert first == again
    assert len(cli.json("kanban", "list")) == 1  # type: ignore[arg-type]


def test_body_file_parents_and_show(cli: Cli, home: Path) -> None:
    parent = cli.add("parent")
    (home / "body.txt").write_text("do the thing\n")
    code, out, _ = cli(
        "kanban",
        "add",
        "child",
        "--assignee",
        "echo",
        "--body-file",
        str(home / "body.txt"),
        "--parent",
        parent[:6],
    )
    assert code == 0
    child = out.strip()
    doc = cli.json("kanban", "show", child[:7])
    assert isinstance(doc, dict)
    assert doc["status"] == "todo" and doc["parents"] == [parent]
    assert doc["body"] == "do the thing\n"
    assert doc["runs"] == [] and [e["kind"] for e in doc["events"]] == ["created"]
    assert isinstance(doc["events"][0]["id"], str)
    code, out, _ = cli("kanban", "show", child)
    assert code == 0 and "do the thing" in out


def test_edit_move_unblock_archive(cli: Cli) -> None:
    card_id = cli.add()
    code, _, err = cli("kanban", "edit", card_id, "--title", "new", "--assignee", "other")
    assert code == 0, err
    doc = cli.json("kanban", "show", card_id)
    assert isinstance(doc, dict) and doc["title"] == "new" and doc["assignee"] == "other"
    assert cli("kanban", "move", card_id, "blocked")[0] == 0
    doc = cli.json("kanban", "show", card_id)
    assert isinstance(doc, dict) and doc["block_kind"] == "needs_input"
    assert cli("kanban", "unblock", card_id)[0] == 0
    assert cli("kanban", "archive", card_id)[0] == 0
    assert cli.json("kanban", "list") == []
    archived = cli.json("kanban", "list", "--all")
    assert isinstance(archived, list) and archived[0]["status"] == "archived"


def test_pause_and_resume_are_stored(cli: Cli) -> None:
    assert cli("kanban", "pause")[1].strip() == "claiming paused"
    code, out, _ = cli("kanban", "board")
    assert code == 0 and "PAUSED" in out
    assert cli.json("kanban", "resume") == {"paused": False, "changed": True}


def test_board_groups_by_status(cli: Cli) -> None:
    card_id = cli.add("on the board")
    code, out, _ = cli("kanban", "board")
    assert code == 0
    lines = out.splitlines()
    assert lines[lines.index("READY (1)") + 1].split()[0] == card_id


def test_worker_commands_from_the_environment(cli: Cli, home: Path) -> None:
    card_id = cli.add()
    with open_state(home / "state") as db:
        run = (
            SqliteBoardStore(db)
            .claim(
                card_id,
                now=1.0,
                claimer=Claimant(pid=1, start=None, boot=None),
                limits=Limits(max_in_progress=9),
            )
            .run
        )
    assert run is not None
    env = {"DISPATCH_CARD_ID": card_id, "DISPATCH_RUN_ID": run.run_id}
    code, _, err = cli("kanban", "complete", "--result", "ok", env=env)
    assert code == 0, err
    doc = cli.json("kanban", "show", card_id)
    assert isinstance(doc, dict) and doc["status"] == "done" and doc["result"] == "ok"


# -- bad input: exit 2, one line, nothing changed ---------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["kanban", "add", "x", "--assignee", "nobody"], "assignee 'nobody'"),
        (["kanban", "add", "x", "--assignee", "echo", "--parent", "zz!"], "--parent"),
        (["kanban", "add", "x", "--assignee", "echo", "--parent", "c_ffff0000ff"], "parent"),
        (["kanban", "add", "  ", "--assignee", "echo"], "title"),
        (["kanban", "add", "x", "--assignee", "echo", "--priority", "high"], "--priority"),
        (["kanban", "show", "c_ffff0000ff"], "no card"),
        (["kanban", "show", "c_1"], "too short"),
        (["kanban", "move", "CARD", "running"], "running"),
        (["kanban", "edit", "CARD", "--assignee", "nobody"], "nobody"),
        (["kanban", "complete", "CARD", "--run", "r_0000000000"], "stale run"),
        (["kanban", "complete", "CARD"], "run id"),
        (
            ["kanban", "block", "CARD", "--run", "r_00000000", "--kind", "x", "--reason", "r"],
            "kind",
        ),
        (["kanban", "unblock", "CARD"], "ready"),
        (["kanban", "tick", "--max", "-1"], "--max"),
        (["kanban", "nosuch"], "invalid choice"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_changes_nothing(
    cli: Cli, argv: list[str], needle: str
) -> None:
    card_id = cli.add("keep me", "--body", "precious")
    before = cli.dump()
    code, out, err = cli(*[card_id if a == "CARD" else a for a in argv])
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dispatch: error: "), err
    assert needle in lines[0]
    assert cli.dump() == before


def test_a_stale_run_changes_nothing_even_for_a_running_card(cli: Cli, home: Path) -> None:
    card_id = cli.add()
    me = Claimant(pid=1, start=None, boot=None)
    with open_state(home / "state") as db:
        store = SqliteBoardStore(db)
        old = store.claim(card_id, now=1.0, claimer=me, limits=Limits(max_in_progress=9)).run
        assert old is not None
        store.close_run(
            old.run_id,
            Result(outcome=Outcome.RECLAIMED),
            lambda card, run: CardChange(fields={"status": CardStatus.READY}),
            now=2.0,
        )
        new = store.claim(card_id, now=3.0, claimer=me, limits=Limits(max_in_progress=9)).run
        assert new is not None
    before = cli.dump()
    code, _, err = cli(
        "kanban", "block", card_id, "--run", old.run_id, "--kind", "needs_input", "--reason", "r"
    )
    assert code == 2 and "stale run" in err and new.run_id in err
    assert cli.dump() == before


def test_bad_input_is_one_line_from_a_real_process(home: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatcher.cli.main",
            "--config",
            str(home / "config.yaml"),
            "--state-dir",
            str(home / "state"),
            "kanban",
            "add",
            "x",
            "--assignee",
            "ghost",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "ghost" in done.stderr and "echo" in done.stderr


# -- with real workers ------------------------------------------------------------------------


def wait_status(cli: Cli, card_id: str, status: str) -> dict[str, object]:
    def current() -> dict[str, object] | None:
        doc = cli.json("kanban", "show", card_id)
        assert isinstance(doc, dict)
        return doc if doc["status"] == status else None

    return wait_for(current, timeout=20, interval=0.1, what=f"{card_id} {status}")


def test_tick_starts_workers_and_board_reads_reconcile(
    cli: Cli, home: Path, leak_guard: object
) -> None:
    first = cli.add("one")
    second = cli.add("two")
    report = cli.json("kanban", "tick")
    assert isinstance(report, dict)
    assert {d["card_id"] for d in report["dispatched"]} | {
        c["card_id"] for c in report["reconciled"]
    } == {first, second}
    for card_id in (first, second):
        doc = wait_status(cli, card_id, "done")
        (run,) = doc["runs"]  # type: ignore[misc]
        assert run["outcome"] == "completed" and run["exit_code"] == 0
        assert run["placement"] in ("in_process", "degraded", "scoped")
        kinds = [e["kind"] for e in doc["events"]]  # type: ignore[union-attr]
        assert kinds[:3] == ["created", "claimed", "spawned"] and kinds[-1] == "completed"
        with open_state(home / "state") as db:
            store = SqliteBoardStore(db)
            session_id = resolve_session_id(store, card_id)
            assert session_id == run["session_id"]
            assert resolve_session_id(store, run["run_id"]) == session_id
            assert resolve_session_id(store, str(session_id)) is None
        title = "one" if card_id == first else "two"
        code, out, _ = cli("logs", str(session_id))
        if code == 0:  # `dispatch logs` belongs to the registry's CLI
            assert out == f"hi {title}\n"


def test_tick_dry_run_changes_nothing(cli: Cli) -> None:
    card_id = cli.add()
    before = cli.dump()
    report = cli.json("kanban", "tick", "--dry-run")
    assert isinstance(report, dict) and report["planned"] == [card_id]
    assert report["dispatched"] == [] and cli.dump() == before


def test_tick_names_cards_left_for_later_as_waiting_for_room(cli: Cli) -> None:
    first, second = cli.add("one"), cli.add("two")
    report = cli.json("kanban", "tick", "--dry-run", "--max", "1")
    assert isinstance(report, dict) and report["planned"] == [first]
    # "deferred" stays for existing readers; it is not the outcome of that name.
    assert report["waiting_for_room"] == report["deferred"] == [second]
    code, out, _ = cli("kanban", "tick", "--dry-run", "--max", "1")
    summary = out.splitlines()[-1]
    assert code == 0 and "1 waiting for room," in summary and "deferred" not in summary


def test_a_worker_reports_itself_and_its_exit_is_only_recorded(cli: Cli) -> None:
    code, out, err = cli("kanban", "add", "self-report", "--assignee", "reporter")
    assert code == 0, err
    card_id = out.strip()
    assert cli("kanban", "tick")[0] == 0
    doc = wait_status(cli, card_id, "done")

    def closed() -> dict[str, object] | None:
        doc = cli.json("kanban", "show", card_id)
        assert isinstance(doc, dict)
        return doc if doc["runs"][0]["outcome"] else None  # type: ignore[index]

    doc = wait_for(closed, timeout=20, interval=0.1, what="the run to close")
    assert doc["status"] == "done" and doc["result"] == "from-worker"
    assert doc["runs"][0]["exit_code"] == 3  # type: ignore[index]
    assert doc["events"][-1]["kind"] == "exit_ignored"  # type: ignore[index]
    assert doc["consecutive_failures"] == 0


def test_archive_stops_a_running_worker(cli: Cli, home: Path) -> None:
    _, out, _ = cli("kanban", "add", "long", "--assignee", "sleeper")
    card_id = out.strip()
    assert cli("kanban", "tick")[0] == 0
    doc = cli.json("kanban", "show", card_id)
    assert isinstance(doc, dict) and doc["status"] == "running"
    session_id = doc["runs"][0]["session_id"]  # type: ignore[index]
    assert cli("kanban", "archive", card_id)[0] == 0
    doc = cli.json("kanban", "show", card_id)
    assert isinstance(doc, dict) and doc["status"] == "archived"
    assert doc["runs"][0]["outcome"] == "failed"  # type: ignore[index]
    assert doc["runs"][0]["signal"] in ("SIGTERM", "SIGKILL")  # type: ignore[index]
    assert [e["kind"] for e in doc["events"]][-2:] == ["stopped", "archived"]  # type: ignore[union-attr]
    with open_state(home / "state") as db:
        row = (
            db.read()
            .__enter__()
            .execute("SELECT state FROM registry_sessions WHERE id = ?", (session_id,))
            .fetchone()
        )
    assert row[0] == "killed"


def test_a_worker_past_its_timeout_is_timed_out_and_counted(cli: Cli) -> None:
    _, out, _ = cli("kanban", "add", "slow", "--assignee", "slow", "--failure-limit", "1")
    card_id = out.strip()
    assert cli("kanban", "tick")[0] == 0
    doc = wait_status(cli, card_id, "blocked")
    (run,) = doc["runs"]  # type: ignore[misc]
    assert run["outcome"] == "timed_out"
    assert doc["consecutive_failures"] == 1
    assert [e["kind"] for e in doc["events"]][-2:] == ["blocked", "gave_up"]  # type: ignore[union-attr]


def test_a_missing_binary_is_an_ordinary_counted_failure(cli: Cli) -> None:
    _, out, _ = cli("kanban", "add", "broken", "--assignee", "missing")
    card_id = out.strip()
    for _ in range(2):
        assert cli("kanban", "tick")[0] == 0
    doc = wait_status(cli, card_id, "blocked")
    assert [r["outcome"] for r in doc["runs"]] == ["failed_start", "failed_start"]  # type: ignore[union-attr]
    assert all(not r["infrastructure"] for r in doc["runs"])  # type: ignore[union-attr]
    assert doc["consecutive_failures"] == 2
    assert "worker-binary" in str(doc["last_failure_error"])


def test_retry_runs_a_finished_card_again_with_the_reason_in_its_events(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("kanban:\n  assignees:\n    ok:\n      command: [sh, -c, 'echo run']\n")
    env = {**os.environ, "DISPATCH_CONFIG": str(config), "DISPATCH_STATE_DIR": str(tmp_path / "s")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dispatcher.cli.main", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=60,
            check=False,
        )

    card = cli("kanban", "add", "again", "--assignee", "ok").stdout.strip()
    refused = cli("kanban", "retry", card)  # ready, waiting for nothing: it runs anyway
    assert refused.returncode == 2 and "cannot retry" in refused.stderr
    assert cli("kanban", "tick").returncode == 0

    def shown() -> dict:
        cli("kanban", "list")  # reconciles the finished run
        return json.loads(cli("kanban", "show", card, "--json").stdout)

    wait_for(lambda: shown()["status"] == "done", 30, what="first run done")
    retried = cli("kanban", "retry", card, "--reason", "flaky upstream")
    assert retried.returncode == 0, retried.stderr
    doc = shown()
    assert doc["status"] == "ready" and doc["completed_at"] is None
    moved = [e for e in doc["events"] if e["kind"] == "moved"][-1]
    assert moved["data"]["action"] == "retry" and moved["data"]["reason"] == "flaky upstream"
    assert cli("kanban", "tick").returncode == 0
    wait_for(lambda: shown()["status"] == "done", 30, what="second run done")
    assert [r["attempt"] for r in shown()["runs"]] == [1, 2]


def test_retry_policy_backs_off_then_completes_and_a_fail_rule_gives_up(
    cli: Cli, home: Path
) -> None:
    _, out, _ = cli("kanban", "add", str(home / "flaky"), "--assignee", "flaky")
    flaky = out.strip()
    _, out, _ = cli("kanban", "add", str(home / "usage"), "--assignee", "flaky")
    usage = out.strip()

    def timing() -> tuple[float | None, list[tuple[float, float | None]]]:
        conn = sqlite3.connect(home / "state" / "state.db")
        try:
            (retry_at,) = conn.execute(
                "SELECT retry_at FROM kanban_cards WHERE id = ?", (flaky,)
            ).fetchone()
            runs = conn.execute(
                "SELECT claimed_at, ended_at FROM kanban_runs WHERE card_id = ?"
                " ORDER BY claimed_at",
                (flaky,),
            ).fetchall()
            return retry_at, runs
        finally:
            conn.close()

    backoffs = []
    for attempt in (1, 2):
        assert cli("kanban", "tick")[0] == 0
        doc = wait_status(cli, flaky, "ready")
        assert doc["retry"] == {
            "attempt": attempt + 1,
            "attempts": 4,
            "counted": True,
            "next_try_at": doc["retry_at"],
            "reason": f"backoff, attempt {attempt + 1} of 4",
        }
        _, text, _ = cli("kanban", "show", flaky)
        assert f"attempt   {attempt + 1} of 4" in text
        assert f"(backoff, attempt {attempt + 1} of 4)" in text
        if attempt == 1:
            blocked = wait_status(cli, usage, "blocked")  # exit 2: the fail rule, no retry
            assert [r["exit_code"] for r in blocked["runs"]] == [2]  # type: ignore[union-attr]
            assert [e["kind"] for e in blocked["events"]][-1] == "gave_up"  # type: ignore[union-attr]
        retry_at, runs = timing()
        assert retry_at is not None and runs[-1][1] is not None
        backoffs.append(retry_at - runs[-1][1])
        # A tick before retry_at claims nothing; the claim after it starts the next attempt.
        wait_for(
            lambda n=attempt: (cli("kanban", "tick"), len(timing()[1]) > n)[1] or None,
            timeout=20,
            interval=0.05,
            what=f"attempt {attempt + 1}",
        )
        assert timing()[1][-1][0] >= retry_at
    doc = wait_status(cli, flaky, "done")
    assert [r["outcome"] for r in doc["runs"]] == ["failed", "failed", "completed"]  # type: ignore[union-attr]
    assert doc["retry"] is None
    # jitter none: 300 ms, then 600 ms after the exit (stored times are float32-close)
    assert 0.299 <= backoffs[0] < 0.45 and 0.599 <= backoffs[1] < 0.9, backoffs


def test_a_worker_defers_its_card_uncounted_until_its_time(cli: Cli) -> None:
    _, out, _ = cli("kanban", "add", "later", "--assignee", "deferrer")
    card_id = out.strip()
    assert cli("kanban", "tick")[0] == 0
    doc = wait_status(cli, card_id, "ready")
    assert [r["outcome"] for r in doc["runs"]] == ["deferred"]  # type: ignore[union-attr]
    assert doc["consecutive_failures"] == 0 and doc["retry_at"] is not None
    retry = doc["retry"]
    assert isinstance(retry, dict) and retry["reason"] == "deferred by the worker: rate limited"
    assert retry["counted"] is False and retry["next_try_at"] == doc["retry_at"]
    _, text, _ = cli("kanban", "show", card_id)
    assert "next try deferred until " in text and "by the worker: rate limited" in text
    report = cli.json("kanban", "tick")
    assert isinstance(report, dict) and report["dispatched"] == []
    code, _, err = cli("kanban", "defer", card_id, "--run", "r_0000000000", "--for", "soon")
    assert code == 2 and err.count("\n") == 1 and "--for" in err
    # A time not in the future names the flag and the text the worker gave, not a timestamp.
    code, _, err = cli("kanban", "defer", card_id, "--run", "r_0000000000", "--for", "0s")
    assert code == 2 and err.count("\n") == 1 and "--for '0s'" in err and "future" in err
    past = "2020-01-01T09:00"
    code, _, err = cli("kanban", "defer", card_id, "--run", "r_0000000000", "--until", past)
    assert code == 2 and err.count("\n") == 1, err
    assert f"--until '{past}'" in err and "future" in err and "1577" not in err
    # The operator cuts the wait short: the card starts over and the next tick claims it.
    code, out, err = cli("kanban", "retry", card_id, "--reason", "not waiting an hour")
    assert code == 0, err
    doc = cli.json("kanban", "show", card_id)
    assert isinstance(doc, dict) and doc["retry_at"] is None and doc["retry"] is None
    moved = doc["events"][-1]  # type: ignore[index]
    assert moved["data"]["waited_until"] == retry["next_try_at"]
    report = cli.json("kanban", "tick")
    assert isinstance(report, dict) and [d["card_id"] for d in report["dispatched"]] == [card_id]


def test_kill_takes_a_card_id_or_a_run_id(cli: Cli) -> None:
    """Issue 19 §4: ``dispatch kill`` names a worker the way ``logs`` does."""
    cards = []
    for title in ("by-card", "by-run"):
        _, out, _ = cli("kanban", "add", title, "--assignee", "sleeper")
        cards.append(out.strip())
    assert cli("kanban", "tick")[0] == 0
    runs = []
    for card_id in cards:
        doc = cli.json("kanban", "show", card_id)
        assert isinstance(doc, dict) and doc["status"] == "running"
        runs.append(doc["runs"][0])  # type: ignore[index]
    for given, run in ((cards[0], runs[0]), (runs[1]["run_id"], runs[1])):
        code, out, err = cli("kill", given, "--grace", "1")
        assert code == 0, err
        assert out.startswith(f"{run['session_id']} killed"), out
    code, _, err = cli("kill", "c_0000000000")
    assert code == 2 and "c_0000000000" in err


def test_an_unconfigured_assignee_shows_in_list_board_and_status(cli: Cli, home: Path) -> None:
    """Issue 19 §4: not only an ``assignee_unknown`` event."""
    _, out, _ = cli("kanban", "add", "orphan", "--assignee", "other")
    orphan = out.strip()
    fine = cli.add("fine")
    config = home / "config.yaml"
    config.write_text(CONFIG.replace('    other:\n      command: ["true"]\n', ""))
    code, listed, err = cli("kanban", "list")
    assert code == 0, err
    rows = {line.split()[0]: line for line in listed.splitlines()[1:]}
    assert rows[orphan].endswith("[assignee not configured]")
    assert "not configured" not in rows[fine]
    docs = cli.json("kanban", "list")
    assert isinstance(docs, list)
    assert {d["id"]: d["assignee_configured"] for d in docs} == {orphan: False, fine: True}
    _, board, _ = cli("kanban", "board")
    (line,) = [line for line in board.splitlines() if orphan in line]
    assert "[assignee not configured]" in line
    _, status, _ = cli("status")
    assert f"kanban: card {orphan}: assignee 'other' is not configured" in status
