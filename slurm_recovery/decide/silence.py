"""Silence: a node whose sidecar stops reporting while the node runs a job.

A sidecar sends something every ``sidecar.status_interval`` at the latest (its status, when it
has nothing else). A node that goes quiet for longer than ``controller.missing_report_grace``
while Slurm shows it running a job has lost its sidecar, its network, or itself: Slurm notices
the last two only after ``SlurmdTimeout`` (minutes). The silence becomes one finding about the
node (evidence ``sidecar_silent``), weak system evidence for the attribution of that job's
failure (``decide.attribute``): it never drains, stops or requeues anything on its own, since a
sidecar restarted by an admin is as silent as a dead node.

Pure: the caller says when each node was last heard from, what runs where, and which silences
it has already recorded (one finding per silence: a node heard from again, then silent again,
is a new one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from slurm_recovery.scheduler.base import Job

#: The evidence kind of a silence, and its source (the controller noticed it).
KIND = "sidecar_silent"
SOURCE = "controller"


@dataclass(frozen=True)
class Silence:
    """A node running ``jobs`` that has not reported since ``last_report``."""

    node: str
    last_report: float
    silent_for: float
    jobs: tuple[int, ...]

    def payload(self, grace: float) -> dict[str, object]:
        return {
            "last_report": self.last_report,
            "silent_for": round(self.silent_for, 3),
            "grace": grace,
            "jobs": list(self.jobs),
        }


def jobs_by_node(jobs: Iterable[Job]) -> dict[str, tuple[int, ...]]:
    """node -> the ids of the jobs Slurm shows running on it, in order."""
    found: dict[str, list[int]] = {}
    for job in jobs:
        if job.state == "RUNNING":
            for node in dict.fromkeys(job.nodes):
                found.setdefault(node, []).append(job.job_id)
    return {node: tuple(sorted(ids)) for node, ids in found.items()}


def new_silences(
    last_report: Mapping[str, float],
    running: Mapping[str, tuple[int, ...]],
    recorded: Mapping[str, float],
    now: float,
    grace: float,
) -> list[Silence]:
    """The nodes that run a job and were last heard from more than ``grace`` ago, whose
    silence since that report is not in ``recorded`` yet (node -> the last report of the
    silence recorded for it). A node never heard from is not judged: it has no sidecar (or
    none this controller has heard since it started and the store remembers). ``grace`` 0:
    none."""
    if grace <= 0:
        return []
    found = []
    for node in sorted(running):
        last = last_report.get(node)
        if last is None or now - last <= grace or recorded.get(node) == last:
            continue
        found.append(Silence(node, last, now - last, running[node]))
    return found
