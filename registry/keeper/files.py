"""A session's directory: ``<state_dir>/sessions/<session_id>/`` and the files the keeper shares.

========================  ======  ============================================================
file                      writer  content
========================  ======  ============================================================
``spec.json``             us      what the keeper runs: argv, cwd, env, pty, caps, timeout ...
``stdin``                 us      a FIFO the keeper holds open; anyone may write the worker's
                                  stdin through it (PTY master in PTY mode)
``output.log``            keeper  the worker's raw output bytes (stdout and stderr merged)
``keeper.json``           keeper  keeper and worker pid + kernel start time, once it runs
``exit.json``             keeper  the exit record (temp + fsync + rename); also written by a
                                  registry that finalized a session whose keeper is gone
``keeper.err``            keeper  the keeper's own stderr (a crash traceback, if any)
========================  ======  ============================================================

The directory is 0700 and every file 0600. The keeper writes its JSON with its own tiny encoder
(see :mod:`registry.keeper.program`); this module reads and writes the same shapes with :mod:`json`.

A damaged directory (an exit record that is not the JSON a keeper writes, a log missing after
the keeper started, a directory or file owned by someone else or writable by group/others) is
named by :meth:`SessionDir.damage`: the registry reports that one session ``lost`` with the
reason and carries on; nothing in such a directory is written or removed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import shutil
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from registry.abc import SessionState
from registry.errors import RegistryError
from registry.store.database import ensure_private_dir
from registry.usage import Usage

__all__ = [
    "ExitRecord",
    "KeeperInfo",
    "SessionDir",
    "keeper_spec",
    "sessions_root",
    "write_bounded",
]

SPEC_FORMAT = 1


def sessions_root(state_dir: Path) -> Path:
    """``<state_dir>/sessions``."""
    return Path(state_dir) / "sessions"


@dataclass(frozen=True, kw_only=True)
class KeeperInfo:
    """``keeper.json``: who runs (written by the keeper once the worker started)."""

    keeper_pid: int
    keeper_start: int | None
    worker_pid: int
    worker_start: int | None
    started_at: float

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KeeperInfo:
        """Parse the keeper's document."""
        return cls(
            keeper_pid=int(data["keeper_pid"]),
            keeper_start=_opt_int(data.get("keeper_start")),
            worker_pid=int(data["worker_pid"]),
            worker_start=_opt_int(data.get("worker_start")),
            started_at=float(data["started_at"]),
        )


@dataclass(frozen=True, kw_only=True)
class ExitRecord:
    """``exit.json``: how the worker ended."""

    state: SessionState
    """``exited``, ``timed_out``, ``failed_start`` (keeper); ``killed`` or ``lost`` (registry).
    A state this version does not know reads as ``exited``."""
    exit_code: int | None
    signal: str | None
    reason: str
    started_at: float | None
    finished_at: float | None
    total_bytes: int = 0
    dropped_bytes: int = 0
    writer: str = "keeper"
    final: bool = False
    """True once the keeper stopped capturing (no later rewrite will come)."""
    usage: Usage | None = None
    """What the worker used (the keeper reads its scope's counters when the worker ends)."""
    unit_result: str | None = None
    """The ``Result`` the keeper read of its own scope as the worker ended (only when the
    scope has a runtime_max): ``timeout`` means its manager stopped it at ``RuntimeMaxSec=``."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExitRecord:
        """Parse a record written by a keeper or a registry."""
        return cls(
            state=_state_of(str(data["state"])),
            exit_code=_opt_int(data.get("exit_code")),
            signal=data.get("signal") or None,
            reason=str(data.get("reason") or ""),
            started_at=_opt_float(data.get("started_at")),
            finished_at=_opt_float(data.get("finished_at")),
            total_bytes=int(data.get("total_bytes") or 0),
            dropped_bytes=int(data.get("dropped_bytes") or 0),
            writer=str(data.get("writer") or "keeper"),
            final=bool(data.get("final")),
            usage=Usage.from_json(data.get("usage")),
            unit_result=_opt_str(data.get("unit_result")),
        )

    def to_json(self) -> dict[str, Any]:
        """The document (registry-written records carry ``writer: "registry"``)."""
        return {
            "version": SPEC_FORMAT,
            "state": self.state.value,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "total_bytes": self.total_bytes,
            "dropped_bytes": self.dropped_bytes,
            "writer": self.writer,
            "final": True,
            "usage": self.usage.to_json() if self.usage is not None else None,
            "unit_result": self.unit_result,
        }


class SessionDir:
    """Paths and file operations of one session's directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def of(cls, state_dir: Path, session_id: str) -> SessionDir:
        """The directory of ``session_id`` under ``state_dir``."""
        return cls(sessions_root(state_dir) / session_id)

    @cached_property
    def spec(self) -> Path:
        return self.path / "spec.json"

    @cached_property
    def log(self) -> Path:
        return self.path / "output.log"

    @cached_property
    def keeper(self) -> Path:
        return self.path / "keeper.json"

    @cached_property
    def exit(self) -> Path:
        return self.path / "exit.json"

    @cached_property
    def stdin(self) -> Path:
        return self.path / "stdin"

    @cached_property
    def keeper_err(self) -> Path:
        return self.path / "keeper.err"

    # -- creating ----------------------------------------------------------------------------

    def create(self, spec: Mapping[str, Any]) -> None:
        """Make the directory (0700), the spec (0600) and the stdin FIFO (0600)."""
        ensure_private_dir(self.path.parent)
        self.path.mkdir(mode=0o700)
        text = json.dumps(dict(spec), ensure_ascii=True)
        _write_private(self.spec, text.encode(), sync=False)
        os.mkfifo(self.stdin, 0o600)

    def remove(self, *, keep_log: bool = False) -> None:
        """Delete the directory; with ``keep_log`` only the log and exit record stay.

        A directory that is not ours (or not private) is left alone."""
        untrusted = self._untrusted()
        if untrusted is not None and not untrusted.startswith("session directory missing"):
            return
        if not keep_log:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.path):
                if entry.name not in ("output.log", "exit.json"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)

    # -- reading -----------------------------------------------------------------------------

    def read_keeper(self) -> KeeperInfo | None:
        """keeper.json, or None while it is absent (or unreadable, or in a directory that is
        not private: its pids are what a kill would signal)."""
        if self._untrusted() is not None:
            return None
        data = _read_json(self.keeper)
        if data is None:
            return None
        try:
            return KeeperInfo.from_json(data)
        except (KeyError, TypeError, ValueError):
            return None

    def read_exit(self) -> ExitRecord | None:
        """exit.json, or None while it is absent.

        A keeper replaces the record atomically, so one that does not parse was damaged after
        the fact: it reads as a ``lost`` record naming the damage (never as "still running").
        In a directory that is not private (:meth:`damage`) no record is trusted: None."""
        if self._untrusted() is not None:
            return None
        try:
            text = self.exit.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as err:
            return self._lost_record(f"exit record unreadable ({err.strerror})")
        problem = _exit_problem(text)
        if problem is not None:
            return self._lost_record(problem)
        return ExitRecord.from_json(json.loads(text))

    def _lost_record(self, reason: str) -> ExitRecord:
        return ExitRecord(
            state=SessionState.LOST,
            exit_code=None,
            signal=None,
            reason=f"{reason}: {self.exit}",
            started_at=None,
            finished_at=time.time(),
            total_bytes=self.log_size(),
            writer="registry",
        )

    def damage(self) -> str | None:
        """Why this directory cannot be trusted or read, or None when it is sound.

        Checked: the directory and the files the program trusts are ours and not writable by
        group/others; the exit record parses; the log exists once the keeper has started."""
        problem = self._untrusted()
        if problem is not None:
            return problem
        try:
            text: bytes | None = self.exit.read_bytes()
        except FileNotFoundError:
            text = None
        except OSError as err:
            return f"exit record unreadable ({err.strerror}): {self.exit}"
        if text is not None and _exit_problem(text) is not None:
            return f"{_exit_problem(text)}: {self.exit}"
        started = self.keeper.exists() or self.exit.exists()
        if started and not self.log.exists():
            return f"output log missing: {self.log}"
        return None

    def _untrusted(self) -> str | None:
        """Ownership and mode of the directory and its trusted files (lstat only)."""
        uid = os.getuid()
        try:
            info = self.path.lstat()
        except FileNotFoundError:
            return f"session directory missing: {self.path}"
        if not stat.S_ISDIR(info.st_mode):
            return f"session directory is not a directory: {self.path}"
        for path in (self.path, self.spec, self.keeper, self.exit, self.log):
            try:
                info = path.lstat()
            except FileNotFoundError:
                continue
            if info.st_uid != uid:
                return f"owned by uid {info.st_uid}, not by the running user: {path}"
            if stat.S_IMODE(info.st_mode) & 0o022:
                return (
                    f"writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}): {path}"
                )
            if path != self.path and not stat.S_ISREG(info.st_mode):
                return f"not a regular file: {path}"
        return None

    def has_exit(self) -> bool:
        """Whether an exit record exists (one stat)."""
        return self.exit.exists()

    def write_exit(self, record: ExitRecord) -> None:
        """Write a registry-made record (the keeper is gone), atomically and durably.

        Refused (``PermissionError``) in a damaged directory: nothing there is touched."""
        problem = self.damage()
        if problem is not None:
            raise PermissionError(errno.EPERM, f"session directory damaged ({problem})")
        tmp = self.path / "exit.json.registry-tmp"
        _write_private(tmp, json.dumps(record.to_json()).encode(), sync=True)
        os.replace(tmp, self.exit)
        with contextlib.suppress(OSError):
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def write_stdin(self, data: bytes, *, session_id: str, timeout: float = 10.0) -> None:
        """Send bytes to the worker through the FIFO (ENXIO: nobody holds it any more)."""
        try:
            fd = os.open(self.stdin, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            raise RegistryError(
                f"session {session_id} does not accept input ({err.strerror}: {self.stdin})",
                session=session_id,
            ) from None
        try:
            write_bounded(fd, data, timeout=timeout, session_id=session_id)
        finally:
            os.close(fd)

    def keeper_errors(self, limit: int = 600) -> str:
        """The end of the keeper's stderr (one line), for a ``lost`` reason."""
        try:
            with open(self.keeper_err, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - limit))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [line for line in text.strip().splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""

    def log_size(self) -> int:
        """Current size of the log (0 when absent)."""
        try:
            return self.log.stat().st_size
        except FileNotFoundError:
            return 0


def keeper_spec(
    *,
    session_id: str,
    directory: Path,
    argv: Sequence[str],
    cwd: str,
    env: Mapping[str, str],
    pty: bool,
    max_log_bytes: int,
    timeout: float | None,
    kill_grace: float,
    drain_time: float,
    ready_fd: int | None,
    record_fd: int | None = None,
    pty_size: tuple[int, int] = (24, 80),
) -> dict[str, Any]:
    """The spec document the keeper reads (see :mod:`registry.keeper.program`)."""
    return {
        "version": SPEC_FORMAT,
        "session": session_id,
        "dir": str(directory),
        "argv": list(argv),
        "cwd": cwd,
        "env": dict(env),
        "pty": pty,
        "pty_rows": pty_size[0],
        "pty_cols": pty_size[1],
        "max_log_bytes": max_log_bytes,
        "timeout": timeout,
        "kill_grace": kill_grace,
        "drain_time": drain_time,
        "ready_fd": ready_fd,
        "record_fd": record_fd,
    }


def _write_private(path: Path, data: bytes, *, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _state_of(text: str) -> SessionState:
    try:
        return SessionState(text)
    except ValueError:
        return SessionState.EXITED


def _exit_problem(text: bytes) -> str | None:
    """What is wrong with an exit record's bytes, in a few words; None when it is sound."""
    if not text.strip():
        return "exit record empty"
    try:
        data = json.loads(text)
    except ValueError:
        if text.lstrip().startswith(b"{"):
            return "exit record truncated or malformed"
        return "exit record is not JSON (garbage)"
    try:
        if not isinstance(data, dict):
            raise TypeError("not an object")
        ExitRecord.from_json(data)
    except (KeyError, TypeError, ValueError):
        return "exit record lacks the fields a keeper writes"
    return None


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def write_bounded(fd: int, data: bytes, *, timeout: float, session_id: str) -> None:
    """Write all of ``data`` to a non-blocking fd, waiting at most ``timeout`` for room."""
    view = memoryview(data)
    deadline = time.monotonic() + timeout
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while view:
        try:
            view = view[os.write(fd, view) :]
            continue
        except BlockingIOError:
            pass
        except OSError as err:
            if err.errno == errno.EPIPE:
                raise RegistryError(
                    f"session {session_id} stopped reading its stdin", session=session_id
                ) from None
            raise
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RegistryError(
                f"session {session_id} is not reading its stdin ({len(view)} bytes not sent)",
                session=session_id,
            )
        poller.poll(int(remaining * 1000) + 1)
