"""The keeper: the small process that owns a worker's output and writes its exit record.

``program`` is the keeper itself, run as a script with ``python3 -I -S`` (stdlib only, never
imported by the registry); ``start`` builds its command line and waits for it to be ready;
``files`` is the session directory it shares with the registry; ``times`` reads the output
arrival times it notes beside the log.
"""
