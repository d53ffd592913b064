"""The controller's API for ``srecovery status``, ``mode``, ``drain`` and ``undrain``.

- ``GET /v1/status`` (any authenticated reader): the controller's health, the mode of every
  partition and where it comes from, incidents in flight and recent ones, the last errors, the
  watchdog's last run, and the nodes the tool keeps out. docs/cli.md has the JSON contract.
- ``GET /v1/mode``: the modes alone. ``POST /v1/mode`` (operators): set or clear an operator's
  mode override for a partition or the default, stored and audited; the recovery loop applies it
  from its next pass (``loop.effective_policy``). ``dry_run`` answers what would change.
- ``POST /v1/drain`` / ``POST /v1/undrain`` (operators): drain or resume nodes in Slurm, audited,
  recorded in the store's node state. A drain through the tool carries the reason
  ``srecovery-op:<user>: <reason>``; undrain refuses a node someone else drained unless forced.

Scheduler calls run on the recovery loop's thread (one at a time with its passes), never on the
ingest thread, so a slow slurmctld does not hold up evidence.
"""

from __future__ import annotations

import json
import logging
import pwd
import re
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from slurm_recovery import __version__
from slurm_recovery.contract import hostlist, requests
from slurm_recovery.controller import views
from slurm_recovery.controller.views import iso
from slurm_recovery.decide.model import ClusterView
from slurm_recovery.decide.policy import Policy
from slurm_recovery.scheduler import SchedulerError, Unreachable
from slurm_recovery.scheduler.base import sanitize_reason
from slurm_recovery.store import ModeOverride, NodeState, Store, StoreError

if TYPE_CHECKING:
    from slurm_recovery.controller.service import Controller

log = logging.getLogger("srecovery.controller")

#: WARNING+ records the controller keeps in memory, and how many ``status`` shows.
ERROR_RING_SIZE = 200
STATUS_ERRORS = 10
#: How long a message may be in the ring (a traceback's last line is enough).
MAX_ERROR_CHARS = 1000
#: Incidents that need an operator are listed for this long after they opened.
NEEDS_OPERATOR_WINDOW = 86400.0
#: The reason prefix of a drain an operator made through slurm-recovery.
OPERATOR_DRAIN_PREFIX = "srecovery-op:"
#: The reason prefix of the controller's own drains (``srecovery:<incident>:<cause>``).
TOOL_DRAIN_PREFIX = "srecovery:"
#: Most nodes one drain or undrain request may name (after expanding host lists).
MAX_NODES = 10_000

_PARTITION_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


# --------------------------------------------------------------------------------- the ring


class ErrorRing(logging.Handler):
    """The last ``capacity`` WARNING+ log records of this process, oldest first, as
    ``{"at": epoch, "level": str, "message": str}``. Bounded; safe across threads."""

    def __init__(self, capacity: int = ERROR_RING_SIZE, level: int = logging.WARNING) -> None:
        if capacity < 1:
            raise ValueError("ErrorRing capacity must be at least 1")
        super().__init__(level)
        self.records: deque[dict[str, Any]] = deque(maxlen=capacity)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                message += f": {type(exc).__name__}: {exc}"
            message = " ".join(message.split())
            if len(message) > MAX_ERROR_CHARS:
                message = message[: MAX_ERROR_CHARS - 3] + "..."
            self.records.append(
                {"at": record.created, "level": record.levelname, "message": message}
            )
        except Exception:
            self.handleError(record)

    def last(self, count: int) -> list[dict[str, Any]]:
        """The ``count`` latest records, oldest first."""
        self.acquire()
        try:
            items = list(self.records)
        finally:
            self.release()
        return items[-count:] if count > 0 else []


def install_error_ring(owner: object, capacity: int = ERROR_RING_SIZE) -> ErrorRing:
    """An ErrorRing on the root logger for as long as ``owner`` lives."""
    ring = ErrorRing(capacity)
    root = logging.getLogger()
    root.addHandler(ring)
    weakref.finalize(owner, root.removeHandler, ring)
    return ring


# --------------------------------------------------------------------------------- modes


def _override_json(mode: str, override: ModeOverride | None) -> dict[str, Any]:
    return {
        "mode": str(mode),
        "source": "override" if override else "policy",
        "set_by": override.set_by if override else None,
        "set_at": iso(override.set_at) if override else None,
        "reason": (override.reason or None) if override else None,
    }


def modes_json(
    policy: Policy, overrides: Iterable[ModeOverride], partitions: Iterable[str]
) -> dict[str, Any]:
    """The mode of the default and of each partition (those given, those the policy file names,
    those with an override), with where it comes from. A partition with neither its own policy
    table nor an override follows the default (``inherits_default``). Pure; agrees with
    ``loop.effective_policy(policy, overrides).mode_for(name)``."""
    by_name = {o.partition: o for o in overrides}
    default_override = by_name.get(None)
    default = _override_json(
        default_override.mode if default_override else policy.mode, default_override
    )
    names = {*partitions, *policy.partition_modes, *(p for p in by_name if p is not None)}
    out: dict[str, Any] = {}
    for name in sorted(names):
        override = by_name.get(name)
        if override is not None:
            out[name] = {**_override_json(override.mode, override), "inherits_default": False}
        elif name in policy.partition_modes:
            out[name] = {
                **_override_json(policy.partition_modes[name], None),
                "inherits_default": False,
            }
        else:
            out[name] = {**default, "inherits_default": True}
    return {"default": default, "partitions": out}


def mode_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Where the effective mode differs: ``[{"partition": NAME or None, "from", "to"}]``."""
    changes = []
    if before["default"]["mode"] != after["default"]["mode"]:
        changes.append(
            {"partition": None, "from": before["default"]["mode"], "to": after["default"]["mode"]}
        )
    for name, entry in after["partitions"].items():
        old = before["partitions"].get(name, before["default"])["mode"]
        if old != entry["mode"]:
            changes.append({"partition": name, "from": old, "to": entry["mode"]})
    return changes


def partitions_seen(view: ClusterView | None) -> set[str]:
    """Every partition Slurm shows a node in."""
    if view is None:
        return set()
    return {p for node in view.nodes.values() for p in node.partitions}


# --------------------------------------------------------------------------------- incidents


@dataclass(frozen=True)
class RecentIncident:
    opened_at: float
    kind: str
    fault_class: str


def incident_counts(
    incidents: Iterable[RecentIncident], now: float, window: float
) -> dict[str, Any]:
    """``{"total", "by_class", "by_kind"}`` of the incidents opened in the last ``window``."""
    chosen = [i for i in incidents if now - window <= i.opened_at]
    return {
        "total": len(chosen),
        "by_class": dict(sorted(Counter(i.fault_class for i in chosen).items())),
        "by_kind": dict(sorted(Counter(i.kind for i in chosen).items())),
    }


# --------------------------------------------------------------------------------- drains


def operator_reason(user: str, reason: str) -> str:
    """The Slurm drain reason of an operator's drain through slurm-recovery. ValueError when
    ``reason`` says nothing."""
    return sanitize_reason(f"{OPERATOR_DRAIN_PREFIX}{user}: {sanitize_reason(reason)}")


def drain_owner(reason: str) -> str | None:
    """Who drained a node with this Slurm reason, when it was slurm-recovery: ``operator
    USER through slurm-recovery`` or ``slurm-recovery (incident N)``; None for anyone else."""
    if reason.startswith(OPERATOR_DRAIN_PREFIX):
        user = reason[len(OPERATOR_DRAIN_PREFIX) :].split(":", 1)[0].strip() or "?"
        return f"operator {user} through slurm-recovery"
    if reason.startswith(TOOL_DRAIN_PREFIX):
        incident = reason[len(TOOL_DRAIN_PREFIX) :].split(":", 1)[0]
        return f"slurm-recovery (incident {incident})" if incident.isdigit() else None
    return None


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def expand_nodes(value: Any) -> list[str]:
    """A request's ``nodes``: names or host lists (``n[1-3]``), expanded, in order, once each."""
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError('"nodes" must be a non-empty list of node names or host lists')
    names: list[str] = []
    for expr in value:
        try:
            expanded = hostlist.expand(expr.strip())
        except hostlist.HostlistError as exc:
            raise ValueError(str(exc)) from None
        if not expanded:
            raise ValueError(f"{expr!r} names no node")
        names.extend(n for n in expanded if n not in names)
        if len(names) > MAX_NODES:
            raise ValueError(f"at most {MAX_NODES} nodes per request")
    return names


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"{}")
    except ValueError as exc:
        raise ValueError(f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("the body must be a JSON object")
    return data


# --------------------------------------------------------------------------------- the routes


class _Refused(Exception):
    """A request refused with ``status`` (a conflict with what Slurm shows)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class _NodeRequest:
    actor: str  # "uid:N", as in every operator audit row
    user: str
    nodes: list[str]
    reason: str = ""
    force: bool = False


def routes(controller: Controller) -> list[web.RouteDef]:
    """The routes this module serves, bound to ``controller`` (which gets an ErrorRing)."""
    ring = install_error_ring(controller)
    api = _OperatorApi(controller, ring)
    return [
        web.get("/v1/status", api.get_status),
        web.get("/v1/mode", api.get_mode),
        web.post("/v1/mode", api.post_mode),
        web.post("/v1/drain", api.post_drain),
        web.post("/v1/undrain", api.post_undrain),
    ]


class _OperatorApi:
    def __init__(self, controller: Controller, ring: ErrorRing) -> None:
        # A weak reference: the ring's finalizer runs when the controller goes.
        self._controller = weakref.ref(controller)
        self.ring = ring

    @property
    def c(self) -> Controller:
        controller = self._controller()
        assert controller is not None
        return controller

    # --- reads ---------------------------------------------------------------------------

    def _modes(self, store: Store) -> dict:
        reconciler = self.c.reconciler
        view = reconciler.last_view if reconciler else None
        return modes_json(self.c.policy, store.mode_overrides(), partitions_seen(view))

    async def get_mode(self, request: web.Request) -> web.Response:
        return await self.c._read(
            request,
            lambda store: {
                "modes": self._modes(store),
                "policy": str(self.c.config.controller.policy),
            },
        )

    async def get_status(self, request: web.Request) -> web.Response:
        return await self.c._read(request, self.status)

    def status(self, store: Store) -> dict[str, Any]:
        from slurm_recovery.watchdog import heartbeat_state, read_heartbeat, read_releases

        c = self.c
        now = time.time()
        r = c.reconciler
        view = r.last_view if r else None
        last = r.last_tick if r else None
        stale_after = max(10.0, 5 * c.config.controller.loop_interval)
        active = last is not None and now - last < stale_after
        errors = self.ring.last(STATUS_ERRORS)
        last_error = r.last_error if r else "starting"
        if not active and not last_error:
            worst = [e for e in errors if e["level"] in ("ERROR", "CRITICAL")]
            last_error = (
                worst[-1]["message"]
                if worst
                else f"no pass over Slurm in the last {stale_after:g}s"
            )

        in_flight = []
        for incident in store.list_incidents(open_only=True, limit=10_000):
            attempt = store.get_attempt(incident.attempt_id)
            advice = store.latest_advice(incident.id)
            milestones = store.milestones(incident.id)
            name, since = (
                list(milestones.items())[-1] if milestones else ("opened", incident.opened_at)
            )
            in_flight.append(
                {
                    "incident": incident.id,
                    "job_id": attempt.attempt.job_id if attempt else 0,
                    "kind": incident.kind,
                    "milestone": name,
                    "since": iso(since),
                    "action": advice.decision if advice else "",
                }
            )

        recent: list[RecentIncident] = []
        needs_operator = []
        for incident in store.list_incidents(limit=100_000):  # newest first
            if incident.opened_at < now - NEEDS_OPERATOR_WINDOW:
                break
            advice = store.latest_advice(incident.id)
            details = advice.verdict if advice else {}
            fault_class = details.get("verdict", {}).get("fault_class", "unknown")
            recent.append(RecentIncident(incident.opened_at, incident.kind, fault_class))
            gave_up = "needs operator" in (incident.outcome or "")
            if details.get("needs_operator") or gave_up:
                attempt = store.get_attempt(incident.attempt_id)
                needs_operator.append(
                    {
                        "incident": incident.id,
                        "job_id": attempt.attempt.job_id if attempt else 0,
                        "reason": incident.outcome if gave_up else advice.reason,
                        "opened_at": iso(incident.opened_at),
                    }
                )

        spool = c.config.watchdog.spool_dir
        beat = read_heartbeat(spool)
        try:
            released = len(read_releases(spool))
        except OSError:
            released = 0

        nodes = view.nodes if view else {}
        return {
            "version": __version__,
            "cluster": c.cluster,
            "state": "active" if active else "degraded",
            "started_at": iso(c.started_at),
            "now": iso(now),
            "last_pass": iso(last),
            "last_error": last_error,
            "slurm_reachable": last is not None and not (r and r.slurmctld_unreachable),
            "auth": "off (development only)" if c.insecure else "munge",
            "modes": self._modes(store),
            "in_flight": in_flight,
            "incidents": {
                "last_hour": incident_counts(recent, now, 3600.0),
                "last_day": incident_counts(recent, now, 86400.0),
            },
            "needs_operator": needs_operator,
            "errors": [
                {"at": iso(e["at"]), "level": e["level"], "message": e["message"]} for e in errors
            ],
            "watchdog": {
                "last_run": iso(float(beat["ts"])) if beat else None,
                "state": heartbeat_state(beat, now),
                "released_total": released,
            },
            "drained_by_tool": sorted(view.drained_by_tool) if view else [],
            "excluded_by_tool": sorted(views.excluded_by_tool(view)) if view else [],
            "unplaceable": views.waiting_without_room(view) if view else [],
            "drained_by_operator": sorted(
                name
                for name, node in nodes.items()
                if node.drained and node.reason.startswith(OPERATOR_DRAIN_PREFIX)
            ),
        }

    # --- mode ----------------------------------------------------------------------------

    async def post_mode(self, request: web.Request) -> web.Response:
        return await self.c._write(request, self.change_mode)

    def change_mode(
        self, store: Store, principal: requests.Principal, body: bytes
    ) -> dict[str, Any]:
        data = _json_body(body)
        clear = data.get("clear", False)
        dry_run = data.get("dry_run", False)
        if not isinstance(clear, bool) or not isinstance(dry_run, bool):
            raise ValueError('"clear" and "dry_run" must be true or false')
        partition = data.get("partition") or None
        if partition is not None and (
            not isinstance(partition, str) or not _PARTITION_RE.fullmatch(partition)
        ):
            raise ValueError(f'"partition" must be one partition name, got {partition!r}')
        mode = data.get("mode")
        if clear and mode is not None:
            raise ValueError('give "mode" or "clear", not both')
        if not clear and mode not in ("monitor", "act"):
            raise ValueError(f'"mode" must be "monitor" or "act", got {mode!r}')
        reason = data.get("reason") or ""
        if not isinstance(reason, str):
            raise ValueError('"reason" must be a string')
        reason = " ".join(reason.split())[:500]

        reconciler = self.c.reconciler
        view = reconciler.last_view if reconciler else None
        overrides = store.mode_overrides()
        seen = partitions_seen(view)
        known = (
            seen
            | set(self.c.policy.partition_modes)
            | {o.partition for o in overrides if o.partition}
        )
        if partition is not None and view is not None and partition not in known:
            raise ValueError(
                f"unknown partition {partition!r}: Slurm shows "
                f"{', '.join(sorted(seen)) or 'no partition'}"
            )
        user = user_name(principal.uid)
        now = time.time()
        previous = next((o for o in overrides if o.partition == partition), None)
        others = [o for o in overrides if o.partition != partition]
        new = (
            None
            if clear
            else ModeOverride(partition, mode, user, now, reason, set_by_uid=principal.uid)
        )
        before = modes_json(self.c.policy, overrides, seen)
        after = modes_json(self.c.policy, [*others, *([new] if new else [])], seen)
        changes = mode_changes(before, after)
        scope = "default" if partition is None else f"partition {partition}"
        entry = after["default"] if partition is None else after["partitions"][partition]
        old = (
            before["default"]
            if partition is None
            else before["partitions"].get(partition, before["default"])
        )
        if not dry_run and (new is not None or previous is not None):
            with store.transaction():
                if new is not None:
                    store.set_mode_override(new)
                else:
                    store.clear_mode_override(partition)
                store.append_audit(
                    f"uid:{principal.uid}",
                    "mode_cleared" if clear else "mode_set",
                    scope,
                    {
                        "user": user,
                        "mode": entry["mode"],
                        "previous": old["mode"],
                        "reason": reason,
                        "changes": changes,
                        "override": None if clear else mode,
                        "previous_override": previous.mode if previous else None,
                    },
                    ts=now,
                )
            log.info(
                "mode %s by %s (uid %d): %s%s",
                "override cleared" if clear else f"override {mode}",
                user,
                principal.uid,
                scope,
                f" ({reason})" if reason else "",
            )
        return {
            "dry_run": dry_run,
            "scope": "default" if partition is None else "partition",
            "partition": partition,
            "cleared": clear,
            "had_override": previous is not None,
            "previous": old["mode"],
            "mode": entry["mode"],
            "source": entry["source"],
            "changes": changes,
            "modes": after,
            "policy": str(self.c.config.controller.policy),
        }

    # --- drain and undrain ---------------------------------------------------------------

    async def post_drain(self, request: web.Request) -> web.Response:
        return await self._node_request(request, self._parse_drain, self._drain)

    async def post_undrain(self, request: web.Request) -> web.Response:
        return await self._node_request(request, self._parse_undrain, self._undrain)

    async def _node_request(
        self,
        request: web.Request,
        parse: Callable[[Store, requests.Principal, bytes], _NodeRequest],
        apply: Callable[[_NodeRequest], dict[str, Any]],
    ) -> web.Response:
        """Authorized (operators only) and checked on the ingest thread, as every write is
        (``Controller._authorized_write``); carried out on the loop's thread."""
        c = self.c
        body = await request.read()
        try:
            wanted = await c.ingest.run(c._authorized_write, request, body, parse)
            result = await c.loop_worker.run(apply, wanted)
        except requests.AuthError as err:
            return c._refuse(err)
        except ValueError as err:
            return web.json_response({"error": str(err)}, status=400)
        except _Refused as err:
            return web.json_response({"error": err.reason}, status=err.status)
        except StoreError as err:
            log.error("operator request not stored: %s", err)
            return web.json_response(
                {"error": f"not stored: {err}"}, status=503, headers={"Retry-After": "5"}
            )
        c._wake.set()
        return web.json_response(result)

    def _known(self, nodes: list[str]) -> None:
        reconciler = self.c.reconciler
        view = reconciler.last_view if reconciler else None
        if view is None:
            return  # Slurm not read yet: the scheduler says which node is unknown
        unknown = [n for n in nodes if n not in view.nodes]
        if unknown:
            raise ValueError(
                f"unknown node{'s' if len(unknown) > 1 else ''} {hostlist.compress(unknown)}: "
                f"Slurm shows {hostlist.compress(view.nodes) or 'no node'}"
            )

    def _parse_drain(
        self, store: Store, principal: requests.Principal, body: bytes
    ) -> _NodeRequest:
        data = _json_body(body)
        nodes = expand_nodes(data.get("nodes"))
        reason = data.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError('"reason" is required: say why the node is drained')
        self._known(nodes)
        user = user_name(principal.uid)
        return _NodeRequest(
            f"uid:{principal.uid}", user, nodes, reason=operator_reason(user, reason)
        )

    def _parse_undrain(
        self, store: Store, principal: requests.Principal, body: bytes
    ) -> _NodeRequest:
        data = _json_body(body)
        nodes = expand_nodes(data.get("nodes"))
        force = data.get("force", False)
        if not isinstance(force, bool):
            raise ValueError('"force" must be true or false')
        self._known(nodes)
        return _NodeRequest(f"uid:{principal.uid}", user_name(principal.uid), nodes, force=force)

    def _drain(self, wanted: _NodeRequest) -> dict[str, Any]:
        """On the loop's thread: drain each node not drained yet (a drain already there, ours
        or anyone's, keeps its reason), record it, audit it."""
        c = self.c
        store = c.loop_worker.store()
        results: list[dict[str, Any]] = []
        reachable = True
        for name in wanted.nodes:
            if not reachable:
                results.append({"node": name, "result": "not_tried", "reason": "", "message": ""})
                continue
            item: dict[str, Any] = {"node": name, "result": "", "reason": "", "message": ""}
            try:
                node = c.scheduler.get_node(name)
                if node.drained:  # ours or anyone's: keep that reason, do not overwrite it
                    item.update(result="already_drained", reason=node.reason)
                else:
                    c.scheduler.drain_node(name, wanted.reason)
                    item.update(result="drained", reason=wanted.reason)
            except Unreachable as exc:
                reachable = False
                item.update(result="not_tried", message=f"slurmctld unreachable: {exc}")
            except SchedulerError as exc:
                item.update(result="failed", message=str(exc))
            results.append(item)
            if item["result"] == "not_tried":
                continue
            if item["result"] == "drained":
                self._show_changed(name)
            now = time.time()
            with store.transaction():
                if item["result"] == "drained":
                    old = store.get_node(name)
                    store.upsert_node(
                        NodeState(
                            name=name,
                            updated_at=now,
                            # Not the tool's own drain: the blast radius counts only those.
                            drained_by_tool=False,
                            drain_reason=wanted.reason,
                            drained_at=now,
                            implicated_count=old.implicated_count if old else 0,
                            last_implicated_at=old.last_implicated_at if old else None,
                        )
                    )
                store.append_audit(
                    wanted.actor,
                    "operator_drain",
                    f"node {name}",
                    {
                        "user": wanted.user,
                        "reason": wanted.reason,
                        "result": item["result"],
                        "message": item["message"],
                        **(
                            {"previous_reason": item["reason"]}
                            if item["result"] == "already_drained"
                            else {}
                        ),
                    },
                    ts=now,
                )
            if item["result"] == "drained":
                log.info("node %s drained by %s: %s", name, wanted.user, wanted.reason)
            elif item["result"] == "failed":
                log.warning("node %s: drain by %s failed: %s", name, wanted.user, item["message"])
        return {"reason": wanted.reason, "nodes": results, "slurm_reachable": reachable}

    def _show_changed(self, name: str) -> None:
        """After a drain or resume: the loop's next pass (and ``status``) shows the node as it
        is now, not as the node listing read it up to a second before. A failed read changes
        nothing: the next listing shows it."""
        reconciler = self.c.reconciler
        if reconciler is None:
            return
        try:
            reconciler.read_node(name)
        except SchedulerError as exc:
            log.warning("node %s: reading it back after the change failed: %s", name, exc)

    def _undrain(self, wanted: _NodeRequest) -> dict[str, Any]:
        """On the loop's thread: read every node from Slurm first; refuse the whole request
        (nothing resumed) when one was drained by someone else and it is not forced."""
        c = self.c
        store = c.loop_worker.store()
        shown = {}
        try:
            for name in wanted.nodes:
                shown[name] = c.scheduler.get_node(name)
        except Unreachable as exc:
            raise _Refused(503, f"slurmctld unreachable, nothing resumed: {exc}") from None
        except SchedulerError as exc:
            raise ValueError(f"nothing resumed: {exc}") from None
        out_of_service = {
            name: node
            for name, node in shown.items()
            if node.drained or node.state in ("DOWN", "FAIL")
        }
        foreign = {
            name: node for name, node in out_of_service.items() if drain_owner(node.reason) is None
        }
        if foreign and not wanted.force:
            told = "; ".join(
                f"{name} ({node.state}{'+DRAIN' if node.drained else ''}, reason "
                f"{node.reason or '(none)'!r})"
                for name, node in foreign.items()
            )
            raise _Refused(
                409,
                f"not drained by slurm-recovery, so not resumed: {told}. Someone else (an admin "
                "with scontrol, or Slurm itself) took it out of service; nothing was resumed. "
                "Resume it anyway with --force",
            )
        results: list[dict[str, Any]] = []
        reachable = True
        for name in wanted.nodes:
            node = shown[name]
            owner = drain_owner(node.reason) if name in out_of_service else None
            item: dict[str, Any] = {
                "node": name,
                "result": "",
                "previous_reason": node.reason if name in out_of_service else "",
                "drained_by": owner
                or ("someone else, not slurm-recovery" if name in out_of_service else None),
                "message": "",
            }
            if name not in out_of_service:
                item["result"] = "not_drained"
                results.append(item)
                continue
            if not reachable:
                item["result"] = "not_tried"
                results.append(item)
                continue
            try:
                c.scheduler.resume_node(name)
                item["result"] = "resumed"
            except Unreachable as exc:
                reachable = False
                item.update(result="not_tried", message=f"slurmctld unreachable: {exc}")
            except SchedulerError as exc:
                item.update(result="failed", message=str(exc))
            results.append(item)
            if item["result"] == "not_tried":
                continue
            if item["result"] == "resumed":
                self._show_changed(name)
            now = time.time()
            with store.transaction():
                old = store.get_node(name)
                if item["result"] == "resumed" and old is not None:
                    store.upsert_node(
                        NodeState(
                            name=name,
                            updated_at=now,
                            implicated_count=old.implicated_count,
                            last_implicated_at=old.last_implicated_at,
                        )
                    )
                store.append_audit(
                    wanted.actor,
                    "operator_undrain",
                    f"node {name}",
                    {
                        "user": wanted.user,
                        "result": item["result"],
                        "previous_reason": item["previous_reason"],
                        "drained_by": item["drained_by"],
                        "force": wanted.force,
                        "message": item["message"],
                    },
                    ts=now,
                )
            if item["result"] == "resumed":
                log.info(
                    "node %s resumed by %s (drained by %s: %s)",
                    name,
                    wanted.user,
                    item["drained_by"],
                    item["previous_reason"],
                )
            else:
                log.warning("node %s: resume by %s failed: %s", name, wanted.user, item["message"])
        return {"nodes": results, "slurm_reachable": reachable, "force": wanted.force}
