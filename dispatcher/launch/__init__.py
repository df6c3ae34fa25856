"""The launch core: the one claim → spawn → record → settle life cycle of cron and kanban.

::

    outcome.py   Outcome (the shared vocabulary), Result, outcome_of(session)
    failure.py   classify_spawn_error(err): infrastructure, counted failure or config error
    claimant.py  Claimant: who claimed (pid + kernel start time + boot id), alive()
    setup.py     Workplace: a worker's cwd and layered environment
    core.py      LaunchCore: spawn with one retry for a lost manager, record, settle at
                 once, and the recovery questions (session known? orphaned claim?)

cron (:mod:`dispatcher.cron.firing`) and kanban (:mod:`dispatcher.kanban.running`) are
policies over it: each supplies its own store's record and settle steps (``Books``); neither
imports the other, and this package imports neither.

The workload control both share lives here too, as pure decisions and the little storage
they need: the retry policy, named limits (the one check, and the holds that every store keeps
in its claim's transaction, in the ``limits`` component's table), admission under pressure,
resource classes, and the notification outbox's write side.
"""
