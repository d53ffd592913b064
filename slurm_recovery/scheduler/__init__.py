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

    ``timeout``, ``bin_dir`` and ``slurm_conf`` apply to the scontrol backend; pyslurm reads
    slurm.conf through libslurm (set ``SLURM_CONF`` in the environment to point it elsewhere).
    """
    from slurm_recovery.scheduler import pyslurm_backend
    from slurm_recovery.scheduler.scontrol import ScontrolScheduler

    if backend not in BACKENDS:
        raise ValueError(f"unknown scheduler backend {backend!r}: one of {', '.join(BACKENDS)}")
    if backend in ("auto", "pyslurm"):
        ok, why = pyslurm_backend.available()
        if ok:
            return pyslurm_backend.PyslurmScheduler()
        if backend == "pyslurm":
            raise SchedulerError(f"scheduler.backend = 'pyslurm' but {why}")
        log.info("scheduler backend auto: using scontrol (%s)", why)
    return ScontrolScheduler(timeout=timeout, bin_dir=bin_dir, slurm_conf=slurm_conf)
