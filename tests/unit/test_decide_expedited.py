"""with_failed_attempts(): Slurm 25.11+'s own hold of a failed ``--requeue=expedite`` job is
judged as the attempt that failed; every other hold is left as Slurm shows it."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.decide.detect import detect, held_by_expedited_requeue, with_failed_attempts
from slurm_recovery.decide.model import Evidence, IncidentKind
from slurm_recovery.scheduler.base import ExitCode
from tests.unit.test_decide_detect import CATALOGUE, POLICY, job, view

#: as squeue --json shows it on 26.05.5 after `exit 1` (recorded on the real cluster)
HELD = job(
    state="REQUEUE_HOLD",
    nodes=(),
    restart_count=1,
    held=True,
    start_time=0,
    exit_code=ExitCode(1, 0),
    expedited_requeue=True,
    reason="JobHeldUser",
)


def hooks(restart_count: int = 0, nodes=("n1", "n2")) -> list[Evidence]:
    def ev(i: int, kind: str, at: float, node: str | None) -> Evidence:
        payload = {"nodes": list(nodes), "restart_count": restart_count, "exit_code": 1}
        return Evidence(i, "hook", kind, at, node=node, job_id=42, payload=payload)

    return [ev(1, "job_start", 1_000, "n1"), ev(2, "job_end", 1_500, None)]


def test_slurms_hold_is_shown_as_the_failed_attempt_and_detected_as_a_crash():
    shown = with_failed_attempts(view(HELD), hooks()).jobs[42]
    assert (shown.state, shown.restart_count, shown.nodes) == ("FAILED", 0, ("n1", "n2"))
    assert (shown.start_time, shown.end_time, shown.held) == (1_000, 1_500, False)
    (incident,) = detect(
        with_failed_attempts(view(HELD), hooks()), hooks(), set(), CATALOGUE, POLICY
    )
    assert (incident.kind, incident.restart_count) == (IncidentKind.CRASH, 0)


def test_an_attempt_with_an_incident_already_is_not_raised_again():
    assert (
        detect(with_failed_attempts(view(HELD), hooks()), hooks(), {(42, 0)}, CATALOGUE, POLICY)
        == []
    )


def test_other_holds_are_left_alone():
    cases = {
        "the tool's own hold": dataclasses.replace(HELD, admin_comment="srecovery:held:7:1700"),
        "an operator's requeuehold (killed by a signal)": dataclasses.replace(
            HELD, exit_code=ExitCode(0, 15)
        ),
        "not an expedite job": dataclasses.replace(HELD, expedited_requeue=False),
        "a clean exit": dataclasses.replace(HELD, exit_code=ExitCode(0, 0)),
        "released already": dataclasses.replace(HELD, state="PENDING", held=False),
    }
    for why, held in cases.items():
        assert not held_by_expedited_requeue(held), why
        assert with_failed_attempts(view(held), hooks()).jobs[42] is held, why


def test_without_the_attempts_job_end_nothing_is_guessed():
    assert with_failed_attempts(view(HELD), hooks(restart_count=3)).jobs[42] is HELD
    assert with_failed_attempts(view(HELD), []).jobs[42] is HELD


@given(
    state=st.sampled_from(["RUNNING", "PENDING", "REQUEUE_HOLD", "FAILED", "COMPLETING"]),
    restarts=st.integers(0, 5),
    rc=st.integers(0, 255),
    sig=st.integers(0, 15),
    expedite=st.booleans(),
    held=st.booleans(),
)
def test_only_slurms_expedited_hold_is_ever_rewritten(state, restarts, rc, sig, expedite, held):
    shown = job(
        state=state,
        restart_count=restarts,
        exit_code=ExitCode(rc, sig),
        expedited_requeue=expedite,
        held=held,
    )
    out = with_failed_attempts(view(shown), hooks(max(restarts - 1, 0))).jobs[42]
    if out is not shown:
        assert (state, expedite, held, rc != 0, sig) == ("REQUEUE_HOLD", True, True, True, 0)
        assert out.restart_count == restarts - 1 and out.state == "FAILED"


# --- Slurm's immediate requeue after a failed Epilog (not held) ------------------------------

#: as squeue --json shows it on 26.05.5 once Slurm requeued it after n2's Epilog failed
REQUEUED = job(
    state="RUNNING",
    nodes=("n3", "n4"),
    restart_count=1,
    start_time=1_502,
    exit_code=ExitCode(0, 0),
    expedited_requeue=True,
)


def xid_on(node: str, at: float, code: int = 79) -> Evidence:
    payload = {"xid": code, "message": "GPU has fallen off the bus."}
    return Evidence(9, "sidecar", "xid", at, node=node, gpu=0, payload=payload)


def killed(evidence: list[Evidence]) -> list[Evidence]:
    """The attempt ended by srun killing the ranks (exit 143), as on the real cluster."""
    return [
        dataclasses.replace(ev, payload={**ev.payload, "exit_code": 143})
        if ev.kind == "job_end"
        else ev
        for ev in evidence
    ]


def test_slurms_requeue_after_a_proven_fault_is_shown_as_the_failed_attempt():
    evidence = [*killed(hooks()), xid_on("n2", 1_499.8)]
    shown = with_failed_attempts(view(REQUEUED), evidence, CATALOGUE).jobs[42]
    assert (shown.state, shown.restart_count, shown.nodes) == ("FAILED", 0, ("n1", "n2"))
    assert shown.exit_code == ExitCode(143, 0)
    (incident,) = detect(
        with_failed_attempts(view(REQUEUED), evidence, CATALOGUE),
        evidence,
        set(),
        CATALOGUE,
        POLICY,
    )
    assert (incident.kind, incident.restart_count) == (IncidentKind.CRASH, 0)


def test_once_the_failed_attempt_has_its_incident_the_new_attempt_is_watched():
    evidence = [*killed(hooks()), xid_on("n2", 1_499.8)]
    out = with_failed_attempts(view(REQUEUED), evidence, CATALOGUE, lambda job: True)
    assert out.jobs[42] is REQUEUED


def test_a_requeue_no_proven_fault_explains_is_left_alone():
    """An operator's `scontrol requeue`, or a crash with no fault found: not Slurm's answer
    to a failed Epilog, and never taken for a crash of the attempt."""
    cases = {
        "no node evidence": killed(hooks()),
        "the fault on a node of another job": [*killed(hooks()), xid_on("n7", 1_499.8)],
        "a fault from before the attempt": [*killed(hooks()), xid_on("n2", 900)],
        "an application XID": [*killed(hooks()), xid_on("n2", 1_499.8, code=13)],
        "a clean end": [*hooks(), xid_on("n2", 1_499.8)],
        "no job_end": [xid_on("n2", 1_499.8)],
    }
    cases["a clean end"] = [
        dataclasses.replace(ev, payload={**ev.payload, "exit_code": 0})
        for ev in cases["a clean end"]
    ]
    for why, evidence in cases.items():
        assert with_failed_attempts(view(REQUEUED), evidence, CATALOGUE).jobs[42] is REQUEUED, why
    held = dataclasses.replace(REQUEUED, state="PENDING", held=True, nodes=())
    evidence = [*killed(hooks()), xid_on("n2", 1_499.8)]
    assert with_failed_attempts(view(held), evidence, CATALOGUE).jobs[42] is held  # someone's hold
    plain = dataclasses.replace(REQUEUED, expedited_requeue=False)
    assert with_failed_attempts(view(plain), evidence, CATALOGUE).jobs[42] is plain
