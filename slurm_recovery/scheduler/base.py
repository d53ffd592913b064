"""What the controller needs from Slurm: the records it reads and the steps it takes.

Backends (``scontrol``, ``pyslurm``) implement :class:`Scheduler`; the rest of the project
reaches Slurm only through a backend (the controller, the watchdog, the sidecar's question
about a job's output files, ``srecovery compare``). Two exceptions, neither in production: the
demo submits and cancels jobs as a user would (``sbatch``, ``scancel``), and ``localcluster``
starts the local cluster's daemons. Every refusal by Slurm becomes a :class:`SchedulerError`
subclass carrying Slurm's own message, so a failed step is never silent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

#: Job states in which the job still holds or waits for resources.
#: Slurm reports some flags (REQUEUE_HOLD, SPECIAL_EXIT, ...) as the job's state.
ACTIVE_JOB_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETING",
        "REQUEUED",
        "RESIZING",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "SPECIAL_EXIT",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
    }
)


#: Longest drain reason / admin comment we send; sinfo -R shows the first ~20 characters
#: by default, so the useful words must come first anyway.
MAX_REASON_LENGTH = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def sanitize_reason(reason: str) -> str:
    """A reason safe to show in ``sinfo -R``: one line, no control characters, bounded."""
    text = " ".join(_CONTROL.sub(" ", reason).split())
    if not text:
        raise ValueError("a reason is required")
    return text[:MAX_REASON_LENGTH]


def admin_comment_for(reason: str) -> str:
    """The AdminComment recorded on a job we cancel, so admins see who did it and why."""
    return sanitize_reason(f"slurm-recovery: {reason}")


@dataclass(frozen=True)
class ExitCode:
    """A job's exit: ``returncode`` of the batch script, or the ``signal`` that killed it."""

    returncode: int = 0
    signal: int = 0

    def __str__(self) -> str:  # Slurm's own "rc:sig" spelling, as in sacct/squeue
        return f"{self.returncode}:{self.signal}"


@dataclass(frozen=True)
class Job:
    """One Slurm job as the scheduler shows it now (one attempt: see ``restart_count``)."""

    job_id: int
    name: str
    state: str  # as Slurm 22.05 spells it on every release (scheduler.slurmjson)
    reason: str
    user: str
    partition: str
    nodes: tuple[str, ...]
    num_nodes: int
    submit_time: int
    restart_count: int
    excluded_nodes: frozenset[str] = frozenset()
    exit_code: ExitCode = ExitCode()
    held: bool = False
    begin_time: int = 0
    start_time: int = 0
    end_time: int = 0
    stdout_path: str | None = None
    admin_comment: str = ""
    requeueable: bool = True  # False for jobs submitted with --no-requeue
    required_nodes: frozenset[str] = frozenset()  # --nodelist: the job may run only there
    state_flags: frozenset[str] = frozenset()  # 23.02+: every flag beside the base state
    stderr_path: str | None = None
    array_job_id: int = 0  # an array task: its array's id (0 when not in an array)
    array_task_id: int | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_JOB_STATES


@dataclass(frozen=True)
class Node:
    """One Slurm node: base ``state`` (IDLE, ALLOCATED, MIXED, DOWN, ...) plus ``flags``."""

    name: str
    state: str
    flags: frozenset[str] = frozenset()
    reason: str = ""
    partitions: tuple[str, ...] = field(default_factory=tuple)
    address: str = ""  # NodeAddr: where slurmctld reaches it (and where its reports come from)
    hostname: str = ""  # NodeHostname
    reason_set_by: str = ""  # the user who set ``reason``
    reason_changed_at: int = 0

    @property
    def drained(self) -> bool:
        """True while the node takes no new work (DRAIN set, whether DRAINING or DRAINED)."""
        return "DRAIN" in self.flags


def earliest_restart(requeued_at: float) -> float:
    """The first moment a requeued job may start again on a node of its previous attempt.

    A requeue revokes the job's credential on its nodes at the requeue's whole second, and
    slurmd refuses a credential created in that same second ("Killing non-startable batch
    JobId=N: Job credential revoked"; seen on 22.05 with a release 0.15 s after the requeue).
    Plain Slurm hides this behind its ~121 s requeue delay; we wait for the next second.
    """
    return math.floor(requeued_at) + 1.0


class SchedulerError(Exception):
    """Slurm refused or could not be asked. ``slurm_message`` is Slurm's own words."""

    def __init__(self, message: str, *, slurm_message: str = "", command: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.slurm_message = slurm_message
        self.command = command

    def __str__(self) -> str:
        detail = f" (slurm: {self.slurm_message})" if self.slurm_message else ""
        return f"{self.message}{detail}"


class UnknownJob(SchedulerError):
    """No such job id in slurmctld (never existed, or purged after MinJobAge)."""


class UnknownNode(SchedulerError):
    """No such node name in slurm.conf."""


class PermissionDenied(SchedulerError):
    """Our uid may not do this (we need root or the SlurmUser for most steps)."""


class Unreachable(SchedulerError):
    """slurmctld did not answer within the configured timeout."""


class UnsupportedOutput(SchedulerError):
    """Slurm printed a record whose shape this parser does not know (a release it was not
    tested on): a reason that will not change by retrying, named with the field and release."""

    def __init__(self, message: str, slurm_version: str, *, field: str = "") -> None:
        super().__init__(f"Slurm {slurm_version}: {message}")
        self.slurm_version = slurm_version
        self.field = field


class InvalidRequest(SchedulerError):
    """Slurm understood the request and refused it in this state (e.g. requeue a pending job)."""


@runtime_checkable
class Scheduler(Protocol):
    """The scheduler operations the controller uses, and nothing more."""

    name: str

    def cluster_name(self) -> str:
        """ClusterName from slurm.conf: part of every job-attempt key."""
        ...

    def version(self) -> str:
        """Slurm version of the running slurmctld, e.g. ``"22.05.8"``."""
        ...

    def list_jobs(self) -> list[Job]: ...

    def get_job(self, job_id: int) -> Job:
        """Raises :class:`UnknownJob`."""
        ...

    def list_nodes(self) -> list[Node]: ...

    def get_node(self, name: str) -> Node:
        """Raises :class:`UnknownNode`."""
        ...

    def requeue_hold(self, job_id: int) -> None:
        """Stop a running job and put it back to pending, held (so we can edit it)."""
        ...

    def add_excluded_nodes(self, job_id: int, nodes: Iterable[str]) -> frozenset[str]:
        """Merge ``nodes`` into the pending job's exclusions; returns the new whole set.

        Slurm *replaces* ExcNodeList on update, so backends read, merge, then write.
        """
        ...

    def set_begin_now(self, job_id: int) -> None:
        """Clear the ~121 s BeginTime Slurm sets on requeue, so release starts it at once."""
        ...

    def release(self, job_id: int) -> None: ...

    def cancel(self, job_id: int, reason: str) -> None:
        """Cancel the job, recording ``reason`` in its AdminComment first (visible to admins)."""
        ...

    def set_admin_comment(self, job_id: int, text: str) -> None:
        """Replace the job's AdminComment (one line, sanitized): the tool's marks and notes."""
        ...

    def drain_node(self, name: str, reason: str) -> None:
        """Drain with a reason that shows in ``sinfo -R``."""
        ...

    def resume_node(self, name: str) -> None: ...


class SchedulerSteps:
    """The contract's checks, shared by every backend: merge, verify, sanitize, no-ops.

    A backend supplies reads (``get_job``, ``get_node``) and the raw writes below; the
    rules that make each step safe to repeat and never silent live here, once.
    """

    def get_job(self, job_id: int) -> Job:
        raise NotImplementedError

    def get_node(self, name: str) -> Node:
        raise NotImplementedError

    def _write_excluded_nodes(self, job_id: int, expr: str) -> None:
        raise NotImplementedError

    def _write_begin_now(self, job_id: int) -> None:
        raise NotImplementedError

    def _write_admin_comment(self, job_id: int, comment: str) -> None:
        raise NotImplementedError

    def _signal_cancel(self, job_id: int) -> None:
        raise NotImplementedError

    def _write_node_state(self, name: str, state: str, reason: str | None) -> None:
        raise NotImplementedError

    def add_excluded_nodes(self, job_id: int, nodes: Iterable[str]) -> frozenset[str]:
        from slurm_recovery.hostlist import compress, expand

        job = self.get_job(job_id)
        wanted = job.excluded_nodes.union(*(expand(n) for n in nodes))
        if wanted == job.excluded_nodes:
            return wanted  # already there: nothing to write, so nothing to refuse
        if job.state != "PENDING":
            raise InvalidRequest(
                f"job {job_id} is {job.state}: exclusions change only while it is pending"
            )
        self._write_excluded_nodes(job_id, compress(wanted))
        shown = self.get_job(job_id).excluded_nodes
        if not wanted <= shown:
            raise SchedulerError(
                f"job {job_id}: asked Slurm to exclude {compress(wanted)}, "
                f"it shows {compress(shown) or 'nothing'}"
            )
        return shown

    def set_begin_now(self, job_id: int) -> None:
        import time

        job = self.get_job(job_id)
        if job.state != "PENDING":
            # Slurm sets the requeue BeginTime when the job leaves COMPLETING; an earlier
            # update is silently overwritten, so refuse rather than pretend.
            raise InvalidRequest(f"job {job_id} is {job.state}: begin time applies to pending")
        self._write_begin_now(job_id)
        begin = self.get_job(job_id).begin_time
        if begin > time.time() + 2:
            raise SchedulerError(f"job {job_id}: begin time still {begin} after setting it now")

    def cancel(self, job_id: int, reason: str) -> None:
        self._write_admin_comment(job_id, admin_comment_for(reason))
        self._signal_cancel(job_id)

    def set_admin_comment(self, job_id: int, text: str) -> None:
        self._write_admin_comment(job_id, sanitize_reason(text))

    def drain_node(self, name: str, reason: str) -> None:
        self._write_node_state(name, "DRAIN", sanitize_reason(reason))

    def resume_node(self, name: str) -> None:
        node = self.get_node(name)
        if not node.drained and node.state not in ("DOWN", "FAIL"):
            return  # already in service: resuming is a no-op, not an error
        self._write_node_state(name, "RESUME", None)
