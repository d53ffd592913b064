"""`srecovery replay`'s core (decide/replay.py) and its inputs (controller/audit_api.py).

The strongest checks record incidents the way the controller does (a Reconciler over a fake
Slurm and a real store), send them through the API's JSON, and replay them: with the policy
they were decided with nothing changes, and with another policy replay says exactly what the
controller would have advised with that policy."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import MappingProxyType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_recovery.controller import audit_api
from slurm_recovery.controller.loop import Reconciler
from slurm_recovery.decide import replay
from slurm_recovery.decide.model import Action, FaultClass, Mode
from slurm_recovery.decide.policy import DEFAULT_CLASSES, BlastRadius, ClassPolicy, Policy
from slurm_recovery.scheduler.base import ExitCode, Job, Node
from slurm_recovery.signals.xid import load_xid_catalogue
from slurm_recovery.store import Evidence, Store
from tests.fakeslurm import FakeSlurm

NOW = 1_700_000_000.0
CATALOGUE = load_xid_catalogue()
#: The default policy, with room to drain one of the 8 nodes (the default cap is 10 %).
WIDE = dataclasses.replace(Policy(), blast_radius=BlastRadius(max_nodes=4, max_percent=100.0))


def job(state: str = "RUNNING", nodes=("n1", "n2"), **kw) -> Job:
    fields = dict(
        job_id=7,
        name="train",
        state=state,
        reason="",
        user="alice",
        partition="gpu",
        nodes=tuple(nodes),
        num_nodes=len(nodes),
        submit_time=int(NOW) - 600,
        restart_count=0,
        start_time=int(NOW) - 500,
        end_time=int(NOW) if state != "RUNNING" else 0,  # not before the controller's epoch
    )
    fields.update(kw)
    return Job(**fields)


def nodes(drained: dict[str, str] | None = None) -> list[Node]:
    drained = drained or {}
    return [
        Node(
            f"n{i}",
            "IDLE",
            flags=frozenset({"DRAIN"}) if f"n{i}" in drained else frozenset(),
            reason=drained.get(f"n{i}", ""),
            partitions=("gpu",),
        )
        for i in range(1, 9)
    ]


def xid(code: int, node: str = "n2", at: float = NOW - 20, gpu: int = 0) -> Evidence:
    return Evidence(
        "sidecar", "xid", at, node=node, gpu=gpu, job_id=7, payload={"xid": code, "message": ""}
    )


def operator(node: str = "n2", at: float = NOW - 20) -> Evidence:
    return Evidence("operator", "operator_report", at, node=node, payload={"reason": "bad fan"})


def record(path: Path, policy: Policy, the_job: Job, evidence: list[Evidence], slurm=None):
    """Decide as the controller does: one pass of a Reconciler over a fresh store."""
    store = Store.open(path)
    if evidence:
        store.add_evidence(evidence, received_at=NOW - 1)
    slurm = slurm or FakeSlurm([the_job], nodes())
    clock = [NOW]
    reconciler = Reconciler(
        store=store,
        scheduler=slurm,
        policy=policy,
        catalogue=CATALOGUE,
        cluster="c1",
        hold_deadline=120.0,
        clock=lambda: clock[0],
    )
    clock[0] = NOW + policy.fatal_evidence_window.settle  # a crash waits that long for evidence
    reconciler.tick()
    return store, reconciler


def cases_of(store: Store, reconciler: Reconciler) -> list[replay.Case]:
    """The store's incidents as the CLI gets them: through the API's JSON, and back."""
    inputs = json.loads(json.dumps(audit_api.incidents_json(store, with_evidence=True)))
    history = json.loads(json.dumps(audit_api.slurm_history_json(store, reconciler.last_view)))
    now = {n["name"]: replay.node_from_json(n) for n in history["nodes"]}
    events, drains = replay.events_from_json(history["changes"], history["tool_actions"])
    return [
        c for item in inputs["incidents"] if (c := replay.case_from_json(item, now, events, drains))
    ]


def advice_fields(store: Store) -> dict:
    (incident,) = store.list_incidents()
    advice = store.latest_advice(incident.id)
    return {
        "action": advice.decision,
        "mode": advice.verdict["mode"],
        "reason": advice.reason,
        "rule": advice.verdict["rule"],
        "exclude": sorted(advice.verdict["exclude"]),
        "drain": sorted(advice.verdict["drain"]),
        "needs_operator": advice.verdict["needs_operator"],
    }


# --- recorded, then replayed ----------------------------------------------------------------


def test_the_same_policy_changes_nothing_and_another_says_what_would(tmp_path):
    store, reconciler = record(tmp_path / "a.db", WIDE, job(), [xid(79)])
    (case,) = cases_of(store, reconciler)
    assert case.approximate == () and case.job == job()
    same = replay.replay_case(case, WIDE, CATALOGUE)
    assert same.changed == () and not same.effect_changed
    assert str(same.new.action) == "requeue_exclude"

    classes = dict(DEFAULT_CLASSES)
    classes[FaultClass.HARDWARE] = ClassPolicy(Action.STOP, drain=True)
    stop = dataclasses.replace(WIDE, classes=MappingProxyType(classes))
    changed = replay.replay_case(case, stop, CATALOGUE)
    assert changed.changed == ("action", "exclude", "reason") and changed.effect_changed
    assert changed.new.action is Action.STOP and changed.new.rule == "classes.hardware.action"
    out = replay.outcome_json(changed)
    assert out["old"]["action"] == "requeue_exclude" and out["new"]["action"] == "stop"
    assert out["new"]["verdict"]["nodes"] == ["n2"]

    act = replay.replay_case(case, dataclasses.replace(WIDE, mode=Mode.ACT), CATALOGUE)
    assert act.changed == ("mode",)


def test_a_drain_after_the_advice_is_wound_back(tmp_path):
    store, reconciler = record(tmp_path / "a.db", WIDE, job(), [operator()])
    # later an operator drains n2, and the controller saw it
    later = dataclasses.replace(
        reconciler.last_view,
        now=NOW + 60,
        nodes={n.name: n for n in nodes({"n2": "replaced the GPU"})},
    )
    audit_api_observe(store, later, reconciler.last_view)
    reconciler.last_view = later
    (case,) = cases_of(store, reconciler)
    assert not case.view.nodes["n2"].drained
    assert replay.replay_case(case, WIDE, CATALOGUE).changed == ()


def audit_api_observe(store, view, previous):
    from slurm_recovery.controller.observe import observe

    observe(store, view, previous)


def test_an_advice_without_a_job_snapshot_is_replayed_approximately(tmp_path):
    crashed = job(state="FAILED", exit_code=ExitCode(1, 0))
    store, _ = record(tmp_path / "a.db", WIDE, crashed, [xid(79)])
    inputs = json.loads(json.dumps(audit_api.incidents_json(store, with_evidence=True)))
    (item,) = inputs["incidents"]
    del item["advice"]["job"]  # as written before snapshots existed
    evidence = replay.evidence_from_json(item["evidence"])
    rebuilt, guessed = replay.job_from_record(item, evidence)
    assert guessed and "no job snapshot" in guessed[0]
    assert (rebuilt.job_id, rebuilt.state, rebuilt.exit_code) == (7, "FAILED", ExitCode(1, 0))
    assert set(rebuilt.nodes) == {"n2"}  # the verdict's nodes: no job_start evidence here
    case = replay.case_from_json(item, None)
    assert case is not None and case.approximate
    assert any("no view of Slurm" in a for a in case.approximate)
    # the decision itself is the same: xid 79 on n2 -> requeue excluding n2
    outcome = replay.replay_case(case, WIDE, CATALOGUE)
    assert str(outcome.new.action) == "requeue_exclude" and outcome.new.exclude == {"n2"}


def test_a_snapshot_missing_a_field_names_it(tmp_path):
    store, _ = record(tmp_path / "a.db", WIDE, job(), [xid(79)])
    inputs = json.loads(json.dumps(audit_api.incidents_json(store, with_evidence=True)))
    (item,) = inputs["incidents"]
    del item["advice"]["job"]["partition"]
    _, guessed = replay.job_from_record(item, [])
    assert guessed == ("job partition (the default mode applies)",)


def test_an_incident_without_advice_is_skipped():
    assert replay.case_from_json({"id": 1, "kind": "crash", "advice": None}, None) is None


# --- node states at the advice's time ----------------------------------------------------------


def test_nodes_at_winds_drains_and_resumes_back():
    now = {n.name: n for n in nodes({"n1": "operator: bad", "n3": "srecovery:4:xid 79"})}
    events = [
        replay.NodeEvent("n1", 200.0, "drained", "operator: bad"),
        replay.NodeEvent("n2", 150.0, "resumed", previous_reason="maintenance"),
        replay.NodeEvent("n2", 50.0, "drained", "maintenance"),
    ]
    then = replay.nodes_at(now, events, 100.0)
    assert not then["n1"].drained  # drained later
    assert then["n2"].drained and then["n2"].reason == "maintenance"  # resumed later
    assert then["n3"].drained  # no change recorded: as now
    tool = replay.drained_by_tool_at(then, [("n3", 90.0), ("n3", 120.0)], 100.0)
    assert tool == {"n3": 90.0}


@given(
    st.dictionaries(st.sampled_from([f"n{i}" for i in range(1, 9)]), st.text(max_size=5)),
    st.floats(0, 1e6),
)
def test_nodes_at_without_later_events_is_now(drained, at):
    now = {n.name: n for n in nodes(drained)}
    events = [replay.NodeEvent(name, at - 1, "drained", "x") for name in drained]
    assert replay.nodes_at(now, events, at) == now


# --- the property: replay reproduces the controller ------------------------------------------

policies = st.builds(
    lambda mode, action, drain, confidence, restarts, excluded, radius: dataclasses.replace(
        Policy(),
        mode=mode,
        max_restarts=restarts,
        max_excluded_nodes=excluded,
        classes=MappingProxyType(
            {**DEFAULT_CLASSES, FaultClass.HARDWARE: ClassPolicy(action, drain, confidence)}
        ),
        blast_radius=BlastRadius(max_nodes=radius, max_percent=100.0),
    ),
    st.sampled_from(list(Mode)),
    st.sampled_from(list(Action)),
    st.booleans(),
    st.sampled_from([0.5, 0.9, 1.0]),
    st.integers(0, 2),
    st.integers(0, 3),
    st.integers(0, 2),
)
scenarios = st.sampled_from(
    [
        ("RUNNING", (79,), False),  # doomed by a fatal hardware XID
        ("RUNNING", (), True),  # doomed by an operator's report
        ("FAILED", (79, 94), False),  # crashed after XIDs
        ("FAILED", (13,), False),  # crashed with an application XID
        ("FAILED", (), False),  # crashed, no evidence
        ("NODE_FAIL", (119,), False),  # Slurm lost a node after a firmware fault
    ]
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(scenarios, st.booleans(), policies, policies)
def test_replay_says_what_the_controller_would_have_advised(
    tmp_path_factory, scenario, pre_drained, recorded_with, replayed_with
):
    state, codes, report = scenario
    the_job = job(state=state, exit_code=ExitCode(1 if state != "RUNNING" else 0, 0))
    evidence = [xid(c, gpu=i) for i, c in enumerate(codes)] + ([operator()] if report else [])
    drained = {"n2": "operator: flaky"} if pre_drained else {}
    folder = tmp_path_factory.mktemp("replay")

    def slurm():
        return FakeSlurm([the_job], nodes(drained))

    store, reconciler = record(folder / "a.db", recorded_with, the_job, evidence, slurm())
    (case,) = cases_of(store, reconciler)
    assert replay.replay_case(case, recorded_with, CATALOGUE).changed == ()

    other, _ = record(folder / "b.db", replayed_with, the_job, evidence, slurm())
    outcome = replay.replay_case(case, replayed_with, CATALOGUE)
    want = advice_fields(other)
    got = replay.outcome_json(outcome)["new"]
    assert {k: got[k] for k in want} == want


@pytest.mark.parametrize("kind", ["crash", "doomed"])
def test_outcome_json_shape(tmp_path, kind):
    the_job = job(state="FAILED") if kind == "crash" else job()
    store, reconciler = record(tmp_path / "a.db", Policy(), the_job, [xid(79)])
    (case,) = cases_of(store, reconciler)
    out = replay.outcome_json(replay.replay_case(case, Policy(), CATALOGUE))
    assert set(out) == {
        "incident",
        "job_id",
        "kind",
        "changed",
        "effect_changed",
        "old",
        "new",
        "approximate",
    }
    assert out["kind"] == kind and out["changed"] == []
