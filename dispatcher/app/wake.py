"""Waking the gateway from other processes: a datagram "poke" after a board change.

``dispatch kanban add`` (and every other command that changes the board) sends one empty
datagram to the gateway of its state dir, so a new ready card is dispatched at once instead of
at the next poll. The socket lives in the abstract namespace under a name derived from the
state dir (no path-length limit, nothing left on disk after a crash). A poke carries no data
and the gateway trusts none: the worst a stray poke can do is cause an extra, cheap tick.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from scope.foundation.digest import sha256_hex

if TYPE_CHECKING:
    import socket


def wake_address(state_dir: Path) -> bytes:
    """The abstract socket name of the gateway serving ``state_dir``."""
    digest = sha256_hex(str(Path(state_dir).resolve()).encode())[:24]
    return b"\0dispatch-serve-" + digest.encode()


def poke(state_dir: Path) -> bool:
    """Tell the gateway of ``state_dir`` (if one runs) to look at the board now."""
    # The socket module's own type, without the socket module: importing it (its enums of
    # every constant) would be a tenth of a short write command's start-up (issue 26). The
    # datagram and its errors are the same.
    import _socket

    address = wake_address(state_dir)
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM | _socket.SOCK_CLOEXEC)
    except OSError:
        return False
    try:
        sock.setblocking(False)
        sock.sendto(b"", address)
        return True
    except OSError:
        # No gateway listening (or its queue is full, which means a wake is pending anyway).
        return False
    finally:
        sock.close()


class WakeSocket:
    """The gateway's end: bound while it runs; :meth:`drain` empties pending pokes."""

    def __init__(self, state_dir: Path) -> None:
        import socket

        self.sock: socket.socket = socket.socket(
            socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
        )
        try:
            self.sock.bind(wake_address(state_dir))
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)

    def fileno(self) -> int:
        """For select()."""
        return self.sock.fileno()

    def drain(self) -> int:
        """Read every pending poke; returns how many there were."""
        count = 0
        while True:
            try:
                self.sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return count
            except OSError:
                return count
            count += 1

    def close(self) -> None:
        """Unbind (the abstract name disappears with the socket)."""
        self.sock.close()
