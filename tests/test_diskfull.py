"""Disk full on the state dir: `dispatch serve` with its state dir on a small tmpfs in a private
mount namespace. New claims stop with a clear reason, running workers keep running, nothing
stored is damaged, and dispatching resumes by itself once space returns.

Needs root, ``unshare`` and ``nsenter`` (a mount namespace); skips without them, and fails
instead under ``DISPATCH_REQUIRE_SYSTEMD=1`` (CI), like the systemd tier.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.store.database import SPACE_RESERVE
from tests.support.systemd import require_systemd
from tests.support.wait import wait_for
from tests.test_gateway_serve import Serve

ROOT = Path(__file__).resolve().parent.parent
TMPFS_BYTES = 16 * 1024 * 1024

CONFIG = """
serve:
  safety_tick: 1s
kanban:
  assignees:
    chatty:
      command:
        - sh
        - -c
        - 'while [ ! -e "{release}" ]; do echo "working $$"; sleep 0.05; done; echo done'
cron:
  jobs:
    - id: tidy
      schedule: "0 3 * * *"
      command: [sh, -c, 'echo tidy']
"""


def _missing() -> str | None:
    if os.getuid() != 0:
        return "needs root for a private mount namespace"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"needs {tool} (util-linux)"
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "true"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        return f"unshare -m failed: {probe.stderr.decode().strip()}"
    return None


class TmpfsServe(Serve):
    """`dispatch serve` whose state dir is a fresh tmpfs seen only in its mount namespace;
    commands run in that namespace through nsenter, files are reached via /proc/PID/root."""

    def start(self, *, watchdog_usec: int | None = None) -> subprocess.Popen[str]:
        env = self.env()
        env["NOTIFY_SOCKET"] = str(self.notify_path)
        self.state.mkdir(mode=0o700)
        self.stderr = open(self.stderr_path, "a")  # noqa: SIM115 - closed in stop()
        script = 'mount -t tmpfs -o "size=$1,mode=0700" tmpfs "$2" || exit 98; shift 2; exec "$@"'
        self.proc = subprocess.Popen(
            [
                "unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                str(TMPFS_BYTES), str(self.state), sys.executable, "-m", "dispatcher.cli.main",
                "--config", str(self.config), "--state-dir", str(self.state), "serve",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            text=True,
            cwd=ROOT,
        )  # fmt: skip
        self.wait_message("READY=1", timeout=30)
        return self.proc

    def dispatch(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert self.proc is not None
        done = subprocess.run(
            [
                "nsenter", "-m", "-t", str(self.proc.pid), sys.executable, "-m",
                "dispatcher.cli.main", "--config", str(self.config), "--state-dir",
                str(self.state), *args,
            ],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            check=False,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"dispatch {args}: exit {done.returncode}: {done.stderr}")
        return done

    def inside(self, path: str) -> Path:
        """``path`` (under the state dir) as this test sees it from outside the namespace."""
        assert self.proc is not None
        return Path(f"/proc/{self.proc.pid}/root{self.state}") / path


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[TmpfsServe]:
    missing = _missing()
    if missing:
        if require_systemd():
            pytest.fail(f"disk-full tier required but unavailable: {missing}")
        pytest.skip(missing)
    gateway = TmpfsServe(tmp_path)
    gateway.config.write_text(CONFIG.format(release=gateway.release))
    yield gateway
    gateway.release.touch()
    if gateway.proc is not None and gateway.proc.poll() is None:
        gateway.proc.send_signal(signal.SIGTERM)
        gateway.proc.wait(20)
    gateway.notify.close()


def fill(path: Path, leave: int) -> int:
    """Grow ``path`` until at most ``leave`` bytes stay free on its file system."""
    written = 0
    chunk = b"\0" * 65536
    with open(path, "ab") as f:
        while True:
            free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
            if free <= leave:
                return written
            try:
                written += f.write(chunk[: max(1, min(len(chunk), free - leave))])
                f.flush()
            except OSError as err:
                assert err.errno == errno.ENOSPC
                return written


def card(serve: TmpfsServe, card_id: str) -> dict:
    return json.loads(serve.dispatch("kanban", "show", card_id, "--json").stdout)


@pytest.mark.slow
def test_disk_full_stops_claims_keeps_workers_and_resumes(serve: TmpfsServe) -> None:
    serve.start()
    first = json.loads(
        serve.dispatch("kanban", "add", "a", "--assignee", "chatty", "--json").stdout
    )
    wait_for(lambda: card(serve, first["id"])["status"] == "running", 20, what="first running")
    sessions = json.loads(serve.dispatch("ps", "--json").stdout)
    (worker,) = sessions
    log = serve.inside(f"sessions/{worker['id']}/output.log")

    # Nearly full: the database still takes a small write, but no new work is claimed.
    filler = serve.inside("filler")
    fill(filler, SPACE_RESERVE // 2)
    second = json.loads(
        serve.dispatch("kanban", "add", "b", "--assignee", "chatty", "--json").stdout
    )
    wait_for(lambda: "nearly full" in serve.log(), 20, what="the reason in serve's log")
    assert card(serve, second["id"])["status"] == "ready"
    assert "no new claims until space returns" in serve.log()
    fired = serve.dispatch("cron", "run", "tidy", "--wait", "--json", check=False)
    assert fired.returncode == 1, fired.stdout + fired.stderr
    fire = json.loads(fired.stdout)
    assert fire["outcome"] == "spawn_refused" and "nearly full" in fire["error"], fire

    # Completely full: a write is refused in one line; stored state stays intact.
    fill(filler, 0)
    refused = serve.dispatch("kanban", "add", "c", "--assignee", "chatty", check=False)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 1 and len(lines) == 1, refused.stderr
    assert "no space left" in lines[0] and "state.db" in lines[0], lines
    checked = serve.dispatch("state", "check", check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # The running worker kept running all along (its keeper and process are alive).
    assert worker["pid"] and os.path.exists(f"/proc/{worker['pid']}")
    assert serve.proc is not None and serve.proc.poll() is None
    assert card(serve, first["id"])["status"] == "running"

    # Space returns: the waiting card is claimed without anyone poking serve.
    filler.unlink()
    wait_for(lambda: card(serve, second["id"])["status"] == "running", 30, what="claims resume")
    serve.release.touch()
    wait_for(lambda: card(serve, first["id"])["status"] == "done", 30, what="first done")
    wait_for(lambda: card(serve, second["id"])["status"] == "done", 30, what="second done")
    final = serve.dispatch("state", "check", "--json")
    assert json.loads(final.stdout)["ok"] is True
    assert log.read_bytes().endswith(b"done\n")
    assert "Traceback" not in serve.log()
