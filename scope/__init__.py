"""scope/: where a launched process may live (systemd scopes, bus, probe, placement policy).

Uses nothing else of this project. See :mod:`scope.abc` for the contract.
"""

__version__ = "0.1.0"
