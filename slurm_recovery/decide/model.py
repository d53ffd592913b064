"""The decision core's vocabulary: Evidence -> Incident -> Verdict -> Advice.

Frozen values only. The controller builds them from the store and Slurm (``scheduler.Job``
and ``scheduler.Node`` are the core's view of the cluster) and hands them to the pure
functions in ``detect``, ``attribute`` and ``advise``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from slurm_recovery.contract.catalogue import FaultClass as FaultClass  # re-exported
from slurm_recovery.scheduler.base import Job, Node


class IncidentKind(StrEnum):
    CRASH = "crash"  # the job ended in failure
    DOOMED = "doomed"  # a fatal fault hit a node of a running job: restart it away now
    APP_FAULT = "app_fault"  # the application reported its own fatal error while running
    HANG = "hang"  # a running job stopped making progress for longer than its deadline
    STRAGGLER = "straggler"  # a running job's throughput dropped and stayed down


class Action(StrEnum):
    """What the advice asks of the scheduler."""

    REQUEUE_EXCLUDE = "requeue_exclude"  # requeue away from the implicated nodes
    REQUEUE = "requeue"  # requeue, no exclusion (unknown cause, bounded)
    STOP = "stop"  # do not restart; cancel if still running; say why
    NONE = "none"  # nothing to do (e.g. not a fault)


class Mode(StrEnum):
    MONITOR = "monitor"  # advice recorded and published, Slurm untouched
    ACT = "act"


#: Evidence sources. Node-scoped sources may speak only about their own node.
SOURCES = ("sidecar", "hook", "operator", "scheduler")


@dataclass(frozen=True)
class Evidence:
    """A fact, timestamped, attributed where known to a node, a GPU and a job.

    Kinds the core understands (payload keys in brackets):
    - ``xid``: an NVIDIA XID on ``node``/``gpu`` [xid: int, message: str]
    - ``operator_report``: an operator says ``node`` is bad [reason: str, xid?: int]
    - ``job_end``: a job ended [state: str, exit_code: int, signal: int]
    - ``progress``: the latest training step a rank of ``job_id`` reached [step: int,
      rank?: int, ts?: float (when it was reached), origin: "log"|"file"; from the progress
      file also tokens?, samples?: float (running totals), step_time?: float (the rank's own
      work per step), loss?: float or "nan"/"inf"/"-inf", done?: true (the rank's process
      ended after ``step``)]. ``node`` is where the rank runs
      for origin "file"; for "log" it is only the node that read the job's output
    - ``log_signature``: a recognised log line for ``job_id`` [signature: str,
      fault_class: str, blame_node: bool, text: str] (the signals issue produces these)
    - ``node_state``: what Slurm showed for ``node`` (source ``scheduler``) [state: str,
      flags: list[str], reason: str]; a DOWN/FAIL/NOT_RESPONDING node of a job that ended
      NODE_FAIL is implicated by it (without it, no node is: nodes need evidence)
    - ``health_check_drain``: the site's health check (NHC) drained ``node`` (source
      ``scheduler``, recorded by the controller when Slurm shows it) [reason: str, state: str];
      weak system evidence against the node, never a reason to stop a running job
    Unknown kinds are kept and ignored by the core.
    """

    id: int
    source: str
    kind: str
    observed_at: float
    node: str | None = None
    gpu: int | None = None
    job_id: int | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterView:
    """What Slurm shows now, plus what the tool drained recently (for the blast radius)."""

    now: float
    jobs: Mapping[int, Job]
    nodes: Mapping[str, Node]
    #: node -> when the tool drained it (only drains still in force, any age)
    drained_by_tool: Mapping[str, float] = field(default_factory=dict)
    #: nodes per partition (the blast radius's percentages); None: counted from ``nodes``
    #: when needed. The loop counts once per node listing, not once per incident.
    partition_sizes: Mapping[str, int] | None = None
    #: node -> its reason, for the nodes Slurm shows drained by the site's health check
    #: (``controller.health_check_drain_prefixes``): kept out of a job's restarts while drained
    health_check_drained: Mapping[str, str] = field(default_factory=dict)
    #: whether ``nodes`` is Slurm's whole listing: placement (decide/placement.py) is judged
    #: only then, never from a view made of the job's own nodes (explain-log, replay without
    #: a listing), where every partition would look as small as the job
    whole_listing: bool = True


def by_job(evidence: Iterable[Evidence]) -> dict[int, list[Evidence]]:
    """Each job's evidence, in the order given. The per-job rules (crash, hang, straggler,
    log verdicts) read only their job's: indexed once per pass, a pass costs jobs + evidence
    instead of jobs x evidence (bench/decision_scale.py)."""
    found: dict[int, list[Evidence]] = {}
    for ev in evidence:
        if ev.job_id is not None:
            found.setdefault(ev.job_id, []).append(ev)
    return found


def partition_sizes(nodes: Iterable[Node]) -> dict[str, int]:
    """How many of ``nodes`` each partition has."""
    sizes: dict[str, int] = {}
    for node in nodes:
        for partition in node.partitions:
            sizes[partition] = sizes.get(partition, 0) + 1
    return sizes


@dataclass(frozen=True)
class Incident:
    """A job attempt in trouble. ``restart_count``/``submit_time`` pin the attempt."""

    job_id: int
    restart_count: int
    submit_time: int
    kind: IncidentKind
    failed_at: float
    trigger_ids: tuple[int, ...] = ()  # evidence that opened it
    summary: str = ""
    #: (node, why) the detector itself points at (a straggler's slow nodes); attribution
    #: weighs them with the evidence among ``trigger_ids``
    suspects: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Verdict:
    """Attribution: the class, the implicated nodes and GPUs, how sure, and on what."""

    fault_class: FaultClass
    nodes: frozenset[str] = frozenset()
    gpus: frozenset[tuple[str, int]] = frozenset()
    confidence: float = 0.0
    evidence_ids: tuple[int, ...] = ()
    cause: str = ""  # short, for reasons: "xid 79 (GPU fell off the bus)"


@dataclass(frozen=True)
class Advice:
    """What should happen for an incident, and why. ``rule`` names the policy key that decided."""

    action: Action
    mode: Mode
    reason: str
    rule: str
    exclude: frozenset[str] = frozenset()
    #: the tool's own earlier exclusions of nodes back in service: dropped from this attempt
    unexclude: frozenset[str] = frozenset()
    drain: frozenset[str] = frozenset()
    needs_operator: bool = False
    verdict: Verdict | None = None
