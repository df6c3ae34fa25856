"""The figures for docs/testing.md: hostile inputs per parser and generated CLI command lines,
counted by outcome (``python -m tests.support.census [--inputs N] [--lines N]``).

Per parser (tests/support/parsercheck.py): inputs tried, accepted, rejected with our error,
wrongly accepted (outside the documented grammar) and crashes (any other exception). For the
CLI (tests/support/clifuzz.py): command lines tried, crashes (an exception escaping ``main``),
wrong exit codes, broken stderr (more than one error line, or a line not from dispatch), lines
over 1,000 characters, and state dirs changed by a command that exited 2.

The same script measures the tree before issue 15: run it with that tree first on
``PYTHONPATH`` (and this file's tests/support copied into it). Parsers that did not exist there
fall back to what the code did then (see ``_FALLBACKS``).
"""

from __future__ import annotations

import argparse
import collections
import tempfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.support import parsercheck
from tests.support.parsercheck import Target


def _base_count(text: str) -> object:
    from scope.foundation.errors import UsageError

    try:
        value = int(text)  # argparse's type=int, as the CLI had it
    except ValueError:
        raise UsageError("invalid int value") from None
    if not 1 <= value <= 1000:
        raise UsageError("--count out of range")
    return value


def _base_schema(name: str) -> Callable[[str], object]:
    def parse(text: str) -> object:
        from scope.foundation import schema

        return getattr(schema, name)(text)

    return parse


_FALLBACKS: dict[str, Callable[[str], object]] = {
    "duration": _base_schema("parse_duration"),
    "size": _base_schema("parse_size"),
    "count": _base_count,
    "card-body": lambda text: text,  # stored as given
}


def _target_for(target: Target) -> Target | None:
    """``target``, or its fallback on a tree without the parser; None: nothing to measure."""
    _kind, err = parsercheck.outcome(target, "1")
    if not isinstance(err, ImportError):
        return target
    fallback = _FALLBACKS.get(target.name)
    if fallback is None:
        return None
    return Target(
        name=target.name, strategy=target.strategy, parse=fallback, grammar=target.grammar
    )


def _counting(examples: int) -> settings:
    """Generate ``examples`` inputs and never shrink: the census counts, it does not hunt."""
    return settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def measure(target: Target, inputs: int) -> tuple[collections.Counter[str], list[str]]:
    """Outcome counts of ``inputs`` generated texts, and a few examples of wrong/crash."""
    counts: collections.Counter[str] = collections.Counter()
    examples: list[str] = []

    @_counting(inputs)
    @given(text=target.strategy)
    def run(text: str) -> None:
        kind, err = parsercheck.outcome(target, text)
        counts[kind] += 1
        if kind in ("wrong", "crash") and len(examples) < 3:
            detail = f" ({type(err).__name__}: {str(err)[:60]})" if err else ""
            examples.append(f"{kind}: {text[:40]!r}{detail}")

    run()
    return counts, examples


def parsers(inputs: int) -> list[tuple[str, collections.Counter[str], list[str]]]:
    """(name, outcome counts, a few examples of wrong/crash) per parser."""
    rows = []
    for original in parsercheck.TARGETS:
        target = _target_for(original)
        if target is None:
            rows.append((original.name, collections.Counter(), ["not in this tree"]))
        else:
            rows.append((original.name, *measure(target, inputs)))
    return rows


def cli(lines: int) -> tuple[int, collections.Counter[str], list[str]]:
    """(command lines tried, problem counts by kind, a few examples)."""
    from tests.support import clifuzz

    counts: collections.Counter[str] = collections.Counter()
    examples: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        world = clifuzz.make_world(root)
        with clifuzz.inside(root):
            clifuzz.seed(world)

            @_counting(lines)
            @given(data=st.data())
            def run(data: st.DataObject) -> None:
                command, words = data.draw(clifuzz.command_lines(world.ids))
                for problem in clifuzz.problems(world, command, words):
                    kind = problem.partition(":")[0]
                    counts[kind] += 1
                    if len(examples) < 8:
                        shown = [w[:30] for w in words]
                        examples.append(f"{kind}: {shown} -> {problem[len(kind) + 2 :][:160]!r}")

            run()
        return world.tried, counts, examples


def main() -> None:
    """Print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=1000, help="inputs per parser")
    parser.add_argument("--lines", type=int, default=1000, help="CLI command lines")
    args = parser.parse_args()
    print("| parser | inputs | accepted | rejected | wrongly accepted | crashes |")
    print("|---|---|---|---|---|---|")
    notes = []
    for name, counts, examples in parsers(args.inputs):
        total = sum(counts.values())
        print(
            f"| {name} | {total} | {counts['accepted']} | {counts['rejected']} | "
            f"{counts['wrong']} | {counts['crash']} |"
        )
        notes += [f"  {name}: {example}" for example in examples]
    tried, problems, examples = cli(args.lines)
    print()
    print("| command lines | crashes | wrong exit | broken stderr | long lines | changed on 2 |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {tried} | {problems['crash']} | {problems['exit']} | {problems['lines']} | "
        f"{problems['long']} | {problems['changed']} |"
    )
    for line in notes + [f"  cli: {example}" for example in examples]:
        print(line)


if __name__ == "__main__":
    main()
