"""Prometheus metrics of the controller, on its own registry (served at ``/metrics``).

The alert rules (packaging/prometheus/srecovery-rules.yml) and the Grafana dashboard
(packaging/grafana/) use these names; docs/monitoring.md lists them. Most are set by the loop
and the ingest path as things happen; :class:`ReadAtScrape` reads the watchdog's heartbeat and
the store's disk when Prometheus scrapes, so they are as fresh as the scrape even when the loop
is stuck.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from slurm_recovery.controller.views import LEMON_THRESHOLD
from slurm_recovery.decide.advise import NEEDS_OPERATOR_RULES
from slurm_recovery.watchdog import read_heartbeat, stale_after

#: The refusals of evidence, each a series from 0 (so that rate() sees the first): 400 malformed,
#: 401 credentials, 403 role, 429 queue full, 503 store or munged unavailable.
REJECT_STATUSES = ("400", "401", "403", "429", "503")
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.incidents = Counter(
            "srecovery_incidents",
            "Incidents opened, by verdict class",
            ["fault_class"],
            registry=r,
        )
        self.detection = Histogram(
            "srecovery_detection_seconds",
            "Failure to incident recorded",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.action = Histogram(
            "srecovery_action_seconds",
            "Incident recorded to job released (verified)",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.end_to_end = Histogram(
            "srecovery_end_to_end_seconds",
            "Failure to job running again",
            registry=r,
            buckets=_LATENCY_BUCKETS,
        )
        self.actions = Counter(
            "srecovery_actions",
            "Scheduler steps, by step and result",
            ["step", "result"],
            registry=r,
        )
        self.nodes_drained = Gauge(
            "srecovery_nodes_drained_by_tool",
            "Nodes drained by slurm-recovery, still drained",
            registry=r,
        )
        self.nodes_excluded = Gauge(
            "srecovery_nodes_excluded",
            "Distinct nodes excluded by slurm-recovery from jobs still pending or running",
            registry=r,
        )
        self.ingest_events = Counter(
            "srecovery_ingest_events", "Evidence events accepted", registry=r
        )
        self.heartbeats = Counter(
            "srecovery_heartbeats",
            "Sidecar heartbeats answered: held (its report unchanged) or wanted (send it in full)",
            ["answer"],
            registry=r,
        )
        for answer in ("held", "wanted"):
            self.heartbeats.labels(answer)
        self.heartbeat_datagrams = Counter(
            "srecovery_heartbeat_datagrams",
            "Heartbeat datagrams (UDP): answered (counted in srecovery_heartbeats too), refused "
            "(a session refusal, counted in srecovery_ingest_rejects), or dropped unanswered "
            "(not a heartbeat)",
            ["outcome"],
            registry=r,
        )
        for outcome in ("answered", "refused", "dropped"):
            self.heartbeat_datagrams.labels(outcome)
        self.ingest_rejects = Counter(
            "srecovery_ingest_rejects",
            "Requests rejected, by HTTP status",
            ["status"],
            registry=r,
        )
        for status in REJECT_STATUSES:
            self.ingest_rejects.labels(status)
        self.ingest_latency = Histogram(
            "srecovery_ingest_seconds",
            "Time to verify and store one evidence batch",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
        )
        self.needs_operator = Counter(
            "srecovery_needs_operator",
            "Advice that needs an operator (blast radius reached, exclusion cap, ...), by rule",
            ["rule"],
            registry=r,
        )
        for rule in NEEDS_OPERATOR_RULES:  # each series from 0, so increase() sees the first
            self.needs_operator.labels(rule)
        self.jobs_unplaceable = Gauge(
            "srecovery_jobs_unplaceable",
            "Jobs the tool requeued that cannot start: too few usable nodes in their partition",
            registry=r,
        )
        self.slurm_unreachable = Counter(
            "srecovery_slurm_unreachable",
            "Passes skipped because slurmctld did not answer",
            registry=r,
        )
        self.slurm_unreachable_passes = Gauge(
            "srecovery_slurm_unreachable_passes",
            "Passes in a row that slurmctld did not answer (0 once one does)",
            registry=r,
        )
        self.last_good_pass = Gauge(
            "srecovery_last_good_pass_timestamp_seconds",
            "When the last pass that read Slurm and the store without an error ended",
            registry=r,
        )
        self.lemon_score = Gauge(
            "srecovery_node_lemon_score",
            "A node's repeat-offender score (nodes with a score above 0; docs/cli.md, Nodes)",
            ["node"],
            registry=r,
        )
        self.lemon_threshold = Gauge(
            "srecovery_lemon_threshold", "The lemon score at which a node is a lemon", registry=r
        )
        self.lemon_threshold.set(LEMON_THRESHOLD)

    def pass_done(self, *, unreachable: bool, good: bool, now: float) -> None:
        """After each pass: slurmctld did not answer it (``unreachable``), or it ended without
        any error (``good``)."""
        if unreachable:
            self.slurm_unreachable.inc()
            self.slurm_unreachable_passes.inc()
            return
        self.slurm_unreachable_passes.set(0)
        if good:
            self.last_good_pass.set(now)

    def lemons(self, scores: Mapping[str, float]) -> None:
        """Replace the per-node lemon scores (nodes no longer scored drop out)."""
        self.lemon_score.clear()
        for node, score in scores.items():
            self.lemon_score.labels(node).set(score)

    def incident_opened(self, fault_class: str, detection_seconds: float) -> None:
        self.incidents.labels(fault_class).inc()
        self.detection.observe(max(0.0, detection_seconds))

    def action_done(self, step: str, result: str) -> None:
        self.actions.labels(step, result).inc()

    def recovered(self, milestones: Mapping[str, float]) -> None:
        if "detected" in milestones and "released" in milestones:
            self.action.observe(max(0.0, milestones["released"] - milestones["detected"]))
        if "failure" in milestones and "running_again" in milestones:
            self.end_to_end.observe(max(0.0, milestones["running_again"] - milestones["failure"]))


class ReadAtScrape(Collector):
    """Metrics read from files at each scrape: the watchdog's heartbeat (``spool``) and the
    free space of the file system holding the store (``store``). A file that cannot be read
    leaves its metric out (or, for the heartbeat, at 0: never seen) rather than failing the
    scrape."""

    def __init__(self, store: Path, spool: Path) -> None:
        self.store = store
        self.spool = spool

    def collect(self) -> Iterator[GaugeMetricFamily]:
        beat = read_heartbeat(self.spool)
        yield GaugeMetricFamily(
            "srecovery_watchdog_heartbeat_timestamp_seconds",
            "When the watchdog last swept (0: no heartbeat in watchdog.spool_dir)",
            value=float(beat["ts"]) if beat else 0.0,
        )
        yield GaugeMetricFamily(
            "srecovery_watchdog_heartbeat_stale_after_seconds",
            "Age at which the heartbeat is stale (3 sweep intervals, at least 60 s)",
            value=stale_after(beat),
        )
        try:
            fs = os.statvfs(self.store.parent)
        except OSError:
            return
        yield GaugeMetricFamily(
            "srecovery_store_filesystem_free_bytes",
            "Free space for the controller's user on the file system holding the store",
            value=float(fs.f_bavail * fs.f_frsize),
        )
        yield GaugeMetricFamily(
            "srecovery_store_filesystem_size_bytes",
            "Size of the file system holding the store",
            value=float(fs.f_blocks * fs.f_frsize),
        )
        size = 0
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):  # no WAL yet, or a file just renamed
                size += Path(f"{self.store}{suffix}").stat().st_size
        yield GaugeMetricFamily(
            "srecovery_store_bytes",
            "Size of the store (database, WAL and shared memory)",
            value=float(size),
        )
