"""The controller's read endpoints for ``srecovery incidents|advice list|explain|nodes`` (and
anything else that reads): incidents filtered in the store, incidents told as stories, nodes
joined with what Slurm shows.

- ``GET /v1/incidents?since=&until=&job=&node=&class=&state=&kind=&limit=``: incidents,
  newest first, filtered in the store;
- ``GET /v1/incidents/ID``: one incident's story (decisive evidence, timeline, audit rows);
- ``GET /v1/jobs/JOBID``: the stories of every incident of a job, oldest first;
- ``GET /v1/nodes``: every node: Slurm's state, the tool's drains and exclusions, open
  findings, the lemon score;
- ``GET /v1/nodes/NAME``: one node, with its recent evidence and incidents.

Bad parameters are refused with 400 and a message naming the parameter and what it accepts;
an unknown incident, job or node with 404 and a message saying which.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from slurm_recovery.contract import hostlist, requests
from slurm_recovery.controller import views
from slurm_recovery.controller.loop import core_evidence
from slurm_recovery.decide.detect import is_fatal_node_event
from slurm_recovery.decide.model import ClusterView, FaultClass, IncidentKind
from slurm_recovery.holdmark import requeued_by_tool
from slurm_recovery.store import NodeReport, Store, StoreError

if TYPE_CHECKING:
    from slurm_recovery.controller.service import Controller

log = logging.getLogger("srecovery.controller")

#: Values the incident filters accept.
CLASSES = tuple(str(c) for c in FaultClass)
KINDS = tuple(str(k) for k in IncidentKind)
STATES = ("open", "closed")
#: ``GET /v1/incidents`` parameters (``open=1`` is the older spelling of ``state=open``).
INCIDENT_PARAMS = ("since", "until", "job", "node", "class", "state", "kind", "limit", "open")
DEFAULT_LIMIT, MAX_LIMIT = 100, 10_000
#: Evidence about a node worth listing in its detailed view (not progress or inventories).
NODE_EVIDENCE_KINDS = (
    "xid",
    "operator_report",
    "gpu_finding",
    "ib_finding",
    "node_state",
    "log_signature",
    "slurm_change",
    "sidecar_silent",
)
#: Evidence kinds that may be a fatal finding (the lemon score's second input).
FATAL_KINDS = ("xid", "operator_report", "gpu_finding", "ib_finding")
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$")


class BadRequest(ValueError):
    """A parameter the endpoint cannot take: 400 with this message."""


class NotFound(LookupError):
    """Nothing by that id or name: 404 with this message."""


# ------------------------------------------------------------------ parameters (pure)


def parse_time(name: str, text: str) -> float:
    """Epoch seconds (``1795960000.25``) or an ISO 8601 time (UTC unless it says otherwise)."""
    try:
        value = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise BadRequest(
                f"{name}={text!r}: not a time; give epoch seconds (1795960000) or ISO 8601 "
                "(2026-11-29T03:00:00Z)"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        value = moment.timestamp()
    if not value >= 0 or value == float("inf"):
        raise BadRequest(f"{name}={text!r}: must be a time after 1970")
    return value


def parse_int(name: str, text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"{name}={text!r}: not a whole number") from None
    if not low <= value <= high:
        raise BadRequest(f"{name}={value}: must be between {low} and {high}")
    return value


def parse_node(text: str, name: str = "node") -> str:
    if not _NODE_NAME.match(text):
        raise BadRequest(f"{name}={text!r}: not a node name (one name, as sinfo shows it)")
    return text


def parse_incident_query(query: Mapping[str, str]) -> dict[str, Any]:
    """``GET /v1/incidents`` parameters -> :meth:`Store.find_incidents` arguments (with
    ``limit``); BadRequest naming the parameter and what it accepts."""
    unknown = sorted(set(query) - set(INCIDENT_PARAMS))
    if unknown:
        raise BadRequest(
            f"unknown parameter {', '.join(unknown)}; this endpoint takes "
            f"{', '.join(INCIDENT_PARAMS)}"
        )
    out: dict[str, Any] = {"limit": DEFAULT_LIMIT}
    if "since" in query:
        out["since"] = parse_time("since", query["since"])
    if "until" in query:
        out["until"] = parse_time("until", query["until"])
    if "job" in query:
        out["job_id"] = parse_int("job", query["job"], 1, 2**63 - 1)
    if "node" in query:
        out["node"] = parse_node(query["node"])
    if "class" in query:
        if query["class"] not in CLASSES:
            raise BadRequest(f"class={query['class']!r}: must be one of {', '.join(CLASSES)}")
        out["fault_class"] = query["class"]
    if "open" in query:
        if query["open"] not in ("0", "1"):
            raise BadRequest(f"open={query['open']!r}: must be 1 (only open incidents) or 0")
        if query["open"] == "1":
            out["state"] = "open"
    if "state" in query:
        if query["state"] not in STATES:
            raise BadRequest(f"state={query['state']!r}: must be open or closed")
        if out.get("state", query["state"]) != query["state"]:
            raise BadRequest("open=1 and state=closed contradict each other")
        out["state"] = query["state"]
    if "kind" in query:
        kinds = [k for k in query["kind"].split(",") if k]
        bad = [k for k in kinds if k not in KINDS]
        if bad or not kinds:
            raise BadRequest(
                f"kind={query['kind']!r}: must be one or more (comma-separated) of "
                f"{', '.join(KINDS)}"
            )
        out["kinds"] = kinds
    if "limit" in query:
        out["limit"] = parse_int("limit", query["limit"], 1, MAX_LIMIT)
    if "since" in out and "until" in out and out["until"] < out["since"]:
        raise BadRequest("until is before since")
    return out


def _no_params(query: Mapping[str, str]) -> None:
    if query:
        raise BadRequest(f"unknown parameter {', '.join(sorted(query))}; this endpoint takes none")


# ------------------------------------------------------------------------ the queries


def list_incidents(store: Store, params: Mapping[str, Any]) -> dict[str, Any]:
    """The incidents matching ``params`` (:func:`parse_incident_query`), newest first. Only
    the ones returned are read in full; one more is asked for to say whether there are more."""
    args = dict(params)
    limit = args.pop("limit")
    found = store.find_incidents(**args, limit=limit + 1)
    filters = {k: v for k, v in params.items() if k != "limit"}
    for key in ("since", "until"):
        if key in filters:
            filters[key] = views.iso(filters[key])
    return {
        "incidents": [views.incident_summary(store, i) for i in found[:limit]],
        "count": min(len(found), limit),
        "limit": limit,
        "more": len(found) > limit,
        "filters": filters,
    }


def job_stories(store: Store, job_id: int) -> dict[str, Any]:
    """The incidents of the newest job that had ``job_id``, oldest first. Slurm reuses job ids
    (a new cluster, a reset of its state), and the store keeps each submission and its requeues
    apart (its job history): the earlier jobs with this id are only listed, under
    ``earlier_jobs``, with their incident ids, never told as this job's story."""
    incidents = store.find_incidents(job_id=job_id, limit=MAX_LIMIT, oldest_first=True)
    if not incidents:
        raise NotFound(
            f"no incidents for job {job_id}: the controller has recorded none for it (is the "
            "job id right? `srecovery incidents --since 1d` lists recent ones)"
        )
    by_history: dict[int, list[Any]] = {}
    first_seen: dict[int, float] = {}
    for incident in incidents:
        attempt = store.get_attempt(incident.attempt_id)
        history = attempt.history_id if attempt is not None else -1
        by_history.setdefault(history, []).append(incident)
        if attempt is not None:
            seen = first_seen.get(history, attempt.first_seen_at)
            first_seen[history] = min(seen, attempt.first_seen_at)
    newest = max(by_history)
    earlier = [
        {
            "first_seen": views.iso(first_seen[h]) if h in first_seen else None,
            "incidents": [i.id for i in by_history[h]],
        }
        for h in sorted(by_history)
        if h != newest
    ]
    return {
        "job_id": job_id,
        "incidents": [views.incident_story(store, i) for i in by_history[newest]],
        "earlier_jobs": earlier,
    }


def incident_story(store: Store, incident_id: int) -> dict[str, Any]:
    incident = store.get_incident(incident_id)
    if incident is None:
        raise NotFound(f"no incident {incident_id}")
    return views.incident_story(store, incident)


def excluding_jobs(view: ClusterView | None) -> dict[str, list[int]]:
    """node -> active jobs that exclude it because the tool requeued them (its hold mark or
    its ``srecovery: requeued`` note is on the job)."""
    out: dict[str, list[int]] = {}
    if view is None:
        return out
    for job in view.jobs.values():
        if job.active and requeued_by_tool(job.admin_comment):
            for node in job.excluded_nodes:
                out.setdefault(node, []).append(job.job_id)
    return out


def nodes_view(
    store: Store,
    view: ClusterView | None,
    catalogue: Any,
    now: float,
    only: str | None = None,
    reports: Mapping[str, NodeReport] | None = None,
) -> list[dict[str, Any]]:
    """Every node Slurm shows or the tool has a record of (or only ``only``), in name order,
    as :func:`views.node_item` puts it together. A handful of queries for all nodes at once.
    ``reports``: the sidecars' reports as the controller holds them (controller.reports),
    fresher than the store's, which is written every ``reports.FLUSH_INTERVAL``."""
    if only is not None:
        state = store.get_node(only)
        states = {only: state} if state is not None else {}
    else:
        states = {s.name: s for s in store.list_nodes()}
    shown = dict(view.nodes) if view is not None else {}
    names = set(states) | set(shown)
    if only is not None:
        names &= {only}
    if not names:
        return []
    implicated, drains, fatal = lemon_inputs(store, catalogue, now, only)
    findings: dict[str, list[dict[str, Any]]] = {}
    for record in store.latest_findings(node=only):
        findings.setdefault(record.evidence.node or "", []).append(views.evidence_json(record))
    excluded = excluding_jobs(view)
    if reports is None:
        reports = store.node_reports(node=only)
    ordered = hostlist.expand(hostlist.compress(names)) if names else []
    return [
        views.node_item(
            name,
            slurm=shown.get(name),
            state=states.get(name),
            findings=views.open_findings(findings.get(name, [])),
            drains=drains.get(name, []),
            excluded_by=excluded.get(name, []),
            implicated=implicated.get(name, []),
            fatal_times=fatal.get(name, []),
            now=now,
            report=reports.get(name),
        )
        for name in ordered
    ]


LemonInputs = tuple[
    dict[str, list[tuple[int, float, float]]],  # node -> (incident, when, confidence)
    dict[str, list[dict[str, Any]]],  # node -> drains by the tool (views.node_item's shape)
    dict[str, list[float]],  # node -> times of fatal findings
]


def lemon_inputs(store: Store, catalogue: Any, now: float, only: str | None = None) -> LemonInputs:
    """What the lemon score of every node (or only ``only``) is made of, read from the store:
    the incidents that implicated it in the lemon window, the tool's drains of it, and its
    fatal findings in the window."""
    since = now - views.LEMON_WINDOW
    implicated: dict[str, list[tuple[int, float, float]]] = {}
    for node, incident, at, confidence in store.implicated_since(since):
        if only is None or node == only:
            implicated.setdefault(node, []).append((incident, at, confidence))
    drains: dict[str, list[dict[str, Any]]] = {}
    for action, incident, reason in store.node_drains(node=only):
        drains.setdefault(action.target, []).append(
            {
                "at": views.iso(action.finished_at),
                "incident": incident,
                "reason": reason,
                "action_id": action.id,
            }
        )
    fatal: dict[str, list[float]] = {}
    for record in store.evidence_by_kinds(
        FATAL_KINDS, node=only, any_node=True, since=since, limit=1_000_000
    ):
        if is_fatal_node_event(core_evidence(record), catalogue):
            fatal.setdefault(record.evidence.node or "", []).append(record.evidence.observed_at)
    return implicated, drains, fatal


def lemon_scores(store: Store, catalogue: Any, now: float) -> dict[str, float]:
    """node -> lemon score, for the nodes whose score is above 0 (``/metrics``)."""
    implicated, drains, fatal = lemon_inputs(store, catalogue, now)
    scores = {}
    for node in sorted(set(implicated) | set(drains) | set(fatal)):
        score = views.node_lemon(
            implicated.get(node, []), fatal.get(node, []), drains.get(node, []), now
        )["score"]
        if score > 0:
            scores[node] = float(score)
    return scores


def node_detail(
    store: Store,
    view: ClusterView | None,
    catalogue: Any,
    now: float,
    name: str,
    reports: Mapping[str, NodeReport] | None = None,
) -> dict[str, Any]:
    found = nodes_view(store, view, catalogue, now, only=name, reports=reports)
    if not found:
        raise NotFound(
            f"no node {name}: Slurm does not show it and the tool has no record of it "
            "(`sinfo -N` lists the nodes)"
        )
    item = found[0]
    recent = store.evidence_by_kinds(NODE_EVIDENCE_KINDS, node=name, limit=20, newest_first=True)
    item["recent_evidence"] = [views.evidence_json(r) for r in recent]
    item["recent_incidents"] = [
        views.incident_summary(store, i) for i in store.find_incidents(node=name, limit=10)
    ]
    item["slurm_seen_at"] = views.iso(view.now) if view is not None else None
    return item


# ------------------------------------------------------------------------- the routes


async def _serve(
    controller: Controller, request: web.Request, fn: Callable[[Store], Any]
) -> web.Response:
    """Authenticate, authorize (any principal may read), run ``fn`` with the store on the
    ingest worker; BadRequest -> 400, NotFound -> 404, a store failure -> 503."""
    try:
        result = await controller.ingest.run(controller._authorized_read, request, fn)
    except requests.AuthError as err:
        return controller._refuse(err)
    except BadRequest as err:
        return web.json_response({"error": str(err)}, status=400)
    except NotFound as err:
        return web.json_response({"error": str(err)}, status=404)
    except StoreError as err:
        log.error("read failed: %s", err)
        return web.json_response(
            {"error": f"the store cannot be read now: {err}"},
            status=503,
            headers={"Retry-After": "5"},
        )
    return web.json_response(result)


def routes(controller: Controller) -> list[web.RouteDef]:
    """The routes this module serves, bound to ``controller``."""

    def view() -> ClusterView | None:
        return controller.reconciler.last_view if controller.reconciler else None

    async def get_incidents(request: web.Request) -> web.Response:
        def read(store: Store) -> Any:
            return list_incidents(store, parse_incident_query(request.query))

        return await _serve(controller, request, read)

    async def get_incident(request: web.Request) -> web.Response:
        def read(store: Store) -> Any:
            _no_params(request.query)
            ident = parse_int("incident id", request.match_info["id"], 1, 2**63 - 1)
            return incident_story(store, ident)

        return await _serve(controller, request, read)

    async def get_job(request: web.Request) -> web.Response:
        def read(store: Store) -> Any:
            _no_params(request.query)
            job_id = parse_int("job id", request.match_info["job_id"], 1, 2**63 - 1)
            return job_stories(store, job_id)

        return await _serve(controller, request, read)

    async def get_nodes(request: web.Request) -> web.Response:
        def read(store: Store) -> Any:
            _no_params(request.query)
            shown = view()
            return {
                "nodes": nodes_view(
                    store,
                    shown,
                    controller.catalogue,
                    time.time(),
                    reports=controller.reports.reports(),
                ),
                "slurm_seen_at": views.iso(shown.now) if shown is not None else None,
                "lemon": lemon_parameters(),
            }

        return await _serve(controller, request, read)

    async def get_node(request: web.Request) -> web.Response:
        def read(store: Store) -> Any:
            _no_params(request.query)
            name = parse_node(request.match_info["name"], "node")
            return node_detail(
                store,
                view(),
                controller.catalogue,
                time.time(),
                name,
                reports=controller.reports.reports(name),
            )

        return await _serve(controller, request, read)

    return [
        web.get("/v1/incidents", get_incidents),
        web.get("/v1/incidents/{id}", get_incident),
        web.get("/v1/jobs/{job_id}", get_job),
        web.get("/v1/nodes", get_nodes),
        web.get("/v1/nodes/{name}", get_node),
    ]


def lemon_parameters() -> dict[str, float]:
    """How the lemon score is computed (docs/cli.md, "Nodes")."""
    return {
        "window_days": views.LEMON_WINDOW / 86400,
        "half_life_days": views.LEMON_HALF_LIFE / 86400,
        "finding_weight": views.LEMON_FINDING_WEIGHT,
        "drain_weight": views.LEMON_DRAIN_WEIGHT,
        "threshold": views.LEMON_THRESHOLD,
    }
