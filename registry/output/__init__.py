"""A session's output as programs see it: the raw log read and tailed (``tail``), the transform
hook then redaction on every text handed out (``hooks``, ``redact``)."""
