"""What the gateway needs of the short-write relay: the gateway starts it once it runs and
closes it first when it stops. The relay itself runs command handlers, so it lives with them
(:mod:`dispatcher.cli.relay_server`) and ``dispatch serve`` hands the gateway its starter."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol


class Relay(Protocol):
    """A running relay."""

    def stats(self) -> dict[str, Any]:
        """Commands answered and declined (by reason), for the status file."""

    def close(self) -> None:
        """Stop taking commands; return once the ones started are answered."""


StartRelay = Callable[[Path], "Relay | None"]
"""Starts the relay of a state dir (None: it could not, and said why)."""
