"""Worker output made inert for a page: bytes to text, terminal escapes and controls removed.

A worker may print anything: invalid UTF-8, colour codes, cursor movement, title-setting OSC
sequences, a lone ESC, NULs. What reaches a page is plain text: decoded with U+FFFD for bad
bytes, every escape sequence and control character except tab and newline removed, and a
carriage return treated as a terminal does (what follows it overwrites the line, so a progress
bar shows its last state). The templates then escape that text like any other, so nothing a
worker prints can become markup, let alone script.

:class:`LogChunker` cuts a growing log at line ends, so a chunk never splits a UTF-8 sequence,
an escape sequence or a line a redaction pattern must see whole; a line that stays unfinished
(a prompt, a row of progress dots) is let out in pieces cut at a safe place.
"""

from __future__ import annotations

import re

# ECMA-48: CSI (ESC [ or the 8-bit 0x9B) with parameters and one final byte; OSC, DCS, SOS, PM
# and APC strings up to their terminator (BEL or ST); two- and three-byte escapes; then any
# control character left over (C0 but tab and newline, DEL, C1).
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]"
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"
)
# A whole escape sequence from its ESC on (bytes): CSI, a string up to its terminator, or a
# short escape. Used to tell whether a held-back line ends inside one.
_WHOLE_ESCAPE = re.compile(
    rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|[\]PX^_][^\x07\x1b\n]*(?:\x07|\x1b\\)"
    rb"|[ -/]*[0-OQ-WYZ\\`-~])"
)
TAIL_BYTES = 64 * 1024
"""How much of a log a page shows when it opens (the live tail continues from there)."""
MAX_LINE = 64 * 1024
"""A line longer than this is cut into pieces rather than held back forever."""


def decode(data: bytes) -> str:
    """UTF-8 with U+FFFD for bytes that are not."""
    return data.decode("utf-8", "replace")


def clean(text: str) -> str:
    """``text`` without escape sequences and control characters (see the module docstring)."""
    if "\r" in text:
        lines = []
        for line in text.replace("\r\n", "\n").split("\n"):
            if "\r" in line:
                parts = [part for part in line.split("\r") if part]
                line = parts[-1] if parts else ""
            lines.append(line)
        text = "\n".join(lines)
    return _ESCAPES.sub("", text)


def inert(data: bytes) -> str:
    """Raw output bytes as text safe to show (decoded, then cleaned)."""
    return clean(decode(data))


def tail_start(data: bytes, start: int) -> int:
    """Where a page's tail of a log should begin, given ``data`` read from ``start``: after
    the first newline when ``start`` is not the beginning (so no half line or character)."""
    if start == 0:
        return 0
    cut = data.find(b"\n")
    return start + cut + 1 if cut >= 0 else start + len(data)


class LogChunker:
    """Cuts bytes appended to a log at line ends (see the module docstring).

    :meth:`feed` takes the bytes that follow :attr:`offset` and returns the complete lines
    among them; the rest waits for its newline (or :data:`MAX_LINE`) or :meth:`finish`.
    :attr:`offset` is always where the next unreturned byte starts in the file.
    """

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset
        self._pending = b""

    @property
    def pending(self) -> int:
        """Bytes held back (a line without its newline yet)."""
        return len(self._pending)

    def feed(self, data: bytes) -> bytes:
        """The complete lines now known (b"" if none)."""
        buffer = self._pending + data
        cut = buffer.rfind(b"\n") + 1
        if cut == 0 and len(buffer) >= MAX_LINE:
            cut = len(buffer)
        ready, self._pending = buffer[:cut], buffer[cut:]
        self.offset += len(ready)
        return ready

    def flush_partial(self) -> bytes:
        """The held-back line so far, up to where nothing is cut in two (a UTF-8 character, an
        escape sequence); the rest stays held back."""
        pending = self._pending
        cut = len(pending)
        escape = pending.rfind(b"\x1b")
        if escape >= 0 and _WHOLE_ESCAPE.match(pending, escape) is None:
            cut = escape
        cut = _char_boundary(pending, cut)
        ready, self._pending = pending[:cut], pending[cut:]
        self.offset += len(ready)
        return ready

    def finish(self) -> bytes:
        """Whatever is held back (the log ended without a newline)."""
        rest, self._pending = self._pending, b""
        self.offset += len(rest)
        return rest


def _char_boundary(data: bytes, cut: int) -> int:
    """``cut``, or the start of a UTF-8 character that ``cut`` would split."""
    start = cut - 1
    while start >= 0 and cut - start <= 4 and data[start] & 0xC0 == 0x80:
        start -= 1
    if start < 0:
        return cut
    lead = data[start]
    size = 1
    if lead >> 5 == 0b110:
        size = 2
    elif lead >> 4 == 0b1110:
        size = 3
    elif lead >> 3 == 0b11110:
        size = 4
    return cut if cut - start >= size else start
