"""Processes: identity from /proc and signalling only confirmed processes (``identity``), the
kill policy with escalation and survivor checks (``kill``), and the refusal of worker commands
that would kill the gateway (``refusal``).

The package itself is a public face: :class:`Identity` (a pid and its kernel start time) and
:func:`send` (signal a process only while it is still that one), for callers outside the
registry that must signal a process they know by identity (``dispatch reload``)."""

from registry.proc.identity import Identity, send

__all__ = ["Identity", "send"]
