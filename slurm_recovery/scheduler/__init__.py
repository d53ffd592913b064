"""Scheduler access: the one door to Slurm. ``open_scheduler`` picks the backend."""

from __future__ import annotations

import logging

from slurm_recovery.scheduler.base import (
    ExitCode,
    InvalidRequest,
    Job,
    Node,
    PermissionDenied,
    Scheduler,
    SchedulerError,
    UnknownJob,
    UnknownNode,
    Unreachable,
)

__all__ = [
    "BACKENDS",
    "ExitCode",
    "InvalidRequest",
    "Job",
    "Node",
    "PermissionDenied",
    "Scheduler",
    "SchedulerError",
    "UnknownJob",
    "UnknownNode",
    "Unreachable",
    "open_scheduler",
]

BACKENDS = ("auto", "scontrol", "pyslurm")
log = logging.getLogger(__name__)


def open_scheduler(
    backend: str = "auto", *, timeout: float = 15.0, bin_dir: str = "", slurm_conf: str = ""
) -> Scheduler:
    """The configured backend; ``auto`` takes pyslurm only where it matches the running Slurm.

    ``timeout`` bounds every call of either backend (pyslurm's run in a worker process so
    that they can be bounded); ``slurm_conf`` is the slurm.conf both read; ``bin_dir`` is
    where the scontrol backend finds Slurm's commands.
    """
    from slurm_recovery.scheduler import pyslurm_backend
    from slurm_recovery.scheduler.scontrol import ScontrolScheduler

    if backend not in BACKENDS:
        raise ValueError(f"unknown scheduler backend {backend!r}: one of {', '.join(BACKENDS)}")
    if backend == "scontrol":
        sched: ScontrolScheduler | pyslurm_backend.PyslurmScheduler = ScontrolScheduler(
            timeout=timeout, bin_dir=bin_dir, slurm_conf=slurm_conf
        )
        sched.chosen_because = "scheduler.backend = 'scontrol'"
        return sched
    ok, why = pyslurm_backend.available()
    if ok:
        sched = pyslurm_backend.PyslurmScheduler(timeout=timeout, slurm_conf=slurm_conf)
    elif backend == "pyslurm":
        raise SchedulerError(f"scheduler.backend = 'pyslurm' but {why}")
    else:
        # a site that installed pyslurm meant it to be used: say loudly why it is not
        level = logging.WARNING if pyslurm_backend.importable() else logging.INFO
        log.log(level, "scheduler backend auto: using scontrol (%s)", why)
        sched = ScontrolScheduler(timeout=timeout, bin_dir=bin_dir, slurm_conf=slurm_conf)
    sched.chosen_because = f"scheduler.backend = {backend!r}: {why}"
    return sched
