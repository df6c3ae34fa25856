"""The README's main command: the gateway on the embedded default, with work flowing.

Run through ``sh contrib/dev.sh demo`` (which prepares the virtualenv). It uses the sample config
in contrib/ and a fresh demo state dir for every run (one SQLite file plus session logs, under
./.demo/run-<time>; DISPATCH_STATE_DIR names another, which must be empty or absent), then:

1. validates the config and checks the machine (``dispatch doctor``; on a machine without a
   systemd user manager its FAIL lines are expected: workers run unscoped, which the demo config
   allows);
2. starts ``dispatch serve`` in the background (cron job + kanban dispatcher);
3. adds a few cards, waits until they are done and a cron fire has run;
4. shows ``dispatch status``, the board, a card's output and the cron history;
5. stops the gateway with SIGTERM (workers would keep running) and says where everything is.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "contrib" / "config.example.yaml"
STATE = Path(
    os.environ.get("DISPATCH_STATE_DIR") or ROOT / ".demo" / time.strftime("run-%Y%m%d-%H%M%S")
)


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
        print(f"\n$ {shlex.join(['dispatch', *args])}", flush=True)
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
        raise SystemExit(f"demo: {shlex.join(['dispatch', *args])} exited {proc.returncode}")
    return proc.stdout


def doctor() -> bool:
    """``dispatch doctor``, shown; True when scoped placement works."""
    print("\n$ dispatch doctor", flush=True)
    proc = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.main", "doctor"],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode == 0


def wait_until(what: str, predicate: Callable[[], bool], timeout: float) -> None:
    """Poll ``predicate`` (bounded); fail the demo with a clear line if it never holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: gave up after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


def main() -> int:
    """Run the tour (see the module docstring)."""
    if STATE.exists() and any(STATE.iterdir()):
        raise SystemExit(f"demo: {STATE} is not empty; the demo starts from a fresh state dir")
    STATE.mkdir(parents=True, exist_ok=True, mode=0o700)
    print(f"demo: state dir {STATE}; config {CONFIG}")
    print(
        f"demo: to repeat a command yourself: export DISPATCH_STATE_DIR={shlex.quote(str(STATE))}"
        f" DISPATCH_CONFIG={shlex.quote(str(CONFIG))}"
    )
    dispatch("config", "check")
    if not doctor():
        print(
            "demo: doctor's FAIL lines above are expected on a machine without a systemd user "
            "manager (a container, or root without linger): workers then run in_process, "
            "outside restart-safe scopes, which the demo config allows. The demo goes on."
        )

    log_path = STATE / "serve.log"
    print(f"\n$ dispatch serve 2>{shlex.quote(str(log_path))} &", flush=True)
    with open(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
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
        print(f"\n$ kill -TERM {serve.pid}   # a clean stop; running workers would keep running")
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
