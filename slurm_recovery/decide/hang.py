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
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurm_recovery.decide.joblogs import judge_job_log, of_attempt, rank_node
from slurm_recovery.decide.model import ClusterView, Evidence, Incident, IncidentKind, by_job
from slurm_recovery.decide.policy import HangPolicy, Policy
from slurm_recovery.scheduler.base import Job
from slurm_recovery.signals.flight_recorder import (
    FlightRecorderError,
    stuck_collective,
    trace_from_payload,
)
from slurm_recovery.signals.progress import ProgressSample, StreamKey

#: Samples this many seconds before the attempt's start still belong to it (clock skew between
#: nodes and the head node, whole-second start times); older ones are a previous attempt's.
START_SLACK = 2.0

#: One progress stream: a rank of the job (rank and node as reported; either may be unknown).


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


def all_done(ordered: Sequence[ProgressSample]) -> bool:
    """Whether the latest sample of every stream in ``ordered`` (time order) is ``done``."""
    latest = {sample.key: sample.done for sample in ordered}
    return bool(latest) and all(latest.values())


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
    are ignored. When every rank's latest report says its process ended (``done``), the job
    has finished its work and is only tearing down: not hung, however long that takes.
    """
    ordered = attempt_samples(samples, started_at)
    if ordered and all_done(ordered):
        return None
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


def detect_gpu_idle(
    job_id: int,
    activity: Iterable[Evidence],
    started_at: float,
    now: float,
    policy: HangPolicy,
) -> HangFinding | None:
    """A :class:`HangFinding` when the attempt's GPUs were busy and are now idle on every node
    that reported ``gpu_activity``, for ``policy.gpu_idle``; None otherwise.

    The node whose GPUs went idle first is named as where the job stopped first."""
    since = started_at - START_SLACK
    latest: dict[str, Evidence] = {}
    ever_busy = False
    for ev in sorted(activity, key=lambda e: (e.observed_at, e.id)):
        if ev.kind != "gpu_activity" or ev.node is None or ev.observed_at < since:
            continue
        busy = ev.payload.get("busy")
        if type(busy) is not bool:
            continue
        ever_busy |= busy
        latest[ev.node] = ev
    if not ever_busy or not latest or any(ev.payload["busy"] for ev in latest.values()):
        return None
    idle_since = max(ev.observed_at for ev in latest.values())
    hung_since = idle_since + policy.gpu_idle
    if now < hung_since:
        return None
    first = min(latest.values(), key=lambda ev: (ev.observed_at, ev.node or ""))
    nodes = sorted(latest)
    summary = (
        f"GPUs idle on {', '.join(nodes)} for {_seconds(now - idle_since)} (busy before; "
        f"deadline {_seconds(policy.gpu_idle)}); no step progress reported; idle first: "
        f"{first.node}"
    )
    return HangFinding(
        job_id=job_id,
        last_progress_at=idle_since,
        deadline=policy.gpu_idle,
        hung_since=hung_since,
        stalled_nodes=frozenset({first.node}) if first.node and len(latest) > 1 else frozenset(),
        summary=summary,
    )


def _key_order(key: StreamKey) -> tuple[int, int, str]:
    rank, node = key
    return (rank is None, rank if rank is not None else 0, node or "")


def _seconds(value: float) -> str:
    if value >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"


def _number(value: object) -> float | None:
    if type(value) in (int, float):
        return float(value)  # type: ignore[arg-type]
    if value in ("nan", "inf", "-inf"):
        return float(value)  # type: ignore[arg-type]
    return None


def progress_samples(
    evidence: Iterable[Evidence],
    job_id: int,
    job_nodes: Sequence[str] = (),
    restart_count: int | None = None,
) -> list[ProgressSample]:
    """The ``progress`` evidence of one job as samples (``payload.ts`` when the sender knew
    when the step was reached, else when it was observed).

    When the job has progress-file evidence, its log-line progress is left out: the file says
    which node each rank runs on and carries step times, the log often only rank 0's step. A
    log line names no node (the node that read the output is not where the rank runs); ranks
    are placed on ``job_nodes`` by Slurm's default block layout, see :func:`rank_node`.
    ``restart_count``: leave out the evidence of other attempts (:func:`of_attempt`).
    """
    mine = [
        ev
        for ev in evidence
        if ev.kind == "progress" and ev.job_id == job_id and of_attempt(ev, restart_count)
    ]
    from_file = any(ev.payload.get("origin") == "file" for ev in mine)
    ranks = [ev.payload["rank"] for ev in mine if type(ev.payload.get("rank")) is int]
    world = max(ranks) + 1 if ranks else 0  # at least: log lines rarely show every rank
    samples = []
    for ev in mine:
        origin = ev.payload.get("origin")
        if from_file and origin != "file":
            continue
        step = ev.payload.get("step")
        if type(step) is not int:
            continue
        ts = ev.payload.get("ts")
        rank = ev.payload.get("rank")
        rank = rank if type(rank) is int else None
        node = ev.node if origin == "file" else rank_node(rank, world, job_nodes)
        step_time = _number(ev.payload.get("step_time"))
        samples.append(
            ProgressSample(
                ts=float(ts) if type(ts) in (int, float) else ev.observed_at,
                step=step,
                rank=rank,
                node=node,
                tokens=_number(ev.payload.get("tokens")),
                samples=_number(ev.payload.get("samples")),
                loss=_number(ev.payload.get("loss")),
                step_time=step_time if step_time is not None and step_time >= 0 else None,
                done=ev.payload.get("done") is True,
            )
        )
    return samples


def hang_incidents(
    view: ClusterView,
    evidence: Sequence[Evidence],
    open_or_done: Collection[tuple[int, int]],
    policy: Policy,
    timeouts: Mapping[int, float] | None = None,
) -> list[Incident]:
    """HANG incidents for running jobs that report progress and stopped making it.

    ``timeouts``: job id -> the job's own hang deadline (clamped to the policy's floor and
    ceiling). A job that never reported step progress is judged by its GPUs alone
    (:func:`detect_gpu_idle`), and not at all when the sidecars saw no GPU activity either."""
    found = []
    of_job = by_job(evidence)
    for job_id in sorted(view.jobs):
        job = view.jobs[job_id]
        if job.state != "RUNNING" or (job_id, job.restart_count) in open_or_done:
            continue
        own = of_job.get(job_id, [])  # every rule below reads only the job's own evidence
        samples = progress_samples(own, job_id, job.nodes, job.restart_count)
        if samples:
            kind = "progress"
            finding = detect_hang(
                job_id,
                samples,
                float(job.start_time),
                view.now,
                policy.hang,
                (timeouts or {}).get(job_id),  # the job's own --recovery-hang-timeout
            )
        else:
            kind = "gpu_activity"
            activity = [ev for ev in own if ev.kind == kind and of_attempt(ev, job.restart_count)]
            finding = detect_gpu_idle(
                job_id, activity, float(job.start_time), view.now, policy.hang
            )
        if finding is None:
            continue
        ids = tuple(sorted(ev.id for ev in own if ev.kind == kind))[-5:]
        summary = finding.summary
        recorded = flight_recorder_words(own, job)
        if recorded is not None:
            summary += f"; {recorded[0]}"
            ids = tuple(sorted({*ids, *recorded[1]}))
        logged = log_words(own, job)
        if logged is not None:
            summary += f"; {logged[0]}"
            ids = tuple(sorted({*ids, *logged[1]}))
        found.append(
            Incident(
                job_id,
                job.restart_count,
                job.submit_time,
                IncidentKind.HANG,
                failed_at=finding.hung_since,
                trigger_ids=ids,
                summary=summary,
            )
        )
    return found


def log_words(evidence: Sequence[Evidence], job: Job) -> tuple[str, list[int]] | None:
    """What the attempt's log lines say went wrong (the root, as ``explain-log`` finds it),
    with their evidence ids; None without any. A log line explains a hang past its deadline
    (attribution weighs the same lines); it never makes a running job hung."""
    judged = judge_job_log(evidence, job, since=float(job.start_time) - START_SLACK)
    if judged is None or not judged.evidence_ids:
        return None
    cause = " ".join(judged.verdict.cause.split())
    return f"log: {cause[:117] + '...' if len(cause) > 120 else cause}", sorted(judged.evidence_ids)


def flight_recorder_words(evidence: Iterable[Evidence], job: Job) -> tuple[str, list[int]] | None:
    """What the job's flight-recorder dumps (``flight_recorder`` evidence of this attempt) say
    about where it is stuck, with the evidence ids; None when they say nothing.

    The ranks that never entered the collective the others wait in are named with the node
    their dump came from: they stopped first."""
    since = float(job.start_time) - START_SLACK
    latest: dict[int, Evidence] = {}
    for ev in sorted(evidence, key=lambda e: (e.observed_at, e.id)):
        if (
            ev.kind != "flight_recorder"
            or ev.job_id != job.job_id
            or ev.observed_at < since
            or not of_attempt(ev, job.restart_count)
        ):
            continue
        rank = ev.payload.get("rank")
        if type(rank) is int:
            latest[rank] = ev
    traces = []
    for ev in latest.values():
        try:
            traces.append(trace_from_payload(ev.payload))
        except FlightRecorderError:
            continue
    stuck = stuck_collective(traces)
    if stuck is None:
        return None
    where = f"{stuck.op or 'collective'} #{stuck.seq_id} of group {stuck.desc or stuck.pg}"
    words = f"flight recorder: {_ranks_on(stuck.waiting, latest)} wait in {where}"
    if stuck.suspects:
        words += f"; never entered it: {_ranks_on(stuck.suspects, latest)}"
    if stuck.missing:
        words += f"; no dump from rank(s) {', '.join(map(str, stuck.missing))}"
    if not stuck.suspects and not stuck.missing:
        words += " (every rank entered it: no rank held it up)"
    return words, sorted(ev.id for ev in latest.values())


def _ranks_on(ranks: Iterable[int], dumps: Mapping[int, Evidence]) -> str:
    parts = []
    for rank in ranks:
        node = dumps[rank].node if rank in dumps else None
        parts.append(f"rank {rank}" + (f" on {node}" if node else ""))
    return ", ".join(parts) if parts else "no rank"
