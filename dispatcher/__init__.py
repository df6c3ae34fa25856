"""dispatcher/: cron, kanban, the gateway (``dispatch serve``) and the ``dispatch`` CLI.

Uses registry/ and scope/; nothing imports it.
"""

__version__ = "0.1.0"
