"""A session's output as programs and people get it: the raw log read, selected, stamped and
followed (``log``, behind the contract's ``read_log``/``follow_log``), the rolling text tail
(``tail``), the transform hook then redaction on every text handed out (``hooks``,
``redact``)."""
