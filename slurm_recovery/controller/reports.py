"""When each node's sidecar was last heard from, what it said, and the silences the loop records.

A sidecar's periodic ``sidecar_status`` is state, not an event: the ingest keeps each node's
latest in the store's ``node_reports`` (one row per node, replaced in place) and stores a status
as evidence only when its :func:`status_condition` changed (the first report, a source that
fails or recovers, drops, a restarted or upgraded sidecar, a GPU lost), so a quiet cluster's
store does not grow with nodes x time (docs/performance.md).

The ingest also notes every batch a sidecar delivers (:meth:`LastReports.heard`); the
loop reads the table each pass and records a ``sidecar_silent`` finding for each node that runs
a job and has been quiet past ``controller.missing_report_grace`` (:func:`record_silences`,
the rule in ``decide.silence``). A restarted controller takes the nodes whose sidecars reported
in the last day from the store, as heard at its start, so a sidecar that died while the
controller was down is still noticed, and one alive is not flagged for the outage.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

from slurm_recovery.decide.model import ClusterView
from slurm_recovery.decide.silence import KIND, SOURCE, jobs_by_node, new_silences
from slurm_recovery.store import Evidence, Store

log = logging.getLogger(__name__)

#: The kind every sidecar sends at least once a ``sidecar.status_interval``.
STATUS_KIND = "sidecar_status"
#: How far back the store is read at start (older reports say nothing of a sidecar now).
SEED_HORIZON = 86400.0
#: Per-GPU readings that say what a GPU is, not how busy or warm it is this minute.
GPU_CONDITION_KEYS = ("lost", "conditions")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def source_condition(text: object) -> str:
    """A source's status line as a condition: "ok" for any line that starts so (its counts,
    "ok, following 3 job(s)", are readings), else the problem with its numbers blanked
    ("degraded: nvmlDeviceGetCount has not returned for N s")."""
    line = str(text)
    if line == "ok" or line.startswith("ok,"):
        return "ok"
    return _NUMBER.sub("N", line)


def status_condition(payload: Mapping[str, Any]) -> dict[str, Any]:
    """What a ``sidecar_status`` is judged on for change: which sidecar (version, start), its
    losses (drops, dead letters, bad spool files), each source ok or what is wrong, the open
    fatal conditions, whether delivery fails, and which GPUs it sees (lost or with open
    conditions). Not the readings that move every minute: queue length, delivered counts,
    temperatures, power, utilization, memory."""
    delivery = payload.get("delivery")
    last_error = delivery.get("last_error") if isinstance(delivery, Mapping) else ""
    sources = payload.get("sources")
    gpus = payload.get("gpus")
    condition: dict[str, Any] = {
        key: payload.get(key)
        for key in ("version", "started_at", "dropped", "dead_lettered", "spool_bad", "fatal")
    }
    condition["sources"] = (
        {str(name): source_condition(text) for name, text in sources.items()}
        if isinstance(sources, Mapping)
        else None
    )
    condition["delivery_failing"] = bool(last_error)
    if isinstance(gpus, Mapping):
        condition["gpus"] = {
            str(index): {k: v for k, v in readings.items() if k in GPU_CONDITION_KEYS}
            if isinstance(readings, Mapping)
            else None
            for index, readings in gpus.items()
        }
    return condition


class LastReports:
    """node -> when its sidecar was last heard from (the controller's clock). Written by the
    ingest thread, read by the loop's: one lock, held for a dictionary update or copy."""

    def __init__(self) -> None:
        self._heard: dict[str, float] = {}
        self._lock = threading.Lock()

    def seed(self, store: Store, now: float) -> None:
        """The nodes whose sidecars reported in the last day, as heard from ``now``
        (the controller's start): their silence is counted from it, not from their last
        status. After an outage longer than the grace, every sidecar still alive delivers its
        queue within seconds of the controller's return; one that died meanwhile says nothing,
        and is a finding a grace after the start."""
        since = max(0.0, now - SEED_HORIZON)
        # node_reports; and the status events of a store written before it (schema 5)
        found = set(store.node_reports(since=since)) | set(
            store.latest_by_node(STATUS_KIND, since=since)
        )
        with self._lock:
            for node in found:
                self._heard.setdefault(node, now)

    def heard(self, node: str, when: float) -> None:
        with self._lock:
            if when > self._heard.get(node, float("-inf")):
                self._heard[node] = when

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self._heard)


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
