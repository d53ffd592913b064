"""Routes for ``srecovery audit``, ``compare`` and ``replay``: read-only pages of the store.

Every route is a GET for any authenticated user (``authorize_read``), served from the store in
bounded pages (the client pages on), so a large store never holds the ingest thread for long.
Nothing here writes, and nothing here calls Slurm: ``compare`` and ``replay`` compute on the
client (docs/cli.md says why).

``GET /v1/audit/rows?after=SEQ&limit=N&since=EPOCH`` or ``?last=N``
    ``{"rows": [ROW, ...], "head": {"seq", "hash"} | null, "more": bool}``; ROW is
    ``{"seq", "ts" (ISO), "ts_epoch", "actor", "action", "target", "details" (object, null if
    the stored text is not JSON), "details_json" (the exact hashed text), "hash", "prev_hash"}``.
``GET /v1/history/incidents?since=EPOCH&until=EPOCH&before=ID&limit=N&evidence=1``
    incidents opened in the window, newest first, each with its advice in force (and the job
    snapshot kept with it), the restarts the tool had made by then and, with ``evidence=1``,
    the evidence the controller could have seen when it advised: ``{"incidents": [...],
    "more": bool}``.
``GET /v1/history/slurm?since=EPOCH&until=EPOCH``
    what the controller saw change in Slurm (``slurm_change`` evidence), the tool's own Slurm
    steps, the nodes as its last pass saw them, and since when it has been watching.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from slurm_recovery.controller import views
from slurm_recovery.controller.observe import KIND as SLURM_CHANGE
from slurm_recovery.decide.attribute import XID_REPEAT_WINDOW
from slurm_recovery.decide.model import ClusterView
from slurm_recovery.store import Advice, AuditRow, EvidenceRecord, Incident, Store

if TYPE_CHECKING:
    from slurm_recovery.controller.service import Controller

#: Most audit rows in one page.
MAX_AUDIT_PAGE = 5000
#: Most incidents in one page of /v1/history/incidents (with evidence: fewer by default).
MAX_INCIDENT_PAGE = 1000
#: Most evidence rows sent for one incident.
MAX_EVIDENCE_PER_INCIDENT = 5000
#: Most Slurm changes or tool steps in one answer of /v1/history/slurm.
MAX_CHANGES = 20_000
#: How far back the controller reads evidence when it decides (loop.EVIDENCE_HORIZON).
EVIDENCE_HORIZON = 3600.0
#: Evidence kinds attribution never reads, left out of replay inputs (they are the bulk).
REPLAY_SKIP_KINDS = ("progress", "gpu_activity", "gpu_inventory", "flight_recorder", SLURM_CHANGE)
#: The tool's own Slurm steps, as /v1/history/slurm reports them.
TOOL_STEPS = ("drain", "requeue_hold", "cancel", "exclude", "unexclude", "release")


def iso(ts: float | None) -> str | None:
    """Epoch seconds -> ISO 8601 with microseconds: times replay reads back exactly."""
    return views.iso(ts, "microseconds")


def audit_row_json(row: AuditRow) -> dict[str, Any]:
    try:
        details: Any = row.payload
    except ValueError:
        details = None
    return {
        "seq": row.seq,
        "ts": iso(row.ts) if isinstance(row.ts, int | float) else str(row.ts),
        "ts_epoch": row.ts,
        "actor": row.actor,
        "action": row.kind,
        "target": row.subject,
        "details": details,
        "details_json": row.payload_json,
        "hash": row.hash,
        "prev_hash": row.prev_hash,
    }


def evidence_json(record: EvidenceRecord) -> dict[str, Any]:
    return views.evidence_json(record, "microseconds")


def advice_json(advice: Advice) -> dict[str, Any]:
    return views.advice_json(advice, "microseconds")


def incident_inputs(store: Store, incident: Incident, with_evidence: bool) -> dict[str, Any]:
    """One incident as ``compare`` and ``replay`` need it."""
    attempt = store.get_attempt(incident.attempt_id)
    advice = store.latest_advice(incident.id)
    milestones = store.milestones(incident.id)
    detected = milestones.get("detected", incident.opened_at)
    decided = advice.created_at if advice else detected
    out: dict[str, Any] = {
        "id": incident.id,
        "kind": incident.kind,
        "summary": incident.summary,
        "opened_at": iso(incident.opened_at),
        "closed_at": iso(incident.closed_at),
        "outcome": incident.outcome,
        "failed_at": iso(milestones.get("failure")),
        "detected_at": iso(detected),
        "cluster": attempt.attempt.cluster if attempt else None,
        "job_id": attempt.attempt.job_id if attempt else None,
        "restart_count": attempt.attempt.restart_count if attempt else None,
        "submit_time": attempt.attempt.submit_time if attempt else None,
        "history_id": attempt.history_id if attempt else None,
        "restarts_before": store.restarts_before(attempt.history_id, decided) if attempt else 0,
        "advice": advice_json(advice) if advice else None,
    }
    if with_evidence and attempt is not None:
        job = (advice.verdict.get("job") if advice else None) or {}
        nodes = {n for n in job.get("nodes", []) if isinstance(n, str) and n}
        if advice:
            nodes |= set(advice.verdict.get("verdict", {}).get("nodes", []))
        records = store.evidence_about_job(
            attempt.attempt.job_id,
            nodes,
            since=max(0.0, detected - EVIDENCE_HORIZON),
            until=detected + EVIDENCE_HORIZON,
            received_by=detected,
            skip_kinds=REPLAY_SKIP_KINDS,
            limit=MAX_EVIDENCE_PER_INCIDENT + 1,
        )
        # the day of XIDs before it, as the controller weighed them (repeats on one GPU)
        seen = {r.id for r in records}
        for node in sorted(nodes):
            records += [
                r
                for r in store.evidence_by_kinds(
                    ("xid",),
                    node=node,
                    since=max(0.0, detected - XID_REPEAT_WINDOW),
                    until=max(0.0, detected - EVIDENCE_HORIZON),
                )
                if r.id not in seen and r.received_at <= detected
            ]
        out["evidence"] = [evidence_json(r) for r in records[:MAX_EVIDENCE_PER_INCIDENT]]
        out["evidence_truncated"] = len(records) > MAX_EVIDENCE_PER_INCIDENT
    return out


def audit_page_json(
    store: Store, *, last: int = 0, after: int = 0, limit: int = 1000, since: float | None = None
) -> dict[str, Any]:
    """``GET /v1/audit/rows``: the last ``last`` rows, or a page after ``after``."""
    if last:
        rows, more = store.audit_last(last), False
    else:
        rows = store.audit_page(after_seq=after, limit=limit, since=since)
        more = len(rows) == limit
    head = store.audit_head()
    return {
        "rows": [audit_row_json(r) for r in rows],
        "head": {"seq": head.seq, "hash": head.hash} if head else None,
        "more": more,
    }


def incidents_json(
    store: Store,
    *,
    since: float | None = None,
    until: float | None = None,
    before: int = 0,
    limit: int = 500,
    with_evidence: bool = False,
) -> dict[str, Any]:
    """``GET /v1/history/incidents``: one page, newest first."""
    found = store.incidents_opened(since=since, until=until, before_id=before or None, limit=limit)
    return {
        "incidents": [incident_inputs(store, i, with_evidence) for i in found],
        "more": len(found) == limit,
    }


def nodes_json(view: ClusterView | None) -> list[dict[str, Any]] | None:
    """Slurm's nodes as the loop's last pass saw them (None before the first pass)."""
    if view is None:
        return None
    return [
        {
            "name": n.name,
            "state": n.state,
            "flags": sorted(n.flags),
            "reason": n.reason,
            "partitions": list(n.partitions),
        }
        for n in view.nodes.values()
    ]


def slurm_history_json(
    store: Store,
    view: ClusterView | None,
    *,
    since: float | None = None,
    until: float | None = None,
    observing_since: float | None = None,
    health_check_drain_prefixes: Sequence[str] = (),
) -> dict[str, Any]:
    """``GET /v1/history/slurm``: observed changes, the tool's own steps, the nodes, and the
    prefixes that mark a health check's drain here (``srecovery compare`` sorts drains by
    them)."""
    changes = store.evidence_of_kind(SLURM_CHANGE, since=since, until=until, limit=MAX_CHANGES + 1)
    steps = store.actions_between(steps=TOOL_STEPS, since=since, until=until, limit=MAX_CHANGES + 1)
    incident_of: dict[int, int] = {}
    for step in steps:
        if step.advice_id is not None and step.advice_id not in incident_of:
            advice = store.get_advice(step.advice_id)
            incident_of[step.advice_id] = advice.incident_id if advice else 0
    return {
        "observing_since": iso(observing_since),
        "now": iso(time.time()),
        "changes": [evidence_json(r) for r in changes[:MAX_CHANGES]],
        "tool_actions": [
            {
                "step": a.step,
                "target": a.target,
                "at": iso(a.finished_at),
                "incident": incident_of.get(a.advice_id or 0) or None,
                "params": dict(a.params or {}),
            }
            for a in steps[:MAX_CHANGES]
        ],
        "truncated": len(changes) > MAX_CHANGES or len(steps) > MAX_CHANGES,
        "nodes": nodes_json(view),
        "nodes_seen_at": iso(view.now) if view else None,
        "health_check_drain_prefixes": list(health_check_drain_prefixes),
    }


def _query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {text!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be from {low} to {high}, got {value}")
    return value


def _query_time(request: web.Request, name: str) -> float | None:
    text = request.query.get(name)
    if text is None or text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} must be seconds since the epoch, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be seconds since the epoch, got {text!r}")
    return value


def _bad(err: ValueError) -> web.Response:
    return web.json_response({"error": str(err)}, status=400)


def routes(controller: Controller) -> list[web.RouteDef]:
    """The routes this module serves, bound to ``controller``."""

    async def read(request: web.Request, fn: Callable[[Store], Any]) -> web.Response:
        return await controller._read(request, fn)

    async def audit_rows(request: web.Request) -> web.Response:
        try:
            last = _query_int(request, "last", 0, 0, MAX_AUDIT_PAGE)
            after = _query_int(request, "after", 0, 0, 2**62)
            limit = _query_int(request, "limit", 1000, 1, MAX_AUDIT_PAGE)
            since = _query_time(request, "since")
        except ValueError as err:
            return _bad(err)

        def fn(store: Store) -> Any:
            return audit_page_json(store, last=last, after=after, limit=limit, since=since)

        return await read(request, fn)

    async def history_incidents(request: web.Request) -> web.Response:
        try:
            since = _query_time(request, "since")
            until = _query_time(request, "until")
            before = _query_int(request, "before", 0, 0, 2**62)
            with_evidence = request.query.get("evidence") == "1"
            default = 50 if with_evidence else 500
            limit = _query_int(request, "limit", default, 1, MAX_INCIDENT_PAGE)
        except ValueError as err:
            return _bad(err)

        def fn(store: Store) -> Any:
            return incidents_json(
                store,
                since=since,
                until=until,
                before=before,
                limit=limit,
                with_evidence=with_evidence,
            )

        return await read(request, fn)

    async def history_slurm(request: web.Request) -> web.Response:
        try:
            since = _query_time(request, "since")
            until = _query_time(request, "until")
        except ValueError as err:
            return _bad(err)
        reconciler = controller.reconciler
        view = reconciler.last_view if reconciler else None

        def fn(store: Store) -> Any:
            return slurm_history_json(
                store,
                view,
                since=since,
                until=until,
                observing_since=controller.started_at,
                health_check_drain_prefixes=controller.config.controller.health_check_drain_prefixes,
            )

        return await read(request, fn)

    return [
        web.get("/v1/audit/rows", audit_rows),
        web.get("/v1/history/incidents", history_incidents),
        web.get("/v1/history/slurm", history_slurm),
    ]
