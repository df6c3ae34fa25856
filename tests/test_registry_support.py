"""Shared pieces of the registry tests: worker snippets, registries on a tmp state dir.

No tests live here; the other test_registry_* modules import from it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from registry.abc import Owner, SpawnRequest
from registry.environment import MARKER_ENV
from registry.output.hooks import OutputHooks
from registry.proc.identity import table
from registry.process import KEEPER_SCRIPT, ProcessRegistry
from registry.settings import RegistrySettings
from registry.store.database import StateDB
from registry.store.tables import COMPONENT
from scope.abc import CallerKind, Scoper, Starter
from scope.fake import FakeScoper
from scope.foundation.clock import Clock
from tests.support.keepers import current, keeper_starter

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
OWNER = Owner(kind="test", id="t1")

# Worker snippets (argv lists); each does one thing a real worker might.
EXIT_3 = ["sh", "-c", "echo out; echo err >&2; exit 3"]
IGNORES_TERM = ["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"]
# The grandchild leaves the group (setsid), ignores SIGTERM and outlives its parent.
DOUBLE_FORK = [
    "sh",
    "-c",
    "setsid sh -c 'trap \"\" TERM; while :; do sleep 0.05; done' </dev/null >/dev/null 2>&1 & "
    "echo ready; while :; do sleep 0.05; done",
]
SLEEPER = ["sleep", "60"]


def unscoped() -> FakeScoper:
    """A scoper whose probe fails outside a unit: every launch is ``in_process``."""
    return FakeScoper(probe_ok=False)


def settings(**overrides: object) -> RegistrySettings:
    """Registry settings with short waits for tests."""
    values: dict[str, object] = {"kill_grace": 0.5, "drain_time": 1.0}
    values.update(overrides)
    return RegistrySettings(**values)  # type: ignore[arg-type]


@contextmanager
def open_registry(
    state_dir: Path,
    scoper: Scoper | None = None,
    *,
    follow: bool = True,
    protect_gateway: bool = False,
    cleanup: bool = True,
    clock: Clock | None = None,
    hooks: OutputHooks | None = None,
    starter: Starter | None = None,
    **setting_overrides: object,
) -> Iterator[ProcessRegistry]:
    """A ProcessRegistry on ``state_dir`` (database opened and closed with it). ``cleanup``
    kills what still runs when the block ends (reading sessions also reconciles them). Its
    keepers start the way :func:`tests.support.keepers.current` says (a fork server of its
    own on the ``fork_server`` path), unless ``starter`` names the one to use."""
    with keeper_starter(state_dir, None if starter is None else "direct") as own:
        starter = starter or own
        db = StateDB.in_dir(state_dir, [COMPONENT])
        registry = ProcessRegistry(
            state_dir=state_dir,
            db=db,
            scoper=scoper or unscoped(),
            settings=settings(**setting_overrides),
            follow=follow,
            protect_gateway=protect_gateway,
            clock=clock,
            hooks=hooks,
            starter=starter,
        )
        try:
            yield registry
        finally:
            try:
                # A failed test must not leave workers behind: stop whatever still runs here.
                for session in registry.list_sessions() if cleanup else ():
                    with contextlib.suppress(Exception):
                        registry.kill(session.id, grace=0.2)
            finally:
                registry.close()
                db.close()


def stop_all(state_dir: Path, scoper: Scoper | None = None) -> None:
    """Kill every session still running on ``state_dir`` (test cleanup after a failure)."""
    if (state_dir / "state.db").exists():
        with open_registry(state_dir, scoper, follow=False):
            pass


def request(
    argv: list[str] | str,
    *,
    cwd: str | os.PathLike[str] = "/",
    env: Mapping[str, str] | None = None,
    **fields: object,
) -> SpawnRequest:
    """A SpawnRequest with the test owner and this process's environment."""
    return SpawnRequest(
        argv=argv,
        cwd=str(cwd),
        env=dict(os.environ if env is None else env),
        owner=fields.pop("owner", OWNER),  # type: ignore[arg-type]
        caller=fields.pop("caller", CallerKind.CLI),  # type: ignore[arg-type]
        **fields,  # type: ignore[arg-type]
    )


def session_pids(session_id: str) -> list[int]:
    """Live processes carrying the session's environment marker."""
    needle = f"{MARKER_ENV}={session_id}".encode()
    found = []
    for pid in table():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return sorted(found)


def run_keeper(
    spec: Mapping[str, object], *, preexec_fn: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run the keeper script directly (as the registry does) on a spec file next to it."""
    import json

    directory = Path(str(spec["dir"]))
    path = directory / "spec.json"
    path.write_text(json.dumps(dict(spec)))
    if not (directory / "stdin").exists():
        os.mkfifo(directory / "stdin", 0o600)
    return subprocess.run(
        [PYTHON, "-I", "-S", str(KEEPER_SCRIPT), str(path)],
        capture_output=True,
        timeout=30,
        check=False,
        preexec_fn=preexec_fn,
    )


LAUNCHER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    sys.path.insert(0, {repo!r})
    from registry.abc import Owner, SpawnRequest
    from registry.process import ProcessRegistry
    from registry.settings import RegistrySettings
    from registry.store.database import StateDB
    from registry.store.tables import COMPONENT
    from scope.abc import CallerKind
    spec = json.loads(sys.argv[1])
    starter = None
    if spec.get("fork_server"):
        from registry.keeper.forkserver import ForkServer
        starter = ForkServer(cache_dir=Path(spec["state_dir"]) / "cache", reply_timeout=30.0)
        assert starter.open()
    if spec.get("env"):
        from scope import open_scoper
        from scope.abc import Policy
        from scope.settings import ScopeSettings
        scoper = open_scoper(ScopeSettings(), Policy(), environ=spec["env"])
    else:
        from scope.fake import FakeScoper
        scoper = FakeScoper(probe_ok=False)
    if spec.get("die_before_record"):
        import signal
        from registry.lifecycle.spawn import Spawner
        launch = Spawner._launch
        def launch_and_die(self, request, sdir, argv, fds):
            launched = launch(self, request, sdir, argv, fds)
            print(json.dumps({{"id": sdir.path.name, "keeper_pid": launched.pid}}), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        Spawner._launch = launch_and_die
    db = StateDB.in_dir(spec["state_dir"], [COMPONENT])
    registry = ProcessRegistry(state_dir=spec["state_dir"], db=db, scoper=scoper,
                               settings=RegistrySettings(kill_grace=0.5), follow=True,
                               starter=starter)
    session = registry.spawn(SpawnRequest(
        argv=spec["argv"], cwd="/", env=dict(os.environ), owner=Owner(kind="test", id="l"),
        caller=CallerKind.CLI, timeout=spec.get("timeout")))
    forked = starter.stats().forked if starter else 0
    print(json.dumps({{"id": session.id, "placement": session.placement.value,
                      "unit": session.unit, "keeper_pid": session.keeper_pid,
                      "forked": forked}}), flush=True)
    time.sleep(600)
    """
).format(repo=str(REPO))


def start_launcher(
    state_dir: Path,
    argv: list[str],
    *,
    env: Mapping[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
    **extra: object,
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A separate launcher process that spawns ``argv`` and then just sleeps (to be killed);
    on the ``fork_server`` path through a fork server of its own, which ends with it."""
    import json

    spec = {
        "state_dir": str(state_dir),
        "argv": argv,
        "env": dict(env) if env else None,
        "fork_server": current() == "fork_server",
        **extra,
    }
    proc = subprocess.Popen(
        [PYTHON, "-c", LAUNCHER, json.dumps(spec)],
        stdout=subprocess.PIPE,
        preexec_fn=preexec_fn,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        proc.wait()
        raise AssertionError("the launcher died before printing the session")
    return proc, json.loads(line)
