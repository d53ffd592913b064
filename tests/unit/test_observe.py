"""controller/observe.py: what the loop records each pass about operators' changes in Slurm."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.controller import observe
from slurm_recovery.decide.model import ClusterView
from slurm_recovery.scheduler.base import Job, Node
from slurm_recovery.store import Store


def node(name: str, reason: str = "", drained: bool = False) -> Node:
    return Node(name, "IDLE", frozenset({"DRAIN"}) if drained else frozenset(), reason)


def job(job_id: int = 5, state: str = "RUNNING", restarts: int = 0, comment: str = "") -> Job:
    return Job(
        job_id=job_id,
        name="train",
        state=state,
        reason="",
        user="alice",
        partition="gpu",
        nodes=("n1", "n2"),
        num_nodes=2,
        submit_time=100,
        restart_count=restarts,
        admin_comment=comment,
    )


def view(now: float, nodes=(), jobs=()) -> ClusterView:
    return ClusterView(now=now, jobs={j.job_id: j for j in jobs}, nodes={n.name: n for n in nodes})


BEFORE = view(10.0, [node("n1"), node("n2"), node("n3", "old", True)], [job(5), job(6)])


def test_the_first_pass_records_nothing():
    assert observe.changes(BEFORE, None) == []


def test_operator_drains_resumes_requeues_and_cancels_are_seen():
    after = view(
        11.0,
        [node("n1", "bad fan", True), node("n2", "srecovery:3:xid 79", True), node("n3")],
        [job(5, "PENDING", restarts=1), job(6, "CANCELLED")],
    )
    found = observe.changes(after, BEFORE)
    assert found == [
        {"change": "drained", "node": "n1", "reason": "bad fan", "state": "IDLE"},
        {
            "change": "resumed",
            "node": "n3",
            "previous_reason": "old",
            "was_tool_drain": False,
            "state": "IDLE",
        },
        {
            "change": "requeued",
            "job_id": 5,
            "restart_count": 1,
            "previous_restart_count": 0,
            "state": "PENDING",
            "nodes": ["n1", "n2"],
        },
        {"change": "cancelled", "job_id": 6, "previous_state": "RUNNING", "nodes": ["n1", "n2"]},
    ]  # n2's drain is the tool's own: not recorded


def test_a_reason_taken_over_by_an_operator_is_seen():
    before = view(1.0, [node("n2", "srecovery:3:xid 79", True)])
    after = view(2.0, [node("n2", "RMA ticket 12", True)])
    assert observe.changes(after, before) == [
        {
            "change": "drain_reason_changed",
            "node": "n2",
            "reason": "RMA ticket 12",
            "previous_reason": "srecovery:3:xid 79",
        }
    ]


def test_the_tools_own_job_steps_are_not_recorded(tmp_path):
    marked = job(5, "PENDING", restarts=1, comment="srecovery:held:3:99999")
    cancelled = job(6, "CANCELLED", comment="slurm-recovery: xid 13: stop")
    assert observe.changes(view(11.0, [], [marked, cancelled]), BEFORE) == []
    with Store.open(tmp_path / "state.db") as store:
        # requeued by the tool (its action on record) after the mark was replaced
        store.record_action("requeue_hold", "job 5", result="ok", started_at=10.5, finished_at=10.6)
        after = view(11.0, [], [job(5, "PENDING", restarts=1), job(6, "RUNNING")])
        observe.observe(store, after, BEFORE)
        assert store.evidence_of_kind(observe.KIND) == []
        # an operator requeue of another job is recorded, as scheduler evidence
        observe.observe(store, view(12.0, [], [job(6, "PENDING", restarts=1)]), after)
        (row,) = store.evidence_of_kind(observe.KIND)
        e = row.evidence
        assert (e.source, e.kind, e.job_id, e.observed_at) == ("scheduler", "slurm_change", 6, 12.0)
        assert e.payload["change"] == "requeued"


def test_a_pass_records_a_bounded_number_of_rows(tmp_path):
    many = [node(f"x{i}") for i in range(observe.MAX_CHANGES_PER_PASS + 20)]
    drained = [dataclasses.replace(n, flags=frozenset({"DRAIN"}), reason="rack") for n in many]
    with Store.open(tmp_path / "state.db") as store:
        observe.observe(store, view(2.0, drained), view(1.0, many))
        rows = store.evidence_of_kind(observe.KIND, limit=100_000)
    assert len(rows) == observe.MAX_CHANGES_PER_PASS + 1
    assert rows[-1].evidence.payload == {"change": "truncated", "not_recorded": 20}


@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["", "a", "srecovery:1:x"])), max_size=6))
def test_nothing_changed_records_nothing(states):
    nodes = [node(f"n{i}", reason, drained) for i, (drained, reason) in enumerate(states)]
    assert observe.changes(view(2.0, nodes), view(1.0, nodes)) == []
