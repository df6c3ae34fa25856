"""The runner's combined table as Markdown (``--markdown``), the form docs/benchmarks.md records."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.benchmarks import runner
from tests.benchmarks.common import Row


def test_markdown_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def rows(quick: bool) -> list[Row]:
        return [
            Row(
                figure="a | b",
                value=1.5,
                unit="ms",
                baseline=3.0,
                ratio=0.5,
                target="<= 0.6x",
                met=True,
                note="n=3",
            ),
            Row(figure="missed", value=12345.0, unit="ms", target="<= 2 ms", met=False),
            Row(figure="absent", value=None, unit="s", note="no manager"),
        ]

    fake = runner.Benchmark(name="t", description="", module=SimpleNamespace(run=rows))  # type: ignore[arg-type]
    monkeypatch.setattr(runner, "discover", lambda: [fake])
    assert runner.main(["--quick", "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index(
        "| benchmark | figure | value | unit | baseline | ratio | target | met | note |"
    )
    table = lines[start:]
    assert table[1] == "|---|---|---:|---|---:|---:|---|---|---|"
    assert table[2] == "| t | a \\| b | 1.50 | ms | 3.00 | 0.50x | <= 0.6x | yes | n=3 |"
    assert table[3] == "| t | missed | 12345 | ms | - | - | <= 2 ms | **NO** |  |"
    assert table[4] == "| t | absent | - | s | - | - | - | - | no manager |"
    assert all(line.count("|") - line.count("\\|") == 10 for line in table)
