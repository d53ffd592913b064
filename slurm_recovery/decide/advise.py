"""Advise: what should happen for an attributed incident, by policy, and why in one line.

Pure and deterministic: no clock, no files, no logging. The rules, in order (``Advice.rule`` names
the one that decided):

0. ``straggler.no_node`` / ``straggler.restart``: a straggler no node explains, or any while
   ``straggler.restart`` is false -> none (reported; a straggler drains by ``straggler.drain``).
0. ``app_fault.running``: an application fault seen in the log of a job that is still running
   -> none, and no drain: advice only (a log line alone never stops, requeues or drains; the
   job's crash, or its hang past the deadline, is decided with the same lines).
0. ``hetjob``: a component of a heterogeneous job (``sbatch ... : ...``) -> none, needs an
   operator, its nodes still drained: Slurm restarts such a job only as a whole, and a restart
   with exclusions per component is not built, so no half action (docs/policy.md).
1. ``do_not_requeue_exit_codes``: the job exited with such a code (NVRx's 93) -> stop.
2. ``classes.<class>.action`` when it is ``stop`` or ``none`` (an application fault -> stop).
2a. ``interactive_jobs``: an interactive job (srun/salloc), which Slurm cannot requeue -> none
   (``leave``: it ends on its own) or stop (``cancel``); its nodes are still drained.
3. ``stop_on_same_failure``: the job the tool restarted failed again with the same cause, no
   node implicated -> stop (the application's; a restart would fail the same way).
3. ``max_restarts``: the tool already restarted this job that many times -> stop.
4. ``max_excluded_nodes``: excluding the implicated nodes would leave the job with more excluded
   nodes than allowed -> stop, needs an operator.
5. ``classes.<class>.action``: requeue excluding the implicated nodes (``requeue_exclude``), or
   requeue anywhere (``requeue``; also ``requeue_exclude`` when no node is implicated). Either
   way the job's nodes the site's health check has drained (``ClusterView.health_check_drained``)
   are excluded too, within ``max_excluded_nodes`` (:func:`health_check_held_out`).
6. ``unplaceable``: that requeue would leave the job's partition with fewer usable nodes than
   it needs, its exclusions and the nodes about to be drained left out
   (:mod:`~slurm_recovery.decide.placement`; only on Slurm's whole listing) -> the same
   requeue, needs an operator (``unplaceable = "wait"``, the default), or stop, needs an
   operator.

Independently of the job's fate, the implicated nodes are drained when the class's policy says so
and the verdict is confident enough, within the blast radius (``blast_radius``: drains by the
tool in the window, cluster-wide and per partition, never exceeded); a drain the cap refuses is
dropped and the advice says it needs an operator (rule ``blast_radius`` when the class policy
decided the rest). A broken node is drained even when its job is stopped: it is broken for
everyone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from slurm_recovery.config import format_duration
from slurm_recovery.contract.hostlist import compress
from slurm_recovery.decide.model import (
    Action,
    Advice,
    ClusterView,
    FaultClass,
    Incident,
    IncidentKind,
    Verdict,
    partition_sizes,
)
from slurm_recovery.decide.placement import shortfall
from slurm_recovery.decide.policy import NODE_CLASSES, ClassPolicy, Policy
from slurm_recovery.scheduler.base import Job, Node

#: The rules whose advice needs an operator (``Advice.needs_operator``); the metric
#: ``srecovery_needs_operator_total`` has a series for each from the start.
NEEDS_OPERATOR_RULES = (
    "blast_radius",
    "max_excluded_nodes",
    "job.required_nodes",
    "unplaceable",
    "hetjob",
)


def needs_operator_rule(advice: Advice) -> str:
    """The one of NEEDS_OPERATOR_RULES that made ``advice`` need an operator: a drain refused
    at the blast radius is ``blast_radius``, whichever rule chose the job's action."""
    return advice.rule if advice.rule in NEEDS_OPERATOR_RULES else "blast_radius"


def advise(
    incident: Incident,
    verdict: Verdict,
    job: Job,
    policy: Policy,
    view: ClusterView,
    restarts_so_far: int,
    tool_excluded: frozenset[str] = frozenset(),
    previous_cause: str | None = None,
) -> Advice:
    """The advice for ``incident``. ``restarts_so_far``: restarts the tool already made for this
    job (over its whole history; the controller counts them, Slurm does not).
    ``tool_excluded``: the nodes the tool itself excluded from this job earlier; those repaired
    since (Slurm shows them in service) are dropped from the next attempt, and the cap counts
    only the tool's exclusions still in force (the user's own ``--exclude`` never counts).
    ``previous_cause``: the cause of the incident the tool restarted this job after, if any."""
    mode = policy.mode_for(job.partition)
    class_policy = policy.for_class(verdict.fault_class)
    class_rule = f"classes.{verdict.fault_class}.action"
    cause = verdict.cause or f"{verdict.fault_class} fault"
    straggler = incident.kind is IncidentKind.STRAGGLER
    if straggler:
        class_policy = replace(class_policy, drain=policy.straggler.drain)
    running_fault = incident.kind is IncidentKind.APP_FAULT
    drains = DrainPlan() if running_fault else plan_drains(verdict, class_policy, policy, view)

    exclude: frozenset[str] = frozenset()
    unexclude: frozenset[str] = frozenset()
    needs_operator = False
    code = job.exit_code.returncode
    if running_fault:
        action, rule = Action.NONE, "app_fault.running"
        what = (
            f"{cause}: advice only, nothing done: job {job.job_id} is still running (a log line "
            "alone does not stop or requeue a job; if it crashes or hangs, that is decided then)"
        )
    elif straggler and not verdict.nodes:
        action, rule = Action.NONE, "straggler.no_node"
        what = f"{cause}: reported only (no node explains it; a restart would not help)"
    elif straggler and not policy.straggler.restart:
        action, rule = Action.NONE, "straggler.restart"
        what = f"{cause}: reported only (straggler.restart = false)"
    elif job.het_job_id:
        action, rule, needs_operator = Action.NONE, "hetjob", True
        what = (
            f"{cause}: not restarted, needs operator: job {job.job_id} is component "
            f"{job.het_job_offset} of heterogeneous job {job.het_job_id}, which the tool does "
            "not requeue or stop (Slurm restarts it only as a whole)"
        )
    elif incident.kind is IncidentKind.CRASH and code in policy.do_not_requeue_exit_codes:
        action, rule = Action.STOP, "do_not_requeue_exit_codes"
        what = f"exit code {code} (the job asked not to be requeued): stop"
        if verdict.fault_class is not FaultClass.UNKNOWN:
            what += f"; cause: {cause}"
    elif class_policy.action in (Action.STOP, Action.NONE):
        action, rule = class_policy.action, class_rule
        if action is Action.STOP:
            what = f"{cause}: stop ({verdict.fault_class} fault, not restarted)"
        else:
            what = f"{cause}: no action ({class_rule} = none)"
    elif not job.batch:
        action, rule = _interactive(policy.interactive_jobs)
        what = (
            f"{cause}: {'stop' if action is Action.STOP else 'left to end on its own'}: "
            f"job {job.job_id} is interactive (srun/salloc), which Slurm cannot requeue "
            f"(interactive_jobs = {policy.interactive_jobs})"
        )
    elif not job.requeueable:
        action, rule = Action.STOP, "job.no_requeue"
        what = f"{cause}: stop (the job was submitted with --no-requeue)"
    elif policy.stop_on_same_failure and same_failure(verdict, previous_cause, restarts_so_far):
        action, rule = Action.STOP, "stop_on_same_failure"
        what = (
            f"{cause}: stop: the same failure as before the last restart (no node implicated: "
            "it follows the application, and a restart would fail the same way)"
        )
    elif restarts_so_far >= policy.max_restarts:
        action, rule = Action.STOP, "max_restarts"
        what = (
            f"restart limit reached ({restarts_so_far} of {policy.max_restarts}): stop; "
            f"cause: {cause}"
        )
    else:
        wanted = verdict.nodes if class_policy.action is Action.REQUEUE_EXCLUDE else frozenset()
        restart = f"(restart {restarts_so_far + 1} of {policy.max_restarts})"
        repaired = repaired_exclusions(tool_excluded & job.excluded_nodes, view)
        merged = (tool_excluded & job.excluded_nodes) - repaired | wanted
        held_out = health_check_held_out(job, view, merged, policy)
        if wanted & job.required_nodes:
            action, rule, needs_operator = Action.STOP, "job.required_nodes", True
            what = (
                f"{cause}: stop, needs operator: the job may run only on "
                f"{compress(job.required_nodes)} (--nodelist), which includes "
                f"{compress(wanted & job.required_nodes)}"
            )
        elif wanted and len(merged) > policy.max_excluded_nodes:
            action, rule, needs_operator = Action.STOP, "max_excluded_nodes", True
            what = (
                f"{cause}: stop, needs operator: excluding {compress(wanted)} would leave the "
                f"job with {len(merged)} excluded nodes ({compress(merged)}; "
                f"max_excluded_nodes = {policy.max_excluded_nodes})"
            )
        elif wanted or held_out:
            exclude = wanted | held_out
            action, rule = Action.REQUEUE_EXCLUDE, class_rule
            what = f"{cause}: requeue excluding {compress(exclude)} {restart}"
            if held_out:
                what += f" ({compress(held_out)}: drained by the site's health check)"
            if repaired - exclude:
                unexclude = repaired - exclude
                what += f" (no longer excluding {compress(unexclude)}: back in service)"
        else:
            action, rule = Action.REQUEUE, class_rule
            why = (
                "no node implicated"
                if class_policy.action is Action.REQUEUE_EXCLUDE
                else f"{class_rule} = requeue"
            )
            what = f"{cause}: requeue without exclusion ({why}) {restart}"
        left_out = (job.excluded_nodes - unexclude) | exclude | drains.drain
        requeue = action in (Action.REQUEUE, Action.REQUEUE_EXCLUDE)
        placed = requeue and view.whole_listing
        if placed and (short := shortfall(job, view.nodes, left_out)):
            needs_operator, rule = True, "unplaceable"
            if policy.unplaceable == "stop":
                action, exclude, unexclude = Action.STOP, frozenset(), frozenset()
                what = f"{cause}: stop, needs operator: {short.words()} (unplaceable = stop)"
            else:
                what += (
                    f"; it cannot run until an operator acts, needs operator: {short.words()} "
                    "(unplaceable = wait)"
                )

    if drains.refused:
        needs_operator = True
        if rule == class_rule:
            rule = "blast_radius"
    return Advice(
        action=action,
        mode=mode,
        reason=_one_line(
            what + drains.words(", " if exclude or action is Action.REQUEUE else "; ")
        ),
        rule=rule,
        exclude=exclude,
        unexclude=unexclude,
        drain=drains.drain,
        needs_operator=needs_operator,
        verdict=verdict,
    )


_HANG_TIMES = re.compile(r"no progress for [^()]{1,40}\(deadline [^()]{1,40}\)")


def same_failure(verdict: Verdict, previous_cause: str | None, restarts_so_far: int) -> bool:
    """Whether a restarted job failed again the same way: the same cause, with no node
    implicated, read from evidence (log lines, a hang at the same step: how long it had been
    quiet does not count). A node-side cause never repeats in this sense (its node was
    excluded; a fault on another node is a new one), nor does "no evidence of the cause"."""
    if restarts_so_far <= 0 or not previous_cause or verdict.nodes:
        return False
    if verdict.fault_class is not FaultClass.UNKNOWN:
        return False
    said = bool(verdict.evidence_ids) or "; last step " in verdict.cause
    return said and _HANG_TIMES.sub("no progress", verdict.cause) == _HANG_TIMES.sub(
        "no progress", previous_cause
    )


def _interactive(setting: str) -> tuple[Action, str]:
    """What ``interactive_jobs`` does with a job that needs a restart it cannot have."""
    return (Action.STOP if setting == "cancel" else Action.NONE), "interactive_jobs"


@dataclass(frozen=True)
class DrainPlan:
    """Which implicated nodes to drain, and why the others are not drained."""

    drain: frozenset[str] = frozenset()
    #: node -> why the blast radius (or Slurm's view) refuses it: needs an operator
    refused: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: nodes already drained by someone else: nothing to do, their reason is kept
    already: frozenset[str] = frozenset()
    #: why nothing was drained although the class drains (confidence too low), or ""
    skipped: str = ""

    def words(self, joint: str = ", ") -> str:
        """The tail of the advice reason: ``", drain n2"``, ``"; not draining n3: ..."``."""
        parts = ""
        if self.drain:
            parts += f"{joint}drain {compress(self.drain)}"
        if self.already:
            parts += f" ({compress(self.already)} already drained)"
        if self.skipped:
            parts += f"; {self.skipped}"
        by_why: dict[str, list[str]] = {}
        for node, why in sorted(self.refused.items()):
            by_why.setdefault(why, []).append(node)
        for why, nodes in by_why.items():
            parts += f"; not draining {compress(nodes)}: {why}, needs operator"
        return parts


def plan_drains(
    verdict: Verdict, class_policy: ClassPolicy, policy: Policy, view: ClusterView
) -> DrainPlan:
    """The drains the advice asks for, capped by the blast radius (pure)."""
    if not verdict.nodes or not class_policy.drain or verdict.fault_class not in NODE_CLASSES:
        return DrainPlan()
    if verdict.confidence < class_policy.drain_min_confidence:
        return DrainPlan(
            skipped=(
                f"not draining (confidence {verdict.confidence:.2f} is below "
                f"classes.{verdict.fault_class}.drain_min_confidence "
                f"{class_policy.drain_min_confidence:g})"
            )
        )
    radius = policy.blast_radius
    since = view.now - radius.window
    counted = {name for name, at in view.drained_by_tool.items() if at >= since}
    sizes = view.partition_sizes
    if sizes is None:
        sizes = partition_sizes(view.nodes.values())
    window = format_duration(radius.window)
    drain: list[str] = []
    already: list[str] = []
    refused: dict[str, str] = {}
    for name in sorted(verdict.nodes):
        node = view.nodes.get(name)
        if node is None:
            refused[name] = "Slurm does not show it, so the blast radius cannot be checked"
            continue
        if node.drained:
            if name in view.drained_by_tool:
                drain.append(name)  # our own drain, still in force: nothing new to count
            else:
                already.append(name)  # someone else's drain: keep their reason
            continue
        why = _over_cap(name, node, counted, view.nodes, sizes, policy, window)
        if why:
            refused[name] = why
            continue
        counted.add(name)
        drain.append(name)
    return DrainPlan(
        drain=frozenset(drain),
        refused=MappingProxyType(refused),
        already=frozenset(already),
    )


def _over_cap(
    name: str,
    node: Node,
    counted: set[str],
    nodes: Mapping[str, Node],
    sizes: Mapping[str, int],
    policy: Policy,
    window: str,
) -> str:
    """Why draining ``name`` too would break the blast radius, or "" if it fits."""
    radius = policy.blast_radius
    after = counted | {name}
    if len(after) > radius.max_nodes:
        return (
            f"blast radius reached ({len(counted)} drained by the tool in the last {window}; "
            f"max_nodes = {radius.max_nodes})"
        )
    for partition in sorted(node.partitions):
        inside = [n for n in after if n in nodes and partition in nodes[n].partitions]
        if len(inside) * 100 > radius.max_percent * sizes[partition]:
            already = len(inside) - 1
            return (
                f"blast radius reached in partition {partition} ({already} of "
                f"{sizes[partition]} nodes drained by the tool in the last {window}; "
                f"max_percent = {radius.max_percent:g})"
            )
    return ""


def health_check_held_out(
    job: Job, view: ClusterView, excluded: frozenset[str], policy: Policy
) -> frozenset[str]:
    """The job's nodes Slurm shows drained by the site's health check, kept out of its
    restart while they stay drained: not excluded already, not required (``--nodelist``: the
    job waits for them), and only as far as ``max_excluded_nodes`` leaves room (drained, they
    take no job anyway: never a reason to stop one)."""
    candidates = sorted(
        name
        for name in job.nodes
        if name in view.health_check_drained
        and name not in excluded
        and name not in job.required_nodes
    )
    room = max(0, policy.max_excluded_nodes - len(excluded))
    return frozenset(candidates[:room])


def repaired_exclusions(excluded: frozenset[str], view: ClusterView) -> frozenset[str]:
    """Of the tool's exclusions, the nodes Slurm shows in service again (not drained, not
    down): an operator resumed them after repair, so they no longer need excluding."""
    return frozenset(
        name
        for name in excluded
        if (node := view.nodes.get(name)) is not None
        and not node.drained
        and node.state not in ("DOWN", "FAIL", "FUTURE")
    )


def after_drains(view: ClusterView, nodes: Iterable[str]) -> ClusterView:
    """``view`` with ``nodes`` counted as drained by the tool now.

    Advising several incidents from one view: pass each advice's ``drain`` through this before
    advising the next, so that together they stay within the blast radius.
    """
    drained = dict(view.drained_by_tool)
    for name in nodes:
        drained.setdefault(name, view.now)
    return replace(view, drained_by_tool=MappingProxyType(drained))


def _one_line(text: str) -> str:
    return " ".join(text.split())
