"""The shared fake Slurm (tests/fakeslurm.py) keeps the scheduler interface: its methods and
signatures, and the rules tests/integration/test_scheduler_contract.py shows on real Slurm."""

from __future__ import annotations

import inspect

import pytest

from slurm_recovery.scheduler import InvalidRequest, Job, Node, Scheduler, UnknownJob, UnknownNode
from slurm_recovery.scheduler.base import SchedulerSteps
from tests.fakeslurm import FakeSlurm

INTERFACE = sorted(n for n, v in vars(Scheduler).items() if callable(v) and not n.startswith("_"))


def job(job_id: int = 7, state: str = "RUNNING", **fields) -> Job:
    base = dict(
        job_id=job_id,
        name="train",
        state=state,
        reason="None",
        user="alice",
        partition="gpu",
        nodes=("n1", "n2") if state == "RUNNING" else (),
        num_nodes=2,
        submit_time=1_700_000_000,
        restart_count=0,
    )
    return Job(**{**base, **fields})


@pytest.fixture
def slurm() -> FakeSlurm:
    return FakeSlurm([job()], [Node(f"n{i}", "IDLE") for i in range(1, 5)])


@pytest.mark.parametrize("method", INTERFACE)
def test_every_method_of_the_interface_has_its_signature(method: str):
    assert inspect.signature(getattr(FakeSlurm, method)) == inspect.signature(
        getattr(Scheduler, method)
    )


def test_it_has_nothing_beyond_the_interface(slurm: FakeSlurm):
    assert isinstance(slurm, Scheduler)
    public = {n for n in dir(FakeSlurm) if not n.startswith("_") and callable(getattr(slurm, n))}
    # beside the interface, only SchedulerSteps' helper that every backend shares
    assert public - set(INTERFACE) == {"address"} and hasattr(SchedulerSteps, "address")
    with pytest.raises(AttributeError):
        slurm.query(["sacct"])  # the scontrol backend's extra: code under test may not use it


def test_the_recovery_path_changes_the_job_as_slurm_does(slurm: FakeSlurm):
    slurm.requeue_hold(7)
    held = slurm.get_job(7)
    assert (held.state, held.held, held.restart_count, held.nodes) == ("PENDING", True, 1, ())
    assert slurm.add_excluded_nodes(7, ["n1"]) == {"n1"}
    assert slurm.add_excluded_nodes(7, ["n2"]) == {"n1", "n2"}  # merged, not replaced
    slurm.set_begin_now(7, at=1_700_000_000.2)
    assert slurm.get_job(7).begin_time == 1_700_000_001  # "not before": rounded up
    slurm.release(7)
    assert not slurm.get_job(7).held
    assert [step for step, _ in slurm.steps] == [
        "requeue_hold",
        "add_excluded_nodes",
        "add_excluded_nodes",
        "set_begin_now",
        "release",
    ]


def test_steps_slurm_refuses_in_the_jobs_state_are_refused(slurm: FakeSlurm):
    with pytest.raises(InvalidRequest, match="only while it is pending"):
        slurm.add_excluded_nodes(7, ["n4"])
    with pytest.raises(InvalidRequest):
        slurm.set_begin_now(7)
    slurm.requeue_hold(7)
    with pytest.raises(InvalidRequest) as refused:
        slurm.requeue_hold(7)
    assert refused.value.slurm_message == "Job is pending execution"
    slurm.cancel(7, "application fault")
    assert slurm.get_job(7).state == "CANCELLED"
    assert slurm.get_job(7).admin_comment == "[srecovery: cancelled: application fault]"
    with pytest.raises(InvalidRequest) as refused:
        slurm.release(7)
    assert refused.value.slurm_message
    assert [step for step, _ in slurm.steps][-1] == "release"  # cancel's comment not listed


def test_unknown_jobs_and_nodes_are_typed_errors(slurm: FakeSlurm):
    for step in (slurm.get_job, slurm.requeue_hold, slurm.release):
        with pytest.raises(UnknownJob) as err:
            step(999_999)
        assert "Invalid job id specified" in err.value.slurm_message
    with pytest.raises(UnknownJob):
        slurm.cancel(999_999, "test")
    with pytest.raises(UnknownNode) as node_err:
        slurm.drain_node("n99", "test")
    assert "Invalid node name specified" in node_err.value.slurm_message


def test_a_drain_reason_is_sanitized_and_resume_of_a_node_in_service_is_a_no_op(slurm):
    slurm.drain_node("n4", 'xid 79 on gpu1\n; rm -rf / "$(id)" \x00 `reboot`')
    node = slurm.get_node("n4")
    assert node.drained and node.reason == 'xid 79 on gpu1 ; rm -rf / "$(id)" `reboot`'
    with pytest.raises(ValueError, match="reason is required"):
        slurm.drain_node("n3", "\n")
    slurm.resume_node("n4")
    slurm.resume_node("n4")
    assert not slurm.get_node("n4").drained


def test_an_arrays_pending_record_is_never_acted_on():
    record = job(17, state="PENDING", array_job_id=17, array_task_id=None)
    slurm = FakeSlurm([record])
    with pytest.raises(InvalidRequest, match="pending record"):
        slurm.release(17)
    with pytest.raises(InvalidRequest, match="pending record"):
        slurm.set_admin_comment(17, "note")


def test_a_refusal_asked_for_is_raised_after_the_step_is_recorded():
    slurm = FakeSlurm([job()], refuse={("requeue_hold", 7): InvalidRequest("refused")})
    with pytest.raises(InvalidRequest, match="refused"):
        slurm.requeue_hold(7)
    assert slurm.steps == [("requeue_hold", (7,))]
    assert slurm.get_job(7).state == "RUNNING"
