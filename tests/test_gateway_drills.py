"""Gateway drills on a real systemd user manager: `dispatch serve` as a Type=notify service.

- Restart drill: restarts while workers run lose nothing (every card done once, byte-exact
  output, no fire key twice, no worker killed by a restart).
- Manager-loss drill: cron degrades with one warning, kanban refuses without counting, and both
  recover once the manager is reachable again.
- Crash drill: SIGKILL mid-dispatch, restart, nothing stuck or doubled.

The restart and crash drills run over both keeper start paths: serve's fork server (the
default) and a fresh interpreter per keeper (``registry.fork_server: false``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.app.runtime import open_runtime
from dispatcher.app.workspace import Workspace
from dispatcher.config import load_config
from registry.abc import Registry
from tests.support.cli import dispatch_argv, run_dispatch
from tests.support.keepers import START_PATHS
from tests.support.systemd import SystemdManager

pytestmark = [pytest.mark.systemd, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent

# 20 numbered lines over ~4 s; halfway it waits for the test's go-ahead, so all three restarts
# provably happen while every worker is alive (on a loaded machine 4 s can pass quickly).
LINES_WORKER = (
    'i=1; while [ $i -le 20 ]; do echo "$DISPATCH_CARD_ID line $i"; '
    'if [ $i -eq 10 ]; then while [ ! -e "$RELEASE" ]; do sleep 0.05; done; fi; '
    "i=$((i+1)); sleep 0.2; done"
)


def expected_output(card_id: str) -> bytes:
    return b"".join(f"{card_id} line {i}\n".encode() for i in range(1, 21))


class Gate:
    """One `dispatch serve` service on the test manager plus helpers to drive its state dir."""

    def __init__(
        self, manager: SystemdManager, home: Path, config: str, path: str = "fork_server"
    ) -> None:
        self.manager = manager
        self.home = home
        self.state = home / "state"
        self.config = home / "config.yaml"
        self.path = path
        if path == "direct":
            config += "registry:\n  fork_server: false\n"
        self.config.write_text(config)
        self.log = home / "serve.log"
        self.unit: str | None = None

    def env(self) -> dict[str, str]:
        env = dict(self.manager.env)
        env.update(HOME=str(self.home), PYTHONPATH=str(ROOT))
        return env

    def dispatch(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_dispatch(self.config, self.state, self.env(), *args, check=check)

    def start(self) -> str:
        self.unit = self.manager.run_transient_service(
            dispatch_argv(self.config, self.state, "serve"),
            env={"HOME": str(self.home), "PYTHONPATH": str(ROOT)},
            type="notify",
            name=self.unit,
            properties={
                "StandardOutput": f"append:{self.log}",
                "StandardError": f"append:{self.log}",
                "TimeoutStopSec": "10s",
            },
            cwd=self.home,
            timeout=60,
        )
        return self.unit

    def main_pid(self) -> int:
        assert self.unit is not None
        return int(self.manager.unit_property(self.unit, "MainPID") or 0)

    def active(self) -> bool:
        assert self.unit is not None
        return self.manager.unit_property(self.unit, "ActiveState") == "active"

    def db(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.state / "state.db", timeout=30)
        conn.row_factory = sqlite3.Row
        return conn

    def add_cards(self, count: int, assignee: str = "w") -> list[str]:
        """Add cards in one process (the CLI per card would be slower than the workers)."""
        board = Workspace(
            load_config(self.config).settings,
            self.state,
            environ=self.env(),
            config_path=self.config,
        )
        try:
            return [
                board.board.add(f"card {i}", assignee=assignee, now=board.now())[0].id
                for i in range(count)
            ]
        finally:
            board.close()  # pokes the gateway

    @contextlib.contextmanager
    def registry(self) -> Iterator[Registry]:
        """The state dir's registry, read-only use (no follower, no fork server)."""
        settings = load_config(self.config).settings
        with open_runtime(settings, self.state, self.env()) as runtime:
            yield runtime.registry

    def cards(self) -> list[dict]:
        return json.loads(self.dispatch("kanban", "list", "--all", "--json").stdout)

    def forked_keepers(self) -> int:
        """Running keepers whose parent is a fork server (their session's keeper pid)."""
        with self.db() as conn:
            pids = [r[0] for r in conn.execute("SELECT keeper_pid FROM registry_sessions")]
        count = 0
        for pid in pids:
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{pid}/stat").read_text()
                parent = stat.rsplit(")", 1)[1].split()[1]
                if b"server.py" in Path(f"/proc/{parent}/cmdline").read_bytes():
                    count += 1
        return count

    def stop(self) -> None:
        if self.unit and self.manager.unit_property(self.unit, "LoadState") == "loaded":
            self.manager.systemctl("stop", self.unit, check=False, timeout=30)


@pytest.fixture
def gate_factory(tmp_path: Path, systemd_manager: SystemdManager) -> Iterator:
    made: list[Gate] = []

    def make(config: str, path: str = "fork_server") -> Gate:
        gate = Gate(systemd_manager, tmp_path, config, path)
        made.append(gate)
        return gate

    yield make
    for gate in made:
        gate.stop()
        # Workers left behind by a failed assertion must not outlive the test.
        if (gate.state / "state.db").exists():
            gate.dispatch("kanban", "pause", check=False)
            for session in json.loads(gate.dispatch("ps", "--json", check=False).stdout or "[]"):
                gate.dispatch("kill", session["id"], "--grace", "0.5", check=False)


def assert_fire_keys_unique(gate: Gate) -> int:
    with gate.db() as conn:
        doubled = conn.execute(
            "SELECT fire_key, count(*) FROM cron_fires GROUP BY fire_key HAVING count(*) > 1"
        ).fetchall()
        ran = conn.execute(
            "SELECT count(*) FROM cron_fires WHERE session_id IS NOT NULL"
        ).fetchone()[0]
        sessions = conn.execute(
            "SELECT session_id, count(*) FROM cron_fires WHERE session_id IS NOT NULL"
            " GROUP BY session_id HAVING count(*) > 1"
        ).fetchall()
    assert not doubled, f"fire keys decided twice: {[tuple(r) for r in doubled]}"
    assert not sessions
    return int(ran)


@pytest.mark.parametrize("path", START_PATHS)
def test_restart_drill(
    gate_factory, systemd_manager: SystemdManager, tmp_path: Path, path: str
) -> None:
    release = tmp_path / "release"
    gate = gate_factory(
        "serve:\n  safety_tick: 1s\n"
        "cron:\n  jobs:\n    - id: tick\n      every: 1s\n      command: [sh, -c, 'echo tick']\n"
        "kanban:\n  max_in_progress: 50\n  assignees:\n    w:\n"
        f"      command: [sh, -c, {json.dumps(LINES_WORKER)}]\n"
        f"      env: {{RELEASE: {json.dumps(str(release))}}}\n",
        path,
    )
    gate.start()
    card_ids = gate.add_cards(50)

    def running_count() -> int:
        return sum(1 for c in gate.cards() if c["status"] == "running")

    def spawned_count() -> int:
        # A card is "running" from its claim; its worker is in its own scope only once the run
        # has a session. A restart before that would stop the still-unplaced keeper with the
        # service, which is not what this drill is about.
        conn = gate.db()
        try:
            return int(
                conn.execute(
                    "SELECT count(*) FROM kanban_runs"
                    " WHERE outcome IS NULL AND session_id IS NOT NULL"
                ).fetchone()[0]
            )
        finally:
            conn.close()

    systemd_manager.wait_for(
        lambda: running_count() == 50 and spawned_count() == 50,
        timeout=60,
        interval=0.2,
        what="all 50 workers running",
    )
    # The keepers came from serve's fork server (one that answered too slowly on a loaded
    # machine falls back to a fresh keeper, which the drill must survive just the same), or
    # none did.
    forked = gate.forked_keepers()
    assert forked > 0 if path == "fork_server" else forked == 0
    pids_seen = set()
    for _ in range(3):
        # Each restart happens while all workers are alive: none of them may notice.
        assert running_count() == 50
        pids_seen.add(gate.main_pid())
        systemd_manager.restart_service(gate.unit, timeout=30)
        systemd_manager.wait_for(gate.active, timeout=20, what="serve active again")
        pids_seen.add(gate.main_pid())
    assert len(pids_seen) == 4, "each restart must start a new serve process"
    release.touch()

    def all_done() -> bool:
        return all(c["status"] == "done" for c in gate.cards())

    systemd_manager.wait_for(all_done, timeout=60, interval=0.25, what="50 cards done")
    with gate.db() as conn, gate.registry() as registry:
        for index, card_id in enumerate(card_ids):
            runs = conn.execute(
                "SELECT outcome, exit_code, signal, session_id, placement FROM kanban_runs"
                " WHERE card_id = ?",
                (card_id,),
            ).fetchall()
            assert len(runs) == 1, f"{card_id}: {[tuple(r) for r in runs]}"
            run = runs[0]
            assert (run["outcome"], run["exit_code"], run["signal"]) == ("completed", 0, None)
            assert run["placement"] == "scoped"
            # Byte-exact: once as 'dispatch logs' prints it, then through the registry (the
            # same read, without 49 more CLI start-ups).
            if index == 0:
                log = gate.dispatch("logs", run["session_id"]).stdout.encode()
            else:
                log = registry.read_log(run["session_id"])
            assert log == expected_output(card_id), card_id
    assert assert_fire_keys_unique(gate) >= 3
    text = gate.log.read_text()
    assert text.count("dispatch serve ready") == 4
    assert "Traceback" not in text


def test_manager_loss_drill(gate_factory, systemd_manager: SystemdManager) -> None:
    gate = gate_factory(
        "scope:\n  probe_ttl: 2s\n"
        "serve:\n  safety_tick: 1s\n"
        "cron:\n  jobs:\n    - id: tick\n      every: 1s\n      command: [sh, -c, 'echo tick']\n"
        "kanban:\n  infrastructure_cooldown: 5m\n  assignees:\n    w:\n"
        "      command: [sh, -c, 'echo ran']\n"
    )
    gate.start()
    systemd_manager.wait_for(
        lambda: assert_fire_keys_unique(gate) >= 1,
        timeout=15,
        what="a scoped cron fire before the loss",
    )
    with systemd_manager.manager_unreachable():
        card = gate.dispatch("kanban", "add", "during loss", "--assignee", "w").stdout.strip()

        def refused_runs() -> list[sqlite3.Row]:
            with gate.db() as conn:
                return conn.execute(
                    "SELECT outcome, infrastructure FROM kanban_runs WHERE card_id = ?", (card,)
                ).fetchall()

        systemd_manager.wait_for(
            lambda: len(refused_runs()) >= 1, timeout=20, what="a refused kanban run"
        )

        def degraded_fires() -> int:
            with gate.db() as conn:
                return int(
                    conn.execute(
                        "SELECT count(*) FROM cron_fires WHERE placement = 'degraded'"
                    ).fetchone()[0]
                )

        systemd_manager.wait_for(
            lambda: degraded_fires() >= 2, timeout=20, what="cron fires degraded during the loss"
        )
        (shown,) = [c for c in gate.cards() if c["id"] == card]
        assert shown["status"] == "ready"
        assert shown["consecutive_failures"] == 0
        assert {tuple(r) for r in refused_runs()} == {("spawn_refused", 1)}
    # Back: within the probe TTL placement is scoped again, and a good probe ends the cooldown.

    def card_done() -> bool:
        return any(c["id"] == card and c["status"] == "done" for c in gate.cards())

    systemd_manager.wait_for(card_done, timeout=30, interval=0.25, what="the card to run")
    with gate.db() as conn:
        last = conn.execute(
            "SELECT outcome, placement FROM kanban_runs WHERE card_id = ? ORDER BY claimed_at"
            " DESC LIMIT 1",
            (card,),
        ).fetchone()
        assert tuple(last) == ("completed", "scoped")
        latest_fire = conn.execute(
            "SELECT placement FROM cron_fires WHERE session_id IS NOT NULL ORDER BY id DESC LIMIT 1"
        ).fetchone()
    systemd_manager.wait_for(
        lambda: (
            gate.db()
            .execute(
                "SELECT placement FROM cron_fires WHERE session_id IS NOT NULL ORDER BY id DESC"
                " LIMIT 1"
            )
            .fetchone()[0]
            == "scoped"
        ),
        timeout=15,
        what="cron scoped again",
    )
    assert latest_fire is not None
    warnings = [
        line
        for line in gate.log.read_text().splitlines()
        if "cron" in line and "degraded" in line and "WARNING" in line
    ]
    assert len(warnings) == 1, warnings
    assert_fire_keys_unique(gate)


@pytest.mark.parametrize("path", START_PATHS)
def test_crash_drill(gate_factory, systemd_manager: SystemdManager, path: str) -> None:
    gate = gate_factory(
        "serve:\n  safety_tick: 1s\n"
        "cron:\n  jobs:\n    - id: tick\n      every: 1s\n      command: [sh, -c, 'echo tick']\n"
        "kanban:\n  max_in_progress: 8\n  assignees:\n    w:\n"
        "      command: [sh, -c, 'sleep 1; echo done']\n",
        path,
    )
    gate.start()
    card_ids = gate.add_cards(30)
    systemd_manager.wait_for(
        lambda: any(c["status"] == "running" for c in gate.cards()),
        timeout=20,
        what="dispatch under way",
    )
    assert gate.unit is not None
    systemd_manager.systemctl("kill", "--signal=SIGKILL", "--kill-whom=main", gate.unit)
    systemd_manager.wait_for(lambda: not gate.active(), timeout=20, what="serve dead")
    systemd_manager.systemctl("reset-failed", gate.unit, check=False)
    gate.start()

    def settled() -> bool:
        return all(c["status"] == "done" for c in gate.cards())

    systemd_manager.wait_for(settled, timeout=90, interval=0.25, what="30 cards done")
    with gate.db() as conn:
        for card_id in card_ids:
            runs = conn.execute(
                "SELECT outcome, started_at, ended_at FROM kanban_runs WHERE card_id = ?"
                " ORDER BY claimed_at",
                (card_id,),
            ).fetchall()
            completed = [r for r in runs if r["outcome"] == "completed"]
            assert len(completed) == 1, (card_id, [tuple(r) for r in runs])
            spans = [(r["started_at"], r["ended_at"]) for r in runs if r["started_at"]]
            for (_, e1), (s2, _) in itertools.pairwise(spans):
                assert e1 is not None and e1 <= s2, f"{card_id} had two live workers"
    assert_fire_keys_unique(gate)
