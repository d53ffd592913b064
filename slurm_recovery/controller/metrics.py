"""Prometheus metrics of the controller, on its own registry (served at ``/metrics``)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        self.ingest_rejects = Counter(
            "srecovery_ingest_rejects",
            "Requests rejected, by HTTP status",
            ["status"],
            registry=r,
        )
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
        self.slurm_unreachable = Counter(
            "srecovery_slurm_unreachable",
            "Passes skipped because slurmctld did not answer",
            registry=r,
        )

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
