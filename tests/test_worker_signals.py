"""Workers start with default signal dispositions and an empty mask, whoever launched them.

A launcher started as a background job (``dispatch run ... &`` in a script), under ``nohup``
or from a non-interactive shell runs with SIGINT/SIGQUIT (and SIGHUP) ignored, and both ignored
dispositions and blocked signals survive exec. The keeper must not pass that on: these tests
start the real CLI from a parent that ignores and blocks signals and read the worker's
``/proc/PID/status``; the last one does the same for a keeper forked by a fork server that
the hostile parent started.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.keepers import start_path
from tests.test_registry_cli import ROOT, dispatch, env  # noqa: F401 - env is a fixture
from tests.test_registry_support import open_registry, start_launcher, stop_all

IGNORED = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1, signal.SIGPIPE)
BLOCKED = {signal.SIGTERM, signal.SIGUSR2, signal.SIGCHLD, signal.SIGINT}


def _hostile_parent() -> None:
    """preexec_fn: what a background job, nohup and a careless supervisor hand down."""
    for sig in IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, BLOCKED)


def _masks(pid: int) -> dict[str, int]:
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("SigIgn", "SigBlk"):
            found[key] = int(value.strip(), 16)
    return found


def _names(mask: int) -> list[str]:
    return [signal.Signals(n).name for n in range(1, 32) if mask >> (n - 1) & 1]


def test_a_worker_started_by_a_parent_that_ignores_and_blocks_signals_gets_the_defaults(
    env: dict[str, str],  # noqa: F811
) -> None:
    started = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli.main", "run", "--json", "--", "sleep", "60"],
        capture_output=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
        preexec_fn=_hostile_parent,
    )
    assert started.returncode == 0, started.stderr
    session = json.loads(started.stdout)
    pid = session["pid"]
    try:
        masks = _masks(pid)
        assert masks["SigIgn"] == 0, f"worker ignores {_names(masks['SigIgn'])}"
        assert masks["SigBlk"] == 0, f"worker blocks {_names(masks['SigBlk'])}"
        # The keeper cleared its own inherited mask too (its SIGCHLD and stop handlers work).
        keeper = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert _masks(keeper)["SigBlk"] == 0
    finally:
        assert dispatch(env, "kill", session["id"]).returncode == 0


def test_a_worker_started_from_a_background_job_ignores_nothing(
    env: dict[str, str],  # noqa: F811
) -> None:
    # The reproduction: `sh -c 'dispatch run --follow -- grep SigIgn ... & wait'`.
    script = (
        f"{sys.executable} -m dispatcher.cli.main run --follow -- "
        "grep -E '^Sig(Ign|Blk)' /proc/self/status & wait"
    )
    done = subprocess.run(
        ["sh", "-c", script], capture_output=True, env=env, cwd=ROOT, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(":\t") for line in done.stdout.decode().splitlines())
    assert int(lines["SigIgn"], 16) == 0, done.stdout
    assert int(lines["SigBlk"], 16) == 0, done.stdout


def test_a_keeper_forked_by_a_hostile_parents_fork_server_gives_its_worker_the_defaults(
    tmp_path: Path,
) -> None:
    # The fork server inherits the hostile state (it is exec'd by the launcher); each keeper
    # it forks starts from a fresh interpreter's signal state and hands its worker the defaults.
    state = tmp_path / "state"
    with start_path("fork_server"):
        launcher, info = start_launcher(state, ["sleep", "60"], preexec_fn=_hostile_parent)
    try:
        assert info["forked"] == 1
        with open_registry(state, follow=False, cleanup=False) as registry:
            session = registry.get(info["id"])
        pid = session.worker_pid or 0
        keeper = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        server = int(Path(f"/proc/{keeper}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert _masks(server)["SigIgn"] != 0  # the server did inherit the hostile parent's
        masks = _masks(pid)
        assert masks["SigIgn"] == 0, f"worker ignores {_names(masks['SigIgn'])}"
        assert masks["SigBlk"] == 0, f"worker blocks {_names(masks['SigBlk'])}"
        assert _masks(keeper)["SigBlk"] == 0
    finally:
        launcher.kill()
        launcher.wait(timeout=10)
        stop_all(state)
