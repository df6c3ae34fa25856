"""A session's output as text: a rolling in-memory tail fed incrementally from the raw log.

The log file keeps the raw bytes (``dispatch logs`` shows them unchanged). Programs get text:
:class:`OutputTail` decodes UTF-8 incrementally, so a character split across two reads is
decoded whole, and invalid bytes (binary output, NUL is fine) become U+FFFD instead of raising.
It keeps only the last ``limit`` characters plus counters of everything seen. The raw log
itself is read by :mod:`registry.output.log`.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

__all__ = ["OutputTail", "TailView", "decode_tail"]


@dataclass(frozen=True, kw_only=True)
class TailView:
    """The end of a session's output as handed out."""

    text: str
    cut: int
    """Characters before ``text`` that are not included (approximate when the start of the
    log was skipped unread: bytes count as characters there)."""


class OutputTail:
    """Rolling tail of decoded output plus total counters (not thread-safe; callers lock)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, int(limit))
        self.total_bytes = 0
        self.total_chars = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: list[str] = []
        self._size = 0
        self._finished = False

    def skip(self, nbytes: int) -> None:
        """Account for ``nbytes`` of the log that will not be read (adoption of a big log)."""
        self.total_bytes += nbytes
        self.total_chars += nbytes

    def feed(self, data: bytes) -> None:
        """Add raw bytes (any chunking; a split UTF-8 sequence waits for its rest)."""
        if not data:
            return
        self.total_bytes += len(data)
        self._add(self._decoder.decode(data))

    def finish(self) -> None:
        """The stream ended: a dangling partial sequence becomes U+FFFD."""
        if not self._finished:
            self._finished = True
            self._add(self._decoder.decode(b"", final=True))

    def _add(self, text: str) -> None:
        if not text:
            return
        self.total_chars += len(text)
        if len(text) >= self.limit:
            self._parts = [text[-self.limit :]]
            self._size = self.limit
            return
        self._parts.append(text)
        self._size += len(text)
        if self._size > 2 * self.limit or len(self._parts) > 256:
            self._compact()

    def _compact(self) -> None:
        joined = "".join(self._parts)[-self.limit :]
        self._parts = [joined]
        self._size = len(joined)

    def text(self, chars: int | None = None, *, final: bool = False) -> TailView:
        """The last ``chars`` characters (default: the whole kept tail) and how many are cut.

        ``final``: the stream is over even if :meth:`finish` was not called yet, so an
        incomplete sequence at the end shows as U+FFFD (the tail itself is not changed)."""
        self._compact()
        whole = self._parts[0] if self._parts else ""
        total = self.total_chars
        if final and not self._finished:
            pending = self._decoder.getstate()[0]
            if pending:
                extra = pending.decode("utf-8", "replace")
                whole += extra
                total += len(extra)
        wanted = self.limit if chars is None else max(0, min(int(chars), self.limit))
        shown = whole[-wanted:] if wanted else ""
        return TailView(text=shown, cut=total - len(shown))


def decode_tail(data: bytes, skipped: int, chars: int, *, final: bool) -> TailView:
    """A :class:`TailView` from the last bytes of a log (for sessions nobody here follows).

    ``skipped`` bytes precede ``data``; when that is not 0, a UTF-8 sequence cut at the start
    of ``data`` is dropped rather than shown as a replacement character.
    """
    if skipped:
        start = 0
        while start < min(len(data), 4) and 0x80 <= data[start] < 0xC0:
            start += 1
        skipped += start
        data = data[start:]
    tail = OutputTail(max(chars, 1))
    tail.skip(skipped)
    tail.feed(data)
    if final:
        tail.finish()
    return tail.text(chars)
