"""The keeper: one small process per session that owns a worker's output and writes its end.

Run as ``<python> -I -S registry/keeper/program.py <spec.json>`` (never imported by the
registry). It lives in the worker's scope, so the worker's output and exit status survive
whoever launched it. What it does, in order:

1. reads its spec and opens the stdin FIFO (nothing is changed by that), then honours the
   scope gate (``DISPATCH_SCOPE_GATE_FD``: read one byte; ``b"1"`` = go, anything else or EOF
   = exit at once, before touching anything);
2. ``setsid``; waits on the record gate (``record_fd`` in the spec: ``b"1"`` once the
   launcher stored the keeper's pid in the session's row; EOF = the launcher ended first: exit
   at once, as at the scope gate); ignores SIGPIPE, SIGXFSZ and (until its handler is up)
   SIGHUP, so neither the launcher going away nor a full disk can kill it, and clears the
   signal mask it inherited;
3. starts the worker in its own process group (pipe mode) or on a new PTY (PTY mode, where
   the worker leads its own session), with every signal at its default disposition and an
   empty signal mask (as systemd starts a service); a worker that cannot start yields an exit
   record with state ``failed_start`` and the reason. Its files come after the fork: the log
   while the worker execs, then (after telling the launcher who runs, through the ready pipe)
   ``keeper.json``, the exit record's reserved space and ``output.times``; the worker's start
   waits for no file system work, and its output waits in its pipe meanwhile;
4. appends every output byte to ``output.log`` (head kept up to the cap, the rest counted and
   dropped behind one marker line; bytes lost to a full disk are counted and marked when the
   disk accepts writes again), and notes in ``output.times`` when output arrived: a line
   ``OFFSET SECONDS`` (log offset, wall time) before new output, at most every
   :data:`TIME_STEP` seconds, so ``dispatch logs --since/--timestamps`` can place lines in time;
5. forwards SIGTERM/SIGINT/SIGHUP to the worker's group and enforces the session timeout itself
   (SIGTERM, grace, SIGKILL; inside its own scope also every other pid of its cgroup); under a
   runtime_max a forwarded SIGTERM is followed by SIGKILL after the same grace (the manager's
   own escalation would kill the keeper too, before its record);
 6. writes ``exit.json`` (temp + fsync + rename, space reserved before any output is read, so
    a full disk cannot stop it) as soon as the direct child exits, with its scope's counters
    and, under a runtime_max, the unit's ``Result`` asked of the manager while the keeper
    still holds the scope (``timeout``: the manager stopped it at ``RuntimeMaxSec=``); then
    keeps capturing what descendants still write until EOF or the drain bound, and rewrites
    the record once more if bytes arrived;
7. in PTY mode answers the terminal queries a worker may block on (:class:`TermResponder`)
   and keeps them out of the log.

Start-up is a benchmark figure (against ``python -I -S -c pass``), so the imports are C modules
only: ``posix`` rather than ``os`` (whose import pulls in several Python modules), ``_signal``
rather than ``signal`` (which imports ``enum``) and ``_json``'s scanner and string encoder rather
than ``json`` (which imports ``re``). The registry side reads and writes the same files with the
ordinary modules (see :mod:`registry.keeper.files`).
"""

# contextlib.suppress would import contextlib (and collections, functools) into a process whose
# start-up is measured; plain try/except is used instead.
# ruff: noqa: SIM105

from __future__ import annotations

import _json
import _signal
import errno
import posix
import select
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is a slow import; annotations are strings (PEP 563) anyway
    from typing import Any

FORMAT = 1
GATE_ENV = b"DISPATCH_SCOPE_GATE_FD"
CHUNK = 256 * 1024
"""Bytes per read() (PTY mode, or to count bytes the log cannot take)."""
SPLICE_CHUNK = 1024 * 1024
PIPE_SIZE = 1024 * 1024
RESERVE = 4096
"""Bytes reserved for the exit record at start (overwritten in place at the end)."""
STDIN_BUFFER_MAX = 1024 * 1024
DISK_ERRORS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
TIME_STEP = 0.05
"""Seconds between two entries of ``output.times`` (output in between shares the earlier one)."""
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
UNIT_ENV = b"DISPATCH_SCOPE_UNIT"
SYSTEMCTL_ENV = b"DISPATCH_SCOPE_SYSTEMCTL"
MANAGER_ENV = b"DISPATCH_SCOPE_MANAGER"
"""Set by the scope layer when our scope has a runtime_max (scope/abc.py: manager_env)."""
RESULT_BOUND = 3.0
"""Seconds to wait for the manager's answer about our unit (a scope's stop allows 90 s)."""
_ALIASES = {"SIGIOT", "SIGCLD", "SIGPOLL"}


# -- JSON without the json package --------------------------------------------------------------


class _ScanContext:
    """What ``_json.make_scanner`` reads from a decoder object."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict[str, str] = {}  # the scanner keeps its own memo

    @staticmethod
    def parse_constant(name: str) -> Any:
        raise ValueError(f"unsupported JSON constant {name}")


def loads(text: str) -> Any:
    """Parse one JSON document (the spec)."""
    scan = _json.make_scanner(_ScanContext())  # type: ignore[arg-type]
    try:
        value, end = scan(text, 0)
    except (StopIteration, SystemError) as err:
        # _json reports some malformed input without its Python-level error class loaded.
        raise ValueError(f"malformed JSON ({type(err).__name__})") from None
    if text[end:].strip():
        raise ValueError("trailing data after the JSON document")
    return value


def dumps(value: Any) -> str:
    """Encode None, bools, ints, finite floats, strings, lists and str-keyed dicts."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return (
            repr(value) if value == value and value not in (float("inf"), -float("inf")) else "null"
        )
    if isinstance(value, str):
        return str(_json.encode_basestring_ascii(value))
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{dumps(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot encode {type(value).__name__}")


# -- small helpers ------------------------------------------------------------------------------


def signal_name(number: int) -> str:
    """``SIGTERM`` for 15; realtime signals as ``SIGRTMIN+N``."""
    for name in dir(_signal):
        if (
            name.startswith("SIG")
            and not name.startswith(("SIG_", "SIGRT"))
            and name not in _ALIASES
            and getattr(_signal, name) == number
        ):
            return name
    rtmin = getattr(_signal, "SIGRTMIN", 34)
    if number >= rtmin:
        return f"SIGRTMIN+{number - rtmin}"
    return f"SIG{number}"


def start_time(pid: int | str) -> int | None:
    """Kernel start time (field 22 of /proc/PID/stat), None when the process is gone."""
    try:
        fd = posix.open(f"/proc/{pid}/stat", posix.O_RDONLY)
    except OSError:
        return None
    try:
        data = posix.read(fd, 4096)
    finally:
        posix.close(fd)
    return int(data[data.rindex(b")") + 2 :].split()[19])


def write_all(fd: int, data: bytes) -> int:
    """Write everything; returns the count written before an error (which is re-raised)."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += posix.write(fd, view[done:])
    return done


def write_atomic(path: str, text: str, *, sync: bool) -> None:
    """temp + (fsync) + rename; the temp name is private to this keeper."""
    tmp = f"{path}.tmp"
    fd = posix.open(tmp, posix.O_WRONLY | posix.O_CREAT | posix.O_TRUNC, 0o600)
    try:
        write_all(fd, text.encode())
        if sync:
            posix.fsync(fd)
    finally:
        posix.close(fd)
    posix.rename(tmp, path)


def reserve(path: str, size: int) -> int:
    """Create ``path`` holding ``size`` allocated bytes; -1 when even that failed."""
    try:
        fd = posix.open(path, posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC, 0o600)
    except OSError:
        return -1
    try:
        write_all(fd, b" " * size)
    except OSError:
        pass  # the disk is already full: the record may still fit later
    return fd


def fill_reserved(fd: int, tmp: str, path: str, data: bytes, *, sync: bool) -> None:
    """Publish ``data`` as ``path``: overwrite the reserved ``tmp`` in place (no new blocks
    needed), truncate, (fsync,) rename. Without a reservation, a plain atomic write."""
    if fd < 0 or len(data) > RESERVE:
        if fd >= 0:
            posix.close(fd)
        write_atomic(path, data.decode(), sync=sync)
        return
    try:
        posix.lseek(fd, 0, 0)
        write_all(fd, data)
        posix.ftruncate(fd, len(data))
        if sync:
            posix.fsync(fd)
    finally:
        posix.close(fd)
    posix.rename(tmp, path)


def fsync_dir(path: str) -> None:
    """Make a rename in ``path`` durable (best effort)."""
    try:
        fd = posix.open(path, posix.O_RDONLY)
    except OSError:
        return
    try:
        posix.fsync(fd)
    except OSError:
        pass
    finally:
        posix.close(fd)


# -- terminal queries (PTY mode) ----------------------------------------------------------------

ESC = 0x1B
HOLD_MAX = 64
"""A partial escape sequence at the end of a read is held back (up to this many bytes) until
the next read completes it; a longer one cannot be a query and is passed through."""
LINE_MAX = 4096
"""Bytes of the current output line kept for cursor tracking."""
QUERY_MARKS = (b"5n", b"6n", b"18t", b"$p", b"[c", b"[0c", b"[>c", b"[>0c")
"""Every query contains one of these: a read without any is passed on without parsing its
escape sequences one by one (colour-heavy output stays fast)."""


class TermResponder:
    """Answers terminal queries in a PTY worker's output, as a terminal would, and strips them.

    Without answers, programs that ask the terminal something (a cursor position before
    drawing, device attributes to pick features) block forever, since nobody is at the other
    end. Answered: device status ``ESC[5n`` (``ESC[0n``), cursor position ``ESC[6n``
    (``ESC[<row>;<col>R``; also ``ESC[?6n``), window size ``ESC[18t`` (``ESC[8;<rows>;<cols>t``),
    DEC private and ANSI mode queries ``ESC[?N$p``/``ESC[N$p`` (``ESC[?N;0$y``: not
    recognised), primary device attributes ``ESC[c``/``ESC[0c`` (``ESC[?1;2c``, a VT100 with
    advanced video) and secondary ``ESC[>c`` (``ESC[>0;10;0c``). Everything else passes.

    The cursor is *tracked plausibly*, not emulated: the row counts line feeds (clamped to the
    screen); the column is computed when asked, from the output since the last CR or LF
    (printed characters advance it, wrapping at the width; the motion sequences
    ``CSI H f A B C D E F G d s u`` and ``ESC 7``/``ESC 8`` on that line are applied). A
    full-screen program that depends on exact answers after complex drawing may get an
    approximate one; a line-oriented program asking where its prompt ends gets the truth.
    """

    def __init__(self, rows: int, cols: int, size: Any = None) -> None:
        self.rows = max(1, rows)
        self.cols = max(1, cols)
        self._size = size
        self.row = 1
        """Row of the start of the current line."""
        self.line = b""
        """Output since the last CR or LF (the end of it, at most LINE_MAX bytes)."""
        self.held = b""

    def feed(self, data: bytes) -> tuple[bytes, bytes]:
        """Output bytes -> (bytes for the log, reply bytes for the terminal's input)."""
        if self.held:
            data = self.held + data
            self.held = b""
        if b"\x1b" not in data:
            self._advance(data)
            return data, b""
        last = data.rfind(b"\x1b")
        if len(data) - last <= HOLD_MAX and _csi_end(data, last) < 0:
            self.held = data[last:]  # completed (or given up) by the next read
            data = data[:last]
        for mark in QUERY_MARKS:
            if mark in data:
                return self._scan(data)
        self._advance(data)
        return data, b""

    def flush(self) -> bytes:
        """End of stream: a held-back partial sequence is ordinary output after all."""
        held, self.held = self.held, b""
        self._advance(held)
        return held

    def _scan(self, data: bytes) -> tuple[bytes, bytes]:
        out = bytearray()
        replies = bytearray()
        pos = i = 0
        while True:
            j = data.find(b"\x1b", i)
            if j < 0:
                break
            end = _csi_end(data, j)
            if end <= 0:
                i = j + 1
                continue
            if data[end - 1] in b"ntpc":
                piece = data[pos:j]
                self._advance(piece)
                out += piece
                pos = j
                answer = self._answer(data[j:end])
                if answer is not None:
                    replies += answer
                    pos = end  # answered: not part of the log
            i = end
        piece = data[pos:]
        self._advance(piece)
        out += piece
        return bytes(out), bytes(replies)

    def _answer(self, seq: bytes) -> bytes | None:
        body, final = seq[2:-1], seq[-1:]
        if final == b"n":
            if body == b"5":
                return b"\x1b[0n"
            if body in (b"6", b"?6"):
                row, col = self.position()
                return b"\x1b[" + body[:-1] + b"%d;%dR" % (row, col)
        elif final == b"t" and body == b"18":
            rows, cols = self._window()
            return b"\x1b[8;%d;%dt" % (rows, cols)
        elif final == b"p" and body.endswith(b"$") and body[:-1].lstrip(b"?").isdigit():
            return b"\x1b[" + body[:-1] + b";0$y"
        elif final == b"c":
            if body in (b"", b"0"):
                return b"\x1b[?1;2c"
            if body in (b">", b">0"):
                return b"\x1b[>0;10;0c"
        return None

    def _window(self) -> tuple[int, int]:
        if self._size is not None:
            try:
                import termios  # already loaded in PTY mode

                rows, cols = termios.tcgetwinsize(self._size)
                if rows > 0 and cols > 0:
                    self.rows, self.cols = rows, cols
            except (OSError, ImportError):
                pass
        return self.rows, self.cols

    def _advance(self, data: bytes) -> None:
        if not data:
            return
        cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if cut < 0:
            self.line = (self.line + data)[-LINE_MAX:]
            return
        feeds = data.count(b"\n")
        if feeds:
            self.row = min(self.rows, self.row + feeds)
        self.line = data[cut + 1 :][-LINE_MAX:]

    def position(self) -> tuple[int, int]:
        """The tracked cursor position (1-based row and column)."""
        row, col = self.row, 1
        saved = (row, col)
        line = self.line
        i, n = 0, len(line)
        while i < n:
            j = line.find(b"\x1b", i)
            text = line[i:] if j < 0 else line[i:j]
            if text:
                col += len(text.decode("utf-8", "replace"))
                if col > self.cols:
                    row += (col - 1) // self.cols
                    col = (col - 1) % self.cols + 1
            if j < 0:
                break
            end = _csi_end(line, j)
            if end <= 0:
                byte = line[j + 1] if j + 1 < n else 0
                if byte == 0x37:  # ESC 7: save
                    saved = (row, col)
                elif byte == 0x38:  # ESC 8: restore
                    row, col = saved
                elif byte == 0x63:  # ESC c: reset
                    row, col = 1, 1
                i = j + 2
                continue
            row, col, saved = _motion(line[j:end], row, col, saved)
            i = end
        return min(max(row, 1), self.rows), min(max(col, 1), self.cols)


def _motion(
    seq: bytes, row: int, col: int, saved: tuple[int, int]
) -> tuple[int, int, tuple[int, int]]:
    """The cursor after one CSI sequence (only motions change it)."""
    final = seq[-1:]
    body = seq[2:-1]
    if body[:1] in (b"?", b">", b"<", b"=") or final not in b"HfABCDEFGdsu":
        return row, col, saved
    try:
        args = [int(p) if p else 0 for p in body.split(b";")] if body else []
    except ValueError:
        return row, col, saved
    first = args[0] if args and args[0] > 0 else 1
    if final in (b"H", b"f"):
        row, col = first, args[1] if len(args) > 1 and args[1] > 0 else 1
    elif final == b"A":
        row -= first
    elif final == b"B":
        row += first
    elif final == b"C":
        col += first
    elif final == b"D":
        col -= first
    elif final == b"E":
        row, col = row + first, 1
    elif final == b"F":
        row, col = row - first, 1
    elif final == b"G":
        col = first
    elif final == b"d":
        row = first
    elif final == b"s":
        saved = (row, col)
    elif final == b"u":
        row, col = saved
    return row, col, saved


def _csi_end(data: bytes, start: int) -> int:
    """For the ESC at ``start``: the index after a complete CSI sequence, -1 when the data ends
    inside it, 0 when it is not a CSI sequence."""
    n = len(data)
    if start + 1 >= n:
        return -1
    if data[start + 1] != 0x5B:  # '['
        return 0
    k = start + 2
    while k < n:
        byte = data[k]
        if 0x20 <= byte <= 0x3F:  # parameter and intermediate bytes
            k += 1
            continue
        if 0x40 <= byte <= 0x7E:
            return k + 1
        return 0
    return -1


# -- the keeper ----------------------------------------------------------------------------------


class Keeper:
    """One session's keeper; :meth:`run` is the whole life of the process."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.argv: list[str] = [str(a) for a in spec["argv"]]
        self.env: dict[str, str] = {str(k): str(v) for k, v in spec["env"].items()}
        self.pty = bool(spec.get("pty"))
        self.cap = int(spec["max_log_bytes"])
        self.timeout: float | None = spec.get("timeout")
        self.grace = float(spec.get("kill_grace", 2.0))
        self.drain = float(spec.get("drain_time", 5.0))
        self.dir = str(spec["dir"])
        self.log_path = f"{self.dir}/output.log"
        self.times_path = f"{self.dir}/output.times"
        self.exit_path = f"{self.dir}/exit.json"
        self.usage: dict[str, Any] = {}
        """What the worker used (see :func:`cgroup_usage`; ``cpu_time`` from ``wait4``)."""
        self.info_path = f"{self.dir}/keeper.json"
        self.fifo_path = f"{self.dir}/stdin"
        self.session = str(spec.get("session", ""))
        self.ready_fd: int | None = spec.get("ready_fd")
        self.record_fd: int | None = spec.get("record_fd")
        # Counters of worker output.
        self.total = 0
        self.stored = 0
        self.dropped = 0
        self.disk_lost = 0
        self.disk_marked = 0
        self.cap_marked = False
        # Process facts.
        self.worker_pid = 0
        self.worker_start: int | None = None
        self.started_at = 0.0
        self.finished_at: float | None = None
        self.status: int | None = None
        self.timed_out = False
        self.timeout_signal: int | None = None
        self.unit_result: str | None = None
        """Our scope's ``Result`` when the worker ended (only asked under a runtime_max)."""
        self.forwarded: list[str] = []
        self.stop_requested = False
        self.stop_kill_at: float | None = None
        """Under a runtime_max: when the worker of a SIGTERM still running is SIGKILLed. The
        manager's stop waits 90 s and then kills us too, before any record could be written."""
        self.recorded_total = -1
        # Descriptors.
        self.log_fd = -1
        self.log_pos = 0
        self.times_fd = -1
        self.timed_pos = -1
        self.timed_at = 0.0
        self.splice = False
        self.out_fd = -1
        self.fifo_fd = -1
        self.reserve_fd = -1
        self.exec_report = -1
        self.wake_r = -1
        self.wake_w = -1
        self.pending_stdin = b""
        self.responder: TermResponder | None = None

    # -- start -----------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Signals: what the keeper needs before its worker starts. Nothing is created here:
        the keeper's files come after the worker started (:meth:`open_log`,
        :meth:`open_records`), so a worker's start waits for no file system work."""
        for sig in (_signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGHUP):
            _signal.signal(sig, _signal.SIG_IGN)
        if self.ready_fd is not None:
            # Handed down inheritable (pass_fds, or the fork server's dup2): the worker must
            # not inherit the launcher's pipe.
            try:
                posix.set_inheritable(self.ready_fd, False)
            except OSError:
                self.ready_fd = None
        self.wake_r, self.wake_w = posix.pipe()
        posix.set_blocking(self.wake_r, False)
        posix.set_blocking(self.wake_w, False)
        _signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        for sig in (_signal.SIGCHLD, _signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
            # The handler does nothing: the signal number arrives through the wakeup pipe, which
            # also interrupts poll() (PEP 475 would otherwise resume it).
            _signal.signal(sig, _noop)
        # A launcher that blocks signals passes its mask on through exec: unblock, or SIGCHLD
        # and the stop signals would never reach the handlers above.
        _signal.pthread_sigmask(_signal.SIG_SETMASK, [])

    def recorded(self) -> bool:
        """The record gate: True once the launcher stored who this keeper is; False (EOF:
        the launcher ended first) means exit without starting anything. A worker never runs
        behind a draft row that a restarted dispatcher would take for "nothing started"."""
        fd = self.record_fd
        if fd is None:
            return True
        self.record_fd = None
        return _go(fd)  # closed there: the worker must not inherit it

    def open_stdin(self) -> None:
        """The stdin FIFO's keeper handle (read and write: the worker never sees EOF, and
        writers from any process reach it); before the gate, as it changes nothing."""
        try:
            self.fifo_fd = posix.open(self.fifo_path, posix.O_RDWR | posix.O_NONBLOCK)
        except OSError:
            self.fifo_fd = -1

    def open_log(self) -> None:
        """The log, once the worker was forked (its output waits in the pipe, byte for byte,
        and ``keeper.json`` never names a session without one)."""
        # Not O_APPEND: splice() refuses append-mode targets. We are the log's only writer
        # and keep the position ourselves.
        try:
            self.log_fd = posix.open(self.log_path, posix.O_WRONLY | posix.O_CREAT, 0o600)
        except OSError:
            # No log, no keeper: the worker must not run on unrecorded (the registry reports
            # the session lost, with this traceback from keeper.err).
            if self.worker_pid and self.status is None:
                self.signal_group(_signal.SIGKILL)
                posix.waitpid(self.worker_pid, 0)
            raise
        self.log_pos = self.stored = posix.fstat(self.log_fd).st_size

    def open_records(self) -> None:
        """The exit record's reserved space and the times file: after the launcher was told
        the worker runs, before any output is read (a worker whose output fills the disk
        cannot take the record's space)."""
        if self.reserve_fd < 0:
            self.reserve_fd = reserve(f"{self.exit_path}.tmp", RESERVE)
        try:
            self.times_fd = posix.open(
                self.times_path, posix.O_WRONLY | posix.O_CREAT | posix.O_APPEND, 0o600
            )
        except OSError:
            self.times_fd = -1  # times are a convenience; the log does not depend on them

    def fork_worker(self) -> None:
        """Fork the worker, which execs at once; :meth:`worker_started` says whether it did.

        A plain fork: ``posix_spawn`` would be a tenth of the cost, but glibc's leaves its
        two internal realtime signals ignored in the child (2.36), and the worker must start
        with every disposition at its default; CPython's own C child (``_posixsubprocess``)
        forks too before 3.12 and measured no faster here."""
        err_r, err_w = posix.pipe()
        child_fds: list[int] = []
        if self.pty:
            import termios

            master, slave = posix.openpty()
            rows = int(self.spec.get("pty_rows") or 24)
            cols = int(self.spec.get("pty_cols") or 80)
            try:
                termios.tcsetwinsize(slave, (rows, cols))
            except (OSError, termios.error):
                pass
            self.out_fd, child_fds = master, [slave]
            self.responder = TermResponder(rows, cols, master)
        else:
            out_r, out_w = posix.pipe()
            _grow_pipe(out_r)
            stdin_fd = self._worker_stdin()
            self.out_fd, child_fds = out_r, [out_w, stdin_fd]
            self.splice = hasattr(posix, "splice")
        blocked = _signal.pthread_sigmask(_signal.SIG_BLOCK, _all_signals())
        try:
            pid = posix.fork()
            if pid == 0:
                self._child(err_w, child_fds)  # never returns
            self.worker_pid = pid
        finally:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, blocked)
        self.started_at = time.time()
        if not self.pty:
            try:
                posix.setpgid(pid, pid)
            except OSError:
                pass  # the child did it first (or already exec'ed, which implies it did)
        self.worker_start = start_time(pid)
        for fd in (err_w, *child_fds):
            posix.close(fd)
        self.exec_report = err_r
        posix.set_blocking(self.out_fd, False)

    def worker_started(self) -> str | None:
        """Wait until the worker exec'd; the reason it could not start, else None."""
        failure = _read_all(self.exec_report)
        posix.close(self.exec_report)
        self.exec_report = -1
        if failure:
            _, status = posix.waitpid(self.worker_pid, 0)
            self.status = status
            self.finished_at = time.time()
            return _describe_failure(failure, self.argv[0], str(self.spec["cwd"]))
        return None

    def _worker_stdin(self) -> int:
        """Pipe mode: the worker reads the FIFO itself (the keeper's O_RDWR handle keeps a
        writer open, so the worker never sees EOF and writers from any process reach it)."""
        if self.fifo_fd < 0:
            return posix.open("/dev/null", posix.O_RDONLY)
        fd = posix.open(self.fifo_path, posix.O_RDONLY | posix.O_NONBLOCK)
        posix.set_blocking(fd, True)
        return fd

    def _child(self, err_w: int, fds: list[int]) -> None:
        """In the forked child: become the worker, or report why not and exit 127."""
        try:
            _default_signals()
            if self.pty:
                posix.login_tty(fds[0])
            else:
                posix.setpgid(0, 0)
                posix.dup2(fds[1], 0)
                posix.dup2(fds[0], 1)
                posix.dup2(fds[0], 2)
            try:
                posix.chdir(str(self.spec["cwd"]))
            except OSError as err:
                posix.write(err_w, f"cwd:{err.errno}".encode())
                posix._exit(127)
            err_no = _exec_search(self.argv, self.env)
            posix.write(err_w, f"exec:{err_no}".encode())
        except BaseException as err:  # nothing may escape a forked child
            try:
                posix.write(err_w, f"other:{type(err).__name__}: {err}".encode())
            except BaseException:  # noqa: S110
                pass
        posix._exit(127)

    def info(self) -> dict[str, Any]:
        """Who runs: the document of ``keeper.json``."""
        return {
            "version": FORMAT,
            "session": self.session,
            "keeper_pid": posix.getpid(),
            "keeper_start": start_time("self"),
            "unit_result": self.unit_result,
            "worker_pid": self.worker_pid,
            "worker_start": self.worker_start,
            "started_at": self.started_at,
            "pty": self.pty,
        }

    def publish_start(self, info: dict[str, Any]) -> None:
        """keeper.json: who runs (written once the worker runs)."""
        try:
            write_atomic(self.info_path, dumps(info), sync=False)
        except OSError:
            pass  # no keeper.json: the registry still has our pid and finds the worker by marker

    def signal_ready(self, info: dict[str, Any] | None = None) -> None:
        """Tell the launcher (if it gave us a pipe): ``b"1"``, then who runs (the
        ``keeper.json`` document, written next) when the worker started, else nothing more
        (``exit.json`` exists then). One write, so it arrives whole."""
        if self.ready_fd is None:
            return
        try:
            posix.write(self.ready_fd, b"1" + (dumps(info).encode() if info else b""))
        except OSError:
            pass
        try:
            posix.close(self.ready_fd)
        except OSError:
            pass
        self.ready_fd = None

    # -- output ----------------------------------------------------------------------------------

    def store(self, data: bytes) -> None:
        """Append worker output to the log under the cap; count what cannot be kept."""
        self.total += len(data)
        if self.disk_lost > self.disk_marked:
            self._mark_disk_loss()
        room = self.cap - self.stored
        keep = data if len(data) <= room else data[: max(room, 0)]
        if keep:
            self.stored += self._append(keep)
        if len(keep) < len(data):
            self.dropped += len(data) - len(keep)
            if not self.cap_marked:
                self.cap_marked = True
                marker = (
                    f"\n[dispatch: log cap of {self.cap} bytes reached; later output is "
                    "counted and dropped]\n"
                )
                self._append(marker.encode(), count_loss=False)

    def _append(self, data: bytes, *, count_loss: bool = True) -> int:
        """Write to the log; on a full disk count the loss and return what got through."""
        view = memoryview(data)
        done = 0
        while done < len(view):
            try:
                wrote = posix.pwrite(self.log_fd, view[done:], self.log_pos)
                done += wrote
                self.log_pos += wrote
            except OSError as err:
                if err.errno not in DISK_ERRORS:
                    raise
                if count_loss:
                    self.disk_lost += len(view) - done
                break
        return done

    def _mark_disk_loss(self) -> None:
        lost = self.disk_lost - self.disk_marked
        marker = f"\n[dispatch: {lost} bytes of output lost: the disk was full]\n".encode()
        start = self.log_pos
        if self._append(marker, count_loss=False) == len(marker):
            self.disk_marked = self.disk_lost
        elif self.log_pos != start:
            # Half a marker is noise: take it back and try again with the next output.
            self.log_pos = start
            try:
                posix.ftruncate(self.log_fd, start)
            except OSError:
                pass

    def note_time(self) -> None:
        """Note in ``output.times`` that output starting at the log's end arrives now (at most
        every :data:`TIME_STEP` seconds; a full disk only costs the note)."""
        now = time.time()
        if self.times_fd < 0 or self.log_pos == self.timed_pos or now - self.timed_at < TIME_STEP:
            return
        try:
            posix.write(self.times_fd, f"{self.log_pos} {now:.3f}\n".encode())
        except OSError:
            return
        self.timed_pos, self.timed_at = self.log_pos, now

    def read_output(self, limit: int = 1 << 62) -> bool:
        """Capture what is available (up to ``limit`` bytes); False once the output hit EOF."""
        got = 0
        self.note_time()
        while got < limit:
            if self.splice and self.cap > self.stored and not self.disk_lost > self.disk_marked:
                moved = self._splice(min(SPLICE_CHUNK, self.cap - self.stored))
                if moved is None:
                    return True
                if moved > 0:
                    got += moved
                    continue
                if moved == 0:
                    return False
                # moved < 0: the log refused (full disk); read the bytes to count them
            try:
                data = posix.read(self.out_fd, CHUNK)
            except BlockingIOError:
                return True
            except OSError as err:
                if err.errno == errno.EIO:  # PTY: every slave handle is closed
                    self.end_output()
                    return False
                raise
            if not data:
                self.end_output()
                return False
            got += len(data)
            if self.responder is not None:
                data, replies = self.responder.feed(data)
                if replies:
                    self.reply(replies)
            if data:
                self.store(data)
        return True

    def end_output(self) -> None:
        """The output ended: a partial escape sequence held back is ordinary output."""
        if self.responder is not None:
            held = self.responder.flush()
            if held:
                self.store(held)

    def reply(self, data: bytes) -> None:
        """Answer a terminal query: write to the PTY master (the worker's input), after any
        stdin still buffered, so the bytes arrive in order."""
        if not self.pending_stdin:
            try:
                data = data[posix.write(self.out_fd, data) :]
            except BlockingIOError:
                pass
            except OSError:
                return  # the terminal is gone
        self.pending_stdin += data

    def _splice(self, count: int) -> int | None:
        """Move pipe bytes into the log in the kernel (pipe mode): the count, 0 at EOF, None
        when nothing is there now, -1 when the log cannot take them (the caller reads)."""
        try:
            moved = posix.splice(
                self.out_fd,
                self.log_fd,
                count,
                offset_dst=self.log_pos,
                flags=posix.SPLICE_F_MOVE | posix.SPLICE_F_NONBLOCK,
            )
        except BlockingIOError:
            return None
        except OSError as err:
            if err.errno in DISK_ERRORS:
                return -1
            if err.errno == errno.EINVAL:
                self.splice = False  # a filesystem without splice support: plain copies
                return -1
            raise
        self.total += moved
        self.stored += moved
        self.log_pos += moved
        return moved

    # -- signals -----------------------------------------------------------------------------

    def take_signals(self) -> list[int]:
        """Signal numbers that arrived since the last call."""
        got: list[int] = []
        while True:
            try:
                data = posix.read(self.wake_r, 256)
            except BlockingIOError:
                return got
            if not data:
                return got
            got.extend(data)

    def signal_group(self, sig: int) -> None:
        """Signal the worker's process group (its pid is the group id in both modes).

        Once the worker is reaped its pid may belong to a stranger: then the group is only
        signalled while no process holds that pid (a group id cannot be reused while the
        group has members, and a free pid cannot lead a group)."""
        current = start_time(self.worker_pid)
        if current is not None and current != self.worker_start:
            return
        try:
            posix.killpg(self.worker_pid, sig)
        except OSError:
            pass

    def signal_cgroup(self, sig: int) -> None:
        """Inside our own scope: signal every other process of its cgroup."""
        for pid in _own_scope_pids(self.session):
            if pid == posix.getpid():
                continue
            try:
                pidfd = posix.pidfd_open(pid)
            except OSError:
                continue
            try:
                # The pidfd pins the process; re-check membership so a reused pid is not hit.
                if pid in _own_scope_pids(self.session):
                    _signal.pidfd_send_signal(pidfd, sig)
            except OSError:
                pass
            finally:
                posix.close(pidfd)

    # -- the loop ------------------------------------------------------------------------------

    def end_stubborn(self, now: float) -> None:
        """Under a runtime_max, a worker the manager's SIGTERM has not ended within the kill
        grace (:attr:`stop_kill_at`) is SIGKILLed, as our own timeout would, so the keeper
        lives to write the record."""
        if self.status is None and self.stop_kill_at is not None and now >= self.stop_kill_at:
            self.stop_kill_at = None
            self.signal_group(_signal.SIGKILL)
            self.signal_cgroup(_signal.SIGKILL)

    def run(self) -> int:
        """Capture until the worker ended and the output drained; write the record."""
        mono = time.monotonic
        deadline = None if self.timeout is None else mono() + float(self.timeout)
        escalate_at: float | None = None
        drain_until: float | None = None
        output_open = True
        out_mask = select.POLLIN
        poller = select.poll()
        poller.register(self.out_fd, out_mask)
        poller.register(self.wake_r, select.POLLIN)
        if self.pty and self.fifo_fd >= 0:
            poller.register(self.fifo_fd, select.POLLIN)
        while True:
            now = mono()
            stop_kill = self.stop_kill_at if self.status is None else None
            waits = [t for t in (deadline, escalate_at, drain_until, stop_kill) if t is not None]
            wait_ms = -1 if not waits else max(0, int((min(waits) - now) * 1000) + 1)
            if self.status is None:
                # A SIGCHLD is never lost (the wakeup pipe), but re-check now and then anyway.
                wait_ms = 1000 if wait_ms < 0 else min(wait_ms, 1000)
            for fd, event in poller.poll(wait_ms):
                if fd == self.wake_r:
                    for sig in self.take_signals():
                        self.on_signal(sig)
                elif fd == self.fifo_fd:
                    self.take_stdin(poller)
                elif fd == self.out_fd and output_open:
                    if event & select.POLLOUT:
                        self.flush_stdin(poller)
                    if event & ~select.POLLOUT and not self.read_output(CHUNK * 4):
                        output_open = False
                        poller.unregister(self.out_fd)
            if self.pty and output_open:
                wanted = select.POLLIN | (select.POLLOUT if self.pending_stdin else 0)
                if wanted != out_mask:
                    out_mask = wanted
                    poller.modify(self.out_fd, out_mask)
            if self.status is None:
                self.reap()
                if self.status is not None:
                    if output_open:
                        # What the worker wrote before exiting is in the pipe now: take it all
                        # (bounded, in case a descendant keeps writing) before the record.
                        output_open = self.read_output(CHUNK * 64)
                        if not output_open:
                            poller.unregister(self.out_fd)
                    self.write_record()
                    self.close_stdin(poller)
                    drain_until = mono() + (0.2 if self.stop_requested else self.drain)
                    deadline = None  # a timeout kill in progress still escalates
            now = mono()
            self.end_stubborn(now)
            if escalate_at is not None and now >= escalate_at:
                self.timeout_signal = _signal.SIGKILL
                self.signal_group(_signal.SIGKILL)
                self.signal_cgroup(_signal.SIGKILL)
                escalate_at = None
            if self.status is not None:
                if escalate_at is None and (
                    not output_open or (drain_until is not None and now >= drain_until)
                ):
                    break
                if self.stop_requested and drain_until is not None:
                    drain_until = min(drain_until, now + 0.2)
                continue
            if deadline is not None and now >= deadline:
                self.timed_out = True
                self.timeout_signal = _signal.SIGTERM
                self.signal_group(_signal.SIGTERM)
                self.signal_cgroup(_signal.SIGTERM)
                escalate_at = now + self.grace
                deadline = None
        self.end_output()
        if self.total != self.recorded_total:
            try:
                self.write_record(final=True)
            except OSError:
                pass  # the first record stands
        return 0

    def on_signal(self, sig: int) -> None:
        """SIGCHLD: handled by reap(); the stop signals are forwarded to the worker's group."""
        if sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
            self.forwarded.append(signal_name(sig))
            if sig != _signal.SIGHUP:
                self.stop_requested = True
            if self.status is None:
                self.signal_group(sig)
                if (
                    sig == _signal.SIGTERM
                    and self.stop_kill_at is None
                    and posix.environ.get(UNIT_ENV)
                ):
                    self.stop_kill_at = time.monotonic() + self.grace

    def reap(self) -> None:
        """Collect the worker's status if it ended (never blocks), with what it used."""
        used: dict[str, Any] = {}
        try:
            pid, status, rusage = posix.wait4(self.worker_pid, posix.WNOHANG)
            if pid == self.worker_pid:
                # The worker and the descendants it waited for; ru_maxrss is in KiB.
                used["cpu_time"] = round(rusage.ru_utime + rusage.ru_stime, 3)
                used["max_rss"] = int(rusage.ru_maxrss) * 1024
        except ChildProcessError:
            pid, status = self.worker_pid, 0
        if pid == self.worker_pid:
            self.status = status
            self.finished_at = time.time()
            # Read while the scope still holds its counters (we are in it until we exit).
            self.usage = {**cgroup_usage(self.session), **used}
            self.unit_result = self.stop_result()

    def stop_result(self) -> str | None:
        """Our scope's ``Result`` when the worker may have been stopped by its manager.

        A runtime_max stop signals everything in the scope, us included, and sets the unit's
        ``Result`` to ``timeout`` first; a stop by anyone else leaves it ``success``. Asked
        now, while we still hold the scope (an empty one is collected at once), unless the
        worker exited 0 with no stop signal seen, or our own timeout ended it."""
        for sig in self.take_signals():
            self.on_signal(sig)  # a SIGTERM sent with the worker's may still be pending
        status = self.status or 0
        clean = posix.WIFEXITED(status) and posix.WEXITSTATUS(status) == 0
        if self.timed_out or (clean and "SIGTERM" not in self.forwarded):
            return None
        return unit_result(posix.environ)

    def take_stdin(self, poller: select.poll) -> None:
        """PTY mode: FIFO bytes are buffered for the PTY master (the FIFO pauses when full)."""
        try:
            data = posix.read(self.fifo_fd, 65536)
        except BlockingIOError:
            return
        self.pending_stdin += data
        if len(self.pending_stdin) >= STDIN_BUFFER_MAX:
            poller.unregister(self.fifo_fd)
        self.flush_stdin(poller)

    def flush_stdin(self, poller: select.poll) -> None:
        """Write buffered stdin to the PTY master as far as it accepts it now."""
        if not self.pending_stdin:
            return
        was_full = len(self.pending_stdin) >= STDIN_BUFFER_MAX
        try:
            sent = posix.write(self.out_fd, self.pending_stdin)
        except BlockingIOError:
            sent = 0
        except OSError:
            sent = len(self.pending_stdin)  # the terminal is gone: nobody will read it
        self.pending_stdin = self.pending_stdin[sent:]
        if was_full and len(self.pending_stdin) < STDIN_BUFFER_MAX and self.fifo_fd >= 0:
            poller.register(self.fifo_fd, select.POLLIN)

    def close_stdin(self, poller: select.poll) -> None:
        """The worker is gone: writers to the FIFO get ENXIO from now on."""
        if self.fifo_fd >= 0:
            try:
                poller.unregister(self.fifo_fd)
            except KeyError:
                pass
            posix.close(self.fifo_fd)
            self.fifo_fd = -1
        self.pending_stdin = b""

    # -- the record ------------------------------------------------------------------------------

    def record(self, *, state: str | None = None, reason: str | None = None) -> dict[str, Any]:
        """The exit record as a dict (see registry.keeper.files.ExitRecord)."""
        status = self.status if self.status is not None else 0
        code: int | None = None
        sig: int | None = None
        if posix.WIFSIGNALED(status):
            sig = posix.WTERMSIG(status)
        else:
            code = posix.WEXITSTATUS(status)
        if state is None:
            state = "timed_out" if self.timed_out else "exited"
        elif state == "failed_start":
            code = None  # the 127 is our child's, not a worker's exit code
        if reason is None:
            ended = (
                f"killed by {signal_name(sig)}" if sig is not None else f"exited with code {code}"
            )
            if self.timed_out:
                reason = f"timed out after {_seconds(self.timeout)}; {ended}"
            else:
                reason = ended
        return {
            "version": FORMAT,
            "session": self.session,
            "state": state,
            "exit_code": code,
            "signal": signal_name(sig) if sig is not None else None,
            "signal_number": sig,
            "reason": reason,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "written_at": time.time(),
            "total_bytes": self.total,
            "dropped_bytes": self.dropped + self.disk_lost,
            "disk_lost_bytes": self.disk_lost,
            "forwarded_signals": self.forwarded,
            "timeout_signal": signal_name(self.timeout_signal) if self.timeout_signal else None,
            "unit_result": self.unit_result,
            "worker_pid": self.worker_pid,
            "worker_start": self.worker_start,
            "keeper_pid": posix.getpid(),
            "writer": "keeper",
            "usage": self.usage,
        }

    def write_record(self, *, final: bool = False, **fields: Any) -> None:
        """Write exit.json durably; the first write uses the space reserved at start."""
        record = self.record(**fields)
        record["final"] = final
        data = dumps(record).encode()
        fd, self.reserve_fd = self.reserve_fd, -1
        fill_reserved(fd, f"{self.exit_path}.tmp", self.exit_path, data, sync=True)
        fsync_dir(self.dir)
        self.recorded_total = self.total


def _grow_pipe(fd: int) -> None:
    """A 1 MiB pipe: fewer wake-ups for a fast writer (best effort)."""
    try:
        import fcntl

        fcntl.fcntl(fd, 1031, PIPE_SIZE)  # F_SETPIPE_SZ (Linux)
    except (ImportError, OSError):
        pass


def _noop(signum: int, frame: object) -> None:
    """A Python-level handler so the C handler writes the signal to the wakeup pipe."""


def _all_signals() -> set[int]:
    return set(_signal.valid_signals()) - {_signal.SIGKILL, _signal.SIGSTOP}


def _default_signals() -> None:
    """In the forked worker: every catchable signal back to its default disposition and an
    empty signal mask, as systemd does for its services. A launcher started from a background
    job, ``nohup`` or a non-interactive shell runs with SIGINT/SIGQUIT/SIGHUP ignored, and an
    ignored disposition survives exec; the worker must not inherit that."""
    _signal.set_wakeup_fd(-1)
    for sig in _all_signals():
        try:
            _signal.signal(sig, _signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # reserved by the C library (the realtime signals glibc keeps for itself)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, [])


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        data = posix.read(fd, 4096)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def _seconds(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{int(value)}s" if float(value).is_integer() else f"{value:g}s"


def _exec_search(argv: list[str], env: dict[str, str]) -> int:
    """execve ``argv`` found like execvp would; returns the errno when every try failed."""
    program = argv[0]
    if "/" in program:
        candidates = [program]
    else:
        path = env.get("PATH", DEFAULT_PATH)
        candidates = [f"{d or '.'}/{program}" for d in path.split(":")]
    saved = errno.ENOENT
    for candidate in candidates:
        try:
            posix.execve(candidate, argv, env)
        except OSError as err:
            if err.errno not in (errno.ENOENT, errno.ENOTDIR):
                saved = err.errno or saved
    return saved


def _describe_failure(report: bytes, program: str, cwd: str) -> str:
    kind, _, detail = report.decode(errors="replace").partition(":")
    if kind in ("exec", "cwd") and detail.isdigit():
        message = posix.strerror(int(detail))
        if kind == "cwd":
            return f"cannot change to the working directory {cwd!r}: {message}"
        return f"cannot run {program!r}: {message}"
    return f"cannot start the worker: {detail}"


def _cgroup2_mount() -> str | None:
    try:
        fd = posix.open("/proc/self/mountinfo", posix.O_RDONLY)
    except OSError:
        return None
    try:
        text = _read_all(fd).decode(errors="replace")
    finally:
        posix.close(fd)
    found = None
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if sep and right.split(" ", 1)[0] == "cgroup2":
            fields = left.split()
            if len(fields) > 4 and fields[3] == "/":
                found = fields[4].replace("\\040", " ")
    return found


def _own_scope_pids(session: str) -> list[int]:
    """Pids of our cgroup when it is our own scope (its name carries the session id)."""
    try:
        fd = posix.open("/proc/self/cgroup", posix.O_RDONLY)
    except OSError:
        return []
    try:
        text = _read_all(fd).decode(errors="replace")
    finally:
        posix.close(fd)
    path = next((line[3:] for line in text.splitlines() if line.startswith("0::")), "")
    leaf = path.rsplit("/", 1)[-1]
    token = session.removeprefix("s_")
    if not (leaf.endswith(".scope") and token and token in leaf):
        return []
    mount = _cgroup2_mount()
    if mount is None:
        return []
    try:
        fd = posix.open(f"{mount}{path}/cgroup.procs", posix.O_RDONLY)
    except OSError:
        return []
    try:
        return [int(x) for x in _read_all(fd).split()]
    finally:
        posix.close(fd)


# -- how our scope ended (its manager's word) ---------------------------------------------------


def unit_result(environ: Any, bound: float = RESULT_BOUND) -> str | None:
    """The ``Result`` of the unit named in ``environ`` (:data:`UNIT_ENV`), as its manager
    reports it now through ``systemctl show``; None when not set up to ask, or without an
    answer within ``bound`` seconds (the caller then knows nothing more than before)."""
    unit, tool = environ.get(UNIT_ENV), environ.get(SYSTEMCTL_ENV)
    if not unit or not tool:
        return None
    argv = [tool]
    if environ.get(MANAGER_ENV) != b"system":
        argv.append(b"--user")
    argv += [b"show", b"--property=Result", b"--value", unit]
    env = {b"PATH": DEFAULT_PATH.encode(), b"LC_ALL": b"C"}
    for key in (b"XDG_RUNTIME_DIR", b"DBUS_SESSION_BUS_ADDRESS"):
        if key in environ:
            env[key] = environ[key]
    read_fd, write_fd = posix.pipe()
    try:
        pid = posix.posix_spawn(
            tool,
            argv,
            env,
            file_actions=[
                (posix.POSIX_SPAWN_OPEN, 0, "/dev/null", posix.O_RDONLY, 0),
                (posix.POSIX_SPAWN_DUP2, write_fd, 1),
                (posix.POSIX_SPAWN_OPEN, 2, "/dev/null", posix.O_WRONLY, 0),
            ],
            # The manager's stop signals every pid it finds in the scope until no new one
            # appears: ours may be among them. Blocked, SIGTERM cannot cut the answer short.
            setsigmask=(_signal.SIGTERM,),
            setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGHUP),
        )
    except OSError:
        posix.close(read_fd)
        posix.close(write_fd)
        return None
    posix.close(write_fd)
    deadline = time.monotonic() + bound
    try:
        text = _read_until(read_fd, deadline)
    finally:
        posix.close(read_fd)
    if not _reaped(pid, deadline):
        return None
    answer = text.decode("ascii", "replace").strip()
    return answer if answer and answer.replace("-", "").isalpha() else None


def _read_until(fd: int, deadline: float) -> bytes:
    """What ``fd`` yields until EOF or ``deadline`` (a short answer: capped at 4 KiB)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    data = b""
    while len(data) < 4096:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(int(left * 1000) + 1):
            return data
        chunk = posix.read(fd, 4096)
        if not chunk:
            return data
        data += chunk
    return data


def _reaped(pid: int, deadline: float) -> bool:
    """Reap our ``pid``: True when it exited 0 by ``deadline``; else it is killed (it is our
    own unreaped child, so the pid is still its) and False."""
    while True:
        try:
            done, status = posix.waitpid(pid, posix.WNOHANG)
        except ChildProcessError:
            return False
        if done == pid:
            return posix.WIFEXITED(status) and posix.WEXITSTATUS(status) == 0
        if time.monotonic() >= deadline:
            break
        time.sleep(0.005)  # a bounded poll: the child closed its output and is exiting
    try:
        posix.kill(pid, _signal.SIGKILL)
        posix.waitpid(pid, 0)
    except OSError:
        pass
    return False


# -- what the worker used (cgroup counters) -----------------------------------------------------

_NO_LIMIT = 2**62
"""cgroup v1 spells "no limit" as a huge page-aligned number; anything above this is none."""


def cgroup_usage(session: str, proc: str = "/proc", root: str = "") -> dict[str, Any]:
    """The OOM kills, peak memory and memory limit of our own scope's cgroup.

    Only our own scope counts (its leaf carries the session id): in a shared cgroup an OOM
    kill of somebody else's process must not read as ours. cgroup v2 (``memory.events``
    ``oom_kill``/``oom_group_kill``, ``memory.peak``, ``memory.max``) is preferred; on v1 the
    memory controller's cgroup must be the same path as the scope's (``memory.oom_control``
    ``oom_kill``, ``memory.max_usage_in_bytes``, ``memory.limit_in_bytes``). ``root`` prefixes
    the mount points (tests use a fake tree). Empty when nothing could be read."""
    membership = _text(f"{proc}/self/cgroup")
    mounts = _text(f"{proc}/self/mountinfo")
    if membership is None or mounts is None:
        return {}
    paths: dict[str, str] = {}
    for line in membership.splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    scope_path = paths.get("") or paths.get("name=systemd") or ""
    leaf = scope_path.rsplit("/", 1)[-1]
    token = session.removeprefix("s_")
    if not (leaf.endswith(".scope") and token and token in leaf):
        return {}
    v2, v1 = _cgroup_mounts(mounts)
    if v2 is not None and "" in paths:
        found = _v2_usage(f"{root}{v2}{paths['']}")
        if found:
            return found
    if v1 is not None and paths.get("memory") == scope_path:
        return _v1_usage(f"{root}{v1}{scope_path}")
    return {}


def _cgroup_mounts(mountinfo: str) -> tuple[str | None, str | None]:
    """(the cgroup2 mount, the v1 memory controller's mount) from ``/proc/self/mountinfo``."""
    v2 = v1 = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if not sep or len(fields) < 5 or fields[3] != "/" or not kind:
            continue
        where = fields[4].replace("\\040", " ")
        if kind[0] == "cgroup2":
            v2 = where
        elif kind[0] == "cgroup" and len(kind) > 2 and "memory" in kind[2].split(","):
            v1 = where
    return v2, v1


def _v2_usage(directory: str) -> dict[str, Any]:
    events = _text(f"{directory}/memory.events")
    if events is None:
        return {}
    counts = _counters(events)
    found: dict[str, Any] = {
        "cgroup": "v2",
        "oom_kills": max(counts.get("oom_kill", 0), counts.get("oom_group_kill", 0)),
    }
    found["memory_peak"] = _number(_text(f"{directory}/memory.peak"))
    found["memory_max"] = _number(_text(f"{directory}/memory.max"))
    return found


def _v1_usage(directory: str) -> dict[str, Any]:
    control = _text(f"{directory}/memory.oom_control")
    if control is None:
        return {}
    found: dict[str, Any] = {"cgroup": "v1", "oom_kills": _counters(control).get("oom_kill", 0)}
    found["memory_peak"] = _number(_text(f"{directory}/memory.max_usage_in_bytes"))
    found["memory_max"] = _number(_text(f"{directory}/memory.limit_in_bytes"))
    return found


def _counters(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[name] = int(value)
    return out


def _number(text: str | None) -> int | None:
    """A byte count from a cgroup file ("max" or a v1 "unlimited" value: None)."""
    value = (text or "").strip()
    if not value.isdigit() or int(value) >= _NO_LIMIT:
        return None
    return int(value)


def _text(path: str) -> str | None:
    try:
        fd = posix.open(path, posix.O_RDONLY)
    except OSError:
        return None
    try:
        return _read_all(fd).decode(errors="replace")
    except OSError:
        return None
    finally:
        posix.close(fd)


def _gate() -> bool:
    """The scope gate: True to go on; False means exit now (see scope/abc.py)."""
    value = posix.environ.get(GATE_ENV)
    if value is None:
        return True
    try:
        fd = int(value)
    except ValueError:
        return False
    return _go(fd)


def _go(fd: int) -> bool:
    """One byte from a gate's pipe, which is then closed: True for ``b"1"``; False for
    anything else, EOF or an error."""
    try:
        byte = posix.read(fd, 1)
    except OSError:
        byte = b""
    try:
        posix.close(fd)
    except OSError:
        pass
    return byte == b"1"


def main(argv: list[str]) -> int:
    """Entry point: ``program.py SPEC``.

    Reading the spec and opening the stdin FIFO come before the gate: they change nothing,
    and they overlap the placement the gate waits for; a failure there is reported only once
    the gate said go (a keeper turned back leaves nothing, not even an error)."""
    keeper: Keeper | None = None
    early: Exception | None = None
    if len(argv) == 2:
        try:
            fd = posix.open(argv[1], posix.O_RDONLY)
            try:
                spec = loads(_read_all(fd).decode())
            finally:
                posix.close(fd)
            keeper = Keeper(spec)
            keeper.open_stdin()
        except Exception as err:  # reported after the gate, or not at all
            early = err
    if not _gate():
        return 0
    if len(argv) != 2:
        sys.stderr.write("usage: program.py SPEC.json\n")
        return 2
    try:
        posix.setsid()
    except OSError:
        pass  # already a session leader (started with start_new_session)
    if early is not None:
        raise early
    assert keeper is not None
    if not keeper.recorded():
        return 0
    keeper.prepare()
    keeper.fork_worker()
    keeper.open_log()  # while the worker execs
    failure = keeper.worker_started()
    if failure is not None:
        keeper.write_record(state="failed_start", reason=failure, final=True)
        keeper.signal_ready()
        return 0
    info = keeper.info()
    keeper.signal_ready(info)  # the launcher learns who runs from the pipe,
    keeper.publish_start(info)  # everyone else from keeper.json
    keeper.open_records()
    return keeper.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
