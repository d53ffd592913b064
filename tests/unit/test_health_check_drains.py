"""Drains by the site's health check (LBNL NHC, reason prefix ``controller.health_check_drain_
prefixes``): the setting, recognising the reasons, the evidence the controller records, how it
counts in attribution and exclusions, and the scorecard keeping it apart from operators'."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery import config as cfg
from slurm_recovery import scorecard
from slurm_recovery.config import ConfigError, config_from_toml
from slurm_recovery.controller import observe
from slurm_recovery.controller.loop import health_check_drained
from slurm_recovery.controller.views import describe_evidence
from slurm_recovery.decide.advise import advise
from slurm_recovery.decide.attribute import HEALTH_CHECK, attribute
from slurm_recovery.decide.detect import detect
from slurm_recovery.decide.model import (
    Action,
    ClusterView,
    Evidence,
    FaultClass,
)
from slurm_recovery.decide.policy import Policy
from slurm_recovery.scheduler.base import Job, Node
from slurm_recovery.scorecard import Advised, Drain, is_health_check_drain, score
from slurm_recovery.signals.xid import load_xid_catalogue
from slurm_recovery.store import Store
from tests.unit.test_decide_attribute import FAILED_AT, incident, job

CATALOGUE = load_xid_catalogue()
POLICY = Policy()
NHC_REASON = "NHC: check_fs_mount:  /scratch not mounted"


# ------------------------------------------------------------------------------ the setting


def prefixes_from(value: str) -> tuple[str, ...]:
    text = f"[controller]\nhealth_check_drain_prefixes = {value}\n"
    return config_from_toml(text, "config.toml").controller.health_check_drain_prefixes


def test_the_default_is_nhcs_prefix():
    assert cfg.DEFAULTS["controller.health_check_drain_prefixes"] == ("NHC:",)
    assert prefixes_from('["NHC:", "gpu-burn failed:"]') == ("NHC:", "gpu-burn failed:")
    assert prefixes_from("[]") == ()


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('"NHC:"', "must be a list of strings"),
        ("[1]", "is not a string"),
        ('[""]', "an empty prefix would make every drain"),
        ('["  "]', "an empty prefix would make every drain"),
        ('["srecovery:"]', "slurm-recovery's own drain reasons"),
        ('["srec"]', "slurm-recovery's own drain reasons"),
        ('["NHC:\\n"]', "control character"),
        (f'["{"x" * 65}"]', "longer than 64"),
        ("[" + ", ".join(f'"p{i}:"' for i in range(33)) + "]", "at most 32"),
    ],
)
def test_bad_prefixes_are_refused_naming_the_key(value, says):
    with pytest.raises(ConfigError) as caught:
        prefixes_from(value)
    assert "controller.health_check_drain_prefixes" in str(caught.value)
    assert says in str(caught.value)


# ------------------------------------------------------------------------ reading reasons

PREFIX = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12
).filter(lambda p: not p.startswith("srecovery") and not "srecovery".startswith(p))
REST = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)


@given(st.lists(PREFIX, min_size=1, max_size=4), st.data(), REST, st.sampled_from(["", " ", "  "]))
def test_a_reason_starting_with_a_prefix_is_the_health_checks(prefixes, data, rest, blanks):
    chosen = data.draw(st.sampled_from(prefixes))
    assert is_health_check_drain(blanks + chosen + rest, prefixes)


@given(st.lists(PREFIX, max_size=4), REST)
def test_a_reason_without_a_prefix_is_not(prefixes, reason):
    expected = any(reason.lstrip().startswith(p) for p in prefixes)
    assert is_health_check_drain(reason, prefixes) is expected


@given(REST)
def test_the_tools_and_operators_reasons_are_never_the_health_checks(rest):
    for reason in (f"srecovery:7:{rest}", f"srecovery-op:alice: {rest}"):
        assert not is_health_check_drain(reason, ["s", "srecovery", ""])


@pytest.mark.parametrize("reason", [None, 17, b"NHC: x", ["NHC: x"]])
def test_a_reason_that_is_not_text_is_nobodys(reason):
    assert not is_health_check_drain(reason, ["NHC:"])


# ---------------------------------------------------------------- what the controller records


def node(name: str, reason: str = "", drained: bool = False) -> Node:
    return Node(name, "MIXED", frozenset({"DRAIN"}) if drained else frozenset(), reason)


def view(now: float, nodes, prefixes=("NHC:",)) -> ClusterView:
    return ClusterView(
        now=now,
        jobs={},
        nodes={n.name: n for n in nodes},
        health_check_drained=health_check_drained(nodes, prefixes),
    )


def test_the_loop_knows_the_nodes_the_health_check_drained():
    nodes = [
        node("n1", NHC_REASON, True),
        node("n2", "NHC: but resumed"),  # not drained: not held out
        node("n3", "bad fan", True),
        node("n4", "srecovery:3:xid 79", True),
    ]
    assert health_check_drained(nodes, ("NHC:",)) == {"n1": NHC_REASON}
    assert health_check_drained(nodes, ()) == {}


def test_an_nhc_drain_is_recorded_as_evidence_against_its_node(tmp_path):
    before = view(10.0, [node("n1"), node("n2"), node("n3")])
    after = view(11.0, [node("n1", NHC_REASON, True), node("n2", "bad fan", True), node("n3")])
    changes = observe.changes(after, before)
    assert changes[0] == {
        "change": "drained",
        "node": "n1",
        "reason": NHC_REASON,
        "state": "MIXED",
        "health_check": True,
    }
    assert "health_check" not in changes[1]  # an operator's
    with Store.open(tmp_path / "state.db") as store:
        observe.observe(store, after, before)
        (row,) = store.evidence_of_kind(observe.HEALTH_CHECK_KIND)
        later = view(12.0, [node("n1"), node("n2", "bad fan", True), node("n3")])
        observe.observe(store, later, after)
        resumed = [
            r.evidence.payload
            for r in store.evidence_of_kind(observe.KIND)
            if r.evidence.payload["change"] == "resumed"
        ]
    e = row.evidence
    assert (e.source, e.kind, e.node, e.observed_at) == (
        "scheduler",
        "health_check_drain",
        "n1",
        11.0,
    )
    assert e.payload == {"reason": NHC_REASON, "state": "MIXED"}
    assert resumed[0]["was_health_check"] is True and resumed[0]["was_tool_drain"] is False


def test_a_tool_drain_taken_over_by_nhc_is_the_health_checks():
    before = view(10.0, [node("n1", "srecovery:3:xid 79", True)])
    after = view(11.0, [node("n1", NHC_REASON, True)])
    (change,) = observe.changes(after, before)
    assert change["change"] == "drain_reason_changed" and change["health_check"] is True


def test_described_in_words():
    line = describe_evidence(
        {"kind": "health_check_drain", "node": "n1", "payload": {"reason": NHC_REASON}}
    )
    assert line == "the site's health check drained n1: " + " ".join(NHC_REASON.split())


# ------------------------------------------------------------------------ the decision core


def nhc_drain(ev_id: int, node: str = "n2", at: float = FAILED_AT - 60) -> Evidence:
    payload = {"reason": NHC_REASON, "state": "MIXED"}
    return Evidence(ev_id, "scheduler", "health_check_drain", at, node=node, payload=payload)


def verdict_of(*evidence: Evidence, the_job: Job | None = None):
    return attribute(incident(), the_job or job(), list(evidence), CATALOGUE, POLICY)


def test_a_crash_on_a_node_nhc_drained_implicates_that_node():
    verdict = verdict_of(nhc_drain(1))
    assert verdict.fault_class is FaultClass.SYSTEM
    assert verdict.nodes == {"n2"} and verdict.confidence == HEALTH_CHECK
    assert verdict.evidence_ids == (1,)
    assert "the site's health check drained n2 (NHC: check_fs_mount: /scratch" in verdict.cause


def test_the_drain_of_a_node_outside_the_job_or_the_window_implicates_nothing():
    assert not verdict_of(nhc_drain(1, node="n9")).nodes
    assert not verdict_of(nhc_drain(1, at=FAILED_AT - 3600)).nodes


def test_a_drain_before_the_node_was_resumed_implicates_nothing():
    resumed = Evidence(
        2, "scheduler", "slurm_change", FAILED_AT - 30, node="n2", payload={"change": "resumed"}
    )
    assert not verdict_of(nhc_drain(1), resumed).nodes


def test_the_jobs_own_application_error_wins_over_a_health_check():
    line = Evidence(
        3,
        "sidecar",
        "log_signature",
        FAILED_AT - 5,
        node="n1",
        job_id=42,
        payload={
            "signature": "python.exception",
            "fault_class": "application",
            "blame_node": False,
            "text": "ValueError: boom",
        },
    )
    verdict = verdict_of(nhc_drain(1), line)
    assert verdict.fault_class is FaultClass.APPLICATION and not verdict.nodes


def test_a_fatal_xid_on_another_node_wins_over_a_health_check():
    xid = Evidence(4, "sidecar", "xid", FAILED_AT - 20, node="n1", gpu=0, payload={"xid": 79})
    verdict = verdict_of(nhc_drain(1), xid)
    assert verdict.fault_class is FaultClass.HARDWARE and verdict.nodes == {"n1"}


def prolog_start(ev_id: int, nhc: object, restart: int = 0) -> Evidence:
    payload = {"context": "prolog", "restart_count": restart, "health_gate": {"nhc": nhc}}
    return Evidence(ev_id, "hook", "job_start", 5_000.0, node="n3", job_id=42, payload=payload)


def test_nhc_failing_in_the_prolog_of_this_attempt_implicates_the_node():
    the_job = job(start_time=5_000, end_time=5_100)
    failed = {
        "verdict": "fail",
        "exit_code": 1,
        "output": ["nhc 1.4.3", "ERROR: nhc: check_hw_mem"],
    }
    early = incident(failed_at=5_100.0)
    verdict = attribute(early, the_job, [prolog_start(1, failed)], CATALOGUE, POLICY)
    assert verdict.nodes == {"n3"} and verdict.fault_class is FaultClass.SYSTEM
    assert "failed on n3 at the job's start (exit 1: ERROR: nhc: check_hw_mem)" in verdict.cause
    for harmless in (
        {"verdict": "pass", "exit_code": 0},
        {"verdict": "timeout"},
        {"verdict": "fail", "exit_code": "1", "output": "not a list"},  # still a failure
        "not a record",
        None,
    ):
        got = attribute(early, the_job, [prolog_start(1, harmless)], CATALOGUE, POLICY)
        assert bool(got.nodes) is (isinstance(harmless, dict) and harmless["verdict"] == "fail")
    # another attempt's prolog is not this attempt's evidence
    other = attribute(early, the_job, [prolog_start(1, failed, restart=1)], CATALOGUE, POLICY)
    assert not other.nodes


def test_a_drain_alone_never_dooms_a_running_job():
    running = job("RUNNING", end_time=0)
    cluster = ClusterView(now=FAILED_AT, jobs={42: running}, nodes={})
    assert detect(cluster, [nhc_drain(1, at=FAILED_AT - 5)], set(), CATALOGUE, POLICY) == []


# ------------------------------------------------------------------------------- exclusions


def cluster(*nhc_nodes: str, size: int = 6) -> ClusterView:
    nodes = {
        f"n{i}": Node(
            f"n{i}",
            "IDLE",
            frozenset({"DRAIN"}) if f"n{i}" in nhc_nodes else frozenset(),
            NHC_REASON if f"n{i}" in nhc_nodes else "",
            partitions=("gpu",),
        )
        for i in range(1, size + 1)
    }
    return ClusterView(
        now=FAILED_AT + 5,
        jobs={},
        nodes=nodes,
        health_check_drained=health_check_drained(nodes.values(), ("NHC:",)),
    )


def test_the_nhc_drained_node_is_implicated_excluded_and_not_drained_by_the_tool():
    verdict = verdict_of(nhc_drain(1))
    advice = advise(incident(), verdict, job(), POLICY, cluster("n2"), 0)
    assert advice.action is Action.REQUEUE_EXCLUDE and advice.exclude == {"n2"}
    assert advice.drain == frozenset()  # someone else's drain: their reason stays


def test_a_health_check_drained_node_is_kept_out_of_a_restart_made_for_another_cause():
    xid = Evidence(4, "sidecar", "xid", FAILED_AT - 20, node="n1", gpu=0, payload={"xid": 79})
    verdict = verdict_of(xid)  # no health-check evidence in the window: only Slurm shows it
    advice = advise(incident(), verdict, job(), POLICY, cluster("n3"), 0)
    assert advice.exclude == {"n1", "n3"}
    assert "(n3: drained by the site's health check)" in advice.reason
    # no node implicated: still not restarted onto it
    unknown = verdict_of()
    advice = advise(incident(), unknown, job(), POLICY, cluster("n3"), 0)
    assert advice.action is Action.REQUEUE_EXCLUDE and advice.exclude == {"n3"}
    # with nothing drained, nothing changes
    assert advise(incident(), unknown, job(), POLICY, cluster(), 0).action is Action.REQUEUE


def test_held_out_nodes_never_stop_a_job_and_required_nodes_are_left_to_slurm():
    capped = dataclasses.replace(POLICY, max_excluded_nodes=1)
    xid = Evidence(4, "sidecar", "xid", FAILED_AT - 20, node="n1", gpu=0, payload={"xid": 79})
    advice = advise(incident(), verdict_of(xid), job(), capped, cluster("n3"), 0)
    assert advice.action is Action.REQUEUE_EXCLUDE and advice.exclude == {"n1"}
    required = job(required_nodes=frozenset({"n3"}))
    advice = advise(incident(), verdict_of(), required, POLICY, cluster("n3"), 0)
    assert advice.action is Action.REQUEUE and not advice.exclude


# ------------------------------------------------------------------------------ the scorecard


def test_the_scorecard_keeps_health_check_drains_apart_from_operators():
    drains = scorecard.mark_health_checks(
        [Drain("n2", 1000.0, NHC_REASON, "root"), Drain("n3", 1000.0, "bad fan", "alice")],
        ["NHC:"],
    )
    advice = Advised(1, 10, 1010.0, "requeue_exclude", "monitor", "why", frozenset({"n2"}))
    card = score([advice], drains)
    assert card.recall == 0.0  # the one operator drain (n3) was not the tool's call
    assert card.precision == 0.0  # n2: drained by the health check, not by an operator
    (implication,) = card.implications
    assert implication.health_checks and not implication.drains
    body = card.to_json()
    assert body["agreement"]["operator_drains"] == 1
    assert body["agreement"]["health_check_drains"] == 1
    assert body["health_check_drains"][0]["by"] == "health_check"
    (row,) = [d for d in card.differences() if d["incident"] == 1]
    assert "n2 not drained by an operator" in row["why"]
    assert "(drained by the health check)" in row["why"]


def test_observed_health_check_drains_stay_apart_when_merged():
    observed = scorecard.from_observed(
        [
            {
                "observed_at": 1000.5,
                "payload": {
                    "change": "drained",
                    "node": "n2",
                    "reason": NHC_REASON,
                    "health_check": True,
                },
            },
            {
                "observed_at": 1060.0,
                "payload": {"change": "drain_reason_changed", "node": "n2", "reason": "RMA"},
            },
        ]
    )
    merged = scorecard.merge_drains(observed.drains)
    assert [(d.reason, d.health_check) for d in merged] == [(NHC_REASON, True), ("RMA", False)]
    assert merged[0].words().startswith("drained n2 by the health check at ")


def test_the_gates_nhc_verdict_shows_with_the_job_start():
    gate = {
        "refused": False,
        "reason": "would refuse",
        "nhc": {"verdict": "fail", "exit_code": 1, "duration": 0.25, "output": ["ERROR: x"]},
    }
    line = describe_evidence(
        {
            "kind": "job_start",
            "job_id": 7,
            "node": "n2",
            "payload": {"nodes": ["n2"], "restart_count": 0, "health_gate": gate},
        }
    )
    assert line == (
        "job 7 started on n2 (attempt 0); health gate on n2: nhc fail, exit 1 in 0.25 s: ERROR: x"
    )
