"""Output capture throughput through the keeper against ``cat > file``.

The same source file is copied by ``cat`` into a file (the baseline) and by ``cat`` running
under a keeper into its log (stdout pipe, keeper, log file). The figure with the target is the
worker's own time to push every byte out (the keeper's ``started_at`` to ``finished_at``: the
writer is only as fast as the keeper drains its pipe); the end-to-end time, keeper start-up
and exit record included, is reported next to it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from registry.process import KEEPER_SCRIPT
from tests.benchmarks.common import Row, median, timer

NAME = "registry_capture"
DESCRIPTION = "output capture throughput through the keeper vs cat > file (target >= 0.5x)"


def run(quick: bool) -> list[Row]:
    """Median throughput of both paths and their ratio."""
    size_mb = 32 if quick else 256
    repeat = 3 if quick else 7
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        source = root / "source"
        with open(source, "wb") as f:
            block = os.urandom(1 << 20)
            for _ in range(size_mb):
                f.write(block)
        cat_times: list[float] = []
        keeper_times: list[float] = []
        worker_times: list[float] = []
        for round_ in range(repeat + 1):
            target = root / "copy"
            with timer() as t, open(target, "wb") as out:
                subprocess.run(["cat", str(source)], stdout=out, check=True)
            target.unlink()
            directory = root / f"s{round_}"
            directory.mkdir(mode=0o700)
            os.mkfifo(directory / "stdin", 0o600)
            spec = {
                "session": "s_000000000000",
                "dir": str(directory),
                "argv": ["cat", str(source)],
                "cwd": "/",
                "env": {"PATH": os.defpath},
                "max_log_bytes": 1 << 40,
                "drain_time": 1.0,
            }
            (directory / "spec.json").write_text(json.dumps(spec))
            argv = [sys.executable, "-I", "-S", str(KEEPER_SCRIPT), str(directory / "spec.json")]
            with timer() as k:
                subprocess.run(argv, check=True)
            if (directory / "output.log").stat().st_size != size_mb << 20:
                raise RuntimeError("the keeper's log does not hold every byte")
            (directory / "output.log").unlink()
            record = json.loads((directory / "exit.json").read_text())
            if round_:  # the first round warms the page cache
                cat_times.append(t.elapsed)
                keeper_times.append(k.elapsed)
                worker_times.append(record["finished_at"] - record["started_at"])
    cat_rate = size_mb / median(cat_times)
    worker_rate = size_mb / median(worker_times)
    keeper_rate = size_mb / median(keeper_times)
    share = worker_rate / cat_rate
    return [
        Row(figure="cat > file", value=cat_rate, unit="MiB/s", note=f"{size_mb} MiB, n={repeat}"),
        Row(
            figure="cat | keeper > log",
            value=worker_rate,
            unit="MiB/s",
            baseline=cat_rate,
            ratio=share,
            target=">= 0.5x",
            met=share >= 0.5,
            note=f"{size_mb} MiB, n={repeat}, the worker's time to write it all",
        ),
        Row(
            figure="same, end to end",
            value=keeper_rate,
            unit="MiB/s",
            baseline=cat_rate,
            ratio=keeper_rate / cat_rate,
            note="keeper start-up and the fsync'd exit record included",
        ),
    ]
