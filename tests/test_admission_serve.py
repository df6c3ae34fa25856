"""A real ``dispatch serve`` fed fake pressure readings (``DISPATCH_ADMISSION_PROC``): it holds
kanban claims and cron starts under pressure (a held fire ``missed`` at its start deadline with
the reason), says so on its ``STATUS=`` line, in its log and in ``dispatch status``, keeps its
running worker, and takes work again once the pressure is gone and the minimum hold passed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatcher.cli.main import main
from dispatcher.launch.pressure import PROC_ENV
from tests.support.wait import wait_for
from tests.test_gateway_serve import Serve

CONFIG = """
serve:
  safety_tick: 30s
admission:
  min_hold: 1s
kanban:
  assignees:
    quick:
      command: [sh, -c, 'echo "hello from $DISPATCH_CARD_ID"']
    gated:
      command: [sh, -c, 'while [ ! -e "$RELEASE" ]; do sleep 0.05; done; echo released']
      env: {{RELEASE: "{release}"}}
cron:
  jobs:
    - id: often
      every: 2s
      catch_up_window: 1s
      command: [sh, -c, 'echo fired']
"""

HIGH = "some avg10=34.00 avg60=10.00 avg300=2.00 total=1000\n"
LOW = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\n"


def pressure(proc: Path, text: str) -> None:
    (proc / "pressure").mkdir(parents=True, exist_ok=True)
    temp = proc / "pressure" / ".memory"
    temp.write_text(text)
    temp.replace(proc / "pressure" / "memory")  # whole readings only, as the kernel gives them
    (proc / "meminfo").write_text("MemAvailable:   8388608 kB\n")


def test_serve_holds_claims_and_cron_under_pressure_then_resumes(tmp_path: Path, capsys) -> None:
    proc = tmp_path / "proc"
    pressure(proc, LOW)
    gateway = Serve(tmp_path)
    gateway.config.write_text(CONFIG.format(release=gateway.release))
    env = gateway.env()
    env[PROC_ENV] = str(proc)
    gateway.env = lambda: env  # type: ignore[method-assign]

    def cli(*args: str) -> str:
        capsys.readouterr()
        code = main(
            ["--config", str(gateway.config), "--state-dir", str(gateway.state), *args], env
        )
        out, err = capsys.readouterr()
        assert code == 0, err
        return out

    def status(card_id: str) -> str:
        return json.loads(cli("kanban", "show", card_id, "--json"))["status"]

    try:
        # Unheld, a worker starts; it must keep running through the hold.
        gateway.start()
        running = cli("kanban", "add", "runs through", "--assignee", "gated").strip()
        wait_for(lambda: status(running) == "running", timeout=15, what="the first claim")
        pressure(proc, HIGH)
        gateway.wait_message("new work held: memory pressure 34 %", timeout=15)
        waiting = cli("kanban", "add", "waits", "--assignee", "quick").strip()

        def missed() -> list[dict]:
            rows = json.loads(cli("cron", "history", "often", "--json"))
            return [r for r in rows if r["outcome"] == "missed"]

        wait_for(lambda: missed(), timeout=15, what="a held cron fire missed")
        assert missed()[0]["error"] == "memory pressure 34 %"
        assert status(waiting) == "ready" and status(running) == "running"
        shown = json.loads(cli("status", "--json"))["admission"]
        assert shown["held"] is True and shown["reason"] == "memory pressure 34 %"
        assert shown["decided_by"] == "serve" and shown["readings"]["memory_pressure"] == 34.0
        assert "admission: holding new work: memory pressure 34 %" in gateway.log()
        # The status's recent errors name each source once (the messages carry it already).
        human = cli("status")
        assert "  admission: holding new work: memory pressure 34 %" in human, human
        assert "cron: fire often@" in human and "cron: cron:" not in human, human

        pressure(proc, LOW)
        wait_for(lambda: status(waiting) == "done", timeout=20, what="the held card claimed")
        wait_for(
            lambda: any(
                r["outcome"] == "completed"
                for r in json.loads(cli("cron", "history", "often", "--json"))
            ),
            timeout=15,
            what="a cron fire after the hold",
        )
        assert "admission: taking new work again after" in gateway.log()
        assert status(running) == "running"  # never touched
        assert json.loads(cli("status", "--json"))["admission"]["held"] is False
    finally:
        gateway.release.touch()
        if gateway.proc is not None:
            assert gateway.stop() == 0
        gateway.notify.close()


@pytest.mark.parametrize("held", [True, False])
def test_a_oneshot_tick_claims_nothing_while_held(tmp_path: Path, capsys, held: bool) -> None:
    proc = tmp_path / "proc"
    pressure(proc, HIGH if held else LOW)
    config = tmp_path / "config.yaml"
    config.write_text("kanban:\n  assignees:\n    quick: {command: [sh, -c, 'echo hi']}\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), PROC_ENV: str(proc)}
    base = ["--config", str(config), "--state-dir", str(tmp_path / "state")]
    assert main([*base, "kanban", "add", "x", "--assignee", "quick"], env) == 0
    capsys.readouterr()
    # A dry run says what a tick would do, so it holds too; it decides nothing it keeps.
    assert main([*base, "kanban", "tick", "--dry-run", "--json"], env) == 0
    dry = json.loads(capsys.readouterr().out)
    assert (dry["held"], len(dry["planned"])) == (
        ("memory pressure 34 %", 0) if held else (None, 1)
    )
    assert not (tmp_path / "state" / "admission.json").exists()
    assert main([*base, "kanban", "tick", "--json"], env) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    if held:
        assert report["held"] == "memory pressure 34 %" and report["dispatched"] == []
        assert "admission: holding new work: memory pressure 34 %" in err
    else:
        assert report["held"] is None and len(report["dispatched"]) == 1
