"""The pyslurm backend's translation, over a recorded model of pyslurm 25.11.2.

pyslurm cannot run here (it needs Slurm 25.11; Debian has 22.05): these tests check what
can be checked without it -- pyslurm objects to base.Job/base.Node, each operation to the
exact pyslurm calls, RPCError to the typed errors -- and the shared error table in
slurm_recovery.scheduler.errors. The model is tests/unit/pyslurm_model/fake_pyslurm.py; most
tests run it in this process (``isolate=False``), the worker tests in the backend's own worker
process (``tests/unit/pyslurm_model/site/pyslurm``), which is what bounds every call.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slurm_recovery.contract.hostlist import expand
from slurm_recovery.scheduler.base import (
    ExitCode,
    InvalidRequest,
    Job,
    Node,
    PermissionDenied,
    Scheduler,
    SchedulerError,
    UnknownJob,
    UnknownNode,
    Unreachable,
)
from slurm_recovery.scheduler.errors import SLURM_MESSAGES, classify_slurm_error, slurm_error
from slurm_recovery.scheduler.pyslurm_backend import PyslurmScheduler, available


def _load_model():
    name = "slurm_recovery_tests_fake_pyslurm"
    path = Path(__file__).parent / "pyslurm_model" / "fake_pyslurm.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


model = _load_model()


@pytest.fixture
def world():
    return model.World()


@pytest.fixture
def pyslurm(world, monkeypatch):
    module = model.build(world)
    monkeypatch.setitem(sys.modules, "pyslurm", module)
    return module


@pytest.fixture
def sched(pyslurm, world):
    scheduler = PyslurmScheduler(isolate=False)  # the model, in this process
    world.calls.clear()
    return scheduler


def running_job(world, job_id=7, **overrides):
    values = {
        "name": "train",
        "user_name": "alice",
        "priority": 4294901,
        "state": "RUNNING",
        "state_reason": "None",
        "requeue_count": 1,
        "submit_time": 1_700_000_000,
        "eligible_time": 1_700_000_005,
        "start_time": 1_700_000_010,
        "end_time": 1_700_086_410,
        "partition": "gpu",
        "num_nodes": 3,
        "allocated_nodes": "n[1-2],m7",
        "excluded_nodes": "n4",
        "exit_code": 0,
        "exit_code_signal": 0,
        "admin_comment": None,
        "standard_output": "/home/alice/train-7.out",
    }
    values.update(overrides)
    return world.job_record(job_id, **values)


# --- module and availability -------------------------------------------------------------


def test_module_imports_where_pyslurm_is_absent():
    code = (
        "import sys; sys.modules['pyslurm'] = None\n"  # any "import pyslurm" now fails
        "from slurm_recovery.scheduler import pyslurm_backend as b\n"
        "print(b.available())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("(False, 'pyslurm does not import: ModuleNotFoundError")


def test_unavailable_and_unconstructible_without_pyslurm(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyslurm", None)
    ok, why = available()
    assert ok is False
    assert why.startswith("pyslurm does not import: ")
    with pytest.raises(ImportError):
        PyslurmScheduler()
    with pytest.raises(ImportError):
        PyslurmScheduler(isolate=False)


def test_available_when_major_minor_match(pyslurm, world):
    world.version = "25.11.0"
    ok, why = available()
    assert ok is True
    assert why == "pyslurm 25.11.2 matches slurmctld 25.11.0"


def test_pyslurm_writes_the_release_without_slurms_leading_zero(pyslurm, world, monkeypatch):
    monkeypatch.setattr(pyslurm, "__version__", "25.5.0")
    world.version = "25.05.3"
    assert available() == (True, "pyslurm 25.5.0 matches slurmctld 25.05.3")
    world.version = "25.11.0"
    ok, why = available()
    assert not ok and "pyslurm 25.5.0 is for Slurm 25.05, but slurmctld runs Slurm 25.11.0" in why


def test_unavailable_when_slurm_release_differs(pyslurm, world):
    world.version = "22.05.8"
    ok, why = available()
    assert ok is False
    assert "pyslurm 25.11.2 is for Slurm 25.11, but slurmctld runs Slurm 22.05.8" in why


def test_unavailable_when_slurmctld_does_not_answer(pyslurm, world):
    world.fail["slurmctld.Config.load"] = pyslurm.RPCError(1800)
    ok, why = available()
    assert ok is False
    assert "Unable to contact slurm controller (connect failure)" in why


def test_satisfies_the_scheduler_protocol(sched):
    assert isinstance(sched, Scheduler)
    assert sched.name == "pyslurm"


def test_cluster_name_and_version_come_from_slurmctld_config(sched, world):
    world.cluster_name, world.version = "gpu-west", "25.11.1"
    assert sched.cluster_name() == "gpu-west"
    assert sched.version() == "25.11.1"
    assert world.calls == [("slurmctld.Config.load",), ("slurmctld.Config.load",)]


# --- pyslurm objects -> base.Job / base.Node ----------------------------------------------


def test_running_job_translates_every_field(sched, world):
    running_job(world, admin_comment="seen before", is_requeueable=False, required_nodes="n[1-2]")
    assert sched.get_job(7) == Job(
        job_id=7,
        name="train",
        state="RUNNING",
        reason="None",
        user="alice",
        partition="gpu",
        nodes=("m7", "n1", "n2"),
        num_nodes=3,
        submit_time=1_700_000_000,
        restart_count=1,
        excluded_nodes=frozenset({"n4"}),
        exit_code=ExitCode(0, 0),
        held=False,
        begin_time=1_700_000_005,
        start_time=1_700_000_010,
        end_time=1_700_086_410,
        stdout_path="/home/alice/train-7.out",
        admin_comment="seen before",
        requeueable=False,
        required_nodes=frozenset({"n1", "n2"}),
    )
    assert world.calls == [("Job.load", 7)]


def test_requeued_held_job_with_unset_fields(sched, world):
    # After requeue(hold=True): priority 0, state_desc set, no nodes; pyslurm gives None
    # for every string and time Slurm left unset.
    running_job(
        world,
        state="PENDING",
        state_reason="job requeued in held state",
        priority=0,
        allocated_nodes=None,
        excluded_nodes=None,
        start_time=None,
        end_time=None,
        standard_output=None,
        num_nodes=None,
        requeue_count=2,
    )
    job = sched.get_job(7)
    assert job.held is True
    assert job.active is True
    assert (job.nodes, job.excluded_nodes, job.num_nodes) == ((), frozenset(), 0)
    assert (job.start_time, job.end_time, job.stdout_path) == (0, 0, None)
    assert job.restart_count == 2
    assert job.reason == "job requeued in held state"


@pytest.mark.parametrize(
    ("priority", "reason", "held"),
    [
        (0, "JobHeldUser", True),
        (0, "JobHeldAdmin", True),
        (0, "None", True),  # priority 0 alone means held
        (1000, "JobHeldAdmin", True),  # the reason alone too
        (1000, "Priority", False),
        (1000, "BeginTime", False),
    ],
)
def test_held_from_priority_or_reason(sched, world, priority, reason, held):
    running_job(world, state="PENDING", priority=priority, state_reason=reason)
    assert sched.get_job(7).held is held


def test_failed_job_exit_code_and_signal(sched, world):
    running_job(world, state="FAILED", exit_code=3, exit_code_signal=0)
    running_job(world, job_id=8, state="NODE_FAIL", exit_code=0, exit_code_signal=9)
    assert sched.get_job(7).exit_code == ExitCode(3, 0)
    assert str(sched.get_job(8).exit_code) == "0:9"
    assert sched.get_job(8).active is False


def test_list_jobs_reads_all_jobs_once_sorted_by_id(sched, world):
    running_job(world, job_id=12)
    running_job(world, job_id=3, state="PENDING", allocated_nodes=None)
    jobs = sched.list_jobs()
    assert [j.job_id for j in jobs] == [3, 12]
    assert jobs[0].state == "PENDING" and jobs[1].nodes == ("m7", "n1", "n2")
    assert world.calls == [("Jobs.load",)]


def test_nodes_split_state_into_base_and_flags(sched, world):
    world.node_record("n1", state="IDLE", partitions=["gpu"], address="10.0.0.1", hostname="gpu-n1")
    world.node_record(
        "n2", state="MIXED+DRAIN", reason="xid 79 on GPU 3", partitions=["gpu", "debug"]
    )
    world.node_record("n3", state="DOWN+NOT_RESPONDING", reason="Not responding")
    nodes = {n.name: n for n in sched.list_nodes()}
    assert list(nodes) == ["n1", "n2", "n3"]
    assert nodes["n1"] == Node(
        name="n1",
        state="IDLE",
        flags=frozenset(),
        partitions=("gpu",),
        address="10.0.0.1",  # node.pyx:445 Node.address (NodeAddr)
        hostname="gpu-n1",  # node.pyx:453 Node.hostname (NodeHostname)
    )
    assert nodes["n2"] == Node(
        name="n2",
        state="MIXED",
        flags=frozenset({"DRAIN"}),
        reason="xid 79 on GPU 3",
        partitions=("gpu", "debug"),
    )
    assert nodes["n2"].drained and not nodes["n1"].drained
    assert (nodes["n3"].state, nodes["n3"].flags) == ("DOWN", frozenset({"NOT_RESPONDING"}))
    assert nodes["n3"].partitions == ()
    assert world.calls == [("Nodes.load",)]


def test_get_node_and_unknown_node(sched, world):
    world.node_record("n1", state="ALLOCATED+DRAIN", reason="lemon")
    assert sched.get_node("n1").flags == frozenset({"DRAIN"})
    with pytest.raises(UnknownNode) as err:
        sched.get_node("nope")
    # pyslurm's own words (Node.load finds no record), kept as the Slurm message
    assert err.value.slurm_message == "Node 'nope' does not exist"
    assert world.calls == [("Node.load", "n1"), ("Node.load", "nope")]


def test_unknown_job(sched, world):
    with pytest.raises(UnknownJob) as err:
        sched.get_job(99)
    assert err.value.slurm_message == "Invalid job id specified"
    assert err.value.command == "pyslurm.Job.load(99)"
    assert "Invalid job id specified" in str(err.value)


# --- operations -> the exact pyslurm calls ------------------------------------------------


def test_requeue_hold(sched, world):
    running_job(world)
    sched.requeue_hold(7)
    # read first: a write names only a job whose address (array task or not) is known
    assert world.calls == [("Job.load", 7), ("Job.requeue", 7, {"hold": True})]
    assert sched.get_job(7).held is True


def test_add_excluded_nodes_merges_with_existing_and_writes_the_union(sched, world):
    running_job(world, state="PENDING", excluded_nodes="n4")
    result = sched.add_excluded_nodes(7, ["n2", "n3", "n4"])
    assert result == frozenset({"n2", "n3", "n4"})
    # read, write the union, read back to verify Slurm shows it
    assert [c[0] for c in world.calls] == ["Job.load", "Job.modify", "Job.load"]
    _, job_id, changes = world.calls[1]
    assert job_id == 7 and list(changes) == ["excluded_nodes"]
    assert set(expand(changes["excluded_nodes"])) == {"n2", "n3", "n4"}
    assert sched.get_job(7).excluded_nodes == result


def test_add_excluded_nodes_twice_keeps_the_first_exclusions(sched, world):
    running_job(world, state="PENDING", excluded_nodes=None)
    assert sched.add_excluded_nodes(7, ["n1"]) == frozenset({"n1"})
    assert sched.add_excluded_nodes(7, ["n[5-6]"]) == frozenset({"n1", "n5", "n6"})
    written = [set(expand(c[2]["excluded_nodes"])) for c in world.calls if c[0] == "Job.modify"]
    assert written == [{"n1"}, {"n1", "n5", "n6"}]


def test_add_excluded_nodes_already_excluded_writes_nothing(sched, world):
    running_job(world, excluded_nodes="n[1-3]")  # RUNNING: a write would be refused
    assert sched.add_excluded_nodes(7, ["n2"]) == frozenset({"n1", "n2", "n3"})
    assert world.calls == [("Job.load", 7)]


def test_add_excluded_nodes_refused_once_running(sched, world):
    running_job(world, excluded_nodes=None)
    with pytest.raises(InvalidRequest, match="RUNNING: exclusions change only while"):
        sched.add_excluded_nodes(7, ["n1"])
    assert [c[0] for c in world.calls] == ["Job.load"]  # nothing written


def test_add_excluded_nodes_refused_by_slurm_keeps_its_message(sched, world, pyslurm):
    running_job(world, state="PENDING", excluded_nodes=None)  # started between read and write
    world.fail["Job.modify"] = pyslurm.RPCError(2073)
    with pytest.raises(InvalidRequest) as err:
        sched.add_excluded_nodes(7, ["n1"])
    assert err.value.slurm_message == "Job is no longer pending execution"


def test_add_excluded_nodes_not_shown_after_the_write_is_an_error(sched, world, pyslurm):
    record = running_job(world, state="PENDING", excluded_nodes=None)
    original_modify = pyslurm.Job.modify

    def dropped(self, changes):  # slurmctld answers success and keeps the old list
        original_modify(self, changes)
        record["excluded_nodes"] = None

    pyslurm.Job.modify = dropped
    with pytest.raises(SchedulerError, match="it shows nothing"):
        sched.add_excluded_nodes(7, ["n1"])


def test_set_begin_now_and_release(sched, world):
    running_job(world, state="PENDING", priority=0, eligible_time=int(time.time()) + 121)
    sched.set_begin_now(7)
    assert sched.get_job(7).begin_time <= time.time()
    sched.release(7)
    assert [c for c in world.calls if c[0] != "Job.load"] == [
        ("Job.modify", 7, {"begin_time": "now"}),
        ("Job.release", 7),
    ]


def test_set_begin_now_refused_unless_pending_and_checked_after(sched, world):
    running_job(world)  # RUNNING
    with pytest.raises(InvalidRequest, match="RUNNING: begin time applies to pending"):
        sched.set_begin_now(7)
    running_job(world, state="PENDING", eligible_time=int(time.time()) + 121)
    world.apply_begin_time = False
    with pytest.raises(SchedulerError, match="begin time still"):
        sched.set_begin_now(7)


def test_cancel_records_the_reason_in_admin_comment_first(sched, world):
    running_job(world, admin_comment="billing=projX;ticket=INC-4711")
    sched.cancel(7, "application error: CUDA OOM in rank 3")
    note = (
        "billing=projX;ticket=INC-4711 "
        "[srecovery: cancelled: application error: CUDA OOM in rank 3]"
    )
    assert [c for c in world.calls if c[0] != "Job.load"] == [
        ("Job.modify", 7, {"admin_comment": note}),
        ("Job.cancel", 7),
    ]
    job = sched.get_job(7)
    assert job.admin_comment == note
    assert job.state == "CANCELLED"


def test_cancel_unknown_job_raises_and_cancels_nothing(sched, world):
    with pytest.raises(UnknownJob):
        sched.cancel(99, "gone")
    assert "Job.cancel" not in [c[0] for c in world.calls]


def test_drain_and_resume_node(sched, world):
    world.node_record("n3", state="ALLOCATED")
    sched.drain_node("n3", "slurm-recovery: xid 79 (GPU fell off the bus)")
    assert sched.get_node("n3").drained
    sched.resume_node("n3")
    assert not sched.get_node("n3").drained
    assert [c for c in world.calls if c[0] == "Node.modify"] == [
        (
            "Node.modify",
            "n3",
            {"state": "DRAIN", "reason": "slurm-recovery: xid 79 (GPU fell off the bus)"},
        ),
        ("Node.modify", "n3", {"state": "RESUME"}),
    ]
    world.calls.clear()
    sched.resume_node("n3")  # in service already: a no-op, not an error
    assert [c[0] for c in world.calls] == ["Node.load"]


def test_drain_reason_is_sanitized(sched, world):
    world.node_record("n3", state="IDLE")
    sched.drain_node("n3", "xid 79\n; rm -rf /\x00")
    assert sched.get_node("n3").reason == "xid 79 ; rm -rf /"


def test_drain_unknown_node(sched, world):
    with pytest.raises(UnknownNode) as err:
        sched.drain_node("zz9", "bad")
    assert err.value.slurm_message == "Invalid node name specified"


# --- RPCError -> typed errors, Slurm's message kept -------------------------------------


@pytest.mark.parametrize(
    ("errno", "error", "text"),
    [
        (2017, UnknownJob, "Invalid job id specified"),
        (2002, PermissionDenied, "Access/permission denied"),
        (1800, Unreachable, "Unable to contact slurm controller (connect failure)"),
        (2024, InvalidRequest, "Job is pending execution"),
        (2037, InvalidRequest, "Requested operation is presently disabled"),
        (2039, InvalidRequest, "Only batch jobs are accepted or processed"),
        (2021, InvalidRequest, "Job/step already completing or completed"),
    ],
)
def test_rpc_errors_become_typed_errors(sched, world, pyslurm, errno, error, text):
    running_job(world)
    world.fail["Job.requeue"] = pyslurm.RPCError(errno)
    with pytest.raises(SchedulerError) as err:
        sched.requeue_hold(7)
    assert type(err.value) is error
    assert err.value.slurm_message == text
    assert err.value.command == "pyslurm.Job(7).requeue(hold=True)"
    assert isinstance(err.value.__cause__, pyslurm.RPCError)


def test_rpc_error_with_only_a_message_is_classified_by_its_text(sched, world, pyslurm):
    # pyslurm keeps errno == SLURM_ERROR (-1) when it raises with msg=...
    world.fail["Jobs.load"] = pyslurm.RPCError(
        msg="Unable to contact slurm controller (send failure)"
    )
    with pytest.raises(Unreachable):
        sched.list_jobs()


def test_non_rpc_errors_are_not_swallowed(sched, world):
    running_job(world)
    world.fail["Job.release"] = RuntimeError("bug in the caller")
    with pytest.raises(RuntimeError):
        sched.release(7)


# --- the shared error table (errors.py) -------------------------------------------------

# slurm_strerror() of libslurm 22.05.8 for these errnos (same text in Slurm 25.11).
SLURM_STRERROR = {
    1001: "Communication connection failure",
    1007: "Protocol authentication error",
    1800: "Unable to contact slurm controller (connect failure)",
    1801: "Unable to contact slurm controller (send failure)",
    1802: "Unable to contact slurm controller (receive failure)",
    1803: "Unable to contact slurm controller (shutdown failure)",
    2002: "Access/permission denied",
    2017: "Invalid job id specified",
    2018: "Invalid node name specified",
    2020: "Job can not be altered now, try again later",
    2021: "Job/step already completing or completed",
    2024: "Job is pending execution",
    2027: "Slurm backup controller in standby mode",
    2028: "Invalid node state specified",
    2037: "Requested operation is presently disabled",
    2039: "Only batch jobs are accepted or processed",
    2073: "Job is no longer pending execution",
    2084: "Job has already finished",
    2131: "Controller is in standby mode, try a different controller",
    5004: "Socket timed out on send/recv operation",
    5005: "Zero Bytes were transmitted or received",
}


@pytest.mark.parametrize(("errno", "text"), sorted(SLURM_STRERROR.items()))
def test_errno_and_text_tables_agree(errno, text):
    assert classify_slurm_error(text) is classify_slurm_error("", errno)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        # as the command-line tools print them (for the scontrol backend)
        ("slurm_update error: Invalid job id specified", UnknownJob),
        ("scancel: error: Kill job error on job id 7: Invalid job id specified", UnknownJob),
        ("Requeue job 7 failed: Job is pending execution", InvalidRequest),
        ("slurm_update error: Invalid node name specified", UnknownNode),
        ("slurm_update error: Access/permission denied", PermissionDenied),
        (
            "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
            Unreachable,
        ),
        ("slurm_update error: Job is no longer pending execution", InvalidRequest),
        ("ACCESS/PERMISSION DENIED", PermissionDenied),
        ("something Slurm has never said", InvalidRequest),
        ("", InvalidRequest),
    ],
)
def test_classify_by_message(message, error):
    assert classify_slurm_error(message) is error


def test_a_listed_errno_wins_over_text_and_an_unlisted_one_defers_to_it():
    assert classify_slurm_error("Unspecified error", 2017) is UnknownJob
    assert classify_slurm_error("Access/permission denied", 1800) is Unreachable
    assert classify_slurm_error("Invalid job id specified", -1) is UnknownJob  # SLURM_ERROR
    assert classify_slurm_error("Invalid job id specified", 2073) is UnknownJob


def test_every_message_row_classifies_to_its_own_error():
    # guards the first-match order: no earlier row may swallow a later one
    for text, error in SLURM_MESSAGES:
        assert classify_slurm_error(text) is error, text


def test_slurm_error_builds_the_typed_error_with_slurm_words():
    err = slurm_error(
        "requeue job 7", "Job is pending execution\n", command="scontrol requeuehold 7"
    )
    assert type(err) is InvalidRequest
    assert err.slurm_message == "Job is pending execution"
    assert err.command == "scontrol requeuehold 7"
    assert str(err) == "requeue job 7 failed (slurm: Job is pending execution)"


# --- array tasks and interactive jobs (issue 16, items 1 and 7) ---------------------------


def array_tasks(world):
    """``--array=0-3``: tasks 0-2 split off as jobs 18-20; task 3 kept the array's id, 17.
    Slurm sends an array's id as every task, 18 first."""
    for job_id, task in ((18, 0), (19, 1), (20, 2), (17, 3)):
        running_job(world, job_id, excluded_nodes=None)
        world.array_task(job_id, 17, task, **world.jobs[job_id])


def test_the_model_reads_task_0_as_pyslurm_does(pyslurm, world):
    # pyslurm's u32_parse turns task 0 into None, like the pending record's NO_VAL; only
    # array_tasks_waiting (Slurm's array_task_str) tells the two apart (Slurm 25.11.7)
    world.array_task(5, 2, 0, state="RUNNING")
    world.array_pending_record(2, "1-3%1")
    task, record = pyslurm.Job.load(5), pyslurm.Jobs.load().data["testcluster"][2]
    assert (task.array_id, task.array_task_id, task.array_tasks_waiting) == (2, None, None)
    assert (record.array_id, record.array_task_id, record.array_tasks_waiting) == (2, None, "1-3")
    world.job_record(3, state="RUNNING")
    assert (pyslurm.Job.load(3).array_id, pyslurm.Job.load(3).array_task_id) == (None, None)


def test_task_0_is_a_task_and_the_pending_record_is_not(sched, world):
    """``--array=0-3%1`` with task 0 running: the contract's first array read (issue 27)."""
    running_job(world, 5, excluded_nodes=None)
    world.array_task(5, 2, 0, **world.jobs[5])
    world.array_pending_record(2, "1-3%1")
    jobs = {j.job_id: j for j in sched.list_jobs()}
    assert (jobs[5].array_job_id, jobs[5].array_task_id) == (2, 0)
    assert jobs[5].slurm_address == "2_0" and not jobs[5].pending_array_record
    assert (jobs[2].array_job_id, jobs[2].array_task_id) == (2, None)
    assert jobs[2].pending_array_record
    assert sched.get_job(2).pending_array_record
    with pytest.raises(InvalidRequest, match="pending record of array 2"):
        sched.requeue_hold(2)
    sched.requeue_hold(5)  # task 0's own id names it alone
    assert ("Job.requeue", 5, {"hold": True}) in world.calls


def test_every_running_task_of_an_array_is_listed(sched, world):
    """``--array=0-1``: task 0 split off as 4, task 1 kept the array's id, 1."""
    for job_id, task in ((4, 0), (1, 1)):
        running_job(world, job_id)
        world.array_task(job_id, 1, task, **world.jobs[job_id])
    tasks = [j for j in sched.list_jobs() if j.array_job_id == 1]
    assert sorted((t.job_id, t.array_task_id) for t in tasks) == [(1, 1), (4, 0)]
    assert all(t.state == "RUNNING" and t.array_task_id is not None for t in tasks)
    assert sched.get_job(1).slurm_address == "1_1"


def test_get_job_of_an_arrays_id_is_the_task_with_that_own_id(sched, world):
    array_tasks(world)
    job = sched.get_job(17)
    assert (job.job_id, job.array_job_id, job.array_task_id) == (17, 17, 3)
    assert job.slurm_address == "17_3"


def test_a_task_with_its_own_id_is_written_by_that_id(sched, world):
    array_tasks(world)
    sched.requeue_hold(19)
    assert [c for c in world.calls if c[0] != "Job.load"] == [("Job.requeue", 19, {"hold": True})]
    assert world.jobs[18]["requeue_count"] == world.jobs[17]["requeue_count"] == 1


@pytest.mark.parametrize(
    "step",
    [
        lambda s: s.requeue_hold(17),
        lambda s: s.release(17),
        lambda s: s.set_admin_comment(17, "srecovery:held:1:1795960000"),
        lambda s: s._signal_cancel(17),
    ],
)
def test_the_task_that_carries_the_arrays_id_is_refused_not_sent(sched, world, step):
    # pyslurm can send only the number 17, which Slurm applies to every task of array 17
    array_tasks(world)
    with pytest.raises(InvalidRequest, match="17_3"):
        step(sched)
    assert [c[0] for c in world.calls if c[0] != "Job.load" and c[0] != "Jobs.load"] == []


def test_an_arrays_pending_record_is_never_written(sched, world):
    world.array_pending_record(17, "4-9")
    assert sched.get_job(17).pending_array_record
    with pytest.raises(InvalidRequest, match="pending record of array 17"):
        sched.release(17)
    assert "Job.release" not in [c[0] for c in world.calls]


def test_batch_flag_is_read(sched, world):
    running_job(world, 7, is_batch_job=False)
    running_job(world, 8, is_batch_job=True)
    assert [j.batch for j in sched.list_jobs()] == [False, True]


# --- the worker process: every call bounded by the timeout (issue 27) ----------------------
# The backend runs pyslurm in a child process, which here imports the same model as
# ``pyslurm`` (tests/unit/pyslurm_model/site/pyslurm) over a World written to a file.

SITE = Path(__file__).parent / "pyslurm_model" / "site"


@pytest.fixture
def worker_world(tmp_path, monkeypatch):
    """Write a World for the worker's model; returns (write(**fields), calls())."""
    world_file, calls_file = tmp_path / "world.json", tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_PYSLURM_WORLD", str(world_file))
    monkeypatch.setenv("FAKE_PYSLURM_CALLS", str(calls_file))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delitem(sys.modules, "pyslurm", raising=False)
    monkeypatch.syspath_prepend(str(SITE))  # where this process finds (not imports) pyslurm

    def write(**fields):
        world = model.World()
        running_job(world, 7)
        world.node_record("n1", state="IDLE", partitions=["debug"])
        values = {"jobs": world.jobs, "nodes": world.nodes, **fields}
        world_file.write_text(json.dumps(values))

    def calls():
        if not calls_file.exists():
            return []
        return [tuple(json.loads(line)) for line in calls_file.read_text().splitlines()]

    write()
    return write, calls


@pytest.fixture
def isolated(worker_world):
    scheduler = PyslurmScheduler(timeout=10.0)
    yield scheduler
    scheduler.close()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:  # reaped by us, or a zombie of someone else's
        return fh.read().split()[2] == "Z"


def test_the_worker_runs_the_calls_and_sends_back_our_records(isolated, worker_world):
    _, calls = worker_world
    assert isolated.worker_pid is None  # started on the first call
    job = isolated.get_job(7)
    assert (job.job_id, job.nodes, job.excluded_nodes) == (7, ("m7", "n1", "n2"), {"n4"})
    assert [n.name for n in isolated.list_nodes()] == ["n1"]
    isolated.drain_node("n1", "xid 79")
    assert isolated.get_node("n1").drained
    pid = isolated.worker_pid
    assert pid is not None and pid != os.getpid()
    assert calls() == [
        ("Job.load", 7),
        ("Nodes.load",),
        ("Node.modify", "n1", {"state": "DRAIN", "reason": "xid 79"}),
        ("Node.load", "n1"),
    ]
    assert isolated.worker_pid == pid  # one worker for every call
    isolated.close()
    assert _gone(pid) and isolated.worker_pid is None


def test_slurms_refusal_crosses_the_process_as_the_typed_error(worker_world):
    write, _ = worker_world
    write(fail={"Job.requeue": ["RPCError", 2024], "Job.release": ["RuntimeError", "bug"]})
    scheduler = PyslurmScheduler(timeout=10.0)
    try:
        with pytest.raises(UnknownJob) as err:
            scheduler.get_job(99)
        assert err.value.slurm_message == "Invalid job id specified"
        assert err.value.command == "pyslurm.Job.load(99)"
        with pytest.raises(UnknownNode, match="read node zz9 failed"):
            scheduler.get_node("zz9")
        with pytest.raises(InvalidRequest) as refused:
            scheduler.requeue_hold(7)
        assert refused.value.slurm_message == "Job is pending execution"
        with pytest.raises(RuntimeError, match="RuntimeError: bug"):
            scheduler.release(7)  # a bug is not a refusal: not swallowed
    finally:
        scheduler.close()


@pytest.mark.parametrize(
    "step",
    [
        lambda s: s.get_job(7),  # Job.load: two RPCs, 2 x MessageTimeout in libslurm
        lambda s: s.list_nodes(),
        lambda s: s.drain_node("n1", "test"),
        lambda s: s.requeue_hold(7),
    ],
)
def test_slurmctld_down_is_unreachable_within_the_timeout(worker_world, step):
    """What the contract met on 25.11.7: Job.load took 20 s (limit 11 s). libslurm waits
    MessageTimeout per RPC with the GIL held; only the worker's deadline bounds it."""
    write, _ = worker_world
    write(slurmctld_down=True, msg_timeout=30.0)
    scheduler = PyslurmScheduler(timeout=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(Unreachable, match="did not finish within 1s"):
            step(scheduler)
        assert time.monotonic() - started < 1.0 + 1.0  # the deadline, and the kill
        assert scheduler.worker_pid is None  # the stuck worker was killed ...
        write()  # ... slurmctld is back
        scheduler.timeout = 10.0  # (a loaded test host may take over 1 s to start Python)
        assert scheduler.get_job(7).job_id == 7  # ... and a fresh worker answers
    finally:
        scheduler.close()


def test_the_stuck_worker_is_killed_not_left_behind(worker_world):
    write, calls = worker_world
    write(slurmctld_down=True, msg_timeout=30.0)
    scheduler = PyslurmScheduler(timeout=1.0)
    pids = []
    original = scheduler._runner._start

    def start(deadline):
        original(deadline)
        pids.append(scheduler.worker_pid)

    scheduler._runner._start = start
    with pytest.raises(Unreachable):
        scheduler.list_jobs()
    assert len(pids) == 1 and _gone(pids[0])
    assert calls() == [("Jobs.load",)]


def test_a_call_waiting_behind_a_stuck_one_keeps_its_own_deadline(worker_world):
    """The controller's node listing thread and its loop share one scheduler."""
    write, _ = worker_world
    write(slurmctld_down=True, msg_timeout=30.0)
    scheduler = PyslurmScheduler(timeout=1.0)
    errors: list[BaseException] = []

    def listing():
        try:
            scheduler.list_nodes()
        except BaseException as exc:
            errors.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=listing)
    thread.start()
    time.sleep(0.2)
    with pytest.raises(Unreachable):
        scheduler.get_job(7)
    thread.join()
    assert time.monotonic() - started < 1.0 + 0.2 + 1.5
    assert len(errors) == 1 and isinstance(errors[0], Unreachable)
    scheduler.close()


def test_in_this_process_the_call_waits_as_long_as_libslurm(pyslurm, world):
    """isolate=False has no bound: the model's Job.load waits 2 x MessageTimeout, as real
    pyslurm did (20 s on 25.11.7), so production never runs pyslurm in-process."""
    world.slurmctld_down, world.msg_timeout = True, 0.3
    scheduler = PyslurmScheduler(timeout=0.1, isolate=False)
    started = time.monotonic()
    with pytest.raises(Unreachable) as err:
        scheduler.get_job(7)
    assert time.monotonic() - started >= 0.6
    assert err.value.slurm_message == "Unable to contact slurm controller (connect failure)"


def test_a_worker_that_cannot_start_pyslurm_is_an_error_not_a_hang(worker_world, monkeypatch):
    # real pyslurm's slurm_init() ends the process on a fatal slurm.conf error
    monkeypatch.setenv("FAKE_PYSLURM_EXIT", "1")
    scheduler = PyslurmScheduler(timeout=5.0)
    started = time.monotonic()
    with pytest.raises(SchedulerError, match=r"exited \(status 1\) without answering") as err:
        scheduler.list_jobs()
    assert type(err.value) is SchedulerError and time.monotonic() - started < 5.0
    monkeypatch.delenv("FAKE_PYSLURM_EXIT")
    scheduler.env.pop("FAKE_PYSLURM_EXIT")
    scheduler.timeout = 10.0
    assert [j.job_id for j in scheduler.list_jobs()] == [7]  # a fresh worker, next call
    scheduler.close()


def test_slurm_conf_reaches_the_worker(worker_world, tmp_path):
    scheduler = PyslurmScheduler(slurm_conf=str(tmp_path / "slurm.conf"))
    assert scheduler.env["SLURM_CONF"] == str(tmp_path / "slurm.conf")
    assert scheduler.timeout == 15.0  # scheduler.command_timeout's default
