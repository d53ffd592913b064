"""placement: which of a partition's nodes could take a job, and the words when too few can."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.decide.placement import Shortfall, matches, shortfall, usable
from slurm_recovery.scheduler.base import Job, Node


def job(num_nodes: int = 4, partition: str = "gpu", **kw) -> Job:
    fields = dict(
        job_id=7,
        name="train",
        state="FAILED",
        reason="",
        user="alice",
        partition=partition,
        nodes=tuple(f"n{i}" for i in range(1, num_nodes + 1)),
        num_nodes=num_nodes,
        submit_time=1,
        restart_count=0,
        start_time=2,
        end_time=3,
    )
    fields.update(kw)
    return Job(**fields)


def nodes(count: int = 4, partition: str = "gpu", **by_name) -> dict[str, Node]:
    """``count`` idle nodes n1..; ``by_name`` overrides a node's fields (a dict each)."""
    out = {}
    for i in range(1, count + 1):
        name = f"n{i}"
        fields = dict(state="IDLE", partitions=(partition,))
        fields.update(by_name.get(name, {}))
        out[name] = Node(name, **fields)
    return out


def test_a_job_spanning_its_partition_cannot_run_without_one_node():
    short = shortfall(job(4), nodes(4), {"n2"})
    assert short == Shortfall(need=4, usable=frozenset({"n1", "n3", "n4"}), excluded={"n2"})
    assert short.words() == "job needs 4 nodes, 3 are usable after excluding n2"


def test_a_spare_node_makes_room():
    assert shortfall(job(4), nodes(5), {"n2"}) is None


@pytest.mark.parametrize(
    ("state", "flags"),
    [
        ("DOWN", ()),
        ("IDLE", ("DRAIN",)),
        ("ALLOCATED", ("DRAIN",)),  # draining: takes no new job
        ("DOWN", ("NOT_RESPONDING",)),  # SlurmdTimeout passed: Slurm set it DOWN
        ("IDLE", ("POWERED_DOWN", "DRAIN")),  # asleep and drained: the drain counts
        ("MIXED", ("FAIL",)),  # an operator's state=fail
        ("FUTURE", ()),
        ("FAIL", ()),
    ],
)
def test_nodes_that_take_no_job_do_not_count(state, flags):
    listing = nodes(5, n5=dict(state=state, flags=frozenset(flags)))
    assert not usable(listing["n5"])
    short = shortfall(job(4), listing, {"n2"})
    assert short is not None and "n5" not in short.usable


@pytest.mark.parametrize(
    ("state", "flags"),
    [
        ("ALLOCATED", ("NOT_RESPONDING",)),  # one missed ping under load (CI stop 44)
        ("IDLE", ("NOT_RESPONDING",)),
        ("IDLE", ("POWERED_DOWN",)),  # power saving: Slurm powers it up for a job
        ("IDLE", ("POWERING_DOWN",)),
        ("MIXED", ("REBOOT_ISSUED",)),  # back after its reboot
        ("UNKNOWN", ()),  # not registered yet (slurmctld just started)
        ("IDLE", ("COMPLETING",)),
    ],
)
def test_nodes_in_a_passing_state_count_no_operator_is_needed(state, flags):
    """A snapshot taken while a node misses a ping, sleeps or reboots must not make a job
    look unplaceable: with ``unplaceable = "stop"`` that would cancel a job that can run."""
    listing = nodes(4, n3=dict(state=state, flags=frozenset(flags)))
    assert usable(listing["n3"])
    assert shortfall(job(3), listing, {"n2"}) is None


@pytest.mark.parametrize("state", ["IDLE", "ALLOCATED", "MIXED", "COMPLETING"])
def test_busy_nodes_count_they_free_up(state):
    listing = nodes(5, n5=dict(state=state))
    assert usable(listing["n5"])
    assert shortfall(job(4), listing, {"n2"}) is None


def test_nodes_of_other_partitions_do_not_count_and_a_job_in_several_sees_all():
    listing = nodes(4) | {"m1": Node("m1", "IDLE", partitions=("cpu",))}
    assert shortfall(job(4), listing, {"n2"}) is not None
    assert shortfall(job(4, partition="gpu,cpu"), listing, {"n2"}) is None


def test_a_node_in_two_partitions_counts_for_either():
    listing = nodes(4) | {"m1": Node("m1", "IDLE", partitions=("cpu", "gpu"))}
    assert shortfall(job(4), listing, {"n2"}) is None


def test_what_cannot_be_told_is_never_a_shortfall():
    assert shortfall(job(4), {}, {"n2"}) is None  # no listing
    assert shortfall(job(4, partition="other"), nodes(4), {"n2"}) is None  # unseen partition
    assert shortfall(job(0), nodes(4), {"n1", "n2", "n3", "n4"}) is None  # count unknown
    assert shortfall(job(4, partition=""), nodes(4), {"n2"}) is None


def test_required_nodes_must_all_be_usable():
    pinned = job(2, required_nodes=frozenset({"n1", "n2"}))
    assert shortfall(pinned, nodes(4), {"n3"}) is None
    short = shortfall(pinned, nodes(4, n2=dict(flags=frozenset({"DRAIN"}))), set())
    assert short is not None and short.need == 2
    # a required node the listing does not show is Slurm's business, not a shortfall
    assert shortfall(job(1, required_nodes=frozenset({"x9"})), nodes(4), set()) is None


def test_a_constraint_counts_only_the_nodes_that_carry_it():
    a100 = frozenset({"a100", "ib"})
    listing = nodes(
        5,
        n1=dict(features=a100),
        n2=dict(features=a100),
        n3=dict(features=a100),
        n4=dict(features=a100),
        n5=dict(features=frozenset({"h100"})),
    )
    assert shortfall(job(4, features="a100"), listing, {"n2"}) is not None
    assert shortfall(job(4, features="a100|h100"), listing, {"n2"}) is None
    assert shortfall(job(4), listing, {"n2"}) is None


def test_words_for_one_node_and_none_excluded():
    short = shortfall(job(1), nodes(1, n1=dict(state="DOWN")), set())
    assert short is not None and short.words() == "job needs 1 node, 0 are usable"
    two = shortfall(job(2), nodes(2), {"n1"})
    assert two is not None and two.words() == "job needs 2 nodes, 1 is usable after excluding n1"


def test_excluded_nodes_of_other_partitions_are_not_named():
    short = shortfall(job(4), nodes(4), {"n2", "zz9"})
    assert short is not None and short.excluded == {"n2"}


@pytest.mark.parametrize(
    ("constraint", "features", "expected"),
    [
        ("a100", {"a100"}, True),
        ("a100", {"h100"}, False),
        ("a100&ib", {"a100", "ib"}, True),
        ("a100&ib", {"a100"}, False),
        ("a100,ib", {"ib"}, False),
        ("a100|h100", {"h100"}, True),
        ("a100|h100", set(), False),
        ("", set(), True),
        ("[rack1|rack2]", set(), True),  # brackets: not checked
        ("a100*2", set(), True),  # counts: not checked
        ("(a|b)&c", set(), True),
        ("a|b&c", set(), True),  # mixed: not checked
    ],
)
def test_plain_constraints(constraint, features, expected):
    assert matches(constraint, frozenset(features)) is expected


def test_features_not_known_always_match():
    assert matches("a100", None)


NAMES = st.text("abcdefgh", min_size=1, max_size=3)


@given(st.lists(NAMES, min_size=1, max_size=4), st.frozensets(NAMES, max_size=6))
def test_and_or_lists_mean_all_and_any(names, features):
    assert matches("&".join(names), features) is all(n in features for n in names)
    assert matches(",".join(names), features) is all(n in features for n in names)
    assert matches("|".join(names), features) is any(n in features for n in names)


@given(st.text(max_size=30), st.frozensets(NAMES, max_size=4))
def test_any_constraint_text_answers_without_error(constraint, features):
    assert matches(constraint, features) in (True, False)


STATES = st.sampled_from(["IDLE", "ALLOCATED", "MIXED", "DOWN", "FUTURE"])
FLAGS = st.frozensets(st.sampled_from(["DRAIN", "NOT_RESPONDING", "COMPLETING", "RESERVED"]))


@given(
    st.lists(st.tuples(STATES, FLAGS), min_size=1, max_size=12),
    st.integers(1, 12),
    st.frozensets(st.integers(1, 12), max_size=6),
)
def test_a_shortfall_is_exactly_too_few_usable_nodes(states, need, excluded_numbers):
    listing = {
        f"n{i}": Node(f"n{i}", state, flags=flags, partitions=("gpu",))
        for i, (state, flags) in enumerate(states, start=1)
    }
    excluded = {f"n{i}" for i in excluded_numbers}
    fit = {n for n, node in listing.items() if usable(node) and n not in excluded}
    short = shortfall(job(need), listing, excluded)
    assert (short is None) is (len(fit) >= need)
    if short is not None:
        assert short.usable == fit and short.need == need
        # more exclusions never make room
        assert shortfall(job(need), listing, excluded | {"n1"}) is not None


# ------------------------------------------------------------- the status list (level check)


def test_the_status_lists_requeued_jobs_that_wait_without_room():
    from slurm_recovery.controller.views import waiting_without_room
    from slurm_recovery.decide.model import ClusterView
    from slurm_recovery.holdmark import hold_mark, requeue_incident, with_note

    note = with_note("site text", "srecovery: requeued after incident 12, excluding n2")
    waiting = job(4, job_id=7, state="PENDING", excluded_nodes=frozenset({"n2"}),
                  admin_comment=note)  # fmt: skip
    theirs = job(4, job_id=8, state="PENDING", excluded_nodes=frozenset({"n2"}))  # not ours
    held = job(4, job_id=9, state="PENDING", held=True, excluded_nodes=frozenset({"n2"}),
               admin_comment=hold_mark(13, 2e9))  # fmt: skip
    placeable = job(3, job_id=10, state="PENDING", excluded_nodes=frozenset({"n2"}),
                    admin_comment=note)  # fmt: skip
    running = job(4, job_id=11, state="RUNNING", admin_comment=note)
    # Slurm 24.11 holds a job it finds it can never run (BadConstraints): still waiting
    by_slurm = job(4, job_id=12, state="PENDING", held=True, reason="BadConstraints",
                   excluded_nodes=frozenset({"n2"}), admin_comment=note)  # fmt: skip
    jobs = {j.job_id: j for j in (waiting, theirs, held, placeable, running, by_slurm)}
    view = ClusterView(now=0.0, jobs=jobs, nodes=nodes(4))
    assert waiting_without_room(view) == [
        {
            "job_id": job_id,
            "incident": 12,
            "reason": "needs operator: job needs 4 nodes, 3 are usable after excluding n2",
        }
        for job_id in (7, 12)
    ]
    # the operator resumes a node elsewhere in the partition: the list clears
    assert waiting_without_room(ClusterView(now=0.0, jobs=jobs, nodes=nodes(5))) == []
    assert requeue_incident(hold_mark(13, 2e9)) == 13 and requeue_incident("site text") is None
