"""Starting a keeper: the argv a request runs, the keeper's command line, its ready pipe.

Python never caches the compilation of a script it runs, and compiling ``program.py`` costs more
than all of the keeper's start-up work, so the keeper is compiled once per source version into
the private state dir and that bytecode file is run (``python file.pyc`` executes compiled code
directly). The source file is the fallback.

That file is code we run, so it is trusted only as far as ssh trusts ``authorized_keys``: the
cache dir must be ours, private and not a symlink, and the bytecode's hash must equal the one
recorded when we compiled it from the current source (checked before every spawn: ownership and
modes each time, the hashes whenever a file is not the very one last compared; a mismatch is
rebuilt, a foreign-owned or writable file refused).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import select
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from registry.abc import SpawnRequest
from registry.keeper.files import KeeperInfo
from registry.store.database import UnsafeStatePath, check_private, ensure_private_dir
from scope.foundation.errors import UsageError

__all__ = ["KEEPER_SCRIPT", "await_ready", "keeper_command", "worker_argv"]

_log = logging.getLogger("dispatch.registry")

KEEPER_SCRIPT = Path(__file__).with_name("program.py")


def keeper_command(python: str | None = None, cache_dir: Path | None = None) -> list[str]:
    """The argv prefix that runs the keeper: ``<python> -I -S <keeper>`` (the spec follows).

    Python never caches the compilation of a script it runs, and compiling the keeper costs
    more than all its start-up work; so when ``python`` is this interpreter the keeper is
    compiled once into ``cache_dir`` (the private state dir) and the bytecode file is run
    (``python file.pyc`` runs compiled code directly). Falls back to the source file.

    Called before every spawn: the bytecode is code we execute, so the cache dir must be a
    private directory (not a symlink) and the file ours, private and equal to what was
    compiled (:class:`~registry.store.database.UnsafeStatePath` otherwise; a mismatch is
    rebuilt). The hashes are compared again whenever the source, the bytecode or its record
    is not the very file (inode, size, times) it was at the last comparison; the ownership
    and modes are checked every time."""
    python = python or sys.executable
    if python == sys.executable and cache_dir is not None:
        compiled = _compiled_keeper(Path(cache_dir))
        if compiled is not None:
            return [python, "-I", "-S", str(compiled)]
    return [python, "-I", "-S", str(KEEPER_SCRIPT)]


_Identity = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class _Checked:
    """What the last full check of one cache dir found: the files' identities then."""

    source: _Identity
    target: Path
    files: tuple[_Identity, _Identity]
    """The bytecode's and its record's."""


_checked: dict[Path, _Checked] = {}
"""Per cache dir (a process spawns from one or two): the full check is repeated only when a
file's identity changed since."""


def _identity(info: os.stat_result) -> _Identity:
    """Which file this is, and which version of it: a write changes the ctime (which no
    user can set back), a replacement the inode."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _compiled_keeper(cache_dir: Path) -> Path | None:
    try:
        source_info = os.stat(KEEPER_SCRIPT)
    except OSError as err:
        _log.debug("running the keeper from source: %s", err)
        return None
    # Refuses a symlinked, foreign or group/other-writable cache (raises UnsafeStatePath).
    ensure_private_dir(cache_dir, allow_symlink=False)
    known = _checked.get(cache_dir)
    if known is not None and known.source == _identity(source_info):
        # The same files as at the last full check, still private: the hashes would match.
        files = _private_files(known.target)
        if files == known.files:
            return known.target
    try:
        source = KEEPER_SCRIPT.read_bytes()
    except OSError as err:
        _log.debug("running the keeper from source: %s", err)
        return None
    source_hash = hashlib.sha256(source).hexdigest()
    target = cache_dir / f"keeper-{source_hash[:16]}.{sys.implementation.cache_tag}.pyc"
    files = _private_files(target)  # before the hashes: a change after them shows next time
    if files is not None and _verified(target, source_hash):
        _checked[cache_dir] = _Checked(_identity(source_info), target, files)
        return target
    import py_compile  # only when compiling: it costs the CLI start-up time otherwise

    try:
        return _compile(cache_dir, target, source_hash)
    except (OSError, py_compile.PyCompileError) as err:
        _log.debug("running the keeper from source: %s", err)
        return None


def _private_files(target: Path) -> tuple[_Identity, _Identity] | None:
    """The identities of the bytecode and its record, each checked private (raises
    :class:`UnsafeStatePath` otherwise); None when either is missing."""
    found = []
    for path in (target, _record_path(target)):
        try:
            info = path.lstat()
        except FileNotFoundError:
            return None
        _check_compiled(path, info)
        found.append(_identity(info))
    return found[0], found[1]


def _check_compiled(path: Path, info: os.stat_result) -> None:
    """``path`` (the keeper's bytecode or its record, as ``lstat`` saw it) must be a regular
    file, ours and private (:class:`UnsafeStatePath` otherwise)."""
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
        raise UnsafeStatePath(
            str(path),
            "is not a regular file",
            remedy=f"remove it ('rm {path}'); dispatch compiles the keeper again",
        )
    check_private(path, info)


def _record_path(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _verified(target: Path, source_hash: str) -> bool:
    """Whether ``target`` is the bytecode we compiled from ``source_hash`` (its recorded hash
    matches); False when it is absent or differs (it is then rebuilt)."""
    try:
        info = target.lstat()
    except FileNotFoundError:
        return False
    _check_compiled(target, info)
    record = _record_path(target)
    try:
        check_private(record)
        recorded = record.read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError):
        return False
    actual = hashlib.sha256(target.read_bytes()).hexdigest()
    if recorded == [actual, source_hash]:
        return True
    _log.warning("keeper bytecode %s does not match what was compiled; rebuilding it", target)
    return False


def _compile(cache_dir: Path, target: Path, source_hash: str) -> Path:
    import py_compile

    tmp = cache_dir / f".{target.name}.{os.getpid()}.tmp"
    py_compile.compile(
        str(KEEPER_SCRIPT),
        cfile=str(tmp),
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    os.chmod(tmp, 0o600)
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    record_tmp = cache_dir / f".{target.name}.{os.getpid()}.sha256.tmp"
    fd = os.open(record_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(f"{digest} {source_hash}\n")
    # Bytecode first, then its record: a crash in between leaves a mismatch, rebuilt next time.
    os.replace(tmp, target)
    os.replace(record_tmp, _record_path(target))
    for old in cache_dir.glob("keeper-*.pyc*"):
        if old not in (target, _record_path(target)):
            # A running keeper already holds its code in memory; the file is not needed.
            with contextlib.suppress(OSError):
                old.unlink()
    return target


def worker_argv(request: SpawnRequest) -> list[str]:
    """The worker's argv: a list as given, or ``/bin/sh -c STRING`` when ``shell`` is set."""
    if request.shell:
        if not isinstance(request.argv, str):
            raise UsageError(
                "shell=True takes the command as one string",
                remedy="pass argv as a list without shell, or one string with shell",
            )
        argv = ["/bin/sh", "-c", request.argv]
    else:
        if isinstance(request.argv, str):
            raise UsageError(
                f"argv is a single string ({request.argv!r})",
                remedy="give a list of arguments, or set shell=True to run it with /bin/sh -c",
            )
        argv = [str(a) for a in request.argv]
    if not argv or not argv[0]:
        raise UsageError("empty command", remedy="give the program to run")
    if any("\0" in a for a in argv):
        raise UsageError("an argument contains a NUL byte")
    return argv


def await_ready(fd: int, timeout: float) -> tuple[bool, KeeperInfo | None]:
    """Wait for the keeper's ready message: whether it came (False on EOF, when the keeper
    died, or when the bound passed), and who runs when the worker started (the message
    carries ``keeper.json``'s document, which the keeper writes next; None when the worker
    could not start and ``exit.json`` says why, or when the document does not parse)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if not poller.poll(int(timeout * 1000)):
        return False, None
    try:
        message = os.read(fd, 4096)  # one write of at most PIPE_BUF bytes: whole
    except OSError:
        return False, None
    if message[:1] != b"1":
        return False, None
    if len(message) == 1:
        return True, None
    try:
        return True, KeeperInfo.from_json(json.loads(message[1:]))
    except (ValueError, KeyError, TypeError):
        return True, None
