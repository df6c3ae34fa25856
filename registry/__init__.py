"""registry/: every launched process: spawn, output, kill, completions, adoption.

Uses scope/ for placement; never imports dispatcher/. See :mod:`registry.abc` for the contract
and :mod:`registry.state` for the shared state database.
"""

__version__ = "0.1.0"
