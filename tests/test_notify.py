"""Notifications: the config section, the outbox written with its event, and delivery to a
real HTTP receiver on 127.0.0.1 (an outage survived, signatures checked with the stdlib)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.server
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.app.database import open_state
from dispatcher.config import parse_config
from dispatcher.kanban.abc import BoardStore
from dispatcher.kanban.model import CardStatus, Limits, NewCard
from dispatcher.kanban.store import SqlBoardStore, SqliteBoardStore
from dispatcher.launch.claimant import Claimant
from dispatcher.launch.outbox import Outbox
from dispatcher.notify.sender import Sender, backoff
from dispatcher.notify.settings import NotifySettings
from dispatcher.notify.store import NotifyStore
from scope.foundation.errors import ConfigError
from scope.foundation.schema import dump_record
from tests.support.wait import wait_for

NOW = 1_800_000_000.0
ME = Claimant(pid=1, start=1, boot=None)


# -- config ---------------------------------------------------------------------------------


def _notify(text: str) -> NotifySettings:
    return parse_config(text, "config.yaml").notify


def test_config_parses_the_issue_example_and_hides_secrets(tmp_path: Path) -> None:
    settings = parse_config(
        """
notify:
  channels:
    ops-slack: {webhook: {url: "https://hooks.example/T0/B0/XX?token=tok3n", format: slack}}
    pager: {webhook: {url: "https://alerts.example/hook", secret_file: /x/hook-secret}}
    local: {command: ["/usr/local/bin/notify-me"]}
  rules:
    - {on: [card.blocked, card.gave_up, cron.failed], to: [ops-slack, pager]}
    - {on: [card.review], assignees: [coder], to: [local]}
""",
        "config.yaml",
    )
    notify = settings.notify
    assert notify.rules[0].on == ("card.blocked", "card.gave_up", "cron.failed")
    assert notify.rules[1].assignees == ("coder",)
    assert notify.channels["local"].command == ("/usr/local/bin/notify-me",)
    from dispatcher.settings import SCHEMA

    shown = json.dumps(dump_record(SCHEMA, settings))
    assert "T0/B0" not in shown and "tok3n" not in shown
    assert "https://hooks.example/<redacted>" in shown


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("rules: [{on: [card.done], to: [nowhere]}]", "notify.rules[0].to[0]: unknown channel"),
        (
            "channels: {a: {command: [x]}}\n  rules: [{on: [card.exploded], to: [a]}]",
            "notify.rules[0].on[0]: unknown event 'card.exploded'",
        ),
        ("channels: {a: {webhook: {url: 'file:///etc/passwd'}}}", "not an http(s) URL"),
        ("channels: {a: {}}", "exactly one of 'webhook' and 'command'"),
        ("channels: {a: {command: 'echo hi'}}", "argv list (no shell); write it as a list"),
    ],
)
def test_bad_notify_config_is_one_line_naming_the_key(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _notify(f"notify:\n  {text}\n")
    message = str(caught.value)
    assert words in message and "\n" not in message and "passwd" not in message


def test_the_deadline_may_be_short_but_not_zero() -> None:
    # A short deadline is how a drill (or a test) sees a message go dead without waiting.
    assert _notify("notify: {deadline: 5s}\n").deadline == 5
    with pytest.raises(ConfigError, match=r"notify\.deadline"):
        _notify("notify: {deadline: 0}\n")


def test_a_command_channel_runs_a_shell_only_when_asked(tmp_path: Path) -> None:
    from dispatcher.notify.sender import deliver

    got = tmp_path / "got"
    shelled = _notify(
        f"notify:\n  channels: {{a: {{command: 'cat > {got} && echo $((6 * 7))', shell: true}}}}\n"
    ).channels["a"]
    answer = deliver(shelled, '{"id": "m1", "event": "card.done"}')
    assert (answer.ok, answer.detail) == (True, "exit 0 42")
    assert json.loads(got.read_text())["id"] == "m1"
    # An argv list never sees a shell: the words reach the program as they are.
    plain = _notify("notify:\n  channels: {a: {command: [echo, '$((6 * 7))']}}\n").channels["a"]
    assert deliver(plain, '{"id": "m2", "event": "card.done"}').detail == "exit 0 $((6 * 7))"


def test_a_command_past_its_timeout_ends_with_everything_it_started(tmp_path: Path) -> None:
    from dispatcher.notify.sender import deliver

    pids = tmp_path / "pids"
    # The shell's background child holds stdout: killing only the shell would leave the
    # sender waiting for that pipe as long as the child lives.
    channel = _notify(
        "notify:\n  channels: {a: {command: 'sleep 60 & echo $! > "
        f"{pids}; wait', shell: true, timeout: 1s}}}}\n"
    ).channels["a"]
    started = time.monotonic()
    answer = deliver(channel, '{"id": "m3", "event": "card.done"}')
    took = time.monotonic() - started
    assert (answer.ok, answer.detail) == (False, "timed out after 1s")
    assert took < 10, took
    child = int(pids.read_text())
    wait_for(lambda: not _alive(child), timeout=5, what="the command's child killed")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, reaped by nobody here, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Drip:
    """A receiver that sends the start of its answer at once and the rest a byte every 0.2 s,
    forever: each read alone is quick, so only a bound on the whole exchange ends it."""

    def __init__(self, start: bytes, rest: bytes) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.start, self.rest = start, rest
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(self.start)
                for byte in self.rest * 10_000:
                    conn.sendall(bytes([byte]))
                    if self.stop.wait(0.2):
                        return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.mark.parametrize(
    ("start", "rest", "ok"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n", b"x", True),  # the body drips
        (b"", b"H", False),  # the status line never ends
    ],
)
def test_a_webhook_delivery_ends_within_its_timeout_however_slow_the_receiver(
    start: bytes, rest: bytes, ok: bool
) -> None:
    from dispatcher.notify.sender import deliver

    drip = Drip(start, rest)
    try:
        hook = _notify(
            f"notify:\n  channels: {{d: {{webhook: {{url: 'http://127.0.0.1:{drip.port}/', "
            "timeout: 1s}}}\n"
        ).channels["d"]
        started = time.monotonic()
        got = deliver(hook, '{"id": "m1", "event": "card.done"}')
        took = time.monotonic() - started
    finally:
        drip.close()
    assert 0.9 < took < 5, took
    # The head arrived (200): the receiver took the message; the rest of its answer is cut.
    assert got.ok is ok, got.detail
    if not ok:
        assert got.detail == f"http://127.0.0.1:{drip.port}: timed out after 1s"


def test_backoff_doubles_up_to_the_cap_with_jitter_between_half_and_all() -> None:
    assert backoff(1, base=2, cap=60, jitter=0.999999) == pytest.approx(2, rel=1e-5)
    assert backoff(3, base=2, cap=60, jitter=0.0) == 4
    assert backoff(30, base=2, cap=60, jitter=0.5) == 45


# -- the outbox beside the board ------------------------------------------------------------


def _notify_store(db: Any, *, clustered: bool) -> NotifyStore:
    if clustered:
        return NotifyStore(db.read, lambda: db.write(None), skip_locked=True)
    return NotifyStore(db.read, db.write)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def books(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[SqlBoardStore, Any]]:
    """A board store with an outbox routing every card event to channel ``hook``, and its
    database."""
    routes = _notify(
        "notify:\n  channels: {hook: {webhook: {url: 'http://127.0.0.1:9/x'}}}\n"
        "  rules: [{on: [card.added, card.blocked, card.done, card.review], to: [hook]}]\n"
    ).routes()
    if request.param == "sqlite":
        with open_state(tmp_path / "state") as db:
            store: SqlBoardStore = SqliteBoardStore(db)
            store.outbox = Outbox(routes)
            yield store, db
    else:
        from dispatcher.cluster.board import PgBoardStore
        from dispatcher.cluster.database import ClusterDB

        with ClusterDB(request.getfixturevalue("pg_url")) as cluster:
            cluster.migrate()
            store = PgBoardStore(cluster)
            store.outbox = Outbox(routes)
            yield store, cluster


def _add(store: BoardStore, assignee: str = "coder") -> str:
    card, _ = store.add_card(NewCard(title="fix it", assignee=assignee), now=NOW)
    return card.id


class Exploding(Outbox):
    """Writes its rows, then fails: the transaction must take the event down with it."""

    def record(self, *args: Any, **kwargs: Any) -> str | None:
        super().record(*args, **kwargs)
        raise RuntimeError("crash after the outbox write")


def test_outbox_rows_commit_with_their_event_or_not_at_all(
    books: tuple[SqlBoardStore, Any],
) -> None:
    store, db = books
    clustered = not isinstance(store, SqliteBoardStore)
    outbox = _notify_store(db, clustered=clustered)
    card_id = _add(store)
    run = store.claim(card_id, now=NOW, claimer=ME, limits=Limits(max_in_progress=5)).run
    assert run is not None
    store.worker_move(card_id, run.run_id, CardStatus.REVIEW, now=NOW + 1)
    other_id = _add(store)
    store.move(other_id, CardStatus.BLOCKED, now=NOW + 2)
    rows = outbox.list()
    assert sorted(r.event for r in rows) == ["card.added"] * 2 + ["card.blocked", "card.review"]
    assert {r.channel for r in rows} == {"hook"} and len({r.message_id for r in rows}) == 4
    body = json.loads(next(r.body for r in rows if r.event == "card.review"))
    assert body["card"] == {
        "id": card_id,
        "title": "fix it",
        "assignee": "coder",
        "status": "review",
        "group": None,
    }
    assert body["run_id"] == run.run_id and body["id"] == next(
        r.message_id for r in rows if r.event == "card.review"
    )
    # A failure after both writes rolls back the event and its message together.
    events = len(store.events_of(other_id))
    assert store.outbox is not None
    store.outbox = Exploding(store.outbox.routes)
    with pytest.raises(RuntimeError):
        store.move(other_id, CardStatus.DONE, now=NOW + 3)
    assert len(store.events_of(other_id)) == events
    assert store.get_card(other_id).status is CardStatus.BLOCKED
    assert len(outbox.list()) == 4
    if clustered:  # a row locked by another claimer is skipped, not waited for
        with db.write(None) as conn:
            conn.execute(
                "SELECT 1 FROM notify_outbox WHERE event = 'card.added' FOR UPDATE"
            ).fetchall()
            other = _notify_store(db, clustered=True)
            holder = threading.Thread(
                target=lambda: taken.extend(other.claim(now=NOW + 9, lease=60))
            )
            taken: list[Any] = []
            holder.start()
            holder.join(10)
            assert sorted(d.event for d in taken) == ["card.blocked", "card.review"]
        assert [d.event for d in other.claim(now=NOW + 9, lease=60)] == ["card.added"] * 2


def test_a_settled_fire_queues_its_outcome_for_the_jobs_a_rule_names(
    books: tuple[SqlBoardStore, Any],
) -> None:
    from dispatcher.cron.changes import FireChange
    from dispatcher.cron.ledger import Ledger
    from dispatcher.cron.records import Kind, Status
    from dispatcher.launch.outbox import Route
    from dispatcher.launch.outcome import Outcome

    store, db = books
    clustered = not isinstance(store, SqliteBoardStore)
    if clustered:
        from dispatcher.cluster.ledger import PgLedger

        ledger: Ledger = PgLedger(db)
    else:
        ledger = Ledger(db)
    events = frozenset({"cron.failed", "cron.completed"})
    ledger.outbox = Outbox([Route(events=events, channels=("hook",), jobs=frozenset({"nightly"}))])
    ids = {}
    with ledger.transaction() as tx:
        for job in ("nightly", "hourly"):
            wall = "2027-01-15T09:00:00"
            ids[job] = tx.insert(
                fire_key=f"{job}@{wall}", job_id=job, kind=Kind.SCHEDULE, nominal_wall=wall,
                zone="UTC", nominal=NOW, decided_at=NOW, status=Status.CLAIMED,
            )  # fmt: skip
    for job in ("nightly", "hourly"):
        done = FireChange(status=Status.DONE, outcome=Outcome.FAILED, exit_code=3, ended_at=NOW)
        assert ledger.update(ids[job], [Status.CLAIMED], done)
    (only,) = _notify_store(db, clustered=clustered).list()
    body = json.loads(only.body)
    assert (only.event, body["job"], body["fire"]["exit_code"]) == ("cron.failed", "nightly", 3)


# -- delivery to a real receiver ------------------------------------------------------------


class Receiver:
    """An HTTP server on 127.0.0.1 recording every POST (headers and body)."""

    def __init__(self, port: int = 0) -> None:
        got = self.got = []  # type: list[tuple[dict[str, str], bytes]]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                got.append((dict(self.headers), body))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def receiving(port: int = 0) -> Iterator[Receiver]:
    receiver = Receiver(port)
    try:
        yield receiver
    finally:
        receiver.close()


def _verified(secret: bytes, headers: dict[str, str], body: bytes) -> bool:
    # The check docs/notify.md shows a receiver, written independently of the sender.
    signed = headers["Dispatch-Timestamp"].encode() + b"." + body
    expected = "sha256=" + hmac.new(secret, signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, headers["Dispatch-Signature"])


def test_a_message_survives_a_receiver_outage_signed_with_its_stable_id(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    out = tmp_path / "stdin.json"
    script = f"import sys; open({str(out)!r}, 'wb').write(sys.stdin.buffer.read())"
    with receiving() as first:
        port = first.port
    config = f"""
notify:
  channels:
    hook: {{webhook: {{url: "http://127.0.0.1:{port}/in", secret_file: {secret}}}}}
    local: {{command: [{sys.executable}, -c, "{script}"]}}
  rules: [{{on: [card.blocked], to: [hook, local]}}]
"""
    settings = _notify(config)
    clock = [NOW]
    with open_state(tmp_path / "state") as db:
        board = SqliteBoardStore(db)
        board.outbox = Outbox(settings.routes())
        store = _notify_store(db, clustered=False)
        sender = Sender(store, settings, clock=lambda: clock[0], base=1, rand=lambda: 0.99)
        card_id = _add(board)
        board.move(card_id, CardStatus.BLOCKED, now=NOW)
        # The receiver is down: three tries fail, each retried later; the command delivers.
        for _ in range(3):
            assert sender.tick(clock[0]) == (1 if clock[0] == NOW else 0)
            clock[0] += 10
        hook = next(d for d in store.list() if d.channel == "hook")
        assert (hook.state, hook.attempts) == ("pending", 3) and "127.0.0.1" in str(hook.last_error)
        piped = json.loads(out.read_bytes())
        with receiving(port) as back:
            assert sender.tick(clock[0]) == 1
        (headers, body) = back.got[0]
        message = json.loads(body)
        assert message["id"] == headers["Dispatch-Message-Id"] == piped["id"] == hook.message_id
        assert message["event"] == "card.blocked" and message["card"]["id"] == card_id
        assert _verified(b"s3cret", headers, body)
        assert {d.state for d in store.list()} == {"delivered"}
        # Past the deadline a message is dead; retry makes it due again.
        board.move(card_id, CardStatus.DONE, now=clock[0])
        board.move(card_id, CardStatus.BLOCKED, now=clock[0])
        clock[0] += settings.deadline + 1
        sender.tick(clock[0])
        dead = store.list(state="dead")
        assert [d.channel for d in dead] == ["hook"]
        assert store.retry(dead[0].message_id, now=clock[0]) == 1
        with receiving(port) as again:
            assert sender.tick(clock[0]) == 1
        assert json.loads(again.got[0][1])["id"] == dead[0].message_id


def test_a_secret_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("x")
    secret.chmod(0o644)
    settings = _notify(
        "notify:\n  channels: {h: {webhook: {url: 'http://127.0.0.1:9/', secret_file: "
        f"{secret}}}}}}}\n"
        "  rules: [{on: [card.done], to: [h]}]\n"
    )
    with open_state(tmp_path / "state") as db, pytest.raises(ConfigError, match="chmod 600"):
        Sender(_notify_store(db, clustered=False), settings)


def test_a_private_secret_file_is_asked_for_by_file_key_and_fix_everywhere(
    tmp_path: Path,
) -> None:
    """config check, notify test and serve each refuse a secret file others can read, in one
    line naming the config file, the channel's key and ``chmod 600``."""
    from tests.support.cli import run_dispatch, state_env

    secret = tmp_path / "hook-secret"
    secret.write_text("x")
    secret.chmod(0o644)
    config = tmp_path / "config.yaml"
    config.write_text(
        "notify:\n  channels:\n    pager: {webhook: {url: 'http://127.0.0.1:9/', secret_file: "
        f"{secret}}}}}\n  rules: [{{on: [card.done], to: [pager]}}]\n"
    )
    env = state_env(tmp_path)
    line = (
        f"dispatch: error: {config}: notify.channels.pager.webhook.secret_file: secret file "
        f"{secret} is readable by others (mode 644); chmod 600 {secret}"
    )
    for args in (("config", "check"), ("notify", "test", "pager"), ("serve",)):
        done = run_dispatch(config, tmp_path / "state", env, *args, check=False)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.strip().splitlines()[-1] == line, args
        assert "Traceback" not in done.stderr


def test_serve_delivers_what_a_command_queued(tmp_path: Path) -> None:
    from dispatcher.app.workspace import Workspace
    from dispatcher.config import load_config
    from dispatcher.gateway.serve import Gateway
    from tests.support.env import no_bus_env
    from tests.support.wait import wait_for

    with receiving() as receiver:
        config = tmp_path / "config.yaml"
        config.write_text(
            "kanban:\n  assignees:\n    quick: {command: [sh, -c, 'exit 0']}\n"
            "notify:\n"
            f"  channels: {{hook: {{webhook: {{url: 'http://127.0.0.1:{receiver.port}/'}}}}}}\n"
            "  rules: [{on: [card.added], assignees: [quick], to: [hook]}]\n"
        )
        settings = load_config(config).settings
        environ = no_bus_env(tmp_path)
        gateway = Gateway(
            settings=settings, state_dir=tmp_path / "state", environ=environ, config_path=config
        )
        gateway.start()
        try:
            # The card is added the way `dispatch kanban add` adds it, in another workspace.
            workspace = Workspace(settings, tmp_path / "state", environ=environ)
            try:
                workspace.board.store.set_paused(True)  # no worker needed for this message
                card, _ = workspace.board.add("hello", assignee="quick", now=time.time())
            finally:
                workspace.close()
            wait_for(lambda: receiver.got, timeout=10, what="the card.added webhook")
        finally:
            gateway.shutdown()
    message = json.loads(receiver.got[0][1])
    assert (message["event"], message["card"]["id"]) == ("card.added", card.id)


def test_notify_commands_list_retry_and_test(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dispatcher.cli.main import main
    from tests.support.cli import state_env

    config = tmp_path / "config.yaml"

    with receiving() as receiver:
        config.write_text(
            "kanban: {assignees: {a: {command: ['true']}}}\n"
            f"notify:\n  channels: {{hook: {{webhook: {{url: 'http://127.0.0.1:{receiver.port}/k'}}}}}}\n"
            "  rules: [{on: [card.added], to: [hook]}]\n"
        )
        env = state_env(tmp_path)
        assert main(["--config", str(config), "notify", "test", "hook"], environ=env) == 0
        assert capsys.readouterr().out.startswith("delivered: 200 ok")
        assert json.loads(receiver.got[0][1])["event"] == "test"
    assert (
        main(["--config", str(config), "notify", "test", "hook"], environ=env) == 1
    )  # the receiver is gone
    assert capsys.readouterr().out.startswith(
        f"refused: http://127.0.0.1:{receiver.port}/<redacted>"
    )
    assert main(["--config", str(config), "notify", "test", "nope"], environ=env) == 2
    assert "unknown channel 'nope'" in capsys.readouterr().err
    assert (
        main(["--config", str(config), "kanban", "add", "hello", "--assignee", "a"], environ=env)
        == 0
    )
    capsys.readouterr()
    assert main(["--config", str(config), "notify", "list", "--json"], environ=env) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["event"], row["channel"], row["state"]) == ("card.added", "hook", "pending")
    # A list an operator scans: local times and how long ago (docs/cli.md), never raw ISO.
    assert main(["--config", str(config), "notify", "list"], environ={**env, "TZ": "UTC"}) == 0
    (_, line) = capsys.readouterr().out.splitlines()
    assert line.split()[:5] == [row["id"], "hook", "card.added", "pending", "0"]
    assert re.fullmatch(r"\d\d:\d\d:\d\d UTC \((now|\d+s ago)\)", line.split("  ")[-1]), line
    assert main(["--config", str(config), "notify", "list", "--dead"], environ=env) == 0
    assert capsys.readouterr().out.strip() == "no dead notifications"
    assert main(["--config", str(config), "notify", "retry", row["id"]], environ=env) == 0
    assert main(["--config", str(config), "notify", "retry", "0" * 32], environ=env) == 2
    # A unique prefix names the message, as card and session prefixes do; too short is refused.
    capsys.readouterr()
    prefix = row["id"][:6]
    assert main(["--config", str(config), "notify", "retry", prefix], environ=env) == 0
    assert capsys.readouterr().out.startswith(f"notification {row['id']}: 1 deliveries due now")
    assert main(["--config", str(config), "notify", "retry", row["id"][:3]], environ=env) == 2
    assert "at least" in capsys.readouterr().err
    assert main(["--config", str(config), "notify", "retry", "not-hex"], environ=env) == 2


def test_breaker_blocks_and_pauses_are_their_own_events(tmp_path: Path) -> None:
    from dispatcher.cron.ledger import Ledger
    from dispatcher.kanban.model import EventKind
    from dispatcher.kanban.notices import notify_events
    from dispatcher.launch.outbox import Route

    assert notify_events(EventKind.BLOCKED, {"reason": "3 failures"}) == (
        "card.blocked",
        "breaker.tripped",
    )
    assert notify_events(EventKind.BLOCKED, {"by": "worker"}) == ("card.blocked",)
    assert notify_events(EventKind.MOVED, {"to": "ready"}) == ()
    with open_state(tmp_path / "state") as db:
        ledger = Ledger(db)
        ledger.outbox = Outbox([Route(events=frozenset({"cron.paused"}), channels=("h",))])
        assert ledger.set_paused("nightly", True, NOW)
        (row,) = _notify_store(db, clustered=False).list()
        assert (row.event, json.loads(row.body)["job"]) == ("cron.paused", "nightly")


def test_a_woken_look_claims_only_new_messages(books: tuple[SqlBoardStore, Any]) -> None:
    """serve wakes its sender when the board changes: that look takes the messages made since
    the last one, and leaves a backlog's retries to the poll (no burst beside every claim)."""
    board, db = books
    store = _notify_store(db, clustered=not isinstance(board, SqliteBoardStore))
    old = _add(board)
    board.add_card(NewCard(title="later", assignee="coder"), now=NOW + 100)
    fresh = store.claim(now=NOW + 101, lease=30, created_since=NOW + 50)
    assert [json.loads(d.body)["card"]["title"] for d in fresh] == ["later"]
    rest = store.claim(now=NOW + 101, lease=30)
    assert [json.loads(d.body)["card"]["id"] for d in rest] == [old]
