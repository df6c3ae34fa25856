"""``dispatch web``: the board page on a big board, and what live clients cost the gateway.

(a) *board page*: a state dir with 5,000 cards (3,500 done, 800 ready, 300 todo, 200 review,
150 blocked, 50 archived; done cards come 50 to a page) served by a real ``dispatch web``
process; the figure is the server's own time for ``GET /`` (its ``Server-Timing`` header: from
the request reaching the application to the answer starting), p50 over repeated loads, with
the client's wall time and the page size in the note. Baseline: the same page on an empty board
in the same run. ``/metrics`` on the same board is reported too.

(b) *live clients*: the gateway benchmark's ready -> worker running measurement
(:func:`tests.benchmarks.bench_gateway._latency`: ``dispatch serve`` as a ``Type=notify`` unit
of a systemd user manager, scoped workers, one card at a time), run alternately without a
dashboard and with a ``dispatch web`` on the same state dir holding 50 open board streams that
each receive every card. The figure is the p50 with clients over the p50 without (both pooled
over the rounds); every client must have received every card.

Full mode: 30 page loads; 3 rounds of 40 cards each way. Quick: 8 loads; 1 round of 12 cards.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shutil
import socket
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from dispatcher.app.database import open_state
from dispatcher.kanban.model import CardStatus, NewCard
from dispatcher.kanban.store import SqliteBoardStore
from tests.benchmarks.bench_gateway import Serve, _latency, _load
from tests.benchmarks.common import Row, median, percentile, ratio
from tests.support.browser import WebProcess
from tests.support.env import no_bus_env

NAME = "web"
DESCRIPTION = (
    "dispatch web: board page server time with 5,000 cards; gateway ready -> running p50 "
    "with 50 live dashboard clients vs none"
)

TARGET_BOARD_MS = 100.0
TARGET_SLOWDOWN = 1.10
CLIENTS = 50
MIX = (
    (CardStatus.DONE, 3500),
    (CardStatus.READY, 800),
    (CardStatus.TODO, 300),
    (CardStatus.REVIEW, 200),
    (CardStatus.BLOCKED, 150),
    (CardStatus.ARCHIVED, 50),
)
CONFIG = "kanban:\n  assignees:\n    a:\n      command: ['true']\n    b:\n      command: ['true']\n"


def _fill(state: Path) -> int:
    """The board of the module docstring, written through the board store."""
    now = time.time() - 86400
    count = 0
    with open_state(state) as db:
        store = SqliteBoardStore(db)
        for status, many in MIX:
            for _ in range(many):
                count += 1
                card, _ = store.add_card(
                    NewCard(
                        title=f"card {count}: rotate the keys of service {count % 97}",
                        assignee="ab"[count % 2],
                        priority=count % 7,
                        body="some words about the card\n" * 4,
                    ),
                    now=now + count,
                )
                if status is CardStatus.ARCHIVED:
                    store.archive(card.id, now=now + count)
                elif status is not CardStatus.READY:
                    store.move(card.id, status, now=now + count)
    return count


def _timed_get(url: str) -> tuple[float, float, int]:
    """(server ms from Server-Timing, client wall ms, bytes) of one GET."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as answer:
        body = answer.read()
        header = answer.headers.get("server-timing", "")
    wall = (time.perf_counter() - started) * 1000
    server = float(header.split("dur=")[1]) if "dur=" in header else float("nan")
    return server, wall, len(body)


def _page_times(url: str, loads: int) -> tuple[list[float], list[float], int]:
    for _ in range(3):
        _timed_get(url)  # warm up: templates compiled, caches of the database filled
    server, wall, size = [], [], 0
    for _ in range(loads):
        s, w, size = _timed_get(url)
        server.append(s)
        wall.append(w)
    return server, wall, size


@contextlib.contextmanager
def _dashboard(root: Path, cards: bool) -> Iterator[WebProcess]:
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(CONFIG)
    state = root / "state"
    if cards:
        _fill(state)
    web = WebProcess(root / "config.yaml", state, no_bus_env(root))
    try:
        yield web
    finally:
        web.stop()


def _board_rows(loads: int) -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="bench-web-board-"))
    try:
        load_before = _load()
        with _dashboard(root / "empty", cards=False) as web:
            empty, _, _ = _page_times(web.url + "/", loads)
        built = time.perf_counter()
        with _dashboard(root / "full", cards=True) as web:
            built = time.perf_counter() - built
            server, wall, size = _page_times(web.url + "/", loads)
            metrics, _, _ = _page_times(web.url + "/metrics", max(3, loads // 3))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    value = median(server)
    base = median(empty)
    note = (
        f"n={loads}, p90={percentile(server, 90):.1f} ms; client wall p50 {median(wall):.1f} ms; "
        f"{size // 1024} KiB; shown: the first 200 of each other column, 50 of 3,500 done; "
        f"{load_before} before, {_load()} after; baseline: the empty board"
    )
    return [
        Row(
            figure="web: board page with 5,000 cards, server time p50",
            value=value,
            unit="ms",
            baseline=base,
            ratio=ratio(value, base),
            target=f"p50 <= {TARGET_BOARD_MS:g} ms",
            met=value <= TARGET_BOARD_MS,
            note=note,
        ),
        Row(
            figure="web: /metrics with 5,000 cards, server time p50",
            value=median(metrics),
            unit="ms",
            note=f"n={len(metrics)}; board built in {built:.1f} s",
        ),
    ]


class _Listeners:
    """``count`` open streams of one SSE URL, read by a single thread that only notes which
    card ids each received: clients as light as a browser elsewhere would be for this machine
    (50 Python threads parsing JSON would measure the benchmark, not the dashboard)."""

    _ID = re.compile(rb'"id":"(c_[0-9a-f]+)"')

    def __init__(self, url: str, count: int) -> None:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        request = (
            f"GET {parts.path}?{parts.query} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        ).encode()
        self.socks = [socket.create_connection((host, port), timeout=30) for _ in range(count)]
        for sock in self.socks:
            sock.sendall(request)
        self.seen: list[set[bytes]] = [set() for _ in self.socks]
        self.heads: list[bytes] = [b"" for _ in self.socks]
        self._tails: list[bytes] = [b"" for _ in self.socks]
        self._selector = selectors.DefaultSelector()
        for index, sock in enumerate(self.socks):
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ, index)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.2):
                index = key.data
                try:
                    data = self.socks[index].recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._selector.unregister(key.fileobj)
                    continue
                if len(self.heads[index]) < 16:
                    self.heads[index] += data[:16]
                text = self._tails[index] + data
                cut = text.rfind(b"\n") + 1
                self.seen[index].update(self._ID.findall(text[:cut]))
                self._tails[index] = text[cut:]

    def wait_for(self, expected: int, timeout: float) -> list[int]:
        """Cards each client has received, once all have ``expected`` (or at ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and min(len(s) for s in self.seen) < expected:
            time.sleep(0.05)  # bounded: the deadline above
        return [len(s) for s in self.seen]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._selector.close()
        for sock in self.socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@contextlib.contextmanager
def _clients(serve: Serve, expected: int, delivered: list[int]) -> Iterator[None]:
    """A dashboard on the serve's state dir with :data:`CLIENTS` open board streams; after
    the block, how many of the ``expected`` cards each client received goes to ``delivered``."""
    web = WebProcess(serve.config, serve.state, serve.env())
    listeners = _Listeners(web.url + "/live/board?after=0", CLIENTS)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(len(h) < 12 for h in listeners.heads):
            time.sleep(0.05)  # bounded: every stream answered its first line
        if any(not h.startswith(b"HTTP/1.1 200") for h in listeners.heads):
            raise RuntimeError(f"a live client was refused: {set(listeners.heads)}")
        yield
        delivered += listeners.wait_for(expected, timeout=30)
    finally:
        listeners.close()
        web.stop()


def _fanout_rows(rounds: int, count: int) -> list[Row]:
    from tests.support.systemd import ManagerUnavailable, acquire_manager

    figure = f"serve: ready -> worker running p50 with {CLIENTS} live dashboard clients"
    try:
        manager = acquire_manager(dict(os.environ))
    except ManagerUnavailable as exc:
        note = f"no systemd user manager: {exc.reason.splitlines()[0]}"
        return [Row(figure=figure, value=None, unit="ms", note=note)]
    plain: list[float] = []
    loaded: list[float] = []
    delivered: list[int] = []
    load_before = _load()
    try:
        for _ in range(rounds):
            plain += _latency(manager, count)["latency"]
            with_clients = _latency(manager, count, lambda serve: _clients(serve, count, delivered))
            loaded += with_clients["latency"]
    finally:
        manager.close()
    value, base = median(loaded) * 1000, median(plain) * 1000
    short = [n for n in delivered if n < count]
    if short:
        raise RuntimeError(f"{len(short)} live clients missed cards: {sorted(short)[:5]}")
    slowdown = ratio(value, base)
    return [
        Row(
            figure=figure,
            value=value,
            unit="ms",
            baseline=base,
            ratio=slowdown,
            target=f"<= {TARGET_SLOWDOWN:.2f}x",
            met=slowdown is not None and slowdown <= TARGET_SLOWDOWN,
            note=f"n={len(loaded)} vs {len(plain)} cards in {rounds} alternating rounds; "
            f"p99 {percentile(loaded, 99) * 1000:.1f} vs {percentile(plain, 99) * 1000:.1f} ms; "
            f"every client got every card ({len(delivered)} clients); baseline: no dashboard; "
            f"{load_before} before, {_load()} after",
        )
    ]


def run(quick: bool) -> list[Row]:
    """Both parts (see the module docstring)."""
    loads, rounds, count = (8, 1, 12) if quick else (30, 3, 40)
    return [*_board_rows(loads), *_fanout_rows(rounds, count)]
