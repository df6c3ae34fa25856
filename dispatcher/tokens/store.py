"""API tokens: make one (shown once), list, revoke, and check the one a request carries.

A token is ``dsp_`` and 43 characters of :func:`secrets.token_urlsafe` (256 bits), so a digest
without a salt is safe to store: nobody can guess their way back from SHA-256 of that much
randomness. A request's token is found by its digest (an indexed equality, which reveals
nothing useful about other tokens), compared again in constant time, and refused when revoked
or expired. Its last use is written at most once a minute, so a busy client costs one write a
minute, not one per request.

The SQL is the one dialect both backends share (``?`` placeholders), as the outbox's is.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dispatcher.errors import DispatcherError
from dispatcher.timefmt import iso
from scope.foundation.errors import NotFoundError, UsageError
from scope.foundation.ids import IdKind, lookup
from scope.foundation.text import quote, strip_blanks, unsafe_char

__all__ = ["SCOPES", "TOKEN_IDS", "Token", "TokenRefused", "TokenStore", "digest_of"]

SCOPES = ("read", "operate")
"""``read`` reads everything the API serves; ``operate`` also changes things."""
PREFIX = "dsp_"
TOKEN_IDS = IdKind(name="token", prefix="t_", digits=10, listing="dispatch web token list")
LAST_USE_EVERY = 60.0
"""Seconds between two writes of a token's last use."""
MAX_NAME = 100
_COLUMNS = "id, name, scope, created_at, expires_at, last_used_at, revoked_at"

Connect = Callable[[], contextlib.AbstractContextManager[Any]]


def digest_of(text: str) -> str:
    """The stored form of a token: SHA-256, hex."""
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


class TokenRefused(DispatcherError):
    """A bearer token that is not (or no longer) good: unknown, revoked or expired."""

    def __init__(self, why: str) -> None:
        super().__init__(
            remedy="make a new one with 'dispatch web token create --name NAME --scope SCOPE'",
            why=why,
        )

    def describe(self) -> str:
        return f"the bearer token is {self.fields['why']}"


@dataclass(frozen=True, kw_only=True)
class Token:
    """One token as stored (never its text)."""

    id: str
    name: str
    scope: str
    created_at: float
    expires_at: float | None
    last_used_at: float | None
    revoked_at: float | None

    def state(self, now: float) -> str:
        """``active``, ``expired`` or ``revoked``."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    @property
    def operates(self) -> bool:
        """Whether the token may change things."""
        return self.scope == "operate"

    def to_dict(self, now: float) -> dict[str, Any]:
        """The JSON shape of ``dispatch web token list --json``."""
        return {
            "id": self.id,
            "name": self.name,
            "scope": self.scope,
            "state": self.state(now),
            "created_at": iso(self.created_at),
            "expires_at": iso(self.expires_at),
            "last_used_at": iso(self.last_used_at),
            "revoked_at": iso(self.revoked_at),
        }


def _token(row: Any) -> Token:
    return Token(
        id=row[0],
        name=row[1],
        scope=row[2],
        created_at=float(row[3]),
        expires_at=None if row[4] is None else float(row[4]),
        last_used_at=None if row[5] is None else float(row[5]),
        revoked_at=None if row[6] is None else float(row[6]),
    )


def check_name(name: str) -> str:
    """A token's name: printable text on one line, at most :data:`MAX_NAME` characters."""
    text = strip_blanks(name)
    bad = unsafe_char(text, newlines=False)
    if not text or bad is not None or len(text) > MAX_NAME:
        problem = f"contains {bad}" if bad else "must be 1 to 100 printable characters"
        raise UsageError(f"--name {quote(name)}: {problem}", remedy="e.g. --name ci")
    return text


class TokenStore:
    """The tokens of one database (see the module docstring)."""

    def __init__(self, read: Connect, write: Connect) -> None:
        self._read = read
        self._write = write

    def create(
        self, name: str, scope: str, *, now: float, expires_at: float | None = None
    ) -> tuple[Token, str]:
        """A new token and its text (the only time the text exists). The name must not be
        used by another active token."""
        name = check_name(name)
        if scope not in SCOPES:
            raise UsageError(f"--scope {quote(scope)}: use read or operate")
        if expires_at is not None and expires_at <= now:
            raise UsageError("--expires: the token would be expired already")
        text = PREFIX + secrets.token_urlsafe(32)
        token = Token(
            id=TOKEN_IDS.new(),
            name=name,
            scope=scope,
            created_at=now,
            expires_at=expires_at,
            last_used_at=None,
            revoked_at=None,
        )
        with self._write() as conn:
            for row in conn.execute(
                f"SELECT {_COLUMNS} FROM web_tokens WHERE name = ? AND revoked_at IS NULL",  # noqa: S608
                (name,),
            ).fetchall():
                if _token(row).state(now) == "active":
                    raise UsageError(
                        f"a token named {quote(name)} exists already ({row[0]})",
                        remedy=f"revoke it first ('dispatch web token revoke {row[0]}') "
                        "or choose another --name",
                    )
            conn.execute(
                f"INSERT INTO web_tokens ({_COLUMNS}, digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",  # noqa: S608
                (token.id, name, scope, now, expires_at, None, None, digest_of(text)),
            )
        return token, text

    def list(self) -> list[Token]:
        """Every token, oldest first (revoked and expired ones too)."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM web_tokens ORDER BY created_at, id"  # noqa: S608
            ).fetchall()
        return [_token(row) for row in rows]

    def resolve(self, text: str) -> Token:
        """The token an id (or unique id prefix) or the name of an active token names."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM web_tokens WHERE name = ? AND revoked_at IS NULL",  # noqa: S608
                (strip_blanks(text),),
            ).fetchall()
            if len(rows) == 1:
                return _token(rows[0])

            def starting(prefix: str) -> list[str]:
                found = conn.execute(
                    "SELECT id FROM web_tokens WHERE id >= ? AND id < ? ORDER BY id LIMIT 50",
                    (prefix, prefix + "\uffff"),
                ).fetchall()
                return [str(r[0]) for r in found]

            token_id = lookup(text, TOKEN_IDS, starting=starting)
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM web_tokens WHERE id = ?",  # noqa: S608
                (token_id,),
            ).fetchone()
        if row is None:
            raise NotFoundError("token", text, remedy="see 'dispatch web token list'")
        return _token(row)

    def revoke(self, text: str, *, now: float) -> tuple[Token, bool]:
        """Revoke a token (by id, prefix or name); False when it was revoked already."""
        token = self.resolve(text)
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE web_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                (now, token.id),
            )
            changed = bool(cursor.rowcount)
        return self.resolve(token.id), changed

    def authenticate(self, text: str, *, now: float) -> Token:
        """The active token ``text`` is; TokenRefused (unknown, revoked, expired) otherwise.
        Records its use (at most once a minute)."""
        digest = digest_of(text)
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS}, digest FROM web_tokens WHERE digest = ?",  # noqa: S608
                (digest,),
            ).fetchone()
        if row is None or not hmac.compare_digest(str(row[7]), digest):
            raise TokenRefused("unknown")
        token = _token(row)
        state = token.state(now)
        if state != "active":
            raise TokenRefused(state)
        if token.last_used_at is None or now - token.last_used_at >= LAST_USE_EVERY:
            with self._write() as conn:
                conn.execute("UPDATE web_tokens SET last_used_at = ? WHERE id = ?", (now, token.id))
        return token
