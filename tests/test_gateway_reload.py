"""``systemctl reload`` tells the truth: ExecReload=dispatch reload on a real user manager.

systemd 252 has no Type=notify-reload, so the unit's ExecReload= is ``dispatch reload --pid
$MAINPID``: it signals the gateway and waits for its verdict, and a rejected config makes the
reload job fail (exit 2) while the gateway runs on with the old config.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.cli import run_dispatch
from tests.support.systemd import SystemdManager

pytestmark = [pytest.mark.systemd]

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "serve:\n  safety_tick: 30s\n"


def test_systemctl_reload_fails_for_a_rejected_config_and_succeeds_after_the_fix(
    systemd_manager: SystemdManager, tmp_path: Path
) -> None:
    config, state = tmp_path / "config.yaml", tmp_path / "state"
    config.write_text(CONFIG)
    base = [sys.executable, "-m", "dispatcher.cli.main", "--config", str(config)]
    base += ["--state-dir", str(state)]
    env = {"HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    unit = systemd_manager.run_transient_service(
        [*base, "serve"],
        env=env,
        type="notify",
        properties={
            "ExecReload": " ".join([*base, "reload", "--pid", "$MAINPID"]),
            "StandardError": f"append:{tmp_path / 'serve.log'}",
        },
        cwd=tmp_path,
        timeout=60,
    )
    try:
        config.write_text(CONFIG + "  bogus: [\n")
        refused = systemd_manager.systemctl("reload", unit, check=False, timeout=60)
        assert refused.returncode != 0, refused.stdout
        assert systemd_manager.unit_property(unit, "ActiveState") == "active"
        journal = (tmp_path / "serve.log").read_text()
        assert "reload rejected" in journal

        config.write_text(CONFIG)
        done = systemd_manager.systemctl("reload", unit, check=False, timeout=60)
        assert done.returncode == 0, done.stderr
        status = json.loads(
            run_dispatch(config, state, {**systemd_manager.env, **env}, "status", "--json").stdout
        )
        reload = status["serve"]["last_reload"]
        assert reload["ok"] is True and reload["generation"] == 2
        assert not any(e["message"].startswith("reload rejected") for e in status["recent_errors"])
    finally:
        systemd_manager.stop_service(unit)
