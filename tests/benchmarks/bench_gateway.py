"""``dispatch serve`` in production shape: ready -> worker running latency, restart adoption.

Both parts run ``dispatch serve`` as a transient ``Type=notify`` service of a systemd user
manager (the host's, or a private one booted like the test suite does), so kanban workers are
placed in their own scopes exactly as in production.

(a) *latency*: cards are added one at a time through the kanban Board API (a
:class:`~dispatcher.app.workspace.Workspace` per card, as ``dispatch kanban add`` does: open,
add, close, which pokes the gateway). Each worker's first instruction writes ``$EPOCHREALTIME``
(bash, no extra exec) to a file; the figure is that instant minus ``time.time()`` right after
the commit that made the card ready, p50/p99. The next card is added once the previous one is
done, so every sample meets an idle gateway. Baselines: the loop this replaces polled every
60 s, so a card waited uniformly 0-60 s (p50 30 s, p99 59.4 s) before the same spawn, and the
bare cost of ``systemd-run --user --scope true`` measured in the same run. Where the time goes is
reported from the run's own records: commit -> claim (gateway wake-up), claim -> spawn request,
spawn request -> worker forked (scope placement + keeper start) and fork -> first instruction.
Both keeper start paths are measured in one run, in rounds of N/2 cards in the order fresh
keepers (``registry.fork_server: false``), fork server (serve's default), fork server, fresh.

(b) *adoption*: serve is restarted (``systemctl --user restart``, which returns after READY=1)
first with no workers (the baseline), then with N live scoped ``sleep`` workers it dispatched.
Figures: exec of the new serve -> READY=1 (the manager's monotonic timestamps), serve's own
"ready in" log figure, the registry's ``adopt()`` (timed by a thin wrapper that runs the
unchanged CLI), the old serve's stop (restart asked -> old process gone; bound 5 s) and the
whole ``systemctl restart``. Every worker must be adopted and survive each restart; afterwards
their scopes are stopped and the run checks that none is left. serve holds two pidfds per
worker, so past ~500 workers systemd's default soft ``LimitNOFILE=1024`` is too small (spawns
fail with EMFILE): the benchmark's unit raises it, as an operator's unit would have to.

Full mode: 500 cards, 500 workers, 3 restarts each. Quick: 40 cards, 50 workers, 2 restarts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager, nullcontext
from pathlib import Path

from dispatcher.app.workspace import Workspace
from dispatcher.config import load_config
from tests.benchmarks.common import REPO_ROOT, Row, median, percentile, ratio
from tests.support.systemd import (
    CommandFailed,
    ManagerUnavailable,
    SystemdManager,
    acquire_manager,
)
from tests.support.wait import wait_for

NAME = "gateway"
DESCRIPTION = (
    "dispatch serve (scoped): ready -> worker running p50/p99 over 500 cards, restart adoption "
    "of 500 live workers"
)

TARGET_P50_MS = 50.0
TARGET_P99_MS = 250.0
FORKED_P50_MS = 10.0
FORKED_P99_MS = 25.0
"""serve's default: keepers from its fork server (issue 26)."""
TARGET_ADOPT_S = 2.0
"""The registry's adoption target for 500 live sessions (issue 4)."""
TARGET_STOP_S = 5.0
"""serve exits within 5 s of SIGTERM (issue 8)."""
POLL_PERIOD = 60.0
"""The interval of the polling loop ``dispatch serve`` replaces."""

# Runs the unchanged CLI with some methods timed (BENCH_TIMED="module:Class.method ..."); one
# stderr line per call: "bench-timed: Class.method <ms> ms <len(result) or ->".
TIMER = """\
import importlib, os, runpy, sys, time
def timed(module, qualname):
    owner_name, name = qualname.split(".")
    owner = getattr(importlib.import_module(module), owner_name)
    real = getattr(owner, name)
    def wrapper(self, *args, **kwargs):
        started = time.perf_counter()
        result = None
        try:
            result = real(self, *args, **kwargs)
            return result
        finally:
            took = (time.perf_counter() - started) * 1000
            size = len(result) if isinstance(result, list) else "-"
            print(f"bench-timed: {qualname} {took:.3f} ms {size}", file=sys.stderr, flush=True)
    setattr(owner, name, wrapper)
for spec in os.environ.get("BENCH_TIMED", "").split():
    timed(*spec.split(":"))
sys.argv[0] = "dispatch"
runpy.run_module("dispatcher.cli.main", run_name="__main__", alter_sys=True)
"""
ADOPT = "ProcessRegistry.adopt"
SHUTDOWN = "Gateway.shutdown"
TIMED = (f"registry.process:{ADOPT}", f"dispatcher.gateway.serve:{SHUTDOWN}")

_ADOPTED = re.compile(r"adopted (\d+) running workers")
_READY_IN = re.compile(r"dispatch serve ready in (\d+) ms")
_TIMED = re.compile(r"bench-timed: (\S+) ([0-9.]+) ms (\S+)")


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f}, {os.cpu_count()} cores"


class Serve:
    """One ``dispatch serve`` transient service with its own config and state dir."""

    def __init__(
        self,
        manager: SystemdManager,
        root: Path,
        config: str,
        *,
        timed: Sequence[str] = (),
        nofile: int | None = None,
    ) -> None:
        self.manager = manager
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        self.state = root / "state"
        self.config = root / "config.yaml"
        self.config.write_text(config)
        self.log = root / "serve.log"
        self.timed = tuple(timed)
        self.nofile = nofile
        self.unit: str | None = None
        self.settings = load_config(self.config).settings

    def env(self) -> dict[str, str]:
        """The manager's environment plus what serve's unit gets."""
        return {**self.manager.env, **self.unit_env()}

    def unit_env(self) -> dict[str, str]:
        """What serve's unit gets on top of the manager's environment."""
        env = {"HOME": str(self.home), "PYTHONPATH": str(REPO_ROOT)}
        if self.timed:
            env["BENCH_TIMED"] = " ".join(self.timed)
        return env

    def start(self) -> None:
        """Start the service; returns after READY=1."""
        head = ["-c", TIMER] if self.timed else ["-m", "dispatcher.cli.main"]
        argv = [sys.executable, *head, "--config", str(self.config)]
        properties = {
            "StandardOutput": f"append:{self.log}",
            "StandardError": f"append:{self.log}",
            "TimeoutStopSec": "15s",
            # Restarted back to back: a serve that starts in well under 2 s would otherwise
            # meet the manager's start limit (5 starts in 10 s), which refuses the start.
            "StartLimitIntervalSec": "0",
        }
        if self.nofile is not None:
            properties["LimitNOFILE"] = str(self.nofile)
        self.unit = self.manager.run_transient_service(
            [*argv, "--state-dir", str(self.state), "serve"],
            env=self.unit_env(),
            type="notify",
            properties=properties,
            cwd=self.root,
            timeout=60,
        )

    def restart(self) -> dict[str, float]:
        """Restart and time it (seconds): ``wall`` (systemctl restart), ``stop`` (restart
        asked -> old serve gone), ``exec_ready`` (new exec -> READY=1), ``ready_in`` (serve's
        own figure), one entry per timed method (``Gateway.shutdown`` is the old serve's), and
        ``adopted`` (the running workers the new serve reported)."""
        assert self.unit is not None
        offset = self.log.stat().st_size if self.log.exists() else 0
        asked = time.monotonic()
        try:
            self.manager.restart_service(self.unit, timeout=120)
        except CommandFailed as err:
            raise RuntimeError(f"{err}; serve's log ends: {self.tail()}") from None
        wall = time.monotonic() - asked
        stamps = ("ExecMainStartTimestamp", "ActiveEnterTimestamp", "InactiveEnterTimestamp")
        props = self.manager.systemctl(
            "show",
            "--property=ActiveState," + ",".join(f"{name}Monotonic" for name in stamps),
            self.unit,
        ).stdout
        values = dict(line.split("=", 1) for line in props.splitlines() if "=" in line)
        if values.get("ActiveState") != "active":
            raise RuntimeError(f"serve not active after restart: {values}; {self.tail()}")
        exec_at, ready_at, stopped_at = (int(values[f"{name}Monotonic"]) / 1e6 for name in stamps)
        with self.log.open("rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
        adopted = _ADOPTED.search(text)
        ready_in = _READY_IN.search(text)
        if adopted is None or ready_in is None:
            raise RuntimeError(f"serve log lacks its start lines after a restart: {text[-2000:]!r}")
        out = {
            "wall": wall,
            "stop": stopped_at - asked,
            "exec_ready": ready_at - exec_at,
            "ready_in": int(ready_in.group(1)) / 1000,
            "adopted": float(adopted.group(1)),
        }
        for match in _TIMED.finditer(text):
            out[match.group(1).rsplit(":", 1)[-1]] = float(match.group(2)) / 1000
        missing = [spec for spec in self.timed if spec.rsplit(":", 1)[-1] not in out]
        if missing:
            raise RuntimeError(f"serve log lacks timings of {missing}: {text[-2000:]!r}")
        return out

    def stop(self) -> None:
        """Stop the service if it is loaded (bounded)."""
        if self.unit and self.manager.unit_property(self.unit, "LoadState") == "loaded":
            self.manager.systemctl("stop", self.unit, check=False, timeout=30)

    def tail(self) -> str:
        """The end of serve's log, for error messages."""
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def workspace(self) -> Workspace:
        """The board, opened as ``dispatch kanban add`` opens it."""
        return Workspace(self.settings, self.state, environ=self.env(), config_path=self.config)

    def db(self) -> closing[sqlite3.Connection]:
        """A read connection to the state database."""
        conn = sqlite3.connect(self.state / "state.db", timeout=30)
        conn.row_factory = sqlite3.Row
        return closing(conn)

    def query(self, sql: str, args: Sequence[object] = ()) -> list[sqlite3.Row]:
        """Rows of one read query."""
        with self.db() as conn:
            return conn.execute(sql, tuple(args)).fetchall()

    def units(self) -> list[str]:
        """Every scope unit a kanban run of this state dir was placed in."""
        rows = self.query("SELECT DISTINCT unit FROM kanban_runs WHERE unit IS NOT NULL")
        return [row["unit"] for row in rows]


@contextmanager
def _serve(
    manager: SystemdManager,
    prefix: str,
    config: str,
    *,
    timed: Sequence[str] = (),
    nofile: int | None = None,
) -> Iterator[Serve]:
    """A started :class:`Serve` in a temporary dir; stopped, its scopes stopped and checked
    gone, and the dir removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    serve = Serve(manager, root, config, timed=timed, nofile=nofile)
    try:
        serve.start()
        yield serve
    finally:
        try:
            serve.stop()
            if (serve.state / "state.db").exists():
                _stop_scopes(manager, serve.units())
        finally:
            shutil.rmtree(root, ignore_errors=True)


def _stop_scopes(manager: SystemdManager, units: list[str]) -> None:
    """Stop these scopes (in batches) and wait until none of them is active."""
    for index in range(0, len(units), 100):
        manager.systemctl("stop", *units[index : index + 100], check=False, timeout=120)

    def left() -> list[str]:
        if not units:
            return []
        shown = manager.systemctl(
            "show", "--property=Id,LoadState,ActiveState", *units, check=False, timeout=60
        ).stdout
        alive = []
        for block in shown.strip().split("\n\n"):
            fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
            if fields.get("ActiveState") not in (None, "inactive", "failed"):
                alive.append(fields.get("Id", "?"))
        return alive

    wait_for(lambda: not left(), timeout=60, interval=0.25, what="worker scopes gone")


# -- (a) ready -> worker running -----------------------------------------------------------------


def _spawn_cost(manager: SystemdManager, repeat: int) -> list[float]:
    """Seconds per ``systemd-run --user --scope --quiet --collect true`` (after one warm-up)."""
    true = shutil.which("true", path=manager.env.get("PATH")) or "true"
    argv = ["--scope", "--quiet", "--collect", true]
    manager.systemd_run(*argv, timeout=30)
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        manager.systemd_run(*argv, timeout=30)
        samples.append(time.perf_counter() - started)
    return samples


def _read_mark(path: Path) -> float | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return float(text) if text.endswith("\n") else None


def _wait_started(serve: Serve, mark: Path, card_id: str) -> float:
    """The worker's first-instruction timestamp, once its card is done (bounded waits)."""

    def stamp() -> float | None:
        return _read_mark(mark)

    def done() -> bool:
        sql = "SELECT 1 FROM kanban_cards WHERE id = ? AND status = 'done'"
        return bool(serve.query(sql, (card_id,)))

    value = wait_for(stamp, timeout=30, interval=0.005, what=f"the worker of card {card_id}")
    wait_for(done, timeout=30, interval=0.01, what=f"card {card_id} done")
    assert value is not None
    return value


def _latency(
    manager: SystemdManager,
    count: int,
    during: Callable[[Serve], AbstractContextManager[object]] | None = None,
    *,
    forked: bool = True,
) -> dict[str, list[float]]:
    """Add ``count`` cards one at a time; per card: commit -> first instruction (s) and the
    parts of that time from the run's records. ``during(serve)`` is held open while the cards
    are added (bench_web: a dashboard with live clients on the same state). ``forked``: serve
    starts keepers from its fork server (its default), else fresh."""
    marks = Path(tempfile.mkdtemp(prefix="bench-gateway-marks-"))
    script = 'printf "%s\\n" "$EPOCHREALTIME" > "$0/$DISPATCH_CARD_ID"'
    config = (
        "kanban:\n  assignees:\n    w:\n"
        f"      command: [bash, -c, {json.dumps(script)}, {json.dumps(str(marks))}]\n"
    )
    if not forked:
        config += "registry:\n  fork_server: false\n"
    committed: dict[str, float] = {}
    started: dict[str, float] = {}
    try:
        with (
            _serve(manager, "bench-gateway-latency-", config) as serve,
            during(serve) if during is not None else nullcontext(),
        ):
            for index in range(count):
                workspace = serve.workspace()
                try:
                    card, _ = workspace.board.add(
                        f"card {index}", assignee="w", now=workspace.now()
                    )
                    committed[card.id] = time.time()
                finally:
                    workspace.close()  # pokes serve, as the CLI does
                started[card.id] = _wait_started(serve, marks / card.id, card.id)
            placements = serve.query(
                "SELECT placement, count(*) n FROM kanban_runs WHERE card_id IN"
                " (SELECT id FROM kanban_cards WHERE assignee = 'w') GROUP BY 1"
            )
            parts = serve.query(
                "SELECT r.card_id, r.claimed_at, s.created_at, s.started_at FROM kanban_runs r"
                " JOIN registry_sessions s ON s.id = r.session_id"
            )
    finally:
        shutil.rmtree(marks, ignore_errors=True)
    placed = {row["placement"]: row["n"] for row in placements}
    if placed != {"scoped": count}:
        raise RuntimeError(f"expected {count} scoped runs, got placements {placed}")
    out: dict[str, list[float]] = {
        "latency": [started[c] - committed[c] for c in committed],
        "wake": [],
        "prepare": [],
        "spawn": [],
        "exec": [],
    }
    for row in parts:
        card_id = row["card_id"]
        if row["started_at"] is None:
            continue
        out["wake"].append(row["claimed_at"] - committed[card_id])
        out["prepare"].append(row["created_at"] - row["claimed_at"])
        out["spawn"].append(row["started_at"] - row["created_at"])
        out["exec"].append(started[card_id] - row["started_at"])
    return out


def _latency_rows(manager: SystemdManager, count: int) -> list[Row]:
    spawn = _spawn_cost(manager, 10 if count < 100 else 50)
    load_before = _load()
    half = count // 2
    fresh: dict[str, list[float]] = {}
    forked: dict[str, list[float]] = {}
    for found, fork in ((fresh, False), (forked, True), (forked, True), (fresh, False)):
        for key, values in _latency(manager, half, forked=fork).items():
            found.setdefault(key, []).extend(values)
    spawn += _spawn_cost(manager, 10 if count < 100 else 50)
    spawn_ms = median(spawn) * 1000
    note = (
        f"n={2 * half} in 2 rounds (interleaved), one card at a time; "
        f"{load_before} before, {_load()} after"
    )
    rows = [
        *_path_rows(forked, spawn_ms, note, "", (FORKED_P50_MS, FORKED_P99_MS)),
        *_path_rows(fresh, spawn_ms, note, ", fresh keepers", (TARGET_P50_MS, TARGET_P99_MS)),
        Row(
            figure="systemd-run --user --scope true (bare spawn)",
            value=spawn_ms,
            unit="ms",
            note=f"n={len(spawn)} (half before, half after), p90="
            f"{percentile(spawn, 90) * 1000:.1f} ms",
        ),
    ]
    labels = {
        "wake": "commit -> claim (gateway wake-up)",
        "prepare": "claim -> spawn request",
        "spawn": "spawn request -> worker forked (scope + keeper)",
        "exec": "worker forked -> first instruction",
    }
    for found, how in ((forked, ""), (fresh, ", fresh keepers")):
        for key, label in labels.items():
            values = found[key]
            if values:
                rows.append(
                    Row(
                        figure=f"serve latency part{how}: {label} p50",
                        value=median(values) * 1000,
                        unit="ms",
                        note=f"p99={percentile(values, 99) * 1000:.1f} ms",
                    )
                )
    return rows


def _path_rows(
    found: dict[str, list[float]],
    spawn_ms: float,
    note: str,
    how: str,
    targets: tuple[float, float],
) -> list[Row]:
    late = found["latency"]

    def pct_row(pct: float, target: float) -> Row:
        value = percentile(late, pct) * 1000
        # The loop this replaces: a card waits for the next 60 s poll (uniform, whatever the
        # arrival pattern), then the same bare scope spawn.
        base = pct / 100 * POLL_PERIOD * 1000 + spawn_ms
        return Row(
            figure=f"serve: ready -> worker running p{pct:g}{how}",
            value=value,
            unit="ms",
            baseline=base,
            ratio=ratio(value, base),
            target=f"p{pct:g} <= {target:g} ms",
            met=value <= target,
            note=f"{note}; baseline: 60 s poll (uniform wait) + a bare scope spawn; "
            f"{value / spawn_ms:.1f}x a bare scope spawn",
        )

    return [pct_row(50, targets[0]), pct_row(99, targets[1])]


# -- (b) restart adoption -------------------------------------------------------------------------


def _nofile(count: int) -> int | None:
    """``LimitNOFILE`` for a serve following ``count`` workers, None when the default will do.

    serve holds two pidfds per followed worker (keeper and worker) and systemd's default soft
    limit is 1024, so past about 500 workers a spawn fails with EMFILE. The benchmark measures
    adoption, not that limit: it raises the limit like an operator's unit would have to.
    """
    needed = 2 * count + 64
    return None if needed <= 1024 else max(4096, needed)


def _adoption(manager: SystemdManager, count: int, restarts: int) -> dict[str, list[float]]:
    """Restart serve ``restarts`` times without workers, then with ``count`` live ones."""
    config = (
        f"kanban:\n  max_in_progress: {count + 8}\n  assignees:\n    s:\n"
        '      command: [sleep, "900"]\n'
    )
    out: dict[str, list[float]] = {}
    nofile = _nofile(count)
    with _serve(manager, "bench-gateway-adopt-", config, timed=TIMED, nofile=nofile) as serve:
        empty = [serve.restart() for _ in range(restarts)]
        workspace = serve.workspace()
        try:
            for index in range(count):
                workspace.board.add(f"sleeper {index}", assignee="s", now=workspace.now())
        finally:
            workspace.close()

        def running() -> int:
            rows = serve.query(
                "SELECT count(*) FROM kanban_runs WHERE outcome IS NULL AND session_id IS NOT NULL"
            )
            return int(rows[0][0])

        filled = time.perf_counter()
        wait_for(
            lambda: running() >= count,
            timeout=60 + count * 0.5,
            interval=0.25,
            what=f"{count} sleepers running",
        )
        filled = time.perf_counter() - filled
        placed = {
            row["placement"]: row["n"]
            for row in serve.query("SELECT placement, count(*) n FROM kanban_runs GROUP BY 1")
        }
        if placed != {"scoped": count}:
            odd = serve.query(
                "SELECT card_id, attempt, outcome, error, infrastructure FROM kanban_runs"
                " WHERE placement IS NOT 'scoped'"
            )
            detail = [dict(row) for row in odd]
            raise RuntimeError(f"expected {count} scoped runs, got {placed}: {detail}")
        full = [serve.restart() for _ in range(restarts)]
        for sample in full:
            if sample["adopted"] != count:
                raise RuntimeError(f"a restart adopted {sample['adopted']:.0f} of {count}")
        closed = serve.query("SELECT count(*) FROM kanban_runs WHERE outcome IS NOT NULL")
        if closed[0][0] or running() != count:
            raise RuntimeError(f"{closed[0][0]} runs closed during the restarts; {serve.tail()}")
    for key in ("wall", "stop", "exec_ready", "ready_in", ADOPT, SHUTDOWN):
        out[f"empty_{key}"] = [s[key] for s in empty]
        out[key] = [s[key] for s in full]
    out["fill"] = [filled]
    return out


def _adoption_rows(manager: SystemdManager, count: int, restarts: int) -> list[Row]:
    load_before = _load()
    found = _adoption(manager, count, restarts)
    note = f"n={restarts} restarts, {count} scoped workers; {load_before} before, {_load()} after"
    nofile = _nofile(count)
    if nofile is not None:
        note += f"; serve's LimitNOFILE={nofile} (2 pidfds per worker)"

    def spread(values: list[float]) -> str:
        return "runs " + ", ".join(f"{v:.3f}" for v in values) + " s"

    def row(
        figure: str, key: str, target: float | None = None, extra: str = "", worst: bool = False
    ) -> Row:
        pick = max if worst else median
        value = pick(found[key])
        base = pick(found[f"empty_{key}"])
        compared = "" if key == ADOPT else "baseline: same restart with no workers; "
        return Row(
            figure=figure,
            value=value,
            unit="s",
            baseline=None if key == ADOPT else base,
            ratio=None if key == ADOPT else ratio(value, base),
            target=None if target is None else f"<= {target:g} s",
            met=None if target is None else value <= target,
            note=f"{note}; {compared}{spread(found[key])}{extra}",
        )

    full = count >= 500
    shutdown = f"; of which {SHUTDOWN}() {spread(found[SHUTDOWN])}"
    return [
        row(f"serve restart: exec -> READY=1, {count} live workers", "exec_ready"),
        row(f"serve restart: start -> ready (serve's log), {count} workers", "ready_in"),
        row(
            f"serve restart: registry adopt() of {count} workers",
            ADOPT,
            TARGET_ADOPT_S if full else None,
        ),
        row(
            f"serve restart: SIGTERM -> old serve gone, {count} workers (worst)",
            "stop",
            TARGET_STOP_S,
            shutdown,
            worst=True,
        ),
        row(f"serve restart: systemctl restart wall time, {count} workers", "wall"),
        Row(
            figure=f"serve: dispatch {count} sleepers until all running",
            value=found["fill"][0],
            unit="s",
            note=f"{count / found['fill'][0]:.1f} workers/s, one poke, spawn_concurrency 4",
        ),
    ]


def run(quick: bool) -> list[Row]:
    """Both parts on one manager (see the module docstring)."""
    cards, workers, restarts = (40, 50, 2) if quick else (500, 500, 3)
    try:
        manager = acquire_manager(dict(os.environ))
    except ManagerUnavailable as exc:
        note = f"no systemd user manager: {exc.reason.splitlines()[0]}"
        return [
            Row(figure="serve: ready -> worker running p50", value=None, unit="ms", note=note),
            Row(figure="serve restart: exec -> READY=1", value=None, unit="s", note=note),
        ]
    try:
        return [*_latency_rows(manager, cards), *_adoption_rows(manager, workers, restarts)]
    finally:
        manager.close()
