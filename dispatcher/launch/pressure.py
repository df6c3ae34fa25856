"""Reading the host's pressure for admission: PSI and ``MemAvailable`` from /proc.

``/proc/pressure/memory`` and ``/proc/pressure/cpu`` (PSI, Linux 4.20+ with ``CONFIG_PSI``;
``psi=0`` on the kernel command line makes them fail with EOPNOTSUPP, and some containers hide
them) give ``some avg10=1.23 avg60=... avg300=... total=...``; ``/proc/meminfo`` gives
``MemAvailable:  123456 kB``. What cannot be read is ``None`` in the :class:`Readings`, never
an error: admission then goes by what it has.

:data:`PROC_ENV` names another directory laid out like /proc (``pressure/memory``,
``pressure/cpu``, ``meminfo``): the real-process tests feed a gateway fake readings that way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from dispatcher.launch.admission import Readings

__all__ = ["PROC_ENV", "parse_meminfo", "parse_psi", "proc_root", "read_readings"]

PROC_ENV = "DISPATCH_ADMISSION_PROC"
"""A directory standing in for /proc for admission's readings (tests)."""

_MAX_TEXT = 64 * 1024


def parse_psi(text: str) -> float | None:
    """``some avg10`` of a PSI file, in percent (None when absent or malformed)."""
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind != "some":
            continue
        for field in rest.split():
            name, _, value = field.partition("=")
            if name == "avg10":
                try:
                    number = float(value)
                except ValueError:
                    return None
                return number if math.isfinite(number) and 0 <= number <= 100 else None
    return None


def parse_meminfo(text: str) -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None when absent or malformed)."""
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name != "MemAvailable":
            continue
        words = rest.split()
        if not words or not words[0].isascii() or not words[0].isdigit():
            return None
        unit = words[1] if len(words) > 1 else "B"
        return int(words[0]) * (1024 if unit == "kB" else 1)
    return None


def proc_root(environ: Mapping[str, str]) -> str:
    """Where the readings come from: :data:`PROC_ENV`, else ``/proc``."""
    return environ.get(PROC_ENV) or "/proc"


def read_readings(proc: str | Path = "/proc") -> Readings:
    """The host's readings now (see the module docstring)."""
    root = Path(proc)
    memory = _text(root / "pressure" / "memory")
    cpu = _text(root / "pressure" / "cpu")
    meminfo = _text(root / "meminfo")
    return Readings(
        memory_pressure=parse_psi(memory) if memory is not None else None,
        cpu_pressure=parse_psi(cpu) if cpu is not None else None,
        memory_available=parse_meminfo(meminfo) if meminfo is not None else None,
    )


def _text(path: Path) -> str | None:
    try:
        with path.open("rb") as handle:
            return handle.read(_MAX_TEXT).decode("ascii", errors="replace")
    except OSError:
        # Missing (no PSI), EOPNOTSUPP (psi=0), EACCES: no reading.
        return None
