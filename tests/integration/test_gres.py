"""GPU GRES on the real local cluster: a fatal XID dooms only the jobs on the GPU it reaches.

Two 1-CPU jobs share a node (cons_tres, CR_CPU, 2 CPUs per node), each with ``--gres=gpu:1``,
so Slurm gives them different GPU indices. A real controller in act mode gets the XID."""

from __future__ import annotations

import time

import pytest

from slurm_recovery.scheduler import Job
from tests.conftest import wait_for
from tests.integration import test_controller
from tests.integration.test_controller import running, story_or_none

# the real controller and scheduler fixtures of test_controller
scheduler = test_controller.scheduler
stacks = test_controller.stacks

pytestmark = pytest.mark.cluster

ECC = {"xid": 48, "message": "An uncorrectable double bit error (DBE) has been detected on GPU."}
FALLEN_OFF = {"xid": 79, "message": "GPU has fallen off the bus."}


def two_jobs_on_one_node(submit, scheduler) -> tuple[Job, Job]:
    """Two running jobs on the same node, one GPU each (different indices); the second is
    pinned there with ``-w``, so a doom of it would show as a stop."""
    first_id = submit("-N1", "--gres=gpu:1", "--wrap=sleep 600")
    first = wait_for(lambda: running(scheduler, first_id))
    (node,) = first.nodes
    second_id = submit("-N1", "-w", node, "--gres=gpu:1", "--wrap=sleep 600")
    second = wait_for(lambda: running(scheduler, second_id))
    assert first.gpus is not None and second.gpus is not None
    assert first.gpus[node].isdisjoint(second.gpus[node]), (first.gpus, second.gpus)
    assert scheduler.get_node(node).gpus == 8
    return first, second


def test_a_gpu_scoped_xid_restarts_only_the_job_on_that_gpu(stacks, submit, scheduler):
    stack = stacks("act")
    first, second = two_jobs_on_one_node(submit, scheduler)
    (node,) = first.nodes
    (gpu,) = first.gpus[node]

    stack.report_xid(node, payload=ECC, gpu=gpu)
    again = wait_for(lambda: running(scheduler, first.job_id, restarts=1), timeout=30)
    assert node not in again.nodes
    (incident,) = wait_for(lambda: [i for i in story_or_none(stack, first.job_id) if i["outcome"]])
    assert incident["advice"]["verdict"]["nodes"] == [node]

    time.sleep(3)  # several loop passes after the first job's incident closed
    untouched = scheduler.get_job(second.job_id)
    assert untouched.state == "RUNNING" and untouched.restart_count == 0
    assert untouched.start_time == second.start_time and untouched.nodes == (node,)
    assert story_or_none(stack, second.job_id) == []


def test_a_node_scoped_xid_dooms_every_job_on_the_node(stacks, submit, scheduler):
    stack = stacks("act")
    first, second = two_jobs_on_one_node(submit, scheduler)
    (node,) = first.nodes
    (gpu,) = first.gpus[node]

    stack.report_xid(node, payload=FALLEN_OFF, gpu=gpu)
    again = wait_for(lambda: running(scheduler, first.job_id, restarts=1), timeout=30)
    assert node not in again.nodes
    for job in (first, second):
        (incident,) = wait_for(lambda job=job: story_or_none(stack, job.job_id))
        assert incident["kind"] == "doomed" and incident["nodes"] == [node]
    # the second job may run only on that node (-w): it is stopped, not requeued
    assert wait_for(lambda: scheduler.get_job(second.job_id).state == "CANCELLED")
