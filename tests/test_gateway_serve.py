"""`dispatch serve` as a real process (no systemd needed): the notify protocol, the single-
instance rule, immediate wake-ups, clean stops that leave workers running, adoption on restart,
SIGHUP reloads and `dispatch status`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import dispatch_argv, run_dispatch
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parent.parent

CONFIG = """
serve:
  safety_tick: 30s
kanban:
  assignees:
    quick:
      command: [sh, -c, 'echo "hello from $DISPATCH_CARD_ID"']
    gated:
      command:
        - sh
        - -c
        - 'echo started; while [ ! -e "$RELEASE" ]; do sleep 0.05; done; echo released'
      env: {{RELEASE: "{release}"}}
"""


class Serve:
    """A `dispatch serve` child with its own notify socket."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.state = home / "state"
        self.config = home / "config.yaml"
        self.release = home / "release"
        self.config.write_text(CONFIG.format(release=self.release))
        self.notify_path = home / "notify"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.notify.settimeout(0.2)
        self.messages: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self.stderr_path = home / "serve.err"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(HOME=str(self.home), PYTHONPATH=str(ROOT))
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "INVOCATION_ID"):
            env.pop(name, None)
        return env

    def start(self, *, watchdog_usec: int | None = None) -> subprocess.Popen[str]:
        env = self.env()
        env["NOTIFY_SOCKET"] = str(self.notify_path)
        if watchdog_usec:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        self.stderr = open(self.stderr_path, "a")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            dispatch_argv(self.config, self.state, "serve"),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            text=True,
        )
        self.wait_message("READY=1", timeout=20)
        return self.proc

    def read_messages(self) -> None:
        while True:
            try:
                self.messages.append(self.notify.recv(4096).decode())
            except (TimeoutError, BlockingIOError):
                return

    def wait_message(self, needle: str, timeout: float = 10.0) -> str:
        def seen() -> str | None:
            self.read_messages()
            found = [m for m in self.messages if needle in m]
            if self.proc is not None and self.proc.poll() is not None and not found:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.log()}")
            return found[-1] if found else None

        result = wait_for(seen, timeout=timeout, what=f"notify message {needle!r}")
        assert result is not None
        return result

    def dispatch(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_dispatch(self.config, self.state, self.env(), *args, check=check)

    def card(self, card_id: str) -> dict:
        return json.loads(self.dispatch("kanban", "show", card_id, "--json").stdout)

    def log(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout)
        self.stderr.close()
        return code


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    gateway = Serve(tmp_path)
    yield gateway
    gateway.release.touch()
    if gateway.proc is not None and gateway.proc.poll() is None:
        gateway.stop(signal.SIGKILL)
    # Release and wait out any worker a failed assertion left behind.
    if (gateway.state / "state.db").exists():
        for session in json.loads(gateway.dispatch("ps", "--json", check=False).stdout or "[]"):
            gateway.dispatch("kill", session["id"], "--grace", "0.5", check=False)
    gateway.notify.close()


def test_ready_status_and_single_instance(serve: Serve) -> None:
    proc = serve.start()
    assert "STATUS=" in serve.wait_message("READY=1")
    second = serve.dispatch("serve", check=False)
    assert second.returncode == 1
    assert f"pid {proc.pid}" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    status = json.loads(serve.dispatch("status", "--json").stdout)
    assert status["serve"]["running"] is True
    assert status["serve"]["pid"] == proc.pid
    assert serve.stop() == 0
    status = json.loads(serve.dispatch("status", "--json").stdout)
    assert status["serve"]["running"] is False


def test_watchdog_pings_when_asked(serve: Serve) -> None:
    serve.start(watchdog_usec=400_000)
    serve.wait_message("WATCHDOG=1", timeout=5)
    assert serve.stop() == 0
    serve.read_messages()
    assert any("STOPPING=1" in m for m in serve.messages)


def test_a_card_added_elsewhere_runs_at_once(serve: Serve) -> None:
    serve.start()
    card_id = serve.dispatch("kanban", "add", "hi", "--assignee", "quick").stdout.strip()
    # The safety tick is 30 s: finishing well within that proves the poke woke the gateway.
    wait_for(lambda: serve.card(card_id)["status"] == "done", timeout=10, what="card done")
    shown = serve.card(card_id)
    (run,) = shown["runs"]
    out = serve.dispatch("logs", run["session_id"]).stdout
    assert out == f"hello from {card_id}\n"
    # A card id (its latest run) and a run id name the same log.
    assert serve.dispatch("logs", card_id).stdout == out
    assert serve.dispatch("logs", run["run_id"]).stdout == out
    assert serve.stop() == 0


def test_sigterm_leaves_workers_running_and_the_next_serve_reports_them(serve: Serve) -> None:
    serve.start()
    card_id = serve.dispatch("kanban", "add", "long", "--assignee", "gated").stdout.strip()
    wait_for(lambda: serve.card(card_id)["status"] == "running", timeout=10, what="running")
    session_id = serve.card(card_id)["runs"][0]["session_id"]
    wait_for(lambda: serve.dispatch("logs", session_id).stdout == "started\n", timeout=10)
    begun = time.monotonic()
    assert serve.stop() == 0
    assert time.monotonic() - begun < 5
    (session,) = [
        s for s in json.loads(serve.dispatch("ps", "--json").stdout) if s["id"] == session_id
    ]
    assert session["state"] == "running"
    assert os.path.exists(f"/proc/{session['pid']}")
    serve.release.touch()
    serve.start()
    wait_for(lambda: serve.card(card_id)["status"] == "done", timeout=15, what="card done")
    assert serve.dispatch("logs", session_id).stdout == "started\nreleased\n"
    assert serve.card(card_id)["runs"][0]["exit_code"] == 0
    assert serve.stop() == 0
    assert "Traceback" not in serve.log()


def test_sighup_rejects_a_bad_config_and_applies_a_good_one(serve: Serve) -> None:
    proc = serve.start()
    good = serve.config.read_text()
    serve.config.write_text(good + "  bogus: [\n")
    proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "reload rejected" in serve.log(), timeout=10, what="rejection logged")
    rejection = [line for line in serve.log().splitlines() if "reload rejected" in line]
    assert len(rejection) == 1 and "config.yaml" in rejection[0]
    assert proc.poll() is None
    serve.config.write_text(good + "    late:\n      command: [sh, -c, 'echo late']\n")
    proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "reloaded" in serve.log(), timeout=10, what="reload logged")
    card_id = serve.dispatch("kanban", "add", "new", "--assignee", "late").stdout.strip()
    wait_for(lambda: serve.card(card_id)["status"] == "done", timeout=10, what="card done")
    assert serve.stop() == 0


def test_dispatch_reload_waits_for_the_verdict_and_status_shows_it(serve: Serve) -> None:
    proc = serve.start()
    good = serve.config.read_text()
    serve.config.write_text(good + "  bogus: [\n")
    rejected = serve.dispatch("reload", "--pid", str(proc.pid), check=False)
    assert rejected.returncode == 2, rejected.stderr
    (line,) = rejected.stderr.strip().splitlines()
    assert "reload rejected" in line and "config.yaml:" in line and "old config" in line
    status = json.loads(serve.dispatch("status", "--json").stdout)
    assert status["serve"]["last_reload"]["ok"] is False
    messages = [e["message"] for e in status["recent_errors"]]
    assert any(m.startswith("reload rejected") for m in messages), messages
    # RELOADING=1 (with the MONOTONIC_USEC notify-reload needs), then READY=1.
    assert "MONOTONIC_USEC=" in serve.wait_message("RELOADING=1")

    serve.config.write_text(good)
    applied = serve.dispatch("reload", "--json")
    record = json.loads(applied.stdout)
    assert record["ok"] is True and record["pid"] == proc.pid and record["generation"] == 2
    status = json.loads(serve.dispatch("status", "--json").stdout)
    assert status["serve"]["last_reload"]["ok"] is True
    assert not any(e["message"].startswith("reload rejected") for e in status["recent_errors"])
    human = serve.dispatch("status").stdout
    assert "reload:     applied" in human
    # A pid that is not the state dir's serve is refused, and nothing is signalled.
    other = serve.dispatch("reload", "--pid", str(os.getpid()), check=False)
    assert other.returncode == 1 and f"is pid {proc.pid}" in other.stderr
    assert serve.stop() == 0


def test_dispatch_reload_without_a_serve_says_so(serve: Serve) -> None:
    done = serve.dispatch("reload", check=False)
    assert done.returncode == 1
    assert "no dispatch serve is running" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_keepers_come_from_serves_fork_server_counted_in_status_and_metrics(
    serve: Serve,
) -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from dispatcher.config import load_config
    from dispatcher.web.metrics import metrics_registry
    from dispatcher.web.source import Source

    serve.start()
    card_id = serve.dispatch("kanban", "add", "hi", "--assignee", "quick").stdout.strip()
    wait_for(lambda: serve.card(card_id)["status"] == "done", timeout=10, what="card done")
    serve.dispatch("reload")  # the status file is refreshed with the reload's verdict
    keepers = json.loads(serve.dispatch("status", "--json").stdout)["serve"]["keepers"]
    assert keepers["running"] is True and keepers["forked"] == 1 and keepers["fallbacks"] == {}
    human = serve.dispatch("status").stdout
    assert f"keepers:    fork server pid {keepers['pid']}, 1 forked" in human
    source = Source(load_config(serve.config).settings, serve.state, serve.env())
    try:
        text = generate_latest(metrics_registry(source)).decode()
    finally:
        source.close()
    found = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert found[("dispatch_keeper_fork_server_up", ())] == 1
    assert found[("dispatch_keepers_forked_total", ())] == 1
    assert not [name for name, _ in found if name == "dispatch_keeper_fallbacks_total"]
    assert serve.stop() == 0
    # The fork server ends with serve.
    wait_for(lambda: not os.path.exists(f"/proc/{keepers['pid']}"), 5, what="fork server gone")


def test_short_writes_are_answered_by_serve_counted_in_status_and_metrics(serve: Serve) -> None:
    """Issue 26: with serve running, `kanban add` is answered by it (the first one, with no
    config snapshot yet, runs on its own and leaves one), and the counts reach status and
    /metrics; the cards are exactly the ones added."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from dispatcher.config import load_config
    from dispatcher.web.metrics import metrics_registry
    from dispatcher.web.source import Source

    serve.start()
    added = [serve.dispatch("kanban", "add", f"c{n}", "--assignee", "quick") for n in range(3)]
    assert all(done.stdout.startswith("c_") and done.stderr == "" for done in added)
    serve.dispatch("reload")  # the status file is refreshed with the reload's verdict
    relay = json.loads(serve.dispatch("status", "--json").stdout)["serve"]["relay"]
    assert relay["answered"] >= 2 and sum(relay["declined"].values()) <= 1, relay
    assert f"relay:      {relay['answered']} short write commands answered by serve" in (
        serve.dispatch("status").stdout
    )
    listed = json.loads(serve.dispatch("kanban", "list", "--json").stdout)
    assert sorted(card["title"] for card in listed) == ["c0", "c1", "c2"]
    source = Source(load_config(serve.config).settings, serve.state, serve.env())
    try:
        text = generate_latest(metrics_registry(source)).decode()
    finally:
        source.close()
    answered = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "dispatch_relay_answered_total"
    ]
    assert answered == [relay["answered"]]
    declined = {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "dispatch_relay_declined_total"
    }
    assert declined == relay["declined"]
    assert serve.stop() == 0
