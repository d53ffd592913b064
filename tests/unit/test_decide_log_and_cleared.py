"""Issue 16, items 2, 5 and 13 in the pure core: a log line alone never stops a running job (it
raises advice, or explains a crash or a hang); node evidence the node itself cleared implicates
nothing (one rule with ``srecovery nodes``); replay sees the evidence as the loop saw it."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.controller.views import open_findings
from slurm_recovery.decide.advise import advise
from slurm_recovery.decide.attribute import attribute
from slurm_recovery.decide.cleared import cleared_ids
from slurm_recovery.decide.detect import detect
from slurm_recovery.decide.hang import hang_incidents
from slurm_recovery.decide.model import (
    Action,
    ClusterView,
    Evidence,
    FaultClass,
    Incident,
    IncidentKind,
)
from slurm_recovery.decide.policy import EvidenceWindow, Policy
from slurm_recovery.decide.replay import case_from_json, replay_case
from slurm_recovery.scheduler.base import ExitCode, Job, Node
from slurm_recovery.signals.xid import load_xid_catalogue

CATALOGUE = load_xid_catalogue()
POLICY = Policy()
START = 1_000


def job(state: str = "RUNNING", nodes=("n1",), **kw) -> Job:
    fields = dict(
        job_id=42,
        name="train",
        state=state,
        reason="",
        user="alice",
        partition="gpu",
        nodes=tuple(nodes),
        num_nodes=len(nodes),
        submit_time=900,
        restart_count=0,
        start_time=START,
    )
    fields.update(kw)
    return Job(**fields)


def view(*jobs: Job, now: float) -> ClusterView:
    nodes = {f"n{i}": Node(f"n{i}", "ALLOCATED", partitions=("gpu",)) for i in range(1, 5)}
    return ClusterView(now=now, jobs={j.job_id: j for j in jobs}, nodes=nodes)


def illegal_access_line(ev_id: int, at: float) -> Evidence:
    """An application line: a device-side assert (the issue's line was ``expected error seen:
    an illegal memory access was encountered``; since i28k a GPU kernel's fault is restarted
    once, a bad GPU prints it too: docs/signatures.md, "When the answer is stop")."""
    payload = {
        "signature": "cuda.device_assert",
        "fault_class": "application",
        "blame_node": False,
        "text": "RuntimeError: CUDA error: device-side assert triggered",
    }
    return Evidence(ev_id, "sidecar", "log_signature", at, node="n1", job_id=42, payload=payload)


def xid(ev_id: int, at: float, node: str = "n3", gpu: int | None = 2, code: int = 48) -> Evidence:
    return Evidence(ev_id, "sidecar", "xid", at, node=node, gpu=gpu, payload={"xid": code})


def reset(ev_id: int, at: float, node: str = "n3", gpu: int | None = None) -> Evidence:
    payload = {"check": "gpu_reset", "severity": "info", "cleared": True, "detail": "reset"}
    return Evidence(ev_id, "sidecar", "gpu_finding", at, node=node, gpu=gpu, payload=payload)


# ------------------------------------------------------------- item 2: a log line alone


def test_a_running_job_with_an_application_log_line_gets_advice_only():
    line = illegal_access_line(7, 1_500)
    running = job()
    (found,) = detect(view(running, now=1_510), [line], set(), CATALOGUE, POLICY)
    assert found.kind is IncidentKind.APP_FAULT
    verdict = attribute(found, running, [line], CATALOGUE, POLICY)
    assert verdict.fault_class is FaultClass.APPLICATION
    advice = advise(found, verdict, running, POLICY, view(running, now=1_510), 0)
    assert advice.action is Action.NONE and advice.rule == "app_fault.running"
    assert not advice.drain and not advice.exclude and not advice.needs_operator
    assert "still running" in advice.reason and "cuda.device_assert" in advice.reason


def test_app_fault_advice_never_drains_even_with_node_evidence_in_the_window():
    running = job(nodes=("n1", "n2"))
    found = Incident(42, 0, 900, IncidentKind.APP_FAULT, 1_500, (7,))
    from slurm_recovery.decide.model import Verdict

    hardware = Verdict(FaultClass.HARDWARE, frozenset({"n2"}), confidence=0.95, cause="x")
    advice = advise(found, hardware, running, POLICY, view(running, now=1_510), 0)
    assert advice.action is Action.NONE and advice.drain == frozenset()


def test_the_advice_waits_for_settle_so_a_job_that_exits_at_once_is_a_crash():
    line = illegal_access_line(7, 1_500)
    assert detect(view(job(), now=1_501), [line], set(), CATALOGUE, POLICY) == []
    exited = job(state="FAILED", end_time=1_501, exit_code=ExitCode(1, 0))
    (crash,) = detect(view(exited, now=1_502), [line], set(), CATALOGUE, POLICY)
    assert crash.kind is IncidentKind.CRASH
    verdict = attribute(crash, exited, [line], CATALOGUE, POLICY)
    assert verdict.fault_class is FaultClass.APPLICATION and not verdict.nodes
    advice = advise(crash, verdict, exited, POLICY, view(exited, now=1_502), 0)
    assert advice.action is Action.STOP


def test_an_advised_attempt_is_not_advised_again_but_its_crash_is_detected():
    line = illegal_access_line(7, 1_500)
    assert detect(view(job(), now=1_600), [line], set(), CATALOGUE, POLICY, {(42, 0)}) == []
    exited = job(state="FAILED", end_time=1_590, exit_code=ExitCode(1, 0))
    (crash,) = detect(view(exited, now=1_600), [line], set(), CATALOGUE, POLICY, {(42, 0)})
    assert crash.kind is IncidentKind.CRASH


def test_a_hang_past_its_deadline_is_explained_by_the_log_line_long_before_it():
    """The line came 25 minutes before progress stopped (outside the evidence window around
    the failure): the hang's summary names it and attribution calls it the app's."""
    line = illegal_access_line(7, START + 60)
    steps = [
        Evidence(100 + i, "sidecar", "progress", START + 10 * i, job_id=42, payload={"step": i})
        for i in range(160)
    ]
    running = job()
    now = START + 1_590 + POLICY.hang.ceiling + 10
    (hang,) = hang_incidents(view(running, now=now), [line, *steps], set(), POLICY)
    assert hang.kind is IncidentKind.HANG and "log: " in hang.summary and 7 in hang.trigger_ids
    verdict = attribute(hang, running, [line, *steps], CATALOGUE, POLICY)
    assert verdict.fault_class is FaultClass.APPLICATION
    advice = advise(hang, verdict, running, POLICY, view(running, now=now), 0)
    assert advice.action is Action.STOP


def test_a_log_line_never_makes_a_progressing_job_hung():
    line = illegal_access_line(7, START + 5)
    steps = [
        Evidence(100 + i, "sidecar", "progress", START + 10 * i, job_id=42, payload={"step": i})
        for i in range(30)
    ]
    assert hang_incidents(view(job(), now=START + 295), [line, *steps], set(), POLICY) == []


# ------------------------------------------------------- item 5: cleared evidence


def test_an_xid_the_node_reset_does_not_convict_a_later_crash():
    """sim inject --xid 48 then --clear on n3; minutes later an unrelated crash on n3."""
    evidence = [xid(1, 1_400), reset(2, 1_410)]
    crashed = job(state="FAILED", nodes=("n3",), end_time=1_600, exit_code=ExitCode(1, 0))
    found = Incident(42, 0, 900, IncidentKind.CRASH, 1_600)
    verdict = attribute(found, crashed, evidence, CATALOGUE, POLICY)
    assert verdict.nodes == frozenset() and verdict.fault_class is FaultClass.UNKNOWN
    before = attribute(found, crashed, evidence[:1], CATALOGUE, POLICY)
    assert before.nodes == {"n3"}  # without the reset it does: the reset is what clears it


def test_a_reset_after_the_failure_does_not_unsay_its_cause():
    evidence = [xid(1, 1_590), reset(2, 1_700)]
    crashed = job(state="FAILED", nodes=("n3",), end_time=1_600, exit_code=ExitCode(1, 0))
    found = Incident(42, 0, 900, IncidentKind.CRASH, 1_600)
    assert attribute(found, crashed, evidence, CATALOGUE, POLICY).nodes == {"n3"}


def test_a_cleared_xid_dooms_no_running_job():
    running = job(nodes=("n3",))
    evidence = [xid(1, 1_400), reset(2, 1_410, gpu=2)]
    assert detect(view(running, now=1_500), evidence, set(), CATALOGUE, POLICY) == []
    other_gpu = [xid(1, 1_400), reset(2, 1_410, gpu=5)]
    (doomed,) = detect(view(running, now=1_500), other_gpu, set(), CATALOGUE, POLICY)
    assert doomed.kind is IncidentKind.DOOMED


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="microseconds")


def _json(ev: Evidence) -> dict:
    return {
        "id": ev.id,
        "source": ev.source,
        "kind": ev.kind,
        "node": ev.node,
        "gpu": ev.gpu,
        "job_id": ev.job_id,
        "observed_at": _iso(ev.observed_at),
        "payload": dict(ev.payload),
    }


_CHECKS = st.sampled_from(["ecc_dbe", "gpu_lost", "throttle_hw_slowdown"])


@st.composite
def node_findings(draw) -> list[Evidence]:
    """GPU findings (fatal, warning, cleared) and resets of two GPUs or the whole node, of n3."""
    out = []
    for i in range(draw(st.integers(0, 10))):
        at = 1_000 + draw(st.integers(0, 50))
        gpu = draw(st.sampled_from([0, 1, None]))
        what = draw(st.sampled_from(["fatal", "warning", "cleared", "reset"]))
        if what == "reset":
            out.append(reset(i + 1, at, gpu=gpu))
            continue
        payload = {"check": draw(_CHECKS), "severity": "info" if what == "cleared" else what}
        if what == "cleared":
            payload["cleared"] = True
        out.append(
            Evidence(i + 1, "sidecar", "gpu_finding", at, node="n3", gpu=gpu, payload=payload)
        )
    return out


@given(node_findings())
def test_srecovery_nodes_and_attribution_agree_on_what_is_open(findings):
    """``srecovery nodes`` lists a fatal finding as open exactly when attribution of a crash
    on the node right after them counts it (one rule: decide.cleared)."""
    shown = {f["evidence_id"] for f in open_findings([_json(ev) for ev in findings])}
    ended = cleared_ids(findings)
    counted = {
        ev.id
        for ev in findings
        if ev.id not in ended and ev.payload.get("severity") in ("fatal", "warning")
    }
    assert shown == counted
    crashed = job(state="FAILED", nodes=("n3",), end_time=1_100, exit_code=ExitCode(1, 0))
    verdict = attribute(
        Incident(42, 0, 900, IncidentKind.CRASH, 1_100), crashed, findings, CATALOGUE, POLICY
    )
    fatal_open = {ev.id for ev in findings if ev.id in shown and ev.payload["severity"] == "fatal"}
    assert (verdict.nodes == {"n3"} and verdict.fault_class is FaultClass.HARDWARE) == bool(
        fatal_open
    ) or (not fatal_open and verdict.nodes <= {"n3"})


# ------------------------------------------------------------- item 13: replay


def _item(evidence: list[Evidence], advice: dict, restarts_before: int = 3) -> dict:
    return {
        "id": 5,
        "kind": "crash",
        "summary": "job 42 ended FAILED (exit 1:0) on n3",
        "failed_at": _iso(1_600),
        "detected_at": _iso(1_600.5),
        "opened_at": _iso(1_600.5),
        "job_id": 42,
        "restart_count": 0,
        "submit_time": 900,
        "restarts_before": restarts_before,
        "advice": advice,
        "evidence": [_json(ev) for ev in evidence],
    }


def _live(evidence: list[Evidence], policy: Policy, restarts: int) -> tuple[dict, Job]:
    """What the loop records for a crash on n3 (``_open``): the advice with its job snapshot
    and the restarts it counted."""
    crashed = job(state="FAILED", nodes=("n3",), end_time=1_600, exit_code=ExitCode(1, 0))
    found = Incident(42, 0, 900, IncidentKind.CRASH, 1_600)
    live_view = ClusterView(
        now=1_600.5,
        jobs={42: crashed},
        nodes={"n3": Node("n3", "IDLE", partitions=("gpu",))},
    )
    verdict = attribute(found, crashed, evidence, CATALOGUE, policy, live_view.nodes)
    advice = advise(found, verdict, crashed, policy, live_view, restarts)
    snapshot = {
        "job_id": 42,
        "name": "train",
        "state": "FAILED",
        "user": "alice",
        "partition": "gpu",
        "nodes": ["n3"],
        "num_nodes": 1,
        "submit_time": 900,
        "start_time": START,
        "end_time": 1_600,
        "restart_count": 0,
        "exit_code": [1, 0],
        "excluded_nodes": [],
        "required_nodes": [],
        "requeueable": True,
    }
    return {
        "created_at": _iso(1_600.5),
        "action": str(advice.action),
        "mode": str(advice.mode),
        "reason": advice.reason,
        "rule": advice.rule,
        "exclude": sorted(advice.exclude),
        "drain": sorted(advice.drain),
        "needs_operator": advice.needs_operator,
        "verdict": {"nodes": sorted(verdict.nodes)},
        "job": snapshot,
        "restarts": restarts,
        "evidence_ids": [],
    }, crashed


def test_replay_with_the_live_policy_of_a_reset_before_start_and_max_restarts_0_is_a_no_op():
    policy = Policy(max_restarts=0, fatal_evidence_window=EvidenceWindow(window_before=3600))
    evidence = [xid(1, 900), reset(2, 905)]  # ended before the job started (1000)
    advice, _ = _live(evidence, policy, restarts=0)
    assert "cause: no evidence of the cause" in advice["reason"]
    case = case_from_json(_item(evidence, advice), {"n3": Node("n3", "IDLE", partitions=("gpu",))})
    outcome = replay_case(case, policy, CATALOGUE)
    assert outcome.changed == (), (outcome.new.reason, advice["reason"])
    assert "(0 of 0)" in outcome.new.reason


def test_replay_sees_the_resume_the_loop_saw():
    """An XID on n3, an operator drain and resume after the repair (the controller's
    ``slurm_change``), then a crash on n3: the loop did not blame n3, nor does replay."""
    resumed = Evidence(
        3, "scheduler", "slurm_change", 1_450, node="n3", payload={"change": "resumed"}
    )
    evidence = [xid(1, 1_400, code=79)]
    advice, _ = _live([*evidence, resumed], POLICY, restarts=0)
    assert advice["drain"] == []
    nodes = {"n3": Node("n3", "IDLE", partitions=("gpu",))}
    without = replay_case(case_from_json(_item(evidence, advice), nodes), POLICY, CATALOGUE)
    assert "exclude" in without.changed  # what replay did before: it never saw the resume
    case = case_from_json(_item(evidence, advice), nodes, slurm_changes=[resumed])
    assert replay_case(case, POLICY, CATALOGUE).changed == ()


def test_replay_counts_the_restarts_the_loop_counted():
    policy = Policy(max_restarts=2)
    advice, _ = _live([], policy, restarts=2)  # one restart still open when the loop counted
    nodes = {"n3": Node("n3", "IDLE", partitions=("gpu",))}
    case = case_from_json(_item([], advice, restarts_before=1), nodes)
    assert case.restarts_before == 2
    assert replay_case(case, policy, CATALOGUE).changed == ()


def test_replay_applies_the_jobs_own_max_restarts():
    """``--recovery-max-restarts=0`` in the job_start: the loop stopped the job; so does replay."""
    start = Evidence(
        9,
        "hook",
        "job_start",
        START,
        node="n3",
        job_id=42,
        payload={"recovery": {"max_restarts": 0}},
    )
    own = Policy(max_restarts=0)
    advice, _ = _live([start], own, restarts=0)
    assert advice["rule"] == "max_restarts"
    case = case_from_json(_item([start], advice), {"n3": Node("n3", "IDLE", partitions=("gpu",))})
    assert replay_case(case, POLICY, CATALOGUE).changed == ()
