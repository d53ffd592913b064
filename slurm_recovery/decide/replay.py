"""Replay: decide recorded incidents again with another policy (``srecovery replay``).

Pure and deterministic, like the rest of the core: recorded inputs in (the incident, the job as
Slurm showed it when the advice was given, the evidence the controller could see then, the
restarts the tool had made, the nodes), :func:`attribute` and :func:`advise` with the new policy,
and the difference from the advice on record out. Nothing is stored and nothing is sent to
Slurm: the caller only reads.

What cannot be recorded exactly is reconstructed, and the case says so (``approximate``):

- the job comes from the snapshot kept with the advice (``loop.job_snapshot``); advice written
  before snapshots existed, or a snapshot missing a field, falls back to the attempt on record
  (job id, restart count, submit time), the incident's summary (end state and exit code of a
  crash), the job's ``job_start`` evidence (nodes, start time) and the verdict's nodes;
- the nodes are Slurm's nodes as the controller last saw them, their DRAIN flags and reasons
  wound back to the advice's time with what the controller observed (``slurm_change``) and the
  tool's own drains; without any view of Slurm, a minimal view of the job's nodes;
- the restarts the tool had made are those the controller counted, when recorded with the
  advice (``restarts``); older advice falls back to the incidents closed ``restarted`` by then.

The evidence is seen as the loop saw it: the node evidence the node had cleared by the failure
(``decide.cleared``) and what was said about a node before Slurm showed it resumed (the
controller's ``slurm_change`` evidence, passed in) are set aside by :func:`attribute` itself, and
the job's own settings (``--recovery-max-restarts``, ``--recovery=monitor`` in its
``job_start``) shape the policy, as in the loop.

- a straggler's verdict does not depend on the policy (``attribute`` takes it from what the
  detector found, which is not recorded): the verdict on record is advised again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from slurm_recovery.decide.advise import advise
from slurm_recovery.decide.attribute import attribute
from slurm_recovery.decide.jobsettings import job_settings, policy_for_job
from slurm_recovery.decide.model import (
    Advice,
    ClusterView,
    Evidence,
    FaultClass,
    Incident,
    IncidentKind,
    Verdict,
)
from slurm_recovery.decide.policy import Policy
from slurm_recovery.scheduler.base import ExitCode, Job, Node
from slurm_recovery.signals.xid import XidCatalogue

#: The fields an advice is compared on; the first five change what happens.
EFFECT_FIELDS = ("action", "mode", "exclude", "drain", "needs_operator")
FIELDS = (*EFFECT_FIELDS, "rule", "reason")
#: The tool's drain reasons start with this (loop.py).
TOOL_DRAIN_PREFIX = "srecovery:"

_CRASH_SUMMARY = re.compile(r"ended (\S+) \(exit (\d+):(\d+)\)")


@dataclass(frozen=True)
class Recorded:
    """The advice on record, as compared."""

    action: str
    mode: str
    reason: str
    rule: str
    exclude: frozenset[str] = frozenset()
    drain: frozenset[str] = frozenset()
    needs_operator: bool = False

    def value(self, name: str) -> Any:
        return getattr(self, name)


@dataclass(frozen=True)
class NodeEvent:
    """A change of a node's DRAIN flag: ``drained`` (with its reason) or ``resumed``
    (``previous_reason``: the drain it ended), at ``at``."""

    node: str
    at: float
    change: str  # "drained", "resumed", "drain_reason_changed"
    reason: str = ""
    previous_reason: str = ""


@dataclass(frozen=True)
class Case:
    """One incident, ready to be decided again."""

    incident_id: int
    incident: Incident
    job: Job
    evidence: tuple[Evidence, ...]
    restarts_before: int
    view: ClusterView
    recorded: Recorded
    #: the verdict on record, advised again for kinds whose attribution ignores the policy
    recorded_verdict: Verdict | None = None
    #: what was reconstructed rather than recorded, in words
    approximate: tuple[str, ...] = ()
    #: the cause of the incident the job was restarted after (``stop_on_same_failure``)
    previous_cause: str | None = None


@dataclass(frozen=True)
class Outcome:
    case: Case
    new: Advice
    changed: tuple[str, ...] = field(default=())

    @property
    def effect_changed(self) -> bool:
        return any(name in EFFECT_FIELDS for name in self.changed)


def recorded_of(advice: Advice) -> Recorded:
    return Recorded(
        action=str(advice.action),
        mode=str(advice.mode),
        reason=advice.reason,
        rule=advice.rule,
        exclude=frozenset(advice.exclude),
        drain=frozenset(advice.drain),
        needs_operator=advice.needs_operator,
    )


def replay_case(case: Case, policy: Policy, catalogue: XidCatalogue) -> Outcome:
    """Decide ``case`` again with ``policy``; which compared fields differ from the record."""
    if case.recorded_verdict is not None:
        verdict = case.recorded_verdict
    else:
        verdict = attribute(
            case.incident, case.job, case.evidence, catalogue, policy, case.view.nodes
        )
    own = job_settings(case.evidence).get(case.job.job_id)
    new = advise(
        case.incident,
        verdict,
        case.job,
        policy_for_job(policy, own),
        case.view,
        case.restarts_before,
        previous_cause=case.previous_cause,
    )
    now = recorded_of(new)
    changed = tuple(name for name in FIELDS if now.value(name) != case.recorded.value(name))
    return Outcome(case, new, changed)


def replay(cases: Iterable[Case], policy: Policy, catalogue: XidCatalogue) -> list[Outcome]:
    return [replay_case(case, policy, catalogue) for case in cases]


# ------------------------------------------------------------ nodes at the advice's time


def nodes_at(nodes: Mapping[str, Node], events: Iterable[NodeEvent], at: float) -> dict[str, Node]:
    """``nodes`` (Slurm now) with each node's DRAIN flag and reason as they were at ``at``:
    the first recorded change after ``at`` says what the node was before it; a node with no
    change after ``at`` was then as it is now."""
    first_after: dict[str, NodeEvent] = {}
    for event in sorted(events, key=lambda e: (e.at, e.node)):
        if event.at > at and event.node not in first_after:
            first_after[event.node] = event
    out = dict(nodes)
    for name, event in first_after.items():
        node = nodes.get(name)
        if node is None:
            continue
        if event.change == "drained":
            out[name] = replace(node, flags=node.flags - {"DRAIN"}, reason="")
        else:  # resumed, or a drain whose reason changed later: drained then, old reason
            out[name] = replace(node, flags=node.flags | {"DRAIN"}, reason=event.previous_reason)
    return out


def drained_by_tool_at(
    nodes_then: Mapping[str, Node], tool_drains: Iterable[tuple[str, float]], at: float
) -> dict[str, float]:
    """node -> when the tool drained it, for the tool's drains in force at ``at`` (the blast
    radius counts them)."""
    last: dict[str, float] = {}
    for node, when in tool_drains:
        if when <= at and when >= last.get(node, -1.0):
            last[node] = when
    out = {}
    for name, node in nodes_then.items():
        if node.drained and node.reason.startswith(TOOL_DRAIN_PREFIX):
            out[name] = last.get(name, at)
    return out


# ------------------------------------------------------------ cases from the API's JSON


def _time(value: Any) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return float(value)
    return datetime.fromisoformat(str(value)).timestamp()


def evidence_from_json(items: Iterable[Mapping[str, Any]]) -> list[Evidence]:
    out = []
    for e in items:
        observed = _time(e.get("observed_at"))
        if observed is None:
            continue
        out.append(
            Evidence(
                id=int(e["id"]),
                source=str(e.get("source", "")),
                kind=str(e.get("kind", "")),
                observed_at=observed,
                node=e.get("node"),
                gpu=e.get("gpu"),
                job_id=e.get("job_id"),
                payload=dict(e.get("payload") or {}),
            )
        )
    return out


def node_from_json(data: Mapping[str, Any]) -> Node:
    return Node(
        name=str(data["name"]),
        state=str(data.get("state", "IDLE")),
        flags=frozenset(data.get("flags") or ()),
        reason=str(data.get("reason") or ""),
        partitions=tuple(data.get("partitions") or ()),
    )


def job_from_record(
    item: Mapping[str, Any], evidence: Sequence[Evidence]
) -> tuple[Job, tuple[str, ...]]:
    """The job as it was when advised: the snapshot kept with the advice; what it lacks is
    reconstructed, and named in the second value."""
    advice = item.get("advice") or {}
    snap = advice.get("job")
    guessed: list[str] = []
    if not isinstance(snap, Mapping):
        snap = {}
        guessed.append("no job snapshot with this advice")

    def take(name: str, fallback: Any, why: str = "") -> Any:
        if name in snap and snap[name] is not None:
            return snap[name]
        if snap:
            guessed.append(f"job {name} ({why})" if why else f"job {name}")
        return fallback

    job_id = int(take("job_id", item.get("job_id") or 0))
    restart_count = int(take("restart_count", item.get("restart_count") or 0))
    mine = [e for e in evidence if e.job_id == job_id]
    starts = [
        e
        for e in mine
        if e.kind == "job_start" and e.payload.get("restart_count", restart_count) == restart_count
    ]
    kind = str(item.get("kind", ""))
    crash = _CRASH_SUMMARY.search(str(item.get("summary", "")))
    failed_at = _time(item.get("failed_at")) or _time(item.get("opened_at")) or 0.0
    if kind == IncidentKind.CRASH:
        state_guess = crash.group(1) if crash else "FAILED"
        exit_guess = [int(crash.group(2)), int(crash.group(3))] if crash else [0, 0]
    else:
        state_guess, exit_guess = "RUNNING", [0, 0]
    verdict_nodes = sorted((advice.get("verdict") or {}).get("nodes") or [])
    start_nodes = sorted({e.node for e in starts if e.node})
    nodes = take("nodes", start_nodes or verdict_nodes, "from job_start evidence")
    exit_code = take("exit_code", exit_guess, "from the incident summary")
    if not isinstance(exit_code, Sequence) or len(exit_code) != 2:
        exit_code = exit_guess
    start_guess = int(min((e.observed_at for e in starts), default=0))
    job = Job(
        job_id=job_id,
        name=str(snap.get("name", "")),
        state=str(take("state", state_guess, "from the incident kind and summary")),
        reason="",
        user=str(snap.get("user", "")),
        partition=str(take("partition", "", "the default mode applies")),
        nodes=tuple(nodes),
        num_nodes=int(take("num_nodes", len(nodes))),
        submit_time=int(take("submit_time", item.get("submit_time") or 0)),
        restart_count=restart_count,
        excluded_nodes=frozenset(take("excluded_nodes", [], "taken as none")),
        exit_code=ExitCode(int(exit_code[0]), int(exit_code[1])),
        start_time=int(take("start_time", start_guess, "from job_start evidence")),
        end_time=int(take("end_time", int(failed_at) if kind == IncidentKind.CRASH else 0)),
        requeueable=bool(take("requeueable", True, "taken as requeueable")),
        required_nodes=frozenset(take("required_nodes", [], "taken as none")),
    )
    if not snap:
        guessed.append(
            "job reconstructed from the attempt, the incident summary and job_start evidence"
        )
    return job, tuple(guessed)


def _recorded(advice: Mapping[str, Any]) -> Recorded:
    return Recorded(
        action=str(advice.get("action") or ""),
        mode=str(advice.get("mode") or ""),
        reason=str(advice.get("reason") or ""),
        rule=str(advice.get("rule") or ""),
        exclude=frozenset(advice.get("exclude") or ()),
        drain=frozenset(advice.get("drain") or ()),
        needs_operator=bool(advice.get("needs_operator")),
    )


def _verdict(data: Mapping[str, Any]) -> Verdict:
    try:
        fault_class = FaultClass(str(data.get("fault_class", "unknown")))
    except ValueError:
        fault_class = FaultClass.UNKNOWN
    return Verdict(
        fault_class=fault_class,
        nodes=frozenset(data.get("nodes") or ()),
        gpus=frozenset((str(g[0]), int(g[1])) for g in data.get("gpus") or ()),
        confidence=float(data.get("confidence") or 0.0),
        evidence_ids=tuple(int(i) for i in data.get("evidence_ids") or ()),
        cause=str(data.get("cause") or ""),
    )


def case_from_json(
    item: Mapping[str, Any],
    nodes_now: Mapping[str, Node] | None,
    events: Sequence[NodeEvent] = (),
    tool_drains: Sequence[tuple[str, float]] = (),
    slurm_changes: Sequence[Evidence] = (),
) -> Case | None:
    """A :class:`Case` from one incident of ``GET /v1/history/incidents?evidence=1``; None for
    an incident without advice (nothing to compare with). ``slurm_changes``: the controller's
    ``slurm_change`` evidence (``/v1/history/slurm``); the changes of the case's nodes that it
    could see when it advised join the case's evidence, as they joined the loop's."""
    advice = item.get("advice")
    if not advice:
        return None
    evidence = evidence_from_json(item.get("evidence") or ())
    decided = _time(advice.get("created_at")) or _time(item.get("detected_at")) or 0.0
    have = {ev.id for ev in evidence}
    snapshot = advice.get("job") if isinstance(advice.get("job"), Mapping) else {}
    about = (
        {ev.node for ev in evidence if ev.node}
        | set((advice.get("verdict") or {}).get("nodes") or ())
        | set(snapshot.get("nodes") or ())
    )
    evidence += [
        ev
        for ev in slurm_changes
        if ev.node in about and ev.id not in have and ev.observed_at <= decided
    ]
    job, guessed = job_from_record(item, evidence)
    approximate = list(guessed)
    try:
        kind = IncidentKind(str(item.get("kind")))
    except ValueError:
        kind = IncidentKind.CRASH
        approximate.append(f"unknown incident kind {item.get('kind')!r} taken as crash")
    at = _time(advice.get("created_at")) or _time(item.get("detected_at")) or 0.0
    failed_at = _time(item.get("failed_at"))
    if failed_at is None:
        failed_at = _time(item.get("opened_at")) or at
        approximate.append("failure time taken as the incident's opening")
    if nodes_now:
        then = nodes_at(nodes_now, events, at)
    else:
        names = set(job.nodes) | set((advice.get("verdict") or {}).get("nodes") or ())
        parts = (job.partition,) if job.partition else ()
        then = {name: Node(name, "ALLOCATED", partitions=parts) for name in sorted(names)}
        approximate.append("no view of Slurm's nodes: only the job's, as in service")
    view = ClusterView(
        now=at,
        jobs={job.job_id: job},
        nodes=then,
        drained_by_tool=drained_by_tool_at(then, tool_drains, at),
        whole_listing=bool(nodes_now),
    )
    recorded_verdict = None
    if kind is IncidentKind.STRAGGLER:
        recorded_verdict = _verdict(advice.get("verdict") or {})
    if item.get("evidence_truncated"):
        approximate.append("evidence truncated (too much around this incident)")
    incident = Incident(
        job_id=job.job_id,
        restart_count=job.restart_count,
        submit_time=job.submit_time,
        kind=kind,
        failed_at=failed_at,
        trigger_ids=tuple(int(i) for i in advice.get("evidence_ids") or ()),
        summary=str(item.get("summary") or ""),
    )
    return Case(
        incident_id=int(item["id"]),
        incident=incident,
        job=job,
        evidence=tuple(evidence),
        restarts_before=_restarts(advice, item),
        view=view,
        recorded=_recorded(advice),
        recorded_verdict=recorded_verdict,
        approximate=tuple(approximate),
        previous_cause=_text_or_none(advice.get("previous_cause")),
    )


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _restarts(advice: Mapping[str, Any], item: Mapping[str, Any]) -> int:
    """The restarts the controller counted when it advised (kept with the advice), else the
    incidents closed ``restarted`` by then (which misses a restart not yet closed)."""
    counted = advice.get("restarts")
    if type(counted) is int and counted >= 0:
        return counted
    return int(item.get("restarts_before") or 0)


def events_from_json(
    changes: Iterable[Mapping[str, Any]], tool_actions: Iterable[Mapping[str, Any]]
) -> tuple[list[NodeEvent], list[tuple[str, float]]]:
    """Node events from ``/v1/history/slurm``: what the controller observed, and the tool's own
    drains (``drain`` steps: their reason starts ``srecovery:<incident>:``)."""
    events = []
    for row in changes:
        payload = row.get("payload") or {}
        at = _time(row.get("observed_at"))
        node = payload.get("node")
        change = payload.get("change")
        if at is None or not node or change not in ("drained", "resumed", "drain_reason_changed"):
            continue
        events.append(
            NodeEvent(
                str(node),
                at,
                str(change),
                str(payload.get("reason", "")),
                str(payload.get("previous_reason", "")),
            )
        )
    drains = []
    for action in tool_actions:
        at = _time(action.get("at"))
        target = str(action.get("target", ""))
        if action.get("step") != "drain" or at is None or not target:
            continue
        node = target.removeprefix("node ")
        incident = action.get("incident")
        events.append(NodeEvent(node, at, "drained", f"{TOOL_DRAIN_PREFIX}{incident or ''}:"))
        drains.append((node, at))
    return events, drains


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    case, new = outcome.case, outcome.new
    verdict = new.verdict
    return {
        "incident": case.incident_id,
        "job_id": case.job.job_id,
        "kind": str(case.incident.kind),
        "changed": list(outcome.changed),
        "effect_changed": outcome.effect_changed,
        "old": _advice_json(case.recorded),
        "new": {
            **_advice_json(recorded_of(new)),
            "verdict": None
            if verdict is None
            else {
                "fault_class": str(verdict.fault_class),
                "nodes": sorted(verdict.nodes),
                "confidence": verdict.confidence,
                "cause": verdict.cause,
            },
        },
        "approximate": list(case.approximate),
    }


def _advice_json(r: Recorded) -> dict[str, Any]:
    return {
        "action": r.action,
        "mode": r.mode,
        "reason": r.reason,
        "rule": r.rule,
        "exclude": sorted(r.exclude),
        "drain": sorted(r.drain),
        "needs_operator": r.needs_operator,
    }
