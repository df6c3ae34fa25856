"""Bounded polling for tests: wait for a condition with a deadline instead of sleeping blindly.

Every wait in the suite goes through :func:`wait_for` (or says why it cannot), so a condition that
never comes true fails after a known time with a message naming the condition and the last value
seen, rather than hanging until the per-test timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["WaitTimeout", "wait_for"]

T = TypeVar("T")


def _describe(predicate: Callable[[], object]) -> str:
    """A name for a condition that was not given one."""
    name = getattr(predicate, "__qualname__", None)
    return name if isinstance(name, str) else repr(predicate)


class WaitTimeout(AssertionError):
    """A condition did not become true within its bound.

    An ``AssertionError`` so pytest reports it as a test failure with the message, not an error.
    """

    def __init__(self, what: str, timeout: float, last: object) -> None:
        self.what = what
        self.timeout = timeout
        self.last = last
        super().__init__(f"timed out after {timeout:g} s waiting for {what} (last value: {last!r})")


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 5.0,
    interval: float = 0.05,
    *,
    what: str | None = None,
) -> T:
    """Call ``predicate`` until it returns a truthy value, and return that value.

    The first call happens at once; later calls are spaced by a delay that starts at 5 ms and
    doubles up to ``interval``, so fast conditions are seen quickly without a busy loop on slow
    ones. Raises :class:`WaitTimeout` once ``timeout`` seconds have passed (at least one call is
    always made, and one more right at the deadline so a condition that became true while we
    slept is not reported as a timeout). Exceptions from ``predicate`` propagate.
    """
    if timeout < 0 or interval <= 0:
        raise ValueError("timeout must be >= 0 and interval > 0")
    deadline = time.monotonic() + timeout
    delay = min(0.005, interval)
    while True:
        value = predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(what or _describe(predicate), timeout, value)
        # Polling is the point of this helper: the sleep is bounded by the deadline.
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, interval)
