"""Notifications (issue 24 §1): delivery latency, and what a full outbox costs dispatching.

(a) *event committed -> webhook received*: ``dispatch serve`` (board paused: the message is
the point) with a rule sending ``card.added`` to a webhook on 127.0.0.1 (a small HTTP server in
this process that notes each POST's arrival). Cards are added one at a time the way ``dispatch
kanban add`` adds them (a workspace per card: open, add, close, which pokes serve); the figure
is arrival minus the instant the add returned (its commit), p50 and p99. Targets: p50 <= 100
ms, p99 <= 500 ms.

(b) *ready -> running with 1,000 undeliverable messages*: the same serve, claiming this time;
each card's worker writes ``$EPOCHREALTIME`` as its first instruction, and the figure is that
instant minus the add's commit, the median over the cards, measured twice in the same run:
with an empty outbox (the baseline) and with 1,000 pending messages for a channel whose port
refuses every connection (serve's sender keeps retrying them meanwhile). The two serves run
side by side on state dirs of their own and get their cards in turn, so machine load hits both
alike. Target: <= 1.1x.

Runs without systemd (workers ``in_process``); both parts start serve as a child process on a
state dir of their own. Full mode: 100 deliveries, 40 cards per outbox. Quick: 15 and 8.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dispatcher.app.database import open_state
from dispatcher.app.workspace import Workspace
from dispatcher.config import load_config
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.outbox import Outbox, Route, Subject
from tests.benchmarks.common import Row, median, percentile, ratio
from tests.support.cli import dispatch_argv
from tests.support.env import no_bus_env

NAME = "notify"
DESCRIPTION = (
    "notifications: event committed -> webhook received p50/p99; ready -> running with 1,000 "
    "undeliverable messages vs an empty outbox"
)
DEADLINE = 30.0


class Receiver:
    """Notes the arrival time of every POST by the card id in its message."""

    def __init__(self) -> None:
        got: dict[str, float] = {}
        self.got = got

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                arrived = time.time()
                self.send_response(204)
                self.end_headers()
                card = json.loads(body).get("card") or {}
                got[str(card.get("id"))] = arrived

            def log_message(self, *args: object) -> None:
                """Quiet."""

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _refused_port() -> int:
    """A loopback port nothing listens on (connections are refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _serve(root: Path, config: str) -> Iterator[Callable[[str, str], tuple[str, float]]]:
    """serve on ``root`` with ``config``; yields ``add(title, assignee) -> (id, commit)``."""
    path = root / "config.yaml"
    path.write_text(config)
    env = {**no_bus_env(root), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    settings = load_config(path).settings
    with (root / "serve.err").open("ab") as err:
        proc = subprocess.Popen(
            dispatch_argv(path, root / "state", "serve"),
            env=env,
            stderr=err,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )

    def add(title: str, assignee: str) -> tuple[str, float]:
        workspace = Workspace(settings, root / "state", environ=env, config_path=path)
        try:
            card, _ = workspace.board.add(title, assignee=assignee, now=workspace.now())
            committed = time.time()
        finally:
            workspace.close()
        return card.id, committed

    try:
        yield add
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _wait(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {DEADLINE:g} s")
        time.sleep(0.002)


def _delivery(root: Path, count: int) -> list[float]:
    receiver = Receiver()
    try:
        config = (
            "kanban:\n  assignees:\n    a: {command: ['true']}\n"
            f"notify:\n  channels: {{hook: {{webhook: {{url: 'http://127.0.0.1:"
            f"{receiver.port}/'}}}}}}\n  rules: [{{on: [card.added], to: [hook]}}]\n"
        )
        with open_state(root / "state") as db:
            SqliteBoardStore(db).set_paused(True)
        samples = []
        with _serve(root, config) as add:
            for index in range(count + 1):
                card, committed = add(f"note {index}", "a")
                _wait(lambda card=card: card in receiver.got, "delivery")  # type: ignore[misc]
                if index:  # the first one wakes a cold serve
                    samples.append(receiver.got[card] - committed)
        return samples
    finally:
        receiver.close()


def _claim_config(root: Path) -> str:
    marks = root / "marks"
    marks.mkdir(parents=True)
    return (
        "kanban:\n  max_in_progress: 4\n  assignees:\n"
        "    w: {command: [bash, -c, 'echo $EPOCHREALTIME > \"$DISPATCH_CARD_ID\"'],"
        f" cwd: '{marks}'}}\n"
        f"notify:\n  channels: {{dead: {{webhook: {{url: 'http://127.0.0.1:{_refused_port()}/'}}}}}}\n"
        "  rules: [{on: [cron.missed], to: [dead]}]\n"
    )


def _backlog(root: Path, count: int) -> None:
    """``count`` pending messages for the refusing channel, queued before serve starts."""
    outbox = Outbox([Route(events=frozenset({"card.added"}), channels=("dead",))])
    with open_state(root / "state") as db, db.write() as conn:
        for index in range(count):
            outbox.record(
                conn, "card.added", {"card": {"id": f"c_{index}"}}, Subject(), time.time()
            )


def _claims(empty_root: Path, full_root: Path, count: int) -> tuple[list[float], list[float]]:
    """ready -> running samples of two serves running side by side, one with an empty outbox
    and one with 1,000 undeliverable messages, the cards added to each in turn (so both see
    the same machine load)."""
    configs = {root: _claim_config(root) for root in (empty_root, full_root)}
    _backlog(full_root, 1000)
    samples: dict[Path, list[float]] = {empty_root: [], full_root: []}
    with contextlib.ExitStack() as stack:
        adds = {root: stack.enter_context(_serve(root, configs[root])) for root in configs}
        for index in range(count + 1):
            for root, add in adds.items():
                card, committed = add(f"claim {index}", "w")
                mark = root / "marks" / card
                _wait(lambda mark=mark: mark.exists() and mark.read_text().strip(), "worker start")  # type: ignore[misc]
                if index:  # the first one wakes a cold serve
                    samples[root].append(float(mark.read_text()) - committed)
    return samples[empty_root], samples[full_root]


def run(quick: bool) -> list[Row]:
    """Both parts (see the module docstring)."""
    deliveries, cards = (15, 8) if quick else (100, 40)
    base = Path(tempfile.mkdtemp(prefix="bench-notify-"))
    try:
        latency = _delivery(base / "delivery", deliveries)
        empty, full = _claims(base / "empty", base / "full", cards)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    p50, p99 = median(latency) * 1000, percentile(latency, 99) * 1000
    idle, busy = median(empty) * 1000, median(full) * 1000
    return [
        Row(
            figure=f"event committed -> webhook received p50 ({deliveries} card.added)",
            value=round(p50, 1),
            unit="ms",
            target="<= 100 ms",
            met=p50 <= 100,
        ),
        Row(
            figure="event committed -> webhook received p99",
            value=round(p99, 1),
            unit="ms",
            target="<= 500 ms",
            met=p99 <= 500,
        ),
        Row(
            figure=f"ready -> running median, 1,000 undeliverable messages ({cards} cards)",
            value=round(busy, 1),
            unit="ms",
            baseline=round(idle, 1),
            ratio=ratio(busy, idle),
            target="<= 1.1x the empty outbox",
            met=busy <= idle * 1.1,
            note=f"empty outbox p99 {percentile(empty, 99) * 1000:.0f} ms, "
            f"full p99 {percentile(full, 99) * 1000:.0f} ms",
        ),
    ]
