"""The installation secret and what it signs: browser sessions and per-form CSRF tokens.

The secret is 32 random bytes in ``STATE_DIR/web-secret`` (mode 0600, ours, not a link),
created atomically on first use: written to a private temporary file, then hard-linked into
place, so two ``dispatch web`` starting at once agree on one secret and nobody ever reads half
a file. Deleting the file (and restarting) signs everybody out.

Whoever shows the secret once (the ``?token=`` of the printed URL) gets a **session**: a random
nonce signed with the secret, kept in an HttpOnly, SameSite=Strict cookie, so the secret itself
never sits in the browser's cookie jar or history. A **CSRF token** is a time stamp signed
together with the session's nonce and the form's action, valid for :data:`CSRF_TTL`: another
site can neither read one nor forge one, and a token from an old page, an old session or an
old secret is refused as stale.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import secrets
import stat
import tempfile
from pathlib import Path

from dispatcher.web.errors import SecretUnusable
from scope.foundation.clock import Clock, SystemClock

SECRET_NAME = "web-secret"  # noqa: S105 - a file name
CSRF_TTL = 12 * 3600.0
"""How long a rendered form stays usable (seconds)."""
_MIN_SECRET = 16


def load_secret(state_dir: Path) -> str:
    """The installation's secret, created on first use (see the module docstring)."""
    path = Path(state_dir) / SECRET_NAME
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    fd, temp = tempfile.mkstemp(prefix=".web-secret-", dir=state_dir)  # 0600 from the start
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(32) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        # link() never replaces: whoever links first wins, the other reads that one.
        with contextlib.suppress(FileExistsError):
            os.link(temp, path)
    finally:
        Path(temp).unlink(missing_ok=True)
    _sync_dir(Path(state_dir))
    return _read(path)


def _read(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as err:
        problem = "a symbolic link" if err.errno == errno.ELOOP else err.strerror or str(err)
        raise SecretUnusable(str(path), problem, remedy=f"remove {path}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecretUnusable(str(path), "not a regular file", remedy=f"remove {path}")
        if info.st_uid != os.geteuid():
            raise SecretUnusable(
                str(path),
                f"owned by uid {info.st_uid}, not by us",
                remedy=f"remove {path}; dispatch web makes a new one",
            )
        if info.st_mode & 0o077:
            raise SecretUnusable(
                str(path),
                f"readable by others (mode {stat.S_IMODE(info.st_mode):04o})",
                remedy=f"run 'chmod 600 {path}', or remove it to make a new secret",
            )
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    text = data.decode("ascii", "replace").strip()
    if len(text) < _MIN_SECRET or not text.isprintable():
        raise SecretUnusable(
            str(path), "damaged (too short)", remedy=f"remove {path}; dispatch web makes a new one"
        )
    return text


def _sync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Keys:
    """Checks the secret and signs sessions and CSRF tokens with it."""

    def __init__(
        self, secret: str, *, clock: Clock | None = None, csrf_ttl: float = CSRF_TTL
    ) -> None:
        self._secret = secret.encode()
        self._clock: Clock = clock or SystemClock()
        self.csrf_ttl = csrf_ttl

    def __repr__(self) -> str:
        return "Keys(<secret>)"

    def _sign(self, *parts: str) -> str:
        message = "\x1f".join(parts).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def is_secret(self, given: str | None) -> bool:
        """Whether ``given`` is the secret (constant time)."""
        return given is not None and hmac.compare_digest(given.encode(), self._secret)

    def new_session(self) -> str:
        """A cookie value for a new session."""
        nonce = secrets.token_urlsafe(18)
        return f"{nonce}.{self._sign('session', nonce)}"

    def session_nonce(self, cookie: str | None) -> str | None:
        """The nonce of a genuine session cookie, else None."""
        if not cookie or cookie.count(".") != 1:
            return None
        nonce, signature = cookie.split(".")
        return nonce if hmac.compare_digest(signature, self._sign("session", nonce)) else None

    def csrf_token(self, nonce: str, action: str) -> str:
        """A token for one form (``action`` names what it does, e.g. ``card.archive``)."""
        stamp = str(int(self._clock.time()))
        return f"{stamp}.{self._sign('csrf', nonce, action, stamp)}"

    def csrf_problem(self, nonce: str, action: str, token: str | None) -> str | None:
        """None when ``token`` is good for this session and action; else why not."""
        if not token:
            return "the form carries no CSRF token"
        stamp, _, signature = token.partition(".")
        if not stamp.isdigit() or not hmac.compare_digest(
            signature, self._sign("csrf", nonce, action, stamp)
        ):
            return "the form's CSRF token is not from this session (an old page or secret)"
        age = self._clock.time() - int(stamp)
        if age > self.csrf_ttl or age < -300:
            return f"the form is older than {self.csrf_ttl / 3600:g} hours"
        return None
