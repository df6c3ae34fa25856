"""Who may use the API, and how often a wrong credential may be tried.

A request to ``/api/v1/`` is, in this order:

* ``Authorization: Bearer TOKEN`` with a token from ``dispatch web token create``: its scope
  (``read`` or ``operate``); or with the installation secret (``STATE_DIR/web-secret``, the
  key to the whole dashboard): ``operate``. Any other bearer value, another scheme, a revoked
  or expired token: 401, and the attempt counts as failed.
* no ``Authorization`` but a signed-in browser session (the dashboard's cookie): ``read``
  only. An API write is never accepted from a cookie alone, so a page of another site that
  makes the browser send its cookie can change nothing (the forms of the dashboard itself keep
  their CSRF tokens, :mod:`dispatcher.web.guard`).
* nothing: 401.

Failed attempts are counted per client address in a sliding window (:class:`FailureLimit`):
past :data:`MAX_FAILURES` in :data:`WINDOW` seconds every credentialed request from that
address answers 429 with ``Retry-After`` until the window has room again. Each failure is
logged with the address and the reason, never the credential.
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass

from dispatcher.tokens.store import TokenRefused, TokenStore
from dispatcher.web.api.problems import ApiProblem
from dispatcher.web.keys import Keys
from scope.foundation.clock import Clock, SystemClock

MAX_FAILURES = 10
WINDOW = 60.0
_log = logging.getLogger("dispatch.web.api")


@dataclass(frozen=True, kw_only=True)
class Caller:
    """Who a request comes from and what it may do."""

    name: str
    """The token's name, ``secret`` or ``browser session`` (for messages; never a secret)."""
    scope: str
    """``read`` or ``operate``."""
    bearer: bool
    """Whether the request carried ``Authorization: Bearer`` (else a browser session)."""

    def require(self, scope: str) -> None:
        """Refuse (403) what this caller's scope does not allow."""
        if scope != "operate" or self.scope == "operate":
            return
        if not self.bearer:
            raise ApiProblem(
                403,
                "an API write needs 'Authorization: Bearer TOKEN'; a browser session may only read",
                remedy="make a token with 'dispatch web token create --name NAME --scope operate'",
            )
        raise ApiProblem(
            403,
            f"the token {self.name!r} has the read scope; this operation needs operate",
            remedy="use a token made with --scope operate",
        )


ANONYMOUS_HINT = "send 'Authorization: Bearer TOKEN' with a token from 'dispatch web token create'"


class FailureLimit:
    """Failed authentications per client address in a sliding window (thread-safe)."""

    def __init__(
        self, *, limit: int = MAX_FAILURES, window: float = WINDOW, clock: Clock | None = None
    ) -> None:
        self.limit = limit
        self.window = window
        self._clock: Clock = clock or SystemClock()
        self._failures: dict[str, collections.deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, address: str, now: float) -> collections.deque[float]:
        stamps = self._failures.setdefault(address, collections.deque())
        while stamps and stamps[0] <= now - self.window:
            stamps.popleft()
        return stamps

    def check(self, address: str) -> None:
        """Refuse (429) an address that failed too often lately."""
        now = self._clock.monotonic()
        with self._lock:
            stamps = self._recent(address, now)
            if len(stamps) < self.limit:
                if not stamps:
                    self._failures.pop(address, None)
                return
            wait = max(1, int(stamps[0] + self.window - now + 0.999))
        raise ApiProblem(
            429,
            f"too many failed authentications from {address}",
            remedy=f"wait {wait} s and send a valid token",
            **{"retry-after": str(wait)},
        )

    def failed(self, address: str, why: str) -> None:
        """Count and log one failure (the reason, never the credential)."""
        now = self._clock.monotonic()
        with self._lock:
            stamps = self._recent(address, now)
            stamps.append(now)
            count = len(stamps)
            if len(self._failures) > 10_000:  # a flood of addresses: forget the quiet ones
                for key in [k for k, v in self._failures.items() if not v][:5000]:
                    del self._failures[key]
        if count <= self.limit:
            _log.warning(
                "dispatch web: API authentication failed from %s: %s (%d in %d s)",
                address,
                why,
                count,
                int(self.window),
            )
        if count == self.limit:
            _log.warning(
                "dispatch web: %s is refused for %d s after %d failed authentications",
                address,
                int(self.window),
                count,
            )


def authenticate(
    authorization: str | None,
    session: bool,
    *,
    address: str,
    keys: Keys,
    tokens: TokenStore,
    limit: FailureLimit,
    now: float,
) -> Caller:
    """The caller of a request (see the module docstring); ApiProblem 401/429 or
    TokenRefused otherwise. ``session``: a genuine browser session cookie came along."""
    if authorization is None:
        if session:
            return Caller(name="browser session", scope="read", bearer=False)
        raise ApiProblem(
            401,
            "the API needs a bearer token",
            remedy=ANONYMOUS_HINT,
            **{"www-authenticate": 'Bearer realm="dispatch"'},
        )
    limit.check(address)
    scheme, _, credential = authorization.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential:
        limit.failed(address, f"not a bearer credential ({scheme[:20]!r} scheme)")
        raise ApiProblem(
            401,
            "the Authorization header is not 'Bearer TOKEN'",
            remedy=ANONYMOUS_HINT,
            **{"www-authenticate": 'Bearer realm="dispatch"'},
        )
    if keys.is_secret(credential):
        return Caller(name="secret", scope="operate", bearer=True)
    try:
        token = tokens.authenticate(credential, now=now)
    except TokenRefused as err:
        limit.failed(address, f"{err.fields['why']} token")
        raise
    return Caller(name=token.name, scope=token.scope, bearer=True)
