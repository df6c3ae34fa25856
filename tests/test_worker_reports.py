"""A worker's report never depends on the operator's config (issue 19, section 3).

Real workers, started by a real ``dispatch kanban tick``, wait while the config is broken
three ways in turn (a YAML syntax error, an unknown key, its assignee removed); each then runs
its ``dispatch kanban review|block|complete`` through ``DISPATCH_CONFIG`` as a worker does,
and the report lands, with exit 0 and not a word on stderr. Single host (SQLite) and cluster
mode (PostgreSQL, the database named only in the config, which is broken when they report);
there the human `kanban show` and `cron history` also name the host of each run and fire (§4).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from dispatcher.app.reports import captured_settings, spawn_environ
from dispatcher.cluster.settings import ClusterSettings
from dispatcher.cluster.url import without_password
from dispatcher.settings import Settings
from tests.support.cli import run_dispatch
from tests.support.wait import wait_for

CLI = f"{sys.executable} -m dispatcher.cli.main"
# The worker waits for its go file, reports, and leaves what the report said next to it.
WORKER = (
    'while [ ! -e "$GO/$DISPATCH_CARD_TITLE" ]; do sleep 0.05; done; '
    f'{CLI} kanban "$DISPATCH_CARD_TITLE" $ARGS >"$GO/$DISPATCH_CARD_TITLE.out" '
    '2>"$GO/$DISPATCH_CARD_TITLE.err"; echo $? >"$GO/$DISPATCH_CARD_TITLE.rc"'
)
REPORTS = {
    "review": "",
    "block": "--kind needs_input --reason stuck",
    "complete": "--result fine",
}
STATUS = {"review": "review", "block": "blocked", "complete": "done"}


def _config(go: Path, cluster: str, *, assignees: bool = True) -> str:
    text = f"{cluster}kanban:\n  degrade_without_scope: true\n"
    if assignees:
        text += "  assignees:\n"
        for name, args in REPORTS.items():
            text += (
                f"    {name}:\n      command: [sh, -c, {json.dumps(WORKER)}]\n"
                f"      env: {{GO: {json.dumps(str(go))}, ARGS: {json.dumps(args)}}}\n"
            )
    return text


def _drive(tmp_path: Path, env: dict[str, str], cluster: str) -> dict[str, str]:
    """Start the three workers, break the config under each, and return card -> status as
    the board tells it once the config is good again."""
    go = tmp_path / "go"
    go.mkdir()
    config, state = tmp_path / "config.yaml", tmp_path / "state"
    good = _config(go, cluster)
    config.write_text(good)
    cards = {}
    for name in REPORTS:
        added = run_dispatch(config, state, env, "kanban", "add", name, "--assignee", name)
        cards[name] = added.stdout.strip()
    tick = run_dispatch(config, state, env, "kanban", "tick", "--json")
    assert len(json.loads(tick.stdout)["dispatched"]) == 3, tick.stdout + tick.stderr
    breakages = {
        "review": good + "  bogus: [\n",
        "block": good + "unknown_section: {}\n",
        "complete": _config(go, cluster, assignees=False),
    }
    for name, broken in breakages.items():
        config.write_text(broken)
        (go / name).touch()
        rc = go / f"{name}.rc"
        wait_for(
            lambda rc=rc: rc.exists() and rc.read_text().endswith("\n"),
            timeout=20,
            what=f"{name} reported",
        )
        err = (go / f"{name}.err").read_text()
        assert (go / f"{name}.rc").read_text().strip() == "0", err
        assert err == "", err
    config.write_text(good)
    listed = run_dispatch(config, state, env, "kanban", "list", "--all", "--json")
    by_id = {card["id"]: card["status"] for card in json.loads(listed.stdout)}
    return {name: by_id[card] for name, card in cards.items()}


def test_reports_land_while_the_config_is_broken(tmp_path: Path, leak_guard: object) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    assert _drive(tmp_path, env, "") == STATUS


def test_cluster_reports_land_while_the_config_is_broken(
    tmp_path: Path, pg_url: str, leak_guard: object
) -> None:
    from dispatcher.cluster.database import ClusterDB
    from dispatcher.cluster.hosts import Hosts

    with ClusterDB(pg_url, pooled=False) as db:
        db.migrate()
        Hosts(db, lease_ttl=120).join("alpha", boot_id="test", version="1")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
        cluster = (
            f"cluster:\n  database: {json.dumps(pg_url)}\n  host_id: alpha\n  lease_ttl: 120s\n"
            "cron:\n  jobs:\n    - id: hb\n      every: 1h\n      command: ['true']\n"
        )
        assert _drive(tmp_path, env, cluster) == STATUS
        # Issue 19 §4: the human views name the host of each run and fire.
        config, state = tmp_path / "config.yaml", tmp_path / "state"
        listed = run_dispatch(config, state, env, "kanban", "list", "--json")
        card = json.loads(listed.stdout)[0]["id"]
        shown = run_dispatch(config, state, env, "kanban", "show", card).stdout
        (run_line,) = [line for line in shown.splitlines() if line.startswith("  r_")]
        assert run_line.endswith("  host alpha"), shown
        run_dispatch(config, state, env, "cron", "run", "hb", "--wait")
        history = run_dispatch(config, state, env, "cron", "history").stdout.splitlines()
        assert history[0].split()[:4] == ["FIRE", "KEY", "HOST", "OUTCOME"], history
        assert history[1].split()[1] == "alpha", history
        doc = json.loads(run_dispatch(config, state, env, "cron", "history", "--json").stdout)
        assert doc[0]["host"] == "alpha"


def test_spawn_capture_names_the_database_and_never_its_password(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    settings = Settings(
        cluster=ClusterSettings(
            database="postgresql://u:hunter2@db:5433/d?sslmode=require&password=hunter2",
            password_file=str(secret),
            host_id="alpha",
        )
    )
    env = spawn_environ(settings, {"DISPATCH_DATABASE_PASSWORD_FILE": "/stale", "PATH": "/bin"})
    assert "hunter2" not in json.dumps(env)
    assert env["DISPATCH_DATABASE_URL"] == "postgresql://u@db:5433/d?sslmode=require"
    assert env["DISPATCH_DATABASE_PASSWORD_FILE"] == str(secret)
    assert env["DISPATCH_HOST_ID"] == "alpha" and env["PATH"] == "/bin"
    single = spawn_environ(Settings(), {"DISPATCH_DATABASE_PASSWORD_FILE": "/stale"})
    assert "DISPATCH_DATABASE_URL" not in single
    assert "DISPATCH_DATABASE_PASSWORD_FILE" not in single
    # The worker side: the config's cluster section is replaced by the capture.
    worker = {**env, "DISPATCH_RUN_ID": "r_0123456789"}
    captured = captured_settings(settings, worker)
    assert captured is not None and captured.cluster.database is None
    assert captured.cluster.url(worker) == env["DISPATCH_DATABASE_URL"]
    assert captured.cluster.password_file == str(secret)
    assert captured_settings(settings, env) is None  # not inside a worker
    assert without_password("postgresql://u@h/d") == "postgresql://u@h/d"
