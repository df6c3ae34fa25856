"""A session's life cycle: the parts of :class:`~registry.process.ProcessRegistry`.

``parts`` is the wiring they share; ``spawn`` starts a worker under a keeper and records it;
``stop`` is the registry's kill (the OS side is :mod:`registry.proc.kill`); ``reconcile``
brings a stored session in line with its files and processes and adopts live keepers;
``finalize`` is the one place a session becomes final; ``owners`` answers an owner's questions
(events, acknowledgements, handoff, teardown); ``view`` hands out output snapshots; ``prune``
deletes what has expired.
"""
