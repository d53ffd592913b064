"""attribute(): the class, the implicated nodes and GPUs, how sure, and on which evidence."""

from __future__ import annotations

import dataclasses
import random

import pytest

from slurm_recovery.decide import attribute as attribution
from slurm_recovery.decide.attribute import attribute, node_is_down
from slurm_recovery.decide.model import Evidence, FaultClass, Incident, IncidentKind
from slurm_recovery.decide.policy import EvidenceWindow, Policy
from slurm_recovery.scheduler.base import ExitCode, Job, Node
from slurm_recovery.signals.xid import load_xid_catalogue

CATALOGUE = load_xid_catalogue()
POLICY = Policy()
FAILED_AT = 10_000.0
START = 5_000


def job(state: str = "FAILED", nodes=("n1", "n2", "n3"), **kw) -> Job:
    fields = dict(
        job_id=42,
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
        end_time=int(FAILED_AT),
    )
    fields.update(kw)
    return Job(**fields)


def incident(kind: IncidentKind = IncidentKind.CRASH, failed_at: float = FAILED_AT) -> Incident:
    return Incident(42, 0, 900, kind, failed_at)


def xid(ev_id, code, node="n2", gpu=1, at=FAILED_AT - 30, job_id=None, **kw) -> Evidence:
    payload = {"xid": code, **kw}
    return Evidence(ev_id, "sidecar", "xid", at, node=node, gpu=gpu, job_id=job_id, payload=payload)


def report(ev_id, node="n3", at=FAILED_AT + 60, **payload) -> Evidence:
    return Evidence(ev_id, "operator", "operator_report", at, node=node, payload=payload)


#: real catalogue signatures: the controller judges a job's lines as ``explain-log`` does
LINES = {
    "application": ("python.exception", "ValueError: boom"),
    "hardware": ("nccl.ib_completion_error", "NET/IB : Got completion from peer with status=12"),
}


def log(ev_id, fault_class="application", node="n1", blame=False, at=FAILED_AT - 5, job_id=42):
    """A line read by ``node``'s sidecar; ``blame``: the line names its host (that node)."""
    signature, text = LINES[fault_class]
    payload = {
        "signature": signature,
        "fault_class": fault_class,
        "blame_node": blame,
        "text": text,
    }
    if blame:
        payload["host"] = node
    return Evidence(
        ev_id, "sidecar", "log_signature", at, node=node, job_id=job_id, payload=payload
    )


def down(ev_id, node="n3", at=FAILED_AT - 120, state="DOWN", flags=()) -> Evidence:
    payload = {"state": state, "flags": list(flags), "reason": "Not responding"}
    return Evidence(ev_id, "scheduler", "node_state", at, node=node, payload=payload)


def verdict(evidence, the_job=None, the_incident=None, nodes=None, policy=POLICY):
    return attribute(
        the_incident or incident(), the_job or job(), list(evidence), CATALOGUE, policy, nodes
    )


# --------------------------------------------------------------------------------- hardware


def test_a_fatal_hardware_xid_implicates_its_node_and_gpu():
    v = verdict([xid(5, 79)])
    assert v.fault_class is FaultClass.HARDWARE
    assert v.nodes == {"n2"}
    assert v.gpus == {("n2", 1)}
    assert v.confidence == attribution.FATAL_HARDWARE_XID == 0.95
    assert v.evidence_ids == (5,)
    assert v.cause == "xid 79 (GPU has fallen off the bus) on n2 gpu1"


def test_an_operator_report_is_certain():
    v = verdict([report(9, reason="bad PSU", xid=79)])
    assert v.fault_class is FaultClass.HARDWARE
    assert v.nodes == {"n3"}
    assert v.confidence == 1.0
    assert v.cause == "operator report on n3 (xid 79: bad PSU)"


def test_several_decisive_nodes_share_the_weakest_confidence():
    v = verdict([report(9, node="n1"), xid(5, 79, node="n2")])
    assert v.nodes == {"n1", "n2"}
    assert v.confidence == 0.95
    assert v.evidence_ids == (5, 9)


def test_weak_evidence_on_another_node_does_not_ride_along():
    v = verdict([xid(5, 79, node="n2"), xid(6, 92, node="n3")])
    assert v.nodes == {"n2"}
    assert v.evidence_ids == (5,)


def test_fatal_node_evidence_beats_application_evidence():
    # A GPU that fell off the bus crashes the application too: its log says "illegal address".
    v = verdict([log(1), xid(5, 79), xid(6, 13, node="n1")])
    assert v.fault_class is FaultClass.HARDWARE
    assert v.nodes == {"n2"}


def test_a_non_fatal_hardware_xid_alone_is_a_weak_hardware_verdict():
    v = verdict([xid(5, 54)])
    assert v.fault_class is FaultClass.HARDWARE
    assert v.nodes == {"n2"}
    assert v.confidence == attribution.WEAK_HARDWARE_XID


def test_application_evidence_beats_weak_node_evidence():
    v = verdict([xid(5, 92), log(1)])
    assert v.fault_class is FaultClass.APPLICATION
    assert v.nodes == frozenset()
    assert v.evidence_ids == (1,)


def test_a_hardware_log_signature_blaming_a_node_implicates_it():
    v = verdict([log(1, fault_class="hardware", node="n3", blame=True)])
    assert v.fault_class is FaultClass.HARDWARE
    assert v.nodes == {"n3"}
    assert v.confidence == attribution.HARDWARE_LOG


def test_a_hardware_log_signature_naming_no_node_implicates_none():
    v = verdict([log(1, fault_class="hardware", node="n3", blame=False)])
    assert v.fault_class is FaultClass.HARDWARE
    assert v.nodes == frozenset()
    assert v.confidence == attribution.UNNAMED_NODE_LOG


# --------------------------------------------------------------------------------- system


def test_a_gsp_xid_is_a_system_fault_on_its_node():
    v = verdict([xid(5, 119, node="n1", gpu=0)])
    assert v.fault_class is FaultClass.SYSTEM
    assert v.nodes == {"n1"}
    assert v.confidence == attribution.FATAL_SYSTEM_XID


def test_hardware_beats_system_when_both_are_decisive():
    v = verdict([xid(5, 119, node="n1"), xid(6, 79, node="n2")])
    assert v.fault_class is FaultClass.HARDWARE
    assert v.nodes == {"n2"}


def test_node_fail_implicates_the_nodes_slurm_showed_down():
    ended = job(state="NODE_FAIL")
    end = Evidence(2, "scheduler", "job_end", FAILED_AT, job_id=42, payload={"state": "NODE_FAIL"})
    v = verdict([down(7, node="n3", flags=["NOT_RESPONDING"]), end, log(1)], the_job=ended)
    assert v.fault_class is FaultClass.SYSTEM
    assert v.nodes == {"n3"}
    assert v.confidence == attribution.NODE_LOST == 0.8
    assert v.evidence_ids == (2, 7)
    assert v.cause.startswith("Slurm showed n3 down")


def test_node_fail_without_node_evidence_implicates_no_node():
    ended = job(state="NODE_FAIL")
    slurm = {"n3": Node("n3", "DOWN", flags=frozenset({"NOT_RESPONDING"}))}
    v = verdict([log(1)], the_job=ended, nodes=slurm)
    assert v.fault_class is FaultClass.SYSTEM
    assert v.nodes == frozenset()
    assert v.confidence == attribution.NODE_LOST_UNNAMED
    assert (
        v.cause == "Slurm ended the job NODE_FAIL (it shows n3 down, but no node evidence names it)"
    )


def test_a_node_down_while_the_job_failed_otherwise_is_weak_system_evidence():
    v = verdict([down(7, node="n1")])
    assert v.fault_class is FaultClass.SYSTEM
    assert v.nodes == {"n1"}
    assert v.confidence == attribution.NODE_DOWN


def test_a_node_state_that_is_not_down_is_no_evidence():
    assert verdict([down(7, state="ALLOCATED")]).fault_class is FaultClass.UNKNOWN


@pytest.mark.parametrize(
    ("state", "flags", "is_down"),
    [
        ("DOWN", (), True),
        ("down*", (), True),
        ("IDLE", ("NOT_RESPONDING",), True),
        ("FAIL", (), True),
        ("ALLOCATED", ("DRAIN",), False),
        ("MIXED", (), False),
    ],
)
def test_node_is_down(state, flags, is_down):
    assert node_is_down(state, flags) is is_down


# --------------------------------------------------------------------------------- application


@pytest.mark.parametrize("code", [11, 25, 43, 69, 137])
def test_application_xids_implicate_no_node(code):
    v = verdict([xid(5, code)])
    assert v.fault_class is FaultClass.APPLICATION
    assert v.nodes == frozenset()
    assert v.gpus == frozenset()
    assert v.evidence_ids == (5,)


@pytest.mark.parametrize("code", [13, 31])
def test_a_gpu_kernel_s_fault_xid_is_restarted_once_implicating_no_node(code):
    # i28k: NVIDIA's RESTART_APP; a program's bug, a driver's or the GPU's (docs/signatures.md,
    # "When the answer is stop"): the class is unknown, so the job is restarted, not stopped
    v = verdict([xid(5, code)])
    assert v.fault_class is FaultClass.UNKNOWN
    assert v.nodes == frozenset() and v.gpus == frozenset()


def test_an_application_xid_of_another_job_is_not_ours():
    assert verdict([xid(5, 13, job_id=77)]).fault_class is FaultClass.UNKNOWN


def test_an_application_log_signature_with_a_node_never_blames_it():
    v = verdict([log(1, node="n2", blame=False)], the_incident=incident(IncidentKind.APP_FAULT))
    assert v.fault_class is FaultClass.APPLICATION
    assert v.nodes == frozenset()
    assert v.confidence == attribution.APPLICATION_LOG
    assert v.cause == "log: python.exception"


def test_out_of_memory_is_the_application():
    v = verdict([], the_job=job(state="OUT_OF_MEMORY"))
    assert v.fault_class is FaultClass.APPLICATION
    assert v.confidence == attribution.OUT_OF_MEMORY
    assert "OUT_OF_MEMORY" in v.cause


def test_log_signatures_of_an_earlier_attempt_do_not_count():
    assert verdict([log(1, at=START - 60)]).fault_class is FaultClass.UNKNOWN


# --------------------------------------------------------------------------------- unknown


def test_nothing_is_unknown_with_no_nodes_and_no_confidence():
    v = verdict([])
    assert v.fault_class is FaultClass.UNKNOWN
    assert v.nodes == frozenset()
    assert v.confidence == 0.0
    assert v.evidence_ids == ()
    assert v.cause.startswith("no evidence of the cause")


def test_exit_code_93_stays_unknown_and_says_why():
    end = Evidence(2, "hook", "job_end", FAILED_AT, job_id=42, payload={"exit_code": 93})
    v = verdict([end], the_job=job(exit_code=ExitCode(93, 0)))
    assert v.fault_class is FaultClass.UNKNOWN
    assert v.cause.startswith("exit code 93: the job asked not to be requeued")
    assert v.evidence_ids == (2,)


def test_an_uncatalogued_xid_is_reported_but_implicates_nothing():
    v = verdict([xid(5, 4242)])
    assert v.fault_class is FaultClass.UNKNOWN
    assert v.nodes == frozenset()
    assert v.evidence_ids == (5,)
    assert "xid 4242 (not in the XID catalogue) on n2 gpu1" in v.cause


# --------------------------------------------------------------------------------- scope


def test_evidence_outside_the_window_does_not_count():
    before = FAILED_AT - POLICY.fatal_evidence_window.window_before
    after = FAILED_AT + POLICY.fatal_evidence_window.window_after
    assert verdict([xid(5, 79, at=before - 0.1)]).fault_class is FaultClass.UNKNOWN
    assert verdict([xid(5, 79, at=after + 0.1)]).fault_class is FaultClass.UNKNOWN
    assert verdict([xid(5, 79, at=before)]).nodes == {"n2"}
    assert verdict([xid(5, 79, at=after)]).nodes == {"n2"}


def test_the_window_comes_from_the_policy():
    narrow = Policy(fatal_evidence_window=EvidenceWindow(10, 10))
    assert verdict([xid(5, 79, at=FAILED_AT - 30)], policy=narrow).fault_class is FaultClass.UNKNOWN


def test_evidence_from_nodes_outside_the_job_never_implicates_them():
    v = verdict([xid(5, 79, node="n9"), report(6, node="n8"), down(7, node="n7")])
    assert v.fault_class is FaultClass.UNKNOWN
    assert v.nodes == frozenset()


def test_the_job_must_be_the_incident_job():
    with pytest.raises(ValueError, match="incident for job 42"):
        attribute(incident(), job(job_id=43), [], CATALOGUE, POLICY)


def test_same_evidence_in_any_order_gives_the_same_verdict():
    evidence = [xid(5, 79), report(9, node="n1"), log(1), xid(6, 92, node="n3"), down(7)]
    first = verdict(evidence)
    for seed in range(5):
        shuffled = evidence[:]
        random.Random(seed).shuffle(shuffled)
        assert verdict(shuffled) == first


def test_a_long_cause_is_shortened():
    evidence = [xid(i, 79, node="n1", gpu=i) for i in range(5)]
    v = verdict(evidence)
    assert v.cause.endswith("(+3 more)")
    assert v.gpus == {("n1", i) for i in range(5)}


def test_the_job_end_record_supports_only_verdicts_drawn_from_the_job_state():
    end = Evidence(2, "hook", "job_end", FAILED_AT, job_id=42, payload={"state": "FAILED"})
    assert verdict([end, log(1)]).evidence_ids == (1,)
    assert verdict([end], the_job=job(state="OUT_OF_MEMORY")).evidence_ids == (2,)


def test_evidence_from_before_an_admin_resumed_the_node_does_not_count():
    resumed = Evidence(
        9, "scheduler", "slurm_change", FAILED_AT - 60, node="n1",
        payload={"change": "resumed", "node": "n1", "was_tool_drain": True},
    )  # fmt: skip
    old_report = xid(5, 79, node="n1", at=FAILED_AT - 120)
    v = verdict([old_report, resumed])
    assert v.nodes == frozenset() and v.fault_class is FaultClass.UNKNOWN
    after = xid(6, 79, node="n1", at=FAILED_AT - 30)  # it broke again after the repair
    assert verdict([old_report, resumed, after]).nodes == {"n1"}


def test_a_gpu_scoped_xid_on_another_jobs_gpu_does_not_explain_a_crash():
    """Job 42 holds gpu3 on n2; an ECC error (XID 48, scope gpu) on n2 gpu1 is another job's,
    a fallen-off-the-bus (79, scope node) on n2 reaches every GPU of the node."""
    nodes = {n: Node(n, "MIXED", gpus=8) for n in ("n1", "n2", "n3")}
    crashed = job(gpus={"n2": frozenset({3})})
    other_gpu = attribute(incident(), crashed, [xid(1, 48, gpu=1)], CATALOGUE, POLICY, nodes)
    assert other_gpu.fault_class is FaultClass.UNKNOWN and not other_gpu.nodes
    own_gpu = attribute(incident(), crashed, [xid(1, 48, gpu=3)], CATALOGUE, POLICY, nodes)
    assert own_gpu.nodes == {"n2"} and own_gpu.fault_class is FaultClass.HARDWARE
    bus = attribute(incident(), crashed, [xid(1, 79, gpu=1)], CATALOGUE, POLICY, nodes)
    assert bus.nodes == {"n2"}
    unknown = attribute(incident(), job(), [xid(1, 48, gpu=1)], CATALOGUE, POLICY, nodes)
    assert unknown.nodes == {"n2"}  # Slurm did not say which GPUs the job holds


def test_xid_45_after_another_xid_on_the_node_is_a_knock_on_and_45_alone_is_node_side():
    alone = verdict([xid(5, 45)])
    assert alone.fault_class is FaultClass.SYSTEM and alone.nodes == {"n2"}
    # 45 tears channels down after the 79; only the 79 is a finding
    after = verdict([xid(5, 79), xid(6, 45)])
    assert after.fault_class is FaultClass.HARDWARE and after.evidence_ids == (5,)


def test_an_ignore_xid_is_no_finding_against_the_node():
    for code in (63, 92):
        assert verdict([xid(5, code)]).nodes == frozenset(), code


# --------------------------------------------------------------------------------- repeats


def test_an_application_xid_repeating_on_one_gpu_across_jobs_implicates_its_node():
    day = [xid(100 + i, 13, at=FAILED_AT - 3600 * (i + 2), job_id=900 + i) for i in range(2)]
    v = verdict([*day, xid(5, 13)])
    assert v.fault_class is FaultClass.HARDWARE and v.nodes == {"n2"}
    assert v.confidence == attribution.WEAK_HARDWARE_XID
    assert "3 times in 24 h" in v.cause


def test_repeats_within_one_episode_or_on_every_gpu_or_too_old_stay_the_programs():
    # (XID 13 is restarted once since i28k, class unknown: what matters is no node implicated)
    burst = [xid(100 + i, 13, at=FAILED_AT - 30 - i) for i in range(5)]  # one crash, five lines
    assert verdict(burst).fault_class is FaultClass.UNKNOWN
    day = [xid(100 + i, 13, at=FAILED_AT - 3600 * (i + 2)) for i in range(2)]
    # the same XID on another GPU of the job in this incident: the program hits every GPU
    both = verdict([*day, xid(5, 13), xid(6, 13, gpu=2)])
    assert both.fault_class is FaultClass.UNKNOWN
    old = [xid(100 + i, 13, at=FAILED_AT - 86400 - 3600 * (i + 1)) for i in range(2)]
    assert verdict([*old, xid(5, 13)]).fault_class is FaultClass.UNKNOWN


def test_xid_repeats_zero_turns_the_rule_off():
    day = [xid(100 + i, 13, at=FAILED_AT - 3600 * (i + 2)) for i in range(3)]
    off = dataclasses.replace(POLICY, xid_repeats=0)
    assert verdict([*day, xid(5, 13)], policy=off).fault_class is FaultClass.UNKNOWN
