"""Detect a hung job: no progress for longer than a deadline that adapts to the job's own pace.

Pure: progress samples of one job attempt, its start time, the time now and the ``[hang]`` policy
in; a :class:`HangFinding` or None out. The deadline is

    clamp(max(interval_multiple x median of the last recent_intervals intervals between progress
              reports, longest_gap_multiple x the longest pause already survived),
          floor, ceiling)

so a job that reports every 2 s is hung after the floor, and one that pauses 4 minutes for every
checkpoint save is not called hung by its next save. Before the first report the job has the
start-up grace. A per-job override replaces the adaptive value, held to the same floor and ceiling.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from slurm_recovery.decide.model import ClusterView, Evidence, Incident, IncidentKind
from slurm_recovery.decide.policy import HangPolicy, Policy

#: Samples this many seconds before the attempt's start still belong to it (clock skew between
#: nodes and the head node, whole-second start times); older ones are a previous attempt's.
START_SLACK = 2.0

#: One progress stream: a rank of the job (rank and node as reported; either may be unknown).
StreamKey = tuple[int | None, str | None]


@dataclass(frozen=True)
class ProgressSample:
    """One progress report: ``step`` was done by ``ts`` (seconds since the epoch).

    From the progress file (every field the API wrote) or a log line (``rank`` when the line
    names it; ``node`` where the caller knows it). ``tokens``/``samples`` are running totals of
    the process; ``step_time`` the rank's own work per step, without waiting for other ranks.
    """

    ts: float
    step: int
    rank: int | None = None
    node: str | None = None
    tokens: float | None = None
    samples: float | None = None
    loss: float | None = None
    step_time: float | None = None

    @property
    def key(self) -> StreamKey:
        return (self.rank, self.node)


@dataclass(frozen=True)
class HangFinding:
    """A job attempt made no progress for longer than its deadline."""

    job_id: int
    #: when a rank last advanced its step; None: no progress at all since the start
    last_progress_at: float | None
    #: seconds without progress allowed (the start-up grace when ``last_progress_at`` is None)
    deadline: float
    #: when the deadline passed: ``last_progress_at`` (or the start) + ``deadline``
    hung_since: float
    #: the highest step any rank reached (None: none)
    last_step: int | None = None
    #: ranks whose last step is behind the others': they stopped first (empty when all stopped
    #: at the same step, or progress does not say which rank it is)
    stalled_ranks: tuple[int, ...] = ()
    #: the nodes of those ranks, where known
    stalled_nodes: frozenset[str] = frozenset()
    #: one line for the incident summary
    summary: str = ""


def attempt_samples(samples: Iterable[ProgressSample], started_at: float) -> list[ProgressSample]:
    """The samples of the attempt that started at ``started_at``, in time order."""
    since = started_at - START_SLACK
    return sorted((s for s in samples if s.ts >= since), key=lambda s: (s.ts, s.step))


@dataclass(frozen=True)
class _Streams:
    """Per stream: when it advanced its step, and the last step it reached."""

    advances: dict[StreamKey, list[float]]
    last_step: dict[StreamKey, int]


def _streams(ordered: Sequence[ProgressSample]) -> _Streams:
    advances: dict[StreamKey, list[float]] = {}
    last_step: dict[StreamKey, int] = {}
    for sample in ordered:
        key = sample.key
        if last_step.get(key) != sample.step or key not in advances:
            advances.setdefault(key, []).append(sample.ts)
        last_step[key] = sample.step
    return _Streams(advances, last_step)


def _intervals(streams: _Streams) -> list[tuple[float, float]]:
    """(end time, length) of every interval between two advances of one stream."""
    pairs = []
    for times in streams.advances.values():
        pairs.extend((later, later - earlier) for earlier, later in itertools.pairwise(times))
    pairs.sort()
    return pairs


def clamp(value: float, policy: HangPolicy) -> float:
    return min(max(value, policy.floor), policy.ceiling)


def progress_deadline(
    samples: Sequence[ProgressSample], policy: HangPolicy, override: float | None = None
) -> float:
    """Seconds without progress after which the job is hung, always in [floor, ceiling].

    ``samples`` in time order, of one attempt. With fewer than two reports of one rank the pace
    is unknown and the deadline is the ceiling. ``override`` (a per-job setting) replaces the
    adaptive value.
    """
    if override is not None:
        return clamp(override, policy)
    pairs = _intervals(_streams(samples))
    if not pairs:
        return policy.ceiling
    recent = [length for _, length in pairs[-policy.recent_intervals :]]
    adaptive = policy.interval_multiple * statistics.median(recent)
    longest = policy.longest_gap_multiple * max(length for _, length in pairs)
    return clamp(max(adaptive, longest), policy)


def detect_hang(
    job_id: int,
    samples: Iterable[ProgressSample],
    started_at: float,
    now: float,
    policy: HangPolicy,
    override: float | None = None,
) -> HangFinding | None:
    """A :class:`HangFinding` when the attempt that started at ``started_at`` made no progress
    for its deadline by ``now``; None while it is within it.

    Progress is a rank reporting a step other than the one it reported before. The job is
    making progress as long as any rank is. Samples older than the start (a previous attempt's)
    are ignored.
    """
    ordered = attempt_samples(samples, started_at)
    if not ordered:
        hung_since = started_at + policy.startup_grace
        if now < hung_since:
            return None
        return HangFinding(
            job_id=job_id,
            last_progress_at=None,
            deadline=policy.startup_grace,
            hung_since=hung_since,
            summary=f"no progress in the {_seconds(policy.startup_grace)} start-up grace",
        )
    streams = _streams(ordered)
    last_progress_at = max(times[-1] for times in streams.advances.values())
    deadline = progress_deadline(ordered, policy, override)
    hung_since = last_progress_at + deadline
    if now < hung_since:
        return None
    top = max(streams.last_step.values())
    behind = [key for key, step in streams.last_step.items() if step < top]
    ranks = tuple(sorted({rank for rank, _ in behind if rank is not None}))
    nodes = frozenset(node for _, node in behind if node is not None)
    summary = f"no progress for {_seconds(now - last_progress_at)} (deadline {_seconds(deadline)}"
    summary += f"); last step {top}"
    if behind:
        who = ", ".join(
            f"rank {rank}" + (f" on {node}" if node else "") if rank is not None else str(node)
            for rank, node in sorted(behind, key=_key_order)
        )
        summary += f"; stopped first: {who}"
    return HangFinding(
        job_id=job_id,
        last_progress_at=last_progress_at,
        deadline=deadline,
        hung_since=hung_since,
        last_step=top,
        stalled_ranks=ranks,
        stalled_nodes=nodes,
        summary=summary,
    )


def _key_order(key: StreamKey) -> tuple[int, int, str]:
    rank, node = key
    return (rank is None, rank if rank is not None else 0, node or "")


def _seconds(value: float) -> str:
    if value >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"


def progress_samples(evidence: Iterable[Evidence], job_id: int) -> list[ProgressSample]:
    """The ``progress`` evidence of one job as samples (``payload.ts`` when the sender knew
    when the step was reached, else when it was observed)."""
    samples = []
    for ev in evidence:
        if ev.kind != "progress" or ev.job_id != job_id:
            continue
        step = ev.payload.get("step")
        if type(step) is not int:
            continue
        ts = ev.payload.get("ts")
        rank = ev.payload.get("rank")
        samples.append(
            ProgressSample(
                ts=float(ts) if type(ts) in (int, float) else ev.observed_at,
                step=step,
                rank=rank if type(rank) is int else None,
                node=ev.node,
            )
        )
    return samples


def hang_incidents(
    view: ClusterView,
    evidence: Sequence[Evidence],
    open_or_done: Collection[tuple[int, int]],
    policy: Policy,
) -> list[Incident]:
    """HANG incidents for running jobs that report progress and stopped making it.

    A job that never reported progress is not judged: without a progress source there is
    nothing to measure (its crashes are still detected)."""
    found = []
    for job_id in sorted(view.jobs):
        job = view.jobs[job_id]
        if job.state != "RUNNING" or (job_id, job.restart_count) in open_or_done:
            continue
        samples = progress_samples(evidence, job_id)
        if not samples:
            continue
        finding = detect_hang(job_id, samples, float(job.start_time), view.now, policy.hang)
        if finding is None:
            continue
        ids = tuple(
            sorted(ev.id for ev in evidence if ev.kind == "progress" and ev.job_id == job_id)
        )[-5:]
        found.append(
            Incident(
                job_id,
                job.restart_count,
                job.submit_time,
                IncidentKind.HANG,
                failed_at=finding.hung_since,
                trigger_ids=ids,
                summary=finding.summary,
            )
        )
    return found
