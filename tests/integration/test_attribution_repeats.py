"""Issue 17 on the real local cluster (`srecovery dev up --mode act`: a real controller, a
sidecar per node delivering the jobs' output and the simulated GPUs' XIDs, real Slurm):

- the node of origin: a one-node job whose output says the node's GPU memory failed is requeued
  away from that node, although the line names no host;
- the same failure after a restart stops the job instead of burning its restarts;
- repeats escalate: an application XID that one GPU keeps logging, across jobs, implicates the
  node; the first time, it is the program's.
"""

from __future__ import annotations

import time

import pytest

from slurm_recovery.contract.wire import event_to_json
from tests.conftest import wait_for, wait_passes
from tests.integration.test_log_lines_and_cleared_evidence import act_stack, slurm, srecovery

__all__ = ["slurm"]  # the fixture, shared with the issue-16 tests

pytestmark = pytest.mark.cluster

#: CUDA's own words for a GPU memory error the ECC could not correct: the node's GPU, whatever
#: the program (NVML's "Driver/library version mismatch" was the line here until issue 28 read
#: it as a restart with no node blamed: a job's image can bring its own driver libraries)
ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
TIMEOUT = (
    "[rank0]:[E1201 10:00:00.000000000 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=4242, OpType=ALLREDUCE, NumelIn=1024, "
    "NumelOut=1024, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
)


@pytest.fixture(scope="module")
def stack():
    yield from act_stack("srecovery-repeats-", 34600, "max_restarts = 2\n")


def closed(slurm, job_id: int, count: int = 1) -> list[dict] | None:
    stories = [s for s in slurm.incidents(job_id) if s["closed_at"]]
    return stories if len(stories) >= count else None


def test_a_one_node_jobs_gpu_memory_error_requeues_it_away_from_its_node(stack, slurm, tmp_path):
    tmp_path.chmod(0o755)
    job_id = slurm.submit(
        "-N1", "-o", str(tmp_path / "job-%j.out"), f'--wrap=echo "{ECC}"; sleep 2; exit 1'
    )
    (story,) = wait_for(lambda: closed(slurm, job_id), timeout=90, interval=0.5)
    advice = story["advice"]
    (node,) = advice["job"]["nodes"] if "job" in advice else advice["verdict"]["job"]["nodes"]
    assert advice["verdict"]["nodes"] == [node], (advice["reason"], advice["verdict"])
    assert advice["action"] == "requeue_exclude" and advice["exclude"] == [node], advice
    assert "cuda.ecc_uncorrectable" in advice["reason"], advice["reason"]
    again = wait_for(
        lambda: (j := slurm.scheduler.get_job(job_id)).restart_count == 1 and j, timeout=60
    )
    assert node in again.excluded_nodes


def test_the_same_failure_after_a_restart_stops_the_job(stack, slurm, tmp_path):
    tmp_path.chmod(0o755)
    # two nodes: a one-node job's collective timeout is the program's at once (stop), since
    # no network or other node sits between its ranks; across nodes it is restarted once
    job_id = slurm.submit(
        "-N2", "-o", str(tmp_path / "job-%j.out"), f"--wrap=echo '{TIMEOUT}'; sleep 2; exit 1"
    )
    first, second = wait_for(lambda: closed(slurm, job_id, 2), timeout=180, interval=1.0)
    assert first["advice"]["action"] == "requeue", first["advice"]
    assert "restart 1 of 2" in first["advice"]["reason"]
    advice = second["advice"]
    assert (advice["action"], advice["rule"]) == ("stop", "stop_on_same_failure"), advice
    assert "the same failure as before the last restart" in advice["reason"]
    wait_passes(stack.url, 3)  # a few passes: nothing restarts it again
    job = slurm.scheduler.get_job(job_id)
    assert job.restart_count == 1 and job.state in ("FAILED", "CANCELLED"), job
    assert len(slurm.incidents(job_id)) == 2


def test_an_application_xid_that_one_gpu_keeps_logging_implicates_its_node(stack, slurm):
    def run_once(node: str | None = None) -> tuple[int, str, int]:
        # not pinned with -w (a job that may run only there cannot be moved): the others out
        others = ",".join(n for n in ("n1", "n2", "n3", "n4") if n != node)
        where = ("-x", others) if node else ()
        job_id = slurm.submit("-N1", *where, "--gres=gpu:1", "--wrap=sleep 8; exit 1")
        job = wait_for(
            lambda: (j := slurm.scheduler.get_job(job_id)).state == "RUNNING" and j, timeout=60
        )
        (ran_on,) = job.nodes
        (gpu,) = job.gpus[ran_on]
        out = srecovery(stack, "sim", "inject", "--node", ran_on, "--gpu", str(gpu), "--xid", "69")
        assert out.returncode == 0, out.stderr
        return job_id, ran_on, gpu

    # the first time on this GPU: the program's fault (stopped, no node). XID 69, a graphics
    # engine class error: 13 and 31 are restarted once since i28k (a bad GPU logs them too)
    job_id, node, gpu = run_once()
    (story,) = wait_for(lambda: closed(slurm, job_id), timeout=90, interval=0.5)
    assert story["advice"]["action"] == "stop" and story["advice"]["exclude"] == []
    # the same GPU logged it twice earlier today (a sidecar's spool delivered late)
    now = time.time()
    earlier = [
        event_to_json("xid", now - hours * 3600, node=node, gpu=gpu, payload={"xid": 69})
        for hours in (3, 5)
    ]
    slurm.api.post_evidence(earlier, role="sidecar", node=node)
    job_id, again, again_gpu = run_once(node)
    assert (again, again_gpu) == (node, gpu)
    # decided (it stays pending after: every other node is excluded by its submitter)
    (story,) = wait_for(lambda: slurm.incidents(job_id), timeout=90, interval=0.5)
    advice = story["advice"]
    assert advice["verdict"]["fault_class"] == "hardware", advice
    assert advice["verdict"]["nodes"] == [node] and advice["exclude"] == [node], advice
    assert "times in 24 h" in advice["reason"], advice["reason"]
