"""How long the kernel makes a scope placement wait: the cgroup ``favordynmods`` option.

Placing a process into a new scope moves it between cgroups, which takes the kernel's
threadgroup lock for writing. Without ``favordynmods`` that lock is per-CPU and fast to read
(fork and exit), but a writer first waits for an RCU grace period unless another writer ran
moments before. So placements back to back are cheap, and a placement after a quiet moment (a
gateway starting one card now and then) waits several milliseconds in the kernel, once for
every hierarchy the manager attaches the process to. Measured on the development VM (Linux
6.18, hybrid layout, systemd 252): one move between two cgroups after a 50 ms pause took
5.8 ms without the option and 0.36 ms with it; a whole D-Bus placement after 50 ms idle 19.9
and 7.8 ms; the gateway's ready -> worker running p99 28.8 and 12.3 ms. The option makes every
fork and exit a little dearer, which the same runs did not show in dispatch throughput.

The option is a host setting: a mount option of cgroup2 (Linux 6.0+), changeable by remount,
or ``cgroup_favordynmods=true`` on the kernel command line (Linux 6.7+, cgroup v1 too). One
mount carrying it switches the lock for the whole system. ``dispatch doctor`` reports it with
the remedy; nothing here changes the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scope.cgroup import parse_mountinfo

__all__ = ["FEATURES", "OPTION", "PlacementLatency", "placement_latency", "read_placement_latency"]

OPTION = "favordynmods"
FEATURES = "/sys/kernel/cgroup/features"
"""The cgroup features this kernel offers, one per line (cgroup-v2.rst)."""


@dataclass(frozen=True, kw_only=True)
class PlacementLatency:
    """Whether placements after a quiet moment wait on the kernel, and what changes that."""

    state: str
    """``on`` (some cgroup mount has the option), ``off`` (the kernel offers it, no mount has
    it), ``unsupported`` (a kernel without it) or ``unknown`` (nothing could be read)."""
    mounts: tuple[str, ...]
    """The cgroup2 mount points (the ones a remount would change)."""
    detail: str
    remedy: str | None

    def to_json(self) -> dict[str, object]:
        """The doctor's view."""
        return {
            "favordynmods": self.state,
            "mounts": list(self.mounts),
            "detail": self.detail,
            "remedy": self.remedy,
        }


def placement_latency(mountinfo: str, features: str | None) -> PlacementLatency:
    """Judge ``mountinfo`` text and the kernel's cgroup ``features`` (None: not readable)."""
    try:
        found = parse_mountinfo(mountinfo)
    except ValueError:
        found = []  # a line we cannot read: judged as if no cgroup were mounted
    entries = [e for e in found if e.fstype in ("cgroup", "cgroup2")]
    v2 = tuple(str(e.mount_point) for e in entries if e.fstype == "cgroup2")
    if any(OPTION in e.super_options.split(",") for e in entries):
        detail = f"cgroups mounted with {OPTION}: a placement after a quiet moment does not wait"
        return PlacementLatency(state="on", mounts=v2, detail=detail, remedy=None)
    offered = features is not None and OPTION in features.split()
    if features is None and not entries:
        return PlacementLatency(
            state="unknown", mounts=v2, detail="no cgroup mount found", remedy=None
        )
    if not offered:
        detail = (
            f"this kernel has no {OPTION} (Linux 6.0+): a scope placed after a quiet moment "
            "waits several milliseconds in the kernel"
        )
        return PlacementLatency(state="unsupported", mounts=v2, detail=detail, remedy=None)
    where = v2[0] if v2 else "/sys/fs/cgroup"
    detail = (
        f"cgroup2 at {where} is mounted without {OPTION}: a scope placed after a quiet moment "
        "waits several milliseconds in the kernel (docs/benchmarks.md)"
    )
    remedy = (
        f"for lower spawn latency: mount -o remount,{OPTION} {where} (as root, until reboot), "
        f"or boot with cgroup_{OPTION}=true (Linux 6.7+)"
    )
    return PlacementLatency(state="off", mounts=v2, detail=detail, remedy=remedy)


def read_placement_latency(
    mountinfo_path: str | Path = "/proc/self/mountinfo", features_path: str | Path = FEATURES
) -> PlacementLatency:
    """:func:`placement_latency` of this host (unreadable files count as absent)."""
    try:
        mountinfo = Path(mountinfo_path).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        mountinfo = ""
    try:
        features: str | None = Path(features_path).read_text(encoding="ascii", errors="replace")
    except OSError:
        features = None
    return placement_latency(mountinfo, features)
