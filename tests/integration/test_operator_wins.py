"""Issue 16: what an operator does after the tool acted wins, on the real local cluster.

A 4-node job on the 4-node cluster: once the tool excludes the broken node the job cannot
start again, so its incident stays open ("released: waiting for resources") while the
operator acts, which is when the loop used to undo it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from slurm_recovery.store import Store
from tests.conftest import wait_for, wait_passes
from tests.integration.test_controller import running, scheduler, stacks  # noqa: F401

pytestmark = pytest.mark.cluster


def srecovery(stack, *args: str) -> subprocess.CompletedProcess:
    """The real CLI, as an admin runs it, against this stack's config."""
    argv = [sys.executable, "-m", "slurm_recovery.cli", "--config", str(stack.config), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _open_and_released(stack, job_id: int):
    with Store.open(stack.db, readonly=True) as store:
        for incident in store.list_incidents(open_only=True):
            if "released" in store.milestones(incident.id):
                return incident
    return None


def _changes(stack, job_id: int) -> list[dict]:
    with Store.open(stack.db, readonly=True) as store:
        rows = store.evidence_by_kinds(("slurm_change",), job_id=job_id, limit=100)
        return [dict(r.evidence.payload) for r in rows]


def _waiting_job(stacks, submit, scheduler):  # noqa: F811
    stack = stacks("act")
    job_id = submit("-N4", "--wrap=sleep 600")
    first = wait_for(lambda: running(scheduler, job_id))
    bad = first.nodes[1]
    stack.report_xid(bad)
    incident = wait_for(lambda: _open_and_released(stack, job_id), timeout=30)
    return stack, job_id, bad, incident


def test_an_operator_resume_after_the_tools_drain_is_not_reverted(
    stacks,  # noqa: F811
    submit,
    scheduler,  # noqa: F811
    slurm_env,
):
    stack, job_id, bad, _ = _waiting_job(stacks, submit, scheduler)
    assert scheduler.get_node(bad).drained
    subprocess.run(
        ["scontrol", "update", f"nodename={bad}", "state=resume"], env=slurm_env, check=True
    )
    wait_for(lambda: [c for c in _changes(stack, job_id) if c["change"] == "resumed"], timeout=15)
    wait_passes(stack.url, 3)  # several passes
    assert not scheduler.get_node(bad).drained, stack.log()
    drains = [a for a in stack.actions("drain") if a.result == "ok"]
    assert len(drains) == 1, drains
    with Store.open(stack.db, readonly=True) as store:
        state = store.get_node(bad)
        assert state is not None and not state.drained_by_tool  # the blast radius forgets it
    out = srecovery(stack, "explain", str(job_id))
    assert f"Slurm: {bad} resumed after the tool drained it (kept" in out.stdout, out.stdout


def test_an_operator_hold_after_the_tools_release_is_kept(
    stacks,  # noqa: F811
    submit,
    scheduler,  # noqa: F811
    slurm_env,
):
    stack, job_id, _, _ = _waiting_job(stacks, submit, scheduler)
    subprocess.run(["scontrol", "hold", str(job_id)], env=slurm_env, check=True)
    wait_for(lambda: [c for c in _changes(stack, job_id) if c["change"] == "held"], timeout=15)
    wait_passes(stack.url, 3)
    job = scheduler.get_job(job_id)
    assert job.held, stack.log()
    releases = [a for a in stack.actions("release") if a.result == "ok"]
    assert len(releases) == 1


def test_the_users_own_exclusions_do_not_count_toward_the_cap(
    stacks,  # noqa: F811
    submit,
    scheduler,  # noqa: F811
):
    """``sbatch -x n1,n2``: a fault on its node restarts it (max_excluded_nodes = 2)."""
    stack = stacks("act")
    job_id = submit("-N1", "-x", "n1,n2", "--wrap=sleep 600")
    first = wait_for(lambda: running(scheduler, job_id))
    stack.report_xid(first.nodes[0])
    again = wait_for(lambda: running(scheduler, job_id, restarts=1), timeout=30)
    assert again.excluded_nodes == {"n1", "n2", first.nodes[0]}
    assert not [a for a in stack.actions("cancel")]


def test_an_operator_report_on_an_idle_node_drains_it_in_act_mode(
    stacks,  # noqa: F811
    scheduler,  # noqa: F811
):
    from slurm_recovery.contract.wire import event_to_json

    stack = stacks("act")
    idle = next(n.name for n in scheduler.list_nodes() if not n.drained and n.state == "IDLE")
    stack.client.post_evidence(
        [event_to_json("operator_report", time.time(), node=idle, payload={"reason": "bad fan"})],
        role="operator",
    )
    node = wait_for(lambda: (n := scheduler.get_node(idle)).drained and n, timeout=15)
    assert node.reason.startswith("srecovery:report:bad fan"), node.reason


def test_a_job_the_watchdog_released_onto_the_bad_node_is_restarted_again(
    stacks,  # noqa: F811
    submit,
    scheduler,  # noqa: F811
):
    """Item 12: no drain (as when the blast radius is reached), the controller killed right
    after ``requeue_hold``; the watchdog releases the job past the hold deadline and it runs
    again on the bad node. The controller, back, must not call that a success."""
    from slurm_recovery import localcluster

    stack = stacks(
        "act",
        hold_deadline="2s",
        policy_extra="[classes.hardware]\ndrain = false\n",
        env={"SRECOVERY_FAILPOINT": "after:requeue_hold"},
    )
    job_id = submit("-N4", "--wrap=sleep 600")
    first = wait_for(lambda: running(scheduler, job_id))
    bad = first.nodes[1]
    stack.report_xid(bad)
    wait_for(lambda: not localcluster.process_alive(stack.pid, "slurm_recovery.controller"))
    wait_for(lambda: (j := scheduler.get_job(job_id)).state == "PENDING" and j.held)
    time.sleep(2.5)  # past the hold deadline
    out = srecovery(stack, "watchdog", "--once")
    assert out.returncode == 0, out.stderr
    back = wait_for(lambda: running(scheduler, job_id, restarts=1), timeout=20)
    assert bad in back.nodes  # released before the exclusion: on the bad node again
    stack.start()  # without the failpoint
    # the restart again: held, bad excluded; 3 nodes left for a 4-node job, so it waits
    again = wait_for(
        lambda: (
            (j := scheduler.get_job(job_id)).restart_count == 2 and bad in j.excluded_nodes and j
        ),
        timeout=30,
    )
    assert again.state == "PENDING", stack.log()
    with Store.open(stack.db, readonly=True) as store:
        first_incident, second = sorted(store.list_incidents(), key=lambda i: i.id)
        assert "restarting it again" in (first_incident.outcome or "")
        # the redo, or this pass's detect when the XID came within seconds of the new start
        links = [r.payload.get("redo_of") for r in store.audit_about(incidents=[second.id])]
        assert first_incident.id in links, links
        rows = store.audit_about(incidents=[first_incident.id])
        released = [r for r in rows if r.kind == "watchdog_release"]
        assert released, [r.kind for r in rows]
        assert store.milestones(first_incident.id)["released"] == released[0].ts


def test_the_tools_exclusions_of_repaired_nodes_expire(
    stacks,  # noqa: F811
    submit,
    scheduler,  # noqa: F811
    slurm_env,
):
    """Item 4: fault, resume, fault, resume, fault: three restarts, never "3 excluded nodes";
    each attempt excludes only the node still out of service."""
    stack = stacks("act")
    job_id = submit("-N1", "--wrap=sleep 600")
    job = wait_for(lambda: running(scheduler, job_id))
    for restart in (1, 2, 3):
        bad = job.nodes[0]
        stack.report_xid(bad)
        job = wait_for(lambda r=restart: running(scheduler, job_id, restarts=r), timeout=30)
        assert job.excluded_nodes == {bad}, (restart, job.excluded_nodes, stack.log())
        assert scheduler.get_node(bad).drained
        subprocess.run(
            ["scontrol", "update", f"nodename={bad}", "state=resume"], env=slurm_env, check=True
        )
        # the loop sees the resume (and forgets the tool's drain) before the next fault
        wait_for(lambda b=bad: _not_drained_by_tool(stack, b), timeout=15)
    assert not stack.actions("cancel")


def _not_drained_by_tool(stack, node: str) -> bool:
    with Store.open(stack.db, readonly=True) as store:
        state = store.get_node(node)
        return state is not None and not state.drained_by_tool


def test_the_sites_admin_comment_survives_a_restart_and_a_stop(
    stacks,  # noqa: F811
    submit,
    scheduler,  # noqa: F811
    slurm_env,
):
    """Items 8 and 11: the site's AdminComment stays through mark, requeue and note; a job
    the tool stops later carries the stop's note, not a stale "requeued after" one."""
    site = "billing=projX;ticket=INC-4711"
    stack = stacks("act", policy_extra="max_restarts = 1\n")
    job_id = submit("-N1", "--wrap=sleep 600")
    first = wait_for(lambda: running(scheduler, job_id))
    subprocess.run(
        ["scontrol", "update", f"jobid={job_id}", f"admincomment={site}"],
        env=slurm_env,
        check=True,
    )
    stack.report_xid(first.nodes[0])
    again = wait_for(lambda: running(scheduler, job_id, restarts=1), timeout=30)
    assert again.admin_comment.startswith(site + " [srecovery: requeued after incident")
    stack.report_xid(again.nodes[0])  # the restart limit (1) is reached: stopped
    stopped = wait_for(lambda: (j := scheduler.get_job(job_id)).state == "CANCELLED" and j)
    assert stopped.admin_comment.startswith(site + " [srecovery: cancelled: "), stopped
    assert "requeued after" not in stopped.admin_comment
