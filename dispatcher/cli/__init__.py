"""The ``dispatch`` command line: one module per subcommand group (see :mod:`.main`)."""
