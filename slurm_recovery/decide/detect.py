"""Detect: which job attempts are in trouble now. Evidence and Slurm's view in, incidents out.

Pure and deterministic: no clock, no files, no logging. Three rules, checked per job in order of
job id, at most one new incident per job attempt ``(job_id, restart_count)``:

1. CRASH: the job ended in failure (FAILED, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL). Jobs that
   completed, were cancelled, timed out, were preempted or missed their deadline are not crashes.
2. DOOMED: the job is RUNNING and fatal node evidence (a fatal, non-application XID, or an
   operator's report) arrived for one of its nodes since it started: it cannot finish, so it is
   restarted away now rather than when it exits or hangs. A GPU-scoped XID (catalogue
   ``scope``) dooms only the jobs Slurm's GRES shows on that GPU (:func:`concerns_job`).
3. APP_FAULT: the job is RUNNING, a recognised log line says its application failed, and the
   job is still running ``fatal_evidence_window.settle`` after that line. This incident is advice
   only (``advise`` gives it action none, no drain): a log line explains a failure, it does not
   create one. A job that then exits is a CRASH, one that stops making progress a HANG, each
   judged with the same lines.

On Slurm 25.11+ an ``--requeue=expedite`` job that exits non-zero is never shown FAILED: with
no failed Epilog Slurm requeues and holds it itself (REQUEUE_HOLD, restart count + 1, no
nodes); with one (a node's health check, or ``hooks.epilog_gate`` on a fault the sidecar proved)
it drains the node and requeues the job at once, so the next view shows it PENDING or RUNNING
again. :func:`with_failed_attempts` shows such a job as the attempt that failed, from its hooks'
evidence, so rule 1 sees the crash it would see without expedite and the audit tells what
Slurm did.

Node evidence the node itself has since cleared (a GPU reset, a healthy reading:
:mod:`decide.cleared`) dooms nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence

from slurm_recovery.contract.hostlist import compress
from slurm_recovery.decide.cleared import repaired_ids, still_open
from slurm_recovery.decide.joblogs import judge_job_log, of_attempt
from slurm_recovery.decide.model import (
    ClusterView,
    Evidence,
    FaultClass,
    Incident,
    IncidentKind,
    by_job,
)
from slurm_recovery.decide.policy import Policy
from slurm_recovery.scheduler.base import ExitCode, Job, Node
from slurm_recovery.signals.xid import XidCatalogue, xid_code

#: Job end states that are failures (a crash incident). Any other end is not ours to fix.
FAILED_STATES = frozenset({"FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"})

#: Evidence this many seconds before the job's start still belongs to the attempt (clocks on
#: the nodes and the head node differ a little; Slurm's start time has whole-second precision).
START_SLACK = 2.0


def held_by_expedited_requeue(job: Job) -> bool:
    """Slurm's own requeue-hold of an ``--requeue=expedite`` job whose last attempt exited
    non-zero (25.11+ ``batch_requeue_fini``): not the tool's hold (no hold mark) and not an
    operator's ``requeuehold`` of a running job (that attempt ends by a signal, not an exit)."""
    return (
        job.expedited_requeue
        and job.state == "REQUEUE_HOLD"
        and job.held
        and job.restart_count > 0
        and job.exit_code.returncode != 0
        and job.exit_code.signal == 0
        and not job.admin_comment.startswith("srecovery:held:")
    )


def requeued_by_expedite(job: Job) -> bool:
    """An ``--requeue=expedite`` job back in the queue or running again after a requeue and
    not held: possibly Slurm's requeue of a failed attempt (a failed Epilog), possibly an
    operator's; :func:`with_failed_attempts` tells them apart by the proven fault."""
    return (
        job.expedited_requeue
        and job.restart_count > 0
        and not job.held
        and job.state in ("PENDING", "CONFIGURING", "RUNNING", "EXPEDITING")
    )


def with_failed_attempts(
    view: ClusterView,
    evidence: Sequence[Evidence],
    catalogue: XidCatalogue | None = None,
    has_incident: Callable[[Job], bool] = lambda job: False,
) -> ClusterView:
    """``view`` with each ``--requeue=expedite`` job that Slurm requeued after a failed
    attempt shown as that attempt: FAILED, its restart count, nodes and start as its hooks
    reported them (``job_start``/``job_end``). Two cases:

    - Slurm's hold after a non-zero exit (:func:`held_by_expedited_requeue`);
    - Slurm's immediate requeue after a failed Epilog (:func:`requeued_by_expedite`): only
      when the attempt ended in failure and fatal node evidence (``catalogue``) on one of its
      nodes explains it, so an operator's ``scontrol requeue`` is never taken for a crash; and
      only until that attempt has an incident (``has_incident``), since the job's new attempt
      is the one to watch from then on.

    Without the attempt's ``job_end`` (the hooks are not installed, or it is still on its way)
    the job is left as Slurm shows it: nothing is guessed."""
    replaced: dict[int, Job] = {}
    fatal_nodes: dict[str, list[float]] | None = None  # indexed once, only when needed
    for job in view.jobs.values():
        held = held_by_expedited_requeue(job)
        if not held and not (catalogue is not None and requeued_by_expedite(job)):
            continue
        if not held and fatal_nodes is None and catalogue is not None:
            fatal_nodes = {}
            for ev in still_open(evidence):  # as detect() reads node evidence: cleared is gone
                if ev.node is not None and is_fatal_node_event(ev, catalogue):
                    fatal_nodes.setdefault(ev.node, []).append(ev.observed_at)
        failed = job.restart_count - 1
        mine = [
            ev
            for ev in evidence
            if ev.job_id == job.job_id and ev.payload.get("restart_count") == failed
        ]
        ends = [ev for ev in mine if ev.kind == "job_end" and ev.node is None]
        ends = ends or [ev for ev in mine if ev.kind == "job_end"]
        if not ends:
            continue
        end = min(ends, key=_evidence_order)
        starts = [ev.observed_at for ev in mine if ev.kind == "job_start"]
        nodes = tuple(str(n) for n in end.payload.get("nodes") or ())
        start = min(starts) if starts else 0.0
        if not held and not (
            _ended_badly(end.payload)
            and any(
                start - START_SLACK <= at <= end.observed_at + START_SLACK
                for node in nodes
                for at in (fatal_nodes or {}).get(node, ())
            )
        ):
            continue
        shown = dataclasses.replace(
            job,
            state="FAILED",
            restart_count=failed,
            nodes=nodes or job.nodes,
            start_time=int(start),
            end_time=int(end.observed_at),
            exit_code=ExitCode(_int(end.payload.get("exit_code")), _int(end.payload.get("signal")))
            if not held
            else job.exit_code,
            held=False,
        )
        if held or not has_incident(shown):
            replaced[job.job_id] = shown
    if not replaced:
        return view
    return dataclasses.replace(view, jobs={**view.jobs, **replaced})


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _ended_badly(job_end: Mapping[str, object]) -> bool:
    """A ``job_end`` payload's exit: non-zero or by a signal (the job's or its script's)."""
    return any(
        _int(job_end.get(key))
        for key in ("exit_code", "signal", "derived_exit_code", "derived_signal")
    )


def detect(
    view: ClusterView,
    evidence: Sequence[Evidence],
    open_or_done: Collection[tuple[int, int]],
    catalogue: XidCatalogue,
    policy: Policy,
    advised: Collection[tuple[int, int]] | None = None,
) -> list[Incident]:
    """New incidents, in order of job id; attempts in ``open_or_done`` are skipped.

    ``advised``: attempts that already have an APP_FAULT advice (not raised again; their later
    crash is still detected); None: the attempts in ``open_or_done``.
    """
    skip = set(open_or_done)
    advised_once = skip if advised is None else set(advised)
    # Each job looks only at its own evidence and at the fatal events of its own nodes:
    # indexed once, so a pass costs jobs + evidence, not jobs x evidence (bench/decision_scale)
    ordered = sorted(still_open(evidence), key=_evidence_order)
    of_job = by_job(ordered)
    fatal_on: dict[str, list[Evidence]] = {}
    repaired = repaired_ids(ordered)  # answered by a drain an operator has since resumed
    for ev in ordered:
        if ev.node is not None and ev.id not in repaired and is_fatal_node_event(ev, catalogue):
            fatal_on.setdefault(ev.node, []).append(ev)
    found: list[Incident] = []
    for job_id in sorted(view.jobs):
        job = view.jobs[job_id]
        if (job.job_id, job.restart_count) in skip:
            continue
        own = of_job.get(job.job_id, [])
        on_nodes = sorted(
            (ev for node in set(job.nodes) for ev in fatal_on.get(node, ())), key=_evidence_order
        )
        incident = (
            _crash(job, own, view)
            or _doomed(job, on_nodes, catalogue, view.nodes)
            or (
                None
                if (job.job_id, job.restart_count) in advised_once
                else _app_fault(job, own, view.now, policy.fatal_evidence_window.settle)
            )
        )
        if incident is not None:
            found.append(incident)
    return found


#: Sidecar findings about a node (GPU health, fabric ports); payload ``severity`` says how bad.
NODE_FINDING_KINDS = frozenset({"gpu_finding", "ib_finding"})

#: Sidecar checks of the node's GPU software rather than its hardware: ``driver_version_mismatch``
#: (the sidecar's own nvmlInit: the host's NVML library and the loaded kernel module differ until
#: a reboot). Every new GPU process on the node fails, while the processes already running keep
#: the library they loaded and work on: such a finding explains a failure on its node (a
#: decisive *system* finding, :mod:`decide.attribute`) but dooms no running job and is no
#: hardware event (:func:`is_fatal_node_event`).
NODE_SOFTWARE_CHECKS = frozenset({"driver_version_mismatch"})


def is_fatal_node_event(ev: Evidence, catalogue: XidCatalogue) -> bool:
    """True for evidence that a node can no longer run work: an operator's report, a sidecar
    finding of severity ``fatal`` (not of :data:`NODE_SOFTWARE_CHECKS`: the running work is
    fine), or an XID the catalogue calls fatal whose fault is not the application's."""
    if ev.node is None:
        return False
    if ev.kind == "operator_report":
        return True
    if ev.kind in NODE_FINDING_KINDS:
        return (
            ev.payload.get("severity") == "fatal"
            and ev.payload.get("check") not in NODE_SOFTWARE_CHECKS
        )
    if ev.kind != "xid":
        return False
    code = xid_code(ev.payload)
    if code is None:
        return False
    info = catalogue.assess(code, str(ev.payload.get("message", "")))
    return info.fatal and info.fault_class is not FaultClass.APPLICATION


def holds_gpu(job: Job, node: str, gpu: int, nodes: Mapping[str, Node] | None) -> bool:
    """Whether ``job`` may be using GPU ``gpu`` of ``node``. False only when Slurm says so:
    the node has GPU GRES (with ``gpu`` among them) and the job's GPU indices are known and
    leave ``gpu`` out there (a job without GPU GRES holds none). Anything unknown: True."""
    info = nodes.get(node) if nodes else None
    if info is None or not 0 <= gpu < info.gpus or job.gpus is None:
        return True
    return gpu in job.gpus.get(node, frozenset())


def concerns_job(
    ev: Evidence, job: Job, catalogue: XidCatalogue, nodes: Mapping[str, Node] | None
) -> bool:
    """Evidence about one of the job's nodes that reaches the job: all of it, except a
    GPU-scoped XID (catalogue ``scope = "gpu"``) on a GPU the job does not hold there."""
    if ev.node is None or ev.node not in job.nodes:
        return False
    if ev.kind != "xid" or ev.gpu is None:
        return True
    code = xid_code(ev.payload)
    if code is None or not catalogue.lookup(code).gpu_scoped:
        return True
    return holds_gpu(job, ev.node, ev.gpu, nodes)


def in_attempt(ev: Evidence, job: Job) -> bool:
    """The evidence was observed during (or just before) this attempt of the job, and does
    not name another attempt."""
    return ev.observed_at >= job.start_time - START_SLACK and of_attempt(ev, job.restart_count)


def _evidence_order(ev: Evidence) -> tuple[float, int]:
    return (ev.observed_at, ev.id)


def _crash(job: Job, evidence: Sequence[Evidence], view: ClusterView) -> Incident | None:
    if job.state not in FAILED_STATES:
        return None
    ends = [
        ev
        for ev in evidence
        if ev.kind == "job_end" and ev.job_id == job.job_id and in_attempt(ev, job)
    ]
    if job.end_time > 0:
        failed_at = float(job.end_time)
    elif ends:
        failed_at = ends[0].observed_at
    else:
        failed_at = view.now  # Slurm shows no end time yet: the failure is no later than now
    return Incident(
        job_id=job.job_id,
        restart_count=job.restart_count,
        submit_time=job.submit_time,
        kind=IncidentKind.CRASH,
        failed_at=failed_at,
        trigger_ids=tuple(sorted(ev.id for ev in ends)),
        summary=f"job {job.job_id} ended {job.state} (exit {job.exit_code}) on {_nodes(job)}",
    )


def _doomed(
    job: Job,
    evidence: Sequence[Evidence],
    catalogue: XidCatalogue,
    nodes: Mapping[str, Node] | None = None,
) -> Incident | None:
    """A running job with fatal node evidence that reaches it (:func:`concerns_job`): a
    GPU-scoped XID dooms only the jobs on that GPU, anything else every job on the node."""
    if job.state != "RUNNING":
        return None
    fatal = [
        ev
        for ev in evidence
        if in_attempt(ev, job)
        and is_fatal_node_event(ev, catalogue)
        and concerns_job(ev, job, catalogue, nodes)
    ]
    if not fatal:
        return None
    first = fatal[0]
    return Incident(
        job_id=job.job_id,
        restart_count=job.restart_count,
        submit_time=job.submit_time,
        kind=IncidentKind.DOOMED,
        failed_at=first.observed_at,
        trigger_ids=tuple(sorted(ev.id for ev in fatal)),
        summary=f"job {job.job_id} running on {_nodes(job)}: {_describe(first, catalogue)}",
    )


def _app_fault(
    job: Job, evidence: Sequence[Evidence], now: float, settle: float
) -> Incident | None:
    """The running job's own log says its application failed: the verdict on its lines (as
    ``srecovery explain-log`` gives it) is an application fault. A rank's exception after
    another task was killed, or after a hardware fault, is not one. Raised only once the job
    has kept running ``settle`` after the first such line (one that exits at once is a
    crash, judged with these lines); advice only, never a stop or a requeue."""
    if job.state != "RUNNING":
        return None
    judged = judge_job_log(evidence, job, since=job.start_time - START_SLACK)
    if judged is None or judged.verdict.fault_domain != FaultClass.APPLICATION.value:
        return None
    root = judged.verdict.signatures[0]["id"] if judged.verdict.signatures else "a fatal error"
    first = min(
        (ev for ev in evidence if ev.id in judged.evidence_ids), key=lambda ev: ev.observed_at
    )
    if now - first.observed_at < settle:
        return None
    return Incident(
        job_id=job.job_id,
        restart_count=job.restart_count,
        submit_time=job.submit_time,
        kind=IncidentKind.APP_FAULT,
        failed_at=first.observed_at,
        trigger_ids=tuple(sorted(judged.evidence_ids)),
        summary=f"job {job.job_id} still running on {_nodes(job)}: application reported {root}",
    )


def _nodes(job: Job) -> str:
    return compress(job.nodes) or "no nodes"


def _describe(ev: Evidence, catalogue: XidCatalogue) -> str:
    where = f"{ev.node}" + (f" gpu{ev.gpu}" if ev.gpu is not None else "")
    if ev.kind == "xid":
        code = xid_code(ev.payload)
        label = catalogue.lookup(code).label if code is not None else "xid"
        return f"{label} on {where}"
    reason = " ".join(str(ev.payload.get("reason", "")).split())[:80]
    return f"operator report on {where}" + (f": {reason}" if reason else "")
