"""What the read endpoints return: incidents told as stories, nodes with what the tool knows
about them, in JSON with ISO-8601 times.

The pure parts (no store, no clock) are separate so that they can be tested on their own:
:func:`describe_evidence`, :func:`decisive_evidence` and :func:`build_timeline` tell an
incident; :func:`open_findings` and :func:`lemon_score` judge a node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from slurm_recovery.contract import hostlist
from slurm_recovery.controller.loop import milestone_latencies
from slurm_recovery.decide.cleared import cleared_ids
from slurm_recovery.decide.model import ClusterView
from slurm_recovery.decide.model import Evidence as CoreEvidence
from slurm_recovery.decide.placement import shortfall
from slurm_recovery.holdmark import requeue_incident, requeued_by_tool
from slurm_recovery.store import (
    Advice,
    AuditRow,
    EvidenceRecord,
    Incident,
    NodeReport,
    NodeState,
    Store,
)
from slurm_recovery.store.store import MILESTONE_ORDER

# --------------------------------------------------------------------------- plain values


def iso(ts: float | None, timespec: str = "milliseconds") -> str | None:
    """Epoch seconds -> ``2026-11-29T13:47:56.123+00:00`` (None stays None); ``timespec``
    ``"microseconds"`` where the time must survive the round trip exactly (replay)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec=timespec)


def epoch(text: str | None) -> float | None:
    """The inverse of :func:`iso` (None stays None)."""
    if not text:
        return None
    return datetime.fromisoformat(text).timestamp()


def advice_json(advice: Advice, timespec: str = "milliseconds") -> dict[str, Any]:
    details = advice.verdict
    return {
        "id": advice.id,
        "generation": advice.generation,
        "created_at": iso(advice.created_at, timespec),
        "action": advice.decision,
        "mode": details.get("mode"),
        "reason": advice.reason,
        "rule": details.get("rule"),
        "exclude": details.get("exclude", []),
        "drain": details.get("drain", []),
        "needs_operator": details.get("needs_operator", False),
        "verdict": details.get("verdict", {}),
        "job": details.get("job"),  # Slurm's view of the job when advised (replay)
        "restarts": details.get("restarts"),  # the restarts the controller counted (replay)
        "evidence_ids": list(advice.evidence_ids),
    }


def evidence_json(record: EvidenceRecord, timespec: str = "milliseconds") -> dict[str, Any]:
    e = record.evidence
    out = {
        "id": record.id,
        "source": e.source,
        "kind": e.kind,
        "node": e.node,
        "gpu": e.gpu,
        "job_id": e.job_id,
        "observed_at": iso(e.observed_at, timespec),
        "received_at": iso(record.received_at, timespec),
        "payload": dict(e.payload),
    }
    out["description"] = describe_evidence(out)
    return out


def audit_json(row: AuditRow) -> dict[str, Any]:
    try:
        payload: dict[str, Any] = dict(row.payload)
    except (ValueError, TypeError):  # a row edited by hand: shown, not a server error
        payload = {"unparsable": row.payload_json}
    return {
        "seq": row.seq,
        "ts": iso(row.ts),
        "actor": row.actor,
        "kind": row.kind,
        "subject": row.subject,
        "payload": payload,
        "hash": row.hash,
    }


def node_json(state: NodeState) -> dict[str, Any]:
    """What the store keeps about a node (the first keys of every ``/v1/nodes`` item)."""
    return {
        "name": state.name,
        "drained_by_tool": state.drained_by_tool,
        "drain_reason": state.drain_reason,
        "drained_at": iso(state.drained_at),
        "implicated_count": state.implicated_count,
        "last_implicated_at": iso(state.last_implicated_at),
        "updated_at": iso(state.updated_at),
    }


# ------------------------------------------------------------------- evidence, in words


def _one_line(text: Any, limit: int = 200) -> str:
    words = " ".join(str(text).split())
    return words if len(words) <= limit else words[: limit - 3] + "..."


def _where(e: Mapping[str, Any]) -> str:
    node, gpu = e.get("node"), e.get("gpu")
    if node and gpu is not None:
        return f"{node} GPU {gpu}"
    return node or (f"GPU {gpu}" if gpu is not None else "")


def describe_evidence(e: Mapping[str, Any]) -> str:
    """One line saying what a piece of evidence (``evidence_json``) says: a log line with its
    signature id and text, a finding with its node, GPU and check, an XID with its code."""
    p: Mapping[str, Any] = e.get("payload") or {}
    kind = e.get("kind", "")
    where = _where(e)
    at = f" on {where}" if where else ""
    if kind == "xid":
        text = f"XID {p.get('xid')}{at}"
        return f"{text}: {_one_line(p['message'])}" if p.get("message") else text
    if kind == "operator_report":
        xid = f" (XID {p['xid']})" if p.get("xid") is not None else ""
        return f"operator report{at}{xid}: {_one_line(p.get('reason', ''))}"
    if kind in ("gpu_finding", "ib_finding"):
        port = f" port {p['port']}" if p.get("port") else ""
        check = p.get("check", kind)
        state = "cleared" if p.get("cleared") is True else p.get("severity", "?")
        detail = f": {_one_line(p['detail'])}" if p.get("detail") else ""
        return f"{check} ({state}){at}{port}{detail}"
    if kind == "log_signature":
        rank = f" rank {p['rank']}" if p.get("rank") is not None else ""
        knock = " (knock-on)" if p.get("knock_on") else ""
        src = f" [{where}{rank}]" if where or rank else ""
        return f"log {p.get('signature', '?')}{knock}{src}: {_one_line(p.get('text', ''))}"
    if kind == "node_state":
        flags = "+".join(p.get("flags") or [])
        state = f"{p.get('state', '?')}{'+' + flags if flags else ''}"
        reason = f" ({_one_line(p['reason'])})" if p.get("reason") else ""
        return f"Slurm showed {e.get('node') or '?'} {state}{reason}"
    if kind == "job_end":
        state = p.get("state") or "ended"
        code = p.get("exit_code")
        sig = f" signal {p['signal']}" if p.get("signal") else ""
        ended = f"job {e.get('job_id') or ''} {state}".replace("  ", " ")
        return f"{ended} exit {code}{sig}{at}" if code is not None else f"{ended}{at}"
    if kind == "job_start":
        nodes = p.get("nodes")
        names = hostlist.compress(nodes) if isinstance(nodes, list) else (nodes or where)
        restart = p.get("restart_count")
        attempt = f" (attempt {restart})" if restart is not None else ""
        started = f"job {e.get('job_id') or ''} started on {names or '?'}{attempt}"
        return started + gate_words(p.get("health_gate"), where)
    if kind == "progress":
        rank = f"rank {p['rank']} " if p.get("rank") is not None else ""
        return f"{rank}reached step {p.get('step')}{at} ({p.get('origin', '?')})"
    if kind == "flight_recorder":
        groups = p.get("groups")
        count = f", {len(groups)} process group(s)" if isinstance(groups, list) else ""
        return f"flight-recorder dump of rank {p.get('rank')}{at} ({p.get('backend', '?')}{count})"
    if kind == "gpu_activity":
        busy = "busy" if p.get("busy") else "idle"
        util = f" ({p['utilization']}%)" if p.get("utilization") is not None else ""
        return f"GPUs {busy}{util}{at}"
    if kind == "health_check_drain":
        return f"the site's health check drained {e.get('node') or '?'}: " + _one_line(
            p.get("reason", "")
        )
    if kind == "sidecar_silent":
        quiet = p.get("silent_for")
        jobs = p.get("jobs") if isinstance(p.get("jobs"), list) else []
        running = f" while it ran job{'s' if len(jobs) > 1 else ''} " if jobs else ""
        return (
            f"{e.get('node') or '?'}'s sidecar sent nothing"
            + (f" for {quiet:.0f}s" if isinstance(quiet, int | float) else "")
            + (running + ", ".join(str(j) for j in jobs) if jobs else "")
        )
    if kind == "slurm_change":
        if p.get("incident") is not None:  # after one of the incident's steps: left as it is
            return f"Slurm: {_one_line(p.get('detail', ''))} (kept: the tool does not undo it)"
        return f"Slurm: {p.get('change', '?')}{at}"
    return f"{kind}{at}: {_one_line(dict(p), 160)}" if p else f"{kind}{at}"


def gate_words(gate: Any, node: str) -> str:
    """What the prolog's health gate recorded in a ``job_start`` (``"; health gate on n2:
    refused ...; nhc fail, exit 1 in 0.21 s: NHC: ..."``), or "" when nothing (or nothing
    readable) was recorded."""
    if not isinstance(gate, Mapping):
        return ""
    parts = []
    if gate.get("refused") is True:
        parts.append(f"refused the node: {_one_line(gate.get('reason', ''), 160)}")
    nhc = gate.get("nhc")
    if isinstance(nhc, Mapping):
        words = f"nhc {nhc.get('verdict', '?')}"
        if isinstance(nhc.get("exit_code"), int):
            words += f", exit {nhc['exit_code']}"
        if isinstance(nhc.get("duration"), int | float):
            words += f" in {nhc['duration']:.2f} s"
        lines = nhc.get("output")
        if isinstance(lines, list) and lines:
            words += f": {_one_line(' | '.join(str(line) for line in lines[:3]), 160)}"
        elif nhc.get("note"):
            words += f" ({_one_line(nhc['note'], 160)})"
        parts.append(words)
    return f"; health gate on {node or '?'}: " + "; ".join(parts) if parts else ""


# --------------------------------------------------------------- an incident, as a story


def incident_summary(store: Store, incident: Incident) -> dict[str, Any]:
    """One incident as ``srecovery incidents`` lists it: its latest advice and latencies, and
    (flat) its state, class, implicated nodes and the job's nodes."""
    attempt = store.get_attempt(incident.attempt_id)
    advice = store.latest_advice(incident.id)
    milestones = store.milestones(incident.id)
    verdict = (advice.verdict.get("verdict") if advice else None) or {}
    job = (advice.verdict.get("job") if advice else None) or {}
    return {
        "id": incident.id,
        "kind": incident.kind,
        "cluster": attempt.attempt.cluster if attempt else None,
        "job_id": attempt.attempt.job_id if attempt else None,
        "restart_count": attempt.attempt.restart_count if attempt else None,
        "opened_at": iso(incident.opened_at),
        "closed_at": iso(incident.closed_at),
        "state": "open" if incident.is_open else "closed",
        "outcome": incident.outcome,
        "summary": incident.summary,
        "fault_class": verdict.get("fault_class", "unknown"),
        "nodes": list(verdict.get("nodes", [])),
        "job_nodes": list(job.get("nodes", [])),
        "advice": advice_json(advice) if advice else None,
        "latencies": milestone_latencies(milestones),
    }


#: Evidence kinds about the attempt itself that set the scene on the timeline.
CONTEXT_KINDS = ("job_start", "job_end")
#: Seconds of slack when looking for an incident's audit rows by time.
AUDIT_SLACK = 600.0


def incident_story(store: Store, incident: Incident) -> dict[str, Any]:
    """Everything about one incident: evidence, every advice generation, milestones, actions,
    the audit rows that record them, the decisive evidence first and a timeline."""
    story = incident_summary(store, incident)
    history = store.advice_history(incident.id)
    ids = sorted({i for a in history for i in a.evidence_ids})
    evidence = store.evidence_by_id(ids)
    story["advice_history"] = [advice_json(a) for a in history]
    story["evidence"] = [evidence_json(r) for r in evidence]
    milestones = store.milestones(incident.id)
    story["milestones"] = {k: iso(v) for k, v in sorted(milestones.items(), key=lambda kv: kv[1])}
    actions = store.actions(incident_id=incident.id)
    story["actions"] = [
        {
            "id": a.id,
            "advice_id": a.advice_id,
            "step": a.step,
            "target": a.target,
            "result": a.result,
            "started_at": iso(a.started_at),
            "finished_at": iso(a.finished_at),
            "duration": round(a.finished_at - a.started_at, 6),
            "message": a.message,
            "params": dict(a.params or {}),
            "audit_seq": None,
        }
        for a in actions
    ]
    snapshot = (history[-1].verdict.get("job") if history else None) or {}
    story["context_evidence"] = _context_evidence(store, story, snapshot, milestones, incident)
    earliest = min([incident.opened_at, *(r.received_at for r in evidence), *milestones.values()])
    # what operators sent (reports, the head node's job events) has an audit row of its own
    sent = [
        e["id"]
        for e in [*story["evidence"], *story["context_evidence"]]
        if e["source"] == "operator"
    ]
    rows = store.audit_about(incidents=[incident.id], evidence=sent, since=earliest - AUDIT_SLACK)
    story["audit"] = [{k: v for k, v in audit_json(r).items() if k != "hash"} for r in rows]
    link_audit(story)
    story["decisive_evidence"] = decisive_evidence(story)
    story["timeline"] = build_timeline(story)
    return story


def _context_evidence(
    store: Store,
    story: Mapping[str, Any],
    snapshot: Mapping[str, Any],
    milestones: Mapping[str, float],
    incident: Incident,
) -> list[dict[str, Any]]:
    """The attempt's own start and end events (job_start, job_end), for the timeline: from
    the attempt's start (the job snapshot kept with the advice) to the incident's end."""
    job_id, restart = story.get("job_id"), story.get("restart_count")
    if not job_id:
        return []
    failure = milestones.get("failure", incident.opened_at)
    started = float(snapshot.get("start_time") or 0) or failure - 86400
    until = incident.closed_at if incident.closed_at is not None else failure + 3600
    records = store.evidence_by_kinds(
        CONTEXT_KINDS, job_id=job_id, since=max(0.0, started - 60), until=until + 60, limit=200
    )
    seen = {e["id"] for e in story.get("evidence", [])}
    candidates = [evidence_json(r) for r in records if r.id not in seen]
    # what someone else changed after the incident's steps (the loop left it as it was)
    undone = store.evidence_by_kinds(("slurm_change",), job_id=job_id, since=failure, limit=200)
    return context_events(candidates, restart, iso(incident.closed_at)) + [
        evidence_json(r) for r in undone if r.evidence.payload.get("incident") == incident.id
    ]


def context_events(
    candidates: Sequence[Mapping[str, Any]], restart: int | None, closed_at: str | None
) -> list[dict[str, Any]]:
    """Of a job's ``job_start``/``job_end`` evidence (oldest first), what belongs to the
    attempt ``restart``: its first start report, and its end reports up to the incident's
    close (Slurm's EpilogSlurmctld of a requeued attempt already shows the next restart count,
    so ``restart + 1`` counts as this attempt's end while the incident is open). Pure."""
    until = epoch(closed_at)
    out: list[dict[str, Any]] = []
    started = False
    for e in candidates:
        got = (e.get("payload") or {}).get("restart_count")
        if e["kind"] == "job_start":
            if started or (got is not None and got != restart):
                continue
            started = True
        elif e["kind"] == "job_end":
            if got is not None and restart is not None and got not in (restart, restart + 1):
                continue
            if until is not None and (epoch(e["observed_at"]) or 0.0) > until + 1.0:
                continue
        else:
            continue
        out.append(dict(e))
    return out


def link_audit(story: dict[str, Any]) -> None:
    """Put the seq of the audit row that records each advice, action, operator report and the
    closing on it (``audit_seq``; ``closed_audit_seq`` on the story). Pure."""
    rows = story.get("audit", [])
    used: set[int] = set()
    for advice in story.get("advice_history", []):
        advice["audit_seq"] = next(
            (
                r["seq"]
                for r in rows
                if r["kind"] == "advice" and r["payload"].get("advice") == advice["id"]
            ),
            None,
        )
    for action in story.get("actions", []):
        finished = epoch(action["finished_at"])
        for r in rows:
            p = r["payload"]
            if (
                r["seq"] not in used
                and r["kind"] == "action"
                and p.get("step") == action["step"]
                and p.get("result") == action["result"]
                and r["subject"] == action["target"]
                and finished is not None
                and abs((epoch(r["ts"]) or 0.0) - finished) < 0.002
            ):
                action["audit_seq"] = r["seq"]
                used.add(r["seq"])
                break
    for e in [*story.get("evidence", []), *story.get("context_evidence", [])]:
        e["audit_seq"] = next(
            (
                r["seq"]
                for r in rows
                if r["kind"] == "operator_report" and r["payload"].get("evidence") == e["id"]
            ),
            None,
        )
    story["closed_audit_seq"] = next(
        (r["seq"] for r in rows if r["kind"] == "incident_closed"), None
    )


def decisive_evidence(story: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The evidence the verdict rests on (its ``evidence_ids``), oldest first, each marked
    ``basis: verdict``; when the verdict cites none (a hang with no cause found, an unknown
    crash), the evidence that opened the incident, marked ``basis: trigger``. Pure."""
    advice = story.get("advice") or {}
    cited = set((advice.get("verdict") or {}).get("evidence_ids") or [])
    evidence = list(story.get("evidence", []))
    chosen = [e for e in evidence if e["id"] in cited]
    basis = "verdict"
    if not chosen:
        chosen, basis = evidence, "trigger"
    chosen = sorted(chosen, key=lambda e: (epoch(e["observed_at"]) or 0.0, e["id"]))
    return [{**e, "basis": basis} for e in chosen]


_FAILURE_WORDS = {
    "crash": "the job ended in failure",
    "doomed": "a fatal fault hit a node of the running job",
    "app_fault": "the application reported a fatal error",
    "hang": "the job's progress deadline passed",
    "straggler": "the job's throughput dropped and stayed down",
}


def _milestone_text(name: str, story: Mapping[str, Any]) -> str:
    advice = story.get("advice") or {}
    verdict = advice.get("verdict") or {}
    if name == "failure":
        return f"failure: {_FAILURE_WORDS.get(story.get('kind', ''), story.get('kind', ''))}"
    if name == "detected":
        return f"detected: incident {story.get('id')} opened ({story.get('kind')})"
    if name == "attributed":
        nodes = hostlist.compress(verdict.get("nodes") or []) or "no node"
        return (
            f"attributed: {verdict.get('fault_class', 'unknown')}, {nodes}, "
            f"confidence {verdict.get('confidence', 0)}"
        )
    if name == "advised":
        first = (story.get("advice_history") or [advice])[0] or {}
        return (
            f"advised: {first.get('action')} ({first.get('mode')} mode, rule {first.get('rule')})"
        )
    words = {
        "held": "requeued and held",
        "excluded": "exclusions set on the job",
        "released": "released",
        "running_again": "running again",
        "stopped": "stopped",
    }
    return words.get(name, name.replace("_", " "))


def build_timeline(story: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The incident's story in time order: its evidence (the advice's, and the attempt's start
    and end), milestones, later advice generations, actions with their results, and the
    closing. Each entry has ``at`` (ISO), ``offset`` (seconds after the failure; negative
    before it), ``type``, ``name``, ``text``, ``id`` and ``audit_seq``. Pure: reads only the
    story (``incident_story``'s JSON)."""
    milestones: Mapping[str, str] = story.get("milestones") or {}
    origin = epoch(milestones.get("failure")) or epoch(story.get("opened_at")) or 0.0
    entries: list[tuple[float, int, int, dict[str, Any]]] = []

    def add(at: str | None, rank: int, order: int, entry: dict[str, Any]) -> None:
        ts = epoch(at)
        if ts is None:
            return
        entry = {"at": at, "offset": round(ts - origin, 3), **entry}
        entries.append((ts, rank, order, entry))

    evidence = [*story.get("evidence", []), *story.get("context_evidence", [])]
    for e in evidence:
        add(
            e["observed_at"],
            0,
            0,
            {
                "type": "evidence",
                "name": e["kind"],
                "text": e.get("description") or describe_evidence(e),
                "id": e["id"],
                "audit_seq": e.get("audit_seq"),
            },
        )
    history = list(story.get("advice_history") or [])
    for name, at in milestones.items():
        order = MILESTONE_ORDER.index(name) if name in MILESTONE_ORDER else len(MILESTONE_ORDER)
        entry: dict[str, Any] = {
            "type": "milestone",
            "name": name,
            "text": _milestone_text(name, story),
            "id": None,
            "audit_seq": None,
        }
        if name == "advised" and history:
            entry["id"] = history[0]["id"]
            entry["audit_seq"] = history[0].get("audit_seq")
        add(at, 2, order, entry)
    for advice in history[1:]:
        add(
            advice["created_at"],
            3,
            0,
            {
                "type": "advice",
                "name": f"advice_{advice['generation']}",
                "text": (
                    f"advice generation {advice['generation']}: {advice['action']} "
                    f"({advice['mode']} mode, rule {advice['rule']}): {advice['reason']}"
                ),
                "id": advice["id"],
                "audit_seq": advice.get("audit_seq"),
            },
        )
    for action in story.get("actions", []):
        message = f" ({_one_line(action['message'])})" if action.get("message") else ""
        params = action.get("params") or {}
        nodes = f" {hostlist.compress(params['nodes'])}" if params.get("nodes") else ""
        add(
            action["finished_at"],
            1,
            0,
            {
                "type": "action",
                "name": action["step"],
                "text": (
                    f"{action['step']} {action['target']}{nodes}: {action['result']}{message}"
                ),
                "id": action["id"],
                "audit_seq": action.get("audit_seq"),
                "duration": action.get("duration"),
            },
        )
    if story.get("closed_at"):
        add(
            story["closed_at"],
            4,
            0,
            {
                "type": "closed",
                "name": "closed",
                "text": f"closed: {story.get('outcome')}",
                "id": None,
                "audit_seq": story.get("closed_audit_seq"),
            },
        )
    entries.sort(key=lambda item: item[:3])
    return [entry for *_, entry in entries]


# ------------------------------------------------------------------------------ a node

#: The lemon score (docs/cli.md, "Nodes"): implicated incidents and fatal findings in this
#: window count, each weighted by recency (halved every half-life).
LEMON_WINDOW = 30 * 86400.0
LEMON_HALF_LIFE = 7 * 86400.0
#: Weights: an incident counts its verdict's confidence (0..1); a fatal finding (a fatal GPU or
#: fabric finding, a fatal XID, an operator's report) and a drain by the tool count this much.
LEMON_FINDING_WEIGHT = 0.25
LEMON_DRAIN_WEIGHT = 0.25
#: A node at or above this score is a lemon (a repeat offender): two confident implications
#: this week, or four weak ones.
LEMON_THRESHOLD = 2.0


def recency(age: float, half_life: float = LEMON_HALF_LIFE) -> float:
    """1.0 now, 0.5 one half-life ago, 0.25 two ago ..."""
    return 0.5 ** (max(age, 0.0) / half_life)


def lemon_score(
    incidents: Iterable[tuple[float, float]],
    fatal_findings: Iterable[float],
    drains: Iterable[float],
    now: float,
    *,
    window: float = LEMON_WINDOW,
    half_life: float = LEMON_HALF_LIFE,
    finding_weight: float = LEMON_FINDING_WEIGHT,
    drain_weight: float = LEMON_DRAIN_WEIGHT,
    threshold: float = LEMON_THRESHOLD,
) -> dict[str, Any]:
    """A node's repeat-offender score with its inputs. ``incidents``: (when, confidence) of
    the incidents whose verdict implicated the node; ``fatal_findings`` and ``drains``: when.
    Only the last ``window`` seconds count, each input weighted by :func:`recency`:

        score = sum(confidence * r) + finding_weight * sum(r) + drain_weight * sum(r)

    Pure."""

    def recent(times: Iterable[float]) -> list[float]:
        return [recency(now - t, half_life) for t in times if now - t <= window]

    implicated = [(min(max(c, 0.0), 1.0), now - t) for t, c in incidents if now - t <= window]
    incident_points = sum(c * recency(age, half_life) for c, age in implicated)
    findings = recent(fatal_findings)
    drained = recent(drains)
    finding_points = finding_weight * sum(findings)
    drain_points = drain_weight * sum(drained)
    score = round(incident_points + finding_points + drain_points, 3)
    lemon = score >= threshold
    explanation = (
        f"{len(implicated)} implicated incident(s) {incident_points:.2f} + "
        f"{len(findings)} fatal finding(s) {finding_points:.2f} + "
        f"{len(drained)} drain(s) {drain_points:.2f} = {score:.2f} "
        f"{'>=' if lemon else '<'} {threshold:g}"
    )
    return {
        "score": score,
        "lemon": lemon,
        "threshold": threshold,
        "window_days": window / 86400,
        "half_life_days": half_life / 86400,
        "inputs": {
            "incidents": {"count": len(implicated), "points": round(incident_points, 3)},
            "fatal_findings": {"count": len(findings), "points": round(finding_points, 3)},
            "drains": {"count": len(drained), "points": round(drain_points, 3)},
        },
        "explanation": explanation,
    }


def open_findings(findings: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The GPU and fabric conditions still open (``evidence_json`` dicts, any order; all of a
    node's may be given): the fatal and warning findings that the node has not ended since, by
    the rule detection and attribution use (:func:`slurm_recovery.decide.cleared.cleared_ids`:
    a later finding of the same check, a ``cleared: true`` one, a ``gpu_reset`` of the GPU or
    the whole node). Oldest first. Pure."""
    items = sorted(findings, key=lambda e: (epoch(e["observed_at"]) or 0.0, e["id"]))
    ended = cleared_ids(
        CoreEvidence(
            id=e["id"],
            source=str(e.get("source", "")),
            kind=e["kind"],
            observed_at=epoch(e["observed_at"]) or 0.0,
            node=e.get("node"),
            gpu=e.get("gpu"),
            payload=e.get("payload") or {},
        )
        for e in items
    )
    out = []
    for e in items:
        p = e.get("payload") or {}
        if e["id"] in ended or p.get("severity") not in ("fatal", "warning"):
            continue
        out.append(
            {
                "evidence_id": e["id"],
                "kind": e["kind"],
                "check": p.get("check", e["kind"]),
                "severity": p.get("severity"),
                "gpu": e.get("gpu"),
                "port": p.get("port"),
                "since": e["observed_at"],
                "detail": p.get("detail", ""),
            }
        )
    return out


def tool_drain_incident(reason: str) -> int | None:
    """The incident named in the tool's drain reason ``srecovery:<incident>:<cause>``."""
    parts = reason.split(":", 2)
    if len(parts) >= 2 and parts[0] == "srecovery" and parts[1].isdigit():
        return int(parts[1])
    return None


def node_item(
    name: str,
    *,
    slurm: Any,
    state: NodeState | None,
    findings: Sequence[Mapping[str, Any]],
    drains: Sequence[Mapping[str, Any]],
    excluded_by: Sequence[int],
    implicated: Sequence[tuple[int, float, float]],
    fatal_times: Sequence[float],
    now: float,
    report: NodeReport | None = None,
) -> dict[str, Any]:
    """One node as ``/v1/nodes`` shows it: Slurm's view (``slurm``: a scheduler ``Node`` or
    None), the tool's record, its sidecar's last report, open findings, drains by the tool
    (``{at, incident, reason, action_id}``, oldest first), jobs excluding it, the incidents
    that implicated it in the lemon window (``(incident id, when, confidence)``) and its lemon
    score. Pure."""
    base = (
        node_json(state)
        if state is not None
        else {
            "name": name,
            "drained_by_tool": False,
            "drain_reason": "",
            "drained_at": None,
            "implicated_count": 0,
            "last_implicated_at": None,
            "updated_at": None,
        }
    )
    shown = None
    if slurm is not None:
        shown = {
            "state": slurm.state,
            "flags": sorted(slurm.flags),
            "reason": slurm.reason,
            "drained": slurm.drained,
            "partitions": list(slurm.partitions),
        }
    drain = None
    if shown is not None and shown["drained"] and shown["reason"].startswith("srecovery:"):
        incident = tool_drain_incident(shown["reason"])
        at = next((d["at"] for d in reversed(drains) if d.get("incident") == incident), None)
        drain = {
            "in_force": True,
            "at": at or base["drained_at"],
            "reason": shown["reason"],
            "incident": incident,
        }
    elif shown is None and base["drained_by_tool"]:
        drain = {
            "in_force": None,  # Slurm not seen yet: what the store says
            "at": base["drained_at"],
            "reason": base["drain_reason"],
            "incident": tool_drain_incident(base["drain_reason"]),
        }
    recent_ids = sorted({i for i, at, _ in implicated if now - at <= LEMON_WINDOW})
    lemon = node_lemon(implicated, fatal_times, drains, now)
    return {
        **base,
        "slurm": shown,
        "sidecar": sidecar_json(report, now) if report is not None else None,
        "drain": drain,
        "drains": list(drains),
        "excluded_by": sorted(excluded_by),
        "findings": list(findings),
        "incidents": {
            "count": base["implicated_count"],
            "last": base["last_implicated_at"],
            "recent": len(recent_ids),
            "recent_ids": recent_ids,
        },
        "lemon": lemon,
    }


def sidecar_json(report: NodeReport, now: float) -> dict[str, Any]:
    """A node's sidecar as last heard: when, since when its condition is unchanged (and over
    how many reports), its version, and each source that is not ok. Pure."""
    sources = report.condition.get("sources") or {}
    # the payload as a sidecar sent it: a newer (or broken) one may shape it otherwise
    texts = report.payload.get("sources")
    delivery = report.payload.get("delivery")
    return {
        "last_report": iso(report.heard_at),
        "silent_for": round(max(0.0, now - report.heard_at), 1),
        "last_change": iso(report.changed_at),
        "reports_since_change": report.reports,
        # the readings' time (the sidecar's clock): a heartbeat between full statuses says
        # "unchanged" without them (sidecar.full_status_interval)
        "readings_at": iso(report.observed_at),
        "version": report.payload.get("version"),
        "problems": {
            name: texts.get(name, text) if isinstance(texts, Mapping) else text
            for name, text in sorted(sources.items())
            if text != "ok"
        },
        "dropped": report.payload.get("dropped", 0),
        "delivery_error": delivery.get("last_error", "") if isinstance(delivery, Mapping) else "",
    }


def node_lemon(
    implicated: Sequence[tuple[int, float, float]],
    fatal_times: Sequence[float],
    drains: Sequence[Mapping[str, Any]],
    now: float,
) -> dict[str, Any]:
    """:func:`lemon_score` of one node from what :func:`node_item` is given. Pure."""
    return lemon_score(
        [(at, confidence) for _, at, confidence in implicated],
        fatal_times,
        [epoch(d["at"]) or 0.0 for d in drains],
        now,
    )


def excluded_by_tool(view: ClusterView) -> set[str]:
    """Nodes excluded from active jobs that the tool requeued (its mark or note is on them)."""
    nodes: set[str] = set()
    for job in view.jobs.values():
        if job.active and requeued_by_tool(job.admin_comment):
            nodes |= job.excluded_nodes
    return nodes


def waiting_without_room(view: ClusterView) -> list[dict[str, Any]]:
    """The jobs the tool requeued that cannot start: pending, not held, with too few usable
    nodes left in their partition (:mod:`~slurm_recovery.decide.placement`). Read from the
    listing on every pass, so a job is shown whatever took its room (the tool's exclusion, a
    drain since) and drops out when an operator makes room."""
    found = []
    for job in sorted(view.jobs.values(), key=lambda j: j.job_id):
        if job.state != "PENDING" or job.held_by_someone or not requeued_by_tool(job.admin_comment):
            continue
        if short := shortfall(job, view.nodes, job.excluded_nodes):
            found.append(
                {
                    "job_id": job.job_id,
                    "incident": requeue_incident(job.admin_comment),
                    "reason": f"needs operator: {short.words()}",
                }
            )
    return found
