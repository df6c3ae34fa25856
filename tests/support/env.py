"""Environments for tests that start real workers without any systemd."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["no_bus_env"]


def no_bus_env(home: Path) -> dict[str, str]:
    """An environment without a reachable systemd: the runtime dir exists (0700, ours) but
    holds no bus, so placement is plainly ``in_process`` and nothing touches a real manager."""
    runtime_dir = home / "no-bus"
    runtime_dir.mkdir(mode=0o700, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "XDG_RUNTIME_DIR": str(runtime_dir),
        "DBUS_SESSION_BUS_ADDRESS": f"unix:path={runtime_dir}/bus",
    }
