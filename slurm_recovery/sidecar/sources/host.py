"""The node's memory pressure, and the sidecar's own footprint, from psutil.

A node short of memory (page cache gone, the OOM killer close) makes jobs die or crawl in ways
that look like the application's fault. When the memory available to new work (the kernel's
``MemAvailable``) falls below :data:`LOW_FRACTION` of the total, the source reports a
``host_memory`` finding (check ``low_memory``, a warning: evidence beside a failure, never a
verdict), and a ``cleared`` one once it is back above :data:`RECOVERED_FRACTION` (the gap
keeps a node near the line from flapping). Its status line gives the sidecar's resident
memory and CPU share, so every ``sidecar_status`` event says what the sidecar itself costs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from slurm_recovery.sidecar.base import Finding

__all__ = ["LOW_FRACTION", "RECOVERED_FRACTION", "HostSource", "Memory"]

#: Below this share of memory available, the node is short of memory.
LOW_FRACTION = 0.05
#: Back above this share, it no longer is.
RECOVERED_FRACTION = 0.10

MIB = 1024 * 1024


class Memory(NamedTuple):
    available: int  # bytes
    total: int  # bytes


def host_memory() -> Memory:
    import psutil

    reading = psutil.virtual_memory()
    return Memory(reading.available, reading.total)


def short_of_memory(memory: Memory, was_short: bool) -> bool:
    """Whether the node is short of memory now, given whether it was at the last poll."""
    share = memory.available / memory.total if memory.total else 1.0
    return share < (RECOVERED_FRACTION if was_short else LOW_FRACTION)


class HostSource:
    """``host_memory`` findings (check, severity, detail, available, total) on each change
    of :func:`short_of_memory`; ``read`` gives the node's memory (psutil unless injected)."""

    name = "host"
    fast = False

    def __init__(self, read: Callable[[], Memory] = host_memory) -> None:
        import psutil

        self.read = read
        self.short = False
        self._me = psutil.Process()
        self._me.cpu_percent()  # the first call starts the measurement; later ones are since

    def poll(self, now: float) -> list[Finding]:
        memory = self.read()
        short = short_of_memory(memory, self.short)
        if short == self.short:
            return []
        self.short = short
        percent = 100.0 * memory.available / memory.total if memory.total else 100.0
        payload = {
            "check": "low_memory",
            "severity": "warning" if short else "info",
            "detail": f"{memory.available // MIB} MiB of {memory.total // MIB} MiB "
            f"available ({percent:.1f}%)",
            "available": memory.available,
            "total": memory.total,
        }
        if not short:
            payload["cleared"] = True
        return [Finding("host_memory", now, payload=payload)]

    def status(self) -> str:
        """The sidecar's own footprint: resident memory, and CPU share since the last call."""
        rss = self._me.memory_info().rss
        cpu = self._me.cpu_percent()
        pressure = "; the node is short of memory" if self.short else ""
        return f"ok, sidecar rss {rss // MIB} MiB, cpu {cpu:.1f}%{pressure}"

    def close(self) -> None:
        pass
