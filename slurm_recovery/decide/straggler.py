"""Detect a straggler: a sustained throughput drop against the job's own recent baseline.

Pure: progress samples of one job attempt, node evidence and the ``[straggler]`` policy in; a
:class:`StragglerFinding` or None out. Throughput is measured over consecutive ``rate_interval``
periods; the job straggles when every period since the drop began, for ``min_duration``, stayed
``drop_percent`` below the median of the ``baseline_window`` before it. A node is named only when
its own evidence explains the drop (GPU throttling or a link downgrade on it, or its ranks' own
work per step lagging the other ranks'); otherwise the finding blames no node.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurm_recovery.decide.hang import (
    ProgressSample,
    StreamKey,
    all_done,
    attempt_samples,
    progress_samples,
)
from slurm_recovery.decide.model import ClusterView, Evidence, Incident, IncidentKind, by_job
from slurm_recovery.decide.policy import Policy, StragglerPolicy

#: ``gpu_finding`` checks (sidecar/base.py GPU_CHECKS) that slow a GPU down: low clocks from
#: throttling, a PCIe link below its maximum, an NVLink down (traffic falls back to PCIe).
SLOWDOWN_CHECKS = frozenset(
    {
        "throttle_hw_slowdown",
        "throttle_thermal",
        "throttle_power_brake",
        "pcie_link_downgrade",
        "nvlink_down",
    }
)

#: A baseline needs at least this many throughput periods.
MIN_BASELINE_POINTS = 3


@dataclass(frozen=True)
class RatePoint:
    """Throughput ``rate`` (units per second) from ``start`` to ``end``."""

    start: float
    end: float
    rate: float


@dataclass(frozen=True)
class Drop:
    """A sustained drop: since ``onset`` the rate stayed at most ``current`` (time-weighted mean
    over the drop) against a ``baseline`` median before it."""

    onset: float
    last: float
    baseline: float
    current: float

    @property
    def percent(self) -> float:
        return 100.0 * (1.0 - self.current / self.baseline)

    @property
    def duration(self) -> float:
        return self.last - self.onset


@dataclass(frozen=True)
class StragglerFinding:
    job_id: int
    drop_percent: float
    onset: float
    baseline_rate: float
    current_rate: float
    #: what the rates count: "tokens", "samples" or "steps" (per second)
    unit: str
    #: nodes whose own evidence explains the drop; empty: a job-level finding
    nodes: frozenset[str] = frozenset()
    #: ranks whose own work per step lags the others'
    lagging_ranks: tuple[int, ...] = ()
    evidence_ids: tuple[int, ...] = ()
    summary: str = ""
    #: (node, why) for each node in ``nodes``, in node order
    reasons: tuple[tuple[str, str], ...] = ()


def metric(samples: Iterable[ProgressSample]) -> str:
    """What throughput is counted in: tokens if reported, else samples, else steps."""
    seen = list(samples)
    if any(s.tokens is not None for s in seen):
        return "tokens"
    if any(s.samples is not None for s in seen):
        return "samples"
    return "steps"


def _count(sample: ProgressSample, unit: str) -> float | None:
    if unit == "tokens":
        return sample.tokens
    if unit == "samples":
        return sample.samples
    return float(sample.step)


def _reference(ordered: Sequence[ProgressSample]) -> list[ProgressSample]:
    """The stream the job's throughput is read from: the one with the most reports (in
    synchronous training every rank runs at the job's pace), lowest rank on a tie."""
    streams: dict[StreamKey, list[ProgressSample]] = {}
    for sample in ordered:
        streams.setdefault(sample.key, []).append(sample)
    key = min(
        streams,
        key=lambda k: (-len(streams[k]), k[0] is None, k[0] or 0, k[1] or ""),
    )
    return streams[key]


def throughput(
    samples: Iterable[ProgressSample], started_at: float, interval: float, unit: str | None = None
) -> tuple[str, list[RatePoint]]:
    """The job's throughput as rate points, at most one per ``interval`` period since the start.

    A point spans from the last report before its period to the last report in it, so periods
    without a report add none (sparse log progress is averaged, not read as zero), and a counter
    that goes back (the process restarted) starts over without a point.
    """
    ordered = attempt_samples(samples, started_at)
    unit = unit or metric(ordered)
    if not ordered:
        return unit, []
    points: list[RatePoint] = []
    previous: tuple[float, float] | None = None
    last_period: int | None = None
    pending: tuple[float, float] | None = None  # latest report in the current period
    for sample in _reference(ordered):
        count = _count(sample, unit)
        if count is None:
            continue
        period = int((sample.ts - started_at) // interval)
        if last_period is not None and period != last_period and pending is not None:
            previous = _close(points, previous, pending)
            pending = None
        last_period = period
        if previous is None:
            previous = (sample.ts, count)
            continue
        if count < (pending or previous)[1]:
            previous, pending = (sample.ts, count), None  # the counter started over
            continue
        pending = (sample.ts, count)
    if pending is not None:
        _close(points, previous, pending)
    return unit, points


def _close(
    points: list[RatePoint], previous: tuple[float, float] | None, latest: tuple[float, float]
) -> tuple[float, float]:
    if previous is not None and latest[0] > previous[0]:
        points.append(
            RatePoint(previous[0], latest[0], (latest[1] - previous[1]) / (latest[0] - previous[0]))
        )
    return latest


def find_drop(points: Sequence[RatePoint], policy: StragglerPolicy) -> Drop | None:
    """The earliest onset of a drop that lasts to the latest point, if it lasted ``min_duration``.

    Every point from the onset on is at most ``(1 - drop_percent/100)`` of the baseline, the
    median of the points in the ``baseline_window`` before the onset (at least
    :data:`MIN_BASELINE_POINTS` of them).
    """
    points = sorted(points, key=lambda p: p.end)
    if len(points) <= MIN_BASELINE_POINTS:
        return None
    ends = [p.end for p in points]
    rates = [p.rate for p in points]
    keep = 1.0 - policy.drop_percent / 100.0
    highest = max(rates)
    run_max = 0.0
    found: tuple[int, float] | None = None
    for k in range(len(points) - 1, MIN_BASELINE_POINTS - 1, -1):
        run_max = max(run_max, rates[k])
        if run_max > keep * highest:
            break  # no baseline can be high enough any more
        onset = points[k].start
        first = bisect.bisect_right(ends, onset - policy.baseline_window, 0, k)
        last = bisect.bisect_right(ends, onset, first, k)
        if last - first < MIN_BASELINE_POINTS:
            continue
        baseline = statistics.median(rates[first:last])
        if baseline > 0 and run_max <= keep * baseline:
            found = (k, baseline)
    if found is None:
        return None
    k, baseline = found
    run = points[k:]
    onset, last = run[0].start, run[-1].end
    if last - onset < policy.min_duration:
        return None
    span = sum(p.end - p.start for p in run)
    current = sum(p.rate * (p.end - p.start) for p in run) / span if span > 0 else run[-1].rate
    return Drop(onset=onset, last=last, baseline=baseline, current=current)


def lagging_ranks(
    samples: Iterable[ProgressSample], since: float, until: float, policy: StragglerPolicy
) -> list[StreamKey]:
    """Ranks whose own work per step (median ``step_time`` from ``since`` to ``until``) is
    ``rank_lag_percent`` longer than the median of the other ranks'."""
    times: dict[StreamKey, list[float]] = {}
    for sample in samples:
        if sample.step_time is not None and since <= sample.ts <= until and sample.step_time >= 0:
            times.setdefault(sample.key, []).append(sample.step_time)
    medians = {key: statistics.median(values) for key, values in times.items()}
    if len(medians) < 2:
        return []
    factor = 1.0 + policy.rank_lag_percent / 100.0
    lagging = []
    for key, value in medians.items():
        others = statistics.median(v for k, v in medians.items() if k != key)
        if value > factor * others:
            lagging.append(key)
    return sorted(lagging, key=lambda k: (k[0] is None, k[0] or 0, k[1] or ""))


def slowdown_evidence(
    evidence: Iterable[Evidence],
    nodes: Collection[str] | None,
    onset: float,
    until: float,
    lead: float = 0.0,
) -> list[Evidence]:
    """``gpu_finding`` evidence of a slowdown (:data:`SLOWDOWN_CHECKS`) on one of ``nodes``
    (any node when None) observed from ``lead`` seconds before ``onset`` to ``until``, unless the
    same check on the same GPU was cleared (or the GPU reset) after it and before the onset: a
    condition that began well before the drop, or ended before it, does not explain it."""
    since = onset - lead
    findings = [
        ev
        for ev in evidence
        if ev.kind == "gpu_finding" and ev.node is not None and (nodes is None or ev.node in nodes)
    ]
    cleared = [
        ev
        for ev in findings
        if ev.payload.get("cleared") is True or ev.payload.get("check") == "gpu_reset"
    ]
    found = []
    for ev in findings:
        if ev.payload.get("check") not in SLOWDOWN_CHECKS or ev.payload.get("cleared") is True:
            continue
        if not since <= ev.observed_at <= until:
            continue
        if any(
            clear.node == ev.node
            and (clear.gpu is None or clear.gpu == ev.gpu)
            and clear.payload.get("check") in (ev.payload.get("check"), "gpu_reset")
            and ev.observed_at < clear.observed_at <= onset
            for clear in cleared
        ):
            continue
        found.append(ev)
    return sorted(found, key=lambda ev: (ev.observed_at, ev.id))


def detect_straggler(
    job_id: int,
    samples: Iterable[ProgressSample],
    started_at: float,
    policy: StragglerPolicy,
    evidence: Iterable[Evidence] = (),
    job_nodes: Collection[str] | None = None,
    rank_nodes: Mapping[int, str] | None = None,
) -> StragglerFinding | None:
    """A :class:`StragglerFinding` when the attempt's throughput dropped for ``min_duration``.

    ``evidence``: node evidence (``gpu_finding`` events) from the job's nodes ``job_nodes``;
    ``rank_nodes``: rank -> node (Slurm's task layout) for samples that carry no node.
    """
    ordered = attempt_samples(samples, started_at)
    if ordered and all_done(ordered):
        return None  # the job finished its work: its rate falls to nothing, as it should
    ordered = [s for s in ordered if not s.done]  # an end record carries no work
    unit, points = throughput(ordered, started_at, policy.rate_interval)
    drop = find_drop(points, policy)
    if drop is None:
        return None
    slow = slowdown_evidence(evidence, job_nodes, drop.onset, drop.last, policy.rate_interval)
    lagging = lagging_ranks(ordered, drop.onset, drop.last, policy)
    why: dict[str, list[str]] = {}
    for ev in slow:
        if ev.node is not None:
            gpu = f" (GPU {ev.gpu})" if ev.gpu is not None else ""
            why.setdefault(ev.node, []).append(f"{ev.payload.get('check')}{gpu}")
    ranks = []
    for rank, node in lagging:
        where = node
        if rank is not None:
            where = where or (rank_nodes or {}).get(rank)
            ranks.append(rank)
        if where:
            why.setdefault(where, []).append(
                f"rank {rank} lags the other ranks" if rank is not None else "lags the others"
            )
    summary = (
        f"throughput down {drop.percent:.0f}% ({_rate(drop.current)} vs baseline "
        f"{_rate(drop.baseline)} {unit}/s) for {drop.duration:.0f} s"
    )
    reasons = [f"{ev.payload.get('check')} on {ev.node}" for ev in slow]
    reasons += [
        f"rank {rank} lags the other ranks" + (f" on {node}" if node else "")
        for rank, node in lagging
        if rank is not None
    ]
    summary += "; " + ", ".join(dict.fromkeys(reasons)) if reasons else "; no node explains it"
    return StragglerFinding(
        job_id=job_id,
        drop_percent=drop.percent,
        onset=drop.onset,
        baseline_rate=drop.baseline,
        current_rate=drop.current,
        unit=unit,
        nodes=frozenset(why),
        lagging_ranks=tuple(ranks),
        evidence_ids=tuple(ev.id for ev in slow),
        summary=summary,
        reasons=tuple((node, ", ".join(dict.fromkeys(why[node]))) for node in sorted(why)),
    )


def straggler_incidents(
    view: ClusterView,
    evidence: Sequence[Evidence],
    open_or_done: Collection[tuple[int, int]],
    policy: Policy,
) -> list[Incident]:
    """STRAGGLER incidents for running jobs whose throughput dropped for ``min_duration``.

    One per job attempt (``open_or_done`` holds the attempts already reported). The incident's
    ``suspects`` are the nodes the finding names; its ``trigger_ids`` the slowdown evidence and
    the job's latest progress reports."""
    found = []
    of_job = by_job(evidence)
    findings = [ev for ev in evidence if ev.kind == "gpu_finding"]
    for job_id in sorted(view.jobs):
        job = view.jobs[job_id]
        if job.state != "RUNNING" or (job_id, job.restart_count) in open_or_done:
            continue
        own = of_job.get(job_id, [])
        samples = progress_samples(own, job_id, job.nodes, job.restart_count)
        if not samples:
            continue
        node_evidence = [ev for ev in findings if ev.node in job.nodes]
        finding = detect_straggler(
            job_id,
            samples,
            float(job.start_time),
            policy.straggler,
            node_evidence,
            job_nodes=job.nodes,
        )
        if finding is None:
            continue
        progress = sorted(ev.id for ev in own if ev.kind == "progress")
        found.append(
            Incident(
                job_id,
                job.restart_count,
                job.submit_time,
                IncidentKind.STRAGGLER,
                failed_at=finding.onset,
                trigger_ids=tuple(sorted({*finding.evidence_ids, *progress[-5:]})),
                summary=finding.summary,
                suspects=finding.reasons,
            )
        )
    return found


def _rate(value: float) -> str:
    return f"{value:.3g}"
