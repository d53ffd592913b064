"""One contract for every scheduler backend, run against the real local Slurm cluster.

The pyslurm backend runs only where pyslurm imports against a matching Slurm (never on
Debian's 22.05): there its cases are reported as skipped, with the reason.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from slurm_recovery import localcluster
from slurm_recovery.scheduler import (
    InvalidRequest,
    Scheduler,
    UnknownJob,
    UnknownNode,
    Unreachable,
    pyslurm_backend,
)
from slurm_recovery.scheduler.base import Node, earliest_restart
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.scheduler.slurmjson import nodes_from_json
from tests.conftest import NODES, wait_for

pytestmark = pytest.mark.cluster

TIMEOUT = 5.0  # the bound on one Slurm call in these tests


@pytest.fixture(params=["scontrol", "pyslurm"])
def scheduler(request, local_cluster, monkeypatch) -> Scheduler:
    monkeypatch.setenv("SLURM_CONF", str(local_cluster.slurm_conf))
    if request.param == "scontrol":
        return ScontrolScheduler(timeout=TIMEOUT, slurm_conf=str(local_cluster.slurm_conf))
    ok, why = pyslurm_backend.available()
    if not ok:
        pytest.skip(f"pyslurm backend not testable here: {why}")
    # every call runs in its worker process, bounded by the same TIMEOUT as each command
    return pyslurm_backend.PyslurmScheduler(
        timeout=TIMEOUT, slurm_conf=str(local_cluster.slurm_conf)
    )


def running(scheduler: Scheduler, job_id: int):
    job = scheduler.get_job(job_id)
    return job if job.state == "RUNNING" else None


def test_reads_cluster_and_nodes(scheduler: Scheduler, local_cluster):
    assert scheduler.cluster_name() == "srtest"
    version = subprocess.run(
        ["sinfo", "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    assert scheduler.version() == version
    nodes = {n.name: n for n in scheduler.list_nodes()}
    assert sorted(nodes) == [f"n{i}" for i in range(1, NODES + 1)]
    n2 = scheduler.get_node("n2")
    assert n2 == nodes["n2"]
    assert n2.partitions == ("debug",)
    assert n2.state in {"IDLE", "ALLOCATED", "MIXED"}
    assert not n2.drained


def test_reads_a_running_multi_node_job(scheduler: Scheduler, submit):
    before = int(time.time())
    job_id = submit("-N2", "-J", "contract read", "-o", "out-%j-%x.log", "--wrap=sleep 600")
    job = wait_for(lambda: running(scheduler, job_id))
    assert job.job_id == job_id
    assert job.name == "contract read"
    assert job.user == "root"
    assert job.partition == "debug"
    assert len(job.nodes) == 2 == job.num_nodes
    assert set(job.nodes) <= {f"n{i}" for i in range(1, NODES + 1)}
    assert before - 1 <= job.submit_time <= time.time() + 1
    assert job.restart_count == 0
    assert job.excluded_nodes == frozenset()
    assert not job.held
    assert job.stdout_path == f"/tmp/out-{job_id}-contract read.log"
    assert job_id in {j.job_id for j in scheduler.list_jobs()}


def test_exit_codes_of_failed_jobs(scheduler: Scheduler, submit):
    exited = submit("-N1", "--wrap=exit 3")
    killed = submit("-N1", "--wrap=kill -9 $$")
    failed = wait_for(lambda: (j := scheduler.get_job(exited)).state == "FAILED" and j)
    assert (failed.exit_code.returncode, failed.exit_code.signal) == (3, 0)
    signalled = wait_for(lambda: (j := scheduler.get_job(killed)).state == "FAILED" and j)
    assert signalled.exit_code.signal == 9


def test_requeue_hold_exclude_begin_now_release_runs_elsewhere(scheduler: Scheduler, submit):
    """The recovery path: a running job goes back to pending away from its nodes, at once."""
    job_id = submit("-N2", "--wrap=sleep 600")
    first = wait_for(lambda: running(scheduler, job_id))
    bad = first.nodes[0]

    requeued_at = time.time()
    scheduler.requeue_hold(job_id)
    held = wait_for(lambda: (j := scheduler.get_job(job_id)).state == "PENDING" and j)
    assert held.held
    assert held.restart_count == 1

    assert scheduler.add_excluded_nodes(job_id, [bad]) == {bad}
    # Slurm replaces ExcNodeList on update; the backend must merge.
    # of the two nodes the job did not run on, exclude one an earlier test's job may still hold
    # (or a drained one), so that the other stays free for the restart
    spare = [n for n in (f"n{i}" for i in range(1, NODES + 1)) if n not in first.nodes]
    other = next((n for n in spare if not _free(scheduler.get_node(n))), spare[0])
    merged = scheduler.add_excluded_nodes(job_id, [other])
    assert merged == {bad, other}
    assert scheduler.get_job(job_id).excluded_nodes == {bad, other}
    # Adding what is there already changes nothing and succeeds.
    assert scheduler.add_excluded_nodes(job_id, [bad]) == {bad, other}

    # As the loop does: the begin time at the first second the job may start again (the old
    # attempt's credential is revoked until then), and the release at once.
    earliest = earliest_restart(requeued_at)
    scheduler.set_begin_now(job_id, at=earliest)
    assert scheduler.get_job(job_id).begin_time <= max(earliest, time.time()) + 1
    # Released before its begin time has come, the job waits for Slurm's next scheduling pass
    # (the backfill's, up to 30 s): seen in CI, where the release came 0.4 s early. Release
    # once the begin time is here, so the job starts on the release's own scheduling attempt.
    time.sleep(max(0.0, earliest - time.time()))
    released_at = time.monotonic()
    scheduler.release(job_id)
    try:
        again = wait_for(lambda: running(scheduler, job_id), timeout=20)
    except pytest.fail.Exception:
        print(_cluster_state(scheduler, job_id))  # what held it: shown with the failure
        raise
    assert time.monotonic() - released_at < 10, "BeginTime was not cleared (~121 s wait)"
    assert not set(again.nodes) & {bad, other}
    assert again.restart_count == 1
    assert not again.held


def _cluster_state(scheduler: Scheduler, job_id: int) -> str:
    job = scheduler.get_job(job_id)
    nodes = [f"{n.name} {n.state} {sorted(n.flags)} {n.reason!r}" for n in scheduler.list_nodes()]
    others = [
        f"{j.job_id} {j.state} {j.nodes}" for j in scheduler.list_jobs() if j.job_id != job_id
    ]
    return f"job {job_id}: {job.state} {job.reason!r} excluded {sorted(job.excluded_nodes)}\n" + (
        "\n".join(nodes + others)
    )


def _free(node: Node) -> bool:
    """Idle and in service: a job can start there now."""
    return node.state == "IDLE" and not node.drained and "COMPLETING" not in node.flags


def test_exclusions_refused_on_a_running_job(scheduler: Scheduler, submit):
    job_id = submit("-N1", "--wrap=sleep 600")
    wait_for(lambda: running(scheduler, job_id))
    with pytest.raises(InvalidRequest):
        scheduler.add_excluded_nodes(job_id, ["n4"])
    with pytest.raises(InvalidRequest):
        scheduler.set_begin_now(job_id)


def test_cancel_records_the_reason(scheduler: Scheduler, submit):
    job_id = submit("-N1", "--wrap=sleep 600")
    wait_for(lambda: running(scheduler, job_id))
    scheduler.cancel(job_id, "application fault: CUDA illegal memory access on rank 3")
    job = wait_for(lambda: (j := scheduler.get_job(job_id)).state == "CANCELLED" and j)
    assert job.admin_comment == (
        "[srecovery: cancelled: application fault: CUDA illegal memory access on rank 3]"
    )
    with pytest.raises(InvalidRequest) as refused:
        scheduler.release(job_id)
    assert refused.value.slurm_message


def test_admin_comment_survives_requeue(scheduler: Scheduler, submit):
    """The hold mark is written before requeue-hold; it must still be there afterwards."""
    job_id = submit("-N1", "--wrap=sleep 600")
    wait_for(lambda: running(scheduler, job_id))
    scheduler.set_admin_comment(job_id, "srecovery:held:7:1795960000\nsecond line")
    scheduler.requeue_hold(job_id)
    held = wait_for(lambda: (j := scheduler.get_job(job_id)).state == "PENDING" and j)
    assert held.admin_comment == "[srecovery:held:7:1795960000 second line]"
    scheduler.release(job_id)


def test_drain_and_resume_with_reason_in_sinfo(scheduler: Scheduler, slurm_env):
    hostile = 'xid 79 on gpu1\n; rm -rf / "$(id)" \x00 `reboot`'
    scheduler.drain_node("n4", hostile)
    try:
        node = scheduler.get_node("n4")
        assert node.drained
        assert node.reason == 'xid 79 on gpu1 ; rm -rf / "$(id)" `reboot`'
        sinfo = subprocess.run(
            ["sinfo", "-R", "-h", "-o", "%N|%E"], env=slurm_env, capture_output=True, text=True
        ).stdout
        assert f"n4|{node.reason}" in sinfo.splitlines()
    finally:
        scheduler.resume_node("n4")
    node = scheduler.get_node("n4")
    assert not node.drained
    assert node.state == "IDLE"
    scheduler.resume_node("n4")  # resuming a node in service is a no-op, not an error


def test_unknown_job_and_node_are_typed_errors(scheduler: Scheduler):
    with pytest.raises(UnknownJob) as err:
        scheduler.get_job(999_999)
    assert "Invalid job id specified" in err.value.slurm_message
    for step in (scheduler.requeue_hold, scheduler.release):
        with pytest.raises(UnknownJob) as err:
            step(999_999)
        assert "Invalid job id specified" in err.value.slurm_message
    with pytest.raises(UnknownJob):
        scheduler.cancel(999_999, "test")
    with pytest.raises(UnknownNode) as node_err:
        scheduler.get_node("n99")
    assert node_err.value.slurm_message
    with pytest.raises(UnknownNode) as node_err:
        scheduler.drain_node("n99", "test")
    assert "Invalid node name specified" in node_err.value.slurm_message


def test_slurmctld_down_is_unreachable_within_the_timeout(scheduler: Scheduler, local_cluster):
    localcluster.stop_slurmctld(local_cluster.base)
    try:
        for call in (
            lambda: scheduler.get_job(1),
            scheduler.list_nodes,
            lambda: scheduler.drain_node("n1", "test"),
            lambda: scheduler.requeue_hold(1),
        ):
            started = time.monotonic()
            with pytest.raises(Unreachable):
                call()
            # one call, plus at most one `scontrol ping` to tell a vague error apart
            assert time.monotonic() - started < 2 * TIMEOUT + 1
    finally:
        localcluster.up(local_cluster, keep_state=True)
    assert len(scheduler.list_nodes()) == NODES


# --- job arrays: a step names exactly one task (issue 16, item 1) --------------------------


def _running_tasks(scheduler: Scheduler, array_id: int, count: int):
    tasks = [j for j in scheduler.list_jobs() if j.array_job_id == array_id]
    running_now = [t for t in tasks if t.state == "RUNNING" and t.array_task_id is not None]
    return running_now if len(running_now) == count else None


def test_steps_on_an_array_task_touch_only_that_task(scheduler: Scheduler, submit):
    array_id = submit("--array=0-1", "-N1", "--exclusive", "--wrap=sleep 600")
    tasks = wait_for(lambda: _running_tasks(scheduler, array_id, 2))
    # Slurm gives the last task it starts the array's own id: `17` names every task
    (task,) = [t for t in tasks if t.job_id == array_id]
    (other,) = [t for t in tasks if t.job_id != array_id]
    shown = scheduler.get_job(array_id)  # the task with that own id, never another task
    assert (shown.job_id, shown.array_task_id) == (array_id, task.array_task_id)
    assert shown.slurm_address == f"{array_id}_{task.array_task_id}"
    if scheduler.name == "pyslurm":  # it can send only the number, which means every task
        with pytest.raises(InvalidRequest, match=shown.slurm_address):
            scheduler.requeue_hold(array_id)
        return
    bad = task.nodes[0]
    # a scheduler that has not read the job yet reads it before the first write
    fresh = ScontrolScheduler(timeout=TIMEOUT, slurm_conf=scheduler.env["SLURM_CONF"])
    fresh.set_admin_comment(array_id, "srecovery:held:7:1795960000")
    fresh.requeue_hold(array_id)
    wait_for(lambda: scheduler.get_job(array_id).state == "PENDING")
    scheduler.add_excluded_nodes(array_id, [bad])
    scheduler.set_begin_now(array_id)
    scheduler.release(array_id)
    moved = scheduler.get_job(array_id)
    assert moved.restart_count == 1 and bad in moved.excluded_nodes
    scheduler.cancel(array_id, "contract test")
    wait_for(lambda: not scheduler.get_job(array_id).active)
    after = scheduler.get_job(other.job_id)
    assert after.state == "RUNNING" and after.restart_count == 0 and not after.held
    assert after.excluded_nodes == frozenset() and after.admin_comment == other.admin_comment
    assert after.begin_time == other.begin_time


def test_an_arrays_pending_record_is_never_acted_on(scheduler: Scheduler, submit):
    array_id = submit("--array=0-3%1", "-N1", "--wrap=sleep 600")
    (first,) = wait_for(lambda: _running_tasks(scheduler, array_id, 1))
    record = scheduler.get_job(array_id)  # `17_[1-3%1]`: tasks not started yet
    assert record.pending_array_record and record.job_id != first.job_id
    for step in (scheduler.requeue_hold, scheduler.release, scheduler.set_begin_now):
        with pytest.raises(InvalidRequest, match="pending record"):
            step(array_id)
    with pytest.raises(InvalidRequest, match="pending record"):
        scheduler.cancel(array_id, "contract test")
    after = scheduler.get_job(first.job_id)
    assert after.state == "RUNNING" and after.restart_count == 0
    assert scheduler.get_job(array_id).state == "PENDING"


def test_the_text_node_listing_says_what_the_json_says(local_cluster, slurm_env, submit):
    """The loop's node read (``scontrol -o show nodes``, scheduler.nodetext) against the JSON
    listing, node by node, in the states and with the free text that make the text hard: a
    drain with a reason that looks like more fields, a comment that does, a job's nodes."""
    sched = ScontrolScheduler(timeout=TIMEOUT, slurm_conf=str(local_cluster.slurm_conf))
    job_id = submit("-N2", "--wrap=sleep 600")
    wait_for(lambda: running(sched, job_id))

    def scontrol(*args: str) -> None:
        subprocess.run(["scontrol", "update", *args], env=slurm_env, check=True)

    scontrol("NodeName=n3", "State=DRAIN", "Reason=gpu bad Comment=zz [root@1] State=IDLE")
    scontrol("NodeName=n4", "State=DRAIN", "Reason=xid 79 on gpu 3 (ticket 17)")
    scontrol("NodeName=n2", "Comment=rack 4 Reason=fine State=DOWN")
    try:
        listed = {n.name: n for n in sched.list_nodes()}
        # n3's reason could end in two places: it came from the JSON, the others from text
        assert sched._node_lines.parsed == NODES
        argv = sched._per_node_json()
        shown = {n.name: n for n in nodes_from_json(sched._document(argv), " ".join(argv))}
        assert listed == shown
        assert listed["n3"].reason == "gpu bad Comment=zz [root@1] State=IDLE"
        assert listed["n4"].reason == "xid 79 on gpu 3 (ticket 17)" and listed["n4"].drained
        assert listed["n4"].reason_set_by == "root" and listed["n4"].reason_changed_at > 0
        assert not listed["n2"].drained and listed["n2"].reason == ""
        busy = set(sched.get_job(job_id).nodes)
        assert {listed[n].state for n in busy} <= {"ALLOCATED", "MIXED"}
        again = sched.list_nodes()
        assert sched._node_lines.parsed == 0 and {n.name: n for n in again} == listed
    finally:
        scontrol("NodeName=n2", "Comment=")
        for name in ("n3", "n4"):
            sched.resume_node(name)
