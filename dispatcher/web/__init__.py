"""dispatcher/web: ``dispatch web``, the board, runs, logs, cron, sessions and hosts in a browser.

A process of its own beside ``dispatch serve``, so a dashboard fault never touches dispatching.
It reads the state the CLI reads, through the same code (the app layer's workspace, cron jobs
and runtime, the gateway's status document and doctor report), and acts through the same
calls the CLI makes, poking the gateway as the CLI does. Pages are rendered on the server and
read fine without JavaScript; one small script of ours keeps them live over Server-Sent Events.

Rooms::

    server      --listen parsing, the socket, uvicorn            (the process)
    app         the Starlette application: routes, errors        (the assembly)
    guard       Host check, the secret, sessions, CSRF, headers  (security)
    keys        the installation secret and what it signs
    source      the state as this process sees it (reads, actions)
    pages       GET handlers; actions: POST handlers; forms: their fields
    live        one shared board watcher, the SSE streams, log following
    text        worker output made inert (UTF-8, ANSI, control characters)
    metrics     the Prometheus collector read at scrape time
    render      Jinja2 (autoescaping on) and the formatting filters

In tests/test_layout.py it is the layer just above the gateway (whose status document, doctor
report and lock it reads) and below the CLI; the gateway never imports it, and it never imports
``dispatcher.gateway.serve``: it is not in the dispatch path.
"""
