"""The production path on one host: `srecovery dev up --mode act` (cluster with the hooks in
slurm.conf, controller, watchdog, a sidecar per node with simulated GPUs), a real 2-node job,
and `srecovery sim inject --xid 79` on one of its nodes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ControllerClient
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.store import Store
from tests.conftest import _free_port_block, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def stack(local_cluster):
    base = Path(tempfile.mkdtemp(prefix="srecovery-e2e-"))
    base.chmod(0o755)
    port = _free_port_block(7, start=local_cluster.port_base + 900)
    stack = devstack.up(base, nodes=4, mode="act", port_base=port, api_port=port + 6)
    try:
        yield stack
    finally:
        devstack.down(base)


def srecovery(stack, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slurm_recovery.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **stack.exports()},
    )


@pytest.fixture
def two_node_job(stack):
    """A 2-node ``sleep 600`` job on the stack's cluster: (its scheduler, its id); cancelled,
    and every drained node resumed, after the test."""
    sched = ScontrolScheduler(timeout=10, slurm_conf=str(stack.cluster.slurm_conf))
    env = localcluster.slurm_env(stack.cluster)
    job_id = int(
        subprocess.run(
            ["sbatch", "--parsable", "-N2", "--wrap=sleep 600"],
            env=env,
            cwd="/tmp",
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split(";")[0]
    )
    try:
        yield sched, job_id
    finally:
        subprocess.run(["scancel", str(job_id)], env=env)
        for node in sched.list_nodes():
            if node.drained:
                sched.resume_node(node.name)


def test_injected_xid_moves_the_job_off_the_node(stack, two_node_job):
    sched, job_id = two_node_job
    first = wait_for(lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j)
    bad = first.nodes[1]
    injected_at = time.time()
    out = srecovery(stack, "sim", "inject", "--node", bad, "--gpu", "1", "--xid", "79")
    assert out.returncode == 0, out.stderr
    again = wait_for(
        lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j.restart_count == 1 and j,
        timeout=30,
    )
    assert bad not in again.nodes and bad in again.excluded_nodes
    assert sched.get_node(bad).drained

    client = ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))
    incident = client.get(f"/v1/jobs/{job_id}")["incidents"][0]
    (xid,) = [e for e in incident["evidence"] if e["kind"] == "xid"]
    assert (xid["source"], xid["node"], xid["gpu"]) == ("sidecar", bad, 1)
    assert xid["payload"]["origin"] == "sim"
    detected = incident["milestones"]["detected"]
    latency = datetime.fromisoformat(detected).timestamp() - injected_at
    assert latency < 2.0, f"injected XID -> incident took {latency:.2f}s"

    # the hooks reported the job's start on both nodes, through the node sidecars
    with Store.open(stack.base / "state.db", readonly=True) as store:
        starts = {
            e.evidence.node
            for e in store.find_evidence(job_id=job_id)
            if e.evidence.kind == "job_start"
        }
    assert set(first.nodes) <= starts


def test_a_recovery_waiting_for_a_stopped_slurmctld_finishes_soon_after_it_answers(
    stack, two_node_job
):
    """Issue 30 item 2, on the production path: slurmctld stopped (SIGSTOP) for 12 s (past the
    tool's 10 s command timeout; the issue's probe stopped it 20 s) while an XID hits a running
    2-node job through the node's sidecar; once slurmctld answers again the restart finishes
    within 5 s (a recovery on a healthy slurmctld takes 1-4 s)."""
    sched, job_id = two_node_job
    pid = localcluster.status(stack.cluster.base)["processes"]["slurmctld"]["pid"]
    try:
        bad = wait_for(lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j).nodes[1]
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(2)
            out = srecovery(stack, "sim", "inject", "--node", bad, "--gpu", "0", "--xid", "79")
            assert out.returncode == 0, out.stderr
            time.sleep(10)
        finally:
            os.kill(pid, signal.SIGCONT)
        back = time.time()
        again = wait_for(
            lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j.restart_count == 1 and j,
            timeout=60,
        )
        took = time.time() - back
        assert bad not in again.nodes and bad in again.excluded_nodes
        client = ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))
        incident = client.get(f"/v1/jobs/{job_id}")["incidents"][0]
        milestones = incident["milestones"]
        released = datetime.fromisoformat(milestones["released"]).timestamp() - back
        print(f"slurmctld back -> released {released:.1f}s, running {took:.1f}s; {milestones}")
        assert released < 5, f"released {released:.1f}s after slurmctld answered again"
        assert sched.get_job(job_id).restart_count == 1
    finally:
        os.kill(pid, signal.SIGCONT)
