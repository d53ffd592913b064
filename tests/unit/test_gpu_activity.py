"""GPU activity: the sidecar source on simulated GPUs (real state files), and the core's
GPU-idle hang for jobs that report no step progress."""

from __future__ import annotations

from slurm_recovery.decide.hang import detect_gpu_idle, hang_incidents
from slurm_recovery.decide.model import ClusterView, Evidence, IncidentKind
from slurm_recovery.decide.policy import HangPolicy, policy_from_toml
from slurm_recovery.scheduler.base import Job, Node
from slurm_recovery.sidecar.base import Finding
from slurm_recovery.sidecar.sim import SimBackend, inject
from slurm_recovery.sidecar.sources.gpuactivity import GpuActivitySource

NOW = 1_800_000_000.0


def start(job_id: int, gpus=None, nodes=("n1",)) -> Finding:
    payload = {"nodes": list(nodes)} | ({"gpus": gpus} if gpus is not None else {})
    return Finding("job_start", NOW, job_id=job_id, payload=payload)


def test_activity_is_sent_on_each_change_per_job(tmp_path):
    backend = SimBackend("n1", tmp_path, 4)
    source = GpuActivitySource(backend, "n1")
    assert source.poll(NOW) == []  # no jobs: nothing read
    source.see([start(5, gpus=[2, 3]), start(6), start(7, nodes=("n9",))])
    first = source.poll(NOW)
    assert [(f.job_id, f.payload["busy"]) for f in first] == [(5, False), (6, False)]
    assert first[0].payload["gpus"] == [2, 3] and first[1].payload["gpus"] == [0, 1, 2, 3]
    assert source.poll(NOW + 10) == []  # no change, no event
    inject(tmp_path, "n1", gpu=3, utilization=97)
    busy = source.poll(NOW + 20)
    assert [(f.job_id, f.payload["busy"], f.payload["utilization"]) for f in busy] == [
        (5, True, 97),
        (6, True, 97),
    ]
    inject(tmp_path, "n1", gpu=3, utilization=0)
    inject(tmp_path, "n1", gpu=0, utilization=50)
    after = source.poll(NOW + 30)
    assert [(f.job_id, f.payload["busy"]) for f in after] == [(5, False)]  # 6 still has GPU 0
    source.see([Finding("job_end", NOW + 40, job_id=5, payload={})])
    source.poll(NOW + 40)
    assert 5 not in source.jobs


def activity(ev_id, node, at, busy, job_id=7):
    return Evidence(
        ev_id, "sidecar", "gpu_activity", at, node=node, job_id=job_id, payload={"busy": busy}
    )


POLICY = HangPolicy(gpu_idle=60.0)
START = 1000.0


def test_idle_after_busy_on_every_node_past_the_deadline_is_a_hang():
    evidence = [
        activity(1, "n1", START + 5, True),
        activity(2, "n2", START + 6, True),
        activity(3, "n2", START + 100, False),
        activity(4, "n1", START + 110, False),
    ]
    assert detect_gpu_idle(7, evidence, START, START + 169, POLICY) is None
    found = detect_gpu_idle(7, evidence, START, START + 171, POLICY)
    assert found is not None and found.hung_since == START + 170
    assert found.stalled_nodes == {"n2"} and "idle first: n2" in found.summary


def test_never_busy_or_still_busy_somewhere_or_previous_attempt_is_no_hang():
    never = [activity(1, "n1", START + 5, False)]
    assert detect_gpu_idle(7, never, START, START + 10_000, POLICY) is None
    partly = [
        activity(1, "n1", START + 5, True),
        activity(2, "n2", START + 5, True),
        activity(3, "n1", START + 50, False),
    ]
    assert detect_gpu_idle(7, partly, START, START + 10_000, POLICY) is None
    old = [activity(1, "n1", START - 500, True), activity(2, "n1", START - 400, False)]
    assert detect_gpu_idle(7, old, START, START + 10_000, POLICY) is None


def test_the_controller_path_opens_a_hang_only_without_step_progress():
    policy = policy_from_toml('[hang]\ngpu_idle = "1m"\n')
    job = Job(
        job_id=7, name="t", state="RUNNING", reason="", user="u", partition="p",
        nodes=("n1",), num_nodes=1, submit_time=900, restart_count=0, start_time=int(START),
    )  # fmt: skip
    view = ClusterView(
        now=START + 200, jobs={7: job}, nodes={"n1": Node("n1", "ALLOCATED", partitions=("p",))}
    )
    evidence = [activity(1, "n1", START + 5, True), activity(2, "n1", START + 100, False)]
    (incident,) = hang_incidents(view, evidence, set(), policy)
    assert incident.kind is IncidentKind.HANG and incident.trigger_ids == (1, 2)
    stepping = Evidence(
        3, "sidecar", "progress", START + 199, node="n1", job_id=7,
        payload={"step": 5, "ts": START + 199, "origin": "log"},
    )  # fmt: skip
    assert hang_incidents(view, [*evidence, stepping], set(), policy) == []
