"""detect(): which job attempts are in trouble: crashes, doomed running jobs, application faults."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.decide.detect import FAILED_STATES, START_SLACK, detect
from slurm_recovery.decide.model import ClusterView, Evidence, IncidentKind
from slurm_recovery.decide.policy import Policy
from slurm_recovery.scheduler.base import ExitCode, Job, Node
from slurm_recovery.signals.xid import load_xid_catalogue

CATALOGUE = load_xid_catalogue()
POLICY = Policy()
START = 1_000


def job(job_id: int = 42, state: str = "RUNNING", nodes=("n1", "n2"), **kw) -> Job:
    fields = dict(
        job_id=job_id,
        name="train",
        state=state,
        reason="",
        user="alice",
        partition="gpu",
        nodes=tuple(nodes),
        num_nodes=len(nodes),
        submit_time=900,
        restart_count=0,
        start_time=START,
    )
    fields.update(kw)
    return Job(**fields)


def view(*jobs: Job, now: float = 2_000) -> ClusterView:
    nodes = {f"n{i}": Node(f"n{i}", "ALLOCATED", partitions=("gpu",)) for i in range(1, 9)}
    return ClusterView(now=now, jobs={j.job_id: j for j in jobs}, nodes=nodes)


def xid(ev_id: int, code: int, node: str = "n2", at: float = 1_500, gpu: int = 1, **kw):
    return Evidence(ev_id, "sidecar", "xid", at, node=node, gpu=gpu, payload={"xid": code, **kw})


#: real catalogue signatures: the controller judges them as ``srecovery explain-log`` does
LINES = {
    # (an illegal memory access is restarted once since i28k: a bad GPU prints it too)
    "application": ("cuda.device_assert", "CUDA error: device-side assert triggered"),
    "hardware": ("cuda.ecc_uncorrectable", "CUDA error: uncorrectable ECC error encountered"),
}


def log(ev_id: int, job_id: int = 42, fault_class: str = "application", at: float = 1_500):
    signature, text = LINES[fault_class]
    payload = {
        "signature": signature,
        "fault_class": fault_class,
        "blame_node": False,
        "text": text,
    }
    return Evidence(
        ev_id, "sidecar", "log_signature", at, node="n1", job_id=job_id, payload=payload
    )


def run(*jobs: Job, evidence=(), done=()):
    return detect(view(*jobs), list(evidence), set(done), CATALOGUE, POLICY)


# --------------------------------------------------------------------------------- crashes


@pytest.mark.parametrize("state", sorted(FAILED_STATES))
def test_a_job_that_ended_in_failure_is_a_crash(state):
    ended = job(state=state, end_time=1_700, exit_code=ExitCode(1, 0))
    end = Evidence(7, "hook", "job_end", 1_700.2, job_id=42, payload={"state": state})
    (incident,) = run(ended, evidence=[end])
    assert incident.kind is IncidentKind.CRASH
    assert incident.failed_at == 1_700
    assert incident.trigger_ids == (7,)
    assert (incident.job_id, incident.restart_count, incident.submit_time) == (42, 0, 900)
    assert state in incident.summary and "n[1-2]" in incident.summary


@pytest.mark.parametrize(
    "state", ["COMPLETED", "CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE", "PENDING", "RUNNING"]
)
def test_other_ends_are_not_crashes(state):
    assert run(job(state=state, end_time=1_700)) == []


def test_crash_time_falls_back_to_the_job_end_evidence_then_to_now():
    ended = job(state="FAILED", end_time=0)
    end = Evidence(3, "hook", "job_end", 1_650.0, job_id=42)
    assert run(ended, evidence=[end])[0].failed_at == 1_650.0
    assert run(ended)[0].failed_at == 2_000  # view.now


def test_a_job_end_of_an_earlier_attempt_is_not_a_trigger():
    ended = job(state="FAILED", end_time=1_700)
    old = Evidence(3, "hook", "job_end", START - 60, job_id=42)
    assert run(ended, evidence=[old])[0].trigger_ids == ()


def test_attempts_already_open_or_done_are_skipped():
    ended = job(state="FAILED", end_time=1_700, restart_count=2)
    assert run(ended, done=[(42, 2)]) == []
    assert len(run(ended, done=[(42, 1)])) == 1


# --------------------------------------------------------------------------------- doomed


def test_a_fatal_xid_on_a_running_job_node_dooms_it():
    (incident,) = run(job(), evidence=[xid(5, 79, at=1_500), xid(6, 48, node="n1", at=1_600)])
    assert incident.kind is IncidentKind.DOOMED
    assert incident.failed_at == 1_500
    assert incident.trigger_ids == (5, 6)
    assert "xid 79 (GPU has fallen off the bus) on n2 gpu1" in incident.summary


def test_an_operator_report_dooms_a_running_job():
    report = Evidence(9, "operator", "operator_report", 1_400, node="n1", payload={"reason": "PSU"})
    (incident,) = run(job(), evidence=[report])
    assert incident.kind is IncidentKind.DOOMED
    assert "operator report on n1: PSU" in incident.summary


@pytest.mark.parametrize("code", [13, 31, 43, 45, 63, 92, 94, 9999])
def test_application_non_fatal_and_unknown_xids_do_not_doom(code):
    assert run(job(), evidence=[xid(5, code)]) == []


def test_xid_154_saying_no_recovery_needed_does_not_doom():
    line = "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    assert run(job(), evidence=[xid(5, 154, message=line)]) == []
    assert len(run(job(), evidence=[xid(5, 154, message="to 0x1 (GPU Reset Required)")])) == 1


def test_fatal_evidence_on_another_node_does_not_doom():
    assert run(job(), evidence=[xid(5, 79, node="n7")]) == []


def test_fatal_evidence_from_before_the_job_started_does_not_doom():
    assert run(job(), evidence=[xid(5, 79, at=START - START_SLACK - 0.1)]) == []
    assert len(run(job(), evidence=[xid(5, 79, at=START - START_SLACK)])) == 1


def test_evidence_a_resumed_drain_answered_does_not_doom():
    """The tool drained n2 for XID 5, an operator resumed it, and the job started on it
    within START_SLACK (seen on 26.05): XID 5, which the resume record names, dooms nothing; a
    new XID does, even one stored before the controller noticed the resume (the soak test's
    resume-then-inject), and a resume record naming nothing (observe.py's) discounts nothing."""
    resumed = Evidence(7, "controller", "slurm_change", START - 1, node="n2",
                       payload={"change": "resumed", "incident": 1, "evidence": [5]})  # fmt: skip
    assert run(job(), evidence=[xid(5, 79, at=START - 1.5), resumed]) == []
    (doomed,) = run(job(), evidence=[xid(5, 79, at=START - 1.5), resumed, xid(8, 79)])
    assert doomed.trigger_ids == (8,)
    late = Evidence(9, "controller", "slurm_change", 1_600, node="n2",
                    payload={"change": "resumed", "incident": 1, "evidence": [5]})  # fmt: skip
    assert len(run(job(), evidence=[xid(8, 79, at=1_550), late])) == 1
    seen = Evidence(7, "controller", "slurm_change", START - 1, node="n2",
                    payload={"change": "resumed", "node": "n2"})  # fmt: skip
    assert len(run(job(), evidence=[xid(5, 79, at=START - 1.5), seen])) == 1


def test_evidence_without_a_usable_xid_is_ignored():
    bad = Evidence(5, "sidecar", "xid", 1_500, node="n2", payload={"xid": "seventy-nine"})
    nodeless = Evidence(6, "sidecar", "xid", 1_500, payload={"xid": 79})
    assert run(job(), evidence=[bad, nodeless]) == []


def test_only_running_jobs_are_doomed():
    for state in ("PENDING", "COMPLETING", "SUSPENDED"):
        assert run(job(state=state), evidence=[xid(5, 79)]) == []


# --------------------------------------------------------------------------------- app faults


def test_an_application_log_signature_on_a_running_job_is_an_app_fault():
    (incident,) = run(job(), evidence=[log(8)])
    assert incident.kind is IncidentKind.APP_FAULT
    assert incident.failed_at == 1_500
    assert incident.trigger_ids == (8,)
    assert "cuda.device_assert" in incident.summary


def test_a_rank_error_after_another_task_was_killed_is_not_an_app_fault():
    killed = Evidence(
        7, "sidecar", "log_signature", 1_499, node="n1", job_id=42,
        payload={"signature": "slurm.task_killed", "text": "srun: error: n1: task 1: Killed",
                 "host": "n1", "rank": 1, "line_no": 3},
    )  # fmt: skip
    assert run(job(), evidence=[killed, log(8)]) == []


def test_log_signatures_of_other_jobs_or_classes_are_not_app_faults():
    assert run(job(), evidence=[log(8, job_id=43)]) == []
    assert run(job(), evidence=[log(8, fault_class="hardware")]) == []
    assert run(job(), evidence=[log(8, at=START - 100)]) == []


def test_doomed_wins_over_app_fault_for_the_same_attempt():
    (incident,) = run(job(), evidence=[log(8, at=1_400), xid(5, 79, at=1_500)])
    assert incident.kind is IncidentKind.DOOMED


# --------------------------------------------------------------------------------- order


def test_incidents_come_in_job_id_order_and_ignore_evidence_order():
    jobs = [
        job(50, state="FAILED", end_time=1_700),
        job(7, nodes=("n3",)),
        job(30, nodes=("n4",)),
        job(12, state="COMPLETED"),
    ]
    evidence = [xid(1, 79, node="n3"), log(2, job_id=30), xid(3, 48, node="n3", at=1_450)]
    first = run(*jobs, evidence=evidence)
    assert [i.job_id for i in first] == [7, 30, 50]
    assert first[0].failed_at == 1_450
    shuffled = evidence[:]
    random.Random(4).shuffle(shuffled)
    assert run(*reversed(jobs), evidence=shuffled) == first


# ------------------------------------------------------------------- GPU-scoped XIDs (GRES)


def gres_view(*jobs: Job, gpus_per_node: int = 8) -> ClusterView:
    nodes = {f"n{i}": Node(f"n{i}", "MIXED", gpus=gpus_per_node) for i in range(1, 5)}
    return ClusterView(now=2_000, jobs={j.job_id: j for j in jobs}, nodes=nodes)


def doomed_ids(view: ClusterView, *evidence: Evidence) -> list[int]:
    found = detect(view, list(evidence), set(), CATALOGUE, POLICY)
    return [i.job_id for i in found if i.kind is IncidentKind.DOOMED]


ON_GPU0 = job(1, nodes=("n1",), gpus={"n1": frozenset({0})})
ON_GPU1 = job(2, nodes=("n1",), gpus={"n1": frozenset({1})})
NO_GPU = job(3, nodes=("n1",), gpus={})
NOT_SAID = job(4, nodes=("n1",), gpus=None)


def test_a_gpu_scoped_xid_dooms_only_the_jobs_on_that_gpu():
    # XID 48 (double-bit ECC) on n1 gpu0: only job 1 holds GPU 0; job 4's GPUs are unknown
    ecc = xid(7, 48, node="n1", gpu=0)
    assert doomed_ids(gres_view(ON_GPU0, ON_GPU1, NO_GPU, NOT_SAID), ecc) == [1, 4]


@pytest.mark.parametrize("code", [79, 74, 119, 120])
def test_a_node_scoped_xid_dooms_every_job_on_the_node(code):
    fault = xid(7, code, node="n1", gpu=0)
    assert doomed_ids(gres_view(ON_GPU0, ON_GPU1, NO_GPU, NOT_SAID), fault) == [1, 2, 3, 4]


def test_without_a_gpu_index_or_gres_a_gpu_scoped_xid_is_node_wide():
    jobs = (ON_GPU0, ON_GPU1, NO_GPU)
    no_index = xid(7, 48, node="n1", gpu=None)
    assert doomed_ids(gres_view(*jobs), no_index) == [1, 2, 3]
    on_gpu0 = xid(7, 48, node="n1", gpu=0)
    assert doomed_ids(gres_view(*jobs, gpus_per_node=0), on_gpu0) == [1, 2, 3]
    beyond = xid(7, 48, node="n1", gpu=8)  # an index Slurm's GRES does not have
    assert doomed_ids(gres_view(*jobs), beyond) == [1, 2, 3]


def test_operator_reports_and_ib_findings_stay_node_wide():
    report = Evidence(7, "operator", "operator_report", 1_500, node="n1", gpu=0)
    assert doomed_ids(gres_view(ON_GPU0, ON_GPU1, NO_GPU), report) == [1, 2, 3]
    port = Evidence(8, "sidecar", "ib_finding", 1_500, node="n1", payload={"severity": "fatal"})
    assert doomed_ids(gres_view(ON_GPU0, ON_GPU1, NO_GPU), port) == [1, 2, 3]


def test_a_multi_node_job_is_matched_on_the_xids_node():
    # job 5 holds gpu0 on n1 and gpu3 on n2: an ECC error on n2 gpu0 is not its
    wide = job(5, nodes=("n1", "n2"), gpus={"n1": frozenset({0}), "n2": frozenset({3})})
    assert doomed_ids(gres_view(wide), xid(7, 48, node="n2", gpu=0)) == []
    assert doomed_ids(gres_view(wide), xid(7, 48, node="n2", gpu=3)) == [5]


GPU_SETS = st.frozensets(st.integers(0, 7), max_size=8)


@given(
    held=st.dictionaries(st.sampled_from(["n1", "n2"]), GPU_SETS, max_size=2),
    node=st.sampled_from(["n1", "n2"]),
    gpu=st.one_of(st.none(), st.integers(0, 9)),
    code=st.sampled_from(sorted(c for c in CATALOGUE if CATALOGUE.lookup(c).fatal)),
)
def test_a_job_is_spared_only_when_slurm_shows_it_off_a_gpu_scoped_xids_gpu(held, node, gpu, code):
    running = job(6, nodes=("n1", "n2"), gpus=held)
    doomed = doomed_ids(gres_view(running), xid(7, code, node=node, gpu=gpu)) == [6]
    spared = (
        CATALOGUE.lookup(code).gpu_scoped
        and gpu is not None
        and gpu < 8
        and gpu not in held.get(node, frozenset())
    )
    assert doomed is not spared
