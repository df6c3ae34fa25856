"""What is kept in the state database: the database itself (``database``: connections, the
versioned components and their migrations, private paths), the registry's tables (``tables``),
sessions (``sessions``, with their typed ``changes`` and the ``retention`` rule), durable
events (``events``), and checking, copying and restoring the file (``backup``)."""
