"""The keeper fork server: forks keepers from one warm interpreter instead of starting one each.

Run as ``<python> -I -S registry/keeper/server.py KEEPER DIR CLIENT_PID`` by
:mod:`registry.keeper.forkserver` (never imported by the registry). ``KEEPER`` is the keeper as
the registry would run it (its compiled bytecode, or ``program.py``): it is loaded and compiled
once here, with the C modules its modes use, and nothing else. The server is exec'd fresh by
its client, never forked from it, so it cannot inherit a lock held by another thread or any
thread state: whatever the client's threads were doing, this process starts clean and stays
single-threaded.

One unix ``SOCK_SEQPACKET`` connection per spawn. The client sends one message: a JSON request
(``spec``: the keeper's spec path, ``cwd``, ``env``, ``fds``: the descriptor number each passed
descriptor must have in the keeper, 0-2 being its stdio) with the descriptors as
``SCM_RIGHTS``. The server checks the peer (``SO_PEERCRED``: our uid and the client's pid, so a
stranger's connection is closed unanswered), forks, and answers ``{"pid": N, "start": T}`` (the
child's kernel start time, read before the child can be reaped, so the pair names it) or
``{"error": "..."}``. The child puts back the signal state the server started with (what a
keeper exec'd by the same client starts with), starts its own session, puts the descriptors in
place, closes every other one (nothing of the server, the client or another spawn reaches a
keeper or its worker), and runs the keeper's ``main`` exactly as a freshly started keeper
would; its first act there is to read its scope gate, so a child whose answer never reached
the client (the server died between fork and reply) reads EOF and exits without doing
anything.

The server reaps its children (they stay keepers after it is gone: reparented, never killed)
and exits when its client does (EOF on its stdin, a pipe only the client holds) or on SIGTERM.
``DISPATCH_FORKSERVER_FAULT`` names a crash point for tests (see :data:`FAULTS`).
"""

# contextlib would import more modules into a process whose memory every keeper shares.
# ruff: noqa: SIM105, SIM108

from __future__ import annotations

import _signal
import _socket
import errno
import marshal
import posix
import select
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

FAULT_ENV = "DISPATCH_FORKSERVER_FAULT"
FAULTS = ("before_fork", "after_fork", "after_reply", "refuse")
"""Crash points: SIGKILL itself with a request in hand before forking, after forking but before
answering, or after answering; or answer every request with an error."""
BACKLOG = 64
MAX_REQUEST = 64 * 1024
MAX_FDS = 16
RECV_TIMEOUT = 2.0
"""Seconds a connected client gets to send its request (a stuck one must not hold the rest)."""


def load_keeper(path: str) -> dict[str, Any]:
    """The keeper's module namespace: its bytecode (after the 16-byte pyc header) or its
    source compiled once, executed under a name that is not ``__main__``."""
    fd = posix.open(path, posix.O_RDONLY)
    try:
        chunks = []
        while True:
            data = posix.read(fd, 1 << 20)
            if not data:
                break
            chunks.append(data)
    finally:
        posix.close(fd)
    raw = b"".join(chunks)
    # Our own bytecode: the client checked its hash against what it compiled (keeper_command).
    if path.endswith(".pyc"):
        code = marshal.loads(raw[16:])  # noqa: S302
    else:
        code = compile(raw, path, "exec")
    namespace: dict[str, Any] = {"__name__": "dispatch_keeper", "__file__": path}
    exec(code, namespace)  # noqa: S102 - our own keeper, checked by the client before we start
    # What its modes import on demand, loaded once here instead of in every keeper.
    import fcntl  # noqa: F401
    import termios  # noqa: F401

    return namespace


def _noop(signum: int, frame: object) -> None:
    """A Python-level handler so the C handler writes SIGCHLD to the wakeup pipe."""


class Server:
    """The listening socket, the client's lifeline and the children to reap."""

    def __init__(self, keeper: dict[str, Any], directory: str, client: int) -> None:
        self.keeper = keeper
        self.loads = keeper["loads"]
        self.dumps = keeper["dumps"]
        self.directory = directory
        self.path = f"{directory}/sock"
        self.client = client
        self.uid = posix.geteuid()
        self.fault = posix.environ.get(FAULT_ENV.encode(), b"").decode()
        self.sigchld: Any = _signal.SIG_DFL
        self.devnull = posix.open("/dev/null", posix.O_RDWR)
        self.wake_r, self.wake_w = posix.pipe()
        posix.set_blocking(self.wake_r, False)
        posix.set_blocking(self.wake_w, False)
        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
        umask = posix.umask(0o077)  # the socket file is 0600 from its first instant
        try:
            # Bound by a relative name: a socket path must fit 108 bytes, the directory's
            # need not (the client connects through its descriptor of the directory).
            posix.chdir(directory)
            self.sock.bind("sock")
        finally:
            posix.chdir("/")
            posix.umask(umask)  # keepers get the umask a fresh keeper would
        self.sock.listen(BACKLOG)
        self.sock.setblocking(False)

    def serve(self) -> int:
        """Answer requests until the client goes away."""
        _signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        # What this interpreter started with (its client's, through the exec), restored in
        # each child: the only disposition and the only fd the server changes for itself.
        self.sigchld = _signal.signal(_signal.SIGCHLD, _noop)
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        poller.register(0, select.POLLIN)
        while True:
            for fd, _event in poller.poll():
                if fd == 0:
                    if not _readable_data(0):
                        return 0  # the client is gone: so are we (our keepers stay)
                elif fd == self.wake_r:
                    _drain(self.wake_r)
                    self.reap()
                else:
                    self.accept_all()

    def reap(self) -> None:
        """Collect every child that ended (their records are the keepers' own business)."""
        while True:
            try:
                pid, _status = posix.waitpid(-1, posix.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return

    def accept_all(self) -> None:
        """Take every queued connection, one request each."""
        while True:
            try:
                fd, _addr = self.sock._accept()  # type: ignore[attr-defined]
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return  # the client times out and falls back; try again on the next wake
                raise
            conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, fd)
            try:
                self.handle(conn)
            finally:
                conn.close()

    def handle(self, conn: _socket.socket) -> None:
        """One spawn: check the peer, take the request, fork, answer."""
        pid, uid, _gid = _peer(conn)
        if uid != self.uid or pid != self.client:
            return  # not our client: no answer at all
        conn.settimeout(RECV_TIMEOUT)
        try:
            request, fds = _receive(conn, self.loads)
        except (OSError, ValueError) as err:
            self.answer(conn, {"error": f"bad request: {err}"})
            return
        try:
            if self.fault == "refuse":
                self.answer(conn, {"error": "refused (fault injected)"})
                return
            self.crash_at("before_fork")
            child = self.fork(request, fds)
        finally:
            for fd in fds:
                _close(fd)
        start = self.keeper["start_time"](child)
        self.crash_at("after_fork")
        self.answer(conn, {"pid": child, "start": start})
        self.crash_at("after_reply")

    def answer(self, conn: _socket.socket, reply: dict[str, Any]) -> None:
        """Send the answer; a client that gave up meanwhile has closed its gate already."""
        try:
            conn.send(self.dumps(reply).encode())
        except OSError:
            pass

    def crash_at(self, point: str) -> None:
        """The injected crash point, if it is this one (tests only)."""
        if self.fault == point:
            posix.kill(posix.getpid(), _signal.SIGKILL)

    def fork(self, request: dict[str, Any], fds: list[int]) -> int:
        """Fork a keeper child (signals blocked across the fork, so no handler of ours runs in
        the child before it has put the signal state back)."""
        sys.stderr.flush()
        blocked = _signal.pthread_sigmask(_signal.SIG_BLOCK, _catchable())
        try:
            pid = posix.fork()
            if pid == 0:
                self.child(request, fds, blocked)  # never returns
        finally:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, blocked)
        return pid

    def child(self, request: dict[str, Any], fds: list[int], mask: Any) -> None:
        """In the forked child: become a keeper exactly as a fresh one starts."""
        code = 1
        try:
            # The signal state this interpreter started with, i.e. what a keeper exec'd by
            # the same client would start with: SIGCHLD as it was, no wakeup fd, the mask the
            # server runs with (it blocks signals only across the fork).
            _signal.set_wakeup_fd(-1)
            _signal.signal(_signal.SIGCHLD, self.sigchld)
            _signal.pthread_sigmask(_signal.SIG_SETMASK, mask)
            posix.setsid()
            _place_fds(fds, [int(n) for n in request["fds"]], self.devnull)
            posix.chdir(str(request["cwd"]))
            _set_environ({str(k): str(v) for k, v in request["env"].items()})
            code = self.keeper["main"]([self.keeper["__file__"], str(request["spec"])])
        except SystemExit as end:
            code = end.code if isinstance(end.code, int) else 1
        except BaseException:
            try:
                sys.excepthook(*sys.exc_info())  # the traceback a fresh keeper would print
            except BaseException:  # noqa: S110 - nothing may escape a forked child
                pass
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: S110
            pass
        posix._exit(code if isinstance(code, int) else 1)

    def close(self) -> None:
        """Remove the socket and its directory (empty then), so a client that died without
        closing leaves nothing behind."""
        for remove, path in ((posix.unlink, self.path), (posix.rmdir, self.directory)):
            try:
                remove(path)
            except OSError:
                pass


def _peer(conn: _socket.socket) -> tuple[int, int, int]:
    raw = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)
    order = sys.byteorder
    return (
        int.from_bytes(raw[0:4], order, signed=True),
        int.from_bytes(raw[4:8], order, signed=True),
        int.from_bytes(raw[8:12], order, signed=True),
    )


def _receive(conn: _socket.socket, loads: Any) -> tuple[dict[str, Any], list[int]]:
    """The request and its descriptors (already ours, close-on-exec)."""
    data, ancillary, flags, _addr = conn.recvmsg(
        MAX_REQUEST, _socket.CMSG_SPACE(MAX_FDS * 4), _socket.MSG_CMSG_CLOEXEC
    )
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds += [
                int.from_bytes(payload[i : i + 4], sys.byteorder, signed=True)
                for i in range(0, usable, 4)
            ]
    try:
        if flags & (_socket.MSG_TRUNC | _socket.MSG_CTRUNC):
            raise ValueError("truncated")
        if not data:
            raise ValueError("empty")
        request = loads(data.decode())
        targets = request.get("fds")
        if (
            not isinstance(targets, list)
            or len(targets) != len(fds)
            or len(set(targets)) != len(targets)
            or not all(isinstance(n, int) and n >= 0 for n in targets)
            or not isinstance(request.get("env"), dict)
            or not isinstance(request.get("spec"), str)
            or not isinstance(request.get("cwd"), str)
        ):
            raise ValueError("malformed")
    except BaseException:
        for fd in fds:
            _close(fd)
        raise
    return request, fds


def _catchable() -> set[int]:
    return set(_signal.valid_signals()) - {_signal.SIGKILL, _signal.SIGSTOP}


def _place_fds(fds: list[int], targets: list[int], devnull: int) -> None:
    """Each passed descriptor at its number (inheritable, as ``pass_fds`` leaves them), stdio
    not passed on /dev/null, and every other descriptor closed."""
    import fcntl  # loaded once in the server

    floor = max([*targets, 2]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in fds]
    for fd, target in zip(moved, targets, strict=True):
        posix.dup2(fd, target, True)
    for std in (0, 1, 2):
        if std not in targets:
            posix.dup2(devnull, std, True)
    keep = sorted({0, 1, 2, *targets})
    for low, high in zip(keep, [*keep[1:], None], strict=True):
        if high is None:
            posix.closerange(low + 1, posix.sysconf("SC_OPEN_MAX"))
        elif high > low + 1:
            posix.closerange(low + 1, high)


def _set_environ(env: dict[str, str]) -> None:
    """The keeper's environment, as the exec of a fresh keeper would have set it."""
    for key in list(posix.environ):
        name = key.decode(errors="surrogateescape")
        if name not in env:
            posix.unsetenv(name)
            del posix.environ[key]
    for name, value in env.items():
        posix.putenv(name, value)
        posix.environ[name.encode(errors="surrogateescape")] = value.encode(
            errors="surrogateescape"
        )


def _readable_data(fd: int) -> bool:
    """False at EOF (the client closed its end); the client never writes."""
    try:
        return bool(posix.read(fd, 64))
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False


def _drain(fd: int) -> None:
    while True:
        try:
            if not posix.read(fd, 256):
                return
        except (BlockingIOError, InterruptedError):
            return


def _close(fd: int) -> None:
    try:
        posix.close(fd)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    """``server.py KEEPER DIR CLIENT_PID``: load the keeper, listen on ``DIR/sock``, say so
    on stdout."""
    if len(argv) != 4:
        sys.stderr.write("usage: server.py KEEPER DIR CLIENT_PID\n")
        return 2
    keeper = load_keeper(argv[1])
    server = Server(keeper, argv[2], int(argv[3]))
    try:
        # Listening: tell the client, then let go of the pipe that said so.
        posix.write(1, b"%d\n" % posix.getpid())
        posix.dup2(server.devnull, 1)
        return server.serve()
    finally:
        server.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
