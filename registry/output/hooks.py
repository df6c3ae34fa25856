"""Output hooks: the transform hook, then redaction, on every output handed to a program.

One :class:`OutputHooks` per registry. :meth:`OutputHooks.apply` is the only way output text
leaves the registry for a program (snapshots, previews, event outputs, ``dispatch logs
--redact``). The order is fixed: the transform hook first (it may reshape, shorten or annotate
the text; it learns the owning session's id and owner and the exit code), then redaction, so
whatever the hook returns is still masked. A hook that raises is logged and skipped: delivery
never fails because of it. :class:`LineHooks` applies them to a byte stream line by line
(``dispatch logs --redact``, also with ``-f``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from registry.abc import HookContext, OutputTransform, Owner
from registry.output.redact import Redactor
from registry.settings import RegistrySettings

__all__ = ["LineHooks", "OutputHooks"]

_log = logging.getLogger("dispatch.registry")


class OutputHooks:
    """An optional transform hook plus a redactor (None: no redaction)."""

    def __init__(
        self,
        transform: OutputTransform | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        self._transform = transform
        self.redactor = redactor
        self._lock = threading.Lock()
        self._failures = 0

    @classmethod
    def from_settings(
        cls, settings: RegistrySettings, transform: OutputTransform | None = None
    ) -> OutputHooks:
        """Redaction as ``registry.redact`` and ``registry.redact_patterns`` say."""
        redactor = None
        if settings.redact or settings.redact_patterns:
            redactor = Redactor(settings.redact_patterns, defaults=settings.redact)
        return cls(transform, redactor)

    @property
    def transform(self) -> OutputTransform | None:
        """The transform hook (None: none)."""
        return self._transform

    def set_transform(self, hook: OutputTransform | None) -> None:
        """Install (or with None remove) the transform hook."""
        with self._lock:
            self._transform = hook

    @property
    def failures(self) -> int:
        """How many times the transform hook raised (each time it was skipped)."""
        return self._failures

    def apply(
        self,
        text: str,
        *,
        session_id: str,
        owner: Owner,
        exit_code: int | None,
        purpose: str,
    ) -> str:
        """``text`` after the transform hook (if any), then redaction."""
        hook = self._transform
        if hook is not None:
            context = HookContext(
                session_id=session_id, owner=owner, exit_code=exit_code, purpose=purpose
            )
            try:
                result = hook(text, context)
            except Exception:
                with self._lock:
                    self._failures += 1
                _log.exception(
                    "output transform hook failed for session %s (%s); skipped",
                    session_id,
                    purpose,
                )
            else:
                if isinstance(result, str):
                    text = result
                else:
                    _log.error(
                        "output transform hook returned %s, not text, for session %s; skipped",
                        type(result).__name__,
                        session_id,
                    )
        if self.redactor is not None:
            text = self.redactor(text)
        return text


class LineHooks:
    """Applies ``apply`` (a registry's output hooks for one session) to whole lines of a byte
    stream: the text is decoded as UTF-8 (U+FFFD for bad bytes) and a line waits for its
    newline, so a secret split across two reads is masked whole; :meth:`finish` lets out a last
    line without a newline."""

    def __init__(self, apply: Callable[[str], str]) -> None:
        self.apply = apply
        self._partial = b""

    def _hooked(self, data: bytes) -> bytes:
        return self.apply(data.decode("utf-8", "replace")).encode("utf-8")

    def __call__(self, data: bytes) -> bytes:
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        self._partial = data[cut:]
        return self._hooked(data[:cut]) if cut else b""

    def finish(self) -> bytes:
        """The rest (a last line without a newline)."""
        rest, self._partial = self._partial, b""
        return self._hooked(rest) if rest else b""
