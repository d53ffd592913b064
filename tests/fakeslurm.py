"""A fake Slurm for unit tests that keeps the scheduler interface's rules.

It is built like the real backends: the contract's shared checks (merge, read back, sanitized
reasons, no-ops, an array's pending record) come from :class:`SchedulerSteps`, and the raw
writes change in-memory records the way slurmctld changes its own. A step Slurm refuses is
refused here with Slurm's words, typed by the same table the backends use
(:func:`slurm_error`), so code that is wrong against real Slurm is wrong against the fake.
It has the :class:`Scheduler` methods and, like every backend, ``address``; nothing else: a
call outside the interface is an ``AttributeError``. ``tests/unit/test_fakeslurm.py`` holds it
to the interface's signatures;
``tests/integration/test_scheduler_contract.py`` shows the same rules on real Slurm.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from slurm_recovery.contract.hostlist import expand
from slurm_recovery.scheduler.base import Job, Node, SchedulerError, SchedulerSteps
from slurm_recovery.scheduler.errors import slurm_error

#: Job states after which Slurm refuses to signal or release the job.
FINISHED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}
)
#: What Slurm sets as a requeued job's begin time: about 121 s ahead (docs/controller.md).
REQUEUE_DELAY = 121


class FakeSlurm(SchedulerSteps):
    """Jobs and nodes in memory, changed by the steps asked (recorded in ``steps``).

    ``refuse[(step, job id or node name)]`` is raised by that step (after it is recorded);
    ``clock`` is the time the fake's own changes are stamped with (a begin time, an end time).
    """

    name = "fake"

    def __init__(
        self,
        jobs: Iterable[Job] = (),
        nodes: Iterable[Node] = (),
        *,
        cluster: str = "c1",
        slurm_version: str = "24.11.5",
        refuse: dict[tuple[str, int | str], SchedulerError] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.jobs = {j.job_id: j for j in jobs}
        self.nodes = {n.name: n for n in nodes}
        self.cluster = cluster
        self.slurm_version = slurm_version
        self.refuse = dict(refuse or {})
        self.clock = clock
        #: (step, its arguments) for each step a caller asked, in order; a step's own inner
        #: steps (cancel's admin comment) are not listed.
        self.steps: list[tuple[str, tuple[object, ...]]] = []
        self._in_step = False

    @contextmanager
    def _step(self, step: str, target: int | str, *args: object) -> Iterator[None]:
        """Record a step the caller asked (not one a step makes itself), or refuse it."""
        if self._in_step:
            yield
            return
        self.steps.append((step, (target, *args)))
        if (step, target) in self.refuse:
            raise self.refuse[(step, target)]
        self._in_step = True
        try:
            yield
        finally:
            self._in_step = False

    def _job(self, job_id: int, refused_when: Callable[[Job], str]) -> Job:
        """The job a write names (UnknownJob, or InvalidRequest for an array's pending record,
        as the backends' :meth:`address`), refused with Slurm's words if its state says so."""
        self.address(job_id)
        job = self.jobs[job_id]
        if message := refused_when(job):
            raise slurm_error(f"job {job_id}", message)
        return job

    # --- reads ---

    def cluster_name(self) -> str:
        return self.cluster

    def version(self) -> str:
        return self.slurm_version

    def list_jobs(self) -> list[Job]:
        jobs = list(self.jobs.values())
        self._remember(jobs)
        return jobs

    def get_job(self, job_id: int) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise slurm_error(f"show job {job_id}", "Invalid job id specified")
        self._remember([job])
        return job

    def list_nodes(self) -> list[Node]:
        return list(self.nodes.values())

    def get_node(self, name: str) -> Node:
        if name not in self.nodes:
            raise slurm_error(f"show node {name}", "Invalid node name specified")
        return self.nodes[name]

    # --- steps: the interface's, recorded; their rules in SchedulerSteps and the writes below

    def requeue_hold(self, job_id: int) -> None:
        with self._step("requeue_hold", job_id):
            job = self._job(job_id, _why_not_requeued)
            self.jobs[job_id] = replace(
                job,
                state="PENDING",
                reason="JobHeldAdmin",
                held=True,
                nodes=(),
                restart_count=job.restart_count + 1,
                begin_time=int(self.clock()) + REQUEUE_DELAY,
            )

    def add_excluded_nodes(
        self, job_id: int, nodes: Iterable[str], drop: Iterable[str] = ()
    ) -> frozenset[str]:
        nodes, drop = tuple(nodes), tuple(drop)
        with self._step("add_excluded_nodes", job_id, nodes, drop):
            return super().add_excluded_nodes(job_id, nodes, drop)

    def set_begin_now(self, job_id: int, at: float | None = None) -> None:
        with self._step("set_begin_now", job_id, at):
            super().set_begin_now(job_id, at)

    def release(self, job_id: int) -> None:
        with self._step("release", job_id):
            job = self._job(job_id, _why_not_pending)
            self.jobs[job_id] = replace(job, held=False, reason="None")

    def cancel(self, job_id: int, reason: str) -> None:
        with self._step("cancel", job_id, reason):
            super().cancel(job_id, reason)

    def set_admin_comment(self, job_id: int, text: str) -> None:
        with self._step("set_admin_comment", job_id, text):
            super().set_admin_comment(job_id, text)

    def drain_node(self, name: str, reason: str) -> None:
        with self._step("drain_node", name, reason):
            super().drain_node(name, reason)

    def resume_node(self, name: str) -> None:
        with self._step("resume_node", name):
            super().resume_node(name)

    # --- the raw writes SchedulerSteps makes after its checks ---

    def _write_excluded_nodes(self, job_id: int, expr: str) -> None:
        job = self._job(job_id, _why_not_pending)
        self.jobs[job_id] = replace(job, excluded_nodes=frozenset(expand(expr)))

    def _write_begin_now(self, job_id: int, at: float | None) -> None:
        job = self._job(job_id, _why_not_pending)
        begin = math.ceil(at) if at is not None else int(self.clock())
        self.jobs[job_id] = replace(job, begin_time=begin)

    def _write_admin_comment(self, job_id: int, comment: str) -> None:
        job = self._job(job_id, lambda job: "")
        self.jobs[job_id] = replace(job, admin_comment=comment)

    def _signal_cancel(self, job_id: int) -> None:
        job = self._job(job_id, _why_not_signalled)
        self.jobs[job_id] = replace(job, state="CANCELLED", held=False, end_time=int(self.clock()))

    def _write_node_state(self, name: str, state: str, reason: str | None) -> None:
        node = self.get_node(name)
        if state == "DRAIN":
            assert reason, "Slurm refuses a drain without a reason"
            self.nodes[name] = replace(
                node, flags=node.flags | {"DRAIN"}, reason=reason, reason_set_by="root"
            )
        elif state == "RESUME":
            if not node.drained and node.state not in ("DOWN", "FAIL"):
                raise slurm_error(f"update node {name}", "Invalid node state specified")
            base = "IDLE" if node.state in ("DOWN", "FAIL") else node.state
            self.nodes[name] = replace(
                node, state=base, flags=node.flags - {"DRAIN"}, reason="", reason_set_by=""
            )
        else:
            raise AssertionError(f"the backends never write node state {state}")


def _why_not_requeued(job: Job) -> str:
    if job.state == "PENDING":
        return "Job is pending execution"
    if not job.batch:
        return "Only batch jobs are accepted or processed"
    if not job.requeueable:
        return "Requested operation is presently disabled"
    if job.state == "COMPLETING":
        return "Job can not be altered now, try again later"
    return ""


def _why_not_pending(job: Job) -> str:
    if job.state in FINISHED_STATES:
        return "Job has already finished"
    return "" if job.state == "PENDING" else "Job is no longer pending execution"


def _why_not_signalled(job: Job) -> str:
    return "Job/step already completing or completed" if job.state in FINISHED_STATES else ""
