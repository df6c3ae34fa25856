"""The gate: a held child runs nothing until released; EOF aborts it; any fd number works."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

import scope.gate as gate_mod
from scope.abc import GATE_ENV
from scope.gate import Gate, resolve_program, wrapped_argv

REPORT = (
    "import os, sys; "
    "print(os.environ.get('DISPATCH_SCOPE_GATE_FD'), "
    "sorted(int(f) for f in os.listdir('/proc/self/fd')))"
)


def free_fd(low: int, high: int) -> int:
    """An fd number in [low, high] that this process does not use (never clobber one)."""
    for number in range(low, high + 1):
        try:
            fcntl.fcntl(number, fcntl.F_GETFD)
        except OSError:
            return number
    pytest.skip(f"no free fd number in {low}..{high}")


@contextlib.contextmanager
def gate_at(number: int | None) -> Iterator[Gate]:
    """A gate whose child end is at ``number`` (None: wherever the kernel puts it)."""
    gate = Gate.open()
    if number is not None:
        number = free_fd(number, number + 50)
        os.dup2(gate.read_fd, number, inheritable=False)
        os.close(gate.read_fd)
        gate.read_fd = number
    try:
        yield gate
    finally:
        gate.close()


def run_held(gate: Gate, release: bool, tmp_path) -> subprocess.CompletedProcess[str]:
    env = gate.env({"PATH": os.environ["PATH"], "MARK": "x"})
    argv = wrapped_argv([sys.executable, "-I", "-c", REPORT], gate.read_fd, env, str(tmp_path))
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=str(tmp_path),
        pass_fds=(gate.read_fd,),
        stdout=subprocess.PIPE,
        text=True,
    )
    gate.after_spawn()
    if release:
        gate.release()
    else:
        gate.close()
    out, _ = proc.communicate(timeout=20)
    return subprocess.CompletedProcess(argv, proc.returncode, out, "")


@pytest.fixture(params=["bash", "python"])
def variant(request, monkeypatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(gate_mod, "_bash", lambda: None)
    elif request.param == "bash" and gate_mod._bash() is None:
        pytest.skip("no bash on this host")
    return request.param


def test_released_program_runs_without_the_gate(variant, tmp_path, leak_guard):
    # pytest holds many fds, so the gate lands above 9: bash or Python must hold it.
    with gate_at(42) as gate:
        number = gate.read_fd
        done = run_held(gate, True, tmp_path)
    assert done.returncode == 0, done
    var, fds = done.stdout.split(" ", 1)
    assert var == "None"
    assert str(number) not in fds.strip("[]\n").split(", ")
    # Which interpreter held it:
    held_by = done.args[0]
    if variant == "bash":
        assert held_by.endswith("bash")
    else:
        assert held_by == sys.executable and "-S" in done.args


def test_eof_aborts_without_running_the_program(variant, tmp_path, leak_guard):
    with gate_at(42) as gate:
        done = run_held(gate, False, tmp_path)
    assert done.returncode == 125 and done.stdout == ""


def test_user_strings_are_never_shell_code(tmp_path, leak_guard):
    marker = tmp_path / "pwned"
    with gate_at(None) as gate:
        env = gate.env({"PATH": os.environ["PATH"]})
        argv = wrapped_argv(
            ["echo", f"$(touch {marker})", "; touch", str(marker)], gate.read_fd, env, str(tmp_path)
        )
        proc = subprocess.Popen(argv, env=env, pass_fds=(gate.read_fd,), stdout=subprocess.PIPE)
        gate.after_spawn()
        gate.release()
        out, _ = proc.communicate(timeout=10)
    assert not marker.exists()
    assert out.decode().startswith("$(touch")


def test_gate_env_names_the_fd():
    with gate_at(None) as gate:
        assert gate.env({"A": "1"}) == {"A": "1", GATE_ENV: str(gate.read_fd)}
        assert gate.read_fd >= 3


def test_resolve_program(tmp_path):
    assert resolve_program("sh", {"PATH": "/usr/bin:/bin"}, "/") in ("/usr/bin/sh", "/bin/sh")
    with pytest.raises(FileNotFoundError):
        resolve_program("no-such-thing-xyz", {"PATH": "/usr/bin"}, "/")
    with pytest.raises(FileNotFoundError):
        resolve_program("./missing", {}, str(tmp_path))
    script = tmp_path / "s"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):
        resolve_program("./s", {}, str(tmp_path))
    script.chmod(0o755)
    assert os.path.normpath(resolve_program("./s", {}, str(tmp_path))) == str(script)


CHILD = """
import os, subprocess, sys
from scope.gate import Gate, wrapped_argv
gate = Gate.open()
assert gate.read_fd <= 9, gate.read_fd
env = gate.env({"PATH": os.environ["PATH"]})
argv = wrapped_argv([sys.executable, "-I", "-c", sys.argv[1]], gate.read_fd, env, "/")
proc = subprocess.Popen(argv, env=env, pass_fds=(gate.read_fd,), stdout=subprocess.PIPE, text=True)
gate.after_spawn()
gate.release() if sys.argv[2] == "go" else gate.close()
out, _ = proc.communicate(timeout=20)
print(argv[0], gate.read_fd, proc.returncode, out.strip())
"""


@pytest.mark.parametrize("action", ["go", "abort"])
def test_plain_sh_holds_single_digit_fds(action, leak_guard):
    # A fresh interpreter has single-digit fds free, so /bin/sh (dash on Debian) is used.
    done = subprocess.run(
        [sys.executable, "-c", CHILD, REPORT, action],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert done.returncode == 0, done.stderr
    shell, _fd, code, out = [*done.stdout.split(" ", 3), ""][:4]
    assert shell == "/bin/sh"
    if action == "go":
        assert code == "0" and out.startswith("None ")
    else:
        assert code == "125" and out.strip() == ""
