"""Whether a job's GPUs on this node are working: ``gpu_activity`` evidence on each change.

A job that stopped stepping usually stops using its GPUs too (a rank stuck in data loading, a
deadlock on the host, a dead peer on a collective that gave up). This source reads the GPU
backend's utilization at every slow poll and, per job running on this node, sends one
``gpu_activity`` event when the job's GPUs turn busy (any of them at ``busy_percent`` or more)
or idle (all below it): a handful of events per job, not a stream. The controller treats a job
whose GPUs went idle on every node, after having been busy, as hung when that lasts
``hang.gpu_idle`` and the job reports no step progress of its own (docs/progress.md).

Not a hang signal on its own when NCCL is involved: a rank blocked in an NCCL collective keeps
its GPU at 100 % (the kernel spins), so a collective hang looks busy here. Step progress
(log lines, the progress file) is what catches those.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from slurm_recovery.sidecar.base import Finding

log = logging.getLogger("srecovery.sidecar.gpuactivity")

#: Utilization (percent) from which a GPU counts as working, as nvidia-smi reads it.
BUSY_PERCENT = 10


class Telemetry(Protocol):
    def telemetry(self) -> Mapping[int, Mapping[str, Any]]: ...


@dataclass
class _Job:
    gpus: tuple[int, ...] | None  # None: every GPU of the node (no GRES binding known)
    busy: bool | None = None  # last state sent; None: nothing sent yet


def utilization(readings: Mapping[str, Any]) -> int | None:
    """A GPU's utilization in percent from the backend's telemetry, or None when unknown."""
    value = readings.get("utilization_gpu")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


class GpuActivitySource:
    """Slow source: ``gpu_activity`` {busy, utilization, gpus} per job when its GPUs on this
    node turn busy or idle."""

    name = "gpu_activity"
    fast = False

    def __init__(self, backend: Telemetry, node: str, busy_percent: int = BUSY_PERCENT) -> None:
        self.backend = backend
        self.node = node
        self.busy_percent = busy_percent
        self.jobs: dict[int, _Job] = {}
        # see() runs in whichever loop queued the findings; poll() takes them in order
        self._events: deque[Finding] = deque()

    def see(self, findings: Iterable[Finding]) -> None:
        """Note this node's job_start / job_end events (taken in by the next poll)."""
        self._events.extend(f for f in findings if f.kind in ("job_start", "job_end"))

    def _take_events(self) -> None:
        while self._events:
            f = self._events.popleft()
            if f.job_id is None or f.payload.get("health_gate"):
                continue
            if f.kind == "job_start" and self.node in (f.payload.get("nodes") or [self.node]):
                gpus = f.payload.get("gpus")
                indexes = None
                if isinstance(gpus, list) and gpus and all(type(g) is int for g in gpus):
                    indexes = tuple(gpus)  # UUIDs / MIG names: fall back to every GPU
                self.jobs.setdefault(f.job_id, _Job(indexes))
            elif f.kind == "job_end":
                self.jobs.pop(f.job_id, None)

    def poll(self, now: float) -> list[Finding]:
        self._take_events()
        if not self.jobs:
            return []
        try:
            readings = self.backend.telemetry()
        except Exception as exc:  # the GPU backend reports its own trouble
            log.debug("no telemetry: %s", exc)
            return []
        out = []
        for job_id, job in sorted(self.jobs.items()):
            wanted = readings.keys() if job.gpus is None else job.gpus
            values = {i: utilization(readings[i]) for i in wanted if i in readings}
            known = {i: v for i, v in values.items() if v is not None}
            if not known:
                continue
            busy = max(known.values()) >= self.busy_percent
            if busy == job.busy:
                continue
            job.busy = busy
            out.append(
                Finding(
                    "gpu_activity",
                    now,
                    job_id=job_id,
                    payload={
                        "busy": busy,
                        "utilization": max(known.values()),
                        "gpus": sorted(known),
                    },
                )
            )
        return out

    def status(self) -> str:
        return f"ok, watching {len(self.jobs)} job(s)"

    def close(self) -> None:
        self.jobs.clear()
