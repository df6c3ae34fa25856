"""SHA-256 without loading OpenSSL, for names and cache keys on a short command's path.

``import hashlib`` loads OpenSSL (``_hashlib``), about 2 ms, a tenth of what a short write
command may add to the interpreter's start (issue 26). CPython ships its own SHA-256 as well
(``_sha256`` up to 3.11, ``_sha2`` from 3.12); the digest is the same, so it is used when it
is there, ``hashlib`` otherwise. Nothing here is a password or a signature: the digests name
the gateway's wake socket and key the config snapshot.
"""

from __future__ import annotations

__all__ = ["sha256_hex"]


def sha256_hex(data: bytes) -> str:
    """The SHA-256 of ``data`` in hex, as ``hashlib.sha256(data).hexdigest()``."""
    try:
        from _sha2 import sha256
    except ImportError:
        try:
            from _sha256 import sha256
        except ImportError:
            from hashlib import sha256
    return str(sha256(data).hexdigest())
