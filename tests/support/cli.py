"""Running this checkout's ``dispatch`` CLI as a real process from tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def dispatch_argv(config: Path, state: Path, *args: str) -> list[str]:
    """The argv of ``dispatch --config CONFIG --state-dir STATE ARGS`` from this checkout."""
    return [
        sys.executable,
        "-m",
        "dispatcher.cli.main",
        "--config",
        str(config),
        "--state-dir",
        str(state),
        *args,
    ]


def run_dispatch(
    config: Path,
    state: Path,
    env: Mapping[str, str],
    *args: str,
    check: bool = True,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """``dispatch --config CONFIG --state-dir STATE ARGS``; with ``check`` a non-zero exit fails
    the test with the command's stderr."""
    proc = subprocess.run(
        dispatch_argv(config, state, *args),
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"dispatch {' '.join(args)}: exit {proc.returncode}: {proc.stderr}")
    return proc


def state_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment for a CLI run on a private state dir (``tmp_path/state``)
    with no user config (``XDG_CONFIG_HOME`` in ``tmp_path``), plus ``extra``."""
    values = dict(os.environ)
    values.update(
        DISPATCH_STATE_DIR=str(tmp_path / "state"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        **extra,
    )
    values.pop("DISPATCH_CONFIG", None)
    return values


def dispatch_text(
    env: Mapping[str, str], *args: str, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``dispatch ARGS`` from this checkout in ``env``; output as text, never checked."""
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.main", *args],
        capture_output=True,
        text=True,
        env=dict(env),
        cwd=REPO,
        timeout=timeout,
        check=False,
    )


def dispatch_bytes(
    env: Mapping[str, str], *args: str, timeout: float = 60.0
) -> subprocess.CompletedProcess[bytes]:
    """As :func:`dispatch_text`, with the output as raw bytes (``logs`` shows them exactly)."""
    return subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.main", *args],
        capture_output=True,
        env=dict(env),
        cwd=REPO,
        timeout=timeout,
        check=False,
    )
