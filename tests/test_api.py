"""The HTTP API against a real ``dispatch web`` process: every endpoint, every error status,
token scopes, and the JSON of each endpoint equal to the CLI's ``--json`` for the same object.

One web process serves the module (its start is most of the cost); each test works on cards
of its own. The CLI runs as real processes on the same state dir."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.kanban.model import EventKind
from dispatcher.web.api.openapi import document
from dispatcher.web.api.table import OPERATIONS
from tests.support.api import Api, make_token
from tests.support.browser import SseReader, WebHome, WebProcess
from tests.support.wait import wait_for

CONFIG = """
limits:
  shared: {concurrency: 100, rate: 1000/1m, per_group: {concurrency: 50}}
kanban:
  degrade_without_scope: true
  assignees:
    echo:
      command: ["sh", "-c", "echo hello from the worker; echo second line"]
    sleeper:
      command: ["sleep", "30"]
      uses: [shared]
cron:
  jobs:
    - id: nightly
      schedule: "0 3 * * *"
      timezone: Europe/Berlin
      command: ["true"]
"""


class Site:
    """The module's web process, its tokens and clients."""

    def __init__(self, root: Path) -> None:
        self.home = WebHome(root, CONFIG)
        self.home.dispatch("kanban", "list")  # creates the state dir
        self.operate_token = make_token(self.home, "ci", "operate")
        self.read_token = make_token(self.home, "reader", "read")
        self.web = WebProcess(self.home.config, self.home.state, self.home.env)
        self.api = Api(self.web.url, self.operate_token)
        self.reader = Api(self.web.url, self.read_token)

    def cli(self, *args: str) -> Any:
        return self.home.json(*args)

    def add(self, title: str, assignee: str = "echo", **extra: Any) -> str:
        answer = self.api.post("/cards", {"title": title, "assignee": assignee, **extra})
        assert answer.status == 201, answer.raw
        return str(answer.json["id"])

    def close(self) -> None:
        self.api.close()
        self.reader.close()
        for session in self.cli("ps"):
            self.home.dispatch("kill", session["id"], check=False)
        assert self.web.stop() == 0, self.web.errors


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    made = Site(tmp_path_factory.mktemp("api"))
    try:
        yield made
    finally:
        made.close()


def test_limits_answer_as_dispatch_limits(site: Site) -> None:
    card = site.add("grouped", "echo", group="tenant-1")
    answer = site.reader.get("/limits")
    assert answer.status == 200 and answer.json == site.cli("limits")
    (shared,) = answer.json
    assert (shared["name"], shared["rate"], shared["per_group"]) == ("shared", "1000/1m", 50)
    listed = site.reader.get("/cards?group=tenant-1").json
    assert [c["group"] for c in listed] == ["tenant-1"] and listed[0]["waiting"] is None
    assert listed == [c for c in site.cli("kanban", "list") if c["group"] == "tenant-1"]
    regrouped = site.api.request("PATCH", f"/cards/{card}", {"group": ""})
    assert regrouped.status == 200 and regrouped.json["group"] is None
    site.api.post(f"/cards/{card}/archive")  # the other tests count the ready cards


def _problem(answer: Any, status: int) -> dict[str, Any]:
    assert answer.status == status, (answer.status, answer.raw)
    assert answer.media == "application/problem+json"
    doc = answer.json
    assert doc["status"] == status and "\n" not in doc["detail"]
    return dict(doc)


def test_the_document_is_the_route_table(site: Site) -> None:
    answer = site.api.get("/openapi.json", token="")
    assert answer.status == 200
    served = answer.json
    assert served == json.loads(json.dumps(document(OPERATIONS)))
    assert served["openapi"] == "3.1.0"
    listed = {(path, method) for path, ops in served["paths"].items() for method in ops}
    for op in OPERATIONS:
        assert ("/api/v1" + op.path, op.method.lower()) in listed
        entry = served["paths"]["/api/v1" + op.path][op.method.lower()]
        assert entry["x-dispatch-scope"] == op.scope
        assert {p["name"] for p in entry["parameters"]} >= {p.name for p in op.params}


def test_cards_answer_as_kanban_list_show_and_the_other_commands(site: Site) -> None:
    card = site.add("first", priority=5, body="the brief\nline two")
    again = site.api.post(
        "/cards",
        {"title": "dup", "assignee": "echo"},
        headers={"Idempotency-Key": "k-1"},
    )
    assert again.status == 201
    repeat = site.api.post("/cards", {"title": "dup", "assignee": "echo", "idempotency_key": "k-1"})
    assert repeat.status == 200 and repeat.json == again.json
    assert repeat.headers["location"] == f"/api/v1/cards/{repeat.json['id']}"
    assert site.api.get("/cards").json == site.cli("kanban", "list")
    assert site.api.get("/cards?all=true").json == site.cli("kanban", "list", "--all")
    assert site.api.get("/cards?status=ready&assignee=echo").json == site.cli(
        "kanban", "list", "--status", "ready", "--assignee", "echo"
    )
    assert site.api.get(f"/cards/{card}").json == site.cli("kanban", "show", card)
    assert site.api.get(f"/cards/{card[:6]}").json["id"] == card

    edited = site.api.request("PATCH", f"/cards/{card}", {"title": "renamed", "priority": 7})
    shown = site.cli("kanban", "show", card)
    assert edited.status == 200 and edited.json["title"] == "renamed"
    shown_only = ("retry", "runs", "events", "waiting")
    assert edited.json == {k: v for k, v in shown.items() if k not in shown_only}
    moved = site.api.post(f"/cards/{card}/move", {"status": "review"})
    assert moved.status == 200 and moved.json["status"] == "review"
    retried = site.api.post(f"/cards/{card}/retry", {"reason": "again please"})
    assert retried.json["status"] == "ready"
    assert site.cli("kanban", "show", card)["events"][-1]["data"]["reason"] == "again please"
    site.api.post(f"/cards/{card}/move", {"status": "blocked"})
    unblocked = site.api.post(f"/cards/{card}/unblock")
    assert unblocked.status == 200 and unblocked.json["status"] == "ready"
    archived = site.api.post(f"/cards/{card}/archive")
    assert archived.json["status"] == "archived"
    assert archived.json == {
        k: v for k, v in site.cli("kanban", "show", card).items() if k not in shown_only
    }


def test_the_card_list_pages_by_cursor(site: Site) -> None:
    for n in range(5):
        site.add(f"paged {n}", assignee="sleeper", priority=-100 - n)
    everything = site.cli("kanban", "list", "--assignee", "sleeper", "--status", "ready")
    pages: list[Any] = []
    path = "/cards?assignee=sleeper&status=ready&limit=2"
    while path:
        answer = site.api.get(path)
        assert answer.status == 200
        pages.append(answer.json)
        link = answer.headers.get("link")
        path = link.split(">")[0].removeprefix("</api/v1") if link else ""
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [c for p in pages for c in p] == everything
    bad = site.api.get("/cards?cursor=not-a-cursor")
    assert "cursor" in _problem(bad, 400)["detail"]


def test_runs_output_and_sessions_answer_as_logs_ps_and_kill(site: Site) -> None:
    card = site.add("runs once")
    site.home.dispatch("kanban", "tick")
    wait_for(lambda: site.cli("kanban", "show", card)["status"] == "done", timeout=30)
    shown = site.cli("kanban", "show", card)
    run = shown["runs"][0]
    assert site.api.get(f"/runs/{run['run_id']}").json == run
    session = run["session_id"]
    assert site.api.get(f"/runs/{run['run_id']}/output").json == site.cli("logs", run["run_id"])
    assert site.api.get(f"/sessions/{session}/output?tail=1").json == site.cli(
        "logs", session, "--tail", "1"
    )
    ranged = site.api.get(f"/sessions/{session}/output?start=6&end=10").json
    assert ranged["output"] == "hello from the worker\n"[6:10] and ranged["bytes"] == 4
    assert site.api.get("/sessions?all=true").json == site.cli("ps", "--all")
    assert site.api.get(f"/sessions/{session}").json in site.cli("ps", "--all")
    stream = SseReader(
        site.web.url + f"/api/v1/sessions/{session}/output/stream",
        {"Authorization": f"Bearer {site.read_token}"},
    )
    try:
        chunk = stream.next(None)
        assert chunk["data"]["output"].startswith("hello from the worker")
        end = stream.next("end")
        assert end["data"] == site.api.get(f"/sessions/{session}").json
    finally:
        stream.close()

    sleeper = site.add("sleeps", assignee="sleeper", priority=10**6)
    site.home.dispatch("kanban", "tick")
    wait_for(lambda: site.cli("kanban", "show", sleeper)["runs"][-1]["session_id"], timeout=30)
    open_run = site.cli("kanban", "show", sleeper)["runs"][-1]
    stale = site.api.post(
        f"/cards/{sleeper}/block",
        {"run": "r_0000000000", "kind": "needs_input", "reason": "which one?"},
    )
    assert "r_0000000000" in _problem(stale, 409)["detail"]
    killed = site.api.post(f"/sessions/{open_run['session_id']}/kill")
    assert killed.status == 200 and killed.json["state"] == "killed"
    assert killed.json == site.api.get(f"/sessions/{open_run['session_id']}").json


def test_events_by_cursor_and_as_a_stream_resuming_with_last_event_id(site: Site) -> None:
    first = site.api.get("/events?limit=1000").json
    assert first and [e["id"] for e in first] == sorted((e["id"] for e in first), key=int)
    card = site.cli("kanban", "list", "--all")[0]["id"]
    assert [e for e in first if e["card_id"] == card] == site.cli("kanban", "show", card)["events"]
    page = site.api.get("/events?after=0&limit=2")
    assert page.headers["link"].endswith("after=" + page.json[-1]["id"] + '>; rel="next"')
    last = first[-1]["id"]
    auth = {"Authorization": f"Bearer {site.read_token}"}
    stream = SseReader(site.web.url + f"/api/v1/events/stream?after={last}", auth)
    try:
        added = site.add("streamed")
        event = stream.next(None, timeout=15)
        assert event["data"]["card_id"] == added and event["data"]["kind"] == "created"
        assert event["id"] == event["data"]["id"]
    finally:
        stream.close()
    resumed = SseReader(
        site.web.url + "/api/v1/events/stream?after=0", {**auth, "Last-Event-ID": event["id"]}
    )
    try:
        site.api.request("PATCH", f"/cards/{added}", {"priority": 3})
        after = resumed.next(None, timeout=15)
        assert int(after["id"]) > int(event["id"]) and after["data"]["kind"] == "edited"
    finally:
        resumed.close()


def test_cron_answers_as_cron_list_history_pause_and_run(site: Site) -> None:
    assert site.api.get("/cron").json == site.cli("cron", "list")
    paused = site.api.post("/cron/nightly/pause")
    assert paused.json == {"id": "nightly", "paused": True, "changed": True}
    assert site.api.post("/cron/nightly/pause").json["changed"] is False
    assert site.cli("cron", "list")[0]["paused"] is True
    assert site.api.post("/cron/nightly/resume").json["paused"] is False
    fired = site.api.post("/cron/nightly/run")
    assert fired.status == 200 and fired.json["job_id"] == "nightly"
    wait_for(lambda: site.cli("cron", "history")[0]["outcome"] == "completed", timeout=30)
    assert site.api.get("/cron/history").json == site.cli("cron", "history")
    assert site.api.get("/cron/history?job=nightly&limit=1").json == site.cli(
        "cron", "history", "nightly", "--limit", "1"
    )
    assert "nope" in _problem(site.api.post("/cron/nope/run"), 404)["detail"]


def test_status_hosts_and_notifications_answer_as_the_cli(site: Site) -> None:
    status = site.api.get("/status?fires=2").json
    cli = site.cli("status", "--fires", "2")
    assert status.keys() == cli.keys()
    for key in ("placement", "cards", "kanban_paused", "next_cron_fires", "cluster"):
        assert status[key] == cli[key], key
    hosts = site.home.dispatch("hosts", check=False)
    problem = _problem(site.api.get("/hosts"), 400)
    assert hosts.returncode == 2 and problem["detail"] in hosts.stderr
    assert site.api.get("/notifications").json == site.cli("notify", "list")
    assert site.api.get("/notifications?dead=true").json == site.cli("notify", "list", "--dead")
    missing = site.home.dispatch("notify", "retry", "m_none", check=False)
    problem = _problem(site.api.post("/notifications/m_none/retry"), 404)
    assert problem["detail"] in missing.stderr
    dead = _dead_notification(site)
    assert site.api.get("/notifications?dead=true").json == site.cli("notify", "list", "--dead")
    retried = site.api.post(f"/notifications/{dead}/retry")
    assert retried.status == 200 and retried.json == {"id": dead, "rows": 1}
    assert [d["state"] for d in site.cli("notify", "list")] == ["pending"]


def _dead_notification(site: Site) -> str:
    """A message past its deadline in the module's outbox (its id)."""
    from dispatcher.app.database import open_state
    from dispatcher.launch.outbox import Outbox, Route, Subject
    from dispatcher.notify.store import NotifyStore

    outbox = Outbox([Route(events=frozenset({"card.done"}), channels=("hook",))])
    with open_state(site.home.state) as db:
        store = NotifyStore(db.read, db.write)
        with db.write() as conn:
            outbox.record(conn, "card.done", {"card": {"id": "c_1"}}, Subject(), 1.0)
        (item,) = store.claim(now=2.0, lease=30.0)
        store.settle(item, now=3.0, error="HTTP 500", retry_at=None)
    return item.message_id


def test_scopes_and_credentials(site: Site) -> None:
    anonymous = site.api.get("/cards", token="")
    assert _problem(anonymous, 401) and anonymous.headers["www-authenticate"].startswith("Bearer")
    assert site.reader.get("/cards").status == 200
    refused = site.reader.post("/cards", {"title": "no", "assignee": "echo"})
    assert "read scope" in _problem(refused, 403)["detail"]
    secret = (site.home.state / "web-secret").read_text().strip()
    assert site.api.post("/cron/nightly/resume", token=secret).status == 200
    expired = make_token(site.home, "old", "read", expires_at=time.time() + 1)
    wait_for(lambda: site.api.get("/cards", token=expired).status == 401, timeout=10)
    site.home.dispatch("web", "token", "revoke", "reader")
    assert "revoked" in _problem(site.reader.get("/cards"), 401)["detail"]
    site.reader.token = make_token(site.home, "reader", "read")
    listed = site.cli("web", "token", "list")
    assert sorted((t["name"], t["state"]) for t in listed) == [
        ("ci", "active"),
        ("old", "expired"),
        ("reader", "active"),
        ("reader", "revoked"),
    ]
    assert next(t for t in listed if t["name"] == "ci")["last_used_at"] is not None

    # A browser session reads but never writes through the API.
    session = Api(site.web.url)
    cookie = _session_cookie(site)
    reads = session.get("/cards", headers={"Cookie": cookie})
    writes = session.post("/cards", {"title": "x", "assignee": "echo"}, headers={"Cookie": cookie})
    session.close()
    assert reads.status == 200
    assert "browser session" in _problem(writes, 403)["detail"]


def _session_cookie(site: Site) -> str:
    import http.client
    import urllib.parse

    parts = urllib.parse.urlsplit(site.web.sign_in)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", f"{parts.path}?{parts.query}")
    answer = conn.getresponse()
    answer.read()
    conn.close()
    assert answer.status == 303
    return answer.getheader("set-cookie", "").split(";")[0]


def test_failed_authentication_is_limited_and_logged_without_the_token(site: Site) -> None:
    stranger = Api(site.web.url, "dsp_guessed-token-value", source="127.0.0.2")
    try:
        statuses = [stranger.get("/cards").status for _ in range(11)]
        assert statuses == [401] * 10 + [429]
        limited = stranger.get("/cards", token=site.operate_token)
        assert _problem(limited, 429) and int(limited.headers["retry-after"]) >= 1
        assert site.api.get("/cards").status == 200  # another address is not affected
    finally:
        stranger.close()
    logged = [line for line in site.web.errors if "failed from 127.0.0.2: unknown token" in line]
    assert len(logged) == 10 and "(10 in 60 s)" in logged[-1]
    assert not any("guessed" in line for line in site.web.errors)


def test_bad_input_is_one_problem_and_stores_nothing(site: Site) -> None:
    before = site.cli("kanban", "list", "--all")
    huge = b'{"title": "big", "assignee": "echo", "body": "' + b"x" * (21 << 20) + b'"}'
    assert (
        "larger than"
        in _problem(
            site.api.post("/cards", raw=huge, headers={"Content-Type": "application/json"}), 413
        )["detail"]
    )
    assert (
        "not valid JSON"
        in _problem(
            site.api.post(
                "/cards", raw=b'{"title": ', headers={"Content-Type": "application/json"}
            ),
            400,
        )["detail"]
    )
    assert _problem(
        site.api.post("/cards", raw=b"title=x", headers={"Content-Type": "text/plain"}), 415
    )
    for body, word in (
        ({"title": "x"}, "assignee"),
        ({"title": "x", "assignee": "echo", "colour": "red"}, "colour"),
        ({"title": "x", "assignee": "echo", "priority": "high"}, "priority"),
        ({"title": "x", "assignee": "echo", "priority": 10**10}, "priority"),
        ({"title": "", "assignee": "echo"}, "title"),
        ({"title": "a\u0000b", "assignee": "echo"}, "title"),
        ({"title": "x", "assignee": "nobody"}, "nobody"),
        ([1, 2], "object"),
    ):
        assert word in _problem(site.api.post("/cards", body), 400)["detail"], body
    cli = site.home.dispatch("kanban", "add", "x", "--assignee", "nobody", check=False)
    detail = _problem(site.api.post("/cards", {"title": "x", "assignee": "nobody"}), 400)["detail"]
    assert cli.stderr.strip() == f"dispatch: error: {detail}"
    assert "limit" in _problem(site.api.get("/cards?limit=0"), 400)["detail"]
    assert "unknown" in _problem(site.api.get("/cards?colour=red"), 400)["detail"]
    assert _problem(site.api.get("/cards/c_ffffffffff"), 404)
    assert _problem(site.api.get("/sessions/s_ffffffffffff"), 404)
    assert _problem(site.api.get("/runs/r_ffffffffff"), 404)
    assert _problem(site.api.get("/no/such/path"), 404)
    wrong = site.api.request("DELETE", "/cards")
    assert _problem(wrong, 405) and wrong.headers["allow"] == "GET, HEAD, POST"
    wrong = site.api.request("PUT", "/cards/c_ffffffffff")
    assert _problem(wrong, 405) and wrong.headers["allow"] == "GET, HEAD, PATCH"
    ready = site.add("cannot retry a ready card")
    assert _problem(site.api.post(f"/cards/{ready}/retry"), 409)
    # Backing off after a failure, it can: the wait is cut short, the count starts over.
    board = site.home.workspace()
    try:
        waits = {"retry_at": time.time() + 600, "consecutive_failures": 1}
        board.store.append_event(ready, EventKind.FAILED, {}, now=time.time(), fields=waits)
    finally:
        board.close()
    cut_short = site.api.post(f"/cards/{ready}/retry", {"reason": "the API is back"})
    assert cut_short.status == 200 and cut_short.json["retry_at"] is None
    assert cut_short.json["consecutive_failures"] == 0
    assert _problem(site.api.post(f"/cards/{ready}/move", {"status": "running"}), 400)
    site.api.post(f"/cards/{ready}/archive")
    after = site.cli("kanban", "list", "--all")
    assert [c for c in after if c["id"] != ready] == before


def test_api_only_serves_the_api_and_nothing_else(site: Site, tmp_path: Path) -> None:
    web = WebProcess(site.home.config, site.home.state, site.home.env, "--api-only")
    try:
        client = Api(web.url, site.operate_token)
        assert client.get("/cards").json == site.cli("kanban", "list")
        import urllib.error
        import urllib.request

        with pytest.raises(urllib.error.HTTPError) as page:
            urllib.request.urlopen(web.url + "/", timeout=30)
        assert page.value.code == 404
        assert page.value.headers["content-type"] == "application/problem+json"
        client.close()
    finally:
        assert web.stop() == 0, web.errors


@pytest.mark.postgres
def test_cluster_mode_tokens_cards_and_hosts(tmp_path: Path, pg_url: str) -> None:
    """In cluster mode a token lives in the cluster database (every host's web accepts it)
    and the API reads the cluster's board and hosts as the CLI does."""
    home = WebHome(tmp_path, CONFIG + f"cluster:\n  database: '{pg_url}'\n  host_id: alpha\n")
    token = make_token(home, "ci", "operate")
    web = WebProcess(home.config, home.state, home.env)
    client = Api(web.url, token)
    try:
        added = client.post("/cards", {"title": "in the cluster", "assignee": "echo"})
        assert added.status == 201
        assert client.get("/cards").json == home.json("kanban", "list")
        assert client.get("/hosts").json == home.json("hosts")
        assert client.get(f"/cards/{added.json['id']}").json == home.json(
            "kanban", "show", added.json["id"]
        )
    finally:
        client.close()
        assert web.stop() == 0, web.errors
