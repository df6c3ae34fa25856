"""The keeper's own cost: start-up and memory against a bare ``python -I -S -c pass``.

Start-up is the time from starting the keeper (exactly as the registry does, compiled
bytecode included) until it reports its worker running through the ready pipe (gate, spec,
log, reserved records, fork/exec, ``keeper.json``). A whole keeper life around ``/bin/true``
(with the fsync'd exit record) is reported next to it. RSS is the keeper's resident memory
while its worker sleeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from registry.process import keeper_command
from tests.benchmarks.common import Row, measure_commands, median, percentile, ratio

NAME = "registry_keeper"
DESCRIPTION = "keeper start-up and RSS vs python -I -S -c pass (targets <= 1.5x, <= 12 MB)"


def _spec(directory: Path, argv: list[str], ready_fd: int | None = None) -> Path:
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


def _time_to_ready(command: list[str], root: Path, index: int) -> tuple[float, int]:
    """Seconds until the keeper reports its worker running, and the keeper's RSS then."""
    read_end, write_end = os.pipe()
    spec = _spec(root / f"ready{index}", ["sleep", "30"], ready_fd=write_end)
    started = time.perf_counter()
    proc = subprocess.Popen([*command, str(spec)], pass_fds=(write_end,))
    os.close(write_end)
    try:
        if os.read(read_end, 1) != b"1":
            raise RuntimeError("the keeper did not start its worker")
        elapsed = time.perf_counter() - started
        return elapsed, _rss_kb(proc.pid)
    finally:
        os.close(read_end)
        proc.terminate()
        proc.wait(timeout=10)


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
    """Median start-up of both, the whole life around /bin/true, and the keeper's RSS."""
    repeat = 5 if quick else 40
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        command = keeper_command(None, root / "cache")
        compiled = command[-1].endswith(".pyc")
        ready: list[float] = []
        bare: list[float] = []
        rss: list[int] = []
        _time_to_ready(command, root, -1)  # warm-up
        for i in range(repeat):  # interleaved, so load drift hits both alike
            bare += _bare(1)
            elapsed, kb = _time_to_ready(command, root, i)
            ready.append(elapsed)
            rss.append(kb)
        life = measure_commands(
            {"keeper": [*command, str(_spec(root / "life", ["/bin/true"]))]}, repeat
        )["keeper"]
    bare_kb = _bare_rss()
    base = median(bare) * 1000
    value = median(ready) * 1000
    startup_ratio = ratio(value, base)
    rss_mb = median([float(k) for k in rss]) / 1024
    return [
        Row(
            figure="python -I -S -c pass",
            value=base,
            unit="ms",
            note=f"n={repeat}, p90={percentile(bare, 90) * 1000:.1f} ms",
        ),
        Row(
            figure="keeper start-up (worker running)",
            value=value,
            unit="ms",
            baseline=base,
            ratio=startup_ratio,
            target="<= 1.5x",
            met=None if startup_ratio is None else startup_ratio <= 1.5,
            note=f"n={repeat}, p90={percentile(ready, 90) * 1000:.1f} ms, "
            + ("compiled keeper" if compiled else "keeper from source"),
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
    ]
