"""squeue/sinfo --json records -> Job/Node, on output recorded from Slurm 22.05.8 and the
newer (23.02+) shapes: state lists and {"set", "number"} numbers."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.scheduler.base import ExitCode
from slurm_recovery.scheduler.scontrol import _exit_code, job_from_json, node_from_json

DATA = Path(__file__).parent / "data"


def _jobs():
    data = json.loads((DATA / "squeue-22.05.json").read_text())
    return {j.job_id: j for j in map(job_from_json, data["jobs"])}


def test_recorded_22_05_jobs():
    jobs = _jobs()
    running = jobs[1]
    assert (running.name, running.state, running.user, running.partition) == (
        "train run",
        "RUNNING",
        "root",
        "debug",
    )
    assert running.nodes == ("n1", "n2") and running.num_nodes == 2
    assert running.stdout_path == "/tmp/o-1-train run.out"
    assert not running.held and running.active
    assert running.submit_time > 1_700_000_000 and running.start_time >= running.submit_time

    assert jobs[2].state == "FAILED" and jobs[2].exit_code == ExitCode(3, 0)
    assert jobs[2].stdout_path == "/tmp/slurm-2.out"  # no -o: Slurm's default name
    assert not jobs[2].active
    assert jobs[3].exit_code == ExitCode(0, 9)

    held = jobs[5]
    assert held.state == "PENDING" and held.held
    assert held.restart_count == 1
    assert held.excluded_nodes == {"n1", "n2"}
    assert held.nodes == ()
    assert all(j.requeueable and j.required_nodes == frozenset() for j in jobs.values())


def test_recorded_22_05_nodes():
    data = json.loads((DATA / "sinfo-22.05.json").read_text())
    nodes = {n.name: n for n in map(node_from_json, data["nodes"])}
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    assert nodes["n4"].drained and nodes["n4"].reason == "xid 79 gpu1"
    assert nodes["n1"].state in {"MIXED", "ALLOCATED"} and not nodes["n1"].drained
    assert nodes["n1"].partitions == ("debug",)
    assert (nodes["n1"].address, nodes["n1"].hostname) == ("127.0.0.1", "vm")


def test_newer_slurm_shapes():
    job = job_from_json(
        {
            "job_id": 9,
            "name": "x",
            "job_state": ["PENDING", "REQUEUED"],
            "nodes": "",
            "priority": {"set": True, "infinite": False, "number": 0},
            "restart_cnt": 2,
            "submit_time": {"set": True, "number": 1_800_000_000},
            "eligible_time": {"set": False, "number": 0},
            "exit_code": {
                "status": ["SIGNALED"],
                "return_code": {"set": True, "number": 0},
                "signal": {"id": {"set": True, "number": 9}, "name": "KILL"},
            },
            "excluded_nodes": "gpu[01-03]",
            "standard_output": "/o/%j.out",
            "requeue": False,
            "required_nodes": "gpu[01-02]",
        }
    )
    assert job.state == "PENDING" and job.held and job.restart_count == 2
    assert job.submit_time == 1_800_000_000 and job.begin_time == 0
    assert job.exit_code == ExitCode(0, 9)
    assert job.excluded_nodes == {"gpu01", "gpu02", "gpu03"}
    assert job.stdout_path == "/o/9.out"
    assert not job.requeueable and job.required_nodes == {"gpu01", "gpu02"}
    node = node_from_json({"name": "g1", "state": ["IDLE", "DRAIN"], "reason": "r"})
    assert node.state == "IDLE" and node.drained


@given(st.integers(0, 255), st.integers(0, 127))
def test_raw_wait_status_round_trip(returncode, signal):
    # What 22.05 reports: exit status in the high byte, or the signal in the low bits.
    if signal:
        assert _exit_code(signal) == ExitCode(0, signal)
    else:
        assert _exit_code(returncode << 8) == ExitCode(returncode, 0)
