"""The steps an incident's advice takes in Slurm, as one pure function: ``next_step``.

The loop reads Slurm and its own record of the steps it took, asks ``next_step`` what to do,
does that one step, records it, and asks again. Everything it needs to decide is an argument:
the advice (``Plan``), the job and nodes as Slurm shows them now, the steps recorded as done,
and the clock. So these rules hold by construction, not by care at each call site:

- A step that succeeded is done: it is never repeated. A drain, an exclusion, a release or a
  hold mark that Slurm no longer shows was undone by someone after the tool acted (an operator's
  resume, undrain, hold or comment), and that change wins: ``next_step`` reports it in
  ``changes`` (the loop records it once as ``slurm_change`` evidence) and goes on without it.
- Only the tool's own hold is released: the tool holds the job only while it applies the
  exclusions and until the first second the job may start (its begin time, at most a second
  away), then releases it, so a hold seen after its release is someone else's.
- A step Slurm shows done that has no record (the controller died between the call and the
  commit) is reported in ``found`` and counted as done.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_recovery.contract.hostlist import compress
from slurm_recovery.decide.model import Action, Mode
from slurm_recovery.decide.placement import usable
from slurm_recovery.scheduler.base import Job, Node, earliest_restart

#: Job states from which ``requeue_hold`` moves a job back to pending.
REQUEUEABLE = frozenset(
    {"RUNNING", "SUSPENDED", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "TIMEOUT"}
)


@dataclass(frozen=True)
class Plan:
    """The advice in force for an incident, as the loop carries it out."""

    incident_id: int
    advice_id: int
    action: Action
    mode: Mode
    reason: str
    rule: str = ""
    exclude: frozenset[str] = frozenset()
    #: the tool's own earlier exclusions of nodes repaired since: removed from this attempt
    unexclude: frozenset[str] = frozenset()
    drain: frozenset[str] = frozenset()
    needs_operator: bool = False
    cause: str = ""
    fault_class: str = "unknown"

    @classmethod
    def from_verdict(
        cls, incident_id: int, advice_id: int, decision: str, reason: str, v: Mapping[str, Any]
    ) -> Plan:
        """From an advice row: its decision, reason and stored details (``verdict``)."""
        return cls(
            incident_id=incident_id,
            advice_id=advice_id,
            action=Action(decision),
            mode=Mode(v["mode"]),
            reason=reason,
            rule=v.get("rule", ""),
            exclude=frozenset(v.get("exclude", [])),
            unexclude=frozenset(v.get("unexclude", [])),
            drain=frozenset(v.get("drain", [])),
            needs_operator=bool(v.get("needs_operator")),
            cause=v.get("verdict", {}).get("cause", ""),
            fault_class=v.get("verdict", {}).get("fault_class", "unknown"),
        )

    @property
    def drain_reason_prefix(self) -> str:
        """How a drain reason set by this incident starts (``srecovery:<incident>:``)."""
        return f"srecovery:{self.incident_id}:"


@dataclass(frozen=True)
class Step:
    """One call to Slurm. ``name`` is the action row's step; ``target`` "job N" or a node."""

    name: str
    target: str
    params: Mapping[str, Any] = field(default_factory=dict)
    milestone: str | None = None


@dataclass(frozen=True)
class Wait:
    """Nothing to do now: Slurm (or someone else) must move first."""

    why: str


@dataclass(frozen=True)
class Close:
    """The incident is over. ``milestone`` is recorded first (``running_again``, ``stopped``);
    ``redo`` asks the loop to carry the same advice out again for the job's current attempt."""

    outcome: str
    milestone: str | None = None
    redo: bool = False


@dataclass(frozen=True)
class Change:
    """Something someone else did after the tool's step, which the tool now leaves as it is."""

    what: str  # resumed | unexcluded | held | released | comment
    target: str
    detail: str


@dataclass(frozen=True)
class Next:
    action: Step | Wait | Close
    #: steps Slurm shows done that have no record yet (record each as found, once)
    found: tuple[Step, ...] = ()
    #: changes by others after the tool's steps (record each once as evidence)
    changes: tuple[Change, ...] = ()


def next_step(
    plan: Plan,
    job: Job | None,
    base: int,
    done: Mapping[tuple[str, str], float],
    nodes: Mapping[str, Node],
    now: float,
    *,
    hold_mark_of: tuple[int, int] | None = None,
    watchdog_released_at: float | None = None,
) -> Next:
    """What to do next for the incident ``plan.incident_id`` (pure).

    ``job``: the job as Slurm shows it now (None: gone). ``base``: the restart count of the
    attempt the incident is about. ``done``: (step, target) -> when it succeeded, from the
    action rows. ``hold_mark_of``: the hold mark in the job's AdminComment, parsed.
    ``watchdog_released_at``: when the watchdog released this job after the tool held it.
    """
    done = dict(done)
    changes: list[Change] = []
    found: list[Step] = []
    back: set[str] = set()  # drained by the tool, resumed since and usable: back in service

    # Drains first: a node the advice drains is drained whatever happens to the job.
    for name in sorted(plan.drain):
        shown = nodes.get(name)
        if ("drain", name) in done:
            if shown is not None and not shown.drained:
                changes.append(Change("resumed", name, f"{name} resumed after the tool drained it"))
                if usable(shown):
                    back.add(name)
            continue
        if shown is None:
            continue  # Slurm does not know it: nothing to drain
        if shown.drained:
            if shown.reason.startswith(plan.drain_reason_prefix):
                found.append(Step("drain", name, {"reason": shown.reason}))  # just before a crash
            continue  # someone else's drain: their reason stays
        return Next(
            Step(
                "drain",
                name,
                {"reason": f"{plan.drain_reason_prefix}{plan.cause or plan.fault_class}"},
            ),
            tuple(found),
            tuple(changes),
        )
    for step in found:
        done[(step.name, step.target)] = now

    if plan.action is Action.NONE:
        return Next(Close("nothing to do"), tuple(found), tuple(changes))
    target = f"job {job.job_id}" if job is not None else ""
    if plan.action is Action.STOP:
        if job is not None and job.active and ("cancel", target) not in done:
            return Next(
                Step("cancel", target, {"reason": plan.reason}), tuple(found), tuple(changes)
            )
        return Next(Close(f"stopped: {plan.reason}", "stopped"), tuple(found), tuple(changes))
    if job is None:
        return Next(Close("job no longer in Slurm"), tuple(found), tuple(changes))
    restart = _restart(plan, job, base, done, now, hold_mark_of, watchdog_released_at, back)
    return Next(restart.action, tuple(found) + restart.found, tuple(changes) + restart.changes)


def _restart(
    plan: Plan,
    job: Job,
    base: int,
    done: dict[tuple[str, str], float],
    now: float,
    mark: tuple[int, int] | None,
    watchdog_released_at: float | None,
    back: set[str],
) -> Next:
    """Mark -> requeue held -> exclude -> begin time -> release -> unmark -> running again.

    While the released job waits, an exclusion of a node that the tool drained and an operator
    has since resumed is dropped (``unexclude``, one step per node): the operator's resume says
    the node is repaired, and a job that needs it (a job spanning its partition) would
    otherwise wait for ever."""
    target = f"job {job.job_id}"
    ours = mark is not None and mark[0] == plan.incident_id
    found: list[Step] = []
    changes: list[Change] = []

    def is_done(step: str) -> bool:
        return (step, target) in done

    def result(action: Step | Wait | Close) -> Next:
        return Next(action, tuple(found), tuple(changes))

    dropped = {name for name in plan.exclude if ("unexclude", name) in done}

    def waiting(why: str) -> Next:
        """Wait for Slurm to start the job, first dropping exclusions of repaired nodes."""
        repaired = sorted((back & plan.exclude & job.excluded_nodes) - dropped)
        if repaired:
            return result(Step("unexclude", repaired[0], {"job": job.job_id}))
        return result(Wait(why))

    # What Slurm shows done that has no record: the controller stopped after the call.
    shown = []
    if ours:
        shown.append("mark")
    if job.restart_count > base:
        shown.append("requeue_hold")
        wanted = _excluded_after(plan, job)
        if (plan.exclude or plan.unexclude) and job.excluded_nodes == wanted:
            shown.append("exclude")
        if ours and not job.held and watchdog_released_at is None:
            shown.append("release")  # released with our mark on it: by us
    for step in shown:
        if not is_done(step):
            params = {"nodes": sorted(plan.exclude)} if step == "exclude" else {}
            if step == "requeue_hold" and job.expedited_requeue and not ours:
                params = {"by": "slurm"}  # 25.11+ expedited requeue: Slurm's own requeue
            found.append(Step(step, target, params))
            done[(step, target)] = now

    if job.restart_count == base:
        if is_done("requeue_hold"):
            return result(Wait("requeued: Slurm does not show it yet"))
        if job.state not in REQUEUEABLE:
            return result(Wait(f"the job is {job.state}: waiting for Slurm"))
        if job.active and not is_done("mark"):
            # Mark before holding, so the watchdog can always find what we hold.
            # (A finished job's AdminComment cannot change: it is marked once held.)
            return result(Step("mark", target))
        return result(Step("requeue_hold", target, milestone="held"))

    held_at = done.get(("requeue_hold", target), now)
    if not job.active:
        if job.start_time > held_at:
            return result(Close(f"restarted; the new attempt ended {job.state}"))
        if is_done("release") or watchdog_released_at is not None:
            return result(Close(f"released, but the job ended {job.state} before it ran again"))
        return result(Close(f"the job ended {job.state} while held for its restart: not restarted"))

    released = is_done("release")
    if watchdog_released_at is not None and not released:
        changes.append(
            Change("released", target, "released by the watchdog (hold deadline passed)")
        )
    if job.state == "RUNNING":
        if ours and not is_done("unmark"):
            return result(Step("unmark", target))
        on_excluded = (plan.exclude - dropped) & set(job.nodes)
        if on_excluded and not released:
            return result(
                Close(
                    f"running again on {compress(job.nodes)}, which includes "
                    f"{compress(on_excluded)} that the advice excluded: released before the "
                    "exclusion was applied; restarting it again",
                    redo=True,
                )
            )
        return result(Close(f"restarted on {compress(job.nodes)}", "running_again"))
    if job.state not in ("PENDING", "REQUEUE_HOLD"):
        # REQUEUE_HOLD: pending and held, as Slurm 25.11+ leaves an expedited job it held
        return result(Wait(f"the job is {job.state}: Slurm is moving it"))

    if job.held and mark is None and not is_done("mark") and watchdog_released_at is None:
        # Our requeue of a finished job (or a crash right after it): mark it now.
        return result(Step("mark", target))
    if not is_done("exclude") and job.excluded_nodes != _excluded_after(plan, job):
        if plan.exclude or plan.unexclude:
            params = {"nodes": sorted(plan.exclude)}
            if plan.unexclude:
                params["unexclude"] = sorted(plan.unexclude)
            return result(Step("exclude", target, params, milestone="excluded"))
    elif is_done("exclude") and (gone := plan.exclude - dropped - job.excluded_nodes):
        changes.append(
            Change(
                "unexcluded",
                target,
                f"exclusion of {compress(gone)} removed after the tool set it",
            )
        )
    if released or watchdog_released_at is not None:
        if job.held_by_someone and released:
            changes.append(Change("held", target, "held again after the tool released it"))
            return result(Wait("held by someone else after the tool released it"))
        if ours and not is_done("unmark"):
            return result(Step("unmark", target))
        return waiting("released: waiting for resources")
    if not job.held:
        changes.append(Change("released", target, "released by someone else"))
        if ours and not is_done("unmark"):
            return result(Step("unmark", target))
        return waiting("released: waiting for resources")
    if not ours and is_done("mark"):
        # our hold mark is gone: someone changed the comment while we held the job; it is
        # still our hold (the requeue is ours), so the restart goes on
        changes.append(Change("comment", target, "the tool's hold mark was removed"))
    earliest = earliest_restart(held_at)
    if not is_done("begin_now") and job.begin_time > earliest:
        return result(Step("begin_now", target, {"at": earliest}))
    if now < earliest:
        # Released before its begin time, the job misses the scheduling attempt the release
        # triggers and waits for Slurm's next pass (the backfill's, 30 s by default).
        return result(Wait("held until its begin time, then released"))
    return result(Step("release", target, milestone="released"))


def _excluded_after(plan: Plan, job: Job) -> frozenset[str]:
    """The job's exclusions once the plan's exclude step is done: its own and the tool's
    still in force, plus the new ones; the tool's exclusions of repaired nodes removed."""
    return (job.excluded_nodes - plan.unexclude) | plan.exclude
