"""The benchmark runner works: quick cli_startup run, JSON output, error rows, statistics."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.benchmarks import runner
from tests.benchmarks.common import REPO_ROOT, Row, measure, median, percentile, ratio


def run_benchmarks(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m tests.benchmarks ARGS`` from the repo root, as docs/benchmarks.md says."""
    return subprocess.run(
        [sys.executable, "-m", "tests.benchmarks", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=40,
        check=False,
    )


@pytest.mark.timeout(45)  # builds and installs the wheel, and starts its dispatch serve
def test_quick_cli_startup_prints_table() -> None:
    done = run_benchmarks("--quick", "--only", "cli_startup")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("machine: load ") and " cores, " in lines[0]
    assert any(line.split()[:2] == ["benchmark", "figure"] for line in lines), done.stdout
    for figure in (
        "python -c pass",
        "python -I -S -c pass",
        "dispatch --version",
        "dispatch kanban add (wheel install, serve answering)",
    ):
        assert any(line.startswith("cli_startup") and figure in line for line in lines), figure


def test_json_output(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def one(quick: bool) -> list[Row]:
        assert quick
        return [Row(figure="f", value=1.5, unit="ms", baseline=3.0, ratio=0.5, target="<= 0.6x")]

    fake = runner.Benchmark(name="j", description="", module=SimpleNamespace(run=one))  # type: ignore[arg-type]
    monkeypatch.setattr(runner, "discover", lambda: [fake])
    assert runner.main(["--quick", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["errors"] == 0 and document["mode"] == "quick"
    assert set(document["machine"]) == {"load", "cores", "python", "platform", "favordynmods"}
    (row,) = document["rows"]
    assert row == {
        "benchmark": "j",
        "figure": "f",
        "value": 1.5,
        "unit": "ms",
        "baseline": 3.0,
        "ratio": 0.5,
        "target": "<= 0.6x",
        "met": None,
        "note": "",
    }


def test_unknown_benchmark_is_a_usage_error() -> None:
    assert runner.main(["--only", "no_such_benchmark"]) == 2


def test_failing_benchmark_reports_error_row_and_others_still_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(quick: bool) -> list[Row]:
        raise RuntimeError("kaput")

    def fine(quick: bool) -> list[Row]:
        return [Row(figure="f", value=1.0, unit="ms", target="<= 2 ms", met=True)]

    fakes = [
        runner.Benchmark(name="a_broken", description="", module=SimpleNamespace(run=broken)),  # type: ignore[arg-type]
        runner.Benchmark(name="b_fine", description="", module=SimpleNamespace(run=fine)),  # type: ignore[arg-type]
    ]
    monkeypatch.setattr(runner, "discover", lambda: fakes)
    assert runner.main([]) == 1
    out = capsys.readouterr().out
    assert "RuntimeError: kaput" in out
    assert any(line.startswith("b_fine") and "yes" in line for line in out.splitlines())


def test_strict_fails_on_missed_target(monkeypatch: pytest.MonkeyPatch) -> None:
    def missed(quick: bool) -> list[Row]:
        return [Row(figure="f", value=3.0, unit="ms", target="<= 2 ms", met=False)]

    fake = runner.Benchmark(name="m", description="", module=SimpleNamespace(run=missed))  # type: ignore[arg-type]
    monkeypatch.setattr(runner, "discover", lambda: [fake])
    assert runner.main(["--json"]) == 0
    assert runner.main(["--json", "--strict"]) == 1


def test_statistics() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == pytest.approx(4.6)
    assert percentile([7.0], 99) == 7.0
    assert ratio(2.0, 4.0) == 0.5 and ratio(None, 1.0) is None and ratio(1.0, 0.0) is None
    calls: list[int] = []
    samples = measure(lambda: calls.append(1), repeat=3, warmup=2)
    assert len(samples) == 3 and len(calls) == 5 and all(s >= 0 for s in samples)
    with pytest.raises(ValueError):
        median([])
