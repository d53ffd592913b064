"""GPU and fabric findings from the sidecar, through detection and attribution."""

from __future__ import annotations

from slurm_recovery.decide.detect import detect, is_fatal_node_event
from slurm_recovery.decide.model import ClusterView, Evidence, FaultClass, IncidentKind
from slurm_recovery.scheduler.base import Node
from tests.unit.test_decide_attribute import CATALOGUE, FAILED_AT, POLICY, START, job, verdict


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
