"""Processes: identity from /proc and signalling only confirmed processes (``identity``), the
kill policy with escalation and survivor checks (``kill``), and the refusal of worker commands
that would kill the gateway (``refusal``)."""
