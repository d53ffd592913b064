"""``next_step``: the restart sequence as a pure function (issue 16, item 3 and its class)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.decide.model import Action, Mode
from slurm_recovery.decide.restart import Close, Plan, Step, Wait, next_step
from slurm_recovery.holdmark import hold_mark, parse_hold_mark
from slurm_recovery.scheduler.base import Node
from tests.unit.test_replay import NOW
from tests.unit.test_replay import job as replay_job

T = "job 7"
PLAN = Plan(
    incident_id=3,
    advice_id=1,
    action=Action.REQUEUE_EXCLUDE,
    mode=Mode.ACT,
    reason="xid 79",
    exclude=frozenset({"n2"}),
    drain=frozenset({"n2"}),
    cause="xid 79",
)


def job(state="RUNNING", restart=0, held=False, comment="", excluded=(), nodes=("n1", "n2"), **kw):
    """test_replay's job 7, as the restart sequence sees it."""
    return replay_job(
        state,
        nodes=nodes,
        restart_count=restart,
        held=held,
        admin_comment=comment,
        excluded_nodes=frozenset(excluded),
        **kw,
    )


def nodes(drained=("n2",), reason="srecovery:3:xid 79"):
    return {
        n: Node(
            n,
            "IDLE",
            flags=frozenset({"DRAIN"}) if n in drained else frozenset(),
            reason=reason if n in drained else "",
        )
        for n in ("n1", "n2", "n3", "n4")
    }


def step(the_job, done, shown=None, plan=PLAN, **kw):
    mark = parse_hold_mark(the_job.admin_comment) if the_job else None
    return next_step(plan, the_job, 0, done, shown or nodes(), NOW, hold_mark_of=mark, **kw)


MARK = hold_mark(3, NOW + 300)
DRAINED = {("drain", "n2"): NOW - 5}


def test_the_sequence_from_a_running_job():
    assert step(job(), {}, nodes(drained=())).action == Step(
        "drain", "n2", {"reason": "srecovery:3:xid 79"}
    )
    assert step(job(), DRAINED).action == Step("mark", T)
    marked = {**DRAINED, ("mark", T): NOW - 4}
    held = step(job(comment=MARK), marked).action
    assert held == Step("requeue_hold", T, milestone="held")
    requeued = {**marked, ("requeue_hold", T): NOW - 3}
    pending = job("PENDING", 1, held=True, comment=MARK, nodes=(), begin_time=int(NOW) + 120)
    assert step(pending, requeued).action.name == "exclude"
    excluded = {**requeued, ("exclude", T): NOW - 2}
    pending = job(
        "PENDING", 1, held=True, comment=MARK, nodes=(), excluded={"n2"}, begin_time=int(NOW) + 120
    )
    begin = step(pending, excluded).action
    assert begin.name == "begin_now" and begin.params["at"] == int(NOW - 3) + 1
    begun = {**excluded, ("begin_now", T): NOW - 1}
    assert step(pending, begun).action == Step("release", T, milestone="released")


def test_the_release_waits_for_the_begin_time():
    """Released before its begin time, a job misses the scheduling attempt the release
    triggers and waits for Slurm's next pass (30 s or more; seen in CI). So the tool holds it
    until the first second it may start, then releases it."""
    requeued_at = NOW + 0.4  # earliest start: NOW + 1
    done = {**DRAINED, ("mark", T): NOW, ("requeue_hold", T): requeued_at}
    done |= {("exclude", T): NOW + 0.5, ("begin_now", T): NOW + 0.6}
    pending = job(
        "PENDING", 1, held=True, comment=MARK, nodes=(), excluded={"n2"}, begin_time=int(NOW) + 1
    )
    mark = parse_hold_mark(MARK)
    for now in (NOW + 0.6, NOW + 0.99):
        waiting = next_step(PLAN, pending, 0, done, nodes(), now, hold_mark_of=mark).action
        assert waiting == Wait("held until its begin time, then released")
    for now in (NOW + 1, NOW + 30):
        released = next_step(PLAN, pending, 0, done, nodes(), now, hold_mark_of=mark).action
        assert released == Step("release", T, milestone="released")


def test_a_drain_the_operator_resumed_is_never_drained_again():
    """Item 3: ``scontrol update nodename=n2 state=resume`` after the tool drained it."""
    nxt = step(job(), DRAINED, nodes(drained=()))
    assert nxt.action == Step("mark", T)
    assert [(c.what, c.target) for c in nxt.changes] == [("resumed", "n2")]


def test_a_hold_placed_after_the_tools_release_is_kept():
    """Item 3: an admin's ``scontrol hold`` once the tool released the job."""
    done = {
        **DRAINED,
        ("mark", T): 1.0,
        ("requeue_hold", T): 2.0,
        ("exclude", T): 3.0,
        ("release", T): 4.0,
        ("unmark", T): 5.0,
    }
    held = job("PENDING", 1, held=True, nodes=(), excluded={"n2"})
    nxt = step(held, done)
    assert isinstance(nxt.action, Wait)
    assert [c.what for c in nxt.changes] == ["held"]


def test_an_exclusion_the_operator_removed_is_not_put_back():
    done = {
        **DRAINED,
        ("mark", T): 1.0,
        ("requeue_hold", T): 2.0,
        ("exclude", T): 3.0,
        ("release", T): 4.0,
        ("unmark", T): 5.0,
    }
    nxt = step(job("PENDING", 1, nodes=()), done)
    assert isinstance(nxt.action, Wait)
    assert [c.what for c in nxt.changes] == ["unexcluded"]


def test_a_job_cancelled_while_held_is_not_called_restarted():
    """Item 11."""
    done = {**DRAINED, ("mark", T): 1.0, ("requeue_hold", T): NOW - 2}
    nxt = step(job("CANCELLED", 1, held=True, comment=MARK, nodes=()), done)
    assert nxt.action == Close("the job ended CANCELLED while held for its restart: not restarted")


def test_a_job_the_watchdog_released_onto_an_excluded_node_is_restarted_again():
    """Item 12: released by the watchdog before the exclusion, running on n2 again."""
    done = {**DRAINED, ("mark", T): 1.0, ("requeue_hold", T): 2.0}
    running = job("RUNNING", 1, nodes=("n2",))
    nxt = step(running, done, watchdog_released_at=NOW - 30)
    assert isinstance(nxt.action, Close) and nxt.action.redo
    assert [c.what for c in nxt.changes] == ["released"]


def test_the_tools_repaired_exclusions_are_dropped_by_the_exclude_step():
    plan = Plan(
        3,
        1,
        Action.REQUEUE_EXCLUDE,
        Mode.ACT,
        "x",
        exclude=frozenset({"n1"}),
        unexclude=frozenset({"n2", "n3"}),
    )
    done = {("mark", T): 1.0, ("requeue_hold", T): 2.0}
    pending = job("PENDING", 1, held=True, comment=MARK, nodes=(), excluded={"n2", "n3", "n4"})
    nxt = step(pending, done, plan=plan)
    assert nxt.action.name == "exclude"
    assert nxt.action.params == {"nodes": ["n1"], "unexclude": ["n2", "n3"]}


RELEASED = {
    **DRAINED,
    ("mark", T): 1.0,
    ("requeue_hold", T): 2.0,
    ("exclude", T): 3.0,
    ("begin_now", T): 3.5,
    ("release", T): 4.0,
    ("unmark", T): 5.0,
}


def test_a_waiting_job_stops_excluding_a_node_the_operator_resumed():
    """Issue 30: a job spanning its partition, requeued excluding n2, waits; the operator
    repairs and resumes n2: the tool drops its own exclusion so the job can start."""
    waiting = job("PENDING", 1, nodes=(), excluded={"n2"})
    assert step(waiting, RELEASED).action == Wait("released: waiting for resources")
    nxt = step(waiting, RELEASED, nodes(drained=()))
    assert nxt.action == Step("unexclude", "n2", {"job": 7})
    assert [c.what for c in nxt.changes] == ["resumed"]
    # once done: waits, no "exclusion removed by someone else" record, and running on n2 is
    # the restart, not a release onto an excluded node
    dropped = {**RELEASED, ("unexclude", "n2"): 6.0}
    after = step(job("PENDING", 1, nodes=()), dropped, nodes(drained=()))
    assert after.action == Wait("released: waiting for resources")
    assert [c.what for c in after.changes] == ["resumed"]
    running = step(job("RUNNING", 1, nodes=("n1", "n2")), dropped, nodes(drained=()))
    assert running.action == Close("restarted on n[1-2]", "running_again")


def test_a_resumed_node_that_is_down_or_a_held_job_keeps_the_exclusion():
    waiting = job("PENDING", 1, nodes=(), excluded={"n2"})
    down = nodes(drained=()) | {"n2": Node("n2", "DOWN")}
    assert isinstance(step(waiting, RELEASED, down).action, Wait)
    held = job("PENDING", 1, held=True, nodes=(), excluded={"n2"})
    assert isinstance(step(held, RELEASED, nodes(drained=())).action, Wait)


def test_slurms_own_hold_of_a_job_it_finds_it_can_never_run_is_not_an_operators():
    """Slurm 24.11: released and excluding n2, a job that needs every node is "non-runnable":
    slurmctld holds it itself (reason BadConstraints, priority 0). That is no operator's hold:
    the tool keeps waiting, and drops its exclusion of n2 once n2 is resumed (the update makes
    Slurm weigh the job again). An operator's hold after the release is left alone."""
    by_slurm = job("PENDING", 1, held=True, nodes=(), excluded={"n2"}, reason="BadConstraints")
    assert by_slurm.held_by_slurm and not by_slurm.held_by_someone
    nxt = step(by_slurm, RELEASED)
    assert nxt.action == Wait("released: waiting for resources") and nxt.changes == ()
    nxt = step(by_slurm, RELEASED, nodes(drained=()))
    assert nxt.action == Step("unexclude", "n2", {"job": 7})
    by_admin = job("PENDING", 1, held=True, nodes=(), excluded={"n2"}, reason="JobHeldAdmin")
    assert by_admin.held_by_someone
    nxt = step(by_admin, RELEASED, nodes(drained=()))
    assert nxt.action == Wait("held by someone else after the tool released it")


def test_only_the_tools_drained_exclusions_are_dropped():
    """A node excluded without a drain (below drain_min_confidence) is idle in Slurm from the
    start: not a repair, so it stays excluded."""
    plan = Plan(3, 1, Action.REQUEUE_EXCLUDE, Mode.ACT, "x", exclude=frozenset({"n2"}))
    done = {k: v for k, v in RELEASED.items() if k[0] != "drain"}
    waiting = job("PENDING", 1, nodes=(), excluded={"n2"})
    assert isinstance(step(waiting, done, nodes(drained=()), plan=plan).action, Wait)


STEPS = (
    "drain",
    "mark",
    "requeue_hold",
    "exclude",
    "begin_now",
    "release",
    "unmark",
    "cancel",
    "unexclude",
)
NODE_STEPS = ("drain", "unexclude")


@given(
    state=st.sampled_from(["RUNNING", "PENDING", "FAILED", "COMPLETING", "CANCELLED"]),
    restart=st.integers(0, 2),
    held=st.booleans(),
    marked=st.booleans(),
    excluded=st.sets(st.sampled_from(["n1", "n2", "n3"])),
    drained=st.sets(st.sampled_from(["n1", "n2", "n3"])),
    done=st.sets(st.sampled_from(STEPS)),
    action=st.sampled_from([Action.REQUEUE_EXCLUDE, Action.REQUEUE, Action.STOP, Action.NONE]),
    watchdog=st.booleans(),
)
def test_a_step_recorded_done_is_never_asked_again(
    state, restart, held, marked, excluded, drained, done, action, watchdog
):
    """Whatever Slurm shows and whatever is recorded: the step ``next_step`` asks for has no
    ok record yet (a step that succeeded is done), and a release is asked for only while the
    job is held with the tool's own requeue."""
    plan = Plan(3, 1, action, Mode.ACT, "r", exclude=frozenset({"n2"}), drain=frozenset({"n2"}))
    the_job = job(
        state,
        restart,
        held=held,
        comment=MARK if marked else "",
        excluded=excluded,
        nodes=() if state == "PENDING" else ("n1", "n2"),
    )
    recorded = {(s, "n2" if s in NODE_STEPS else T): 1.0 for s in done}
    nxt = step(
        the_job,
        recorded,
        nodes(drained=drained),
        plan=plan,
        watchdog_released_at=NOW if watchdog else None,
    )
    if isinstance(nxt.action, Step):
        assert (nxt.action.name, nxt.action.target) not in recorded
        if nxt.action.name == "release":
            found = {(f.name, f.target) for f in nxt.found}
            assert held and restart > 0 and ("requeue_hold", T) in set(recorded) | found
            assert not watchdog


@given(
    restart=st.integers(0, 2),
    held=st.booleans(),
    marked=st.booleans(),
    done=st.sets(st.sampled_from(STEPS)),
    action=st.sampled_from([Action.REQUEUE_EXCLUDE, Action.REQUEUE]),
)
def test_a_completing_job_is_never_requeued(restart, held, marked, done, action):
    """Slurm 25.11.7 and 26.05.3 can crash slurmctld, or corrupt the previous accounting
    record, when a COMPLETING job is requeued (fixed after 26.05.3, not on 25.11): the restart
    waits until the job has left COMPLETING, whatever else is recorded. Nor is its begin time
    set (or the job released) while it is COMPLETING after the requeue: on 25.11+ Slurm pushes
    a begin time set then back by its whole requeue delay."""
    plan = Plan(3, 1, action, Mode.ACT, "r", exclude=frozenset({"n2"}), drain=frozenset({"n2"}))
    completing = job("COMPLETING", restart, held=held, comment=MARK if marked else "")
    recorded = {(s, "n2" if s in NODE_STEPS else T): 1.0 for s in done}
    nxt = step(completing, recorded, nodes(), plan=plan)
    assert not (
        isinstance(nxt.action, Step) and nxt.action.name in ("requeue_hold", "begin_now", "release")
    ), nxt
