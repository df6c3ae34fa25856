"""The keeper's own cost: start-up and memory against a bare ``python -I -S -c pass``, for a
fresh keeper and for one forked by the fork server, interleaved in one run.

Start-up is the time from starting the keeper (exactly as the registry does, compiled
bytecode included, behind a gate opened at once) until it reports its worker running through
the ready pipe (gate, spec, log, reserved records, fork/exec, ``keeper.json``). Through the
fork server that is the request, the fork and the same keeper work. A whole keeper life around
``/bin/true`` (with the fsync'd exit record) is reported next to it. RSS is the keeper's
resident memory while its worker sleeps; PSS counts pages shared with other processes (the
fork server's, copy-on-write) by their share, so it is what a keeper really costs the host.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from registry.process import ForkServer, keeper_command
from scope.abc import LaunchSpec
from scope.spawn import start_released
from tests.benchmarks.common import Row, measure_commands, median, percentile, ratio

NAME = "registry_keeper"
DESCRIPTION = (
    "keeper start-up, RSS and PSS vs python -I -S -c pass, fresh and through the fork server "
    "(targets <= 1.5x fresh, <= 0.3x forked, <= 12 MB, forked RSS <= fresh)"
)


def _spec(
    directory: Path, argv: list[str], ready_fd: int | None = None, record_fd: int | None = None
) -> Path:
    directory.mkdir(mode=0o700, exist_ok=True)
    spec = {
        "session": "s_000000000000",
        "dir": str(directory),
        "argv": argv,
        "cwd": "/",
        "env": {"PATH": os.defpath},
        "pty": False,
        "max_log_bytes": 1 << 20,
        "timeout": None,
        "kill_grace": 1.0,
        "drain_time": 1.0,
        "ready_fd": ready_fd,
        "record_fd": record_fd,
    }
    path = directory / "spec.json"
    path.write_text(json.dumps(spec))
    if not (directory / "stdin").exists():
        os.mkfifo(directory / "stdin", 0o600)
    return path


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise LookupError("VmRSS")


def _pss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise LookupError("Pss")


def _time_to_ready(
    command: list[str], root: Path, index: int, server: ForkServer | None = None
) -> tuple[float, int, int]:
    """Seconds until the keeper reports its worker running, and the keeper's RSS and PSS then
    (started as the registry starts it: behind a gate, through ``server`` when given)."""
    read_end, write_end = os.pipe()
    # The record gate, opened at once: the registry opens it after one row update.
    record_r, record_w = os.pipe()
    err = os.open(os.devnull, os.O_WRONLY)
    spec = _spec(root / f"ready{index}", ["sleep", "30"], ready_fd=write_end, record_fd=record_r)
    launch = LaunchSpec(
        argv=[*command, str(spec)],
        env={"PATH": os.defpath, "LC_ALL": "C.UTF-8"},
        cwd=str(spec.parent),
        pass_fds=(write_end, record_r),
        stderr=err,
        gated=True,
        starter=server,
    )
    started = time.perf_counter()
    keeper = start_released(launch)
    os.write(record_w, b"1")
    for fd in (write_end, err, record_r, record_w):
        os.close(fd)
    pidfd = os.pidfd_open(keeper.pid)
    try:
        if os.read(read_end, 1) != b"1":
            raise RuntimeError("the keeper did not start its worker")
        elapsed = time.perf_counter() - started
        return elapsed, _rss_kb(keeper.pid), _pss_kb(keeper.pid)
    finally:
        os.close(read_end)
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        select.select([pidfd], [], [], 10)
        os.close(pidfd)
        if keeper.process is not None:
            keeper.process.wait(timeout=10)


def _bare(repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
        samples.append(time.perf_counter() - started)
    return samples


def _bare_rss() -> int:
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
    )
    try:
        time.sleep(0.2)
        return _rss_kb(proc.pid)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)


def run(quick: bool) -> list[Row]:
    """Median start-up of all three, the whole life around /bin/true, RSS and PSS."""
    repeat = 5 if quick else 40
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        command = keeper_command(None, root / "cache")
        compiled = command[-1].endswith(".pyc")
        server = ForkServer(cache_dir=root / "cache")
        if not server.open():
            raise RuntimeError("the fork server did not start")
        try:
            fresh, forked = _Samples(), _Samples()
            _time_to_ready(command, root, -1)  # warm-up
            _time_to_ready(command, root, -2, server)
            for i in range(repeat):  # interleaved, so load drift hits all three alike
                fresh.bare += _bare(1)
                fresh.add(*_time_to_ready(command, root, i))
                forked.add(*_time_to_ready(command, root, repeat + i, server))
            server_kb = _rss_kb(server.pid or 0)
            fell_back = server.stats().fallbacks
        finally:
            server.close()
        if fell_back:
            raise RuntimeError(f"spawns fell back from the fork server: {fell_back}")
        life = measure_commands(
            {"keeper": [*command, str(_spec(root / "life", ["/bin/true"]))]}, repeat
        )["keeper"]
    return _rows(repeat, compiled, fresh, forked, life, _bare_rss(), server_kb)


class _Samples:
    """Start-up seconds, RSS and PSS (KiB) of one start path."""

    def __init__(self) -> None:
        self.bare: list[float] = []
        self.ready: list[float] = []
        self.rss: list[float] = []
        self.pss: list[float] = []

    def add(self, elapsed: float, rss_kb: int, pss_kb: int) -> None:
        self.ready.append(elapsed)
        self.rss.append(rss_kb / 1024)
        self.pss.append(pss_kb / 1024)


def _rows(
    repeat: int,
    compiled: bool,
    fresh: _Samples,
    forked: _Samples,
    life: list[float],
    bare_kb: int,
    server_kb: int,
) -> list[Row]:
    base = median(fresh.bare) * 1000
    value = median(fresh.ready) * 1000
    startup_ratio = ratio(value, base)
    through = median(forked.ready) * 1000
    through_ratio = ratio(through, base)
    rss_mb = median(fresh.rss)
    forked_rss = median(forked.rss)
    note = f"n={repeat}, interleaved with the others"
    return [
        Row(
            figure="python -I -S -c pass",
            value=base,
            unit="ms",
            note=f"n={repeat}, p90={percentile(fresh.bare, 90) * 1000:.1f} ms",
        ),
        Row(
            figure="keeper start-up (worker running)",
            value=value,
            unit="ms",
            baseline=base,
            ratio=startup_ratio,
            target="<= 1.5x",
            met=None if startup_ratio is None else startup_ratio <= 1.5,
            note=f"{note}, p90={percentile(fresh.ready, 90) * 1000:.1f} ms, "
            + ("compiled keeper" if compiled else "keeper from source"),
        ),
        Row(
            figure="keeper start-up through the fork server (worker running)",
            value=through,
            unit="ms",
            baseline=base,
            ratio=through_ratio,
            target="<= 0.3x",
            met=None if through_ratio is None else through_ratio <= 0.3,
            note=f"{note}, p90={percentile(forked.ready, 90) * 1000:.1f} ms; "
            "request, fork, the same keeper work",
        ),
        Row(
            figure="keeper life around /bin/true",
            value=median(life) * 1000,
            unit="ms",
            baseline=base,
            ratio=ratio(median(life) * 1000, base),
            note="exit record fsync included",
        ),
        Row(
            figure="keeper RSS",
            value=rss_mb,
            unit="MB",
            baseline=bare_kb / 1024,
            ratio=ratio(rss_mb, bare_kb / 1024),
            target="<= 12 MB",
            met=rss_mb <= 12,
            note="baseline: python -I -S idle",
        ),
        Row(
            figure="keeper RSS, forked by the fork server",
            value=forked_rss,
            unit="MB",
            baseline=rss_mb,
            ratio=ratio(forked_rss, rss_mb),
            target="<= fresh keeper",
            met=forked_rss <= rss_mb,
            note="baseline: a fresh keeper's RSS in the same run",
        ),
        Row(
            figure="keeper PSS, fresh",
            value=median(fresh.pss),
            unit="MB",
            note="pages shared with other processes counted by their share",
        ),
        Row(
            figure="keeper PSS, forked by the fork server",
            value=median(forked.pss),
            unit="MB",
            baseline=median(fresh.pss),
            ratio=ratio(median(forked.pss), median(fresh.pss)),
            note="copy-on-write pages shared with the server and its other keepers",
        ),
        Row(
            figure="fork server RSS",
            value=server_kb / 1024,
            unit="MB",
            baseline=bare_kb / 1024,
            ratio=ratio(server_kb / 1024, bare_kb / 1024),
            note=f"after {2 * repeat + 1} forks; baseline: python -I -S idle",
        ),
    ]
