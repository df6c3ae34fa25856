"""Process limits ``dispatch serve`` needs beyond the defaults it is started with."""

from __future__ import annotations

import logging
import resource

__all__ = ["raise_fd_limit"]

log = logging.getLogger("dispatch.gateway")


def raise_fd_limit() -> None:
    """Lift the soft open-files limit to the hard one: every followed worker costs the gateway
    a few descriptors, and systemd's default soft limit (1024) is reached near 500 workers."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as err:
            log.warning("cannot raise the open-files limit from %d: %s", soft, err)
