"""The README's main command: show dispatch working on the embedded default.

Run through ``sh contrib/dev.sh demo`` (which prepares the virtualenv). Uses the sample config in
contrib/ and a demo state dir (SQLite) under ./.demo unless DISPATCH_STATE_DIR is set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "contrib" / "config.example.yaml"


def dispatch(*args: str, check: bool = True) -> int:
    """Run the dispatch CLI of this checkout and echo the command."""
    print(f"\n$ dispatch {' '.join(args)}", flush=True)
    env = dict(os.environ)
    env.setdefault("DISPATCH_STATE_DIR", str(ROOT / ".demo" / "state"))
    env["DISPATCH_CONFIG"] = str(CONFIG)
    proc = subprocess.run([sys.executable, "-m", "dispatcher.cli.main", *args], env=env)
    if check and proc.returncode != 0:
        raise SystemExit(proc.returncode)
    return proc.returncode


def main() -> int:
    """Validate the sample config, show it, and check the machine."""
    dispatch("config", "check")
    dispatch("config", "show")
    dispatch("doctor", check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
