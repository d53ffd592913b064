"""What the controller needs from Slurm: the records it reads and the steps it takes.

Backends (``scontrol``, ``pyslurm``) implement :class:`Scheduler`; the rest of the project
reaches Slurm only through a backend. The controller, the watchdog and ``srecovery slurm`` use
the configured one through this interface; the sidecar (a job's output files) and ``srecovery
compare`` use the scontrol backend, and ``compare`` also reads accounting (``sacct``,
``sacctmgr``), which no method here covers, through that backend's bounded runner
(``ScontrolScheduler.query``). Two doors bypass the backends, neither in production: the demo
submits and cancels jobs as a user would (``sbatch``, ``scancel``), and ``localcluster``
starts the local cluster's daemons and waits for them (``sinfo``, ``scontrol ping``). Every
refusal by Slurm becomes a :class:`SchedulerError` subclass carrying Slurm's own message, so a
failed step is never silent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from slurm_recovery.holdmark import CANCEL_NOTE, CommentFull, parse_hold_mark, with_mark, with_note

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
        "EXPEDITING",  # 25.11+: Slurm requeueing an --requeue=expedite job on its own
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
    """The tool's note on a job we cancel, so admins see who did it and why (put beside the
    site's own AdminComment text: :mod:`slurm_recovery.holdmark`)."""
    return sanitize_reason(f"{CANCEL_NOTE}{reason}")


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
    array_task_id: int | None = None  # None in an array's pending record (``17_[4-9]``)
    batch: bool = True  # False for srun/salloc jobs: Slurm refuses to requeue them
    #: 25.11+: submitted ``--requeue=expedite`` (job flag ``EXPEDITED_REQUEUE``): Slurm itself
    #: requeues it after a node failure or a failed Epilog, and holds it after any other failure
    expedited_requeue: bool = False
    #: node -> the GPU indices (GRES ``IDX``) the job holds there; a node where it holds none
    #: is absent. None: Slurm did not say (no GRES detail, ``IDX:N/A``, MPS/shard sharing).
    gpus: Mapping[str, frozenset[int]] | None = field(default=None, hash=False)
    #: a heterogeneous job's component (``sbatch ... : ...``): its leader's id (the first
    #: component's own) and its place in the job; 0 and 0 off heterogeneous jobs
    het_job_id: int = 0
    het_job_offset: int = 0
    #: ``--constraint`` as typed (``"a100&ib"``); "" when none
    features: str = ""

    @property
    def pending_array_record(self) -> bool:
        """The record of an array's tasks not started yet: not one job, so never acted on."""
        return bool(self.array_job_id) and self.array_task_id is None

    @property
    def slurm_address(self) -> str:
        """How Slurm's commands name exactly this job: ``<array>_<task>`` for an array task,
        whose own id may equal the array's id, which names every task of the array."""
        if self.array_job_id and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.job_id)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_JOB_STATES

    @property
    def held_by_slurm(self) -> bool:
        """Held by slurmctld itself, not by a person: a pending job its scheduler found it can
        never run as it stands (reason ``BadConstraints``, priority 0: job_scheduler.c,
        "non-runnable"). Any update of the job (its exclusions, say) makes Slurm weigh it
        again; an operator's hold is ``JobHeldAdmin`` or ``JobHeldUser``."""
        return self.held and self.state == "PENDING" and self.reason == "BadConstraints"

    @property
    def held_by_someone(self) -> bool:
        """Held by a user or an operator (``scontrol hold``): a hold the tool leaves alone."""
        return self.held and not self.held_by_slurm


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
    gpus: int = 0  # GPU GRES configured on the node (``Gres=gpu:8``); 0: none, or not known
    #: the node's active features (what ``--constraint`` matches); None: not known
    features: frozenset[str] | None = None

    @property
    def drained(self) -> bool:
        """True while the node takes no new work (DRAIN set, whether DRAINING or DRAINED)."""
        return "DRAIN" in self.flags


def slurm_time(at: float) -> str:
    """``at`` (epoch seconds) as Slurm's time arguments take it: local time, whole seconds
    rounded up (a begin time is "not before")."""
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(math.ceil(at)))


def earliest_restart(requeued_at: float) -> float:
    """The first moment a requeued job may start again on a node of its previous attempt.

    A requeue revokes the job's credential on its nodes at the requeue's whole second, and
    slurmd refuses a credential created in that same second ("Killing non-startable batch
    JobId=N: Job credential revoked"; seen on 22.05 with a release 0.15 s after the requeue).
    Plain Slurm hides this behind its ~121 s requeue delay; the tool sets the begin time to the
    next second and releases at once, so its own hold lasts only while it sets exclusions.
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

    def add_excluded_nodes(
        self, job_id: int, nodes: Iterable[str], drop: Iterable[str] = ()
    ) -> frozenset[str]:
        """Merge ``nodes`` into the pending job's exclusions, less ``drop`` (the tool's own
        earlier exclusions of nodes repaired since); returns the new whole set.

        Slurm *replaces* ExcNodeList on update, so backends read, merge, then write.
        """
        ...

    def set_begin_now(self, job_id: int, at: float | None = None) -> None:
        """Replace the ~121 s BeginTime Slurm sets on requeue by now (or ``at``, epoch
        seconds: the first second the job may start again), so release starts it then."""
        ...

    def release(self, job_id: int) -> None: ...

    def cancel(self, job_id: int, reason: str) -> None:
        """Cancel the job, recording ``reason`` in its AdminComment first (visible to admins),
        beside the site's own text."""
        ...

    def set_admin_comment(self, job_id: int, text: str) -> None:
        """Replace the tool's part of the job's AdminComment by ``text`` (its hold mark or a
        note), keeping the site's own text (:mod:`slurm_recovery.holdmark`)."""
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

    #: why open_scheduler chose this backend (shown by ``srecovery slurm``)
    chosen_because = ""

    def get_job(self, job_id: int) -> Job:
        raise NotImplementedError

    def get_node(self, name: str) -> Node:
        raise NotImplementedError

    def _remember(self, jobs: Iterable[Job]) -> None:
        """Keep each job's Slurm address from a read (``list_jobs``, ``get_job``), so a write
        names exactly that job (``None``: an array's pending record, never written to)."""
        addresses: dict[int, str | None] = vars(self).setdefault("_job_addresses", {})
        for job in jobs:
            addresses[job.job_id] = None if job.pending_array_record else job.slurm_address

    def address(self, job_id: int) -> str:
        """The name every job-targeted write uses for ``job_id`` (:attr:`Job.slurm_address`).

        A bare array id names every task of the array in Slurm's commands, so an id not read
        yet is read first rather than sent bare. Raises :class:`UnknownJob`, or
        :class:`InvalidRequest` for an array's pending record (tasks not started yet).
        """
        addresses: dict[int, str | None] = vars(self).setdefault("_job_addresses", {})
        if addresses.get(job_id) is None:
            self._remember([self.get_job(job_id)])  # unknown, or a pending record that may
            # since have become its last task (Slurm gives the last task the array's id)
        found = addresses.get(job_id)
        if found is None:
            raise InvalidRequest(
                f"job {job_id} is the pending record of array {job_id} (tasks not started "
                "yet), not one job: a step on it would reach every task; nothing done"
            )
        return found

    def _write_excluded_nodes(self, job_id: int, expr: str) -> None:
        raise NotImplementedError

    def _write_begin_now(self, job_id: int, at: float | None) -> None:
        raise NotImplementedError

    def _write_admin_comment(self, job_id: int, comment: str) -> None:
        raise NotImplementedError

    def _signal_cancel(self, job_id: int) -> None:
        raise NotImplementedError

    def _write_node_state(self, name: str, state: str, reason: str | None) -> None:
        raise NotImplementedError

    def add_excluded_nodes(
        self, job_id: int, nodes: Iterable[str], drop: Iterable[str] = ()
    ) -> frozenset[str]:
        from slurm_recovery.contract.hostlist import compress, expand

        job = self.get_job(job_id)
        dropped = frozenset().union(*(expand(n) for n in drop))
        wanted = (job.excluded_nodes - dropped).union(*(expand(n) for n in nodes))
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

    def set_begin_now(self, job_id: int, at: float | None = None) -> None:
        import time

        job = self.get_job(job_id)
        if job.state != "PENDING":
            # Slurm sets the requeue BeginTime when the job leaves COMPLETING; an earlier
            # update is silently overwritten, so refuse rather than pretend.
            raise InvalidRequest(f"job {job_id} is {job.state}: begin time applies to pending")
        self._write_begin_now(job_id, at)
        begin = self.get_job(job_id).begin_time
        if begin > max(time.time(), at or 0) + 2:
            raise SchedulerError(f"job {job_id}: begin time still {begin} after setting it now")

    def cancel(self, job_id: int, reason: str) -> None:
        self.set_admin_comment(job_id, admin_comment_for(reason))
        self._signal_cancel(job_id)

    def set_admin_comment(self, job_id: int, text: str) -> None:
        # Read just before writing: the site's text is whatever Slurm holds now.
        current = self.get_job(job_id).admin_comment
        mark = parse_hold_mark(text)
        try:
            comment = with_mark(current, *mark) if mark else with_note(current, text)
        except CommentFull as exc:
            raise InvalidRequest(f"job {job_id}: {exc}") from None
        if comment != current:
            self._write_admin_comment(job_id, comment)

    def drain_node(self, name: str, reason: str) -> None:
        self._write_node_state(name, "DRAIN", sanitize_reason(reason))

    def resume_node(self, name: str) -> None:
        node = self.get_node(name)
        if not node.drained and node.state not in ("DOWN", "FAIL"):
            return  # already in service: resuming is a no-op, not an error
        self._write_node_state(name, "RESUME", None)
