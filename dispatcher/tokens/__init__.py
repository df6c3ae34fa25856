"""dispatcher/tokens: the HTTP API's bearer tokens (``dispatch web token create|list|revoke``).

A token is shown once when it is made and stored only as its SHA-256 digest, beside the board:
in the state database on a single host (the ``tokens`` component, :mod:`.tables`), in the
cluster database in cluster mode (so every host's ``dispatch web`` accepts it; ``state
migrate`` copies them). :mod:`.store` holds the record, the one SQL both backends run, and
the check a request's token passes. It knows nothing of HTTP: ``dispatcher/web/api/`` asks it.
"""
