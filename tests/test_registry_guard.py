"""The gateway-kill refusal: commands that would kill the gateway by name are refused, judged by
tokens; other targets stay killable."""

from __future__ import annotations

import os
import shlex

import pytest

from registry.errors import SpawnRefused
from registry.proc.refusal import GatewayIdentity, gateway_kill_reason
from tests.test_registry_support import open_registry, request

GATEWAY = GatewayIdentity(
    pid=4242,
    pgrp=4242,
    uid=1000,
    user="alice",
    names=frozenset({"python3", "python3.11", "python", "dispatch"}),
    cmdlines=("/usr/bin/python3 /usr/bin/dispatch serve", "dispatch serve"),
)

REFUSED = [
    "pkill python3",
    "pkill -9 python3",
    "pkill -KILL python",
    "pkill -f 'dispatch serve'",
    "pkill -f dispatch",
    "pkill --full 'dispatch serve'",
    "pkill -f -i 'DISPATCH SERVE'",
    "pkill pyth",
    "pkill -x python3",
    "pkill -u alice",
    "killall python",
    "killall -9 python3",
    "killall -r 'pyth.*'",
    "killall dispatch",
    "killall -u alice",
    "killall5 -15",
    "kill -9 4242",
    "kill -- -1",
    "kill -TERM -4242",
    "sudo pkill python3",
    "timeout 5 pkill -f 'dispatch serve'",
    "env A=1 pkill python3",
    "nohup killall python &",
    "sh -c 'pkill python3'",
    "bash -lc 'sleep 1; pkill -f \"dispatch serve\"'",
    "sh -c 'x=1 && echo hi | pkill python3'",
    "sh -c 'echo $(pkill python3)'",
    "sh -c \"eval 'pkill python'\"",
    "sh -c 'sh -c \"killall python\"'",
]

ALLOWED = [
    "pkill sleep",
    "pkill -f worker.py",
    "pkill -f 'node server.js'",
    "pkill -x python3-worker",
    "pkill -0 python3",
    "killall node",
    "killall python2",
    "kill 1234",
    "kill -9 1234",
    "kill -l",
    "grep pkill notes.txt",
    "echo 'pkill python3'",
    "sh -c 'echo pkill python3'",
    "python3 -c 'print(1)'",
    "sh -c 'pkill -f my-agent; echo done'",
    "pkill -u bob",
]


@pytest.mark.parametrize("command", REFUSED)
def test_refused(command: str) -> None:
    reason = gateway_kill_reason(shlex.split(command), GATEWAY)
    assert reason is not None, command


@pytest.mark.parametrize("command", ALLOWED)
def test_allowed(command: str) -> None:
    assert gateway_kill_reason(shlex.split(command), GATEWAY) is None, command


def test_current_identity_knows_this_process() -> None:
    me = GatewayIdentity.current()
    assert me.pid == os.getpid()
    assert "python3" in me.names
    assert gateway_kill_reason(["kill", str(os.getpid())], me) is not None


def test_registry_refusal_names_the_id_based_alternative(tmp_path: os.PathLike[str]) -> None:
    from pathlib import Path

    with open_registry(Path(tmp_path), protect_gateway=True) as registry:
        with pytest.raises(SpawnRefused) as caught:
            registry.spawn(request(["pkill", "-f", "dispatch serve"]))
        assert "dispatch kill ID" in caught.value.message
        assert caught.value.exit_code == 2
        assert registry.list_sessions(include_finished=True) == []
        with pytest.raises(SpawnRefused):
            registry.spawn(request("sleep 1; killall python3", shell=True))
