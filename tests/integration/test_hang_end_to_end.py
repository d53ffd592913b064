"""Hang detection on the production path: `srecovery dev up --mode act` with a short hang
policy; a real 2-node job prints Megatron-style progress lines, then stops stepping. Its own
stack, so no other test's evidence on its nodes colours the verdict."""

from __future__ import annotations

import subprocess
import tempfile
from datetime import datetime
from pathlib import Path

import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ControllerClient
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.store import Store
from tests.conftest import _free_port_block, wait_for

pytestmark = pytest.mark.cluster

#: A job that steps every 0.5 s is hung after a few seconds without progress, not 30 minutes.
HANG_POLICY = """
[hang]
floor = "3s"
ceiling = "20s"
interval_multiple = 3.0
startup_grace = "1m"
"""
TRAINING = """#!/bin/bash
for i in $(seq 1 12); do
  echo " iteration $i/ 1000 | consumed samples: $((i * 8)) | lm loss: 2.5E+00 |"
  sleep 0.5
done
echo "waiting for a peer that never comes"; sleep 600
"""


@pytest.fixture(scope="module")
def stack(local_cluster):
    base = Path(tempfile.mkdtemp(prefix="srecovery-hang-"))
    base.chmod(0o755)
    port = _free_port_block(7, start=local_cluster.port_base + 1000)
    stack = devstack.up(
        base, nodes=4, mode="act", port_base=port, api_port=port + 6, policy_extra=HANG_POLICY
    )
    try:
        yield stack
    finally:
        devstack.down(base)


def test_a_training_job_that_stops_stepping_is_declared_hung_and_restarted(stack, tmp_path):
    """Megatron-style progress lines in the job's stdout, followed by the batch node's sidecar;
    the job stops stepping; the controller declares it hung past its own adaptive deadline
    and (act mode, cause unknown) requeues it."""
    sched = ScontrolScheduler(timeout=10, slurm_conf=str(stack.cluster.slurm_conf))
    env = localcluster.slurm_env(stack.cluster)
    script = tmp_path / "train.sh"
    script.write_text(TRAINING)
    tmp_path.chmod(0o755)
    out = tmp_path / "train-%j.out"
    job_id = int(
        subprocess.run(
            ["sbatch", "--parsable", "-N2", "-o", str(out), str(script)],
            env=env,
            cwd="/tmp",
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split(";")[0]
    )
    client = ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))
    try:
        again = wait_for(lambda: (j := sched.get_job(job_id)).restart_count == 1 and j, timeout=90)
        assert again.restart_count == 1
        incident = client.get(f"/v1/jobs/{job_id}")["incidents"][0]
        assert incident["kind"] == "hang"
        assert incident["advice"]["action"] == "requeue"
        assert incident["advice"]["verdict"]["nodes"] == []  # a hang alone blames no node
        kinds = {e["kind"] for e in incident["evidence"]}
        assert "progress" in kinds
        with Store.open(stack.base / "state.db", readonly=True) as store:
            steps = [e for e in store.find_evidence(job_id=job_id) if e.evidence.kind == "progress"]
        last = max(e.evidence.payload["ts"] for e in steps)
        assert max(e.evidence.payload["step"] for e in steps) == 12
        detected = datetime.fromisoformat(incident["milestones"]["detected"]).timestamp()
        failed = datetime.fromisoformat(incident["milestones"]["failure"]).timestamp()
        overshoot = detected - failed
        print(
            f"hang: last progress {last:.1f}, deadline passed {failed:.1f}, detected "
            f"{detected:.1f}: overshoot {overshoot:.2f}s"
        )
        assert overshoot < 5.0
    finally:
        subprocess.run(["scancel", str(job_id)], env=env)
