"""Gateway plumbing that needs no workers: sd_notify, journal logging, the serve lock."""

from __future__ import annotations

import io
import logging
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dispatcher.errors import GatewayError
from dispatcher.gateway.journal import JournalFormatter, configure_logging, stderr_is_journal
from dispatcher.gateway.lock import ServeLock, read_holder
from dispatcher.gateway.notify import Notifier


@pytest.fixture
def notify_socket(tmp_path: Path):
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    yield str(path), sock
    sock.close()


def test_notifier_sends_ready_status_and_watchdog(notify_socket) -> None:
    path, sock = notify_socket
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000"})
    assert notifier.enabled
    assert notifier.watchdog_interval == 2.0
    assert notifier.ready("running: 0 workers")
    assert sock.recv(4096) == b"READY=1\nSTATUS=running: 0 workers"
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    notifier.close()


def test_notifier_abstract_socket() -> None:
    name = f"dispatch-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    try:
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert notifier.status("hello")
        assert sock.recv(4096) == b"STATUS=hello"
        notifier.close()
    finally:
        sock.close()


def test_notifier_is_a_no_op_outside_systemd() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert notifier.watchdog_interval is None
    assert notifier.ready() is False


def test_watchdog_for_another_pid_is_ignored() -> None:
    notifier = Notifier({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert notifier.watchdog_interval is None


def test_journal_detection_and_priority_prefix(tmp_path: Path) -> None:
    target = tmp_path / "stream"
    with open(target, "w") as stream:
        info = os.fstat(stream.fileno())
        env = {"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"}
        assert stderr_is_journal(env, stream)
        assert not stderr_is_journal({"JOURNAL_STREAM": "1:2"}, stream)
        handler = configure_logging(env, stream=stream)
        try:
            logging.getLogger("dispatch.test").warning("two\nlines")
            logging.getLogger("dispatch.test").info("fine")
        finally:
            logging.getLogger("dispatch").removeHandler(handler)
    assert target.read_text().splitlines() == [
        "<4>dispatch.test: two | lines",
        "<6>dispatch.test: fine",
    ]


def test_plain_lines_off_the_journal() -> None:
    stream = io.StringIO()
    handler = configure_logging({}, stream=stream)
    try:
        logging.getLogger("dispatch.test").error("boom")
    finally:
        logging.getLogger("dispatch").removeHandler(handler)
    line = stream.getvalue().strip()
    assert line.endswith("ERROR dispatch.test: boom")
    assert not line.startswith("<")
    assert isinstance(JournalFormatter(), logging.Formatter)


HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from dispatcher.gateway.lock import ServeLock
    ServeLock(Path(sys.argv[1])).acquire()
    print("held", flush=True)
    sys.stdin.read()
    """
)


def test_second_serve_lock_names_the_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        record = read_holder(tmp_path)
        assert record is not None and record.pid == holder.pid
        with pytest.raises(GatewayError) as info:
            ServeLock(tmp_path).acquire()
        assert f"pid {holder.pid}" in info.value.message
    finally:
        holder.communicate("", timeout=10)
    # The kernel released the lock with the process: the next gateway may start.
    assert read_holder(tmp_path) is None
    lock = ServeLock(tmp_path)
    assert lock.acquire().pid == os.getpid()
    assert (tmp_path / "serve.lock").stat().st_mode & 0o777 == 0o600
    lock.release()
