"""`srecovery compare`: the pure scorecard (scorecard.py) and the parsers of what Slurm records
about operators (slurmfacts.py)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery import scorecard, slurmfacts
from slurm_recovery.scheduler.base import Job
from slurm_recovery.scheduler.slurmjson import node_from_json
from slurm_recovery.scorecard import Advised, Drain, JobChange, score

H = 3600.0
DATA = Path(__file__).parent / "data"


def advised(incident: int, job_id: int, at: float, *nodes: str, action="requeue_exclude", **kw):
    return Advised(
        incident, job_id, at, action, "monitor", "why", frozenset(nodes), frozenset(nodes), **kw
    )


def test_precision_and_recall_count_nodes_within_the_window():
    card = score(
        [advised(1, 10, 1000.0, "n2"), advised(2, 11, 5000.0, "n3")],
        [Drain("n2", 1200.0, "gpu dead", "alice", ("slurm",)), Drain("n4", 1300.0, "fan")],
        [JobChange(10, 1250.0, "requeued"), JobChange(11, 5100.0, "cancelled")],
    )
    assert (card.precision, card.recall) == (0.5, 0.5)
    assert card.job_agreement() == {"agree": 1, "differ": 1, "no operator action": 0}
    body = card.to_json()
    assert body["agreement"]["tool_implications"] == 2
    assert body["agreement"]["operator_drains_matched"] == 1
    differences = card.differences()
    assert [d["incident"] for d in differences] == [None, 2]  # oldest first
    assert differences[0]["tool_said"] == "never implicated n4"
    assert "drained n4" in differences[0]["operators_did"]
    assert "n3 not drained by an operator within ±1h" in differences[1]["why"]
    assert "operators cancelled" in differences[1]["why"]


def test_an_operator_drain_before_the_advice_agrees_too():
    card = score([advised(1, 10, 1000.0, "n2")], [Drain("n2", 1000.0 - H)])
    assert card.precision == card.recall == 1.0
    late = score([advised(1, 10, 1000.0, "n2")], [Drain("n2", 1000.0 + H + 1)])
    assert late.precision == late.recall == 0.0


def test_a_drain_just_before_the_window_agrees_but_is_not_the_windows_own():
    early = Drain("n2", 900.0, "gpu dead")
    stale = Drain("n5", 950.0, "maintenance")
    card = score([advised(1, 10, 1100.0, "n2", action="none")], [early, stale], since=1000.0)
    assert card.precision == 1.0 and card.recall is None
    assert card.drains == () and card.differences() == []


def test_a_drain_in_the_windows_first_second_is_its_own():
    """Slurm's record of a drain 0.4 s after ``since`` says the whole second before it (CI: a
    drain merged to Slurm's time dropped out of the window, ``operator_drains`` 1, not 2)."""
    slurm = Drain("n2", 1000.0, "gpu dead", "root", ("slurm",))  # drained at 1000.7
    seen = Drain("n2", 1001.2, "gpu dead", None, ("observed",))
    card = score([], scorecard.merge_drains([seen, slurm]), since=1000.3)
    assert [d.at for d in card.drains] == [1000.0]
    requeued = JobChange(7, 1000.0, "requeued", None, ("slurm",))
    assert score([], [], [requeued], since=1000.3).job_changes == (requeued,)
    assert score([], [Drain("n2", 999.0)], since=1000.3).drains == ()


def test_drained_resumed_and_drained_again_is_two_steps():
    first = Drain("n2", 1000.0, "fan", None, ("observed",))
    again = Drain("n2", 1100.0, "fan", "root", ("slurm",))
    # without the resume seen, the same node and reason 100 s apart read as one step
    assert scorecard.merge_drains([first, again]) == [
        Drain("n2", 1100.0, "fan", "root", ("slurm", "observed"))
    ]
    two = scorecard.merge_drains([first, again], resumes={"n2": [1050.0], "n3": [1060.0]})
    assert two == [first, again]
    other_node = scorecard.merge_drains([first, again], resumes={"n3": [1050.0]})
    assert len(other_node) == 1


def test_nothing_to_score_is_not_a_number():
    card = score([], [])
    assert card.precision is None and card.recall is None
    assert card.to_json()["agreement"]["precision"] is None
    only_app = score([advised(1, 10, 1.0, action="stop", job_active=False)], [])
    assert only_app.precision is None and only_app.job_agreement()["agree"] == 1


def test_job_agreement_by_action():
    def verdict(action, changes, active=True):
        a = advised(1, 10, 100.0, action=action, job_active=active)
        return score([a], [], [JobChange(10, 110.0, c) for c in changes]).rows[0].job_agreement

    assert verdict("requeue", ["requeued"]) == "agree"
    assert verdict("requeue", ["cancelled"]) == "differ"
    assert verdict("requeue", []) == "no operator action"
    assert verdict("stop", ["cancelled"]) == "agree"
    assert verdict("stop", []) == "no operator action"
    assert verdict("stop", [], active=False) == "agree"  # it had already ended
    assert verdict("none", []) == "agree"
    assert verdict("none", ["requeued"]) == "differ"


def test_reports_of_one_drain_from_several_sources_merge():
    merged = scorecard.merge_drains(
        [
            Drain("n2", 1003.0, "gpu dead", None, ("observed",)),
            Drain("n2", 1002.0, "gpu dead", "alice", ("slurm",)),
            Drain("n2", 9000.0, "again", None, ("observed",)),
            Drain("n3", 1002.0, "other", "bob", ("accounting",)),
        ]
    )
    assert merged == [
        Drain("n2", 1002.0, "gpu dead", "alice", ("slurm", "observed")),
        Drain("n3", 1002.0, "other", "bob", ("accounting",)),
        Drain("n2", 9000.0, "again", None, ("observed",)),
    ]
    jobs = scorecard.merge_job_changes(
        [
            JobChange(5, 101.0, "cancelled", None, ("observed",)),
            JobChange(5, 100.0, "cancelled", "alice", ("accounting",)),
            JobChange(5, 100.0, "requeued", None, ("slurm",)),
        ]
    )
    assert [(c.change, c.at, c.user, c.sources) for c in jobs] == [
        ("cancelled", 100.0, "alice", ("accounting", "observed")),
        ("requeued", 100.0, None, ("slurm",)),
    ]


def test_inputs_from_the_api():
    item = {
        "id": 3,
        "job_id": 9,
        "kind": "crash",
        "opened_at": "2026-11-29T10:00:00+00:00",
        "advice": {
            "created_at": "2026-11-29T10:00:01+00:00",
            "action": "requeue_exclude",
            "mode": "monitor",
            "reason": "xid 79",
            "exclude": ["n2"],
            "drain": [],
            "verdict": {"fault_class": "hardware"},
            "job": {"state": "FAILED"},
        },
    }
    a = scorecard.advised_from_api(item)
    assert a is not None and a.nodes == {"n2"} and not a.job_active
    assert a.at == datetime.fromisoformat("2026-11-29T10:00:01+00:00").timestamp()
    assert a.says() == "requeue job 9 excluding n2"
    assert scorecard.advised_from_api({**item, "advice": None}) is None
    observed = scorecard.from_observed(
        [
            {"observed_at": 5.0, "payload": {"change": "drained", "node": "n1", "reason": "x"}},
            {"observed_at": 6.0, "payload": {"change": "resumed", "node": "n1"}},
            {"observed_at": 7.0, "payload": {"change": "requeued", "job_id": 4}},
        ]
    )
    assert observed.drains == [Drain("n1", 5.0, "x", None, ("observed",))]
    assert observed.job_changes == [JobChange(4, 7.0, "requeued", None, ("observed",))]
    assert observed.resumes == {"n1": [6.0]}


events = st.lists(
    st.tuples(st.sampled_from(["n1", "n2", "n3", "n4"]), st.floats(0, 20_000)), max_size=8
)


@given(events, events, st.floats(0, 5000))
def test_precision_and_recall_are_fractions_and_order_free(tool, ops, tolerance):
    items = [advised(i, i, at, node) for i, (node, at) in enumerate(tool, 1)]
    drains = [Drain(node, at) for node, at in ops]
    card = score(items, drains, tolerance=tolerance)
    for value in (card.precision, card.recall):
        assert value is None or 0.0 <= value <= 1.0
    again = score(list(reversed(items)), list(reversed(drains)), tolerance=tolerance)
    assert (again.precision, again.recall) == (card.precision, card.recall)
    wider = score(items, drains, tolerance=tolerance + 1000)
    assert (wider.precision or 0) >= (card.precision or 0)
    assert (wider.recall or 0) >= (card.recall or 0)


@given(events)
def test_operators_doing_exactly_what_the_tool_says_scores_one(tool):
    items = [advised(i, i, at, node) for i, (node, at) in enumerate(tool, 1)]
    card = score(items, [Drain(node, at + 60) for node, at in tool])
    assert card.precision in (None, 1.0) and card.recall in (None, 1.0)
    assert card.unmatched_drains == ()


# --- what Slurm records -----------------------------------------------------------------------


def sinfo_nodes():
    nodes = json.loads((DATA / "sinfo-22.05.json").read_text())["nodes"]
    first = dict(nodes[0])
    return [
        {**first, "name": "a1", "state": "idle", "state_flags": ["DRAIN"], "reason": "bad fan",
         "reason_changed_at": 1000, "reason_set_by_user": "alice"},
        {**first, "name": "a2", "state": "idle", "state_flags": ["DRAIN"],
         "reason": "srecovery:4:xid 79", "reason_changed_at": 1000, "reason_set_by_user": "root"},
        {**first, "name": "a3", "state": "idle", "state_flags": ["DRAIN"], "reason": "old",
         "reason_changed_at": 10, "reason_set_by_user": "bob"},
        {**first, "name": "a4", "state": ["IDLE", "DRAIN"], "reason": "new style",
         "reason_changed_at": {"set": True, "number": 1500}, "reason_set_by_user": "carol"},
        {**first, "name": "a5", "reason": "", "reason_changed_at": 1000},
        {**first, "name": "a6", "state": "idle", "state_flags": ["DRAIN"],
         "reason": "srecovery-op:dave: RMA 7", "reason_changed_at": 1800,
         "reason_set_by_user": "root"},
    ]  # fmt: skip


def test_drains_from_nodes_carry_user_and_time():
    nodes = [node_from_json(n) for n in sinfo_nodes()]
    assert slurmfacts.drains_from_nodes(nodes, 500.0, 2000.0) == [
        Drain("a1", 1000.0, "bad fan", "alice", ("slurm",)),
        Drain("a4", 1500.0, "new style", "carol", ("slurm",)),
        Drain("a6", 1800.0, "srecovery-op:dave: RMA 7", "dave", ("slurm",)),
    ]  # a2 is the tool's, a3 is older than the window, a5 is not drained; a6: `srecovery drain`


def test_whose_drain_it_is():
    assert scorecard.is_tool_drain("srecovery:12:xid 79 (GPU has fallen off the bus)")
    assert not scorecard.is_tool_drain("srecovery-op:alice: RMA")
    assert not scorecard.is_tool_drain("srecovery: by hand")
    assert scorecard.drain_user("srecovery-op:alice: RMA", "root") == "alice"
    assert scorecard.drain_user("bad fan", "bob") == "bob"


def slurm_job(job_id, state, **kw):
    fields = dict(
        job_id=job_id,
        name="t",
        state=state,
        reason="",
        user="u",
        partition="p",
        nodes=(),
        num_nodes=1,
        submit_time=100,
        restart_count=0,
    )
    return Job(**{**fields, **kw})


HELD = "srecovery:held:1:9"  # the tool's hold mark


def test_job_changes_from_squeue_leave_out_the_tools():
    tool = [slurmfacts.ToolStep("requeue_hold", 3, None, 1001.0)]
    jobs = [
        slurm_job(1, "CANCELLED", end_time=1000),
        slurm_job(2, "CANCELLED", end_time=1000, admin_comment="slurm-recovery: stop"),
        slurm_job(3, "PENDING", restart_count=1, submit_time=1000),  # the tool's requeue
        slurm_job(4, "PENDING", restart_count=2, submit_time=1100),
        slurm_job(5, "PENDING", restart_count=1, submit_time=1100, admin_comment=HELD),
        slurm_job(6, "CANCELLED", end_time=10),
    ]  # fmt: skip
    found = slurmfacts.job_changes_from_squeue(jobs, 500.0, 2000.0, tool)
    assert [(c.job_id, c.change, c.at) for c in found] == [
        (1, "cancelled", 1000.0),
        (4, "requeued", 1100.0),
    ]


def local(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_accounting_drains_and_job_changes():
    events = "\n".join(
        [
            "n3|2026-11-29T10:00:00|Unknown|DRAIN|fan noise|alice(1000)",
            "n4|2026-11-29T10:05:00|2026-11-29T11:00:00|IDLE+DRAIN|srecovery:3:xid 79|root(0)",
            "n5|2026-11-29T10:06:00|Unknown|DOWN|not responding|slurm(64030)",
            "|2026-11-29T10:07:00|Unknown|DRAIN|cluster event|root(0)",
        ]
    )
    since, until = local("2026-11-29T09:00:00"), local("2026-11-29T12:00:00")
    assert slurmfacts.drains_from_sacctmgr(events, since, until) == [
        Drain("n3", local("2026-11-29T10:00:00"), "fan noise", "alice", ("accounting",))
    ]
    sacct = "\n".join(
        [
            "41|REQUEUED|2026-11-29T10:01:00|",
            "41|RUNNING|Unknown|",
            "42|CANCELLED by 0|2026-11-29T10:02:00|",
            "43|CANCELLED by 0|2026-11-29T10:03:00|slurm-recovery: xid 13: stop",
            "44|REQUEUED|2026-11-29T10:04:00|",
        ]
    )
    tool = [slurmfacts.ToolStep("requeue_hold", 44, None, local("2026-11-29T10:04:01"))]
    found = slurmfacts.job_changes_from_sacct(sacct, since, until, tool)
    assert [(c.job_id, c.change, c.user) for c in found] == [
        (41, "requeued", None),
        (42, "cancelled", "root"),
    ]


def test_read_never_raises_and_says_why(tmp_path):
    from slurm_recovery.config import SchedulerConfig

    facts = slurmfacts.read(
        SchedulerConfig(slurm_bin_dir=str(tmp_path), command_timeout=2.0), 0.0, 1.0
    )
    assert facts.drains == [] and facts.job_changes == [] and not facts.accounting
    assert facts.notes["slurm nodes"].startswith("not read: scontrol not found")
    assert facts.notes["accounting"].startswith("unknown:")
