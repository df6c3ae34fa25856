"""Notifications: the ``notify:`` config section, the outbox tables and the sender.

Events are written to the outbox by the stores that record them (the write side is
:mod:`dispatcher.launch.outbox`, so cron and kanban can both reach it); this package reads the
config into routes, keeps the ``notify`` component's tables, and delivers from the outbox in
``dispatch serve``. It never imports cron, kanban or the gateway.
"""
