"""dispatcher/cron: crontab semantics, the fire-key ledger and the scheduler.

Modules: crontab (expressions), timeline (fires in real time, DST rule), policy (catch-up and
overlap rules), ledger (the state-DB tables), decisions (one decision transaction), launcher
(spawning and settling fires), scheduler (``CronScheduler``: every decision, ``tick``/``step``),
waker (``CronWaker``: APScheduler wake-ups and the spawn pool), plan, zones, report, errors,
settings. See docs/cron.md.
"""
