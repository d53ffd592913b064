"""When each node's sidecar was last heard from, and the silences the loop records.

The ingest (``service``) notes every batch a sidecar delivers (:meth:`LastReports.heard`); the
loop reads the table each pass and records a ``sidecar_silent`` finding for each node that runs
a job and has been quiet past ``controller.missing_report_grace`` (:func:`record_silences`,
the rule in ``decide.silence``). A restarted controller takes the nodes whose sidecars reported
in the last day from the store, as heard at its start, so a sidecar that died while the
controller was down is still noticed, and one alive is not flagged for the outage.
"""

from __future__ import annotations

import logging
import threading

from slurm_recovery.decide.model import ClusterView
from slurm_recovery.decide.silence import KIND, SOURCE, jobs_by_node, new_silences
from slurm_recovery.store import Evidence, Store

log = logging.getLogger(__name__)

#: The kind every sidecar sends at least once a ``sidecar.status_interval``.
STATUS_KIND = "sidecar_status"
#: How far back the store is read at start (older reports say nothing of a sidecar now).
SEED_HORIZON = 86400.0


class LastReports:
    """node -> when its sidecar was last heard from (the controller's clock). Written by the
    ingest thread, read by the loop's: one lock, held for a dictionary update or copy."""

    def __init__(self) -> None:
        self._heard: dict[str, float] = {}
        self._lock = threading.Lock()

    def seed(self, store: Store, now: float) -> None:
        """The nodes whose sidecars stored a status in the last day, as heard from ``now``
        (the controller's start): their silence is counted from it, not from their last
        status. After an outage longer than the grace, every sidecar still alive delivers its
        queue within seconds of the controller's return; one that died meanwhile says nothing,
        and is a finding a grace after the start."""
        found = store.latest_by_node(STATUS_KIND, since=max(0.0, now - SEED_HORIZON))
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
