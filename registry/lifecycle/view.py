"""Reading a session's output: the one place text is read, and the one place it is handed on.

:meth:`Viewer.view` reads the end of a session's output (from the follower's in-memory tail
when this instance follows it, else from the log); :meth:`Viewer.handed` is where text goes to
a program, after the transform hook and redaction (:mod:`registry.output.hooks`). ``read_log``
and ``follow`` give the log's bytes (:mod:`registry.output.log`), raw unless a presentation
is asked for. Nothing here changes a session.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from registry.abc import Registry, Session, Snapshot, Stamp
from registry.keeper.times import LogTimes
from registry.lifecycle.parts import Parts
from registry.output.log import FileLog, Following, Presenter, read
from registry.output.tail import TailView, decode_tail
from registry.store.sessions import StoredSession

__all__ = ["EXACT_CUT_BYTES", "TAIL_MARGIN", "Viewer"]

EXACT_CUT_BYTES = 1 << 20
"""Logs up to this size are decoded whole for an exact ``output_cut``."""

TAIL_MARGIN = 1024
"""Characters before a cut tail that its hooks see too (longer than any secret's shape)."""


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

    def tail(self, stored: StoredSession, chars: int, purpose: str) -> Snapshot:
        """The session plus the last ``chars`` characters of its output: the hooks see
        :data:`TAIL_MARGIN` more, so a secret the cut runs through is masked before it is cut."""
        view = self.view(stored, chars + TAIL_MARGIN)
        session = stored.session
        text = self.handed(view.text, session, session.exit_code, purpose)
        kept = text[-chars:] if chars else ""
        return Snapshot(
            session=session,
            output=kept,
            output_cut=view.cut + len(text) - len(kept) + session.dropped_bytes,
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

    def hooks_for(self, session: Session, purpose: str = "logs") -> Callable[[str], str]:
        """The output hooks for text of ``session``, as :meth:`handed` applies them."""
        return lambda text: self.handed(text, session, session.exit_code, purpose)

    def times(self, stored: StoredSession) -> Callable[[], LogTimes]:
        """The session's arrival times, read once when first asked for."""
        return functools.cache(lambda: LogTimes(stored.session.log_path))

    def read_log(
        self,
        stored: StoredSession,
        *,
        head: int | None = None,
        tail_lines: int | None = None,
        byte_range: tuple[int, int] | None = None,
        since: float | None = None,
        stamp: Stamp | None = None,
        hooks: bool = False,
    ) -> bytes:
        """The log's bytes as :meth:`Registry.read_log <registry.abc.Registry.read_log>` says:
        raw unless a stamp or the hooks are asked for."""
        return read(
            FileLog(stored.session.log_path),
            self.times(stored),
            head=head,
            tail_lines=tail_lines,
            byte_range=byte_range,
            since=since,
            stamp=stamp,
            hooks=self.hooks_for(stored.session) if hooks else None,
        )

    def follow(
        self,
        registry: Registry,
        stored: StoredSession,
        offset: int,
        *,
        stamp: Stamp | None = None,
        hooks: bool = False,
        timeout: float | None = None,
    ) -> Following:
        """The log from ``offset`` on until the session ends (see
        :meth:`Registry.follow_log <registry.abc.Registry.follow_log>`)."""
        session = stored.session
        presenter = Presenter.asked(
            offset,
            times=self.times(stored),
            stamp=stamp,
            hooks=self.hooks_for(session) if hooks else None,
        )
        log = FileLog(session.log_path)
        return Following(registry, session.id, log, offset, presenter, timeout=timeout)
