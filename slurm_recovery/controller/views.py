"""What the read endpoints return: incidents told as stories, in JSON with ISO-8601 times."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from slurm_recovery.controller.loop import milestone_latencies
from slurm_recovery.store import Advice, AuditRow, EvidenceRecord, Incident, NodeState, Store


def iso(ts: float | None) -> str | None:
    """Epoch seconds -> ``2026-11-29T13:47:56.123+00:00`` (None stays None)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def advice_json(advice: Advice) -> dict[str, Any]:
    details = advice.verdict
    return {
        "id": advice.id,
        "generation": advice.generation,
        "created_at": iso(advice.created_at),
        "action": advice.decision,
        "mode": details.get("mode"),
        "reason": advice.reason,
        "rule": details.get("rule"),
        "exclude": details.get("exclude", []),
        "drain": details.get("drain", []),
        "needs_operator": details.get("needs_operator", False),
        "verdict": details.get("verdict", {}),
        "evidence_ids": list(advice.evidence_ids),
    }


def evidence_json(record: EvidenceRecord) -> dict[str, Any]:
    e = record.evidence
    return {
        "id": record.id,
        "source": e.source,
        "kind": e.kind,
        "node": e.node,
        "gpu": e.gpu,
        "job_id": e.job_id,
        "observed_at": iso(e.observed_at),
        "received_at": iso(record.received_at),
        "payload": dict(e.payload),
    }


def incident_summary(store: Store, incident: Incident) -> dict[str, Any]:
    attempt = store.get_attempt(incident.attempt_id)
    advice = store.latest_advice(incident.id)
    milestones = store.milestones(incident.id)
    return {
        "id": incident.id,
        "kind": incident.kind,
        "cluster": attempt.attempt.cluster if attempt else None,
        "job_id": attempt.attempt.job_id if attempt else None,
        "restart_count": attempt.attempt.restart_count if attempt else None,
        "opened_at": iso(incident.opened_at),
        "closed_at": iso(incident.closed_at),
        "outcome": incident.outcome,
        "summary": incident.summary,
        "advice": advice_json(advice) if advice else None,
        "latencies": milestone_latencies(milestones),
    }


def incident_story(store: Store, incident: Incident) -> dict[str, Any]:
    """Everything about one incident: evidence, every advice generation, milestones, actions."""
    story = incident_summary(store, incident)
    history = store.advice_history(incident.id)
    ids = sorted({i for a in history for i in a.evidence_ids})
    story["advice_history"] = [advice_json(a) for a in history]
    story["evidence"] = [evidence_json(r) for r in store.evidence_by_id(ids)]
    story["milestones"] = {
        k: iso(v) for k, v in sorted(store.milestones(incident.id).items(), key=lambda kv: kv[1])
    }
    story["actions"] = [
        {
            "id": a.id,
            "step": a.step,
            "target": a.target,
            "result": a.result,
            "started_at": iso(a.started_at),
            "finished_at": iso(a.finished_at),
            "message": a.message,
            "params": dict(a.params or {}),
        }
        for a in store.actions(incident_id=incident.id)
    ]
    return story


def audit_json(row: AuditRow) -> dict[str, Any]:
    return {
        "seq": row.seq,
        "ts": iso(row.ts),
        "actor": row.actor,
        "kind": row.kind,
        "subject": row.subject,
        "payload": dict(row.payload),
        "hash": row.hash,
    }


def node_json(state: NodeState) -> dict[str, Any]:
    return {
        "name": state.name,
        "drained_by_tool": state.drained_by_tool,
        "drain_reason": state.drain_reason,
        "drained_at": iso(state.drained_at),
        "implicated_count": state.implicated_count,
        "last_implicated_at": iso(state.last_implicated_at),
        "updated_at": iso(state.updated_at),
    }
