"""The README's main command: the gateway on the embedded default, with work flowing.

Run through ``sh contrib/dev.sh demo`` (which prepares the virtualenv). It uses the sample config
in contrib/ and a demo state dir (one SQLite file plus session logs) under ./.demo unless
DISPATCH_STATE_DIR is set, then:

1. validates the config and checks the machine (``dispatch doctor``; on a machine without a
   systemd user manager workers run unscoped, which the demo config allows);
2. starts ``dispatch serve`` in the background (cron job + kanban dispatcher);
3. adds a few cards, waits until they are done and a cron fire has run;
4. shows ``dispatch status``, the board, a card's output and the cron history;
5. stops the gateway with SIGTERM (workers would keep running) and says where everything is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "contrib" / "config.example.yaml"
STATE = Path(os.environ.get("DISPATCH_STATE_DIR") or ROOT / ".demo" / "state")


def environment() -> dict[str, str]:
    """The demo's environment: the sample config and the demo state dir."""
    env = dict(os.environ)
    env["DISPATCH_STATE_DIR"] = str(STATE)
    env["DISPATCH_CONFIG"] = str(CONFIG)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def dispatch(*args: str, show: bool = True, check: bool = True) -> str:
    """Run this checkout's `dispatch`, echoing the command and (optionally) its output."""
    if show:
        print(f"\n$ dispatch {' '.join(args)}", flush=True)
    proc = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.main", *args],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if show:
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr)
    if check and proc.returncode != 0:
        if not show:
            sys.stderr.write(proc.stderr)
        raise SystemExit(f"demo: 'dispatch {' '.join(args)}' exited {proc.returncode}")
    return proc.stdout


def wait_until(what: str, predicate: Callable[[], bool], timeout: float) -> None:
    """Poll ``predicate`` (bounded); fail the demo with a clear line if it never holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: gave up after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


def main() -> int:
    """Run the tour (see the module docstring)."""
    STATE.mkdir(parents=True, exist_ok=True, mode=0o700)
    dispatch("config", "check")
    dispatch("doctor", check=False)

    log_path = STATE.parent / "serve.log"
    print(f"\n$ dispatch serve &     # logs: {log_path}", flush=True)
    with open(log_path, "ab") as log:
        serve = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli.main", "serve"],
            env=environment(),
            stdout=log,
            stderr=log,
        )
    try:
        wait_until(
            "serve to start",
            lambda: json.loads(dispatch("status", "--json", show=False))["serve"]["running"],
            30,
        )
        cards = [
            dispatch("kanban", "add", title, "--assignee", "echo").strip()
            for title in ("write the release notes", "rebuild the index", "say hello")
        ]

        def finished() -> bool:
            board = json.loads(dispatch("kanban", "list", "--all", "--json", show=False))
            return all(c["status"] in ("done", "blocked") for c in board if c["id"] in cards)

        wait_until("the cards to finish", finished, 60)
        wait_until(
            "a cron fire",
            lambda: bool(json.loads(dispatch("cron", "history", "--json", show=False))),
            30,
        )
        dispatch("status")
        dispatch("kanban", "board")
        show = json.loads(dispatch("kanban", "show", cards[0], "--json", show=False))
        session = next(r["session_id"] for r in reversed(show["runs"]) if r.get("session_id"))
        dispatch("logs", session)
        dispatch("cron", "history", "--limit", "3")
    finally:
        print("\n$ kill -TERM <serve pid>   # a clean stop; running workers would keep running")
        serve.send_signal(signal.SIGTERM)
        try:
            code = serve.wait(timeout=15)
        except subprocess.TimeoutExpired:
            serve.kill()
            code = serve.wait(timeout=5)
        print(f"serve exited {code}")
    print(f"\nState dir: {STATE} (state.db, sessions/). Gateway log: {log_path}")
    print("Next: docs/quickstart.md, and docs/systemd.md to run it as a service.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
