"""Slurm 25.11+'s own fast path, cooperated with: ``enable_expedited_requeue`` on, jobs
submitted ``--requeue=expedite``, the dev stack in act mode on the real cluster.

- the job's own crash, no Epilog failing: Slurm holds the job itself (REQUEUE_HOLD, restart
  count 1, "job requeued in held state"). Before, the tool opened no incident and the job
  waited for a person; now it is judged as the attempt that failed (an application bug:
  stopped with the reason, no node blamed);
- a GPU fault under a running job: running again once, without the node, restart count 1;
- a node death: Slurm holds the job once it marks the node DOWN; the tool releases it, and
  it runs again elsewhere (before, it stayed held).

Skipped below 25.11, where ``--requeue=expedite`` does not exist (CI runs these on 26.05)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ClientError, ControllerClient
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from tests.conftest import _free_port_block, wait_for

pytestmark = pytest.mark.cluster

CLI = (sys.executable, "-m", "slurm_recovery.cli")
BUG = "import sys; print('step 1', flush=True); data = {}; data['sample_7']"


@pytest.fixture(scope="module")
def stack(local_cluster):
    release = localcluster.slurm_release(local_cluster)
    if tuple(int(p) for p in release.split(".")) < (25, 11):
        pytest.skip(f"Slurm {release}: expedited requeue is 25.11+ (CI runs this on 26.05)")
    base = Path(tempfile.mkdtemp(prefix="srecovery-expedite-"))
    base.chmod(0o755)
    port = _free_port_block(7, start=local_cluster.port_base + 700)
    stack = devstack.up(
        base,
        nodes=4,
        mode="act",
        port_base=port,
        api_port=port + 6,
        slurm=os.environ.get("SRECOVERY_SLURM", "default"),
        slurm_conf_extra=["SlurmctldParameters=enable_expedited_requeue"],
    )
    try:
        yield stack
    finally:
        devstack.down(base)


@pytest.fixture
def sched(stack):
    return ScontrolScheduler(timeout=10, slurm_conf=str(stack.cluster.slurm_conf))


@pytest.fixture
def client(stack):
    return ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))


def sbatch(stack, *args: str) -> int:
    out = subprocess.run(
        ["sbatch", "--parsable", "--requeue=expedite", *args],
        env=localcluster.slurm_env(stack.cluster),
        cwd="/tmp",
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split(";")[0])


def incidents(client, job_id: int) -> list[dict]:
    try:
        return client.get(f"/v1/jobs/{job_id}")["incidents"]
    except ClientError as exc:
        if exc.status != 404:  # 404: none recorded yet
            raise
        return []


def test_slurms_hold_of_a_crashed_job_gets_an_incident_and_the_verdict(stack, sched, client):
    job_id = sbatch(stack, "-N1", f'--wrap=python3 -c "{BUG}"')
    try:
        held = wait_for(
            lambda: (j := sched.get_job(job_id)).restart_count == 1 and j.held and j, timeout=30
        )
        assert held.expedited_requeue  # Slurm held it: the case that used to go unseen
        story = wait_for(
            lambda: [i for i in incidents(client, job_id) if (i.get("advice") or {}).get("action")],
            timeout=30,
        )[0]
        advice = story["advice"]
        assert story["kind"] == "crash" and story["restart_count"] == 0, story
        assert advice["action"] == "stop", advice
        assert advice["verdict"]["fault_class"] == "application", advice
        assert not advice["verdict"].get("nodes") and not advice.get("drain"), advice
        ended = wait_for(lambda: not (j := sched.get_job(job_id)).active and j, timeout=30)
        assert ended.state == "CANCELLED" and ended.restart_count == 1, ended
        assert not [n.name for n in sched.list_nodes() if n.drained]
    finally:
        subprocess.run(["scancel", str(job_id)], env=localcluster.slurm_env(stack.cluster))


def test_a_gpu_fault_restarts_the_expedited_job_once_without_the_node(stack, sched, client):
    job_id = sbatch(stack, "-N2", "--wrap=sleep 600")
    env = {**os.environ, **stack.exports()}
    try:
        first = wait_for(lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j)
        bad = first.nodes[1]
        subprocess.run(
            [*CLI, "sim", "inject", "--node", bad, "--gpu", "1", "--xid", "79"],
            env=env,
            check=True,
            capture_output=True,
        )
        again = wait_for(
            lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j.restart_count >= 1 and j,
            timeout=30,
        )
        time.sleep(3)  # two more passes: no second restart
        again = sched.get_job(job_id)
        assert again.restart_count == 1 and bad not in again.nodes, again
        assert sched.get_node(bad).drained
    finally:
        subprocess.run(["scancel", str(job_id)], env=localcluster.slurm_env(stack.cluster))
        subprocess.run(  # leave the module's stack as found for the next test
            ["scontrol", "update", f"nodename={bad}", "state=resume"],
            env=localcluster.slurm_env(stack.cluster),
            capture_output=True,
        )


def test_a_dead_node_does_not_leave_the_expedited_job_held(stack, sched, client):
    """The node's slurmd killed: srun loses it, the batch script exits non-zero, the job sits
    COMPLETING until Slurm marks the node DOWN (SlurmdTimeout), then Slurm holds it. Before,
    it stayed held; now it runs again, on other nodes, once, seconds after the hold."""
    job_id = sbatch(stack, "-N2", "--wrap=srun sleep 600")
    env = localcluster.slurm_env(stack.cluster)
    dead = ""
    try:
        first = wait_for(lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j)
        dead = first.nodes[1]
        state = json.loads((stack.cluster.base / "cluster.json").read_text())
        os.kill(state["pids"][f"slurmd:{dead}"], signal.SIGKILL)
        held = wait_for(
            lambda: (j := sched.get_job(job_id)).restart_count == 1 and not j.nodes and j,
            timeout=120,
            interval=0.2,
        )
        held_at = time.monotonic()
        again = wait_for(lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j, timeout=30)
        assert time.monotonic() - held_at < 10, "not restarted within seconds of Slurm's hold"
        assert again.restart_count == 1 and dead not in again.nodes, (held, again)
        (story,) = incidents(client, job_id)
        assert story["kind"] == "crash" and story["restart_count"] == 0, story
        steps = client.get(f"/v1/incidents/{story['id']}")
        assert "expedited requeue" in json.dumps(steps), "the audit must say Slurm requeued it"
    finally:
        subprocess.run(["scancel", str(job_id)], env=env)
        localcluster.up(stack.cluster)  # the killed slurmd back
        subprocess.run(
            ["scontrol", "update", f"nodename={dead}", "state=resume"], env=env, capture_output=True
        )
