"""Running this checkout's ``dispatch`` CLI as a real process from tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


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
