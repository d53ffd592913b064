"""The controller process: the HTTP API (aiohttp) in front, the recovery loop behind it.

Two worker threads, each with its own Store connection on the same SQLite file: one for
ingest and reads (short transactions), one for the recovery loop (which waits on Slurm).
An accepted evidence batch wakes the loop at once, so a fatal XID is acted on in the same
second rather than at the next interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from slurm_recovery import __version__
from slurm_recovery.auth import authorize
from slurm_recovery.config import Config
from slurm_recovery.contract import datagrams, hostlist, munge, requests, sessions
from slurm_recovery.contract.status import (
    HEARTBEAT_PATH,
    HELD,
    MAX_HEARTBEAT_BYTES,
    STATUS_KIND,
    WANTED,
    parse_heartbeat,
    status_condition,
)
from slurm_recovery.contract.wire import WireError, parse_batch
from slurm_recovery.controller import audit_api, datagram_port, operator_api, read_api, views
from slurm_recovery.controller.checkpointer import Checkpointer
from slurm_recovery.controller.loop import Reconciler, StepDone
from slurm_recovery.controller.metrics import Metrics, ReadAtScrape
from slurm_recovery.controller.nodelisting import NodeListing
from slurm_recovery.controller.reports import FLUSH_CHUNK, FLUSH_INTERVAL, LastReports
from slurm_recovery.decide.model import ClusterView
from slurm_recovery.decide.policy import load_policy
from slurm_recovery.scheduler import Node, Scheduler, SchedulerError, Unreachable, open_scheduler
from slurm_recovery.signals.xid import load_xid_catalogue
from slurm_recovery.store import Evidence, NodeReport, Store, StoreError
from slurm_recovery.store.store import ROUTINE_EVIDENCE

log = logging.getLogger("srecovery.controller")
T = TypeVar("T")

#: One evidence request as stored: the evidence ids, whether any of it wakes the loop, and how
#: many events it held (a sidecar status that changed nothing is accepted but not stored).
Ingested = tuple[list[int], bool, int]

#: An evidence request checked (authenticated, parsed, authorized): who sent it, and what.
Checked = tuple[requests.Principal, list[Evidence]]

#: The answer to a status that changed nothing (most requests): one event accepted, none stored.
UNCHANGED_ANSWER = b'{"accepted": 1, "ids": []}'
#: The answers to a heartbeat (contract.status): the report held, or send the status in full.
HELD_ANSWER, WANTED_ANSWER = (json.dumps({"status": a}).encode() for a in (HELD, WANTED))

#: Role assumed for every request when authentication is off (development only).
INSECURE_ROLE_HEADER = "X-SRecovery-Role"

#: Retention runs this often (seconds), deleting at most PRUNE_BATCH rows per statement.
PRUNE_EVERY, PRUNE_BATCH = 3600.0, 10_000

#: Evidence that only feeds the next regular pass (status, telemetry, progress, job starts):
#: a request with nothing else does not wake the loop at once. Under thousands of sidecars
#: the loop would otherwise run pass after pass without pause.
ROUTINE_KINDS = frozenset(
    {"sidecar_status", "progress", "gpu_activity", "gpu_inventory", "job_start"}
)
#: The least time from the start of one pass to the start of the next, however often
#: evidence wakes the loop: each pass reads the jobs (one RPC to slurmctld), and an XID
#: storm must not become a squeue storm. The busy cadence (steps in flight) is the same.
MIN_PASS_GAP = 0.1
#: /metrics reads the per-node lemon scores from the store at most this often (seconds).
LEMON_REFRESH = 30.0


def wakes_the_loop(evidence: Evidence) -> bool:
    """Evidence a pass should see at once: not ROUTINE_KINDS, and a job's end only when it
    did not end cleanly (an exit code or signal, or codes not known). A clean end is read
    at the next regular pass; Slurm's record of the job is what detection reads anyway."""
    if evidence.kind in ROUTINE_KINDS:
        return False
    if evidence.kind == "job_end":
        p = evidence.payload
        codes = [p.get(k) for k in ("exit_code", "signal")]
        codes += [p.get(k, 0) for k in ("derived_exit_code", "derived_signal")]
        return any(code != 0 for code in codes)
    return True


class _Worker:
    """One thread that owns one Store connection; everything store-related runs on it."""

    def __init__(self, name: str, db: Path) -> None:
        """Its commits never checkpoint the WAL: the service's Checkpointer does that."""
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.local = threading.local()
        self.db = db

    def store(self) -> Store:
        if not hasattr(self.local, "store"):
            self.local.store = Store.open(self.db, auto_checkpoint=False)
        return self.local.store

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)


#: How long a resolved NodeAddr/NodeHostname is trusted before it is looked up again.
RESOLVE_TTL = 600.0


class AddressBook:
    """node -> IPv4 addresses its munged may stamp: NodeAddr, and NodeHostname, resolved.

    Lookups are cached for RESOLVE_TTL so a pass over 10,000 nodes does not ask the resolver
    10,000 times a second; a changed NodeAddr in Slurm is seen at once (it is the cache key).
    Each node's set is kept too, by (NodeAddr, NodeHostname), so a pass over 10,000 unchanged
    nodes costs a dictionary lookup per node, not set arithmetic and lookups (about 20 us).
    """

    def __init__(self, resolve: Callable[[str], list[str]] | None = None) -> None:
        self._resolve = resolve or (lambda host: socket.gethostbyname_ex(host)[2])
        self._cache: dict[str, tuple[float, frozenset[str]]] = {}
        self._nodes: dict[tuple[str, str], tuple[float, frozenset[str]]] = {}

    def lookup(self, host: str, now: float) -> frozenset[str]:
        cached = self._cache.get(host)
        if cached is None or now - cached[0] > RESOLVE_TTL:
            try:
                addrs = frozenset(self._resolve(host))
            except OSError:
                addrs = frozenset()
            cached = self._cache[host] = (now, addrs)
        return cached[1]

    def addresses(self, nodes: Mapping[str, Node], now: float) -> dict[str, frozenset[str]]:
        known = self._nodes
        found: dict[str, frozenset[str]] = {}
        for name, node in nodes.items():
            key = (node.address, node.hostname)
            cached = known.get(key)
            if cached is None or now - cached[0] > RESOLVE_TTL:
                addrs = frozenset().union(*(self.lookup(h, now) for h in set(key) - {""}))
                cached = known[key] = (now, addrs)
            found[name] = cached[1]
        return found


#: Evidence kinds ``srecovery report`` sends (an operator's word on a node).
REPORT_KINDS = ("operator_report", "xid")


def check_operator_report(
    evidence: list[Evidence], view: ClusterView | None, job_on_record: Callable[[int], bool]
) -> None:
    """Refuse (WireError: 400) an operator's report on a node Slurm does not have, on a job
    neither Slurm nor the store knows, or without a reason: a typo must not pass unnoticed.
    Before the first pass has read Slurm (``view`` None) only the reason is checked."""
    for e in evidence:
        if e.kind not in REPORT_KINDS:
            continue  # e.g. the head node's epilog posts job ends with the operator role
        if e.kind == "operator_report" and not str(e.payload.get("reason") or "").strip():
            raise WireError("an operator report needs a reason: what is wrong, in words")
        if view is None:
            continue
        if e.node is not None and e.node not in view.nodes:
            raise WireError(
                f"unknown node {e.node!r}: Slurm shows {hostlist.compress(view.nodes) or 'none'}"
            )
        if e.job_id is not None and e.job_id not in view.jobs and not job_on_record(e.job_id):
            raise WireError(f"unknown job {e.job_id}: neither Slurm nor the controller knows it")


#: Called on the event loop after every loop pass with the pass's trouble ("" when it went
#: well): ``srecovery-controller`` tells systemd (READY, WATCHDOG, STATUS) through it.
PassDone = Callable[[str], None]


class Controller:
    def __init__(
        self,
        config: Config,
        *,
        insecure_no_auth: bool = False,
        on_pass: PassDone | None = None,
        after_step: StepDone | None = None,
    ) -> None:
        self.config = config
        self.insecure = insecure_no_auth
        self.on_pass = on_pass
        self.after_step = after_step
        self.metrics = Metrics()
        # bound once: a heartbeat is most requests, and labels() takes a lock and a look-up
        self._heartbeats_held = self.metrics.heartbeats.labels("held")
        self._heartbeats_wanted = self.metrics.heartbeats.labels("wanted")
        self._datagrams = {
            outcome: self.metrics.heartbeat_datagrams.labels(outcome)
            for outcome in ("answered", "refused", "dropped")
        }
        #: the UDP endpoint taking heartbeat datagrams (open_heartbeat_port); None: not open
        self._datagram_transport: asyncio.DatagramTransport | None = None
        self.ingest = _Worker("srecovery-ingest", config.store.path)
        self.loop_worker = _Worker("srecovery-loop", config.store.path)
        self.checkpointer = Checkpointer(config.store.path)
        self.replays = requests.ReplayCache()
        #: sidecars' sessions (contract/sessions.py): one MUNGE decode per session, not report
        self.sessions = (
            sessions.SessionTable(config.auth.session_ttl) if config.auth.sessions else None
        )
        self.operators = authorize.operators_from_system(
            config.auth.slurm_user, config.auth.operator_group
        )
        self.scheduler: Scheduler = open_scheduler(
            config.scheduler.backend,
            timeout=config.scheduler.command_timeout,
            bin_dir=config.scheduler.slurm_bin_dir,
            slurm_conf=config.scheduler.slurm_conf,
        )
        #: Slurm's nodes, read every loop interval by a thread of its own (nodelisting.py)
        self.node_listing: NodeListing | None = None
        self.policy = load_policy(config.controller.policy)
        self.catalogue = load_xid_catalogue()
        self.cluster = ""
        self.node_addresses: dict[str, frozenset[str]] = {}
        self._unplaceable_jobs: set[int] = set()  # the jobs last seen waiting without room
        #: when each node's sidecar was last heard from (the ingest notes, the loop reads)
        self.reports = LastReports()
        self.address_book = AddressBook()
        self.reconciler: Reconciler | None = None
        self._wake = asyncio.Event()
        #: evidence requests waiting for the next group commit (see _ingest_grouped)
        self._ingest_queue: list[
            tuple[web.Request, bytes, Checked | None, asyncio.Future[Any]]
        ] = []
        self._queued_bytes = 0  # the bodies in _ingest_queue (controller.max_queued_bytes)
        self._ingest_flushing = False
        self._ingest_task: asyncio.Task[None] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._flush_task: asyncio.Task[None] | None = None
        self.started_at = time.time()
        self._next_prune = 0.0  # retention: the first pass prunes, then once an hour
        self._lemons_due = 0.0  # /metrics: when the lemon scores are read again
        self.metrics.registry.register(ReadAtScrape(config.store.path, config.watchdog.spool_dir))

    # --- lifecycle ---------------------------------------------------------------------

    def _make_reconciler(self) -> Reconciler:
        self.cluster = self.config.cluster.name or self.scheduler.cluster_name()
        self.reports.seed(self.loop_worker.store(), time.time())
        interval = self.config.controller.loop_interval
        self.node_listing = NodeListing(
            self.scheduler.list_nodes, every=interval, max_age=max(5.0, 3 * interval)
        )
        return Reconciler(
            store=self.loop_worker.store(),
            scheduler=self.scheduler,
            policy=self.policy,
            catalogue=self.catalogue,
            cluster=self.cluster,
            hold_deadline=self.config.controller.hold_deadline,
            spool_dir=self.config.watchdog.spool_dir,
            hook_spool_dir=self.config.controller.spool_dir,
            metrics=self.metrics,
            after_step=self.after_step,
            node_listing=self.node_listing,
            health_check_prefixes=self.config.controller.health_check_drain_prefixes,
            reports=self.reports,
            missing_report_grace=self.config.controller.missing_report_grace,
        )

    async def start(self, app: web.Application) -> None:
        await self.ingest.run(self.ingest.store)  # opens (and migrates) the store
        self.checkpointer.start()
        self.reconciler = await self.loop_worker.run(self._make_reconciler)
        assert self.node_listing is not None
        self.node_listing.start()
        self._loop_task = asyncio.create_task(self._run_loop())
        self._flush_task = asyncio.create_task(self._flush_reports_every(FLUSH_INTERVAL))
        if self.insecure:
            log.critical(requests.INSECURE_NO_AUTH_WARNING)

    async def stop(self, app: web.Application) -> None:
        if self._loop_task:
            self._loop_task.cancel()
        if self._flush_task:
            self._flush_task.cancel()
            await self._flush_reports()  # the reports held in memory, for the next start
        if self.node_listing:
            self.node_listing.stop()
        self.ingest.pool.shutdown(wait=True)
        self.loop_worker.pool.shutdown(wait=True)
        self.checkpointer.stop()

    async def _flush_reports_every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self._flush_reports()

    async def _flush_reports(self) -> None:
        """Write the sidecars' reports that changed in memory only (controller.reports); a
        store that cannot be written keeps them for the next try: a report is state, and
        the statuses that changed a node's condition are stored as evidence already."""

        def chunk() -> int:
            return self.reports.flush(self.ingest.store(), FLUSH_CHUNK)

        try:  # a chunk a turn: what queued for the ingest thread meanwhile goes between
            while await self.ingest.run(chunk) == FLUSH_CHUNK:
                pass
        except StoreError as exc:
            log.warning("sidecar reports not written to the store (kept; tried again): %s", exc)

    async def _run_loop(self) -> None:
        interval = self.config.controller.loop_interval
        clock = asyncio.get_running_loop().time
        while True:
            started = clock()
            try:
                busy = await self.loop_worker.run(self._tick)
                trouble = self.reconciler.last_error if self.reconciler else ""
            except Exception:  # a bug must not stop recovery for good: log, go on
                log.exception("recovery loop pass failed")
                busy, trouble = False, "the pass failed (see the log)"
            if self.on_pass:
                self.on_pass(trouble)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=0.1 if busy else interval)
            await asyncio.sleep(max(0.0, MIN_PASS_GAP - (clock() - started)))
            self._wake.clear()  # the pass that follows reads what woke it in the gap

    def _prune(self) -> None:
        """Retention (``store.retention``), at most once an hour, on the loop's thread: batch
        after batch for at most a second, so a large backlog never stalls recovery."""
        now = time.time()
        if now < self._next_prune:
            return
        store = self.loop_worker.store()
        before = now - self.config.store.retention
        deleted, deadline = 0, time.monotonic() + 1.0
        try:
            while True:
                count = store.prune_evidence(before, batch=PRUNE_BATCH)
                deleted += count
                if count < PRUNE_BATCH or time.monotonic() > deadline:
                    break
            if deleted:
                store.append_audit(
                    "controller",
                    "retention",
                    "evidence",
                    {"deleted": deleted, "observed_before": before, "kinds": ROUTINE_EVIDENCE},
                )
                log.info("retention: deleted %d evidence rows older than the window", deleted)
        except StoreError as exc:  # a full or locked store: try again at the next interval
            log.warning("retention: %s", exc)
            return
        self._next_prune = now + (PRUNE_EVERY if count < PRUNE_BATCH else 0.0)

    def _tick(self) -> bool:
        assert self.reconciler is not None
        self._prune()
        busy = self.reconciler.tick()
        r = self.reconciler
        self.metrics.pass_done(
            unreachable=r.slurmctld_unreachable, good=not r.last_error, now=time.time()
        )
        view = self.reconciler.last_view
        if view is not None:
            self.node_addresses = self.address_book.addresses(view.nodes, view.now)
            self.metrics.nodes_drained.set(len(view.drained_by_tool))
            self.metrics.nodes_excluded.set(len(views.excluded_by_tool(view)))
            self._report_unplaceable(views.waiting_without_room(view))
        return busy

    def _report_unplaceable(self, waiting: list[dict[str, Any]]) -> None:
        """The gauge, and one warning in the journal when a job starts waiting without room."""
        self.metrics.jobs_unplaceable.set(len(waiting))
        now = {w["job_id"] for w in waiting}
        for w in waiting:
            if w["job_id"] not in self._unplaceable_jobs:
                log.warning(
                    "job %d (incident %s) cannot start: %s", w["job_id"], w["incident"], w["reason"]
                )
        self._unplaceable_jobs = now

    # --- authentication ----------------------------------------------------------------

    def _principal(self, request: web.Request, body: bytes) -> requests.Principal:
        if self.insecure:
            log.warning(
                "unauthenticated request %s %s (--insecure-no-auth)", request.method, request.path
            )
            role = request.headers.get(INSECURE_ROLE_HEADER, "operator")
            return requests.Principal(uid=0, gid=0, origin="", role=role, node=None)
        header = request.headers.get("Authorization")
        if sessions.is_session(header):
            session = self._session_of(
                str(header), request.method, request.raw_path, body, request.remote
            )
            return session.principal
        return requests.verify(
            request.headers,
            request.method,
            request.raw_path,
            body,
            socket=self.config.auth.munge_socket or None,
            max_age=self.config.auth.max_age,
            now=time.time(),
            seen=self.replays,
        )

    def _session_of(
        self, header: str, method: str, path: str, body: bytes, peer: str | None
    ) -> sessions.Session:
        """The session that signed this request (HTTP or datagram), or AuthError saying why
        not."""
        if self.sessions is None:
            raise requests.AuthError(
                401,
                f"{sessions.REFUSAL}s are off here (auth.sessions = false): sign each "
                "request with MUNGE",
            )
        return self.sessions.verify_session(
            header,
            method,
            path,
            body,
            peer=peer,
            now=time.time(),
            max_age=self.config.auth.max_age,
            skew=requests.DEFAULT_SKEW,
        )

    def _refuse(self, err: requests.AuthError) -> web.Response:
        self.metrics.ingest_rejects.labels(str(err.status)).inc()
        log.info("refused: %s", err)
        return web.json_response({"error": err.reason}, status=err.status)

    # --- handlers ----------------------------------------------------------------------

    async def post_evidence(self, request: web.Request) -> web.Response:
        started = time.monotonic()
        busy = self._queue_full(request.content_length)
        if busy:
            # refused before reading the body or decoding the credential: cheap under a flood;
            # a random Retry-After spreads the sidecars' retries
            self.metrics.ingest_rejects.labels("429").inc()
            return web.json_response(
                {"error": f"busy: {busy}; retry later"},
                status=429,
                headers={"Retry-After": str(random.randint(1, 5))},
            )
        body = await request.read()
        try:
            checked = self._checked_here(request, body)
            if checked is not None and self._unchanged_status(*checked):
                # a status that changes nothing: answered here, nothing to store
                self.metrics.ingest_events.inc()
                self.metrics.ingest_latency.observe(time.monotonic() - started)
                return web.Response(
                    body=UNCHANGED_ANSWER, status=202, content_type="application/json"
                )
            ids, urgent, accepted = await self._ingest_grouped(request, body, checked)
        except requests.AuthError as err:
            return self._refuse(err)
        except WireError as err:
            self.metrics.ingest_rejects.labels("400").inc()
            return web.json_response({"error": str(err)}, status=400)
        except StoreError as err:
            log.error("evidence not stored: %s", err)
            self.metrics.ingest_rejects.labels("503").inc()
            return web.json_response(
                {"error": f"not stored: {err}"}, status=503, headers={"Retry-After": "5"}
            )
        self.metrics.ingest_events.inc(accepted)
        self.metrics.ingest_latency.observe(time.monotonic() - started)
        if urgent:
            self._wake.set()
        # accepted: every event; ids: those stored as evidence (an unchanged status is not)
        return web.json_response({"accepted": accepted, "ids": ids}, status=202)

    async def post_heartbeat(self, request: web.Request) -> web.Response:
        """A sidecar says "my condition is still the one you hold" (contract.status): checked
        and answered on the HTTP thread when signed in a session (an HMAC and a dictionary
        look-up; a MUNGE credential goes to the ingest thread, as for evidence). Nothing is
        stored: the node is heard, and its report counts one more."""
        started = time.monotonic()
        if (request.content_length or 0) > MAX_HEARTBEAT_BYTES:
            self.metrics.ingest_rejects.labels("413").inc()
            return web.json_response(
                {"error": f"a heartbeat is at most {MAX_HEARTBEAT_BYTES} bytes"}, status=413
            )
        body = await request.read()
        try:
            if self.insecure or sessions.is_session(request.headers.get("Authorization")):
                principal = self._principal(request, body)
            else:
                principal = await self.ingest.run(self._principal, request, body)
            node, digest = parse_heartbeat(body)
            held = self._heard(principal, node, digest)
        except requests.AuthError as err:
            return self._refuse(err)
        except WireError as err:
            self.metrics.ingest_rejects.labels("400").inc()
            return web.json_response({"error": str(err)}, status=400)
        self.metrics.ingest_latency.observe(time.monotonic() - started)
        return web.Response(
            body=HELD_ANSWER if held else WANTED_ANSWER, content_type="application/json"
        )

    def _heard(self, principal: requests.Principal, node: str, digest: str) -> bool:
        """A checked heartbeat: the node is heard when ``principal`` may speak for it (else
        AuthError); True when the report held for it has the condition ``digest``."""
        if principal.role != "sidecar":
            raise requests.AuthError(
                403, f"a {principal.role} credential may not send heartbeats: sidecars only"
            )
        if not self.insecure:
            event = {"node": node, "kind": STATUS_KIND}
            authorize.authorize_evidence(principal, [event], self.node_addresses, self.operators)
        held = self.reports.beat(node, digest, time.time())
        (self._heartbeats_held if held else self._heartbeats_wanted).inc()
        return held

    def heartbeat_datagram(self, data: bytes, peer: str) -> bytes | None:
        """A heartbeat datagram from ``peer`` (contract.datagrams) -> its answer, checked as
        the HTTP heartbeat is, on the event loop (an HMAC and a look-up); None, and no answer,
        for a datagram that is not a session-signed heartbeat."""
        started = time.monotonic()
        try:
            authorization, body = datagrams.decode(data)
            node, digest = parse_heartbeat(body)
        except WireError:
            self._datagrams["dropped"].inc()
            return None
        try:
            session = self._session_of(authorization, datagrams.METHOD, HEARTBEAT_PATH, body, peer)
            held = self._heard(session.principal, node, digest)
        except requests.AuthError as err:
            self._datagrams["refused"].inc()
            self.metrics.ingest_rejects.labels(str(err.status)).inc()
            log.info("refused a heartbeat datagram from %s: %s", peer, err)
            return datagrams.refusal(err.reason, len(data))
        self._datagrams["answered"].inc()
        self.metrics.ingest_latency.observe(time.monotonic() - started)
        return datagrams.answer(session.key, authorization, HELD if held else WANTED)

    async def open_heartbeat_port(self, app: web.Application) -> None:
        """Take heartbeat datagrams on the HTTP port's number over UDP (controller.
        heartbeat_datagrams), when sessions are on: a port that cannot be bound is logged and
        the sidecars keep to HTTP (the session's answer offers no port)."""
        if not self.config.controller.heartbeat_datagrams or self.sessions is None or self.insecure:
            return
        host, port = self.config.controller.listen_host_port
        self._datagram_transport = await datagram_port.open_port(
            host, port, self.heartbeat_datagram
        )
        if self._datagram_transport is not None:
            log.info("heartbeat datagrams on UDP port %d", self.datagram_port)

    async def close_heartbeat_port(self, app: web.Application) -> None:
        if self._datagram_transport is not None:
            self._datagram_transport.close()
            self._datagram_transport = None

    @property
    def datagram_port(self) -> int | None:
        """The UDP port taking heartbeat datagrams; None when none is open."""
        if self._datagram_transport is None:
            return None
        return int(self._datagram_transport.get_extra_info("sockname")[1])

    def _queue_full(self, length: int | None) -> str:
        """Why a new evidence request of ``length`` bytes (None: not said, so as large as
        allowed) does not fit in the queue for the ingest thread, or "" when it does. The count
        bounds the work waiting, the bytes the memory it holds; an empty queue takes any
        request the body limit lets in."""
        limits = self.config.controller
        waiting = len(self._ingest_queue)
        if waiting >= limits.max_queued_requests:
            return f"{waiting} requests waiting to be stored"
        size = limits.max_request_bytes if length is None else length
        if waiting and self._queued_bytes + size > limits.max_queued_bytes:
            return f"{self._queued_bytes} bytes of requests waiting to be stored"
        return ""

    async def post_session(self, request: web.Request) -> web.Response:
        """A sidecar opens a session (contract/sessions.py); 404 when sessions are off."""
        body = await request.read()
        if self.sessions is None or self.insecure:
            return web.json_response(
                {"error": "this controller offers no sessions (auth.sessions = false)"},
                status=404,
            )
        try:
            answer = await self.ingest.run(self._open_session, request, body)
        except requests.AuthError as err:
            return self._refuse(err)
        return web.json_response(answer, status=201)

    def _open_session(self, request: web.Request, body: bytes) -> dict[str, Any]:
        assert self.sessions is not None
        if sessions.is_session(request.headers.get("Authorization")):
            raise requests.AuthError(401, "a session is opened with a MUNGE credential")
        principal = self._principal(request, body)
        if principal.role != "sidecar":
            raise requests.AuthError(
                403, f"a {principal.role} credential may not open a session: sidecars only"
            )
        authorize.authorize_evidence(principal, [], self.node_addresses, self.operators)
        session = self.sessions.open(principal, request.remote or "", time.time())
        try:
            key = munge.encode(
                session.key,
                socket=self.config.auth.munge_socket or None,
                uid_restriction=principal.uid,
            )
        except munge.MungeError as exc:
            raise requests.AuthError(503, f"cannot encode the session key: {exc}") from exc
        log.info(
            "session opened for the sidecar of %s (uid %d) from %s",
            principal.node,
            principal.uid,
            session.peer,
        )
        return {
            "session": session.id,
            "key": key,
            "expires_at": session.expires_at,
            "ttl": self.sessions.ttl,
            **({"datagram_port": self.datagram_port} if self.datagram_port else {}),
        }

    def _checked_here(self, request: web.Request, body: bytes) -> Checked | None:
        """A request signed in a session, checked on the HTTP thread: its HMAC costs
        microseconds, so the status that most requests carry never waits for the ingest
        thread. None for the others: a MUNGE credential is a round trip to munged, made on the
        ingest thread (``_checked``)."""
        if self.insecure or not sessions.is_session(request.headers.get("Authorization")):
            return None
        return self._checked(request, body)

    def _unchanged_status(self, principal: requests.Principal, evidence: list[Evidence]) -> bool:
        """Whether the request is one sidecar status that changes nothing about its node
        (controller.reports): the node's report is updated in memory, and nothing is stored."""
        if principal.role != "sidecar" or len(evidence) != 1:
            return False
        status = evidence[0]
        if status.kind != STATUS_KIND or status.node is None:
            return False
        now = time.time()
        if not self.reports.note_unchanged(status, status_condition(status.payload), now):
            return False
        self.reports.heard(status.node, now)
        return True

    async def _ingest_grouped(
        self, request: web.Request, body: bytes, checked: Checked | None = None
    ) -> Ingested:
        """Group commit: the requests that arrive while one transaction is being committed
        are stored together in the next one, so one fsync covers them all (a durable commit
        costs milliseconds on most disks, which would cap ingest at a few hundred requests a
        second). Each request is still checked on its own and answered only once its rows are
        on disk; one refused request never affects the others. Returns the evidence ids, and
        whether any of it is urgent (not in ROUTINE_KINDS), and how many events it held.
        ``checked``: the request as ``_checked_here`` already checked it."""
        done: asyncio.Future[Ingested] = asyncio.get_running_loop().create_future()
        self._ingest_queue.append((request, body, checked, done))
        self._queued_bytes += len(body)
        if not self._ingest_flushing:
            self._ingest_flushing = True
            self._ingest_task = asyncio.create_task(self._flush_ingest())
        return await done

    async def _flush_ingest(self) -> None:
        try:
            while self._ingest_queue:
                group, self._ingest_queue = self._ingest_queue, []
                self._queued_bytes = 0
                try:
                    results = await self.ingest.run(self._ingest_many, [item[:3] for item in group])
                except Exception as exc:  # the commit itself failed: nothing was stored
                    results = [exc] * len(group)
                for (*_, done), result in zip(group, results, strict=True):
                    if done.done():
                        continue
                    if isinstance(result, BaseException):
                        done.set_exception(result)
                    else:
                        done.set_result(result)
        finally:
            self._ingest_flushing = False

    def _ingest_many(
        self, items: list[tuple[web.Request, bytes, Checked | None]]
    ) -> list[Ingested | Exception]:
        """Check each request (unless checked already), then store the accepted ones in one
        transaction (each in its own savepoint); per request, its evidence ids or the
        exception that refused it. The statuses that change their node's report are applied
        to the in-memory reports once the transaction has committed."""
        checked: list[Checked | Exception] = []
        for request, body, already in items:
            try:
                checked.append(already if already is not None else self._checked(request, body))
            except Exception as exc:
                checked.append(exc)
        if all(isinstance(c, Exception) for c in checked):
            return checked  # type: ignore[return-value]
        store = self.ingest.store()
        results: list[Ingested | Exception] = []
        changes: dict[str, NodeReport] = {}  # node -> its report changed in this transaction
        try:
            with store.transaction():
                for item in checked:
                    if isinstance(item, Exception):
                        results.append(item)
                        continue
                    before = dict(changes)
                    try:
                        with store.transaction():
                            ids = self._store_evidence(store, *item, changes)
                        urgent = any(wakes_the_loop(e) for e in item[1])
                        results.append((ids, urgent, len(item[1])))
                        if item[0].role == "sidecar" and item[0].node:
                            self.reports.heard(item[0].node, time.time())
                    except StoreError as exc:  # its savepoint rolled back: its changes too
                        results.append(exc)
                        undone = [r for node, r in changes.items() if node not in before]
                        self.reports.settle(undone, committed=False)
                        changes = before
        except BaseException:
            self.reports.settle(changes.values(), committed=False)
            raise
        self.reports.settle(changes.values(), committed=True)
        return results

    def _checked(
        self, request: web.Request, body: bytes
    ) -> tuple[requests.Principal, list[Evidence]]:
        """Authenticate, parse and authorize one evidence request (raises what refuses it)."""
        principal = self._principal(request, body)
        evidence = [Evidence.from_wire(e, principal.role) for e in parse_batch(body)]
        events = [
            {"node": e.node, "gpu": e.gpu, "job_id": e.job_id, "kind": e.kind} for e in evidence
        ]
        if not self.insecure:
            authorize.authorize_evidence(principal, events, self.node_addresses, self.operators)
        if principal.role == "operator":
            view = self.reconciler.last_view if self.reconciler else None
            store = self.ingest.store()
            check_operator_report(evidence, view, lambda job: self._job_known(store, job))
        return principal, evidence

    def _job_known(self, store: Store, job_id: int) -> bool:
        """A job the last pass did not see: one the store has a record of, or one Slurm shows
        now (submitted since that pass). Slurm unreachable: taken as known (a report is never
        lost to a check)."""
        if store.latest_attempt(self.cluster, job_id) is not None:
            return True
        try:
            self.scheduler.get_job(job_id)
        except Unreachable:
            return True
        except SchedulerError:
            return False
        return True

    def _store_evidence(
        self,
        store: Store,
        principal: requests.Principal,
        evidence: list[Evidence],
        changes: dict[str, NodeReport],
    ) -> list[int]:
        """Store the request's evidence. A sidecar's status is its node's report
        (controller.reports), stored as evidence (and its report written) only when it
        changes the node's condition; ``changes`` collects those reports, which the caller
        settles once its transaction has ended (``_ingest_many``)."""
        if principal.role == "sidecar":
            heard = time.time()
            kept: list[Evidence] = []
            for e in evidence:
                if e.kind != STATUS_KIND or e.node is None:
                    kept.append(e)
                    continue
                report = self.reports.judge(e, status_condition(e.payload), heard, changes)
                if report is not None:
                    store.save_node_reports([report])
                    kept.append(e)
            evidence = kept
        if not evidence:
            return []
        ids = store.add_evidence(evidence)
        if principal.role == "operator":
            for evidence_id, e in zip(ids, evidence, strict=True):
                # the head node's EpilogSlurmctld posts job ends with the operator role
                reported = e.kind in ("operator_report", "xid")
                store.append_audit(
                    f"uid:{principal.uid}",
                    "operator_report" if reported else "job_event",
                    f"node {e.node}" if e.node else f"job {e.job_id}",
                    {"evidence": evidence_id, "kind": e.kind, **dict(e.payload)},
                )
        return ids

    async def _read(self, request: web.Request, fn: Callable[[Store], Any]) -> web.Response:
        try:
            result = await self.ingest.run(self._authorized_read, request, fn)
        except requests.AuthError as err:
            return self._refuse(err)
        if result is None:
            return web.json_response({"error": "not found"}, status=404)
        return web.json_response(result)

    def _authorized_read(self, request: web.Request, fn: Callable[[Store], Any]) -> Any:
        principal = self._principal(request, b"")
        authorize.authorize_read(principal)
        return fn(self.ingest.store())

    async def _write(
        self, request: web.Request, fn: Callable[[Store, requests.Principal, bytes], Any]
    ) -> web.Response:
        """An operator's request: authenticated, authorized (operators only), run with the
        store; ``fn`` raises ValueError for a bad request (400) and returns None for not found
        (404). The loop is woken so the change takes effect at once."""
        body = await request.read()
        try:
            result = await self.ingest.run(self._authorized_write, request, body, fn)
        except requests.AuthError as err:
            return self._refuse(err)
        except ValueError as err:
            return web.json_response({"error": str(err)}, status=400)
        except StoreError as err:
            log.error("operator request not stored: %s", err)
            return web.json_response(
                {"error": f"not stored: {err}"}, status=503, headers={"Retry-After": "5"}
            )
        if result is None:
            return web.json_response({"error": "not found"}, status=404)
        self._wake.set()
        return web.json_response(result)

    def _authorized_write(
        self,
        request: web.Request,
        body: bytes,
        fn: Callable[[Store, requests.Principal, bytes], Any],
    ) -> Any:
        principal = self._principal(request, body)
        if not self.insecure:
            authorize.authorize_operator(principal, self.operators)
        return fn(self.ingest.store(), principal, body)

    async def get_audit(self, request: web.Request) -> web.Response:
        from slurm_recovery.controller.read_api import BadRequest, parse_int

        try:  # out of range (limit=0, after=-1) is the client's mistake: 400, saying which
            after = parse_int("after", request.query.get("after", "0"), 0, 2**62)
            limit = parse_int("limit", request.query.get("limit", "1000"), 1, 10_000)
        except BadRequest as err:
            return web.json_response({"error": str(err)}, status=400)
        return await self._read(
            request,
            lambda store: {
                "audit": [
                    views.audit_json(r) for r in store.audit_rows(after_seq=after, limit=limit)
                ]
            },
        )

    async def healthz(self, request: web.Request) -> web.Response:
        r = self.reconciler
        now = time.time()
        stale_after = max(10.0, 5 * self.config.controller.loop_interval)
        last = r.last_tick if r else None
        ok = last is not None and now - last < stale_after
        policy = r.policy if r else self.policy
        body = {
            "status": "ok" if ok else "degraded",
            "version": __version__,
            "cluster": self.cluster,
            "last_pass": views.iso(last),
            "passes": r.passes if r else 0,
            "node_reads": self.node_listing.reads if self.node_listing else 0,
            # pages in the store's WAL at the last checkpoint (controller/checkpointer.py)
            "wal_pages": self.checkpointer.last.wal_pages if self.checkpointer.last else None,
            "last_error": r.last_error if r else "starting",
            "auth": "off (development only)" if self.insecure else "munge",
            "modes": {  # the policy file's, with the operators' overrides (srecovery mode)
                "default": str(policy.mode),
                **{part: str(mode) for part, mode in policy.partition_modes.items()},
            },
        }
        return web.json_response(body, status=200 if ok else 503)

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        await self._refresh_lemons()
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )

    async def _refresh_lemons(self) -> None:
        """The per-node lemon scores, read from the store at most every LEMON_REFRESH seconds
        (several Prometheus servers scraping cost one read). A store that cannot be read keeps
        the last scores: the scrape still answers."""
        if time.monotonic() < self._lemons_due:
            return
        self._lemons_due = time.monotonic() + LEMON_REFRESH

        def read() -> dict[str, float]:
            return read_api.lemon_scores(self.ingest.store(), self.catalogue, time.time())

        try:
            scores = await self.ingest.run(read)
        except StoreError as exc:
            log.warning("lemon scores for /metrics not read: %s", exc)
            return
        self.metrics.lemons(scores)

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.controller.max_request_bytes, middlewares=[json_errors]
        )
        app.on_startup.append(self.start)
        app.on_cleanup.append(self.stop)
        app.add_routes(
            [
                web.post("/v1/evidence", self.post_evidence),
                web.post("/v1/session", self.post_session),
                web.post(HEARTBEAT_PATH, self.post_heartbeat),
                web.get("/v1/audit", self.get_audit),
                web.get("/healthz", self.healthz),
                web.get("/metrics", self.metrics_endpoint),
                # /v1/incidents, /v1/incidents/ID, /v1/jobs/JOBID, /v1/nodes[/NAME]
                *read_api.routes(self),
                *operator_api.routes(self),
                *audit_api.routes(self),
            ]
        )
        return app


@web.middleware
async def json_errors(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
    """Every refusal is JSON with an ``error`` that says what was wrong, as the handlers' own
    are: aiohttp's unknown path (404), wrong method (405) and body too large (413) included.
    A handler that raises is logged with its traceback and answered 500, never a hang."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        what = {
            404: f"no such endpoint: {request.path} (see docs/controller.md)",
            405: f"{request.method} is not allowed on {request.path}",
            413: "request body larger than controller.max_request_bytes allows",
        }.get(exc.status, exc.reason)
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return web.json_response({"error": what}, status=exc.status, headers=headers)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response({"error": "internal error; see the controller's log"}, status=500)
