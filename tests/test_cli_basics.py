"""The CLI skeleton as a user meets it: a real `dispatch` process."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.cli.groups import GROUPS
from dispatcher.cli.main import main

ROOT = Path(__file__).resolve().parent.parent


def dispatch(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.main", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd or ROOT,
        timeout=60,
    )


def test_help_lists_every_group() -> None:
    proc = dispatch("--help")
    assert proc.returncode == 0
    for group in GROUPS:
        assert f"    {group} " in proc.stdout, group


def test_version() -> None:
    proc = dispatch("--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("dispatch ")


def test_malformed_config_is_one_line_exit_2_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("scope:\n  probe_ttl: 10\ncron:\n  jobs:\n    - id: x\n      every: often\n")
    proc = dispatch("--config", str(bad), "config", "show")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"{bad}:6:" in lines[0]
    assert proc.stdout == ""


def test_config_check_accepts_the_sample() -> None:
    proc = dispatch("config", "check", "contrib/config.example.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout


def test_config_check_has_no_side_effects(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = dispatch("--state-dir", str(state), "config", "check", "contrib/config.example.yaml")
    assert proc.returncode == 0
    assert not state.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--json", "config", "check", "contrib/config.example.yaml"],
        ["config", "--json", "check", "contrib/config.example.yaml"],
        ["config", "check", "contrib/config.example.yaml", "--json"],
    ],
)
def test_global_options_before_or_after_the_subcommand(argv: list[str]) -> None:
    proc = dispatch(*argv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.lstrip().startswith("{")


def test_config_option_after_subcommand_overrides_env(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("cron:\n  max_concurrent: 3\n")
    proc = dispatch(
        "config", "show", "--json", "--config", str(good), env={"DISPATCH_CONFIG": "/nonexistent"}
    )
    assert proc.returncode == 0, proc.stderr
    assert '"max_concurrent": 3' in proc.stdout


def test_usage_errors_exit_2_in_one_line() -> None:
    for argv in (["nosuch"], ["config"], ["config", "check", "--bogus"], []):
        proc = dispatch(*argv)
        assert proc.returncode == 2, argv
        assert len(proc.stderr.strip().splitlines()) == 1, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_explicit_missing_config_exits_2(tmp_path: Path) -> None:
    proc = dispatch("--config", str(tmp_path / "nope.yaml"), "config", "show")
    assert proc.returncode == 2
    assert "nope.yaml" in proc.stderr and "not found" in proc.stderr


def test_one_process_serves_several_state_dirs(tmp_path: Path, capsys) -> None:
    """Nothing is frozen at import: two calls in one process use two state dirs."""
    from dispatcher.cli.context import Context
    from dispatcher.cli.main import build_parser

    dirs = []
    for name in ("a", "b"):
        args = build_parser().parse_args(["config", "show"])
        ctx = Context(args, {"DISPATCH_STATE_DIR": str(tmp_path / name), "HOME": str(tmp_path)})
        dirs.append(ctx.state_dir)
    assert dirs == [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert main(["config", "show", "--json"], {"HOME": str(tmp_path)}) == 0
    assert '"scope"' in capsys.readouterr().out


def test_default_state_dir_follows_xdg(tmp_path: Path) -> None:
    from dispatcher.paths import resolve_state_dir

    assert resolve_state_dir(None, {"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "dispatch"
    assert resolve_state_dir(None, {"HOME": "/home/u"}) == Path("/home/u/.local/state/dispatch")
    assert resolve_state_dir("/x/y", {"DISPATCH_STATE_DIR": "/a"}) == Path("/x/y")


@pytest.mark.skipif(
    os.path.isdir("/run/systemd/system"), reason="this host was booted with systemd"
)
def test_doctor_on_a_host_without_systemd_says_so_first(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime), "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    env["DBUS_SESSION_BUS_ADDRESS"] = ""
    proc = dispatch("doctor", env=env)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0] == "system:    FAIL  not booted with systemd"
    assert "enable-linger" not in proc.stdout  # it would fail on such a host
    assert "in_process" in lines[1]
    remedies = lines[lines.index("remedies:") + 1 :]
    assert len(remedies) == len(set(remedies))
    assert "gateway_kanban  in_process" in proc.stdout
    report = __import__("json").loads(dispatch("doctor", "--json", env=env).stdout)
    assert report["system"] == {"booted_with_systemd": False, "detail": report["system"]["detail"]}
