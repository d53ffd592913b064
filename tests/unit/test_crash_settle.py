"""A crash no node evidence explains yet waits ``fatal_evidence_window.settle`` for the node's
XID (Slurm often shows the job's end first): decided at once, the job went back onto the
broken node. A Reconciler over a fake Slurm and a real store, with a clock the test moves."""

from __future__ import annotations

from slurm_recovery.controller.loop import Reconciler
from slurm_recovery.decide.model import FaultClass
from slurm_recovery.scheduler.base import ExitCode
from slurm_recovery.store import Store
from tests.fakeslurm import FakeSlurm
from tests.unit.test_loop_faults import reconciler
from tests.unit.test_replay import NOW, WIDE, job, nodes, xid

CRASHED = job("FAILED", exit_code=ExitCode(1, 0))


def controller(tmp_path) -> tuple[Store, Reconciler, list[float]]:
    """A controller whose clock the test moves; the job ended at NOW, after it started."""
    store = Store.open(tmp_path / "state.db")
    clock = [NOW]
    return store, reconciler(store, FakeSlurm([CRASHED], nodes()), clock), clock


def test_a_crash_waits_for_the_xid_that_arrives_after_the_jobs_end(tmp_path):
    store, reconciler, clock = controller(tmp_path)
    clock[0] = NOW + 0.3
    assert reconciler.tick() is True  # busy: it comes back within 0.1 s
    assert store.list_incidents() == [] and reconciler.settling
    store.add_evidence([xid(79, node="n2", at=NOW - 0.2)], received_at=NOW + 0.6)  # late
    clock[0] = NOW + 0.7
    reconciler.tick()
    [incident] = store.list_incidents()
    advice = store.latest_advice(incident.id)
    assert advice.verdict["verdict"]["fault_class"] == FaultClass.HARDWARE
    assert advice.verdict["verdict"]["nodes"] == ["n2"]
    assert advice.decision.startswith("requeue_exclude")


def test_with_no_evidence_the_crash_is_decided_when_the_settle_time_is_up(tmp_path):
    store, reconciler, clock = controller(tmp_path)
    clock[0] = NOW + WIDE.fatal_evidence_window.settle - 0.1
    reconciler.tick()
    assert store.list_incidents() == []
    clock[0] = NOW + WIDE.fatal_evidence_window.settle
    reconciler.tick()
    [incident] = store.list_incidents()
    assert store.latest_advice(incident.id).verdict["verdict"]["fault_class"] == FaultClass.UNKNOWN
    assert not reconciler.settling


def test_a_crash_its_node_evidence_already_explains_is_decided_at_once(tmp_path):
    store, reconciler, clock = controller(tmp_path)
    store.add_evidence([xid(79, node="n2", at=NOW - 0.2)], received_at=NOW)
    clock[0] = NOW + 0.1
    reconciler.tick()
    [incident] = store.list_incidents()
    assert store.latest_advice(incident.id).verdict["verdict"]["nodes"] == ["n2"]
