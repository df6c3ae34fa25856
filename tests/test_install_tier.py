"""The production-install tier: every mode of dispatch from the wheel, installed without extras.

One module-scoped venv (tests/support/install.py) holds the wheel built from this checkout and
only its declared runtime requirements; every command here is that venv's ``bin/dispatch``,
run from a home directory outside the source tree with no ``PYTHONPATH``, using the default
config and state locations under that home, as a deployment would. The long-running modes run
as real units of the private systemd user manager, the cluster on the suite's PostgreSQL. One
test per mode, so a failure names the mode. ``DISPATCH_REQUIRE_INSTALL=1`` (CI) makes a tier
that cannot run a failure.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import WebProcess
from tests.support.install import (
    ROOT,
    Installed,
    install_from_checkout,
    pip_check,
    wheel_names,
)
from tests.support.postgres import PostgresServer
from tests.support.systemd import CommandFailed, SystemdManager

# The first test also pays for the module fixture: the build and install (about 8 s here,
# about 20 s when the wheelhouse is filled from the index on a fresh machine) need more room
# than the suite's 120 s per test on a heavily loaded host.
pytestmark = [pytest.mark.install, pytest.mark.timeout(600)]

KANBAN = """\
kanban:
  assignees:
    echo:
      command: [sh, -c, 'echo "card $DISPATCH_CARD_ID"']
"""
CRON = """\
cron:
  jobs:
    - id: beat
      every: 2s
      command: [sh, -c, 'echo beat']
"""
CONFIG = KANBAN + CRON


@pytest.fixture(scope="module")
def installed(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Installed:
    return install_from_checkout(tmp_path_factory.mktemp("install"), request.config)


class User:
    """A user of the installed venv: a home with the default config file, and the commands."""

    def __init__(
        self, installed: Installed, home: Path, manager: SystemdManager | None, config: str
    ) -> None:
        self.installed = installed
        self.home = home
        self.manager = manager
        self.config = home / ".config" / "dispatch" / "config.yaml"
        self.config.parent.mkdir(parents=True)
        self.config.write_text(config)
        self.state = home / ".local" / "state" / "dispatch"
        self.env = installed.env(home, manager.env if manager else None)
        self.units: list[str] = []

    def dispatch(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.installed.run(self.env, *args, cwd=self.home, check=check)

    def json(self, *args: str) -> Any:
        # Before the command: after it, `run -- CMD` would hand --json to CMD.
        return json.loads(self.dispatch("--json", *args).stdout)

    def unit(self, args: list[str], type: str, log: str, **extra: str) -> str:
        """``bin/dispatch ARGS`` as a transient unit of the manager (output to ``log``)."""
        assert self.manager is not None
        path = self.home / log
        try:
            unit = self.manager.run_transient_service(
                [self.installed.program, *args],
                env=self.installed.unit_env(self.home) | extra,
                type=type,  # type: ignore[arg-type]
                properties=self.installed.unit_properties(
                    StandardOutput=f"append:{path}",
                    StandardError=f"append:{path}",
                    TimeoutStopSec="15s",
                ),
                cwd=self.home,
                timeout=90,
            )
        except CommandFailed as err:
            words = " ".join(args)
            raise AssertionError(f"dispatch {words} did not start: {self.log(log)}") from err
        self.units.append(unit)
        return unit

    def log(self, name: str) -> str:
        path = self.home / name
        return path.read_text(errors="replace") if path.exists() else ""

    def card_done(self, card_id: str, timeout: float = 45.0) -> dict[str, Any]:
        """Poll ``kanban show`` until the card is done; returns it."""
        assert self.manager is not None

        def done() -> dict[str, Any] | None:
            card = self.json("kanban", "show", card_id)
            return card if card["status"] == "done" else None

        return self.manager.wait_for(done, timeout=timeout, interval=0.3, what=f"{card_id} done")

    def close(self) -> None:
        if self.manager is None:
            return
        for unit in self.units:
            if self.manager.unit_property(unit, "LoadState") == "loaded":
                self.manager.stop_service(unit, timeout=30)


@pytest.fixture
def user(installed: Installed, tmp_path: Path, systemd_manager: SystemdManager) -> Iterator[User]:
    person = User(installed, tmp_path, systemd_manager, CONFIG)
    try:
        yield person
    finally:
        person.close()


def test_the_wheel_installs_without_extras(installed: Installed, tmp_path: Path) -> None:
    assert "No broken requirements found" in pip_check(installed.venv)
    script = Path(installed.program).read_text().splitlines()[0]
    assert script == f"#!{installed.python}", script
    names = wheel_names(installed.wheel)
    web = ROOT / "dispatcher" / "web"
    for folder in ("templates", "static"):
        files = [
            str(p.relative_to(ROOT))
            for p in (web / folder).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        ]
        assert files, f"no {folder} in the checkout?"
        missing = [name for name in files if name not in names]
        assert not missing, f"the wheel lacks {missing}"
    # The venv's own interpreter, outside the source tree, without PYTHONPATH: our packages
    # come from its site-packages and nothing of the dev extra is there.
    probe = (
        "import importlib.util, json, dispatcher, registry, scope\n"
        "print(json.dumps({'files': [m.__file__ for m in (dispatcher, registry, scope)],"
        " 'dev': [n for n in ('psutil', 'pytest', 'hypothesis', 'croniter')"
        " if importlib.util.find_spec(n)]}))"
    )
    done = subprocess.run(
        [installed.python, "-c", probe],
        env=installed.env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = json.loads(done.stdout)
    site = installed.site_packages()
    assert all(path.startswith(site + "/") for path in found["files"]), (found, site)
    assert found["dev"] == []


def test_cli_basics(user: User) -> None:
    assert user.dispatch("--version").stdout.strip() == "dispatch 0.1.0"
    checked = user.dispatch("config", "check")
    assert str(user.config) in checked.stdout and "ok" in checked.stdout
    doctor = user.dispatch("doctor", "--json", check=False)
    report = json.loads(doctor.stdout)
    assert report["probe"]["ok"] is True, doctor.stdout
    assert doctor.returncode == 0, doctor.stderr
    completion = user.dispatch("completion", "bash").stdout
    assert "complete" in completion and "dispatch" in completion
    manpage = user.dispatch("manpage").stdout
    assert manpage.startswith(".TH") or "\n.TH" in manpage[:2000], manpage[:300]
    assert "kanban" in manpage


def test_serve_single_host(user: User) -> None:
    # One zone for serve and the commands: a command in another zone runs itself.
    user.env["TZ"] = "UTC"
    unit = user.unit(["serve"], "notify", "serve.log", TZ="UTC")
    assert user.manager is not None
    assert user.manager.unit_property(unit, "ActiveState") == "active", user.log("serve.log")
    card_id = user.dispatch("kanban", "add", "from the wheel", "--assignee", "echo").stdout.strip()
    card = user.card_done(card_id)
    (run,) = card["runs"]
    assert (run["outcome"], run["placement"]) == ("completed", "scoped"), run
    assert user.dispatch("logs", card_id).stdout == f"card {card_id}\n"
    shown = user.dispatch("kanban", "show", card_id).stdout
    assert card_id in shown and "done" in shown

    # The first add left its config snapshot: the next short writes are answered by serve.
    again = user.dispatch("kanban", "add", "answered", "--assignee", "echo").stdout.strip()
    assert user.card_done(again)["status"] == "done"

    def answered() -> dict[str, Any] | None:
        relay = (user.json("status").get("serve") or {}).get("relay") or {}
        return relay if relay.get("answered") else None

    relay = user.manager.wait_for(answered, timeout=30, interval=0.5, what="a relayed add")
    assert not relay["declined"].get("time zone"), relay

    def keepers() -> dict[str, Any] | None:
        found = (user.json("status").get("serve") or {}).get("keepers") or {}
        return found if found.get("forked") else None

    # The wheel carries the fork server: serve's keepers come from it, none the usual way.
    forked = user.manager.wait_for(keepers, timeout=30, interval=0.5, what="a forked keeper")
    assert forked["running"] and not forked["fallbacks"], forked

    def fired() -> list[dict[str, Any]]:
        rows = user.json("cron", "history", "beat")
        return [r for r in rows if r["kind"] == "schedule" and r["outcome"] == "completed"]

    (fire, *_) = user.manager.wait_for(fired, timeout=45, interval=0.5, what="a cron fire")
    assert user.dispatch("logs", fire["session_id"]).stdout == "beat\n"
    user.manager.stop_service(unit, timeout=30)
    assert "Traceback" not in user.log("serve.log"), user.log("serve.log")


def test_kanban_tick_as_a_oneshot(user: User) -> None:
    card_id = user.dispatch("kanban", "add", "one pass", "--assignee", "echo").stdout.strip()
    user.unit(["kanban", "tick", "--json"], "oneshot", "tick.log")
    report = json.loads(user.log("tick.log"))
    (dispatched,) = report["dispatched"]
    assert (dispatched["card_id"], dispatched["placement"]) == (card_id, "scoped")
    assert user.card_done(card_id)["runs"][0]["outcome"] == "completed"


def test_run_wait(user: User) -> None:
    done = user.dispatch("run", "--wait", "--", "sh", "-c", "echo waited; exit 3", check=False)
    assert done.returncode == 3, done.stderr
    (session,) = user.json("ps", "--all")
    assert (session["state"], session["exit_code"], session["placement"]) == (
        "exited",
        3,
        "scoped",
    )
    assert user.dispatch("logs", session["id"]).stdout == "waited\n"


def test_kill(user: User) -> None:
    session = user.json("run", "--", "sleep", "300")
    assert session["state"] == "running" and session["placement"] == "scoped", session
    killed = user.dispatch("kill", session["id"])
    assert "killed" in killed.stdout
    (after,) = user.json("ps", "--all")
    assert after["state"] == "killed" and after["signal"] == "SIGTERM", after
    assert user.manager is not None and not user.manager.unit_pids(session["unit"])


def _form_token(html: str, action: str) -> str:
    found = re.search(
        rf'action="{re.escape(action)}"[^>]*>.*?name="csrf" value="([^"]*)"', html, re.S
    )
    assert found, f"no form posting to {action}"
    return found.group(1)


def test_web(user: User) -> None:
    web = WebProcess(
        user.config, user.state, user.env, program=[user.installed.program], cwd=user.home
    )
    try:
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        board = browser.open(web.url + "/", timeout=30)
        page = board.read().decode()
        assert board.status == 200 and "ready" in page
        sheet = re.search(r'href="(/static/[^"]+\.css)"', page)
        assert sheet, "the board links no stylesheet"
        assert browser.open(web.url + sheet.group(1), timeout=30).status == 200
        metrics = browser.open(web.url + "/metrics", timeout=30).read().decode()
        assert "# TYPE" in metrics and "dispatch_" in metrics
        # Sign in with the printed link (sets the session cookie), then act as a form does.
        assert browser.open(web.sign_in, timeout=30).status == 200
        token = _form_token(browser.open(web.url + "/", timeout=30).read().decode(), "/cards")
        form = urllib.parse.urlencode(
            {"title": "posted from the wheel", "assignee": "echo", "csrf": token}
        ).encode()
        answer = browser.open(urllib.request.Request(web.url + "/cards", data=form), timeout=30)
        assert answer.status == 200
        cards = user.json("kanban", "list")
        assert [c["title"] for c in cards] == ["posted from the wheel"]
        # The HTTP API from the wheel: a token made by the installed CLI, one GET.
        token = user.dispatch("web", "token", "create", "--name", "ci", "--scope", "read")
        api = urllib.request.Request(
            web.url + "/api/v1/cards", headers={"Authorization": f"Bearer {token.stdout.strip()}"}
        )
        with urllib.request.urlopen(api, timeout=30) as answer:
            assert answer.status == 200 and json.loads(answer.read()) == cards
    finally:
        assert web.stop() == 0, web.errors


def test_cluster(
    installed: Installed,
    tmp_path: Path,
    systemd_manager: SystemdManager,
    postgres_server: PostgresServer,
) -> None:
    url = postgres_server.url(postgres_server.create_database())
    user = User(installed, tmp_path, systemd_manager, KANBAN)
    try:
        first = user.dispatch("kanban", "add", "moved along", "--assignee", "echo").stdout.strip()
        user.dispatch("state", "migrate", "--to", url)
        user.config.write_text(KANBAN + f"cluster:\n  database: {url}\n  host_id: alpha\n")
        user.unit(["serve"], "notify", "serve.log")
        assert user.card_done(first)["runs"][0]["placement"] == "scoped"
        second = user.dispatch("kanban", "add", "in the cluster", "--assignee", "echo").stdout
        card = user.card_done(second.strip())
        assert card["runs"][0]["outcome"] == "completed"
        (host,) = user.json("hosts")
        assert host["host_id"] == "alpha" and host["lease"] == "live", host
        status = user.json("status")
        assert status["serve"]["running"] is True, status
        doctor = user.dispatch("doctor", check=False)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "Traceback" not in user.log("serve.log"), user.log("serve.log")
    finally:
        user.close()
