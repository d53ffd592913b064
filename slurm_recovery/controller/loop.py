"""The recovery loop: read Slurm, detect and decide (pure core), then do the next missing step.

Level-triggered: every pass compares what the advice requires with what Slurm shows now and
performs only the step that is missing, recording it (action row, milestone, audit row) as it
goes. Nothing about "what I was doing" lives only in memory, so the process may die at any
line; the next one reads the store and Slurm and carries on without doing a step twice.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from slurm_recovery import hostlist
from slurm_recovery.controller.observe import observe
from slurm_recovery.controller.wire import parse_event
from slurm_recovery.decide.advise import advise, after_drains
from slurm_recovery.decide.attribute import attribute
from slurm_recovery.decide.catalogue import XidCatalogue
from slurm_recovery.decide.detect import detect
from slurm_recovery.decide.hang import hang_incidents
from slurm_recovery.decide.jobsettings import (
    DEFAULT_SETTINGS,
    JobSettings,
    job_settings,
    policy_for_job,
)
from slurm_recovery.decide.model import Action, ClusterView, IncidentKind, Mode, Verdict
from slurm_recovery.decide.model import Evidence as CoreEvidence
from slurm_recovery.decide.model import Incident as CoreIncident
from slurm_recovery.decide.policy import Policy
from slurm_recovery.decide.straggler import straggler_incidents
from slurm_recovery.holdmark import hold_mark, parse_hold_mark
from slurm_recovery.scheduler import Job, Scheduler, SchedulerError, Unreachable
from slurm_recovery.scheduler.base import UnsupportedOutput, earliest_restart
from slurm_recovery.sidecar.spool import HookSpool
from slurm_recovery.store import (
    Advice,
    EvidenceRecord,
    Incident,
    JobAttempt,
    ModeOverride,
    NodeState,
    Store,
    StoreError,
)

log = logging.getLogger("srecovery.controller")

#: How far back evidence matters to detection and attribution (covers the policy windows).
EVIDENCE_HORIZON = 3600.0
#: Failed steps on one incident before the controller stops trying and asks for an operator.
MAX_FAILED_STEPS = 5
#: Environment variable naming a step after which the controller kills itself (tests only).
FAILPOINT_ENV = "SRECOVERY_FAILPOINT"

#: Job states from which ``requeue_hold`` moves a job back to pending.
_REQUEUEABLE = frozenset(
    {"RUNNING", "SUSPENDED", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "TIMEOUT"}
)


@dataclass(frozen=True)
class Planned:
    """The advice in force for an incident, read back from the store."""

    advice_id: int
    action: Action
    mode: Mode
    reason: str
    rule: str
    exclude: frozenset[str]
    drain: frozenset[str]
    needs_operator: bool
    cause: str
    fault_class: str

    @classmethod
    def from_advice(cls, advice: Advice) -> Planned:
        v = advice.verdict
        return cls(
            advice_id=advice.id,
            action=Action(advice.decision),
            mode=Mode(v["mode"]),
            reason=advice.reason,
            rule=v.get("rule", ""),
            exclude=frozenset(v.get("exclude", [])),
            drain=frozenset(v.get("drain", [])),
            needs_operator=bool(v.get("needs_operator")),
            cause=v.get("verdict", {}).get("cause", ""),
            fault_class=v.get("verdict", {}).get("fault_class", "unknown"),
        )


def core_evidence(record: EvidenceRecord) -> CoreEvidence:
    e = record.evidence
    return CoreEvidence(
        id=record.id,
        source=e.source,
        kind=e.kind,
        observed_at=e.observed_at,
        node=e.node,
        gpu=e.gpu,
        job_id=e.job_id,
        payload=e.payload,
    )


def verdict_json(verdict: Verdict) -> dict[str, Any]:
    return {
        "fault_class": str(verdict.fault_class),
        "nodes": sorted(verdict.nodes),
        "gpus": sorted([list(g) for g in verdict.gpus]),
        "confidence": verdict.confidence,
        "evidence_ids": list(verdict.evidence_ids),
        "cause": verdict.cause,
    }


def job_snapshot(job: Job) -> dict[str, Any]:
    """The job as Slurm showed it when the advice was given: kept with the advice, so that
    ``srecovery replay`` can decide again with another policy."""
    return {
        "job_id": job.job_id,
        "name": job.name,
        "state": job.state,
        "user": job.user,
        "partition": job.partition,
        "nodes": list(job.nodes),
        "num_nodes": job.num_nodes,
        "submit_time": job.submit_time,
        "start_time": job.start_time,
        "end_time": job.end_time,
        "restart_count": job.restart_count,
        "exit_code": [job.exit_code.returncode, job.exit_code.signal],
        "excluded_nodes": sorted(job.excluded_nodes),
        "required_nodes": sorted(job.required_nodes),
        "requeueable": job.requeueable,
    }


def effective_policy(policy: Policy, overrides: Iterable[ModeOverride]) -> Policy:
    """``policy`` with the operators' mode overrides (``srecovery mode``) on top; pure.

    A partition's override beats its ``[partitions.NAME]`` table; the default's override
    replaces the top-level ``mode``, so partitions with their own table keep it, exactly as if
    the top-level mode had been edited in the file. The file itself is never rewritten.
    Returns ``policy`` itself when the overrides change nothing."""
    default = policy.mode
    partitions = dict(policy.partition_modes)
    for override in overrides:
        if override.partition is None:
            default = Mode(override.mode)
        else:
            partitions[override.partition] = Mode(override.mode)
    if default is policy.mode and partitions == dict(policy.partition_modes):
        return policy
    return dataclasses.replace(
        policy, mode=default, partition_modes=MappingProxyType(dict(sorted(partitions.items())))
    )


#: Below this much free space for the store's file system, /healthz says the store is full.
STORE_MIN_FREE = 1 << 20


def store_space_problem(path: Path) -> str:
    """ "" or why the store cannot take writes for lack of space (its file system's free space
    for this user below STORE_MIN_FREE)."""
    try:
        fs = os.statvfs(Path(path).parent)
    except OSError:
        return ""
    free = fs.f_bavail * fs.f_frsize
    if free >= STORE_MIN_FREE:
        return ""
    return (
        f"store: the disk holding {path} is full ({free // 1024} KiB free): evidence is refused "
        "(503, the sidecars keep it) and nothing is recorded until space is freed"
    )


class Reconciler:
    """One controller's loop. Owns its Store connection: call only from one thread."""

    def __init__(
        self,
        *,
        store: Store,
        scheduler: Scheduler,
        policy: Policy,
        catalogue: XidCatalogue,
        cluster: str,
        hold_deadline: float,
        spool_dir: Path | None = None,
        hook_spool_dir: Path | None = None,
        metrics: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.scheduler = scheduler
        #: the policy file's; ``policy`` is it with the mode overrides on top (each pass)
        self.base_policy = policy
        self.policy = policy
        self.catalogue = catalogue
        self.cluster = cluster
        self.hold_deadline = hold_deadline
        self.spool_dir = spool_dir
        self.hook_spool = HookSpool(hook_spool_dir) if hook_spool_dir else None
        self.metrics = metrics
        self.clock = clock
        self.failpoint = os.environ.get(FAILPOINT_ENV, "")
        #: a crash waits for its node evidence (``_settling``): come back soon
        self.settling = False
        # (job_id, restart_count) -> submit time -> kinds of its incidents: from the store.
        self._handled: dict[tuple[int, int], dict[int, set[str]]] = {}
        for incident in store.list_incidents(limit=1_000_000):
            self._remember(incident)
        self.last_tick: float | None = None
        self.last_error: str = ""
        self.last_view: ClusterView | None = None
        #: why this controller cannot trust its reading of this Slurm ("" when it can): set
        #: when its first read fails, and then every partition is in monitor mode for good
        self.slurm_problem: str = ""
        self.epoch = self._record_start()

    def _record_start(self) -> float:
        """Audit this start; return when this store's controller first started (its epoch).

        Jobs that ended before the epoch are history, not incidents: a controller deployed (or
        given a new store) does not requeue every job that failed in the last minutes. Jobs
        that ended while a controller with this store was down are after the epoch, so a
        restarted controller still recovers them."""
        first = self.store.audit_rows(limit=1)
        row = self.store.append_audit(
            "controller",
            "controller_started",
            f"cluster {self.cluster}",
            {"pid": os.getpid()},
            ts=self.clock(),
        )
        return first[0].ts if first else row.ts

    # --- the pass --------------------------------------------------------------------

    def tick(self) -> bool:
        """One pass over Slurm and the open incidents. Returns True while steps are in flight
        (the caller then comes back sooner). Scheduler trouble is logged, never raised."""
        try:
            self._apply_mode_overrides()
            for side_input in (self._import_watchdog_releases, self._import_hook_spool):
                try:
                    side_input()
                except Exception:  # a bad spool must never stop recovery
                    log.exception("%s failed; going on", side_input.__name__)
            view = self._view()
            if self.last_view is None:
                log.info("Slurm's jobs and nodes can be read")
            try:
                observe(self.store, view, self.last_view)
            except Exception:  # a record for the scorecard must never stop recovery
                log.exception("recording Slurm changes failed; going on")
            self.last_view = view
            self._detect_and_decide(view)
            busy = self.settling
            for incident in self.store.list_incidents(open_only=True, limit=10_000):
                busy |= self._reconcile(incident, view)
        except Unreachable as exc:
            self.last_error = f"slurmctld unreachable: {exc}"
            log.warning("%s; retrying", self.last_error)
            return False
        except UnsupportedOutput as exc:  # a record this parser does not know: act on nothing
            if self.last_view is None and not self.slurm_problem:
                self._distrust_slurm(exc)  # its very first read: this release is not known
                self.last_error = self.slurm_problem
                return False
            error = self.slurm_problem or (
                f"cannot read Slurm's output: {exc}; this pass acts on nothing"
            )
            if error != self.last_error:  # once, not every second
                log.error("%s", error)
            self.last_error = error
            return False
        except StoreError as exc:  # disk full, read-only, locked: /healthz says which
            self.last_error = f"store: {exc}"
            log.error("%s; retrying", self.last_error)
            return False
        full = store_space_problem(self.store.path)
        if full:  # a quiet pass writes nothing, but evidence is refused (503): say so
            if full != self.last_error:
                log.error("%s", full)
            self.last_error = full
            return busy
        self.last_tick = self.clock()
        self.last_error = self.slurm_problem
        return busy

    def _distrust_slurm(self, exc: UnsupportedOutput) -> None:
        """The controller's first read of Slurm met a shape the parser does not know: say why
        (log, audit, ``last_error`` in /healthz and ``srecovery status``) and stay in monitor
        mode for good: a step taken on a misread job could be half an action."""
        try:
            version = self.scheduler.version() or "unknown"
        except SchedulerError:
            version = "unknown"
        self.slurm_problem = (
            f"monitor only: slurm-recovery cannot read Slurm {version}'s output ({exc}); "
            "it acts on nothing until it is upgraded (docs/scheduler-backends.md)"
        )
        log.critical("%s", self.slurm_problem)
        self.store.append_audit(
            "controller",
            "slurm_unsupported",
            f"cluster {self.cluster}",
            {"slurm_version": version, "error": str(exc)},
            ts=self.clock(),
        )

    def _apply_mode_overrides(self) -> None:
        """The operators' overrides as they are now in the store, from this pass on; every
        partition in monitor mode while Slurm's output cannot be read (``slurm_problem``)."""
        if self.slurm_problem:
            self.policy = dataclasses.replace(
                self.base_policy, mode=Mode.MONITOR, partition_modes=MappingProxyType({})
            )
            return
        policy = effective_policy(self.base_policy, self.store.mode_overrides())
        modes = (policy.mode, dict(policy.partition_modes))
        if modes != (self.policy.mode, dict(self.policy.partition_modes)):
            log.info(
                "modes from this pass: default %s%s",
                policy.mode,
                "".join(f", {name} {mode}" for name, mode in modes[1].items()),
            )
        self.policy = policy

    def _view(self) -> ClusterView:
        now = self.clock()
        jobs = {j.job_id: j for j in self.scheduler.list_jobs()}
        nodes = {n.name: n for n in self.scheduler.list_nodes()}
        drained = {
            s.name: s.drained_at or s.updated_at
            for s in self.store.list_nodes(drained_by_tool=True)
            if s.name in nodes and nodes[s.name].drained
        }
        return ClusterView(now=now, jobs=jobs, nodes=nodes, drained_by_tool=drained)

    def _evidence(self, now: float) -> list[CoreEvidence]:
        """The last EVIDENCE_HORIZON of evidence the decisions read: not the sidecars'
        status heartbeats, which are most rows on a large cluster and explain nothing."""
        records = self.store.find_evidence(
            since=now - EVIDENCE_HORIZON, limit=1_000_000, skip_kinds=("sidecar_status",)
        )
        return [core_evidence(r) for r in records]

    # --- detect, attribute, advise -----------------------------------------------------

    def _remember(self, incident: Incident) -> None:
        attempt = self.store.get_attempt(incident.attempt_id)
        if attempt is not None:
            key = (attempt.attempt.job_id, attempt.attempt.restart_count)
            kinds = self._handled.setdefault(key, {})
            kinds.setdefault(attempt.attempt.submit_time, set()).add(incident.kind)

    def _kinds(self, job: Job) -> set[str]:
        """Kinds of the incidents this job attempt already has."""
        return self._handled.get((job.job_id, job.restart_count), {}).get(job.submit_time, set())

    def _detect_and_decide(self, view: ClusterView) -> None:
        evidence = self._evidence(view.now)
        reported = {  # every attempt with an incident: a straggler is reported once
            (job.job_id, job.restart_count) for job in view.jobs.values() if self._kinds(job)
        }
        # A straggler that was only reported does not hide a later crash, hang or fault of the
        # same attempt; one whose restart is still in flight does.
        in_flight = self._open_straggler_attempts()
        known = {
            (job.job_id, job.restart_count)
            for job in view.jobs.values()
            if self._kinds(job) - {str(IncidentKind.STRAGGLER)}
            or (job.job_id, job.restart_count, job.submit_time) in in_flight
        }
        settings = self._job_settings(view, evidence)
        watched = dataclasses.replace(  # --recovery=off: the job is left alone
            view,
            jobs={
                job_id: job
                for job_id, job in view.jobs.items()
                if settings.get(job_id, DEFAULT_SETTINGS).mode != "off"
            },
        )
        recent = dataclasses.replace(
            watched,
            jobs={
                job_id: job
                for job_id, job in watched.jobs.items()
                if job.active or job.end_time >= self.epoch
            },
        )
        timeouts = {j: s.hang_timeout for j, s in settings.items() if s.hang_timeout is not None}
        found_now = detect(recent, evidence, known, self.catalogue, self.policy)
        crashed = {(i.job_id, i.restart_count) for i in found_now}
        found_now += hang_incidents(watched, evidence, known | crashed, self.policy, timeouts)
        troubled = reported | {(i.job_id, i.restart_count) for i in found_now}
        found_now += straggler_incidents(watched, evidence, troubled, self.policy)
        self.settling = False
        for found in found_now:
            job = view.jobs[found.job_id]
            if self._settling(found, job, view, evidence):
                self.settling = True  # the caller comes back within 0.1 s (and on evidence)
                continue
            drains = self._open(found, job, view, evidence, settings.get(found.job_id))
            view = after_drains(view, drains)  # the blast radius counts this pass's drains

    def _settling(
        self, found: CoreIncident, job: Job, view: ClusterView, evidence: list[CoreEvidence]
    ) -> bool:
        """A crash no node evidence explains yet, less than ``settle`` after it failed: wait.
        Slurm often shows the job's end before the node's sidecar delivered the XID that
        killed it (or the job's last log lines); decided now, the job would be requeued onto
        the broken node. Detection is level-triggered, so the next pass finds it again."""
        settle = self.policy.fatal_evidence_window.settle
        if found.kind is not IncidentKind.CRASH or self.clock() - found.failed_at >= settle:
            return False
        verdict = attribute(found, job, evidence, self.catalogue, self.policy, view.nodes)
        return not verdict.nodes

    def _job_settings(
        self, view: ClusterView, evidence: list[CoreEvidence]
    ) -> dict[int, JobSettings]:
        """Each job's own settings (SPANK options) from its job_start; for a job that started
        before the evidence horizon, from the store (one indexed query per such job)."""
        settings = job_settings(evidence)
        horizon = view.now - EVIDENCE_HORIZON
        for job in view.jobs.values():
            if job.job_id in settings or not job.active or job.start_time >= horizon:
                continue
            records = self.store.evidence_by_kinds(
                ("job_start",), job_id=job.job_id, limit=1, newest_first=True
            )
            found = job_settings(core_evidence(r) for r in records)
            if job.job_id in found:
                settings[job.job_id] = found[job.job_id]
        return settings

    def _open_straggler_attempts(self) -> set[tuple[int, int, int]]:
        """(job id, restart count, submit time) of the straggler incidents still open."""
        attempts = set()
        for incident in self.store.list_incidents(open_only=True, limit=10_000):
            if incident.kind == IncidentKind.STRAGGLER:
                found = self.store.get_attempt(incident.attempt_id)
                if found is not None:
                    a = found.attempt
                    attempts.add((a.job_id, a.restart_count, a.submit_time))
        return attempts

    def _open(
        self,
        found: CoreIncident,
        job: Job,
        view: ClusterView,
        evidence: list[CoreEvidence],
        settings: JobSettings | None = None,
    ) -> frozenset[str]:
        """Record the incident, its verdict and advice; returns the drains advised."""
        now = self.clock()
        attempt = self.store.resolve_attempt(
            JobAttempt(self.cluster, job.job_id, job.submit_time, job.restart_count), seen_at=now
        )
        verdict = attribute(found, job, evidence, self.catalogue, self.policy, view.nodes)
        attributed = self.clock()
        restarts = sum(
            1
            for past in self.store.list_incidents(history_id=attempt.history_id)
            if (past.outcome or "").startswith("restarted") or self._restarted(past, job)
        )
        advice = advise(found, verdict, job, policy_for_job(self.policy, settings), view, restarts)
        advised = self.clock()
        details = {
            "mode": str(advice.mode),
            "rule": advice.rule,
            "exclude": sorted(advice.exclude),
            "drain": sorted(advice.drain),
            "needs_operator": advice.needs_operator,
            "verdict": verdict_json(verdict),
            "job": job_snapshot(job),
        }
        with self.store.transaction():
            incident = self.store.open_incident(
                attempt.id, str(found.kind), opened_at=now, summary=found.summary
            )
            self.store.add_milestone(incident.id, "failure", at=found.failed_at)
            self.store.add_milestone(incident.id, "detected", at=now)
            self.store.add_milestone(incident.id, "attributed", at=attributed)
            stored = self.store.add_advice(
                incident.id,
                decision=str(advice.action),
                reason=advice.reason,
                verdict=details,
                evidence_ids=sorted({*verdict.evidence_ids, *found.trigger_ids}),
                created_at=advised,
            )
            self.store.add_milestone(incident.id, "advised", at=advised)
            for node in verdict.nodes:
                self._count_implicated(node, advised)
            self.store.append_audit(
                "controller",
                "advice",
                f"job {job.job_id}",
                {
                    "incident": incident.id,
                    "advice": stored.id,
                    "action": str(advice.action),
                    "mode": str(advice.mode),
                    "reason": advice.reason,
                    "rule": advice.rule,
                    "evidence_ids": sorted({*verdict.evidence_ids, *found.trigger_ids}),
                },
                ts=advised,
            )
        self._remember(incident)
        log.info(
            "incident %d: job %d %s -> %s (%s mode): %s",
            incident.id,
            job.job_id,
            found.kind,
            advice.action,
            advice.mode,
            advice.reason,
        )
        if advice.needs_operator:  # in `srecovery status` (the error ring) and the journal
            log.warning(
                "incident %d: job %d NEEDS AN OPERATOR (rule %s): %s",
                incident.id,
                job.job_id,
                advice.rule,
                advice.reason,
            )
        if self.metrics:
            self.metrics.incident_opened(str(verdict.fault_class), now - found.failed_at)
            if advice.needs_operator:
                self.metrics.needs_operator.labels(advice.rule).inc()
        return advice.drain if advice.mode is Mode.ACT else frozenset()

    def _restarted(self, past: Incident, job: Job) -> bool:
        """An open restart incident whose job Slurm already shows at a later attempt: the
        restart happened, and this pass detected the next fault before closing it."""
        if past.closed_at is not None:
            return False
        advice = self.store.latest_advice(past.id)
        found = self.store.get_attempt(past.attempt_id)
        return bool(
            advice
            and advice.decision.startswith("requeue")
            and found
            and found.attempt.restart_count < job.restart_count
        )

    def _count_implicated(self, node: str, at: float) -> None:
        old = self.store.get_node(node)
        self.store.upsert_node(
            NodeState(
                name=node,
                updated_at=at,
                drained_by_tool=old.drained_by_tool if old else False,
                drain_reason=old.drain_reason if old else "",
                drained_at=old.drained_at if old else None,
                implicated_count=(old.implicated_count if old else 0) + 1,
                last_implicated_at=at,
            )
        )

    # --- reconcile one incident --------------------------------------------------------

    def _reconcile(self, incident: Incident, view: ClusterView) -> bool:
        advice = self.store.latest_advice(incident.id)
        attempt = self.store.get_attempt(incident.attempt_id)
        if advice is None or attempt is None:
            return False
        plan = Planned.from_advice(advice)
        job_id = attempt.attempt.job_id
        if plan.mode is Mode.MONITOR:
            self._close(incident, f"monitor: would {describe(plan, job_id)}")
            return False
        failures = sum(
            1 for a in self.store.actions(incident_id=incident.id) if a.result == "failed"
        )
        if failures >= MAX_FAILED_STEPS:
            self._close(incident, f"gave up after {failures} failed steps: needs operator")
            return False
        ours = f"srecovery:{incident.id}:"
        for node in sorted(plan.drain):
            if not self._drained(node, view):
                reason = f"{ours}{plan.cause or plan.fault_class}"
                if not self._step(
                    incident,
                    plan,
                    "drain",
                    node,
                    lambda n=node, r=reason: self.scheduler.drain_node(n, r),
                ):
                    return True
                self._mark_drained(node, reason)
            elif (shown := view.nodes.get(node)) and shown.reason.startswith(ours):
                recorded = self.store.get_node(node)
                if not (recorded and recorded.drain_reason == shown.reason):
                    # drained by us just before a crash: record it (blast radius, lemons)
                    self._mark_drained(node, shown.reason)
                    self._found(incident, plan, "drain", node)
        if plan.action is Action.NONE:
            self._close(incident, "nothing to do")
            return False
        if plan.action is Action.STOP:
            return self._stop(incident, plan, job_id, view.jobs.get(job_id))
        return self._restart(incident, plan, job_id, attempt.attempt.restart_count, view)

    def _drained(self, node: str, view: ClusterView) -> bool:
        shown = view.nodes.get(node)
        if shown is None or shown.drained:
            return True
        state = self.store.get_node(node)  # drained earlier in this pass
        return bool(
            state and state.drained_by_tool and state.drained_at and state.drained_at >= view.now
        )

    def _mark_drained(self, node: str, reason: str) -> None:
        now = self.clock()
        old = self.store.get_node(node)
        self.store.upsert_node(
            NodeState(
                name=node,
                updated_at=now,
                drained_by_tool=True,
                drain_reason=reason,
                drained_at=now,
                implicated_count=old.implicated_count if old else 0,
                last_implicated_at=old.last_implicated_at if old else None,
            )
        )

    def _stop(self, incident: Incident, plan: Planned, job_id: int, job: Job | None) -> bool:
        if (
            job is not None
            and job.active
            and not self._step(
                incident,
                plan,
                "cancel",
                f"job {job_id}",
                lambda: self.scheduler.cancel(job_id, plan.reason),
            )
        ):
            return True
        # A job that already ended stays ended; Slurm refuses to change a finished job's
        # AdminComment, so the reason lives in the advice and the audit trail.
        self.store.add_milestone(incident.id, "stopped", at=self.clock())
        self._close(incident, f"stopped: {plan.reason}")
        return False

    def _restart(
        self, incident: Incident, plan: Planned, job_id: int, base: int, view: ClusterView
    ) -> bool:
        """Requeue held -> exclude -> begin now -> release -> running again, from Slurm's state.

        Reads the job again after each step so one pass goes as far as Slurm allows.
        """
        job = view.jobs.get(job_id)
        for _ in range(8):
            if job is None:
                self._close(incident, "job no longer in Slurm")
                return False
            mark = parse_hold_mark(job.admin_comment)
            ours = mark is not None and mark[0] == incident.id
            self._record_found(incident, plan, job, base, ours)
            if job.restart_count == base:
                if job.state not in _REQUEUEABLE:
                    return True  # e.g. COMPLETING: wait for Slurm
                if job.active and not ours:
                    # Mark before holding, so the watchdog can always find what we hold.
                    # (A finished job's AdminComment cannot change: it is marked once held.)
                    if not self._mark(incident, plan, job_id):
                        return True
                elif not self._step(
                    incident,
                    plan,
                    "requeue_hold",
                    f"job {job_id}",
                    lambda: self.scheduler.requeue_hold(job_id),
                    milestone="held",
                ):
                    return True
            elif (
                job.state == "PENDING"
                and job.held
                and mark is None
                and job.restart_count == base + 1
                and "released" not in self.store.milestones(incident.id)
            ):
                # Our requeue of a finished job (or a crash right after it): mark it now.
                # Once released (by us or the watchdog), a new hold is someone else's.
                if not self._mark(incident, plan, job_id):
                    return True
            elif job.state == "PENDING":
                if not plan.exclude <= job.excluded_nodes:
                    if not self._step(
                        incident,
                        plan,
                        "exclude",
                        f"job {job_id}",
                        lambda: self.scheduler.add_excluded_nodes(job_id, plan.exclude),
                        milestone="excluded",
                        params={"nodes": sorted(plan.exclude)},
                    ):
                        return True
                elif job.held and ours:
                    if job.begin_time > self.clock() + 1:
                        if not self._step(
                            incident,
                            plan,
                            "begin_now",
                            f"job {job_id}",
                            lambda: self.scheduler.set_begin_now(job_id),
                        ):
                            return True
                    elif self.clock() < self._earliest_release(incident):
                        return True  # the previous attempt's credential is still revoked
                    elif not self._step(
                        incident,
                        plan,
                        "release",
                        f"job {job_id}",
                        lambda: self.scheduler.release(job_id),
                        milestone="released",
                    ):
                        return True
                    else:
                        self._unmark(incident, plan, job_id)
                elif job.held:
                    return True  # held by someone else: not ours to release
                else:
                    # released (by us, or by the watchdog): waiting for resources
                    self.store.add_milestone(incident.id, "released", at=self.clock())
                    if ours:  # released, but the mark stayed (a crash or Slurm down between)
                        self._unmark(incident, plan, job_id)
                    return True
            elif job.state == "RUNNING":
                if ours and not self._unmark(incident, plan, job_id):
                    return True  # a stale mark would make a later hold look like ours
                self._running_again(incident, job)
                return False
            elif job.active:
                return True  # COMPLETING, CONFIGURING ...: Slurm is moving it
            else:
                self._close(incident, f"restarted; the new attempt ended {job.state}")
                return False
            job = self.scheduler.get_job(job_id)
        return True

    def _earliest_release(self, incident: Incident) -> float:
        held_at = self.store.milestones(incident.id).get("held")
        if held_at is None:  # held just before a crash, before it was recorded: count from now
            held_at = self.store.add_milestone(incident.id, "held", at=self.clock())
        return earliest_restart(held_at)

    def _mark(self, incident: Incident, plan: Planned, job_id: int) -> bool:
        until = self.clock() + self.hold_deadline
        return self._step(
            incident,
            plan,
            "mark",
            f"job {job_id}",
            lambda: self.scheduler.set_admin_comment(job_id, hold_mark(incident.id, until)),
        )

    def _record_found(
        self, incident: Incident, plan: Planned, job: Job, base: int, ours: bool
    ) -> None:
        """Record the steps Slurm shows done that have no record: the controller was killed
        (or lost Slurm) between a call and the commit of its record. Not the begin time: once
        released, Slurm no longer shows whether it was moved."""
        shown = []
        if ours:
            shown.append("mark")
        if job.restart_count > base:
            shown.append("requeue_hold")
            if plan.exclude and plan.exclude <= job.excluded_nodes:
                shown.append("exclude")
            if ours and not job.held:  # released with our mark: by us (the watchdog unmarks)
                shown.append("release")
        if shown:
            target = f"job {job.job_id}"
            for step in shown:
                self._found(incident, plan, step, target)

    def _found(self, incident: Incident, plan: Planned, step: str, target: str) -> None:
        """Record ``step`` on ``target`` as done, unless it is recorded ok already."""
        done = self.store.actions(incident_id=incident.id)
        if any(a.step == step and a.target == target and a.result == "ok" for a in done):
            return
        now = self.clock()
        message = "found done in Slurm, with no record: the controller stopped after the call"
        with self.store.transaction():
            self.store.record_action(
                step,
                target,
                result="ok",
                started_at=now,
                finished_at=now,
                advice_id=plan.advice_id,
                message=message,
            )
            self.store.append_audit(
                "controller",
                "action",
                target,
                {"incident": incident.id, "step": step, "result": "ok", "found": True},
                ts=now,
            )
        log.warning("incident %d: %s %s %s", incident.id, step, target, message)

    def _unmark(self, incident: Incident, plan: Planned, job_id: int) -> bool:
        """Replace the hold mark by a note, once the job is released."""
        note = f"srecovery: requeued after incident {incident.id}"
        if plan.exclude:
            note += f", excluding {hostlist.compress(plan.exclude)}"
        return self._step(
            incident,
            plan,
            "unmark",
            f"job {job_id}",
            lambda: self.scheduler.set_admin_comment(job_id, note),
        )

    def _running_again(self, incident: Incident, job: Job) -> None:
        now = self.clock()
        self.store.add_milestone(incident.id, "released", at=now)  # no-op when recorded
        self.store.add_milestone(incident.id, "running_again", at=now)
        milestones = self.store.milestones(incident.id)
        self._close(incident, f"restarted on {hostlist.compress(job.nodes)}")
        if self.metrics:
            self.metrics.recovered(milestones)

    # --- recording -----------------------------------------------------------------

    def _step(
        self,
        incident: Incident,
        plan: Planned,
        step: str,
        target: str,
        call: Callable[[], object],
        *,
        milestone: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> bool:
        """Do one scheduler step and record it (action, milestone, audit); False if refused."""
        started = self.clock()
        try:
            call()
        except Unreachable:
            raise
        except SchedulerError as exc:
            finished = self.clock()
            with self.store.transaction():
                self.store.record_action(
                    step,
                    target,
                    result="failed",
                    started_at=started,
                    finished_at=finished,
                    advice_id=plan.advice_id,
                    params=params,
                    message=str(exc),
                )
                self.store.append_audit(
                    "controller",
                    "action",
                    target,
                    {
                        "incident": incident.id,
                        "step": step,
                        "result": "failed",
                        "message": str(exc),
                    },
                    ts=finished,
                )
            log.warning("incident %d: %s %s failed: %s", incident.id, step, target, exc)
            if self.metrics:
                self.metrics.action_done(step, "failed")
            return False
        finished = self.clock()
        with self.store.transaction():
            self.store.record_action(
                step,
                target,
                result="ok",
                started_at=started,
                finished_at=finished,
                advice_id=plan.advice_id,
                params=params,
            )
            if milestone:
                self.store.add_milestone(incident.id, milestone, at=finished)
            self.store.append_audit(
                "controller",
                "action",
                target,
                {"incident": incident.id, "step": step, "result": "ok", **(params or {})},
                ts=finished,
            )
        log.info(
            "incident %d: %s %s ok (%.0f ms)",
            incident.id,
            step,
            target,
            (finished - started) * 1000,
        )
        if self.metrics:
            self.metrics.action_done(step, "ok")
        if self.failpoint == f"after:{step}":
            log.critical("failpoint %s: killing the controller (tests only)", self.failpoint)
            os.kill(os.getpid(), signal.SIGKILL)
        return True

    def _close(self, incident: Incident, outcome: str) -> None:
        now = self.clock()
        with self.store.transaction():
            self.store.close_incident(incident.id, outcome=outcome, closed_at=now)
            self.store.append_audit(
                "controller",
                "incident_closed",
                f"incident {incident.id}",
                {"incident": incident.id, "outcome": outcome},
                ts=now,
            )
        log.info("incident %d closed: %s", incident.id, outcome)

    # --- what the head-node hook spooled while we were away ------------------------------

    def _import_hook_spool(self) -> None:
        """EpilogSlurmctld writes job events here when the controller did not answer."""
        if self.hook_spool is None or not self.hook_spool.events_dir.is_dir():
            return
        events, commit = self.hook_spool.take(None)
        if events:
            evidence = [parse_event(e, f"spool {i}", source="hook") for i, e in enumerate(events)]
            self.store.add_evidence(evidence)
            log.info("imported %d spooled hook event(s)", len(evidence))
        commit()

    # --- the watchdog's records ------------------------------------------------------------

    def _import_watchdog_releases(self) -> None:
        """Copy the watchdog's release records into the audit trail, once each."""
        if self.spool_dir is None:
            return
        spool = self.spool_dir / "releases.jsonl"
        done_file = self.spool_dir / "releases.jsonl.imported"
        if not spool.exists():
            return
        done = int(done_file.read_text() or 0) if done_file.exists() else 0
        size = spool.stat().st_size
        if size <= done:
            return
        with spool.open("rb") as f:
            f.seek(done)
            chunk = f.read(size - done)
        end = chunk.rfind(b"\n") + 1  # whole lines only
        for line in chunk[:end].splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                log.warning("watchdog spool: skipping a malformed line: %r", line[:200])
                continue
            self.store.append_audit(
                "watchdog",
                "watchdog_release",
                f"job {record.get('job_id')}",
                record,
                ts=float(record.get("ts", self.clock())),
            )
        tmp = done_file.with_suffix(".tmp")
        tmp.write_text(str(done + end))
        tmp.replace(done_file)


def describe(plan: Planned, job_id: int) -> str:
    """``requeue job 12 excluding n2, drain n2`` — what the advice asks, in words."""
    words = {
        Action.REQUEUE_EXCLUDE: f"requeue job {job_id}",
        Action.REQUEUE: f"requeue job {job_id}",
        Action.STOP: f"stop job {job_id}",
        Action.NONE: f"leave job {job_id}",
    }[plan.action]
    if plan.exclude:
        words += f" excluding {hostlist.compress(plan.exclude)}"
    if plan.drain:
        words += f", drain {hostlist.compress(plan.drain)}"
    return words


def milestone_latencies(milestones: Mapping[str, float]) -> dict[str, float]:
    """detection, action and end-to-end seconds, where the milestones exist."""
    out = {}
    pairs = (
        ("detection", "failure", "detected"),
        ("action", "detected", "released"),
        ("end_to_end", "failure", "running_again"),
    )
    for name, start, end in pairs:
        if start in milestones and end in milestones:
            out[name] = max(0.0, milestones[end] - milestones[start])
    return out
