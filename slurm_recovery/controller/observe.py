"""What the controller records each pass about what operators do in Slurm, for
``srecovery compare`` (the monitor-mode scorecard).

Each pass the loop hands over the view it just read and the one before it. What changed by
someone other than the tool becomes one ``slurm_change`` evidence row (source ``scheduler``,
observed at the pass's time, so within one loop interval of the change):

- ``drained``: a node took the DRAIN flag with a reason that is not the controller's own
  (``srecovery:<incident>:...``; ``srecovery drain``'s ``srecovery-op:`` is an operator's)
  [reason, state, health_check (only when true)];
- ``drain_reason_changed``: a drained node's reason changed to one that is not the tool's
  (an operator took the drain over, or reworded it) [reason, previous_reason,
  health_check];
- ``resumed``: a drained node was put back in service [previous_reason, was_tool_drain,
  was_health_check (only when true)];
- ``requeued``: a job's restart count went up, and the tool neither holds it (its hold mark)
  nor recorded a ``requeue_hold`` of it since the previous pass [restart_count,
  previous_restart_count, state, nodes];
- ``cancelled``: a job went to CANCELLED, and the tool neither recorded a ``cancel`` of it
  since the previous pass nor left its note (``holdmark.cancelled_by_tool``) in its AdminComment
  [previous_state, nodes].

The tool's own steps are not recorded here: the ``actions`` table has them, with their times.

A drain (or new reason) by the site's health check (``health_check``: the view's
``health_check_drained``, from ``controller.health_check_drain_prefixes``) also becomes one
``health_check_drain`` row on the node [reason, state]: evidence against the node that the
decision core reads (``decide.attribute``).

It is cheap and bounded: two dictionary diffs per pass, one batch insert (normal durability,
like all evidence) only when something changed, at most :data:`MAX_CHANGES_PER_PASS` rows (one
``truncated`` row says how many more there were). The first pass after a start has nothing to
compare with and records nothing; what changed while the controller was down is not seen here
(``srecovery compare`` also reads Slurm's own node reasons and, where there is one, slurmdbd).
Slurm does not say who requeued or cancelled a job; drains carry their user in Slurm's node
record, which ``compare`` reads.
"""

from __future__ import annotations

from typing import Any

from slurm_recovery.decide.model import ClusterView
from slurm_recovery.holdmark import cancelled_by_tool, parse_hold_mark
from slurm_recovery.scheduler import Job
from slurm_recovery.scorecard import is_tool_drain
from slurm_recovery.store import Evidence, Store

#: The evidence kind and source of what the controller saw change in Slurm.
KIND = "slurm_change"
#: The evidence kind of a drain by the site's health check (NHC), against its node.
HEALTH_CHECK_KIND = "health_check_drain"
SOURCE = "scheduler"
#: Most rows one pass records; the rest are counted in one ``truncated`` row.
MAX_CHANGES_PER_PASS = 500
#: Slack, in seconds, when matching a change to the tool's own step of the previous pass.
STEP_SLACK = 5.0


def tool_drain(reason: str) -> bool:
    """The drain reason is the controller's own (``srecovery:<incident>:<cause>``); an
    operator's drain through ``srecovery drain`` (``srecovery-op:...``) is the operator's."""
    return is_tool_drain(reason)


def tool_job(job: Job) -> bool:
    """The tool holds the job (its hold mark), or cancelled it (its note)."""
    comment = job.admin_comment
    return parse_hold_mark(comment) is not None or (
        job.state == "CANCELLED" and cancelled_by_tool(comment)
    )


def changes(view: ClusterView, previous: ClusterView | None) -> list[dict[str, Any]]:
    """What changed from ``previous`` to ``view`` by someone other than the tool: one dict per
    change, with ``change`` and ``node`` or ``job_id`` (pure; see the module docstring)."""
    if previous is None:
        return []
    out: list[dict[str, Any]] = []
    # the same listing (or node record) as before: nothing to compare (a listing unchanged
    # since the last pass is the same object: controller/nodelisting.py, scheduler/nodetext.py)
    for name in sorted(view.nodes) if view.nodes is not previous.nodes else ():
        now, before = view.nodes[name], previous.nodes.get(name)
        if before is None or now is before:
            continue
        checked = name in view.health_check_drained
        if now.drained and not before.drained:
            if not tool_drain(now.reason):
                out.append(
                    {
                        "change": "drained",
                        "node": name,
                        "reason": now.reason,
                        "state": now.state,
                        **({"health_check": True} if checked else {}),
                    }
                )
        elif now.drained and before.drained and now.reason != before.reason:
            if not tool_drain(now.reason):
                out.append(
                    {
                        "change": "drain_reason_changed",
                        "node": name,
                        "reason": now.reason,
                        "previous_reason": before.reason,
                        **({"health_check": True} if checked else {}),
                    }
                )
        elif before.drained and not now.drained:
            out.append(
                {
                    "change": "resumed",
                    "node": name,
                    "previous_reason": before.reason,
                    "was_tool_drain": tool_drain(before.reason),
                    **({"was_health_check": True} if name in previous.health_check_drained else {}),
                    "state": now.state,
                }
            )
    for job_id in sorted(view.jobs):
        job, old = view.jobs[job_id], previous.jobs.get(job_id)
        if old is None or tool_job(job):
            continue
        if job.restart_count > old.restart_count:
            out.append(
                {
                    "change": "requeued",
                    "job_id": job_id,
                    "restart_count": job.restart_count,
                    "previous_restart_count": old.restart_count,
                    "state": job.state,
                    "nodes": list(old.nodes),
                }
            )
        elif job.state == "CANCELLED" and old.state != "CANCELLED":
            out.append(
                {
                    "change": "cancelled",
                    "job_id": job_id,
                    "previous_state": old.state,
                    "nodes": list(job.nodes or old.nodes),
                }
            )
    return out


def observe(store: Store, view: ClusterView, previous: ClusterView | None) -> None:
    """Record what changed in Slurm between ``previous`` and ``view``."""
    found = changes(view, previous)
    if not found:
        return
    if previous is not None and any("job_id" in c for c in found):
        steps = store.actions_between(
            steps=("requeue_hold", "cancel"), since=previous.now - STEP_SLACK, until=view.now
        )
        ours = {(a.step, a.target) for a in steps}
        found = [
            c
            for c in found
            if not (
                (c["change"] == "requeued" and ("requeue_hold", f"job {c['job_id']}") in ours)
                or (c["change"] == "cancelled" and ("cancel", f"job {c['job_id']}") in ours)
            )
        ]
        if not found:
            return
    kept = found[:MAX_CHANGES_PER_PASS]
    rows = [
        Evidence(
            SOURCE,
            KIND,
            view.now,
            node=change.get("node"),
            job_id=change.get("job_id"),
            payload=change,
        )
        for change in kept
    ]
    rows += [
        Evidence(
            SOURCE,
            HEALTH_CHECK_KIND,
            view.now,
            node=change["node"],
            payload={"reason": change["reason"], "state": change.get("state", "")},
        )
        for change in kept
        if change.get("health_check") is True
    ]
    if len(found) > len(kept):
        rows.append(
            Evidence(
                SOURCE,
                KIND,
                view.now,
                payload={"change": "truncated", "not_recorded": len(found) - len(kept)},
            )
        )
    store.add_evidence(rows, received_at=view.now)
