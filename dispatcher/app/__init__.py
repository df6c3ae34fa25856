"""dispatcher/app: the application assembly, one layer above cron and kanban.

What lives here puts the parts together for a command or the gateway: the state database with
every package's tables (:mod:`~dispatcher.app.database`), the scoper and process registry opened
from settings (:mod:`~dispatcher.app.runtime`), a kanban board opened for one command
(:mod:`~dispatcher.app.workspace`) and the wake channel from commands to the gateway
(:mod:`~dispatcher.app.wake`). The root config schema and loader (``dispatcher.settings``,
``dispatcher.config``) belong to this layer too; they keep their top-level paths because they
are the config API users and tools import.

Layers inside dispatcher/, lowest first (tests/test_layout.py checks every import, including
function-local ones and ``import_module`` calls)::

    cli                   dispatch commands
    web                   dispatch web (the dashboard)
    gateway               dispatch serve
    app                   this package + settings, config, configdoc
    cron   kanban         policies; neither imports the other
    foundation            errors, paths, timefmt, envfile, commonsettings

A layer imports only from layers below it (and registry/, scope/).
"""
