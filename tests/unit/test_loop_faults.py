"""The recovery loop under faults, with a fake Slurm (docs/reliability.md): a node that keeps
failing jobs while the blast radius keeps it undrained, and a store that fails its writes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from slurm_recovery.controller.loop import MAX_FAILED_STEPS, Reconciler, StepDone
from slurm_recovery.controller.nodelisting import NodeListing
from slurm_recovery.decide.model import Mode
from slurm_recovery.scheduler.base import Unreachable, UnsupportedOutput
from slurm_recovery.store import Store, StoreFullError
from tests.fakeslurm import FakeSlurm
from tests.unit.test_replay import CATALOGUE, NOW, WIDE, job, nodes, xid


def reconciler(
    store: Store,
    slurm: FakeSlurm,
    clock: list[float],
    after_step: StepDone | None = None,
    listing: NodeListing | None = None,
) -> Reconciler:
    return Reconciler(
        store=store,
        scheduler=slurm,
        policy=dataclasses.replace(WIDE, mode=Mode.ACT),
        catalogue=CATALOGUE,
        cluster="c1",
        hold_deadline=120.0,
        clock=lambda: clock[0],
        after_step=after_step,
        node_listing=listing,
    )


class Killed(BaseException):
    """Stands in for the failpoint's SIGKILL: nothing after it runs."""


def test_after_step_runs_once_the_step_is_on_record(tmp_path: Path):
    """The failpoint seam: a controller killed in ``after_step`` has the step on record, and
    the next controller goes on from the step after it instead of repeating it."""
    store = Store.open(tmp_path / "state.db")
    slurm = FakeSlurm([job(nodes=("n1", "n2"))], nodes())
    clock = [NOW]
    store.add_evidence([xid(79, node="n2", at=NOW - 20)], received_at=NOW - 19)
    heard: list[tuple[str, list[str]]] = []

    def kill_after_mark(step: str) -> None:
        heard.append((step, [a.step for a in store.actions() if a.result == "ok"]))
        if step == "mark":
            raise Killed

    with pytest.raises(Killed):
        reconciler(store, slurm, clock, after_step=kill_after_mark).tick()
    assert heard == [("drain", ["drain"]), ("mark", ["drain", "mark"])]
    assert "requeue_hold" not in [step for step, _ in slurm.steps]

    slurm.steps.clear()
    clock[0] = NOW + 1
    loop = reconciler(store, slurm, clock)  # restarted, without the failpoint
    loop.tick()
    assert [step for step, _ in slurm.steps] == [
        "requeue_hold",  # neither drain nor mark again
        "add_excluded_nodes",
        "set_begin_now",  # NOW + 2: held until then
    ]
    clock[0] = NOW + 2  # the begin time: released in the pass that reaches it
    loop.tick()
    assert [step for step, _ in slurm.steps][3:] == [
        "release",
        "set_admin_comment",  # the note that replaces the mark
    ]


def test_a_fault_in_the_same_pass_as_running_again_counts_the_restart(tmp_path: Path):
    """The restarted job lands on another bad node and is doomed again in the pass that sees
    it running: the open incident's restart is counted (restart 2 of 3, not 1 of 3 again), so
    ``max_restarts`` holds during a storm."""
    store = Store.open(tmp_path / "state.db")
    first = job(nodes=("n1", "n2"))
    slurm = FakeSlurm([first], nodes())
    clock = [NOW]
    store.add_evidence([xid(79, node="n2", at=NOW - 20)], received_at=NOW - 19)
    loop = reconciler(store, slurm, clock)
    loop.tick()
    (incident,) = store.list_incidents()
    assert "(restart 1 of 3)" in store.latest_advice(incident.id).reason

    # Slurm now shows the job running again, on n3 and n4; n3 reports a fatal XID at once.
    clock[0] = NOW + 10
    slurm.jobs[7] = dataclasses.replace(
        first, nodes=("n3", "n4"), restart_count=1, start_time=int(NOW) + 5
    )
    store.add_evidence([xid(79, node="n3", at=NOW + 8)], received_at=NOW + 9)
    loop.tick()
    second, closed = store.list_incidents()  # newest first
    assert closed.id == incident.id and closed.outcome.startswith("restarted on")
    assert "(restart 2 of 3)" in store.latest_advice(second.id).reason


def test_a_store_that_cannot_write_is_the_last_error_not_a_crash(tmp_path: Path, monkeypatch):
    """Disk full under the loop: the pass stops, /healthz shows why (``last_error``), the next
    pass with space again goes on."""
    store = Store.open(tmp_path / "state.db")
    slurm = FakeSlurm([job(nodes=("n1", "n2"))], nodes())
    clock = [NOW]
    loop = reconciler(store, slurm, clock)
    store.add_evidence([xid(79, node="n2", at=NOW - 20)], received_at=NOW - 19)

    def full(*args, **kwargs):
        raise StoreFullError("store x: disk or database size limit full (disk full); write undone")

    monkeypatch.setattr(store, "open_incident", full)
    assert loop.tick() is False
    assert loop.last_error.startswith("store: ") and "full" in loop.last_error
    assert loop.last_tick is None and store.list_incidents() == []
    monkeypatch.undo()
    clock[0] = NOW + 1
    loop.tick()
    assert loop.last_error == "" and loop.last_tick == NOW + 1
    assert len(store.list_incidents()) == 1


def test_released_then_cut_off_the_mark_is_still_replaced_before_closing(tmp_path: Path):
    """Released, then slurmctld went down (or the controller died) before the hold mark was
    replaced: the job runs again still carrying ``srecovery:held:...``. The mark is replaced
    before the incident is closed, or a later hold by someone else would look like ours to the
    watchdog."""
    from slurm_recovery.holdmark import hold_mark

    store = Store.open(tmp_path / "state.db")
    first = job(nodes=("n1", "n2"))
    slurm = FakeSlurm([first], nodes())
    clock = [NOW]
    store.add_evidence([xid(79, node="n2", at=NOW - 20)], received_at=NOW - 19)

    def cut_off_after_release(step: str) -> None:
        if step == "release":
            slurm.refuse[("set_admin_comment", 7)] = Unreachable("Unable to contact slurm")

    loop = reconciler(store, slurm, clock, after_step=cut_off_after_release)
    loop.tick()  # held until its begin time, NOW + 1
    clock[0] = NOW + 1
    loop.tick()  # released, then cut off
    assert ("release", (7,)) in slurm.steps
    (incident,) = store.list_incidents()
    assert hold_mark(incident.id, int(NOW) + 120) in slurm.jobs[7].admin_comment  # not replaced
    del slurm.refuse[("set_admin_comment", 7)]
    clock[0] = NOW + 10
    slurm.jobs[7] = dataclasses.replace(
        slurm.jobs[7], state="RUNNING", nodes=("n3", "n4"), start_time=int(NOW) + 5
    )
    slurm.steps.clear()
    loop.tick()
    assert [s for s in slurm.steps if s[0] == "set_admin_comment"] == [
        (
            "set_admin_comment",
            (7, f"srecovery: requeued after incident {incident.id}, excluding n2"),
        )
    ]
    (closed,) = store.list_incidents()
    assert closed.outcome.startswith("restarted on")


def test_steps_slurm_shows_done_without_a_record_are_recorded_found(tmp_path: Path, monkeypatch):
    """Killed between a Slurm call and the commit of its record: the next controller finds the
    job marked, requeued and excluded with no action rows for them, records them (``ok``,
    "found done in Slurm ...", audited) and goes on; nothing is called twice."""
    from slurm_recovery.holdmark import hold_mark

    store = Store.open(tmp_path / "state.db")
    first = job(nodes=("n1", "n2"))
    slurm = FakeSlurm([first], nodes())
    clock = [NOW]
    store.add_evidence([xid(79, node="n2", at=NOW - 20)], received_at=NOW - 19)
    loop = reconciler(store, slurm, clock)
    monkeypatch.setattr(loop, "_reconcile", lambda incident, view: False)
    loop.tick()  # the incident and its advice, no step yet
    monkeypatch.undo()
    (incident,) = store.list_incidents()
    assert store.actions(incident_id=incident.id) == []
    # what Slurm shows after the kill: marked, requeued held, n2 excluded; begin time far off
    slurm.jobs[7] = dataclasses.replace(
        first,
        state="PENDING",
        nodes=(),
        restart_count=1,
        held=True,
        begin_time=int(NOW) + 120,
        excluded_nodes=frozenset({"n2"}),
        admin_comment=hold_mark(incident.id, int(NOW) + 120),
    )
    clock[0] = NOW + 2
    slurm.steps.clear()
    loop.tick()  # begin time moved to NOW + 3: held until then
    clock[0] = NOW + 3
    loop.tick()
    found = [(a.step, a.message) for a in store.actions(incident_id=incident.id)]
    assert [step for step, message in found if message.startswith("found done")] == [
        "mark",
        "requeue_hold",
        "exclude",
    ]
    # the steps not done yet, then the note that replaces the mark; the mark is not set again
    note = f"srecovery: requeued after incident {incident.id}, excluding n2"
    assert slurm.steps == [
        ("drain_node", ("n2", slurm.steps[0][1][1])),
        ("set_begin_now", (7, NOW + 3)),
        ("release", (7,)),
        ("set_admin_comment", (7, note)),
    ]
    audited = [r.payload for r in store.iter_audit() if r.kind == "action"]
    assert [p["step"] for p in audited if p.get("found")] == ["mark", "requeue_hold", "exclude"]


class UnreadableSlurm(FakeSlurm):
    """A Slurm whose job listing this parser cannot read (a release it does not know)."""

    def list_jobs(self):
        raise UnsupportedOutput("jobs[0].exit_code is 'x'; expected ...", "26.05.1", field="x")


def test_a_slurm_it_cannot_read_leaves_it_in_monitor_mode_for_good(tmp_path: Path):
    """At start the controller checks it can read jobs and nodes. It cannot: it stays up,
    says why (last_error, so /healthz and `srecovery status`; the audit trail), touches
    nothing, and stays in monitor mode even once a pass can read Slurm again."""
    store = Store.open(tmp_path / "state.db")
    slurm = UnreadableSlurm([job(nodes=("n1", "n2"))], nodes())
    clock = [NOW]
    loop = reconciler(store, slurm, clock)
    store.add_evidence([xid(79, node="n2", at=NOW - 20)], received_at=NOW - 19)
    assert loop.tick() is False
    assert "monitor only" in loop.slurm_problem and "26.05.1" in loop.slurm_problem
    assert "exit_code" in loop.last_error
    assert slurm.steps == [] and store.list_incidents() == []
    assert [r.kind for r in store.audit_rows(limit=10)].count("slurm_unsupported") == 1

    # the listing reads again (a record that came and went): still monitor, advice only
    slurm.__class__ = FakeSlurm
    clock[0] = NOW + 1
    loop.tick()
    assert loop.policy.mode is Mode.MONITOR and loop.last_error == loop.slurm_problem
    (incident,) = store.list_incidents()
    assert incident.outcome.startswith("monitor: would requeue job 7")
    assert [s for s in slurm.steps if s[0] != "version"] == []


def test_a_step_that_cannot_be_read_back_never_releases_without_the_exclusion(tmp_path: Path):
    """Half an action never happens: requeued and held, the exclusion fails (a parse error
    that will not change), so the job is not released in that pass or any later one; after
    MAX_FAILED_STEPS the incident says it needs an operator (the watchdog's hold deadline
    then releases the job, fail open)."""
    store = Store.open(tmp_path / "state.db")
    first = job(nodes=("n1", "n2"))
    # requeue works; reading the job back for the exclusion fails with a parse error
    unreadable = UnsupportedOutput("job 7.excluded_nodes is 5; expected a string", "26.05.1")
    slurm = FakeSlurm([first], nodes(), refuse={("add_excluded_nodes", 7): unreadable})
    clock = [NOW]
    store.add_evidence([xid(79, node="n2", at=NOW - 20)], received_at=NOW - 19)
    loop = reconciler(store, slurm, clock)
    loop.tick()
    held = slurm.jobs[7]  # Slurm shows it requeued and held, no exclusion yet
    assert (held.state, held.held, held.excluded_nodes) == ("PENDING", True, frozenset())
    for i in range(MAX_FAILED_STEPS + 2):
        clock[0] = NOW + 2 + i
        loop.tick()
    names = [s[0] for s in slurm.steps]
    assert names.count("add_excluded_nodes") == MAX_FAILED_STEPS
    assert "release" not in names and "set_begin_now" not in names
    (closed,) = store.list_incidents()
    assert closed.outcome.endswith("needs operator")


class AnswerLost(FakeSlurm):
    """slurmctld applies the requeue, then stops answering before it replies."""

    def requeue_hold(self, job_id: int) -> None:
        super().requeue_hold(job_id)
        raise Unreachable("slurm_load_jobs error: Unable to contact slurm controller")


def test_a_step_whose_answer_was_lost_is_found_and_says_so(tmp_path: Path):
    """Issue 16, item 11: Slurm applied the step, then stopped answering. The next pass finds
    it done; the record says the answer was lost (audited ``unanswered``), not that the
    controller stopped after the call (it never stopped), and the step is not repeated."""
    from slurm_recovery.holdmark import hold_mark

    store = Store.open(tmp_path / "state.db")
    first = job(nodes=("n1", "n2"))
    slurm = AnswerLost([first], nodes())
    clock = [NOW]
    store.add_evidence([xid(79, node="n2", at=NOW - 20)], received_at=NOW - 19)
    loop = reconciler(store, slurm, clock)
    loop.tick()  # drain, mark, then requeue_hold: applied, no answer
    assert loop.last_error.startswith("slurmctld unreachable")
    (incident,) = store.list_incidents()
    slurm.jobs[7] = dataclasses.replace(
        slurm.jobs[7], admin_comment=hold_mark(incident.id, int(NOW) + 120)
    )
    unanswered = [
        r.payload
        for r in store.iter_audit()
        if r.kind == "action" and r.payload.get("result") == "unanswered"
    ]
    assert [p["step"] for p in unanswered] == ["requeue_hold"]
    clock[0] = NOW + 2
    loop.tick()
    (found,) = [a for a in store.actions(incident_id=incident.id) if a.step == "requeue_hold"]
    assert found.result == "ok"
    assert "its answer was lost" in found.message
    assert [s for s, _ in slurm.steps].count("requeue_hold") == 1


class NoSqueue(FakeSlurm):
    """Slurm's commands are missing on the head node (a broken PATH after an upgrade)."""

    def list_jobs(self):
        from slurm_recovery.scheduler.base import SchedulerError

        raise SchedulerError("squeue not found", command=["squeue", "--json"])


def test_a_slurm_command_that_fails_ends_the_pass_and_says_why(tmp_path: Path):
    """Scheduler trouble of any kind ends the pass with the reason on /healthz, never an
    exception out of ``tick``; the next pass tries again, and the passes are counted."""
    store = Store.open(tmp_path / "state.db")
    slurm = NoSqueue([job(nodes=("n1", "n2"))], nodes())
    loop = reconciler(store, slurm, [NOW])
    assert loop.tick() is False
    assert loop.last_error == "cannot read Slurm: squeue not found"
    assert loop.last_tick is None and loop.passes == 1
    loop.tick()
    assert loop.passes == 2 and slurm.steps == []


def released_onto_the_bad_node(
    tmp_path: Path, xid_at: float, started_at: float, now: float
) -> tuple[Store, FakeSlurm, list[float]]:
    """A job on n1,n2 with a fatal XID on n2 at ``xid_at``; the controller killed right after
    its ``requeue_hold``; the watchdog then released the job before the exclusion, so Slurm
    shows it running again on n2 since ``started_at``; the clock at ``now``."""
    store = Store.open(tmp_path / "state.db")
    first = job(nodes=("n1", "n2"))
    slurm = FakeSlurm([first], nodes())
    clock = [NOW]
    store.add_evidence([xid(79, node="n2", at=xid_at)], received_at=xid_at + 0.1)

    def kill_after_hold(step: str) -> None:
        if step == "requeue_hold":
            raise Killed

    with pytest.raises(Killed):
        reconciler(store, slurm, clock, after_step=kill_after_hold).tick()
    clock[0] = now
    slurm.jobs[7] = dataclasses.replace(first, restart_count=1, start_time=int(started_at))
    return store, slurm, clock


def test_a_redo_the_same_pass_already_detected_is_linked_not_opened_twice(tmp_path: Path):
    """The watchdog released the held job onto the bad node within seconds of its XID (the
    controller killed after ``requeue_hold``): the restarted controller's detect sees the XID
    in the new attempt (``START_SLACK``) and opens its incident before the old incident's
    reconcile asks for the redo. Seen once in CI on 26.05 (test_operator_wins): the redo then
    hit the open incident (ConflictError, the pass failed) and the link was lost. One incident
    for the new attempt, linked to the old one, and the pass succeeds."""
    # running again on n2 1 s after the XID
    store, slurm, clock = released_onto_the_bad_node(tmp_path, NOW - 0.5, NOW + 1, NOW + 2)
    loop = reconciler(store, slurm, clock)
    loop.tick()
    assert not loop.last_error, loop.last_error
    second, old = store.list_incidents()  # newest first
    assert "restarting it again" in (old.outcome or "")
    links = [r.payload.get("redo_of") for r in store.audit_about(incidents=[second.id])]
    assert old.id in links, links
    assert store.latest_advice(second.id).decision == "requeue_exclude"
    assert "n2" in store.latest_advice(second.id).verdict["exclude"]


def test_a_redo_that_cannot_be_written_leaves_the_old_incident_open(tmp_path: Path, monkeypatch):
    """Closing an incident and opening its redo commit together: a store that fails the redo
    (disk full) leaves the old incident open, so the next pass redoes it instead of leaving the
    job on the node its advice excluded with nothing open about it."""
    # released long after the XID: no new detection
    store, slurm, clock = released_onto_the_bad_node(tmp_path, NOW - 60, NOW + 20, NOW + 30)
    loop = reconciler(store, slurm, clock)
    real_open = store.open_incident

    def full(*args, **kwargs):
        raise StoreFullError("store x: disk full; write undone")

    monkeypatch.setattr(store, "open_incident", full)
    loop.tick()
    assert loop.last_error.startswith("store: ")
    (old,) = store.list_incidents()
    assert old.closed_at is None  # not closed without its redo

    monkeypatch.setattr(store, "open_incident", real_open)
    clock[0] = NOW + 31
    loop.tick()
    assert not loop.last_error, loop.last_error
    again, old = store.list_incidents()
    assert "restarting it again" in (old.outcome or "")
    assert store.latest_advice(again.id).verdict["redo_of"] == old.id
