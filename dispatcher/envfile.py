"""An ``env_file`` (cron jobs and kanban assignees): ``NAME=value`` lines, readable only by us.

The file usually holds secrets, so it must be a regular file owned by the user dispatch runs
as, with no group or other permission bits (mode 0600 or stricter). The check is made on the
opened file descriptor, so swapping the file between the check and the read changes nothing.

Format: one ``NAME=value`` per line (lines end at ``\n``, a ``\r`` before it is dropped);
blank lines and lines starting with ``#`` are ignored; an optional leading ``export`` is
accepted; spaces and tabs around the name and the value are dropped (only ASCII ones: a no-break
space is part of the value); a value wrapped in matching single or double quotes loses the
quotes. ``NAME`` is ``[A-Za-z_][A-Za-z0-9_]*`` in ASCII. Nothing is expanded and nothing passes
through a shell. Error lines name the line number, never its text (values are secrets).
"""

from __future__ import annotations

import os
import re
import stat

from dispatcher.errors import EnvFileError
from scope.foundation.text import BLANKS, strip_blanks

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_BYTES = 1024 * 1024


def read_env_file(path: str, *, uid: int | None = None) -> dict[str, str]:
    """The variables in ``path``; raises :class:`EnvFileError` (one line, with the fix)."""
    uid = os.getuid() if uid is None else uid
    expanded = os.path.expanduser(path)
    try:
        fd = os.open(expanded, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as err:
        raise EnvFileError(path, f"cannot open: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise EnvFileError(path, "not a regular file")
        if info.st_uid != uid:
            raise EnvFileError(
                path,
                f"owned by uid {info.st_uid}, not by the user dispatch runs as (uid {uid})",
                remedy=f"chown it to uid {uid}",
            )
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise EnvFileError(
                path,
                f"mode {mode:04o} lets others read it",
                remedy=f"run chmod 600 {path}",
            )
        raw = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        raise EnvFileError(path, "larger than 1 MiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise EnvFileError(path, "not valid UTF-8") from None
    return parse_env_text(text, path)


def parse_env_text(text: str, path: str = "<env_file>") -> dict[str, str]:
    """Parse ``NAME=value`` lines (see the module docstring)."""
    found: dict[str, str] = {}
    # split("\n"), not splitlines(): that also breaks at \v, \f, \x1c-\x1e, \x85 and
    # U+2028, which may sit inside a value.
    for number, line in enumerate(text.split("\n"), start=1):
        stripped = strip_blanks(line.removesuffix("\r"))
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("export") and stripped[6:7] in tuple(BLANKS):
            stripped = strip_blanks(stripped[6:])
        name, equals, value = stripped.partition("=")
        name = strip_blanks(name)
        if not equals or not _NAME.fullmatch(name):
            raise EnvFileError(
                path,
                f"line {number}: expected NAME=value with NAME like [A-Za-z_][A-Za-z0-9_]*",
                line=number,
            )
        value = strip_blanks(value)
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if "\0" in value:
            raise EnvFileError(path, f"line {number}: NUL byte in the value", line=number)
        found[name] = value
    return found
