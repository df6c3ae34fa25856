"""Cron retries with real parts: real workers under the real process registry (keepers, exit
records), a real SQLite ledger, the real ``dispatch`` CLI, and a worker that runs ``dispatch
kanban defer`` itself.

Decisions are driven with a fake clock (when the next fire comes, when a retry is due); the
workers and their ends are real, and every wait is a bounded poll.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.app.reports import spawn_environ
from dispatcher.cli.main import main
from dispatcher.config import load_config
from dispatcher.cron.records import FireRecord, RetryKind, Status
from dispatcher.launch.outcome import Outcome
from scope.foundation.clock import FakeClock
from tests.support.env import no_bus_env
from tests.support.wait import wait_for
from tests.test_cron_process import T0, Rig

# First try fails (exit 1) and leaves a mark; every later try succeeds.
FLAKY = 'if [ -e "$1" ]; then exit 0; fi; : > "$1"; exit 1'
DEFER = (
    f"{sys.executable} -m dispatcher.cli.main kanban defer --for 1h --reason 'rate limited'"
    ' 2>"$1"; echo $? >"$1.rc"'
)


class Cron:
    """A config file, a real-registry scheduler on it (fake clock) and the CLI on its state."""

    def __init__(self, tmp_path: Path, jobs: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys
        self.config = tmp_path / "config.yaml"
        self.config.write_text(f"cron:\n  jobs:\n{jobs}")
        settings = load_config(self.config).settings
        self.clock = FakeClock(T0)
        # As the gateway starts cron workers: with what their own reports need to find us.
        environ = spawn_environ(settings, no_bus_env(tmp_path))
        self.rig = Rig(tmp_path, *settings.cron.jobs, environ=environ, clock=self.clock)
        self.rig.scheduler.reload(settings.cron)
        self.rig.scheduler.tick()

    def at(self, text: str) -> None:
        self.rig.at(text)
        self.rig.scheduler.tick()

    def row(self, key: str) -> FireRecord:
        found = self.rig.ledger.by_key(key)
        assert found is not None, key
        return found

    def until(self, key: str, status: Status, timeout: float = 30.0) -> FireRecord:
        """Tick (settling real workers as they end) until the fire reaches ``status``."""

        def reached() -> FireRecord | None:
            self.rig.scheduler.tick()
            row = self.row(key)
            return row if row.status is status else None

        found = wait_for(reached, timeout, interval=0.05, what=f"{key} {status.value}")
        assert found is not None
        return found

    def cli(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(
            ["--config", str(self.config), "--state-dir", str(self.rig.state_dir), *argv],
            environ=self.rig.environ,
        )
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def crons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Any]:
    made: list[Cron] = []

    def make(jobs: str) -> Cron:
        made.append(Cron(tmp_path, jobs, capsys))
        return made[-1]

    yield make
    for cron in made:
        cron.rig.close()


def test_a_job_failing_every_attempt_ends_paused_until_resumed(leak_guard: Any, crons: Any) -> None:
    cron = crons(
        "    - id: flaky\n"
        "      schedule: '*/5 * * * *'\n"
        "      command: [sh, -c, 'echo try $DISPATCH_FIRE_ATTEMPT of $DISPATCH_FIRE_ATTEMPTS;"
        " exit 3']\n"
        "      on_exhausted: pause\n"
        "      retry: {attempts: 3, backoff: {initial: 10s, jitter: none}}\n"
    )
    key = "flaky@2026-01-05T10:00:00"
    cron.at("2026-01-05T10:00:00")
    first = cron.until(key, Status.RETRY)
    assert (first.attempt, first.retry_reason) == (2, "backoff, attempt 2 of 3")
    cron.at("2026-01-05T10:00:15")
    second = cron.until(key, Status.RETRY)
    assert second.attempt == 3 and second.retry_at == pytest.approx(T0 + 45 + 20, abs=1)
    cron.at("2026-01-05T10:00:40")
    done = cron.until(key, Status.DONE)
    assert (done.outcome, done.exit_code, done.attempt) == (Outcome.FAILED, 3, 3)
    sessions = [t.session_id for t in done.tries]
    assert len(set(sessions)) == 3 and all(sessions)
    log = cron.rig.runtime.registry.read_log(sessions[1]).decode()
    assert "try 2 of 3" in log

    state = cron.rig.ledger.job_states()["flaky"]
    assert state.paused and "failed every attempt (3 of 3 attempts used)" in (
        state.paused_reason or ""
    )
    code, out, _ = cron.cli("status")
    assert code == 0
    [line] = [x for x in out.splitlines() if x.startswith("cron paused:")]
    assert "flaky since" in line and "by dispatch: fire flaky@2026-01-05T10:00:00 failed" in line
    assert line.endswith("dispatch cron resume flaky")
    (paused,) = json.loads(cron.cli("status", "--json")[1])["cron_paused"]
    assert (paused["job_id"], paused["by"], paused["reason"]) == (
        "flaky",
        "dispatch",
        state.paused_reason,
    )
    code, out, _ = cron.cli("cron", "history", "flaky")
    assert "attempt 1 of 3: failed (exit 3)" in out and "attempt 3 of 3: failed (exit 3)" in out
    assert "no further try: 3 of 3 attempts used" in out
    code, out, _ = cron.cli("cron", "history", "flaky", "--json")
    (entry,) = json.loads(out)
    assert (entry["attempt"], entry["attempts"], entry["retry"]) == (3, 3, None)
    assert [t["outcome"] for t in entry["tries"]] == ["failed"] * 3
    assert "paused (exhausted)" in cron.cli("cron", "list")[1]

    cron.at("2026-01-05T10:05:00")  # paused: the next fire is neither run nor recorded
    assert cron.rig.ledger.by_key("flaky@2026-01-05T10:05:00") is None
    assert cron.cli("cron", "resume", "flaky")[1].strip() == "flaky: resumed"
    resumed = cron.rig.ledger.job_states()["flaky"]
    assert (resumed.paused, resumed.paused_reason) == (False, None)
    assert not any(x.startswith("cron paused:") for x in cron.cli("status")[1].splitlines())


def test_a_fire_failing_twice_completes_on_its_third_attempt_and_exit_2_fails_at_once(
    leak_guard: Any, crons: Any, tmp_path: Path
) -> None:
    count = tmp_path / "count"
    # Counts its tries in a file: exits 1 twice, then 0.
    twice = 'n=$(cat "$1" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$1"; test $n -ge 3'
    sample = (
        "{attempts: 4, backoff: {initial: 10s, factor: 2, jitter: none},"
        " rules: [{exit_codes: ['2', '64-77'], action: fail}]}"
    )
    cron = crons(
        "    - id: flaky\n"
        "      schedule: '*/5 * * * *'\n"
        f"      command: {json.dumps(['sh', '-c', twice, 'sh', str(count)])}\n"
        f"      retry: {sample}\n"
        "    - id: usage\n"
        "      schedule: '*/5 * * * *'\n"
        "      command: [sh, -c, 'exit 2']\n"
        f"      retry: {sample}\n"
    )
    key = "flaky@2026-01-05T10:00:00"
    cron.at("2026-01-05T10:00:00")
    first = cron.until(key, Status.RETRY)
    usage = cron.until("usage@2026-01-05T10:00:00", Status.DONE)
    assert (usage.outcome, usage.exit_code, len(usage.tries)) == (Outcome.FAILED, 2, 1)
    assert usage.retry_reason == "rule exit 2,64-77: no retry"
    cron.at("2026-01-05T10:00:40")
    second = cron.until(key, Status.RETRY)
    # The two back-offs, from each try's end on the scheduler's clock: 10 s, then 20 s.
    backoffs = [first.retry_at - T0 - 30, second.retry_at - T0 - 70]  # type: ignore[operator]
    assert backoffs == [10, 20]
    cron.at("2026-01-05T10:01:30")
    done = cron.until(key, Status.DONE)
    assert (done.outcome, done.attempt) == (Outcome.COMPLETED, 3)
    assert [t.outcome for t in done.tries] == [Outcome.FAILED, Outcome.FAILED, Outcome.COMPLETED]
    assert count.read_text().strip() == "3"


@pytest.mark.parametrize(
    ("overlap", "next_fire", "old_fire"),
    [
        ("skip", "skipped_overlap", "completed"),
        ("replace", "completed", "replaced"),
        ("allow", "completed", "completed"),
        ("queue_one", "completed", "completed"),
    ],
)
def test_each_overlap_policy_with_a_retry_pending_at_the_next_fire(
    leak_guard: Any, crons: Any, tmp_path: Path, overlap: str, next_fire: str, old_fire: str
) -> None:
    mark = tmp_path / "failed-once"
    cron = crons(
        "    - id: job\n"
        "      schedule: '*/5 * * * *'\n"
        f"      command: [sh, -c, '{FLAKY}', sh, '{mark}']\n"
        f"      overlap: {overlap}\n"
        "      retry: {attempts: 2, backoff: {initial: 6m, jitter: none}}\n"
    )
    old, new = "job@2026-01-05T10:00:00", "job@2026-01-05T10:05:00"
    cron.at("2026-01-05T10:00:00")
    pending = cron.until(old, Status.RETRY)
    assert pending.retry_at == pytest.approx(T0 + 30 + 360, abs=1)  # after the next fire
    cron.at("2026-01-05T10:05:00")  # the retry is still pending
    if overlap == "replace":
        abandoned = cron.row(old)
        assert abandoned.error == f"retry abandoned: replaced by {new}"
    if overlap == "skip":
        assert cron.row(new).error == f"the job was waiting for its next try ({old})"
    cron.at("2026-01-05T10:06:30")  # the retry's time (it starts unless it was abandoned)

    def settled() -> bool:
        cron.rig.scheduler.tick()
        return cron.row(old).status is Status.DONE and cron.row(new).status is Status.DONE

    wait_for(settled, 30, interval=0.05, what="both fires settled")
    assert (cron.row(old).shown_outcome, cron.row(new).shown_outcome) == (old_fire, next_fire)
    tries = [t.outcome.value for t in cron.row(old).tries]
    assert tries == (["failed"] if overlap == "replace" else ["failed", "completed"])


def test_a_cron_worker_defers_its_fires_next_try(
    leak_guard: Any, crons: Any, tmp_path: Path
) -> None:
    out, plain = tmp_path / "deferred.err", tmp_path / "plain.err"
    cron = crons(
        "    - id: later\n"
        "      schedule: '*/5 * * * *'\n"
        f"      command: {json.dumps(['sh', '-c', DEFER, 'sh', str(out)])}\n"
        "      retry: {attempts: 2}\n"
        "    - id: once\n"
        "      schedule: '*/5 * * * *'\n"
        f"      command: {json.dumps(['sh', '-c', DEFER, 'sh', str(plain)])}\n"
    )
    cron.at("2026-01-05T10:00:00")
    row = cron.until("later@2026-01-05T10:00:00", Status.RETRY, timeout=60)
    assert (row.retry_kind, row.retry_reason, row.attempt) == (
        RetryKind.DEFERRED,
        "rate limited",
        1,
    )
    (tried,) = row.tries
    assert (tried.outcome, tried.counted, tried.exit_code) == (Outcome.DEFERRED, False, 0)
    assert (tmp_path / "deferred.err.rc").read_text().strip() == "0"
    # --for is measured from the worker's clock (the real one): an hour from when it ran.
    assert tried.ended_at is not None and row.retry_at is not None
    assert 3500 < row.retry_at - tried.ended_at < 3700
    once = cron.until("once@2026-01-05T10:00:00", Status.DONE, timeout=60)
    assert once.outcome is Outcome.COMPLETED and once.tries[0].outcome is Outcome.COMPLETED
    assert (tmp_path / "plain.err.rc").read_text().strip() == "2"
    error = plain.read_text().strip()
    assert error == (
        "dispatch: error: cron fire once@2026-01-05T10:00:00: it has no retry policy (one try):"
        " nothing was changed; give job once a retry policy (its retry:, or cron.retry) to let"
        " its worker defer"
    )
    code, text, _ = cron.cli("cron", "history", "later")
    assert code == 0
    assert "deferred until " in text and "by the worker: rate limited" in text
    # The deferred try starts at its time, as the same attempt.
    cron.rig.clock.set(row.retry_at + 1)
    cron.rig.scheduler.tick()
    again = cron.row(row.fire_key)
    assert again.status in (Status.SPAWNING, Status.RUNNING, Status.RETRY, Status.DONE)
    assert again.try_number == 2 and again.attempt == 1
