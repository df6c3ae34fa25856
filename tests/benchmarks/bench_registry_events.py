"""Costs of completions, heartbeats, redaction and the PTY terminal-query responder.

* completion publish: spawn-to-final of ``true`` with ``notify`` (the completion event is
  stored in the finalizing transaction) against the same without it;
* heartbeats: one timer tick that publishes a heartbeat for each of N running sessions;
* redaction: the default redactor over log-like text with a secret every 50 lines;
* PTY capture: a PTY worker printing escape-dense text (colours on every line, which the
  responder must parse) against the same amount of plain text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from registry.abc import EventType, Owner, SpawnRequest
from registry.output.redact import Redactor
from registry.process import KEEPER_SCRIPT, ProcessRegistry
from registry.settings import RegistrySettings
from registry.store.database import StateDB
from registry.store.tables import COMPONENT
from scope.abc import CallerKind
from scope.fake import FakeScoper
from scope.foundation.clock import FakeClock
from tests.benchmarks.common import Row, median, timer

NAME = "registry_events"
DESCRIPTION = "completion publish, heartbeat tick, redaction and PTY responder costs"

OWNER = Owner(kind="bench", id="events")


def _registry(state: Path, clock: FakeClock | None = None) -> tuple[ProcessRegistry, StateDB]:
    db = StateDB.in_dir(state, [COMPONENT])
    registry = ProcessRegistry(
        state_dir=state,
        db=db,
        scoper=FakeScoper(probe_ok=False),
        settings=RegistrySettings(kill_grace=0.5),
        clock=clock,
    )
    return registry, db


def _request(argv: list[str], **fields: object) -> SpawnRequest:
    return SpawnRequest(
        argv=argv,
        cwd="/",
        env=dict(os.environ),
        owner=OWNER,
        caller=CallerKind.CLI,
        **fields,  # type: ignore[arg-type]
    )


def _completion_rows(root: Path, quick: bool) -> list[Row]:
    repeat = 10 if quick else 60
    registry, db = _registry(root / "c")
    plain: list[float] = []
    notify: list[float] = []
    try:
        for index in range(repeat + 1):
            for wanted, samples in ((False, plain), (True, notify)):
                with timer() as t:
                    session = registry.spawn(_request(["true"], notify=wanted))
                    registry.wait(session.id, timeout=30)
                if index:  # the first round warms up
                    samples.append(t.elapsed)
        if len(registry.events()) != repeat + 1:
            raise RuntimeError("not one completion per notifying session")
    finally:
        registry.close()
        db.close()
    base, value = median(plain) * 1000, median(notify) * 1000
    return [
        Row(figure="spawn to final, plain", value=base, unit="ms", note=f"n={repeat}"),
        Row(
            figure="spawn to final, notify",
            value=value,
            unit="ms",
            baseline=base,
            ratio=value / base,
            target="<= 1.25x",
            met=value / base <= 1.25,
            note="completion event in the finalizing transaction",
        ),
    ]


def _heartbeat_rows(root: Path, quick: bool) -> list[Row]:
    count = 20 if quick else 200
    clock = FakeClock(start=time.time())
    registry, db = _registry(root / "h", clock)
    try:
        sessions = [
            registry.spawn(
                _request(["sh", "-c", "echo hello; exec sleep 600"], heartbeat=60, output_chars=200)
            )
            for _ in range(count)
        ]
        deadline = time.monotonic() + 30
        while any(registry.read_log(s.id) != b"hello\n" for s in sessions):
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not print")
            time.sleep(0.05)
        clock.advance(60)
        with timer() as t:
            registry.notifier.tick()
        beats = [e for e in registry.events() if e.type is EventType.HEARTBEAT]
        if len(beats) != count:
            raise RuntimeError(f"{len(beats)} heartbeats for {count} sessions")
        for session in sessions:
            registry.kill(session.id, grace=0.2)
    finally:
        registry.close()
        db.close()
    return [
        Row(
            figure=f"heartbeat tick, {count} sessions",
            value=t.elapsed * 1000 / count,
            unit="ms/heartbeat",
            note=f"whole tick {t.elapsed * 1000:.0f} ms",
        )
    ]


def _redaction_rows(quick: bool) -> list[Row]:
    lines = []
    for i in range(20_000):
        if i % 50 == 0:
            lines.append(f"[{i}] export GITHUB_TOKEN=ghp_{'a' * 36} and Bearer abcdefgh{i}\n")
        else:
            lines.append(f"[{i}] compiling module_{i}.c -> build/module_{i}.o (ok) 12.5 ms\n")
    text = "".join(lines)
    size = len(text.encode()) / (1 << 20)
    redact = Redactor()
    samples = []
    for _ in range(3 if quick else 9):
        with timer() as t:
            redact(text)
        samples.append(t.elapsed)
    rate = size / median(samples)
    return [
        Row(
            figure="default redaction",
            value=rate,
            unit="MiB/s",
            target=">= 10 MiB/s",
            met=rate >= 10,
            note=f"{size:.1f} MiB of build-log text, n={len(samples)}",
        )
    ]


def _keeper_pty(root: Path, name: str, script: str) -> float:
    directory = root / name
    directory.mkdir(mode=0o700)
    os.mkfifo(directory / "stdin", 0o600)
    spec = {
        "session": "s_000000000000",
        "dir": str(directory),
        "argv": [sys.executable, "-c", script],
        "cwd": "/",
        "env": {"PATH": os.defpath},
        "pty": True,
        "max_log_bytes": 1 << 40,
        "drain_time": 1.0,
    }
    (directory / "spec.json").write_text(json.dumps(spec))
    argv = [sys.executable, "-I", "-S", str(KEEPER_SCRIPT), str(directory / "spec.json")]
    subprocess.run(argv, check=True, timeout=300)
    record = json.loads((directory / "exit.json").read_text())
    return float(record["finished_at"] - record["started_at"])


def _pty_rows(root: Path, quick: bool) -> list[Row]:
    size_mb = 4 if quick else 32
    repeat = 2 if quick else 5
    body = "import sys\nline = {line!r}\nout = sys.stdout.buffer\n"
    body += f"n = {size_mb} * (1 << 20) // len(line)\n"
    body += "for _ in range(n // 64):\n    out.write(line * 64)\nout.flush()\n"
    plain = body.format(line=b"plain text output of a build step, nothing special\n")
    colour = body.format(line=b"\x1b[32mok\x1b[0m build step \x1b[1m42\x1b[0m done \x1b[K\n")
    plain_times, colour_times = [], []
    for index in range(repeat):
        plain_times.append(_keeper_pty(root, f"p{index}", plain))
        colour_times.append(_keeper_pty(root, f"c{index}", colour))
    plain_rate = size_mb / median(plain_times)
    colour_rate = size_mb / median(colour_times)
    share = colour_rate / plain_rate
    return [
        Row(
            figure="PTY capture, plain text", value=plain_rate, unit="MiB/s", note=f"{size_mb} MiB"
        ),
        Row(
            figure="PTY capture, escape-dense",
            value=colour_rate,
            unit="MiB/s",
            baseline=plain_rate,
            ratio=share,
            target=">= 0.5x",
            met=share >= 0.5,
            note=f"4 sequences per line parsed by the responder, n={repeat}",
        ),
    ]


def run(quick: bool) -> list[Row]:
    """All four groups of figures."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = _completion_rows(root, quick)
        rows += _heartbeat_rows(root, quick)
        rows += _redaction_rows(quick)
        rows += _pty_rows(root, quick)
    return rows
