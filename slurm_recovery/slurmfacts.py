"""What operators did, as Slurm itself records it: for ``srecovery compare``.

Two sources besides what the controller observed pass by pass:

- **Slurm now** (always): the node records give each drained node's reason with the user who
  set it and when (``reason_set_by_user``, ``reason_changed_at``); ``squeue --json`` gives
  cancelled jobs still in slurmctld's memory (``MinJobAge``, 300 s by default) and the restart
  count and requeue time of requeued ones.
- **Accounting** (only with slurmdbd: ``AccountingStorageType=accounting_storage/slurmdbd``):
  ``sacctmgr show event`` lists every node drain with its reason, user and start, past ones
  too; ``sacct --duplicates`` lists every requeue and cancel (with the canceller's uid).

Parsing is pure (``*_from_*`` functions, unit-tested on Slurm's own output); :func:`read` runs
the commands through the scontrol scheduler backend (one runner, one JSON parser for every
release), each bounded by the scheduler's command timeout, and says what it could not read.
"""

from __future__ import annotations

import pwd
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from slurm_recovery.config import SchedulerConfig
from slurm_recovery.holdmark import cancelled_by_tool, parse_hold_mark
from slurm_recovery.scheduler.base import Job, Node, SchedulerError
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.scorecard import MERGE_WITHIN, Drain, JobChange, drain_user, is_tool_drain

SLURMDBD = "accounting_storage/slurmdbd"


@dataclass(frozen=True)
class ToolStep:
    """One of the tool's own Slurm steps (``/v1/history/slurm``'s ``tool_actions``)."""

    step: str
    job_id: int | None
    node: str | None
    at: float


@dataclass
class Facts:
    """What Slurm says operators did, and a note per source on what was (not) read."""

    drains: list[Drain] = field(default_factory=list)
    job_changes: list[JobChange] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)
    accounting: bool = False


def _by_tool(steps: Sequence[ToolStep], step: str, at: float, *, job_id: int) -> bool:
    return any(
        s.step == step and s.job_id == job_id and abs(s.at - at) <= MERGE_WITHIN for s in steps
    )


def drains_from_nodes(nodes: Iterable[Node], since: float, until: float) -> list[Drain]:
    """Nodes drained now by someone other than the tool, the drain set in ``[since, until]``
    (``reason_changed_at``), with the user who set it."""
    out = []
    for node in nodes:
        if not node.drained or is_tool_drain(node.reason):
            continue
        at = node.reason_changed_at
        if not at or not since <= at <= until:
            continue
        user = drain_user(node.reason, node.reason_set_by or None)
        out.append(Drain(node.name, float(at), node.reason, user, ("slurm",)))
    return out


def job_changes_from_squeue(
    jobs: Iterable[Job], since: float, until: float, tool: Sequence[ToolStep] = ()
) -> list[JobChange]:
    """Cancels (end time) and the latest requeue (the submit time a requeue sets) of the jobs
    slurmctld still shows, in ``[since, until]``, that were not the tool's."""
    out = []
    for job in jobs:
        comment = job.admin_comment
        cancelled = job.state == "CANCELLED" and since <= job.end_time <= until
        if (
            cancelled
            and not cancelled_by_tool(comment)
            and not _by_tool(tool, "cancel", job.end_time, job_id=job.job_id)
        ):
            out.append(JobChange(job.job_id, float(job.end_time), "cancelled", None, ("slurm",)))
        requeued = job.restart_count > 0 and since <= job.submit_time <= until
        if (
            requeued
            and parse_hold_mark(comment) is None
            and not _by_tool(tool, "requeue_hold", job.submit_time, job_id=job.job_id)
        ):
            out.append(JobChange(job.job_id, float(job.submit_time), "requeued", None, ("slurm",)))
    return out


def _slurm_time(text: str) -> float | None:
    text = text.strip()
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _user(text: str) -> str | None:
    """``alice(1000)`` or ``alice`` -> ``alice``."""
    name = text.strip().split("(", 1)[0].strip()
    return name or None


def drains_from_sacctmgr(text: str, since: float, until: float) -> list[Drain]:
    """``sacctmgr -n -P show event ... format=NodeName,Start,End,State,Reason,User``: node
    events whose state has DRAIN, not the tool's, starting in ``[since, until]``."""
    out = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 6:
            continue
        node, start, _end, state, reason, user = (p.strip() for p in parts[:6])
        at = _slurm_time(start)
        if not node or at is None or "DRAIN" not in state.upper():
            continue
        if is_tool_drain(reason) or not since <= at <= until:
            continue
        out.append(Drain(node, at, reason, drain_user(reason, _user(user)), ("accounting",)))
    return out


def _uid_name(uid: str) -> str:
    try:
        return pwd.getpwuid(int(uid)).pw_name
    except (KeyError, ValueError):
        return f"uid {uid}"


def job_changes_from_sacct(
    text: str, since: float, until: float, tool: Sequence[ToolStep] = ()
) -> list[JobChange]:
    """``sacct -a -X -n -P -D -o JobIDRaw,State,End,AdminComment``: every REQUEUED attempt and
    every CANCELLED (``CANCELLED by UID``) in ``[since, until]``, not the tool's."""
    out = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 3 or not parts[0].strip().isdigit():
            continue
        job_id = int(parts[0])
        state = parts[1].strip()
        at = _slurm_time(parts[2])
        comment = parts[3].strip() if len(parts) > 3 else ""
        if at is None or not since <= at <= until:
            continue
        if state.startswith("REQUEUED"):
            if not _by_tool(tool, "requeue_hold", at, job_id=job_id):
                out.append(JobChange(job_id, at, "requeued", None, ("accounting",)))
        elif state.startswith("CANCELLED"):
            if cancelled_by_tool(comment) or _by_tool(tool, "cancel", at, job_id=job_id):
                continue
            words = state.split()
            user = _uid_name(words[2]) if len(words) == 3 and words[1] == "by" else None
            out.append(JobChange(job_id, at, "cancelled", user, ("accounting",)))
    return out


# ----------------------------------------------------------------------- running Slurm


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at).strftime("%Y-%m-%dT%H:%M:%S")


def read(
    config: SchedulerConfig, since: float, until: float, tool: Sequence[ToolStep] = ()
) -> Facts:
    """Read what operators did in ``[since, until]`` from Slurm now and, where it exists,
    slurmdbd. Never raises: a source that cannot be read gets a note saying why."""
    slurm = ScontrolScheduler(
        timeout=config.command_timeout,
        bin_dir=config.slurm_bin_dir,
        slurm_conf=config.slurm_conf,
    )
    facts = Facts()
    try:
        nodes = slurm.list_nodes()
        facts.drains += drains_from_nodes(nodes, since, until)
        facts.notes["slurm nodes"] = f"{len(nodes)} nodes, drain reasons with user and time"
    except SchedulerError as exc:
        facts.notes["slurm nodes"] = f"not read: {exc}"
    try:
        jobs = slurm.list_jobs()
        facts.job_changes += job_changes_from_squeue(jobs, since, until, tool)
        facts.notes["slurm jobs"] = (
            f"squeue: {len(jobs)} jobs in slurmctld's memory (finished ones only for MinJobAge)"
        )
    except SchedulerError as exc:
        facts.notes["slurm jobs"] = f"not read: {exc}"
    try:
        storage = slurm.show_config().get("AccountingStorageType", "")
    except SchedulerError as exc:
        facts.notes["accounting"] = f"unknown: {exc}"
        return facts
    if storage != SLURMDBD:
        facts.notes["accounting"] = (
            f"absent: AccountingStorageType = {storage or 'not set'} (no slurmdbd); past drains "
            "come only from the controller's observations and the nodes' current reasons"
        )
        return facts
    facts.accounting = True
    window = [f"Start={_stamp(since)}", f"End={_stamp(until)}"]
    read_any = []
    try:
        text = slurm.query(
            [
                "sacctmgr",
                "-n",
                "-P",
                "show",
                "event",
                "Event=Node",
                *window,
                "Format=NodeName,Start,End,State,Reason,User",
            ]
        )
        facts.drains += drains_from_sacctmgr(text, since, until)
        read_any.append("sacctmgr show event")
    except SchedulerError as exc:
        facts.notes["accounting drains"] = f"not read: {exc}"
    try:
        text = slurm.query(
            [
                "sacct",
                "-a",
                "-X",
                "-n",
                "-P",
                "-D",
                f"--starttime={_stamp(since)}",
                f"--endtime={_stamp(until)}",
                "--format=JobIDRaw,State,End,AdminComment",
            ]
        )
        facts.job_changes += job_changes_from_sacct(text, since, until, tool)
        read_any.append("sacct --duplicates")
    except SchedulerError as exc:
        facts.notes["accounting jobs"] = f"not read: {exc}"
    facts.notes["accounting"] = f"slurmdbd: {', '.join(read_any) or 'nothing could be read'}"
    return facts
