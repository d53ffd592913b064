"""GPU and fabric findings from the sidecar, through detection and attribution."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.decide.detect import detect, is_fatal_node_event
from slurm_recovery.decide.model import (
    Action,
    ClusterView,
    Evidence,
    FaultClass,
    IncidentKind,
    Mode,
)
from slurm_recovery.decide.policy import ClassPolicy
from slurm_recovery.scheduler.base import Node
from tests.unit.test_decide_advise import WIDE, decide
from tests.unit.test_decide_advise import job as advise_job
from tests.unit.test_decide_attribute import (
    CATALOGUE,
    FAILED_AT,
    POLICY,
    START,
    job,
    verdict,
    xid,
)


def finding(
    ev_id, kind="gpu_finding", severity="fatal", node="n2", gpu=3, at=FAILED_AT - 20, **payload
) -> Evidence:
    payload = {"check": "ecc_dbe", "severity": severity, **payload}
    return Evidence(ev_id, "sidecar", kind, at, node=node, gpu=gpu, payload=payload)


def test_a_fatal_gpu_finding_is_decisive_hardware_evidence_on_its_node():
    v = verdict([finding(1)])
    assert v.fault_class is FaultClass.HARDWARE
    assert v.nodes == {"n2"} and v.gpus == {("n2", 3)}
    assert v.confidence >= 0.9 and v.evidence_ids == (1,)
    assert "ecc_dbe on n2 gpu3" in v.cause


def test_a_warning_is_weak_and_info_is_ignored():
    weak = verdict([finding(1, severity="warning", check="throttle_thermal")])
    assert weak.fault_class is FaultClass.HARDWARE and weak.confidence < 0.9
    assert verdict([finding(1, severity="info")]).fault_class is FaultClass.UNKNOWN


def test_a_finding_on_another_node_implicates_nothing():
    assert verdict([finding(1, node="n9")]).nodes == frozenset()


def test_a_port_down_names_its_port():
    v = verdict([finding(1, kind="ib_finding", gpu=None, check="port_down", port="mlx5_0/1")])
    assert v.nodes == {"n2"} and "port_down on n2 port mlx5_0/1" in v.cause


def test_only_fatal_findings_doom_a_running_job():
    assert is_fatal_node_event(finding(1), CATALOGUE)
    assert not is_fatal_node_event(finding(1, severity="warning"), CATALOGUE)
    running = job(state="RUNNING", end_time=0)
    view = ClusterView(
        now=FAILED_AT,
        jobs={42: running},
        nodes={n: Node(n, "ALLOCATED", partitions=("gpu",)) for n in running.nodes},
    )
    (doomed,) = detect(view, [finding(7, at=START + 100)], set(), CATALOGUE, POLICY)
    assert doomed.kind is IncidentKind.DOOMED and doomed.trigger_ids == (7,)
    assert (
        detect(view, [finding(7, severity="warning", at=START + 100)], set(), CATALOGUE, POLICY)
        == []
    )


# ------------------------------------------ the sidecar's own NVML: driver libraries vs module


def mismatch(ev_id, node="n2", at=FAILED_AT - 200, severity="fatal", **payload) -> Evidence:
    """The sidecar's nvmlInit got NVML_ERROR_LIB_RM_VERSION_MISMATCH (a node finding)."""
    return finding(
        ev_id,
        node=node,
        gpu=None,
        at=at,
        severity=severity,
        check="driver_version_mismatch",
        **payload,
    )


def test_the_driver_version_mismatch_is_decisive_system_evidence_on_its_node():
    v = verdict([mismatch(1)])
    assert v.fault_class is FaultClass.SYSTEM
    assert v.nodes == {"n2"} and v.gpus == frozenset()
    assert v.confidence == 0.95 and v.evidence_ids == (1,)
    assert "driver_version_mismatch on n2" in v.cause and "reboot" in v.cause


def test_it_beats_the_application_evidence_its_failure_leaves():
    # a job's process on that node fails at its first CUDA call: an application XID or an
    # application log line must not hide the node that no new process can run on
    v = verdict([mismatch(1), xid(2, 13, node="n2")])
    assert v.fault_class is FaultClass.SYSTEM and v.nodes == {"n2"}
    # a GPU's own fatal fault still comes first (tier 1)
    v = verdict([mismatch(1), finding(3, node="n3")])
    assert v.fault_class is FaultClass.HARDWARE and v.nodes == {"n3"}


def test_a_cleared_mismatch_or_another_nodes_implicates_nothing():
    cleared = mismatch(2, at=FAILED_AT - 100, severity="info", cleared=True)
    assert verdict([mismatch(1), cleared]).fault_class is FaultClass.UNKNOWN
    assert verdict([mismatch(1, node="n9")]).nodes == frozenset()
    assert verdict([mismatch(1, at=FAILED_AT - 700)]).nodes == frozenset()  # outside the window


def test_the_mismatch_dooms_no_running_job():
    # the processes already running keep the libraries they loaded: only new ones fail
    assert not is_fatal_node_event(mismatch(1), CATALOGUE)
    running = job(state="RUNNING", end_time=0)
    view = ClusterView(
        now=FAILED_AT,
        jobs={42: running},
        nodes={n: Node(n, "ALLOCATED", partitions=("gpu",)) for n in running.nodes},
    )
    assert detect(view, [mismatch(7, at=START + 100)], set(), CATALOGUE, POLICY) == []


def test_the_advice_excludes_the_node_and_drains_it_where_system_faults_drain():
    advice = decide(verdict([mismatch(1)]), the_job=advise_job(nodes=("n1", "n2")))
    assert advice.action is Action.REQUEUE_EXCLUDE and advice.exclude == {"n2"}
    assert advice.drain == frozenset()  # classes.system.drain is false by default
    assert advice.mode is Mode.MONITOR  # advice only, as every default
    draining = dataclasses.replace(
        WIDE,
        classes={
            **WIDE.classes,
            FaultClass.SYSTEM: ClassPolicy(Action.REQUEUE_EXCLUDE, True, 0.9),
        },
    )
    advice = decide(verdict([mismatch(1)]), the_job=advise_job(nodes=("n1", "n2")), policy=draining)
    assert advice.drain == {"n2"}  # 0.95 clears the default drain_min_confidence


_OTHER = st.sampled_from(
    [
        lambda i, n, t: xid(i, 13, node=n, at=t),  # application XID
        lambda i, n, t: finding(i, node=n, at=t, severity="warning", check="throttle_thermal"),
        lambda i, n, t: finding(i, node=n, gpu=None, at=t, severity="warning", check="nvml_error"),
        lambda i, n, t: xid(i, 119, node=n, at=t),  # fatal driver/firmware XID (system, 0.9)
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    node=st.sampled_from(["n1", "n2", "n3"]),
    at=st.floats(FAILED_AT - 600, FAILED_AT + 300),
    others=st.lists(
        st.tuples(_OTHER, st.sampled_from(["n1", "n2", "n3"]), st.floats(-600, 300)),
        max_size=4,
    ),
    flip=st.booleans(),
)
def test_a_mismatch_in_the_window_always_implicates_its_node(node, at, others, flip):
    evidence = [mismatch(1, node=node, at=at)] + [
        make(i + 2, n, FAILED_AT + dt) for i, (make, n, dt) in enumerate(others)
    ]
    if flip:
        evidence.reverse()
    v = verdict(evidence)
    assert v.fault_class is FaultClass.SYSTEM
    assert node in v.nodes and 1 in v.evidence_ids
    assert v.confidence >= 0.9  # the weakest implicated node's best: a fatal XID at least
    assert not any(is_fatal_node_event(ev, CATALOGUE) for ev in evidence if ev.id == 1)
