"""dispatcher/cron: crontab semantics, the fire-key ledger and the scheduler (see scheduler.py)."""
