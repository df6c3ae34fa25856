"""dispatcher/kanban: the board store, the dispatcher tick and the failure taxonomy.

Modules: :mod:`~dispatcher.kanban.model` (vocabulary and records), :mod:`~dispatcher.kanban.abc`
(the store contract), :mod:`~dispatcher.kanban.store` (SQLite), :mod:`~dispatcher.kanban.taxonomy`
(exit codes → card transitions, breaker), :mod:`~dispatcher.kanban.worker` (argv, env, body file),
:mod:`~dispatcher.kanban.tick` (``tick(now)``), :mod:`~dispatcher.kanban.board` (validated
operator and worker actions), :mod:`~dispatcher.kanban.lookup` (card/run ids for ``dispatch
logs``), :mod:`~dispatcher.kanban.views` (JSON and text). A board opened for one command is
:class:`dispatcher.app.workspace.Workspace` (the layer above).

Nothing is re-exported here: ``dispatcher.settings`` imports this package for its config section,
and importing the package must stay cheap. Import from the modules.
"""
