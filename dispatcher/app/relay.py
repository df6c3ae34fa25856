"""The short-write relay, the command's end: ``dispatch kanban add`` and a worker's reports
answered by the running ``dispatch serve`` instead of by a fresh interpreter's imports.

A short write command spends four fifths of its time importing the board, its dataclasses
and the database layer, and about 2 ms writing (issue 26). ``dispatch serve`` has all of that
loaded already. So when a gateway serves the command's state dir, the command sends it its
command line, environment and working directory over a unix socket, and prints what comes
back; the gateway runs the very same handler (:mod:`dispatcher.cli.relay_server`).

Nothing is lost and nothing runs twice:

- The command falls back to running itself whenever the gateway has not started its
  command: no gateway listening, a peer that is not our user, the gateway declining (``D``:
  a command line, config or path it does not take, see the gateway's end), or the gateway
  gone before it said ``S``. The gateway says ``S`` before it runs anything and runs nothing
  when it cannot say it, so without ``S`` nothing was done.
- After ``S`` the gateway's answer is the command's: its exit status, stdout and stderr.
  If the gateway ends before answering, the command cannot know whether the write was made,
  says so in one line and exits 1 rather than risk making it twice.

Wire format (one connection per command, ``SOCK_STREAM``, everything OS-encoded; argv and
environment strings cannot hold NUL): the request is ``MAGIC``, then NUL-separated the
working directory, the number of arguments, the arguments and ``NAME=value`` environment
entries; the command then shuts its side down. The answer is ``D`` and a reason, or ``S``
followed by ``status NUL len(stdout) NUL`` stdout and stderr.

The socket is in the abstract namespace under a name derived from the state dir, like the
wake socket (:mod:`dispatcher.app.wake`); both ends check the other is our user
(``SO_PEERCRED``), because anyone may bind or connect to an abstract name.
``DISPATCH_RELAY=0`` (or ``DISPATCH_FAST_PATH=0``) keeps the command to itself.

This module is imported by every short write command, so it imports only what the
interpreter has loaded already (``os``, ``sys``) and the C socket module.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs the command's start-up
    from collections.abc import Mapping, Sequence

__all__ = [
    "COMMANDS",
    "MAGIC",
    "RELAY_ENV",
    "decode_request",
    "encode_request",
    "relay",
    "relay_address",
    "state_dir_text",
]

RELAY_ENV = "DISPATCH_RELAY"
"""``DISPATCH_RELAY=0``: the command never asks the gateway."""
MAGIC = b"dispatch-relay/1"
COMMANDS = ("add", "complete", "block", "review", "defer")
"""The ``dispatch kanban`` commands the gateway may answer (the fast path's)."""
CONNECT_TIMEOUT = 2.0
"""Seconds to connect and send: the gateway accepts on a thread of its own."""
START_TIMEOUT = 30.0
"""Seconds for the gateway to say ``S`` or ``D`` once it has the request."""
ANSWER_TIMEOUT = 600.0
"""Seconds for the answer once started (a write waits at most for the database's lock)."""
MAX_ANSWER = 64 * 1024 * 1024


def relay_address(state_dir: str) -> bytes:
    """The abstract socket name of the relay of the gateway serving ``state_dir`` (a real
    path: :func:`os.path.realpath` of the state dir)."""
    from scope.foundation.digest import sha256_hex

    return b"\0dispatch-relay-" + sha256_hex(os.fsencode(state_dir))[:24].encode()


def expand(text: str, environ: Mapping[str, str], cwd: str) -> str | None:
    """``text`` (a path as the command was given it) as an absolute path, read as the
    command would read it: ``~`` and ``~/...`` with its ``HOME``, relative to its ``cwd``.
    None for ``~user`` forms (the gateway cannot read another process's password file
    entry more cheaply than the command can run itself)."""
    if text == "~" or text.startswith("~/"):
        home = environ.get("HOME")
        if not home or not os.path.isabs(home):
            return None
        text = home + text[1:]
    elif text.startswith("~"):
        return None
    return os.path.normpath(os.path.join(cwd, text))


def state_dir_text(explicit: str | None, environ: Mapping[str, str], cwd: str) -> str | None:
    """The real path of the state dir the command would use (``--state-dir``, else
    ``DISPATCH_STATE_DIR``, else the default, as :func:`dispatcher.paths.resolve_state_dir`
    has it), or None when it cannot tell cheaply."""
    chosen = explicit or environ.get("DISPATCH_STATE_DIR") or None
    if chosen:
        path = expand(chosen, environ, cwd)
    else:
        base = environ.get("XDG_STATE_HOME", "")
        if not base or not os.path.isabs(base):
            home = environ.get("HOME")
            if not home or not os.path.isabs(home):
                return None
            base = os.path.join(home, ".local", "state")
        path = os.path.join(base, "dispatch")
    return None if path is None else os.path.realpath(path)


def encode_request(cwd: str, argv: Sequence[str], environ: Mapping[str, str]) -> bytes:
    """The request's bytes (see the module docstring)."""
    parts = [MAGIC, os.fsencode(cwd), str(len(argv)).encode()]
    parts += [os.fsencode(arg) for arg in argv]
    parts += [os.fsencode(f"{name}={value}") for name, value in environ.items()]
    return b"\0".join(parts)


def decode_request(data: bytes) -> tuple[str, list[str], dict[str, str]] | None:
    """``(cwd, argv, environ)`` from a request's bytes, or None when they are not one."""
    parts = data.split(b"\0")
    if len(parts) < 3 or parts[0] != MAGIC or not parts[2].isdigit():
        return None
    count = int(parts[2])
    if len(parts) < 3 + count:
        return None
    argv = [os.fsdecode(arg) for arg in parts[3 : 3 + count]]
    environ: dict[str, str] = {}
    for entry in parts[3 + count :]:
        name, equals, value = os.fsdecode(entry).partition("=")
        if not equals or not name:
            return None
        environ[name] = value
    return os.fsdecode(parts[1]), argv, environ


def relay(arguments: Sequence[str], environ: Mapping[str, str]) -> int | None:
    """Have the gateway run this short write command: its exit status once it has printed
    the gateway's answer, or None when the command should run itself (see the module
    docstring; nothing was done then)."""
    if not _eligible(arguments, environ):
        return None
    try:
        cwd = os.getcwd()
    except OSError:
        return None
    state_dir = state_dir_text(_explicit_state_dir(arguments), environ, cwd)
    if state_dir is None:
        return None
    import _socket

    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    except OSError:
        return None
    try:
        return _converse(sock, relay_address(state_dir), encode_request(cwd, arguments, environ))
    finally:
        sock.close()


def _eligible(arguments: Sequence[str], environ: Mapping[str, str]) -> bool:
    """A cheap first look: one of :data:`COMMANDS` after ``kanban``, no ``--body-file`` (the
    body may be stdin, which the gateway cannot read), relaying not turned off, not cluster
    mode (the gateway declines those; asking would only cost a round trip)."""
    if environ.get(RELAY_ENV) == "0" or environ.get("DISPATCH_FAST_PATH") == "0":
        return False
    if environ.get("DISPATCH_DATABASE_URL") or "kanban" not in arguments:
        return False
    rest = arguments[list(arguments).index("kanban") + 1 :]
    if not any(word in COMMANDS for word in rest):
        return False
    return not any(arg.startswith(("--body-file", "--state-dir=")) for arg in arguments)


def _explicit_state_dir(arguments: Sequence[str]) -> str | None:
    """The ``--state-dir DIR`` of the command line, if any (the gateway checks the state
    dir again from the command line it parses, so a misreading here only costs a decline)."""
    for index, arg in enumerate(arguments[:-1]):
        if arg == "--state-dir":
            return arguments[index + 1]
    return None


def _converse(sock: object, address: bytes, request: bytes) -> int | None:
    import _socket

    assert isinstance(sock, _socket.socket)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        sock.connect(address)
        if not _ours(sock):
            return None
        sock.sendall(request)
        sock.shutdown(_socket.SHUT_WR)
        sock.settimeout(START_TIMEOUT)
        first = sock.recv(1)
    except OSError:
        # Not connected, not sent whole, or no word within the time. A gateway that has not
        # said S has run nothing; after SHUT_RD it can no longer say it (its send fails), and
        # what it said before is still read here.
        first = _last_word(sock)
    if first == b"S":
        return _answer(sock)
    return None  # D (declined), or nothing: not started


def _last_word(sock: object) -> bytes:
    """The gateway's first byte if it was sent before we stopped listening, else b""."""
    import _socket

    assert isinstance(sock, _socket.socket)
    try:
        sock.shutdown(_socket.SHUT_RD)
        sock.setblocking(False)
        return bytes(sock.recv(1))
    except OSError:
        return b""


def _ours(sock: object) -> bool:
    """Whether the peer runs as our user: only then may it see our environment."""
    import _socket

    assert isinstance(sock, _socket.socket)
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    return int.from_bytes(creds[4:8], sys.byteorder) == os.getuid()


def _answer(sock: object) -> int:
    """Print the gateway's answer and return its status; exit 1 with one line when it ended
    before answering (the write may or may not have been made)."""
    import _socket

    assert isinstance(sock, _socket.socket)
    chunks: list[bytes] = []
    size = 0
    try:
        sock.setblocking(True)
        sock.settimeout(ANSWER_TIMEOUT)
        while size <= MAX_ANSWER:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        pass
    parsed = _parse_answer(b"".join(chunks))
    if parsed is None:
        sys.stderr.write(
            "dispatch: error: the gateway (dispatch serve) ended before it answered; the "
            "command may or may not have taken effect: check 'dispatch kanban show' before "
            "repeating it\n"
        )
        return 1
    status, out, err = parsed
    sys.stdout.write(out)
    sys.stdout.flush()
    sys.stderr.write(err)
    return status


def _parse_answer(data: bytes) -> tuple[int, str, str] | None:
    head, _, rest = data.partition(b"\0")
    length, _, body = rest.partition(b"\0")
    if not head.isdigit() or not length.isdigit() or len(body) < int(length):
        return None
    cut = int(length)
    decode = os.fsdecode
    return int(head), decode(body[:cut]), decode(body[cut:])
