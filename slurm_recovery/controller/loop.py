"""The recovery loop: read Slurm, detect and decide (pure core), then do the next missing step.

Level-triggered: every pass compares what the advice requires with what Slurm shows now and
performs only the step that is missing, recording it (action row, milestone, audit row) as it
goes. Nothing about "what I was doing" lives only in memory, so the process may die at any
line; the next one reads the store and Slurm and carries on without doing a step twice.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from slurm_recovery.config import DEFAULT_HEALTH_CHECK_PREFIXES
from slurm_recovery.contract import hostlist
from slurm_recovery.contract.spool import HookSpool
from slurm_recovery.contract.wire import parse_event
from slurm_recovery.controller.nodelisting import NodeListing
from slurm_recovery.controller.observe import HEALTH_CHECK_KIND, observe
from slurm_recovery.controller.reports import LastReports, record_silences
from slurm_recovery.decide.advise import advise, after_drains, needs_operator_rule
from slurm_recovery.decide.attribute import XID_REPEAT_WINDOW, attribute
from slurm_recovery.decide.detect import detect, with_failed_attempts
from slurm_recovery.decide.hang import hang_incidents
from slurm_recovery.decide.jobsettings import (
    DEFAULT_SETTINGS,
    JobSettings,
    job_settings,
    policy_for_job,
)
from slurm_recovery.decide.model import (
    Action,
    ClusterView,
    IncidentKind,
    Mode,
    Verdict,
    partition_sizes,
)
from slurm_recovery.decide.model import Advice as CoreAdvice
from slurm_recovery.decide.model import Evidence as CoreEvidence
from slurm_recovery.decide.model import Incident as CoreIncident
from slurm_recovery.decide.policy import Policy
from slurm_recovery.decide.restart import Change, Close, Plan, Step, Wait, next_step
from slurm_recovery.decide.straggler import straggler_incidents
from slurm_recovery.holdmark import hold_mark, parse_hold_mark
from slurm_recovery.scheduler import Job, Node, Scheduler, SchedulerError, Unreachable
from slurm_recovery.scheduler.base import UnsupportedOutput, sanitize_reason
from slurm_recovery.scorecard import is_health_check_drain
from slurm_recovery.signals.xid import XidCatalogue
from slurm_recovery.store import (
    Advice,
    Evidence,
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
#: Called with each step's name once the step is recorded done. The integration tests inject
#: one that kills the controller there (``slurm_recovery.controller.failpoint_from_env``).
StepDone = Callable[[str], None]


def planned(incident_id: int, advice: Advice) -> Plan:
    """The advice in force for an incident, read back from the store."""
    return Plan.from_verdict(incident_id, advice.id, advice.decision, advice.reason, advice.verdict)


#: How ``Reconciler.last_error`` starts when the pass got no answer from slurmctld.
UNREACHABLE = "slurmctld unreachable"


def still_our_drain(node: Node, reason: str) -> bool:
    """The node is drained, with the reason the tool set (a resume, or a new drain by an
    admin for maintenance, ends the tool's drain)."""
    return node.drained and (not reason or node.reason == reason)


def health_check_drained(nodes: Iterable[Node], prefixes: Sequence[str]) -> dict[str, str]:
    """node -> reason, for the nodes Slurm shows drained by the site's health check (a reason
    starting with one of ``prefixes``, ``controller.health_check_drain_prefixes``)."""
    return {
        node.name: node.reason
        for node in nodes
        if node.drained and is_health_check_drain(node.reason, prefixes)
    }


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


def xid_history(
    store: Store, nodes: Iterable[str], failed_at: float, have: Iterable[CoreEvidence] = ()
) -> list[CoreEvidence]:
    """The XIDs the nodes logged in the day before ``failed_at`` that ``have`` lacks: repeats
    of one XID on one GPU implicate its node (``policy.xid_repeats``). One indexed query per
    node."""
    known = {ev.id for ev in have}
    found: list[CoreEvidence] = []
    for node in sorted(set(nodes)):
        for record in store.evidence_by_kinds(
            ("xid",), node=node, since=failed_at - XID_REPEAT_WINDOW, until=failed_at
        ):
            if record.id not in known:
                found.append(core_evidence(record))
    return found


class EvidenceWindow:
    """The evidence the decisions read: the last EVIDENCE_HORIZON, less the sidecars' status
    heartbeats (most rows on a large cluster, and they explain nothing). Read from the store
    incrementally: each pass adds the rows stored since the last one and drops those that
    aged out, so a pass's cost follows what arrived, not the hour's total."""

    def __init__(self) -> None:
        self.rows: list[CoreEvidence] = []
        self.last_id = 0

    def read(self, store: Store, now: float) -> list[CoreEvidence]:
        since = now - EVIDENCE_HORIZON
        new = store.find_evidence(
            since=since, after_id=self.last_id, limit=1_000_000, skip_kinds=("sidecar_status",)
        )
        if new:
            self.last_id = max(self.last_id, max(r.id for r in new))
            self.rows.extend(core_evidence(r) for r in new)
            self.rows.sort(key=lambda e: (e.observed_at, e.id))  # late arrivals, in order
        cut = bisect.bisect_left(self.rows, since, key=lambda e: e.observed_at)
        del self.rows[:cut]
        return list(self.rows)


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
        after_step: StepDone | None = None,
        node_listing: NodeListing | None = None,
        health_check_prefixes: Sequence[str] = DEFAULT_HEALTH_CHECK_PREFIXES,
        reports: LastReports | None = None,
        missing_report_grace: float = 0.0,
    ) -> None:
        """``node_listing``: where the passes take Slurm's nodes from (the service's, kept
        fresh by its own thread); None: each pass reads them itself.
        ``health_check_prefixes``: drain reasons that mark the site's health check's drains
        (``controller.health_check_drain_prefixes``).
        ``reports``: when each node's sidecar was last heard from (the ingest's); with
        ``missing_report_grace`` > 0, a node silent past it while it runs a job is recorded as
        a ``sidecar_silent`` finding (``controller.reports``)."""
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
        self.after_step = after_step
        #: a crash waits for its node evidence (``_settling``): come back soon
        self.settling = False
        # (job_id, restart_count) -> submit time -> kinds of its incidents: from the store.
        self._handled: dict[tuple[int, int], dict[int, set[str]]] = {}
        for incident in store.list_incidents(limit=1_000_000):
            self._remember(incident)
        self.last_tick: float | None = None
        #: passes finished since start, whether they read Slurm or not (/healthz shows it)
        self.passes = 0
        self.last_error: str = ""
        self.last_view: ClusterView | None = None
        self.node_listing = node_listing
        self._sized: tuple[Mapping[str, Node] | None, Mapping[str, int]] = (None, {})
        self.health_check_prefixes = tuple(health_check_prefixes)
        self._checked: tuple[Mapping[str, Node] | None, Mapping[str, str]] = (None, {})
        self._evidence_window = EvidenceWindow()
        self.reports = reports
        self.missing_report_grace = missing_report_grace
        #: node -> the last report of the silence recorded for it (one finding per silence)
        self._silences: dict[str, float] = {}
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
            return self._pass()
        finally:
            self.passes += 1

    def _pass(self) -> bool:
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
            if self.reports is not None and self.missing_report_grace > 0:
                try:
                    record_silences(
                        self.store, view, self.reports, self._silences, self.missing_report_grace
                    )
                except Exception:  # a finding about a silent node must never stop recovery
                    log.exception("recording silent sidecars failed; going on")
            self.last_view = view
            self._forget_undone_drains(view)
            self._detect_and_decide(view)
            busy = self.settling
            for incident in self.store.list_incidents(open_only=True, limit=10_000):
                busy |= self._reconcile(incident, view)
        except Unreachable as exc:
            self.last_error = f"{UNREACHABLE}: {exc}"
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
        except SchedulerError as exc:  # e.g. squeue missing or refused: this pass reads nothing
            self.last_error = f"cannot read Slurm: {exc}"
            log.error("%s; retrying", self.last_error)
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

    @property
    def slurmctld_unreachable(self) -> bool:
        """The last pass got no answer from slurmctld (not another kind of error)."""
        return self.last_error.startswith(UNREACHABLE)

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
        if self.node_listing is None:
            nodes = {n.name: n for n in self.scheduler.list_nodes()}
        else:  # kept fresh by its own thread: a pass never waits for 10,000 nodes
            nodes = self.node_listing.nodes()
        if nodes is not self._sized[0]:  # counted once per listing, not per incident
            self._sized = (nodes, partition_sizes(nodes.values()))
        if nodes is not self._checked[0]:
            try:
                found = health_check_drained(nodes.values(), self.health_check_prefixes)
            except Exception:  # fail open: no health-check drain is known this pass
                log.exception("reading the health check's drains failed; going on without")
                found = {}
            self._checked = (nodes, MappingProxyType(found))
        drained = {
            s.name: s.drained_at or s.updated_at
            for s in self.store.list_nodes(drained_by_tool=True)
            if s.name in nodes and still_our_drain(nodes[s.name], s.drain_reason)
        }
        return ClusterView(
            now=now,
            jobs=jobs,
            nodes=nodes,
            drained_by_tool=drained,
            partition_sizes=self._sized[1],
            health_check_drained=self._checked[1],
        )

    def _forget_undone_drains(self, view: ClusterView) -> None:
        """A node the tool drained that is resumed (or drained again by someone else, for
        another reason) is no longer the tool's drain: clear the mark, so the blast radius
        and ``srecovery nodes`` count only the tool's drains in force."""
        for state in self.store.list_nodes(drained_by_tool=True):
            shown = view.nodes.get(state.name)
            if shown is None or still_our_drain(shown, state.drain_reason):
                continue
            now = self.clock()
            undone = "resumed" if not shown.drained else f"drained again: {shown.reason}"
            with self.store.transaction():
                self.store.upsert_node(
                    dataclasses.replace(state, updated_at=now, drained_by_tool=False)
                )
                self.store.append_audit(
                    "controller",
                    "slurm_change",
                    state.name,
                    {
                        "change": "drain_undone",
                        "detail": f"{state.name} {undone}",
                        "by": shown.reason_set_by,
                    },
                    ts=now,
                )
            log.info(
                "%s: the tool's drain is undone (%s): no longer counted as its drain",
                state.name,
                undone,
            )

    def _evidence(self, now: float) -> list[CoreEvidence]:
        """The last EVIDENCE_HORIZON of evidence the decisions read (:class:`EvidenceWindow`)."""
        return self._evidence_window.read(self.store, now)

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
        # Slurm's own hold or requeue of a failed --requeue=expedite job: judged as the attempt
        # that failed
        view = with_failed_attempts(
            view, evidence, self.catalogue, lambda job: bool(self._kinds(job))
        )
        reported = {  # every attempt with an incident: a straggler is reported once
            (job.job_id, job.restart_count) for job in view.jobs.values() if self._kinds(job)
        }
        # A straggler that was only reported does not hide a later crash, hang or fault of the
        # same attempt; one whose restart is still in flight does.
        in_flight = self._open_straggler_attempts()
        # Advice-only incidents (a straggler reported, a log line in a running job) do not
        # hide the same attempt's later crash, hang or fault.
        advice_only = {str(IncidentKind.STRAGGLER), str(IncidentKind.APP_FAULT)}
        known = {
            (job.job_id, job.restart_count)
            for job in view.jobs.values()
            if self._kinds(job) - advice_only
            or (job.job_id, job.restart_count, job.submit_time) in in_flight
        }
        advised = {
            (job.job_id, job.restart_count)
            for job in view.jobs.values()
            if str(IncidentKind.APP_FAULT) in self._kinds(job)
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
        found_now = detect(recent, evidence, known, self.catalogue, self.policy, advised)
        crashed = {(i.job_id, i.restart_count) for i in found_now}
        found_now += hang_incidents(watched, evidence, known | crashed, self.policy, timeouts)
        troubled = reported | {(i.job_id, i.restart_count) for i in found_now}
        found_now += straggler_incidents(watched, evidence, troubled, self.policy)
        self._drain_reported_idle_nodes(view, evidence)
        self.settling = False
        for found in found_now:
            job = view.jobs[found.job_id]
            if self._settling(found, job, view, evidence):
                self.settling = True  # the caller comes back within 0.1 s (and on evidence)
                continue
            drains = self._open(found, job, view, evidence, settings.get(found.job_id))
            view = after_drains(view, drains)  # the blast radius counts this pass's drains

    def _drain_reported_idle_nodes(self, view: ClusterView, evidence: list[CoreEvidence]) -> None:
        """An operator's report (``srecovery report NODE``) on a node no job runs on: drain it
        in act mode (new jobs must not start there), advise it in monitor mode. A node with a
        running job is drained by that job's incident. Once per report (audited by its id)."""
        busy = {n for job in view.jobs.values() if job.state == "RUNNING" for n in job.nodes}
        for ev in evidence:
            node = view.nodes.get(ev.node or "")
            if ev.kind != "operator_report" or node is None or node.name in busy:
                continue
            if node.drained:
                continue  # drained already, by anyone: their reason stays
            state = self.store.get_node(node.name)
            if state and (state.last_implicated_at or 0) >= ev.observed_at:
                continue  # an incident's verdict took this report in (its job's restart)
            handled = self.store.audit_about(evidence=[ev.id], since=ev.observed_at - 1)
            if any(r.kind == "report_drain" for r in handled):
                continue  # once per report: a resume after it stands
            mode = self.policy.mode_for(node.partitions[0] if node.partitions else "")
            reason = sanitize_reason(
                f"srecovery:report:{ev.payload.get('reason', '') or 'operator report'}"
            )
            outcome, message = "advised", f"monitor: would drain {node.name} ({reason})"
            if mode is Mode.ACT:
                try:
                    self.scheduler.drain_node(node.name, reason)
                    outcome, message = "drained", reason
                except Unreachable:
                    raise
                except SchedulerError as exc:
                    outcome, message = "failed", str(exc)
            self.store.append_audit(
                "controller",
                "report_drain",
                node.name,
                {"evidence": ev.id, "result": outcome, "message": message, "mode": str(mode)},
                ts=self.clock(),
            )
            log.warning("operator report on idle %s: %s (%s)", node.name, outcome, message)

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
        with_repeats = evidence + xid_history(self.store, job.nodes, found.failed_at, evidence)
        verdict = attribute(found, job, with_repeats, self.catalogue, self.policy, view.nodes)
        attributed = self.clock()
        history = self.store.list_incidents(history_id=attempt.history_id)
        restarted = [
            past
            for past in history
            if (past.outcome or "").startswith("restarted") or self._restarted(past, job)
        ]
        restarts = len(restarted)
        previous_cause = self._cause_of(max(restarted, key=lambda i: i.id)) if restarted else None
        policy = policy_for_job(self.policy, settings)
        tool_excluded = self._tool_exclusions(history)

        def advise_on(seen: ClusterView) -> CoreAdvice:
            return advise(
                found,
                verdict,
                job,
                policy,
                seen,
                restarts,
                tool_excluded=tool_excluded,
                previous_cause=previous_cause,
            )

        advice = advise_on(view)
        if advice.rule == "unplaceable" and self.node_listing is not None:
            # "too few usable nodes" calls an operator or stops the job: judged on a listing
            # read now, not one up to a loop interval old (a node resumed meanwhile, a ping
            # missed then): read afresh, decide again
            self.node_listing.refresh()
            advice = advise_on(dataclasses.replace(view, nodes=self.node_listing.nodes()))
        advised = self.clock()
        # the health check's drains of the nodes excluded: the advice shows them as evidence
        checked = {
            ev.id
            for ev in evidence
            if ev.kind == HEALTH_CHECK_KIND
            and ev.node in advice.exclude
            and ev.node in view.health_check_drained
        }
        evidence_ids = sorted({*verdict.evidence_ids, *found.trigger_ids, *checked})
        details = {
            "mode": str(advice.mode),
            "rule": advice.rule,
            "exclude": sorted(advice.exclude),
            "unexclude": sorted(advice.unexclude),
            "restarts": restarts,
            "previous_cause": previous_cause,
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
                evidence_ids=evidence_ids,
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
                    "evidence_ids": evidence_ids,
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
                self.metrics.needs_operator.labels(needs_operator_rule(advice)).inc()
        return advice.drain if advice.mode is Mode.ACT else frozenset()

    def _cause_of(self, incident: Incident) -> str | None:
        """The cause its advice gave an earlier incident (what a repeat is compared with)."""
        advice = self.store.latest_advice(incident.id)
        cause = advice.verdict.get("verdict", {}).get("cause") if advice is not None else None
        return cause if isinstance(cause, str) and cause else None

    def _tool_exclusions(self, history: Iterable[Incident]) -> frozenset[str]:
        """The nodes the tool excluded from this job (every attempt), less the user's own
        exclusions (as the job showed them at its first incident)."""
        excluded: set[str] = set()
        users: frozenset[str] | None = None
        for past in sorted(history, key=lambda i: i.id):
            if users is None and (first := self.store.latest_advice(past.id)) is not None:
                users = frozenset(first.verdict.get("job", {}).get("excluded_nodes", []))
            for a in self.store.actions(incident_id=past.id):
                if a.step == "exclude" and a.result == "ok":
                    excluded.update(a.params.get("nodes", []))
        return frozenset(excluded) - (users or frozenset())

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
        """Carry out the incident's advice: ask ``next_step`` and do what it says, until it
        waits or closes. Returns True while steps are in flight."""
        advice = self.store.latest_advice(incident.id)
        attempt = self.store.get_attempt(incident.attempt_id)
        if advice is None or attempt is None:
            return False
        plan = planned(incident.id, advice)
        job_id = attempt.attempt.job_id
        if plan.mode is Mode.MONITOR:
            self._close(incident, f"monitor: would {describe(plan, job_id)}")
            return False
        job = view.jobs.get(job_id)
        nodes = dict(view.nodes)
        fresh: set[str] = set()  # nodes read again in this pass
        for _ in range(12):  # one pass goes as far as Slurm allows
            actions = self.store.actions(incident_id=incident.id)
            failures = sum(1 for a in actions if a.result == "failed")
            if failures >= MAX_FAILED_STEPS:
                self._close(incident, f"gave up after {failures} failed steps: needs operator")
                return False
            done = {(a.step, a.target): a.finished_at for a in actions if a.result == "ok"}
            released_at = self._watchdog_released_at(incident, job, attempt.attempt.restart_count)
            nxt = next_step(
                plan,
                job,
                attempt.attempt.restart_count,
                done,
                nodes,
                self.clock(),
                hold_mark_of=parse_hold_mark(job.admin_comment) if job else None,
                watchdog_released_at=released_at,
            )
            for step in nxt.found:
                self._found(incident, plan, step)
            for change in nxt.changes:
                self._record_change(incident, job_id, change, advice.evidence_ids)
            if released_at is not None:
                self.store.add_milestone(incident.id, "released", at=released_at)
            if isinstance(nxt.action, Wait):
                return True
            if isinstance(nxt.action, Close):
                self._finish(incident, plan, job, nxt.action)
                return False
            step = nxt.action
            if step.name == "drain" and step.target not in fresh:
                # the view's listing may be a second old: an operator's drain or resume of
                # the node since then decides the step, never a stale picture of it
                fresh.add(step.target)
                nodes[step.target] = self.read_node(step.target)
                continue
            call = self._call(step, plan, job_id)
            params = {k: v for k, v in step.params.items() if k != "reason"} or None
            if not self._step(
                incident,
                plan,
                step.name,
                step.target,
                call,
                milestone=step.milestone,
                params=params,
                also=self._drain_recorder(step),  # committed with the action row
            ):
                return True
            if step.name == "drain":
                nodes[step.target] = self.read_node(step.target)
            elif step.name == "cancel":
                continue  # stopped: next_step closes
            else:
                job = self.scheduler.get_job(job_id)
        return True

    def read_node(self, name: str) -> Node:
        """The node as Slurm shows it now; the node listing shows it so from now on (the
        tool's drains and the operator's drains and resumes through the controller)."""
        node = self.scheduler.get_node(name)
        if self.node_listing is not None:
            self.node_listing.update(node)
        return node

    def _drain_recorder(self, step: Step) -> Callable[[], None] | None:
        """For a drain: the node record (blast radius, lemons) to commit with its action."""
        if step.name != "drain":
            return None
        return lambda: self._mark_drained(step.target, step.params["reason"])

    def _call(self, step: Step, plan: Plan, job_id: int) -> Callable[[], object]:
        """The scheduler call that does ``step``."""
        s = self.scheduler
        if step.name == "mark":
            mark = hold_mark(plan.incident_id, self.clock() + self.hold_deadline)
            return lambda: s.set_admin_comment(job_id, mark)
        if step.name == "unmark":  # the note replaces the mark; the site's text stays
            note = f"srecovery: requeued after incident {plan.incident_id}"
            if plan.exclude:
                note += f", excluding {hostlist.compress(plan.exclude)}"
            return lambda: s.set_admin_comment(job_id, note)
        calls: dict[str, Callable[[], object]] = {
            "drain": lambda: s.drain_node(step.target, step.params["reason"]),
            "requeue_hold": lambda: s.requeue_hold(job_id),
            "exclude": lambda: (
                s.add_excluded_nodes(job_id, step.params["nodes"], drop=step.params["unexclude"])
                if step.params.get("unexclude")
                else s.add_excluded_nodes(job_id, step.params["nodes"])
            ),
            "begin_now": lambda: s.set_begin_now(job_id, at=step.params.get("at")),
            "release": lambda: s.release(job_id),
            "unexclude": lambda: s.add_excluded_nodes(job_id, (), drop=[step.target]),
            "cancel": lambda: s.cancel(job_id, step.params["reason"]),
        }
        return calls[step.name]

    def _watchdog_released_at(self, incident: Incident, job: Job | None, base: int) -> float | None:
        """When the watchdog released this incident's job (its own clock), if it did."""
        if job is None or job.restart_count <= base:
            return None
        rows = self.store.audit_about(incidents=[incident.id], since=incident.opened_at)
        times = [r.ts for r in rows if r.kind == "watchdog_release"]
        return min(times) if times else None

    def _record_change(
        self, incident: Incident, job_id: int, change: Change, answered: Sequence[int] = ()
    ) -> None:
        """Someone else changed what the tool did: record it once as ``slurm_change``
        evidence (shown by ``explain``) and audit it; the tool leaves the change as it is. A
        resume names the evidence the tool's drain answered (``answered``, the advice's):
        :func:`~slurm_recovery.decide.cleared.repaired_ids`."""
        key = f"{change.what}:{change.target}"
        seen = self.store.evidence_by_kinds(("slurm_change",), job_id=job_id, limit=1000)
        if any(
            r.evidence.payload.get("incident") == incident.id
            and r.evidence.payload.get("key") == key
            for r in seen
        ):
            return
        now = self.clock()
        node = None if change.target.startswith("job ") else change.target
        with self.store.transaction():
            self.store.add_evidence(
                [
                    Evidence(
                        source="controller",
                        kind="slurm_change",
                        observed_at=now,
                        node=node,
                        job_id=job_id,
                        payload={
                            "incident": incident.id,
                            "key": key,
                            "change": change.what,
                            "detail": change.detail,
                            **({"evidence": list(answered)} if change.what == "resumed" else {}),
                        },
                    )
                ]
            )
            self.store.append_audit(
                "controller",
                "slurm_change",
                change.target,
                {"incident": incident.id, "change": change.what, "detail": change.detail},
                ts=now,
            )
        log.warning(
            "incident %d: %s: %s (left as it is)", incident.id, change.target, change.detail
        )

    def _finish(self, incident: Incident, plan: Plan, job: Job | None, close: Close) -> None:
        at = self.clock()
        late = job is not None and job.start_time and at - job.start_time > 2
        if close.milestone == "running_again" and job is not None and late:
            at = float(job.start_time)  # found late (the controller was down): Slurm's time
        if close.milestone:
            self.store.add_milestone(incident.id, close.milestone, at=at)
        if close.milestone == "running_again":
            self.store.add_milestone(incident.id, "released", at=at)  # once
        milestones = self.store.milestones(incident.id)
        with self.store.transaction():  # a redo is never lost with its incident closed
            self._close(incident, close.outcome)
            if close.redo and job is not None:
                self._redo(incident, plan, job)
        if close.milestone == "running_again" and self.metrics:
            self.metrics.recovered(milestones)

    def _redo(self, incident: Incident, plan: Plan, job: Job) -> None:
        """The job runs again on a node the advice excluded (the watchdog released it before
        the exclusion was applied): the same advice again, for the job's current attempt."""
        now = self.clock()
        attempt = self.store.resolve_attempt(
            JobAttempt(self.cluster, job.job_id, job.submit_time, job.restart_count), seen_at=now
        )
        old = self.store.latest_advice(incident.id)
        assert old is not None
        summary = (
            f"job {job.job_id} runs again on {hostlist.compress(job.nodes)}, which incident "
            f"{incident.id} excluded"
        )
        found = self.store.find_open_incident(attempt.id)
        if found is not None:
            # This pass's detect already saw the same evidence in the new attempt (it arrived
            # within START_SLACK of the start) and opened its incident: that one restarts the
            # job; the audit links the two.
            self.store.append_audit(
                "controller",
                "redo",
                f"job {job.job_id}",
                {"incident": found.id, "redo_of": incident.id, "summary": summary},
                ts=now,
            )
            log.warning(
                "incident %d: %s; incident %d, already open, restarts it again",
                incident.id,
                summary,
                found.id,
            )
            return
        with self.store.transaction():
            again = self.store.open_incident(
                attempt.id, str(IncidentKind.DOOMED), opened_at=now, summary=summary
            )
            self.store.add_milestone(again.id, "failure", at=now)
            self.store.add_milestone(again.id, "detected", at=now)
            stored = self.store.add_advice(
                again.id,
                decision=old.decision,
                reason=f"{old.reason} (again: {summary})",
                verdict={**old.verdict, "job": job_snapshot(job), "redo_of": incident.id},
                evidence_ids=list(old.evidence_ids),
                created_at=now,
            )
            self.store.add_milestone(again.id, "advised", at=now)
            self.store.append_audit(
                "controller",
                "advice",
                f"job {job.job_id}",
                {
                    "incident": again.id,
                    "advice": stored.id,
                    "action": old.decision,
                    "mode": old.verdict.get("mode"),
                    "reason": stored.reason,
                    "rule": old.verdict.get("rule", ""),
                    "redo_of": incident.id,
                },
                ts=now,
            )
        self._remember(again)
        log.warning(
            "incident %d: %s; incident %d restarts it again", incident.id, summary, again.id
        )

    def _mark_drained(self, node: str, reason: str) -> None:
        now = self.clock()
        old = self.store.get_node(node)
        self.store.upsert_node(
            NodeState(
                name=node,
                updated_at=now,
                drained_by_tool=True,
                drain_reason=sanitize_reason(reason),
                drained_at=now,
                implicated_count=old.implicated_count if old else 0,
                last_implicated_at=old.last_implicated_at if old else None,
            )
        )

    def _found(self, incident: Incident, plan: Plan, step: Step) -> None:
        """Record ``step`` as done: Slurm shows it, and no success is recorded. Either the
        controller stopped after the call, or Slurm applied it and its answer was lost."""
        done = self.store.actions(incident_id=incident.id)
        if any(a.step == step.name and a.target == step.target and a.result == "ok" for a in done):
            return
        lost = any(
            r.kind == "action"
            and r.payload.get("step") == step.name
            and r.subject == step.target
            and r.payload.get("result") == "unanswered"
            for r in self.store.audit_about(incidents=[incident.id], since=incident.opened_at)
        )
        if step.params.get("by") == "slurm":
            message = "done by Slurm itself (expedited requeue), not by the tool"
        elif lost:
            message = (
                "found done in Slurm: Slurm applied it, but its answer was lost (slurmctld "
                "stopped answering during the call)"
            )
        else:
            message = "found done in Slurm, with no record: the controller stopped after the call"
        now = self.clock()
        with self.store.transaction():
            self.store.record_action(
                step.name,
                step.target,
                result="ok",
                started_at=now,
                finished_at=now,
                advice_id=plan.advice_id,
                params={k: v for k, v in step.params.items() if k != "reason"} or None,
                message=message,
            )
            self.store.append_audit(
                "controller",
                "action",
                step.target,
                {"incident": incident.id, "step": step.name, "result": "ok", "found": True},
                ts=now,
            )
            if step.name == "drain":
                shown = self.store.get_node(step.target)
                if not (shown and shown.drained_by_tool):  # drained by us just before a crash
                    self._mark_drained(step.target, step.params.get("reason", ""))
        log.warning("incident %d: %s %s %s", incident.id, step.name, step.target, message)

    # --- recording -----------------------------------------------------------------

    def _step(
        self,
        incident: Incident,
        plan: Plan,
        step: str,
        target: str,
        call: Callable[[], object],
        *,
        milestone: str | None = None,
        params: Mapping[str, Any] | None = None,
        also: Callable[[], None] | None = None,
    ) -> bool:
        """Do one scheduler step and record it (action, milestone, audit); False if refused."""
        started = self.clock()
        try:
            call()
        except Unreachable as exc:  # Slurm may have applied it: say so, then retry later
            self.store.append_audit(
                "controller",
                "action",
                target,
                {
                    "incident": incident.id,
                    "step": step,
                    "result": "unanswered",
                    "message": str(exc),
                },
                ts=self.clock(),
            )
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
            if also is not None:
                also()
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
        if self.after_step:
            self.after_step(step)
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
            evidence = [
                Evidence.from_wire(parse_event(e, f"spool {i}"), "hook")
                for i, e in enumerate(events)
            ]
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
            if isinstance(record, dict) and "incident_id" in record:
                record["incident"] = record["incident_id"]  # among the incident's own rows
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


def describe(plan: Plan, job_id: int) -> str:
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
