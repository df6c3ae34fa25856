"""Start-up cost of the ``dispatch`` CLI compared with a bare Python interpreter.

Every cron fire, every oneshot ``dispatch kanban tick`` and every worker's report pays the
CLI's start-up, so it is measured against ``python -c pass`` (the floor for any Python
program) and ``python -I -S -c pass`` (the floor the keeper aims for: no site, no user paths).
The same interpreter runs all of them, interleaved, so the ratios show what our imports cost,
not which Python is installed or how loaded the machine is.

Targets: ``dispatch --version`` <= 1.3x (issue 14); the short write commands ``kanban add``,
``complete``, ``block``, ``review`` and ``defer`` <= 3x ``python -c pass`` (issue 26). They run
against a config with one assignee and their own state dir: every ``add`` adds a card, as an
operator's would, and every worker report reports on a card of its own, claimed before the
timed run, with the environment a worker has (``DISPATCH_RUN_ID``, ``DISPATCH_HOST_ID``).

The targets are judged on a venv holding the wheel built from this checkout (rows marked
"(wheel install)", against that venv's own ``python -c pass``), because that is what users
run. The development install's rows stay as context: its editable-install hook runs in
``site`` for every interpreter of the dev venv (some 10 ms of imports, pathlib and re
among them, which the CLI needs anyway), so there ``python -c pass`` is twice as slow and
the CLI's ratio looks half as large as it is. Without a wheel install (no venv module, or
no wheelhouse and no index) the development rows are judged instead, and the wheel row says
why.

Every command runs with its bytecode cached, as an installed package has it (pip compiles it):
the runs write and read their caches in a scratch ``PYTHONPYCACHEPREFIX``, whatever
``PYTHONDONTWRITEBYTECODE`` says (with it set and no cache, every start would compile every
module of ours, some 40 ms here), and the untimed first round fills it.

With ``dispatch serve`` running on a state dir, the short writes on it are answered by the
gateway over its relay (:mod:`dispatcher.app.relay`): the rows marked "(wheel install, serve
answering)" run the wheel's commands against a state dir the wheel's own ``dispatch serve``
serves (its board paused, so it starts nothing while they are timed). Those are the rows the
short writes' target is judged on when they run; the standalone wheel rows (no gateway) are
judged too, and stay above it: a fresh interpreter that imports the store and the config
cannot start in 3x ``python -c pass``.

``DISPATCH_BENCH_BEFORE=DIR`` (a source tree of an older commit, e.g. ``git archive``d) adds
a "(before)" row for each ``dispatch`` command: the same command run from that tree, in the
same interleaved rounds, on a state dir of its own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from tests.benchmarks.common import (
    REPO_ROOT,
    Launch,
    Row,
    measure_commands,
    median,
    percentile,
    ratio,
)
from tests.support.wait import wait_for

NAME = "cli_startup"
DESCRIPTION = (
    "dispatch --version, kanban add and the worker reports (complete, block, review, defer) "
    "vs python -c pass and python -I -S -c pass (median wall time)"
)

CLI = [sys.executable, "-m", "dispatcher.cli.main"]
BARE = [sys.executable, "-c", "pass"]
ISOLATED = [sys.executable, "-I", "-S", "-c", "pass"]
VERSION = "dispatch --version"
ADD = "dispatch kanban add"
REPORTS = {
    "dispatch kanban complete": ["complete"],
    "dispatch kanban block": ["block", "--kind", "transient", "--reason", "bench"],
    "dispatch kanban review": ["review"],
    "dispatch kanban defer": ["defer", "--for", "1h"],
}
TARGETS = {VERSION: 1.3, ADD: 3.0, **dict.fromkeys(REPORTS, 3.0)}
CONFIG = "kanban:\n  assignees:\n    w:\n      command: [sh, -c, ':']\n"
HOST = "bench-host"


# Claims cards through the board store of the tree it runs in (its cwd), one per input line;
# with a second argument on a paused board too (the served side's gateway must start nothing,
# yet its reports need running cards: this helper alone claims past the pause).
CLAIMER = """
import sys, time
from pathlib import Path
from dispatcher.app.database import open_state
from dispatcher.kanban import store as board
from dispatcher.kanban.model import Limits, NewCard
from dispatcher.kanban.store import SqliteBoardStore
from dispatcher.launch.claimant import Claimant
if len(sys.argv) > 2:
    refusal = board.rules.claim_refusal
    board.rules.claim_refusal = lambda card, *, paused, **rest: refusal(card, paused=False, **rest)
db = open_state(Path(sys.argv[1]))
store, me, limits = SqliteBoardStore(db), Claimant.current(), Limits(max_in_progress=10**9)
for _ in sys.stdin:
    now = time.time()
    card, _ = store.add_card(NewCard(title="bench", assignee="w"), now=now)
    claim = store.claim(card.id, now=now, claimer=me, limits=limits)
    print(card.id, claim.run.run_id, flush=True)
db.close()
"""


class Claims:
    """Running cards on one state dir, claimed through the board store (one per report) of
    the source tree ``cwd`` (a helper process in it: an older tree refuses a database that
    newer code has migrated)."""

    def __init__(
        self,
        state_dir: Path,
        cwd: Path | None,
        python: str = sys.executable,
        *,
        past_pause: bool = False,
    ) -> None:
        self._helper = subprocess.Popen(
            [python, "-c", CLAIMER, str(state_dir), *(["past-pause"] if past_pause else [])],
            cwd=cwd or REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def next(self) -> tuple[str, str]:
        """A new card, claimed: its id and its run's id."""
        assert self._helper.stdin is not None and self._helper.stdout is not None
        self._helper.stdin.write("claim\n")
        self._helper.stdin.flush()
        card, run = self._helper.stdout.readline().split()
        return card, run

    def close(self) -> None:
        """End the helper."""
        assert self._helper.stdin is not None
        self._helper.stdin.close()
        try:
            self._helper.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._helper.kill()
            self._helper.wait()


def _report(
    claims: Claims,
    words: Sequence[str],
    env: dict[str, str],
    cwd: Path | None,
    cli: Sequence[str] = CLI,
) -> Callable[[], Launch]:
    """A worker's report on a card claimed just before the run, from ``cwd``'s tree."""

    def launch() -> Launch:
        card, run = claims.next()
        ids = {"DISPATCH_CARD_ID": card, "DISPATCH_RUN_ID": run, "DISPATCH_HOST_ID": HOST}
        return Launch(argv=[*cli, "kanban", *words], env={**env, **ids}, cwd=cwd)

    return launch


def _side(
    scratch: Path, label: str, cwd: Path | None, python: str = sys.executable
) -> tuple[dict[str, Sequence[str] | Callable[[], Launch]], Claims]:
    """The ``dispatch`` commands of one source tree (``cwd``; None: this one) or installed
    venv (``python``, run outside any tree), on a state dir of their own."""
    state = scratch / f"state{label}"
    claims = Claims(state, cwd, python, past_pause=label == SERVED)
    fixed = {"DISPATCH_STATE_DIR": str(state)}
    # Installed: the console script users run (``-m`` would add runpy's imports, 3.5 ms).
    script = Path(python).with_name("dispatch")
    cli = [str(script)] if label in (WHEEL, SERVED) else [python, "-m", "dispatcher.cli.main"]
    commands: dict[str, Sequence[str] | Callable[[], Launch]] = {
        VERSION + label: lambda: Launch(argv=[*cli, "--version"], env=fixed, cwd=cwd),
        ADD + label: lambda: Launch(
            argv=[*cli, "kanban", "add", "bench", "--assignee", "w"], env=fixed, cwd=cwd
        ),
    }
    for figure, words in REPORTS.items():
        commands[figure + label] = _report(claims, words, fixed, cwd, cli)
    return commands, claims


def _wheel_venv(scratch: Path) -> tuple[str | None, str]:
    """The python of a venv holding the wheel built from this checkout (what users install:
    no editable-install hooks in its ``site``), or None and why not."""
    from tests.support.install import InstallUnavailable, build_wheel, install_wheel

    try:
        install_wheel(build_wheel(scratch / "build"), scratch / "venv")
    except (InstallUnavailable, AssertionError, OSError, subprocess.SubprocessError) as exc:
        return None, f"no wheel install: {str(exc).splitlines()[0] if str(exc) else exc!r}"
    return str(scratch / "venv" / "bin" / "python"), ""


def _cli_problem(what: Launch, env: dict[str, str]) -> str | None:
    """Why the CLI cannot be timed (it is missing or fails), or None when it runs."""
    try:
        done = subprocess.run(
            list(what.argv),
            cwd=what.cwd or REPO_ROOT,
            env={**env, **what.env},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"unavailable: exit {done.returncode}: {last}"
    return None


def _row(figure: str, samples: list[float], baseline: float | None, *, judged: bool) -> Row:
    """A timed row; ``judged``: its target applies (the rows of what users install)."""
    value = median(samples) * 1000
    factor = ratio(value, baseline)
    target = TARGETS.get(figure.removesuffix(WHEEL).removesuffix(SERVED)) if judged else None
    note = f"n={len(samples)}, p90={percentile(samples, 90) * 1000:.1f} ms"
    installed = figure.endswith((WHEEL, SERVED))
    if not installed and figure.startswith("dispatch") and judged is False:
        note += "; development install (its editable hooks slow python -c pass too)"
    return Row(
        figure=figure,
        value=value,
        unit="ms",
        baseline=baseline,
        ratio=factor,
        target=f"<= {target}x" if target else None,
        met=None if target is None or factor is None else factor <= target,
        note=note,
    )


WHEEL = " (wheel install)"
"""The label of the rows run from a venv with the wheel, the rows the targets apply to."""

SERVED = " (wheel install, serve answering)"
"""The label of the wheel's rows on a state dir its ``dispatch serve`` serves (relayed)."""


class Served:
    """The wheel's ``dispatch serve`` on ``state``, its board paused, once its relay listens."""

    def __init__(self, python: str, state: Path, env: dict[str, str]) -> None:
        from dispatcher.app.relay import relay_address

        script = str(Path(python).with_name("dispatch"))
        self.env = {**env, "DISPATCH_STATE_DIR": str(state)}
        subprocess.run(
            [script, "kanban", "pause"], env=self.env, capture_output=True, check=True, timeout=60
        )
        self.process = subprocess.Popen(
            [script, "serve"], env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        address = relay_address(os.path.realpath(state))
        try:
            wait_for(lambda: self._listening(address), 30, what="dispatch serve's relay")
        except BaseException:
            self.close()
            raise

    def _listening(self, address: bytes) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"dispatch serve exited with {self.process.returncode}")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(address)
            except OSError:
                return False
        return True

    def close(self) -> None:
        """Stop the gateway (SIGTERM, then SIGKILL after 30 s)."""
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def run(quick: bool) -> list[Row]:
    """Median start-up times; a CLI row says "unavailable" when that command cannot run."""
    repeat = 3 if quick else 30
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        config = scratch / "config.yaml"
        config.write_text(CONFIG)
        env = dict(os.environ)
        env.update(DISPATCH_CONFIG=str(config), PYTHONPYCACHEPREFIX=str(scratch / "pycache"))
        for name in (
            "_ARGCOMPLETE",
            "DISPATCH_CARD_ID",
            "DISPATCH_RUN_ID",
            "DISPATCH_HOST_ID",
            "DISPATCH_FAST_PATH",
            "PYTHONDONTWRITEBYTECODE",
        ):
            env.pop(name, None)
        python, why_not = _wheel_venv(scratch)
        clis, opened = _sides(scratch, python, env)
        try:
            problems = {figure: _cli_problem(_launch(make), env) for figure, make in clis.items()}
            commands: dict[str, Sequence[str] | Callable[[], Launch]] = {
                "bare": BARE,
                "isolated": ISOLATED,
            }
            if python:
                commands["bare" + WHEEL] = [python, "-c", "pass"]
            commands.update({f: make for f, make in clis.items() if problems[f] is None})
            samples = measure_commands(commands, repeat, env=env)
        finally:
            for each in opened:
                each.close()
    return _rows(samples, clis, problems, why_not)


def _sides(
    scratch: Path, python: str | None, env: dict[str, str]
) -> tuple[dict[str, Sequence[str] | Callable[[], Launch]], list[Claims | Served]]:
    """The commands of this tree, of the wheel's venv (when there is one: standalone, and
    answered by its ``dispatch serve``) and of an older tree (``DISPATCH_BENCH_BEFORE``), with
    the claim helpers and the gateway to close (the gateway first: it ends before its state)."""
    clis, claims = _side(scratch, "", None)
    opened: list[Claims | Served] = [claims]
    sides: list[tuple[str, Path | None, str]] = []
    if python:
        opened.insert(0, Served(python, scratch / f"state{SERVED}", env))
        sides += [(WHEEL, scratch, python), (SERVED, scratch, python)]
    before = os.environ.get("DISPATCH_BENCH_BEFORE")
    if before:
        sides.append((" (before)", Path(before).resolve(), sys.executable))
    for label, cwd, interpreter in sides:
        more, claims = _side(scratch, label, cwd, interpreter)
        clis.update(more)
        opened.append(claims)
    return clis, opened


def _rows(
    samples: dict[str, list[float]],
    clis: dict[str, Sequence[str] | Callable[[], Launch]],
    problems: dict[str, str | None],
    why_not: str,
) -> list[Row]:
    """The baselines, then each command against the baseline of its own interpreter."""
    bare = median(samples["bare"]) * 1000
    rows = [
        _row("python -c pass", samples["bare"], None, judged=False),
        _row("python -I -S -c pass", samples["isolated"], bare, judged=False),
    ]
    installed = samples.get("bare" + WHEEL)
    installed_ms = median(installed) * 1000 if installed else None
    if installed:
        rows.append(_row("python -c pass" + WHEEL, installed, None, judged=False))
    else:
        rows.append(Row(figure="python -c pass" + WHEEL, value=None, unit="ms", note=why_not))
    for figure in clis:
        problem = problems[figure]
        wheel = figure.endswith((WHEEL, SERVED))
        if problem is None:
            base = installed_ms if wheel else bare
            rows.append(_row(figure, samples[figure], base, judged=wheel or not installed))
        else:
            rows.append(Row(figure=figure, value=None, unit="ms", note=problem))
    return rows


def _launch(make: Sequence[str] | Callable[[], Launch]) -> Launch:
    return make() if callable(make) else Launch(argv=list(make))
