"""dispatcher/kanban: the board store, the dispatcher tick and the failure taxonomy."""
