"""A job attempt's log lines, judged together: the controller's side of ``srecovery explain-log``.

The sidecar sends each recognised line of a job's output as ``log_signature`` evidence; here
the lines of one attempt are turned back into matches and classified by
:func:`slurm_recovery.signals.logs.classify`, the same code that ``srecovery explain-log`` runs
on files: knock-on symptoms (a peer's timeout, a closed connection) are never the root and never
blame a node, the first failure in time is the root, a decisive hardware or system line beats an
earlier application error, and hosts named in the lines or ranks placed by Slurm's task layout
say which node a line is about.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from slurm_recovery.decide.model import Evidence
from slurm_recovery.scheduler.base import Job
from slurm_recovery.signals.logs import LogVerdict, classify, match_from_payload


def of_attempt(ev: Evidence, restart_count: int | None) -> bool:
    """False when ``ev`` names another attempt of its job (``payload.restart_count``, which the
    sidecar copies from the job_start); evidence that names none is judged by time alone."""
    named = ev.payload.get("restart_count")
    return restart_count is None or type(named) is not int or named == restart_count


def rank_node(rank: int | None, world: int, job_nodes: Sequence[str]) -> str | None:
    """The node of ``rank`` when ``world`` tasks are laid out over ``job_nodes`` by Slurm's
    default block distribution (the first nodes take one task more when they do not divide
    evenly). A guess for log lines only: the progress file names the host itself."""
    if rank is None or not job_nodes or not 0 <= rank < max(world, 1):
        return None
    if world <= len(job_nodes):
        return job_nodes[rank]
    per_node, extra = divmod(world, len(job_nodes))
    edge = extra * (per_node + 1)
    if rank < edge:
        return job_nodes[rank // (per_node + 1)]
    return job_nodes[extra + (rank - edge) // per_node]


@dataclass(frozen=True)
class JobLogVerdict:
    verdict: LogVerdict
    #: the evidence ids of the lines the verdict shows, the root's first
    evidence_ids: tuple[int, ...]
    #: blamed node -> the evidence ids of the lines about it (naming its host or its rank)
    blamed: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


def judge_job_log(evidence: Iterable[Evidence], job: Job, since: float) -> JobLogVerdict | None:
    """The verdict on ``job``'s ``log_signature`` evidence of its current attempt observed from
    ``since`` on (reading order: when observed, then line number); None without any."""
    lines = sorted(
        (
            ev
            for ev in evidence
            if ev.kind == "log_signature"
            and ev.job_id == job.job_id
            and ev.observed_at >= since
            and of_attempt(ev, job.restart_count)
        ),
        key=lambda ev: (ev.observed_at, _line_no(ev), ev.id),
    )
    matches = []
    for ev in lines:
        match = match_from_payload(ev.payload, source=str(ev.id))
        if match is not None:
            matches.append(match)
    if not matches:
        return None
    layout = rank_layout(lines, job.nodes)
    verdict = classify(matches, nodes=job.nodes, rank_to_node=layout)
    ids = tuple(int(source) for source in verdict.sources if source is not None)
    about = line_nodes(lines, job.nodes)
    blamed = {node: tuple(i for i in ids if about.get(i) == node) for node in verdict.blame_nodes}
    return JobLogVerdict(verdict, ids, blamed)


def rank_layout(lines: Sequence[Evidence], job_nodes: Sequence[str]) -> dict[int, str]:
    """rank -> node for the ranks the lines name, by Slurm's default block layout over at
    least as many tasks as the highest rank seen."""
    ranks = [r for ev in lines if type(r := ev.payload.get("rank")) is int and r >= 0]
    world = max(ranks) + 1 if ranks else 0
    return {r: node for r in set(ranks) if (node := rank_node(r, world, job_nodes))}


def line_nodes(lines: Sequence[Evidence], job_nodes: Sequence[str]) -> dict[int, str]:
    """Evidence id -> the job node a log line is about: with a one-node job, that node (as
    :func:`~slurm_recovery.signals.logs.classify` reads it); else the host it names (a job
    node), else its rank's node (:func:`rank_layout`). Lines about no job node are left out."""
    if len(job_nodes) == 1:
        return {ev.id: job_nodes[0] for ev in lines}
    layout = rank_layout(lines, job_nodes)
    short = {node.split(".", 1)[0]: node for node in job_nodes}
    about = {}
    for ev in lines:
        host = ev.payload.get("host")
        rank = ev.payload.get("rank")
        node = short.get(host.split(".", 1)[0]) if isinstance(host, str) else None
        if node is None and type(rank) is int:
            node = layout.get(rank)
        if node is not None:
            about[ev.id] = node
    return about


def _line_no(ev: Evidence) -> int:
    value = ev.payload.get("line_no")
    return value if type(value) is int else 0
