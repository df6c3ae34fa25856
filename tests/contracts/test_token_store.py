"""The API-token store's promises (:class:`dispatcher.tokens.store.TokenStore`), run against
both backends it has: the state database (SQLite) and the cluster database (PostgreSQL, the
``postgres`` tier). A token's text exists once; only its digest is stored; revoked and expired
tokens are refused; names are unique among active tokens; its last use is recorded at most
once a minute."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.app.database import open_state
from dispatcher.cluster.database import ClusterDB
from dispatcher.tokens.store import LAST_USE_EVERY, TokenRefused, TokenStore, digest_of
from scope.foundation.errors import NotFoundError, UsageError

NOW = 1_800_000_000.0
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TokenStore]:
    if request.param == "postgres":
        cluster = ClusterDB(request.getfixturevalue("pg_url"), max_size=1)
        cluster.migrate()
        yield TokenStore(cluster.read, lambda: cluster.write(None))
        cluster.close()
        return
    state = open_state(tmp_path / "state")
    yield TokenStore(state.read, state.write)
    state.close()


def test_a_token_is_shown_once_and_stored_as_its_digest(store: TokenStore) -> None:
    token, text = store.create("ci", "read", now=NOW)
    assert text.startswith("dsp_") and len(text) >= 40
    assert store.authenticate(text, now=NOW + 1).id == token.id
    listed = store.list()
    assert [t.id for t in listed] == [token.id]
    assert text not in repr(listed) and digest_of(text) not in repr(listed)
    _other, other_text = store.create("bot", "operate", now=NOW)
    assert other_text != text and store.authenticate(other_text, now=NOW).operates


def test_unknown_revoked_and_expired_tokens_are_refused(store: TokenStore) -> None:
    with pytest.raises(TokenRefused, match="unknown"):
        store.authenticate("dsp_nothing", now=NOW)
    short, short_text = store.create("short", "read", now=NOW, expires_at=NOW + 60)
    assert store.authenticate(short_text, now=NOW + 59).id == short.id
    with pytest.raises(TokenRefused, match="expired"):
        store.authenticate(short_text, now=NOW + 60)
    token, text = store.create("ci", "operate", now=NOW)
    revoked, changed = store.revoke("ci", now=NOW + 5)
    assert changed and revoked.state(NOW + 5) == "revoked" and revoked.id == token.id
    assert store.revoke(token.id, now=NOW + 6)[1] is False
    with pytest.raises(TokenRefused, match="revoked"):
        store.authenticate(text, now=NOW + 7)


def test_names_are_unique_among_active_tokens(store: TokenStore) -> None:
    first, _ = store.create("ci", "read", now=NOW)
    with pytest.raises(UsageError, match="exists already"):
        store.create("ci", "operate", now=NOW)
    store.revoke(first.id, now=NOW)
    second, _ = store.create("ci", "operate", now=NOW)
    assert store.resolve("ci").id == second.id
    assert store.resolve(first.id[:6]).id == first.id
    with pytest.raises(NotFoundError):
        store.resolve("t_ffffffffff")


def test_bad_names_scopes_and_expiry_store_nothing(store: TokenStore) -> None:
    for name, scope, expires in (
        ("", "read", None),
        ("a\nb", "read", None),
        ("x" * 101, "read", None),
        ("ci", "admin", None),
        ("ci", "read", NOW - 1),
    ):
        with pytest.raises(UsageError):
            store.create(name, scope, now=NOW, expires_at=expires)
    assert store.list() == []


def test_last_use_is_written_at_most_once_a_minute(store: TokenStore) -> None:
    _token, text = store.create("ci", "read", now=NOW)
    assert store.list()[0].last_used_at is None
    store.authenticate(text, now=NOW + 10)
    store.authenticate(text, now=NOW + 20)
    assert store.list()[0].last_used_at == NOW + 10
    store.authenticate(text, now=NOW + 10 + LAST_USE_EVERY)
    assert store.list()[0].last_used_at == NOW + 10 + LAST_USE_EVERY
    assert store.list()[0].to_dict(NOW)["state"] == "active"
