"""Job shapes a site runs beside plain sbatch jobs, with a real controller in act mode on the
real local cluster (issue 16): an array task is recovered alone (item 1); an interactive srun
job, which Slurm cannot requeue, is left running or cancelled, its node drained (item 7)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from slurm_recovery.scheduler import Job
from tests.conftest import wait_for
from tests.integration import test_controller
from tests.integration.test_controller import running, story_or_none

# the real controller and scheduler fixtures of test_controller
scheduler = test_controller.scheduler
stacks = test_controller.stacks

pytestmark = pytest.mark.cluster


def _incident_closed(stack, job_id: int) -> dict:
    (incident,) = wait_for(lambda: [i for i in story_or_none(stack, job_id) if i["outcome"]])
    return incident


def test_an_xid_under_one_array_task_recovers_that_task_alone(stacks, submit, scheduler):
    stack = stacks("act")
    # two exclusive tasks: once the bad node is drained, two of the four nodes are free for
    # the restart even if an earlier test's job still holds one
    array_id = submit("--array=0-1", "-N1", "--exclusive", "--wrap=sleep 600")

    def all_running() -> list[Job] | None:
        tasks = [j for j in scheduler.list_jobs() if j.array_job_id == array_id]
        up = [t for t in tasks if t.state == "RUNNING" and t.array_task_id is not None]
        return up if len(up) == 2 else None

    tasks = wait_for(all_running)
    # the last task Slurm starts keeps the array's own id: `scontrol requeuehold <id>` would
    # requeue every task
    (task,) = [t for t in tasks if t.job_id == array_id]
    others = [t for t in tasks if t.job_id != array_id]
    bad = task.nodes[0]

    stack.report_xid(bad)
    again = wait_for(lambda: running(scheduler, array_id, restarts=1), timeout=30)
    assert bad not in again.nodes and bad in again.excluded_nodes
    assert "requeued after incident" in again.admin_comment
    incident = _incident_closed(stack, array_id)
    steps = [a["step"] for a in incident["actions"] if a["result"] == "ok"]
    assert steps == ["drain", "mark", "requeue_hold", "exclude", "begin_now", "release", "unmark"]
    for before in others:
        after = scheduler.get_job(before.job_id)
        assert (after.state, after.restart_count, after.held) == ("RUNNING", 0, False)
        assert after.excluded_nodes == frozenset() and after.begin_time == before.begin_time
        assert after.admin_comment == before.admin_comment
        assert story_or_none(stack, before.job_id) == []


@pytest.fixture
def srun(slurm_env) -> Iterator[callable]:
    """Start ``srun ARGS`` in the background as a user's interactive job; killed after."""
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            ["srun", *args],
            env=slurm_env,
            cwd="/tmp",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=30)


def _interactive_job(sched, name: str) -> Job | None:
    found = [j for j in sched.list_jobs() if j.name == name and j.state == "RUNNING"]
    return found[0] if found else None


def test_an_interactive_job_is_left_running_and_its_node_drained(stacks, srun, scheduler):
    stack = stacks("act")
    srun("-N2", "-J", "interactive-leave", "sleep", "600")
    job = wait_for(lambda: _interactive_job(scheduler, "interactive-leave"))
    assert not job.batch
    bad = job.nodes[1]

    stack.report_xid(bad)
    incident = _incident_closed(stack, job.job_id)
    assert incident["advice"]["rule"] == "interactive_jobs"
    assert incident["advice"]["action"] == "none"
    assert "interactive (srun/salloc)" in incident["advice"]["reason"]
    assert scheduler.get_node(bad).drained
    steps = [(a["step"], a["result"]) for a in incident["actions"]]
    assert steps == [("drain", "ok")]  # no requeue tried, no hold mark, nothing failed
    assert [a for a in stack.actions() if a.result != "ok"] == []
    after = scheduler.get_job(job.job_id)
    assert (after.state, after.restart_count) == ("RUNNING", 0)
    assert "srecovery" not in after.admin_comment


def test_an_interactive_job_is_cancelled_when_the_policy_says_so(stacks, srun, scheduler):
    stack = stacks("act", policy_extra='interactive_jobs = "cancel"')
    srun("-N2", "-J", "interactive-cancel", "sleep", "600")
    job = wait_for(lambda: _interactive_job(scheduler, "interactive-cancel"))
    bad = job.nodes[0]

    stack.report_xid(bad)
    after = wait_for(lambda: (j := scheduler.get_job(job.job_id)).state == "CANCELLED" and j)
    assert after.restart_count == 0 and "interactive" in after.admin_comment
    assert scheduler.get_node(bad).drained
    incident = _incident_closed(stack, job.job_id)
    assert incident["advice"]["rule"] == "interactive_jobs"
    assert [(a["step"], a["result"]) for a in incident["actions"]] == [
        ("drain", "ok"),
        ("cancel", "ok"),
    ]
