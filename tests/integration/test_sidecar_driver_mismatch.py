"""The node's driver version mismatch through the real path on the local cluster (`srecovery dev
up --mode act`: a real controller, a sidecar per node with the simulated GPUs, real Slurm).

`srecovery sim inject --driver-mismatch` makes a node's simulated NVML answer as the NVML
backend answers its own failed ``nvmlInit`` (LIB_RM_VERSION_MISMATCH): the sidecar sends the
fatal ``driver_version_mismatch`` of the node, and the controller

- requeues a job that failed there saying "Failed to initialize NVML: Driver/library version
  mismatch" away from that node (the line alone, on a node without the finding, blames none);
- touches no job already running there (its processes keep the libraries they loaded);
- once the mismatch is gone (``--clear``, as the reboot), no longer holds it against the node.
"""

from __future__ import annotations

import pytest

from tests.conftest import wait_for, wait_passes
from tests.integration.test_log_lines_and_cleared_evidence import act_stack, slurm, srecovery

__all__ = ["slurm"]  # the fixture, shared with the issue-16 tests

pytestmark = pytest.mark.cluster

#: What a CUDA program (or nvidia-smi) prints on a node whose driver was upgraded under it.
LINE = "Failed to initialize NVML: Driver/library version mismatch"
NODES = ("n1", "n2", "n3", "n4")
CHECK = "driver_version_mismatch"


@pytest.fixture(scope="module")
def stack():
    yield from act_stack("srecovery-mismatch-", 34700, "max_restarts = 2\n")


def only_on(node: str) -> tuple[str, str]:
    """Kept to ``node`` by excluding the others, as test_attribution_repeats does (not ``-w``:
    a job that may run only there cannot be moved)."""
    return ("-x", ",".join(n for n in NODES if n != node))


def open_checks(slurm, node: str) -> set[str]:
    """The checks of the findings the controller holds open on ``node``."""
    found = slurm.api.get(f"/v1/nodes/{node}")["findings"]
    return {f["check"] for f in found}


def failing_job(slurm, tmp_path, node: str) -> int:
    return slurm.submit(
        "-N1", *only_on(node), "-o", str(tmp_path / "job-%j.out"),
        f'--wrap=echo "{LINE}"; sleep 2; exit 1',
    )  # fmt: skip


def first_advice(slurm, job_id: int) -> dict:
    (story, *_) = wait_for(lambda: slurm.incidents(job_id), timeout=90, interval=0.5)
    return story["advice"]


def test_the_sidecars_mismatch_moves_a_failed_job_and_leaves_a_running_one(stack, slurm, tmp_path):
    tmp_path.chmod(0o755)
    node, other = "n2", "n3"
    running = slurm.submit("-N1", *only_on(node), "--wrap=sleep 600")
    wait_for(lambda: slurm.scheduler.get_job(running).state == "RUNNING", timeout=60)
    out = srecovery(stack, "sim", "inject", "--node", node, "--driver-mismatch")
    assert out.returncode == 0, out.stderr
    assert "driver libraries and kernel module differ" in out.stdout
    # the sidecar's next slow poll sends it; the controller holds it open on the node
    wait_for(lambda: CHECK in open_checks(slurm, node), timeout=40, interval=0.5)
    (finding,) = [
        e
        for e in slurm.api.get(f"/v1/nodes/{node}")["recent_evidence"]
        if e["kind"] == "gpu_finding" and e["payload"].get("check") == CHECK
    ]
    assert finding["gpu"] is None and finding["payload"]["severity"] == "fatal", finding
    assert finding["payload"]["call"] == "nvmlInit" and "rebooted" in finding["payload"]["detail"]

    # the same failing job on the node with the finding and on one without
    on_node = failing_job(slurm, tmp_path, node)
    elsewhere = failing_job(slurm, tmp_path, other)
    advice = first_advice(slurm, on_node)
    assert advice["action"] == "requeue_exclude" and advice["exclude"] == [node], advice
    assert advice["verdict"]["fault_class"] == "system", advice["verdict"]
    assert advice["verdict"]["nodes"] == [node], advice["verdict"]
    assert f"{CHECK} on {node}" in advice["reason"], advice["reason"]
    assert advice["drain"] == [], advice  # classes.system.drain is false by default
    plain = first_advice(slurm, elsewhere)
    assert plain["action"] == "requeue" and plain["exclude"] == [], plain
    assert plain["verdict"]["nodes"] == [], plain["verdict"]
    assert "nvml.version_mismatch" in plain["reason"], plain["reason"]  # the line was read

    # the job that was running when the driver changed under it is left alone
    wait_passes(stack.url, 3)
    job = slurm.scheduler.get_job(running)
    assert job.state == "RUNNING" and job.restart_count == 0, job
    assert list(job.nodes) == [node], job
    assert not slurm.scheduler.get_node(node).drained
    for story in slurm.incidents(running):  # if anything was said of it: no step taken
        assert story["advice"]["action"] == "none", story["advice"]
        assert not [e for e in story["timeline"] if e["type"] == "action"], story["timeline"]

    # the reboot (--clear of every GPU): the finding ends, a later failure there blames no node
    out = srecovery(stack, "sim", "inject", "--node", node, "--clear")
    assert out.returncode == 0, out.stderr
    wait_for(lambda: CHECK not in open_checks(slurm, node), timeout=40, interval=0.5)
    cleared = wait_for(
        lambda: [
            e
            for e in slurm.api.get(f"/v1/nodes/{node}")["recent_evidence"]
            if e["payload"].get("check") == CHECK and e["payload"].get("cleared") is True
        ],
        timeout=40,
        interval=0.5,
    )
    assert cleared[0]["payload"]["severity"] == "info", cleared
    later = failing_job(slurm, tmp_path, node)
    advice = first_advice(slurm, later)
    assert advice["exclude"] == [] and advice["verdict"]["nodes"] == [], advice
    assert advice["action"] == "requeue", advice
    assert CHECK not in advice["reason"] and "nvml.version_mismatch" in advice["reason"], advice
    assert slurm.scheduler.get_job(running).state == "RUNNING"
