"""When each node's sidecar was last heard from, what it said, and the silences the loop records.

A sidecar's periodic ``sidecar_status`` is state, not an event: the controller keeps each
node's latest in memory (:class:`LastReports`, written to the store's ``node_reports``, one row
per node, every :data:`FLUSH_INTERVAL`) and stores a status as evidence only when its
condition (contract.status, ``status_condition``, which the sidecar computes too) changed
(the first report, a source that fails or recovers, drops, a restarted or upgraded sidecar, a
GPU lost), so a quiet cluster's store does not grow with nodes x time; a status signed in a
session that changes nothing is answered without leaving the HTTP thread, and a heartbeat that
names the held condition's digest (:meth:`LastReports.beat`) with no status parsed at all
(docs/performance.md).

The ingest also notes every batch a sidecar delivers (:meth:`LastReports.heard`); the
loop reads the table each pass and records a ``sidecar_silent`` finding for each node that runs
a job and has been quiet past ``controller.missing_report_grace`` (:func:`record_silences`,
the rule in ``decide.silence``). A restarted controller takes the nodes whose sidecars reported
in the last day from the store, as heard at its start, so a sidecar that died while the
controller was down is still noticed, and one alive is not flagged for the outage.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import replace
from itertools import islice
from typing import Any

from slurm_recovery.contract.status import STATUS_KIND, condition_digest
from slurm_recovery.decide.model import ClusterView
from slurm_recovery.decide.silence import KIND, SOURCE, jobs_by_node, new_silences
from slurm_recovery.store import Evidence, NodeReport, Store, StoreError

log = logging.getLogger(__name__)

#: How far back the store is read at start (older reports say nothing of a sidecar now).
SEED_HORIZON = 86400.0
#: How often the reports of statuses that changed nothing are written to the store, s (and
#: at shutdown). ``srecovery nodes`` reads them from memory, a change is written at once with
#: its evidence, and a restarted controller counts every node heard in the last day
#: (:data:`SEED_HORIZON`) as heard at its start: a crash loses only readings, which each
#: sidecar sends again within a status period, and the count of reports since the last
#: change. Each flush rewrites every node's row: 11,399 pages (47 MB) of write-ahead log for
#: 10,000 reports of the benchmark's 8-GPU status (a row of about 1.9 KB takes most of a
#: page), copied again into the database by the checkpoint. Every 30 s that was about 270 GB
#: a day written to the disk, and a tenth of the controller's CPU (docs/performance.md, "The
#: event loop").
FLUSH_INTERVAL = 3600.0
#: Reports written in one turn of the ingest thread (a median 24 ms on the bench machine
#: under load): a flush of 10,000 takes 40 turns, and the requests waiting to be stored go
#: between them (one statement of 10,000 held them back up to 1.2 s at 10,000 nodes).
FLUSH_CHUNK = 250


class LastReports:
    """Each node's sidecar as last heard: when (the controller's clock), and its latest status
    report (:class:`NodeReport`). Held in memory and written to the store's ``node_reports``
    when a status changes the node's condition (with that status, stored as evidence) and
    every :data:`FLUSH_INTERVAL` otherwise (:meth:`flush`), so a status that changes nothing
    costs no write at all. The ingest (the HTTP thread's fast path and the ingest thread)
    writes, the loop and the readers read: one lock, held for a dictionary update or copy.

    A change is judged by :meth:`judge` on the ingest thread only, in the transaction that
    stores it, and applied here by :meth:`settle` once that transaction committed; until
    then the node is "in flight" and :meth:`note_unchanged` (the fast path) leaves its
    statuses to the ingest thread, so none is judged against a report about to change."""

    def __init__(self) -> None:
        self._heard: dict[str, float] = {}
        self._reports: dict[str, NodeReport] = {}
        self._dirty: set[str] = set()
        self._in_flight: dict[str, int] = {}
        #: node -> condition_digest of its report's condition (computed at its first heartbeat)
        self._digests: dict[str, str] = {}
        self._lock = threading.Lock()

    def seed(self, store: Store, now: float) -> None:
        """The reports the store holds, and the nodes whose sidecars reported in the last day
        as heard from ``now`` (the controller's start): their silence is counted from it, not
        from their last status. After an outage longer than the grace, every sidecar still
        alive delivers its queue within seconds of the controller's return; one that died
        meanwhile says nothing, and is a finding a grace after the start."""
        since = max(0.0, now - SEED_HORIZON)
        reports = store.node_reports()
        # and the status events of a store written before node_reports (schema 5)
        found = {node for node, r in reports.items() if r.heard_at >= since} | set(
            store.latest_by_node(STATUS_KIND, since=since)
        )
        with self._lock:
            for node, report in reports.items():
                self._reports.setdefault(node, report)
            for node in found:
                self._heard.setdefault(node, now)

    def heard(self, node: str, when: float) -> None:
        with self._lock:
            if when > self._heard.get(node, float("-inf")):
                self._heard[node] = when

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self._heard)

    def reports(self, node: str | None = None) -> dict[str, NodeReport]:
        """node -> its report (all nodes, or only ``node``)."""
        with self._lock:
            if node is None:
                return dict(self._reports)
            report = self._reports.get(node)
            return {node: report} if report is not None else {}

    def note_unchanged(self, status: Evidence, condition: dict[str, Any], heard: float) -> bool:
        """The fast path: True when ``status`` changes nothing about its node (its condition
        equals the current report's, or it is older than that report: a backlog delivered
        late), after making it the node's report. False when it must be judged on the ingest
        thread: the node's first report, a change, or a change of the node still in flight."""
        node = str(status.node)
        with self._lock:
            current = self._reports.get(node)
            if current is None or node in self._in_flight:
                return False
            if status.observed_at < current.observed_at:
                return True
            if condition != current.condition:
                return False
            self._reports[node] = _quiet(current, status, heard)
            self._dirty.add(node)
            return True

    def beat(self, node: str, digest: str, heard: float) -> bool:
        """A heartbeat (contract.status): the node is heard; True when ``digest`` is the
        condition of the report held for it (the report is heard again, its readings kept),
        False when the sidecar should send its status in full: no report held, another one,
        or a change of the node still being stored."""
        with self._lock:
            if heard > self._heard.get(node, float("-inf")):
                self._heard[node] = heard
            current = self._reports.get(node)
            if current is None or node in self._in_flight:
                return False
            held = self._digests.get(node)
            if held is None:
                held = self._digests[node] = condition_digest(current.condition)
            if digest != held:
                return False
            self._reports[node] = replace(
                current, heard_at=max(heard, current.heard_at), reports=current.reports + 1
            )
            self._dirty.add(node)
            return True

    def judge(
        self,
        status: Evidence,
        condition: dict[str, Any],
        heard: float,
        pending: dict[str, NodeReport],
    ) -> NodeReport | None:
        """On the ingest thread: ``status``'s new report when it changes its node's condition
        (against ``pending``, this transaction's changes, then the current report), else None
        after noting it as :meth:`note_unchanged` does. A change goes into ``pending`` and the
        node is in flight until :meth:`settle`."""
        node = str(status.node)
        with self._lock:
            current = pending.get(node) or self._reports.get(node)
            if current is not None and status.observed_at < current.observed_at:
                return None
            if current is not None and condition == current.condition:
                if node in pending:
                    pending[node] = _quiet(current, status, heard)
                else:
                    self._reports[node] = _quiet(current, status, heard)
                    self._dirty.add(node)
                return None
            report = NodeReport(
                node, heard, status.observed_at, heard, 1, condition, status.payload_json
            )
            if node not in pending:
                self._in_flight[node] = self._in_flight.get(node, 0) + 1
            pending[node] = report
            return report

    def settle(self, changes: Iterable[NodeReport], *, committed: bool) -> None:
        """The transaction that stored ``changes`` (:meth:`judge`'s ``pending``, one report
        a node) ended: committed, they are the nodes' reports now; rolled back, the nodes
        keep theirs, and the sender's retry is judged again."""
        with self._lock:
            for report in changes:
                left = self._in_flight.get(report.node, 1) - 1
                if left > 0:
                    self._in_flight[report.node] = left
                else:
                    self._in_flight.pop(report.node, None)
                if committed:
                    self._reports[report.node] = report
                    self._digests.pop(report.node, None)
                    self._dirty.add(report.node)

    def flush(self, store: Store, limit: int | None = None) -> int:
        """Write the reports changed since the last flush to the store (one statement; at
        most ``limit`` of them, the rest stay for the next call); what fails to be written
        stays to be written next time. Returns the rows written."""
        with self._lock:
            nodes = list(self._dirty) if limit is None else list(islice(self._dirty, limit))
            self._dirty.difference_update(nodes)
            dirty = [self._reports[node] for node in nodes]
        try:
            return store.save_node_reports(dirty)
        except StoreError:
            with self._lock:
                self._dirty.update(nodes)
            raise


def _quiet(current: NodeReport, status: Evidence, heard: float) -> NodeReport:
    """``current`` after a status that changed nothing: heard again, the status's readings."""
    return NodeReport(
        current.node,
        max(heard, current.heard_at),
        status.observed_at,
        current.changed_at,
        current.reports + 1,
        current.condition,
        status.payload_json,
    )


def record_silences(
    store: Store,
    view: ClusterView,
    reports: LastReports,
    recorded: dict[str, float],
    grace: float,
) -> list[Evidence]:
    """Store one ``sidecar_silent`` finding for each node newly silent past ``grace`` while it
    runs a job; ``recorded`` (node -> the last report of its recorded silence) is updated so
    that a silence is recorded once. Returns what was stored."""
    silences = new_silences(
        reports.snapshot(), jobs_by_node(view.jobs.values()), recorded, view.now, grace
    )
    if not silences:
        return []
    rows = [
        Evidence(SOURCE, KIND, view.now, node=s.node, payload=s.payload(grace)) for s in silences
    ]
    store.add_evidence(rows, received_at=view.now)
    for s in silences:
        recorded[s.node] = s.last_report
        log.warning(
            "%s's sidecar has sent nothing for %.0fs while it runs job%s %s: a finding about "
            "the node (weak; it drains nothing on its own)",
            s.node,
            s.silent_for,
            "s" if len(s.jobs) > 1 else "",
            ", ".join(str(j) for j in s.jobs),
        )
    return rows
