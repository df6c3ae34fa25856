"""registry/: every launched process: spawn, output, kill, completions, adoption.

Uses scope/ for placement; never imports dispatcher/. The contract is :mod:`registry.abc` (with
:mod:`registry.errors`, :mod:`registry.settings` and :mod:`registry.environment`);
:mod:`registry.process` is the real implementation and :mod:`registry.fake` the in-memory one.
The real one is built from:

* ``lifecycle/`` a session's life: spawn, stop, reconcile, finalize, owners, view, prune;
* ``live/`` what happens while sessions run: the follower, heartbeat and watch events;
* ``keeper/`` the per-session keeper program, starting it, the files it shares, output times;
* ``store/`` the state database and what the registry keeps in it: sessions, events, backups;
* ``output/`` a session's output: the log read and followed, the tail, hooks, redaction;
* ``proc/`` processes: identity from /proc, the kill policy, the gateway-kill refusal.
"""

__version__ = "0.1.0"
