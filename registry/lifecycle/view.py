"""Reading a session's output: the one place text is read, and the one place it is handed on.

:meth:`Viewer.view` reads the end of a session's output (from the follower's in-memory tail
when this instance follows it, else from the log); :meth:`Viewer.handed` is where text goes to
a program, after the transform hook and redaction (:mod:`registry.output.hooks`). ``read_log`` gives
the raw bytes, untouched by any hook. Nothing here changes a session.
"""

from __future__ import annotations

import os

from registry.abc import Session, Snapshot
from registry.lifecycle.parts import Parts
from registry.output.tail import TailView, decode_tail
from registry.output.tail import tail_lines as tail_lines_of
from registry.store.sessions import StoredSession

__all__ = ["EXACT_CUT_BYTES", "Viewer"]

EXACT_CUT_BYTES = 1 << 20
"""Logs up to this size are decoded whole for an exact ``output_cut``."""


class Viewer:
    """Output of sessions as text for programs, and as raw bytes for people."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def chars(self, stored: StoredSession) -> int:
        """Characters of output this session's snapshots and completion carry."""
        if stored.output_chars is None:
            return self.parts.settings.output_chars
        return stored.output_chars

    def snapshot(self, stored: StoredSession, purpose: str) -> Snapshot:
        """The session plus the end of its output, hooks applied for ``purpose``."""
        view = self.view(stored, self.chars(stored))
        session = stored.session
        return Snapshot(
            session=session,
            output=self.handed(view.text, session, session.exit_code, purpose),
            output_cut=view.cut + session.dropped_bytes,
        )

    def handed(self, text: str, session: Session, exit_code: int | None, purpose: str) -> str:
        """Output text on its way to a program: the transform hook, then redaction."""
        return self.parts.hooks.apply(
            text,
            session_id=session.id,
            owner=session.owner,
            exit_code=exit_code,
            purpose=purpose,
        )

    def view(self, stored: StoredSession, chars: int, *, final: bool | None = None) -> TailView:
        """The end of a session's output as text (raw: hooks apply in :meth:`handed`)."""
        if final is None:
            final = stored.session.finished
        follower = self.parts.tracking.follower
        if follower is not None:
            entry = follower.catch_up(stored.session.id)
            if entry is not None:
                with follower.lock:
                    return entry.tail.text(chars, final=final)
        path = stored.session.log_path
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                take = size if size <= EXACT_CUT_BYTES else min(size, chars * 4 + 4)
                f.seek(size - take)
                data = f.read(take)
        except FileNotFoundError:
            return TailView(text="", cut=0)
        return decode_tail(data, size - take, chars, final=final)

    def read_log(
        self,
        stored: StoredSession,
        *,
        head: int | None = None,
        tail_lines: int | None = None,
        byte_range: tuple[int, int] | None = None,
    ) -> bytes:
        """Raw bytes of the log: a byte range, the head, the last lines, or all of it."""
        try:
            with open(stored.session.log_path, "rb") as f:
                if byte_range is not None:
                    start, end = byte_range
                    f.seek(max(0, start))
                    return f.read(max(0, end - max(0, start)))
                if head is not None:
                    return f.read(max(0, head))
                if tail_lines is not None:
                    return tail_lines_of(f, tail_lines)
                return f.read()
        except FileNotFoundError:
            return b""
