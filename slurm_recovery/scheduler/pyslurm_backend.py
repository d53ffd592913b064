"""Scheduler backend over pyslurm (Slurm's C API): the production default where it imports.

pyslurm's API follows Slurm's own major release: pyslurm 25.11.x (the only series on PyPI)
builds only against Slurm 25.11 headers and talks only to a 25.11 slurmctld.

This path cannot run on the development and CI machines: they have Debian's Slurm 22.05,
against which pyslurm 25.11 neither builds nor talks. What covers it here is
``tests/unit/test_pyslurm_backend.py``: the translation in both directions (pyslurm objects
to ``base.Job``/``base.Node``, each operation to the exact pyslurm calls, ``RPCError`` to
the typed errors), run over a recorded model of the pyslurm 25.11.2 objects in
``tests/unit/pyslurm_model/``. What runs it for real is the contract suite in
``tests/integration``, parametrized over backends, on any host where pyslurm imports
against a matching Slurm (:func:`available` says whether this host is one).

pyslurm is imported inside functions only, so this module imports wherever pyslurm is
absent; backend selection ``auto`` asks :func:`available` first.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from slurm_recovery.contract.hostlist import expand
from slurm_recovery.scheduler.base import (
    ExitCode,
    InvalidRequest,
    Job,
    Node,
    SchedulerError,
    SchedulerSteps,
    UnknownJob,
    UnknownNode,
    slurm_time,
)
from slurm_recovery.scheduler.errors import slurm_error

#: Reasons Slurm shows for a held job (``state_reason`` is the state description when
#: Slurm set one, as for ``requeue(hold=True)``, else the reason code's name).
HELD_REASONS = frozenset({"JobHeldAdmin", "JobHeldUser", "job requeued in held state"})

# pyslurm raises some RPCErrors of its own, with no Slurm errno behind them (errno stays
# SLURM_ERROR). pyslurm 25.11.2: core/node.pyx Node.load, core/job/job.pyx Job.load.
_PYSLURM_OWN_ERRORS: tuple[tuple[re.Pattern[str], type[SchedulerError]], ...] = (
    (re.compile(r"^Node '.*' does not exist$"), UnknownNode),
    (re.compile(r"^RPC was successful but got no job data"), UnknownJob),
)


def _major_minor(version: str | None) -> str | None:
    """``"25.05"`` for Slurm's ``25.05.3`` and for pyslurm's ``25.5.0`` (pyslurm drops the
    zero), so the two compare as the release they are."""
    match = re.match(r"^\s*(\d+)\.(\d+)", version or "")
    return f"{int(match[1])}.{int(match[2]):02d}" if match else None


def available() -> tuple[bool, str]:
    """Whether pyslurm imports here and speaks the running slurmctld's release, and why."""
    try:
        import pyslurm
    except Exception as exc:  # ImportError, or libslurm/slurm.conf trouble at import
        return False, f"pyslurm does not import: {type(exc).__name__}: {exc}"
    built_for = getattr(pyslurm, "__version__", None)
    try:
        running = pyslurm.slurmctld.Config.load().version
    except pyslurm.RPCError as exc:
        return False, (
            f"pyslurm {built_for} imports, but slurmctld did not say its version: "
            f"{getattr(exc, 'msg', None) or exc}"
        )
    if _major_minor(built_for) is None or _major_minor(built_for) != _major_minor(running):
        return False, (
            f"pyslurm {built_for} is for Slurm {_major_minor(built_for)}, but slurmctld "
            f"runs Slurm {running}: install pyslurm {_major_minor(running)}.x or use the "
            "scontrol backend"
        )
    return True, f"pyslurm {built_for} matches slurmctld {running}"


def _str(value: Any) -> str:
    """pyslurm gives None for strings Slurm left unset."""
    return "" if value is None else str(value)


def _int(value: Any) -> int:
    """pyslurm gives None for unset numbers and times (0 or NO_VAL in Slurm)."""
    return value if isinstance(value, int) else 0


def job_from_pyslurm(job: Any) -> Job:
    """A ``pyslurm.Job`` (25.11) as a :class:`base.Job`."""
    reason = _str(job.state_reason)
    return Job(
        job_id=int(job.id),
        name=_str(job.name),
        state=_str(job.state),
        reason=reason,
        user=_str(job.user_name),
        partition=_str(job.partition),
        nodes=tuple(expand(job.allocated_nodes)),
        num_nodes=_int(job.num_nodes),
        submit_time=_int(job.submit_time),
        restart_count=_int(job.requeue_count),
        excluded_nodes=frozenset(expand(job.excluded_nodes)),
        exit_code=ExitCode(_int(job.exit_code), _int(job.exit_code_signal)),
        held=job.priority == 0 or reason in HELD_REASONS,
        begin_time=_int(job.eligible_time),  # Slurm's BeginTime, shown as EligibleTime
        start_time=_int(job.start_time),
        end_time=_int(job.end_time),
        stdout_path=job.standard_output or None,
        admin_comment=_str(job.admin_comment),
        requeueable=job.is_requeueable is not False,  # job.pyx: is_requeueable (u16 bool)
        required_nodes=frozenset(expand(job.required_nodes)),  # job.pyx: required_nodes
        array_job_id=_int(job.array_id),  # job.pyx: array_id, array_task_id (None if unset)
        array_task_id=job.array_task_id if _int(job.array_id) else None,
        batch=job.is_batch_job is not False,  # job.pyx: is_batch_job (batch_flag)
    )


def node_from_pyslurm(node: Any) -> Node:
    """A ``pyslurm.Node`` (25.11) as a :class:`base.Node`.

    pyslurm spells the state as Slurm's ``node_state_string_complete``: the base state,
    then ``+FLAG`` for each flag (``"IDLE+DRAIN"``, ``"MIXED+DRAIN+NOT_RESPONDING"``).
    """
    base, *flags = _str(node.state).split("+") if node.state else ["UNKNOWN"]
    return Node(
        name=_str(node.name),
        state=base,
        flags=frozenset(flags),
        reason=_str(node.reason),
        partitions=tuple(node.partitions or ()),
        address=_str(node.address),
        hostname=_str(node.hostname),
    )


class PyslurmScheduler(SchedulerSteps):
    """:class:`base.Scheduler` over pyslurm 25.11 (``Job``, ``Node``, ``slurmctld.Config``)."""

    name = "pyslurm"

    def __init__(self) -> None:
        import pyslurm

        self._ps = pyslurm

    def _call(self, action: str, command: str, fn: Callable[[], Any]) -> Any:
        """Run one pyslurm call; its ``RPCError`` becomes our typed error, in Slurm's words."""
        try:
            return fn()
        except self._ps.RPCError as exc:
            message = _str(getattr(exc, "msg", None)) or str(exc)
            for pattern, error in _PYSLURM_OWN_ERRORS:
                if pattern.search(message):
                    raise error(f"{action} failed", slurm_message=message, command=command) from exc
            errno = getattr(exc, "errno", None)
            raise slurm_error(
                action, message, errno=errno if isinstance(errno, int) else None, command=command
            ) from exc

    def cluster_name(self) -> str:
        config = self._call(
            "read slurmctld config",
            "pyslurm.slurmctld.Config.load()",
            self._ps.slurmctld.Config.load,
        )
        return _str(config.cluster_name)

    def version(self) -> str:
        config = self._call(
            "read slurmctld config",
            "pyslurm.slurmctld.Config.load()",
            self._ps.slurmctld.Config.load,
        )
        return _str(config.version)

    def list_jobs(self) -> list[Job]:
        jobs = self._call("list jobs", "pyslurm.Jobs.load()", self._ps.Jobs.load)
        found = sorted((job_from_pyslurm(j) for j in jobs.values()), key=lambda j: j.job_id)
        self._remember(found)
        return found

    def _load_job(self, job_id: int) -> Any:
        return self._call(
            f"read job {job_id}",
            f"pyslurm.Job.load({job_id})",
            lambda: self._ps.Job.load(job_id),
        )

    def get_job(self, job_id: int) -> Job:
        job = job_from_pyslurm(self._load_job(job_id))
        if job.job_id != job_id:
            # Job.load takes the first record Slurm sends; for an array's id Slurm sends
            # every task, so pick the one whose own id this is from the whole listing.
            job = next((j for j in self.list_jobs() if j.job_id == job_id), None)
            if job is None:
                raise UnknownJob(f"job {job_id} not found", command=f"pyslurm.Job.load({job_id})")
        self._remember([job])
        return job

    def _target(self, job_id: int) -> int:
        """The number a pyslurm write sends for ``job_id``.

        pyslurm names jobs by number only, and Slurm reads a number that is an array's id
        as every task of that array. An array task is sent as its own id when that differs
        from the array's; the task that carries the array's own id is refused, not sent.
        """
        address = self.address(job_id)
        array_id, _, task = address.partition("_")
        if task and int(array_id) == job_id:
            raise InvalidRequest(
                f"job {job_id} is array task {address}, whose id is also the array's: pyslurm "
                "can name it only by that number, which Slurm applies to every task; "
                "nothing done (the scontrol backend names it exactly)"
            )
        return job_id

    def list_nodes(self) -> list[Node]:
        nodes = self._call("list nodes", "pyslurm.Nodes.load()", self._ps.Nodes.load)
        return sorted((node_from_pyslurm(n) for n in nodes.values()), key=lambda n: n.name)

    def get_node(self, name: str) -> Node:
        node = self._call(
            f"read node {name}",
            f"pyslurm.Node.load({name!r})",
            lambda: self._ps.Node.load(name),
        )
        return node_from_pyslurm(node)

    def requeue_hold(self, job_id: int) -> None:
        job_id = self._target(job_id)
        self._call(
            f"requeue job {job_id} held",
            f"pyslurm.Job({job_id}).requeue(hold=True)",
            lambda: self._ps.Job(job_id).requeue(hold=True),
        )

    def _modify_job(self, job_id: int, action: str, **changes: Any) -> None:
        job_id = self._target(job_id)
        shown = ", ".join(f"{k}={v!r}" for k, v in changes.items())
        self._call(
            action,
            f"pyslurm.Job({job_id}).modify(JobSubmitDescription({shown}))",
            lambda: self._ps.Job(job_id).modify(self._ps.JobSubmitDescription(**changes)),
        )

    def _write_excluded_nodes(self, job_id: int, expr: str) -> None:
        self._modify_job(job_id, f"exclude nodes from job {job_id}", excluded_nodes=expr)

    def _write_begin_now(self, job_id: int, at: float | None) -> None:
        # pyslurm passes a begin_time string to slurm_parse_time, as scontrol does for
        # StartTime=now; slurmctld moves a time in the past up to its own "now".
        when = "now" if at is None else slurm_time(at)
        self._modify_job(job_id, f"set begin time of job {job_id} to {when}", begin_time=when)

    def release(self, job_id: int) -> None:
        job_id = self._target(job_id)
        self._call(
            f"release job {job_id}",
            f"pyslurm.Job({job_id}).release()",
            lambda: self._ps.Job(job_id).release(),
        )

    def _write_admin_comment(self, job_id: int, comment: str) -> None:
        self._modify_job(job_id, f"record cancel reason on job {job_id}", admin_comment=comment)

    def _signal_cancel(self, job_id: int) -> None:
        job_id = self._target(job_id)
        self._call(
            f"cancel job {job_id}",
            f"pyslurm.Job({job_id}).cancel()",
            lambda: self._ps.Job(job_id).cancel(),
        )

    def _modify_node(self, name: str, action: str, **changes: Any) -> None:
        shown = ", ".join(f"{k}={v!r}" for k, v in changes.items())
        self._call(
            action,
            f"pyslurm.Node({name!r}).modify(pyslurm.Node({shown}))",
            lambda: self._ps.Node(name).modify(self._ps.Node(**changes)),
        )

    def _write_node_state(self, name: str, state: str, reason: str | None) -> None:
        changes = {"state": state} if reason is None else {"state": state, "reason": reason}
        self._modify_node(name, f"set node {name} {state}", **changes)
