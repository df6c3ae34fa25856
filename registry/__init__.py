"""registry/: every launched process: spawn, output, kill, completions, adoption.

Uses scope/ for placement; never imports dispatcher/. The contract is :mod:`registry.abc`;
:mod:`registry.process` is the real implementation (keepers and real processes) and
:mod:`registry.fake` the in-memory one. The pieces of the real one: :mod:`registry.keeper` (the
per-session keeper script), :mod:`registry.launch` (starting it), :mod:`registry.sessiondir`
(the files it shares), :mod:`registry.store` (durable sessions), :mod:`registry.follower` and
:mod:`registry.output` (following output), :mod:`registry.kill` and :mod:`registry.procinfo`
(the kill policy and process identity), :mod:`registry.guard` (the gateway-kill refusal),
:mod:`registry.prune`. Events: :mod:`registry.events` (the durable event table),
:mod:`registry.notifier` (heartbeat and watch events on one timer thread),
:mod:`registry.heartbeat`, :mod:`registry.watch`, and the output hooks :mod:`registry.hooks`
with :mod:`registry.redact`. :mod:`registry.state` is the shared state database;
:mod:`registry.backup` checks, copies and restores it.
"""

__version__ = "0.1.0"
