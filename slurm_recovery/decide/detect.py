"""Detect: which job attempts are in trouble now. Evidence and Slurm's view in, incidents out.

Pure and deterministic: no clock, no files, no logging. Three rules, checked per job in order of
job id, at most one new incident per job attempt ``(job_id, restart_count)``:

1. CRASH: the job ended in failure (FAILED, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL). Jobs that
   completed, were cancelled, timed out, were preempted or missed their deadline are not crashes.
2. DOOMED: the job is RUNNING and fatal node evidence (a fatal, non-application XID, or an
   operator's report) arrived for one of its nodes since it started: it cannot finish, so it is
   restarted away now rather than when it exits or hangs.
3. APP_FAULT: the job is RUNNING and a recognised log line says its application failed.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from slurm_recovery.decide.catalogue import XidCatalogue, xid_code
from slurm_recovery.decide.hang import of_attempt
from slurm_recovery.decide.joblogs import judge_job_log
from slurm_recovery.decide.model import (
    ClusterView,
    Evidence,
    FaultClass,
    Incident,
    IncidentKind,
)
from slurm_recovery.decide.policy import Policy
from slurm_recovery.hostlist import compress
from slurm_recovery.scheduler.base import Job

#: Job end states that are failures (a crash incident). Any other end is not ours to fix.
FAILED_STATES = frozenset({"FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"})

#: Evidence this many seconds before the job's start still belongs to the attempt (clocks on
#: the nodes and the head node differ a little; Slurm's start time has whole-second precision).
START_SLACK = 2.0


def detect(
    view: ClusterView,
    evidence: Sequence[Evidence],
    open_or_done: Collection[tuple[int, int]],
    catalogue: XidCatalogue,
    policy: Policy,
) -> list[Incident]:
    """New incidents, in order of job id; attempts in ``open_or_done`` are skipped.

    ``policy`` is accepted so that detection settings can live in the policy file; the rules
    above need none yet.
    """
    skip = set(open_or_done)
    ordered = sorted(evidence, key=_evidence_order)
    found: list[Incident] = []
    for job_id in sorted(view.jobs):
        job = view.jobs[job_id]
        if (job.job_id, job.restart_count) in skip:
            continue
        incident = (
            _crash(job, ordered, view)
            or _doomed(job, ordered, catalogue)
            or _app_fault(job, ordered)
        )
        if incident is not None:
            found.append(incident)
    return found


#: Sidecar findings about a node (GPU health, fabric ports); payload ``severity`` says how bad.
NODE_FINDING_KINDS = frozenset({"gpu_finding", "ib_finding"})


def is_fatal_node_event(ev: Evidence, catalogue: XidCatalogue) -> bool:
    """True for evidence that a node can no longer run work: an operator's report, a sidecar
    finding of severity ``fatal``, or an XID the catalogue calls fatal whose fault is not the
    application's."""
    if ev.node is None:
        return False
    if ev.kind == "operator_report":
        return True
    if ev.kind in NODE_FINDING_KINDS:
        return ev.payload.get("severity") == "fatal"
    if ev.kind != "xid":
        return False
    code = xid_code(ev.payload)
    if code is None:
        return False
    info = catalogue.assess(code, str(ev.payload.get("message", "")))
    return info.fatal and info.fault_class is not FaultClass.APPLICATION


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


def _doomed(job: Job, evidence: Sequence[Evidence], catalogue: XidCatalogue) -> Incident | None:
    if job.state != "RUNNING":
        return None
    nodes = set(job.nodes)
    fatal = [
        ev
        for ev in evidence
        if ev.node in nodes and in_attempt(ev, job) and is_fatal_node_event(ev, catalogue)
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


def _app_fault(job: Job, evidence: Sequence[Evidence]) -> Incident | None:
    """The running job's own log says its application failed: the verdict on its lines (as
    ``srecovery explain-log`` gives it) is an application fault. A rank's exception after
    another task was killed, or after a hardware fault, is not one."""
    if job.state != "RUNNING":
        return None
    judged = judge_job_log(evidence, job, since=job.start_time - START_SLACK)
    if judged is None or judged.verdict.fault_domain != FaultClass.APPLICATION.value:
        return None
    root = judged.verdict.signatures[0]["id"] if judged.verdict.signatures else "a fatal error"
    first = min(
        (ev for ev in evidence if ev.id in judged.evidence_ids), key=lambda ev: ev.observed_at
    )
    return Incident(
        job_id=job.job_id,
        restart_count=job.restart_count,
        submit_time=job.submit_time,
        kind=IncidentKind.APP_FAULT,
        failed_at=first.observed_at,
        trigger_ids=tuple(sorted(judged.evidence_ids)),
        summary=f"job {job.job_id} running on {_nodes(job)}: application reported {root}",
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
