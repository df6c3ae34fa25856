"""dispatcher/gateway: ``dispatch serve`` — cron, kanban and the registry in one process."""
