"""dispatch web over HTTP (Starlette's TestClient): every page, every action checked through
the CLI, every security rule, bad input, and /metrics parsed by prometheus_client."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from dispatcher.cli.main import main
from dispatcher.config import load_config
from dispatcher.web.app import create_app, create_site
from dispatcher.web.guard import Access, cookie_name
from dispatcher.web.keys import Keys, load_secret
from dispatcher.web.server import allowed_hosts, parse_listen
from dispatcher.web.source import Source
from scope.foundation.clock import FakeClock
from tests.support.env import no_bus_env
from tests.support.wait import wait_for

BASE = "http://127.0.0.1:8470"
XSS = "<img src=x onerror=alert(1)>"
CONFIG = """
kanban:
  degrade_without_scope: true
  failure_limit: 3
  assignees:
    echo:
      command: ["sh", "-c", "echo hi"]
    sleeper:
      command: ["sleep", "60"]
cron:
  jobs:
    - id: nightly
      schedule: "0 3 * * *"
      timezone: Europe/Berlin
      command: ["true"]
"""


class Dash:
    """A dashboard on a fresh state dir, a TestClient, and the CLI on the same state."""

    def __init__(
        self,
        root: Path,
        capsys: pytest.CaptureFixture[str],
        *,
        remote: bool = False,
        extra: str = "",
    ):
        self.root = root
        self.capsys = capsys
        self.config = root / "config.yaml"
        self.config.write_text(CONFIG + extra)
        self.state = root / "state"
        self.env = no_bus_env(root)
        settings = load_config(self.config).settings
        self.source = Source(settings, self.state, self.env, config_path=self.config)
        self.secret = load_secret(self.state)
        listen = parse_listen("0.0.0.0:8470" if remote else "127.0.0.1:8470")
        self.access = Access(
            keys=Keys(self.secret),
            hosts=allowed_hosts(listen, 8470),
            pages_need_secret=remote,
            cookie=cookie_name(8470),
            origin=BASE,
        )
        self.site = create_site(self.source, self.access)
        self.client = TestClient(create_app(self.site), base_url=BASE)

    def cli(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(
            ["--config", str(self.config), "--state-dir", str(self.state), *argv],
            environ=self.env,
        )
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str) -> Any:
        code, out, err = self.cli(*argv, "--json")
        assert code == 0, err
        return json.loads(out)

    def add(self, title: str = "a card", *args: str) -> str:
        code, out, err = self.cli("kanban", "add", title, "--assignee", "echo", *args)
        assert code == 0, err
        return out.strip()

    def sign_in(self) -> None:
        answer = self.client.get(f"/?token={self.secret}", follow_redirects=False)
        assert answer.status_code == 303

    def token(self, action: str) -> str:
        """A valid CSRF token of this client's session for ``action`` (for forms a page does
        not offer in its current state)."""
        nonce = self.access.keys.session_nonce(self.client.cookies.get(self.access.cookie))
        assert nonce is not None, "sign in first"
        return self.access.keys.csrf_token(nonce, action)

    def post(self, path: str, page: str | None = None, **fields: str) -> Any:
        """POST a form the way a browser would: with the CSRF token the page's form carries."""
        if "csrf" not in fields:
            html = self.client.get(page or path_page(path)).text
            fields["csrf"] = form_token(html, path)
        return self.client.post(path, data=fields, follow_redirects=False)

    def close(self) -> None:
        registry = self.source.registry()
        for session in registry.list_sessions():
            registry.kill(session.id, grace=1)
        self.client.close()
        self.source.close()


def path_page(action: str) -> str:
    """The page whose form posts to ``action``."""
    if action.startswith("/cards/") or action.startswith("/runs/"):
        return "/cards/" + action.split("/")[2] if action.startswith("/cards/") else "/"
    if action.startswith("/cron/"):
        return "/cron"
    if action.startswith("/sessions/"):
        return "/sessions/" + action.split("/")[2]
    return "/"


def form_token(html: str, action: str) -> str:
    """The CSRF token of the form that posts to ``action`` on a page."""
    match = re.search(
        rf'action="{re.escape(action)}"[^>]*>.*?name="csrf" value="([^"]*)"', html, re.S
    )
    assert match, f"no form for {action} on the page"
    return match.group(1)


@pytest.fixture
def dash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Dash]:
    board = Dash(tmp_path, capsys)
    try:
        yield board
    finally:
        board.close()


# -- pages ------------------------------------------------------------------------------------


def test_the_board_shows_cards_added_by_the_cli_in_their_columns(dash: Dash) -> None:
    ready = dash.add("write the notes", "--priority", "2")
    blocked = dash.add("stuck")
    dash.cli("kanban", "move", blocked, "blocked")
    page = dash.client.get("/")
    assert page.status_code == 200
    html = page.text
    column = html[html.index('id="col-ready"') : html.index('id="col-running"')]
    assert f'id="card-{ready}"' in column and "write the notes" in column and "p2" in column
    column = html[html.index('id="col-blocked"') : html.index('id="col-review"')]
    assert f'id="card-{blocked}"' in column and "needs_input" in column
    assert 'data-count="ready">1<' in html and "0/3 fails" in html
    assert 'data-stream="/live/board?after=' in html


def test_every_page_renders(dash: Dash) -> None:
    card = dash.add("card one")
    for path in (
        "/",
        f"/cards/{card}",
        "/cron",
        "/cron/nightly",
        "/sessions",
        "/sessions?all=1",
        "/status",
        "/hosts",
    ):
        answer = dash.client.get(path)
        assert answer.status_code == 200, (path, answer.text[:500])
        assert answer.headers["content-type"].startswith("text/html")
    cron = dash.client.get("/cron").text
    assert (
        "Europe/Berlin" in cron
        and cron.count("03:00:00 CET (in ") + cron.count("03:00:00 CEST (in ") == 5
    )
    assert "Cluster mode is off" in dash.client.get("/hosts").text
    status = dash.client.get("/status").text
    assert "not running" in status and "Remedies" in status


def test_a_card_prefix_redirects_and_a_run_leads_to_its_card(dash: Dash) -> None:
    card = dash.add()
    answer = dash.client.get(f"/cards/{card[:6]}", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == f"/cards/{card}"


@pytest.mark.parametrize(
    "path",
    [
        "/cards/c_deadbeef00",
        "/cards/not-an-id",
        "/runs/r_deadbeef00",
        "/sessions/s_deadbeef0000",
        "/cron/no-such-job",
        "/no/such/page",
        "/live/cards/c_deadbeef00",
        "/live/sessions/s_deadbeef0000",
        "/live/cron/no-such-job",
    ],
)
def test_unknown_ids_are_a_404_page(dash: Dash, path: str) -> None:
    answer = dash.client.get(path)
    assert answer.status_code == 404
    assert "<h1>404</h1>" in answer.text and "Traceback" not in answer.text


def test_user_text_is_inert_in_every_view(dash: Dash) -> None:
    card = dash.add(XSS, "--body", "<script>alert(2)</script>")
    for path in ("/", f"/cards/{card}"):
        html = dash.client.get(path).text
        assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
        assert "<script>alert" not in html
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in dash.client.get(f"/cards/{card}").text


# -- security ---------------------------------------------------------------------------------


def test_every_answer_carries_the_security_headers(dash: Dash) -> None:
    for path in ("/", "/no/such/page", "/static/dispatch.js", "/metrics"):
        headers = dash.client.get(path).headers
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp and "default-src 'none'" in csp
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "no-referrer"
    assert dash.client.get("/").headers["cache-control"] == "no-store"
    assert dash.client.get("/static/dispatch.js").headers["cache-control"] == "no-cache"


def test_pages_use_no_inline_script_or_style(dash: Dash) -> None:
    dash.sign_in()
    card = dash.add()
    for path in ("/", f"/cards/{card}", "/cron", "/status"):
        html = dash.client.get(path).text
        assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/dispatch.js" defer>']
        assert not re.search(r"<[^>]*\s(style|on\w+)\s*=", html, re.I) and "<style" not in html


def test_the_token_signs_in_and_leaves_the_address(dash: Dash) -> None:
    assert "Read-only" in dash.client.get("/").text
    answer = dash.client.get(f"/cron?token={dash.secret}&x=1", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/cron?x=1"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith("dispatch_session_8470=") and dash.secret not in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Read-only" not in dash.client.get("/").text
    wrong = dash.client.get("/?token=guess", follow_redirects=False)
    assert wrong.status_code == 403 and "dispatch web --url" in wrong.text


def test_an_action_without_the_secret_is_refused(dash: Dash) -> None:
    answer = dash.client.post("/cards", data={"title": "sneaky", "assignee": "echo"})
    assert answer.status_code == 403 and "secret" in answer.text
    assert dash.json("kanban", "list") == []


def test_an_action_without_or_with_a_wrong_csrf_token_is_refused(dash: Dash) -> None:
    dash.sign_in()
    form = {"title": "sneaky", "assignee": "echo"}
    missing = dash.client.post("/cards", data=form)
    assert missing.status_code == 403 and "reload the page" in missing.text
    other_form = form_token(dash.client.get("/").text, "/board/pause")
    wrong = dash.client.post("/cards", data={**form, "csrf": other_form})
    assert wrong.status_code == 403 and "reload the page" in wrong.text
    assert dash.json("kanban", "list") == []


def test_a_stale_csrf_token_is_refused_with_a_reload_hint(dash: Dash) -> None:
    dash.sign_in()
    nonce = dash.access.keys.session_nonce(dash.client.cookies.get(dash.access.cookie))
    assert nonce is not None
    old = Keys(dash.secret, clock=FakeClock(time.time() - 13 * 3600)).csrf_token(nonce, "card.add")
    answer = dash.client.post("/cards", data={"title": "t", "assignee": "echo", "csrf": old})
    assert answer.status_code == 403
    assert "older than 12 hours" in answer.text and "reload the page" in answer.text


def test_a_token_from_another_session_is_refused(dash: Dash) -> None:
    dash.sign_in()
    token = form_token(dash.client.get("/").text, "/cards")
    other = TestClient(dash.client.app, base_url=BASE)
    other.get(f"/?token={dash.secret}")
    answer = other.post("/cards", data={"title": "t", "assignee": "echo", "csrf": token})
    assert answer.status_code == 403
    other.close()


def test_a_foreign_host_header_is_refused(dash: Dash) -> None:
    dash.sign_in()
    for method in ("GET", "POST"):
        answer = dash.client.request(method, "/", headers={"host": "evil.example:8470"})
        assert answer.status_code == 403 and "does not name this dashboard" in answer.text
    assert dash.client.get("/metrics", headers={"host": "evil.example"}).status_code == 403


def test_a_cross_site_post_is_refused_even_with_a_token(dash: Dash) -> None:
    dash.sign_in()
    token = form_token(dash.client.get("/").text, "/cards")
    form = {"title": "t", "assignee": "echo", "csrf": token}
    for headers in ({"origin": "http://evil.example"}, {"sec-fetch-site": "cross-site"}):
        answer = dash.client.post("/cards", data=form, headers=headers)
        assert answer.status_code == 403
    assert dash.json("kanban", "list") == []


def test_a_remote_dashboard_needs_the_secret_for_every_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    board = Dash(tmp_path, capsys, remote=True)
    try:
        client = board.client
        for path in ("/", "/cron", "/metrics", "/live/board", "/cards/c_deadbeef00"):
            answer = client.get(path)
            assert answer.status_code == 401, path
            assert answer.headers["www-authenticate"].startswith("Bearer")
            assert str(board.state) not in answer.text
        assert client.get("/static/dispatch.css").status_code == 200
        bearer = {"authorization": f"Bearer {board.secret}"}
        assert client.get("/metrics", headers=bearer).status_code == 200
        answer = client.post("/board/pause", data={}, headers=bearer, follow_redirects=False)
        assert answer.status_code == 303 and board.json("kanban", "board")["paused"] is True
        board.sign_in()
        assert client.get("/").status_code == 200
    finally:
        board.close()


# -- actions, checked through the CLI ---------------------------------------------------------


def test_add_and_edit_a_card(dash: Dash) -> None:
    dash.sign_in()
    parent = dash.add("parent")
    answer = dash.post(
        "/cards",
        title="from the web",
        assignee="echo",
        priority="4",
        body="line one\nline two",
        parents=parent,
        failure_limit="7",
        next="/",
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/"
    [added] = [c for c in dash.json("kanban", "list") if c["title"] == "from the web"]
    assert added["priority"] == 4 and added["body"] == "line one\nline two"
    assert added["parents"] == [parent] and added["failure_limit"] == 7
    assert added["status"] == "todo"
    card = added["id"]
    answer = dash.post(f"/cards/{card}/edit", title="renamed", priority="1", body="")
    assert answer.status_code == 303 and answer.headers["location"] == f"/cards/{card}"
    shown = dash.json("kanban", "show", card)
    assert shown["title"] == "renamed" and shown["priority"] == 1 and shown["body"] == ""
    assert shown["events"][-1]["kind"] == "edited"


def test_unblock_move_and_archive(dash: Dash) -> None:
    dash.sign_in()
    card = dash.add()
    dash.cli("kanban", "move", card, "blocked")
    assert dash.post(f"/cards/{card}/unblock").status_code == 303
    assert dash.json("kanban", "show", card)["status"] == "ready"
    assert dash.post(f"/cards/{card}/move", status="review").status_code == 303
    assert dash.json("kanban", "show", card)["status"] == "review"
    asked = dash.post(f"/cards/{card}/archive")
    assert asked.status_code == 200 and "Archive card" in asked.text  # a confirmation page
    assert dash.json("kanban", "show", card)["status"] == "review"
    confirmed = dash.post(f"/cards/{card}/archive", confirm="yes")
    assert confirmed.status_code == 303
    assert dash.json("kanban", "show", card)["status"] == "archived"


def test_a_card_page_retries_a_card_the_way_kanban_retry_does(dash: Dash) -> None:
    dash.sign_in()
    card = dash.add()
    # A ready card waiting for nothing has no Retry button, and a forged post is refused.
    assert f"/cards/{card}/retry" not in dash.client.get(f"/cards/{card}").text
    wrong = dash.post(f"/cards/{card}/retry", csrf=dash.token("card.retry"))
    assert wrong.status_code == 409 and "retry" in wrong.text
    dash.cli("kanban", "move", card, "blocked")
    page = dash.client.get(f"/cards/{card}").text
    assert f"/cards/{card}/retry" in page and ">Retry</button>" in page
    assert dash.post(f"/cards/{card}/retry").status_code == 303
    shown = dash.json("kanban", "show", card)
    assert shown["status"] == "ready"
    moved = shown["events"][-1]
    assert moved["kind"] == "moved" and moved["data"]["action"] == "retry"
    assert moved["data"]["reason"] == "retried in dispatch web"


def test_the_confirmation_page_carries_the_same_form(dash: Dash) -> None:
    dash.sign_in()
    card = dash.add()
    asked = dash.post(f"/cards/{card}/archive", next="/")
    token = form_token(asked.text, f"/cards/{card}/archive")
    assert 'name="confirm" value="yes"' in asked.text
    done = dash.client.post(
        f"/cards/{card}/archive",
        data={"csrf": token, "confirm": "yes", "next": "/"},
        follow_redirects=False,
    )
    assert done.status_code == 303 and done.headers["location"] == "/"


def test_pause_and_resume_the_board(dash: Dash) -> None:
    dash.sign_in()
    assert dash.post("/board/pause").status_code == 303
    assert dash.json("kanban", "board")["paused"] is True
    assert "Claiming is paused" in dash.client.get("/").text
    assert dash.post("/board/resume").status_code == 303
    assert dash.json("kanban", "board")["paused"] is False


def test_pause_resume_and_run_a_cron_job(dash: Dash) -> None:
    dash.sign_in()
    assert dash.post("/cron/nightly/pause").status_code == 303
    assert dash.json("cron", "list")[0]["paused"] is True
    assert dash.post("/cron/nightly/resume").status_code == 303
    assert dash.json("cron", "list")[0]["paused"] is False
    ran = dash.post("/cron/nightly/run")
    assert ran.status_code == 303 and ran.headers["location"].startswith("/sessions/s_")
    history = dash.json("cron", "history", "nightly")
    assert history and history[0]["kind"] == "manual" and history[0]["session_id"]
    assert dash.client.get(ran.headers["location"]).status_code == 200


def test_kill_a_run_from_the_web(dash: Dash) -> None:
    dash.sign_in()
    _code, out, _err = dash.cli("kanban", "add", "sleepy", "--assignee", "sleeper")
    card = out.strip()
    assert dash.cli("kanban", "tick")[0] == 0
    run = dash.json("kanban", "show", card)["current_run_id"]
    assert run is not None
    page = dash.client.get(f"/cards/{card}").text
    token = form_token(page, f"/runs/{run}/kill")
    answer = dash.post(f"/runs/{run}/kill", page=f"/cards/{card}", confirm="yes")
    assert answer.status_code == 303 and answer.headers["location"] == f"/cards/{card}"
    shown = dash.json("kanban", "show", card)
    [closed] = [r for r in shown["runs"] if r["run_id"] == run]
    assert closed["outcome"] == "failed" and closed["signal"] in ("SIGTERM", "SIGKILL")
    session = closed["session_id"]
    assert next(s for s in dash.json("ps", "--all") if s["id"] == session)["state"] == "killed"
    assert f'action="/runs/{run}/kill"' not in dash.client.get(f"/cards/{card}").text
    again = dash.client.post(f"/runs/{run}/kill", data={"csrf": token, "confirm": "yes"})
    assert again.status_code == 409 and "already ended" in again.text


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"assignee": "echo"}, "title"),
        ({"title": "   ", "assignee": "echo"}, "title"),
        ({"title": "x", "assignee": "echo", "priority": "high"}, "priority"),
        ({"title": "x", "assignee": "nobody"}, "assignee"),
        ({"title": "x", "assignee": "echo", "parents": "c_deadbeef00"}, "parents"),
        ({"title": "x", "assignee": "echo", "failure_limit": "0"}, "failure_limit"),
    ],
)
def test_a_malformed_form_is_a_400_naming_the_field(
    dash: Dash, fields: dict[str, str], named: str
) -> None:
    dash.sign_in()
    answer = dash.post("/cards", **fields)
    assert answer.status_code == 400, answer.text
    assert f"form field &#39;{named}&#39;" in answer.text
    assert dash.json("kanban", "list") == []


def test_a_move_to_running_or_an_unblock_of_a_ready_card_is_refused(dash: Dash) -> None:
    dash.sign_in()
    card = dash.add()
    bad = dash.post(f"/cards/{card}/move", status="running")
    assert bad.status_code == 400 and "status" in bad.text
    wrong = dash.post(f"/cards/{card}/unblock", csrf=dash.token("card.unblock"))
    assert wrong.status_code == 409 and "it is ready" in wrong.text


def test_a_form_that_is_not_a_form_is_a_400(dash: Dash) -> None:
    dash.sign_in()
    token = form_token(dash.client.get("/").text, "/cards")
    as_json = dash.client.post("/cards", json={"title": "x", "csrf": token})
    assert as_json.status_code == 400 and "x-www-form-urlencoded" in as_json.text
    binary = dash.client.post(
        "/cards",
        content=b"title=\xff&csrf=" + token.encode(),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert binary.status_code == 400 and "UTF-8" in binary.text
    huge = dash.client.post(
        "/cards",
        content=b"body=" + b"x" * (2 * 1024 * 1024),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert huge.status_code == 400 and "larger than" in huge.text


def test_an_unknown_card_in_an_action_is_a_404(dash: Dash) -> None:
    dash.sign_in()
    card = dash.add()
    dash.cli("kanban", "move", card, "blocked")
    # A token is per action, not per card: the one from a real card's page serves here.
    token = form_token(dash.client.get(f"/cards/{card}").text, f"/cards/{card}/unblock")
    for target in ("c_deadbeef00", "bogus"):
        answer = dash.client.post(f"/cards/{target}/unblock", data={"csrf": token})
        assert answer.status_code == 404 and "no card" in answer.text
        asked = dash.client.post(
            f"/cards/{target}/archive", data={"csrf": dash.token("card.archive")}
        )
        assert asked.status_code == 404
    killed = dash.client.post("/runs/r_deadbeef00/kill", data={"csrf": dash.token("run.kill")})
    assert killed.status_code == 404 and "no run" in killed.text


# -- metrics ----------------------------------------------------------------------------------


def _metrics(dash: Dash) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    answer = dash.client.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            found.setdefault(sample.name, {})[key] = sample.value
    return found


def test_admission_on_the_status_page_and_in_metrics(dash: Dash) -> None:
    from dispatcher.launch.pressure import PROC_ENV

    proc = dash.root / "proc"
    (proc / "pressure").mkdir(parents=True)
    (proc / "pressure" / "memory").write_text("some avg10=34.00 avg60=1 avg300=0 total=1\n")
    (proc / "meminfo").write_text("MemAvailable:   1048576 kB\n")
    dash.source.environ[PROC_ENV] = str(proc)
    calm = dash.client.get("/status").text
    assert "taking new work" in calm and "34.0 % (PSI some avg10)" in calm
    metrics = _metrics(dash)
    assert metrics["dispatch_admission_memory_pressure_percent"][()] == 34.0
    assert metrics["dispatch_admission_memory_available_bytes"][()] == 2**30
    assert metrics["dispatch_admission_held"][(("reason", "memory_pressure"),)] == 0
    # A oneshot tick decides (and records) the hold; the page and /metrics show it.
    dash.env[PROC_ENV] = str(proc)
    code, out, _err = dash.cli("kanban", "tick", "--json")
    assert code == 0 and json.loads(out)["held"] == "memory pressure 34 %"
    held = dash.client.get("/status").text
    assert "holding new work" in held and "memory pressure 34 %" in held
    assert "decided by kanban tick" in held
    metrics = _metrics(dash)
    assert metrics["dispatch_admission_held"][(("reason", "memory_pressure"),)] == 1
    assert metrics["dispatch_admission_held"][(("reason", "cpu_pressure"),)] == 0
    (proc / "pressure" / "memory").unlink()  # no PSI: the page says MemAvailable decides
    assert "no PSI here" in dash.client.get("/status").text
    assert "dispatch_admission_memory_pressure_percent" not in _metrics(dash)


def test_metrics_match_the_board(dash: Dash) -> None:
    for title in ("one", "two", "three"):
        dash.add(title)
    blocked = dash.add("four")
    dash.cli("kanban", "move", blocked, "blocked")
    dash.cli("kanban", "pause")
    metrics = _metrics(dash)
    board = dash.json("kanban", "board")
    for status in ("todo", "ready", "running", "blocked", "review", "done"):
        assert metrics["dispatch_cards"][(("status", status),)] == len(board[status])
    assert metrics["dispatch_kanban_paused"][()] == 1
    assert metrics["dispatch_serve_up"][()] == 0
    assert metrics["dispatch_state_readable"][()] == 1
    assert metrics["dispatch_cron_job_paused"][(("job", "nightly"),)] == 0
    assert metrics["dispatch_kanban_ready_to_running_seconds_count"][()] == 0
    # The placement each caller gets is the doctor's verdict (which depends on the machine:
    # without systemd as PID 1 a gateway cannot sit in a unit, so its workers run in_process).
    _, out, _ = dash.cli("doctor", "--json")
    doctor = json.loads(out)
    expected = doctor["placement"]["gateway_kanban"]
    assert (("caller", "gateway_kanban"), ("placement", expected)) in metrics[
        "dispatch_scope_placement"
    ]
    assert metrics["dispatch_scope_probe_ok"][()] == 0


def test_metrics_count_runs_and_the_ready_to_running_latency(dash: Dash) -> None:
    for title in ("one", "two"):
        dash.add(title)
    assert dash.cli("kanban", "tick")[0] == 0

    def settled() -> bool:
        dash.cli("kanban", "list")  # reconciles finished workers, as the gateway would
        return all(c["status"] == "done" for c in dash.json("kanban", "list"))

    wait_for(settled, timeout=30, interval=0.2, what="both echo cards done")
    metrics = _metrics(dash)
    assert (
        metrics["dispatch_kanban_runs_total"][
            (("infrastructure", "false"), ("outcome", "completed"))
        ]
        == 2
    )
    assert metrics["dispatch_kanban_ready_to_running_seconds_count"][()] == 2
    assert metrics["dispatch_kanban_ready_to_running_seconds_sum"][()] >= 0
    assert metrics["dispatch_cards"][(("status", "done"),)] == 2
    assert metrics["dispatch_kanban_runs_open"][()] == 0


def test_metrics_count_retries_by_reason_and_fires_retried(dash: Dash) -> None:
    from dispatcher.cron.changes import FireChange
    from dispatcher.cron.records import Kind, RetryKind, Status, Try
    from dispatcher.kanban.model import EventKind
    from dispatcher.launch.outcome import Outcome

    card = dash.add("flaky")
    store = dash.source.store
    now = time.time()
    for kind, data in (
        (EventKind.FAILED, {"retry_at": now + 10, "attempt": 1}),  # counted back-off
        (EventKind.FAILED, {"retry_at": now + 10, "counted": False}),  # counted: false rule
        (EventKind.TEMPFAIL, {"retry_at": now + 30}),  # exit 75
        (EventKind.FAILED, {"attempt": 2}),  # the breaker gave up: no retry
        (EventKind.DEFERRED, {"until": now + 60}),
    ):
        store.append_event(card, kind, data, now=now)
    ledger = dash.source.ledger()
    failed = Try(attempt=1, outcome=Outcome.FAILED)
    fires = {
        "nightly@2026-12-01T03:00:00": (
            (failed, Try(attempt=2, outcome=Outcome.COMPLETED)),
            "done",
        ),
        "nightly@2026-12-02T03:00:00": (
            (Try(attempt=1, outcome=Outcome.DEFERRED, counted=False),),
            "retry",
        ),
        "nightly@2026-12-03T03:00:00": ((Try(attempt=1, outcome=Outcome.COMPLETED),), "done"),
    }
    for key, (tries, status) in fires.items():
        with ledger.transaction() as tx:
            row_id = tx.insert(
                fire_key=key,
                job_id="nightly",
                kind=Kind.SCHEDULE,
                nominal_wall=key[8:],
                zone="UTC",
                nominal=now,
                decided_at=now,
                status=Status.CLAIMED,
                attempts=3,
            )
        assert row_id is not None
        change = FireChange(
            status=Status(status),
            tries=tries,
            retry_kind=RetryKind.DEFERRED,
            retry_at=now + 600,
            retry_reason="quota",
        )
        ledger.update(row_id, [Status.CLAIMED], change)
    metrics = _metrics(dash)
    kanban = metrics["dispatch_kanban_retries_total"]
    assert kanban == {
        (("reason", "backoff"),): 1,
        (("reason", "uncounted"),): 2,
        (("reason", "deferred"),): 1,
    }
    cron = metrics["dispatch_cron_retries_total"]
    assert cron == {
        (("job", "nightly"), ("reason", "backoff")): 1,
        (("job", "nightly"), ("reason", "deferred")): 1,
    }
    assert metrics["dispatch_cron_fires_retried_total"] == {(("job", "nightly"),): 1}
    # The cron page shows the pending deferral and the retried fire's tries.
    page = dash.client.get("/cron/nightly").text
    history = page[page.index("<h2>History</h2>") :]
    assert "attempt 1 of 3: failed" in history, history
    assert "by the worker: quota" in history


@pytest.mark.postgres
def test_cluster_mode_shows_every_host_and_its_lease(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_url: str
) -> None:
    from dispatcher.cluster.database import ClusterDB
    from dispatcher.cluster.hosts import Hosts

    with ClusterDB(pg_url) as cluster:
        cluster.migrate()
        hosts = Hosts(cluster, lease_ttl=30)
        hosts.join("alpha", boot_id="boot-a", version="1")
        hosts.join("beta", boot_id="boot-b", version="1")
        Hosts(cluster, lease_ttl=30, shift=lambda: -120).join("gamma", boot_id="g", version="1")
    board = Dash(tmp_path, capsys, extra=f"cluster:\n  database: {pg_url}\n  host_id: alpha\n")
    try:
        html = board.client.get("/hosts").text
        assert "Cluster mode is off" not in html
        for host in ("alpha", "beta", "gamma"):
            assert f"<td>{host}" in html
        assert "(this host)" in html and html.count(">live<") == 2 and ">expired<" in html
        metrics = _metrics(board)
        live = metrics["dispatch_cluster_host_lease_live"]
        assert live == {(("host", "alpha"),): 1, (("host", "beta"),): 1, (("host", "gamma"),): 0}
        assert metrics["dispatch_state_readable"][()] == 1
    finally:
        board.close()


def test_the_small_page_defects_are_gone(dash: Dash, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, section 5: what each page shows, checked against the CLI."""
    # A todo card links the parents it waits for, on its tile.
    parent = dash.add("first")
    child = dash.add("second", "--parent", parent)
    board = dash.client.get("/").text
    todo = board[board.index('id="col-todo"') : board.index('id="col-ready"')]
    assert f'id="card-{child}"' in todo
    assert f'waits for <a class="id" href="/cards/{parent}">{parent}</a>' in todo
    # A running session's page shows its log's real size, and times as the CLI writes them.
    code, out, err = dash.cli("run", "--", "sh", "-c", "printf 'hello there\\n'; exec sleep 60")
    assert code == 0, err
    session = out.strip()
    registry = dash.source.registry()
    wait_for(lambda: registry.log_size(session) == 12, timeout=10, what="the worker's line")
    page = dash.client.get(f"/sessions/{session}").text
    assert "(12 bytes)" in page and registry.get(session).total_bytes == 0
    assert re.search(r"<dt>started</dt><dd>\d\d:\d\d:\d\d \S+ \((now|\d+s ago)\)</dd>", page)
    assert not re.search(r"\d\d:\d\d:\d\d [+-]\d\d:\d\d", page)  # no bare numeric offset
    # A kanban session's owner links its card (through its run).
    code, out, err = dash.cli("kanban", "add", "sleepy", "--assignee", "sleeper")
    assert code == 0, err
    sleepy = out.strip()
    assert dash.cli("kanban", "tick")[0] == 0
    # The tick also claims the echo cards above; only the sleeper's run stays up.
    shown = dash.json("kanban", "show", sleepy)
    assert shown["status"] == "running", shown
    run = shown["current_run_id"]
    worker = next(r for r in shown["runs"] if r["run_id"] == run)["session_id"]
    page = dash.client.get(f"/sessions/{worker}").text
    assert f'<a href="/runs/{run}">kanban:{run}</a>' in page
    # The cron job page shows the command and the policies as `cron list` writes them.
    job = dash.client.get("/cron/nightly").text
    code, listed, err = dash.cli("cron", "list")
    assert code == 0 and "overlap=" in listed, (code, listed, err)
    policies = listed[listed.index("overlap=") :].splitlines()[0].strip()
    assert "<dt>command</dt><dd><code>true</code>" in job and f"<code>{policies}</code>" in job
    # The status page's doctor panel starts as `dispatch doctor` does on such a host.
    monkeypatch.setattr("scope.doctor.booted_with_systemd", lambda marker="": False)
    assert dash.cli("doctor")[1].splitlines()[0] == "system:    FAIL  not booted with systemd"
    status = dash.client.get("/status").text
    panel = status[status.index("<h2>Doctor</h2>") :]
    assert '<table class="kv">\n<tr><th>system</th><td>FAIL not booted with systemd' in panel
    # The two pause buttons say what they pause.
    dash.sign_in()
    board = dash.client.get("/").text
    assert ">Pause live updates</button>" in board and "Pause claiming" in board
