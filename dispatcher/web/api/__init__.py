"""dispatcher/web/api: the HTTP API under ``/api/v1/`` (docs/api.md).

One route table (:mod:`.table`) names every operation: its method and path, its parameters
and body (:mod:`.spec`), the JSON schema of its answer (:mod:`.schemas`), the scope it needs
and the function that does it. The router (:mod:`.router`) builds the Starlette routes from
that table and parses every request with those same definitions; the OpenAPI 3.1 document
(:mod:`.openapi`) is generated from it too, so the document cannot drift from the server.

Each operation calls what the CLI calls and answers with the CLI's own ``--json`` document
(:mod:`dispatcher.app.documents`, ``kanban/views.py``, ``cron/report.py``); an error is one
``application/problem+json`` document carrying the CLI's one-line message (:mod:`.problems`).
Who may ask is decided by :mod:`.auth`: a bearer token (``dispatch web token``) or the
installation secret; a browser session may read, never write.

Rooms::

    spec       parameters, bodies, operations: parsed and described from one definition
    fields     the parameters and body fields several operations share
    schemas    the JSON schemas of the documents
    table      the route table (every operation)
    router     Starlette routes from the table; the request's way through auth and parsing
    openapi    the OpenAPI document from the table
    auth       bearer tokens, the secret, the browser session; failed attempts rate-limited
    problems   errors as problem documents
    cards      cards and runs;  jobs: cron;  things: sessions, hosts, status, notifications
    follow     the event stream and a session's output (cursor, byte range, SSE)
"""
