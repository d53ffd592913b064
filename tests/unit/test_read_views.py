"""The pure parts of `srecovery incidents|explain|nodes`: the lemon score, the timeline, open
findings, evidence in words, the query parameters, and the text the CLI prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest

from slurm_recovery.cli import read_cmds
from slurm_recovery.controller import read_api, views
from slurm_recovery.scheduler import Node
from slurm_recovery.store import Evidence, JobAttempt, Store

T0 = 1_795_960_000.0
DAY = 86400.0


def at(seconds: float) -> str:
    return views.iso(T0 + seconds)


# --------------------------------------------------------------------------- lemon score


def test_lemon_score_is_zero_without_inputs():
    score = views.lemon_score([], [], [], T0)
    assert score["score"] == 0.0 and score["lemon"] is False
    assert score["inputs"]["incidents"] == {"count": 0, "points": 0.0}


def test_two_confident_implications_today_make_a_lemon_one_does_not():
    one = views.lemon_score([(T0 - 60, 1.0)], [], [], T0)
    two = views.lemon_score([(T0 - 60, 1.0), (T0 - 30, 1.0)], [], [], T0)
    assert one["score"] == pytest.approx(1.0, abs=1e-3) and not one["lemon"]
    assert two["score"] == pytest.approx(2.0, abs=1e-3) and two["lemon"]
    assert two["score"] > one["score"]


def test_recency_halves_every_half_life_and_the_window_cuts_off():
    week_old = views.lemon_score([(T0 - 7 * DAY, 1.0)], [], [], T0)
    assert week_old["score"] == pytest.approx(0.5, abs=1e-3)
    too_old = views.lemon_score([(T0 - 31 * DAY, 1.0)], [T0 - 31 * DAY], [T0 - 40 * DAY], T0)
    assert too_old["score"] == 0.0
    assert too_old["inputs"]["incidents"]["count"] == 0


def test_confidence_findings_and_drains_are_weighted_and_explained():
    score = views.lemon_score([(T0, 0.6), (T0, 2.0)], [T0, T0], [T0], T0)
    # 0.6 + 1.0 (confidence capped at 1) + 2 * 0.25 + 0.25
    assert score["score"] == pytest.approx(2.35, abs=1e-3) and score["lemon"]
    assert score["inputs"]["fatal_findings"] == {"count": 2, "points": 0.5}
    assert score["inputs"]["drains"] == {"count": 1, "points": 0.25}
    assert score["explanation"] == (
        "2 implicated incident(s) 1.60 + 2 fatal finding(s) 0.50 + 1 drain(s) 0.25 = 2.35 >= 2"
    )


def test_four_weak_implications_make_a_lemon_three_do_not():
    weak = [(T0 - i, 0.6) for i in range(4)]
    assert not views.lemon_score(weak[:3], [], [], T0)["lemon"]
    assert views.lemon_score(weak, [], [], T0)["lemon"]


# ---------------------------------------------------------------------- open findings


def finding(ident, seconds, check, severity="fatal", gpu=1, node="n2", kind="gpu_finding", **p):
    return {
        "id": ident,
        "kind": kind,
        "node": node,
        "gpu": gpu,
        "observed_at": at(seconds),
        "payload": {"check": check, "severity": severity, "detail": f"{check} detail", **p},
    }


def test_open_findings_keep_what_was_not_cleared():
    found = views.open_findings(
        [
            finding(1, 0, "ecc_dbe"),
            finding(2, 5, "throttle_thermal", "warning", gpu=2),
            finding(3, 1, "nvlink_down", gpu=3),
            finding(4, 9, "nvlink_down", "info", gpu=3, cleared=True),
            finding(5, 2, "port_down", kind="ib_finding", gpu=None, port="mlx5_0/1"),
            finding(6, 3, "gpu_inventory_changed", "info", gpu=None),
        ]
    )
    assert [(f["check"], f["gpu"], f["severity"]) for f in found] == [
        ("ecc_dbe", 1, "fatal"),
        ("port_down", None, "fatal"),
        ("throttle_thermal", 2, "warning"),
    ]
    assert found[1]["port"] == "mlx5_0/1" and found[0]["evidence_id"] == 1


def test_a_gpu_reset_ends_that_gpus_conditions_and_a_node_reset_all_of_them():
    before = [finding(1, 0, "ecc_dbe", gpu=1), finding(2, 0, "remap_pending", "warning", gpu=2)]
    reset_gpu1 = finding(3, 10, "gpu_reset", "info", gpu=1, cleared=True)
    assert [f["gpu"] for f in views.open_findings([*before, reset_gpu1])] == [2]
    reset_all = finding(4, 10, "gpu_reset", "info", gpu=None, cleared=True)
    assert views.open_findings([*before, reset_all]) == []
    later = finding(5, 20, "ecc_dbe", gpu=1)  # the fault came back after the reset
    assert [f["evidence_id"] for f in views.open_findings([reset_all, later])] == [5]
    ib = finding(6, 0, "port_down", kind="ib_finding", gpu=None)
    assert len(views.open_findings([ib, reset_all])) == 1  # a GPU reset does not heal a port


# --------------------------------------------------------------------- a node's item


def test_node_item_joins_slurm_the_store_and_the_score():
    slurm = Node("n2", "IDLE", frozenset({"DRAIN"}), "srecovery:7:xid 79 (GPU fell off the bus)")
    item = views.node_item(
        "n2",
        slurm=slurm,
        state=None,
        findings=[],
        drains=[{"at": at(-5), "incident": 7, "reason": "srecovery:7:xid 79", "action_id": 3}],
        excluded_by=[42, 41],
        implicated=[(7, T0 - 5, 0.95), (3, T0 - 40 * DAY, 1.0)],
        fatal_times=[T0 - 6],
        now=T0,
    )
    assert item["drain"] == {
        "in_force": True,
        "at": at(-5),
        "reason": slurm.reason,
        "incident": 7,
    }
    assert item["excluded_by"] == [41, 42]
    assert item["incidents"]["recent_ids"] == [7]
    assert item["lemon"]["score"] == pytest.approx(0.95 + 0.25 + 0.25, abs=1e-2)
    assert item["slurm"]["flags"] == ["DRAIN"] and item["drained_by_tool"] is False
    resumed = views.node_item(
        "n2",
        slurm=Node("n2", "IDLE"),
        state=None,
        findings=[],
        drains=[],
        excluded_by=[],
        implicated=[],
        fatal_times=[],
        now=T0,
    )
    assert resumed["drain"] is None  # Slurm shows it back in service


def test_tool_drain_incident_reads_the_reason():
    assert views.tool_drain_incident("srecovery:12:xid 79 (GPU fell off the bus)") == 12
    assert views.tool_drain_incident("srecovery-op:alice: bad DIMM") is None
    assert views.tool_drain_incident("") is None


# ------------------------------------------------------------------ evidence in words


@pytest.mark.parametrize(
    ("kind", "node", "gpu", "payload", "words"),
    [
        (
            "xid",
            "n2",
            1,
            {"xid": 79, "message": "GPU has fallen off the bus."},
            "XID 79 on n2 GPU 1",
        ),
        ("operator_report", "n5", None, {"reason": "fails NCCL test"}, "operator report on n5"),
        (
            "log_signature",
            "n1",
            None,
            {"signature": "cuda.illegal_memory_access", "text": "CUDA error: an illegal..."},
            "log cuda.illegal_memory_access [n1]: CUDA error",
        ),
        (
            "gpu_finding",
            "n3",
            4,
            {"check": "ecc_dbe", "severity": "fatal", "detail": "2 uncorrectable"},
            "ecc_dbe (fatal) on n3 GPU 4: 2 uncorrectable",
        ),
        (
            "ib_finding",
            "n3",
            None,
            {"check": "port_down", "severity": "fatal", "port": "mlx5_0/1"},
            "port_down (fatal) on n3 port mlx5_0/1",
        ),
        (
            "progress",
            "n1",
            None,
            {"step": 12, "rank": 1, "origin": "file"},
            "rank 1 reached step 12",
        ),
        (
            "flight_recorder",
            "n2",
            None,
            {"rank": 3, "backend": "nccl", "groups": [{}, {}]},
            "flight-recorder dump of rank 3 on n2 (nccl, 2 process group(s))",
        ),
        (
            "node_state",
            "n4",
            None,
            {"state": "DOWN", "reason": "Not responding"},
            "Slurm showed n4",
        ),
        (
            "sidecar_silent",
            "n2",
            None,
            {"last_report": 100.0, "silent_for": 151.2, "grace": 150.0, "jobs": [7, 9]},
            "n2's sidecar sent nothing for 151s while it ran jobs 7, 9",
        ),
        (
            "sidecar_silent",
            "n2",
            None,
            {"silent_for": "x", "jobs": "bad"},
            "n2's sidecar sent nothing",
        ),
    ],
)
def test_describe_evidence(kind, node, gpu, payload, words):
    text = views.describe_evidence({"kind": kind, "node": node, "gpu": gpu, "payload": payload})
    assert words in text, text


# ----------------------------------------------------------------- stories, timelines


def story_for(kind: str, **extra: Any) -> dict[str, Any]:
    """An incident story as the API tells it (``views.incident_story``), before the pure
    steps: a doomed job on n[1-2] whose n2 reported an XID, restarted off n2 (act mode)."""
    xid = {
        "id": 11,
        "source": "sidecar",
        "kind": "xid",
        "node": "n2",
        "gpu": 1,
        "job_id": 42,
        "observed_at": at(0),
        "received_at": at(0.1),
        "payload": {"xid": 79, "message": "GPU has fallen off the bus."},
    }
    start = {
        "id": 9,
        "source": "hook",
        "kind": "job_start",
        "node": "n1",
        "gpu": None,
        "job_id": 42,
        "observed_at": at(-30),
        "received_at": at(-30),
        "payload": {"nodes": ["n1", "n2"], "restart_count": 0},
    }
    advice = {
        "id": 5,
        "generation": 1,
        "created_at": at(0.3),
        "action": "requeue_exclude",
        "mode": "act",
        "reason": "xid 79 on n2: requeue excluding n2, drain n2",
        "rule": "classes.hardware.action",
        "exclude": ["n2"],
        "drain": ["n2"],
        "needs_operator": False,
        "verdict": {
            "fault_class": "hardware",
            "nodes": ["n2"],
            "gpus": [["n2", 1]],
            "confidence": 0.95,
            "evidence_ids": [11],
            "cause": "xid 79 (GPU fell off the bus)",
        },
        "evidence_ids": [11],
    }

    def action(ident, step, seconds, target="job 42", **params):
        return {
            "id": ident,
            "advice_id": 5,
            "step": step,
            "target": target,
            "result": "ok",
            "started_at": at(seconds - 0.01),
            "finished_at": at(seconds),
            "duration": 0.01,
            "message": "",
            "params": params,
            "audit_seq": None,
        }

    story = {
        "id": 7,
        "kind": kind,
        "job_id": 42,
        "restart_count": 0,
        "opened_at": at(0.2),
        "closed_at": at(3.0),
        "state": "closed",
        "outcome": "restarted on n[3-4]",
        "summary": "job 42 running on n[1-2]: xid 79 on n2 GPU 1",
        "advice": advice,
        "advice_history": [dict(advice)],
        "evidence": [xid],
        "context_evidence": [start],
        "milestones": {
            "failure": at(0),
            "detected": at(0.2),
            "attributed": at(0.3),
            "advised": at(0.3),
            "held": at(0.6),
            "excluded": at(0.8),
            "released": at(1.2),
            "running_again": at(2.9),
        },
        "actions": [
            action(1, "drain", 0.4, target="n2"),
            action(2, "mark", 0.5),
            action(3, "requeue_hold", 0.6),
            action(4, "exclude", 0.8, nodes=["n2"]),
            action(5, "release", 1.2),
        ],
        "audit": [
            {
                "seq": 20,
                "ts": at(0.3),
                "kind": "advice",
                "subject": "job 42",
                "payload": {"incident": 7, "advice": 5},
            },
            {
                "seq": 21,
                "ts": at(0.4),
                "kind": "action",
                "subject": "n2",
                "payload": {"incident": 7, "step": "drain", "result": "ok"},
            },
            {
                "seq": 22,
                "ts": at(0.5),
                "kind": "action",
                "subject": "job 42",
                "payload": {"incident": 7, "step": "mark", "result": "ok"},
            },
            {
                "seq": 23,
                "ts": at(0.6),
                "kind": "action",
                "subject": "job 42",
                "payload": {"incident": 7, "step": "requeue_hold", "result": "ok"},
            },
            {
                "seq": 24,
                "ts": at(0.8),
                "kind": "action",
                "subject": "job 42",
                "payload": {"incident": 7, "step": "exclude", "result": "ok", "nodes": ["n2"]},
            },
            {
                "seq": 25,
                "ts": at(1.2),
                "kind": "action",
                "subject": "job 42",
                "payload": {"incident": 7, "step": "release", "result": "ok"},
            },
            {
                "seq": 26,
                "ts": at(3.0),
                "kind": "incident_closed",
                "subject": "incident 7",
                "payload": {"incident": 7, "outcome": "restarted on n[3-4]"},
            },
        ],
        "latencies": {"detection": 0.2, "action": 1.0, "end_to_end": 2.9},
    }
    story.update(extra)
    for e in [*story["evidence"], *story["context_evidence"]]:
        e["description"] = views.describe_evidence(e)
    views.link_audit(story)
    story["decisive_evidence"] = views.decisive_evidence(story)
    story["timeline"] = views.build_timeline(story)
    return story


def test_the_timeline_merges_evidence_milestones_and_actions_in_time_order():
    story = story_for("doomed")
    timeline = story["timeline"]
    names = [(e["type"], e["name"]) for e in timeline]
    assert names == [
        ("evidence", "job_start"),
        ("evidence", "xid"),
        ("milestone", "failure"),
        ("milestone", "detected"),
        ("milestone", "attributed"),
        ("milestone", "advised"),
        ("action", "drain"),
        ("action", "mark"),
        ("action", "requeue_hold"),
        ("milestone", "held"),
        ("action", "exclude"),
        ("milestone", "excluded"),
        ("action", "release"),
        ("milestone", "released"),
        ("milestone", "running_again"),
        ("closed", "closed"),
    ]
    offsets = [e["offset"] for e in timeline]
    assert offsets == sorted(offsets)
    assert offsets[0] == -30.0 and timeline[2]["offset"] == 0.0
    assert timeline[-2]["offset"] == pytest.approx(2.9)
    by_name = {e["name"]: e for e in timeline}
    assert by_name["advised"]["audit_seq"] == 20 and by_name["advised"]["id"] == 5
    assert by_name["drain"]["audit_seq"] == 21 and by_name["release"]["audit_seq"] == 25
    assert by_name["closed"]["audit_seq"] == 26
    assert by_name["exclude"]["text"] == "exclude job 42 n2: ok"
    assert "hardware, n2, confidence 0.95" in by_name["attributed"]["text"]


def test_decisive_evidence_is_the_verdicts_or_else_what_opened_the_incident():
    story = story_for("doomed")
    ((decisive,),) = [story["decisive_evidence"]]
    assert (decisive["id"], decisive["basis"]) == (11, "verdict")
    assert decisive["description"].startswith("XID 79 on n2 GPU 1")
    unknown = story_for("crash")
    unknown["advice"]["verdict"]["evidence_ids"] = []
    assert [e["basis"] for e in views.decisive_evidence(unknown)] == ["trigger"]


def test_later_advice_generations_are_on_the_timeline():
    story = story_for("doomed")
    second = {**story["advice"], "id": 6, "generation": 2, "created_at": at(1.5)}
    story["advice_history"].append(second)
    timeline = views.build_timeline(story)
    (entry,) = [e for e in timeline if e["type"] == "advice"]
    assert entry["name"] == "advice_2" and entry["offset"] == 1.5


def test_context_events_keep_the_attempts_first_start_and_its_ends():
    def event(ident, kind, seconds, restart):
        return {
            "id": ident,
            "kind": kind,
            "observed_at": at(seconds),
            "payload": {"restart_count": restart},
        }

    events = [
        event(1, "job_start", -10, 0),
        event(2, "job_start", -9.9, 0),
        event(3, "job_end", 1, 1),  # EpilogSlurmctld after the requeue: the next count
        event(4, "job_start", 5, 1),  # the next attempt
        event(5, "job_end", 50, 1),  # the next attempt's end, after the close
    ]
    kept = views.context_events(events, 0, at(10))
    assert [e["id"] for e in kept] == [1, 3]


@pytest.mark.parametrize(
    ("kind", "summary", "words"),
    [
        ("crash", "job 42 ended FAILED (exit 1:0) on n[1-2]", "the job ended in failure"),
        ("doomed", "job 42 running on n[1-2]: xid 79", "a fatal fault hit a node"),
        ("app_fault", "job 42 running on n1: application reported cuda.oom", "application"),
        (
            "hang",
            "no progress for 9s (deadline 3s); last step 12; stopped first: rank 1 on n2; "
            "flight recorder: rank 1 on n2 never entered all_reduce #13",
            "progress deadline passed",
        ),
        (
            "straggler",
            "throughput down 75% for 6s; throttle_thermal on n2",
            "throughput dropped",
        ),
    ],
)
def test_every_kind_is_told(kind, summary, words):
    story = story_for(kind, summary=summary)
    failure = next(e for e in story["timeline"] if e["name"] == "failure")
    assert words in failure["text"]
    text = "\n".join(read_cmds.render_story(story))
    assert text.startswith(f"incident 7: job 42 attempt 0 ({kind}), restarted on n[3-4]")
    assert f"  summary  {summary}" in text
    assert "  verdict  hardware nodes=n2 confidence=0.95" in text
    assert "  advice   requeue_exclude (act mode, rule classes.hardware.action)" in text
    assert "evidence (what the verdict rests on):" in text
    assert "#11" in text and "XID 79 on n2 GPU 1" in text
    assert "action drain n2: ok (10ms)  [audit 21]" in text
    assert "closed: restarted on n[3-4]  [audit 26]" in text
    assert "latency  detection 200ms, action 1.0s, end-to-end 2.9s" in text
    assert "audit    rows 20, 21, 22, 23, 24, 25, 26" in text
    lines = text.splitlines()
    start = lines.index(next(x for x in lines if x.startswith("  timeline")))
    assert "-30.000s" in lines[start + 1] and "+0.000s" in lines[start + 3]


# -------------------------------------------------------------- parameters and syntax


def test_incident_query_parameters_are_validated():
    parsed = read_api.parse_incident_query(
        {
            "since": "1795960000",
            "job": "42",
            "node": "n2",
            "class": "hardware",
            "state": "open",
            "kind": "crash,doomed",
            "limit": "5",
        }
    )
    assert parsed == {
        "since": 1795960000.0,
        "job_id": 42,
        "node": "n2",
        "fault_class": "hardware",
        "state": "open",
        "kinds": ["crash", "doomed"],
        "limit": 5,
    }
    assert read_api.parse_incident_query({"open": "1"})["state"] == "open"
    assert read_api.parse_incident_query({"since": "2026-11-29T03:00:00Z"})["since"] > 0
    for bad, words in [
        ({"class": "hardwar"}, "class='hardwar': must be one of hardware"),
        ({"kind": "crash,oops"}, "kind='crash,oops'"),
        ({"state": "gone"}, "state='gone'"),
        ({"limit": "0"}, "limit=0: must be between 1 and 10000"),
        ({"limit": "many"}, "not a whole number"),
        ({"job": "-3"}, "job=-3"),
        ({"since": "yesterday"}, "since='yesterday': not a time"),
        ({"node": "n[1-3]"}, "not a node name"),
        ({"clas": "hardware"}, "unknown parameter clas"),
        ({"open": "1", "state": "closed"}, "contradict"),
        ({"since": "200", "until": "100"}, "until is before since"),
    ]:
        with pytest.raises(read_api.BadRequest, match=None) as err:
            read_api.parse_incident_query(bad)
        assert words in str(err.value), (bad, str(err.value))


def test_explain_takes_a_job_id_or_an_incident_id():
    assert read_cmds.parse_target("1234", None) == ("job", 1234)
    assert read_cmds.parse_target("i56", None) == ("incident", 56)
    assert read_cmds.parse_target("I#7", None) == ("incident", 7)
    assert read_cmds.parse_target(None, 56) == ("incident", 56)
    for target, incident in [("x1", None), ("0", None), ("i0", None), (None, None), ("1", 2)]:
        with pytest.raises(click.UsageError):
            read_cmds.parse_target(target, incident)


def test_incident_query_path():
    path = read_cmds.incident_query(
        since=1795960000.5,
        job_id=None,
        node="n2",
        fault_class="hardware",
        state=None,
        kinds=("crash", "doomed", "crash"),
        limit=50,
    )
    assert path == (
        "/v1/incidents?since=1795960000.500&node=n2&class=hardware&kind=crash%2Cdoomed&limit=50"
    )


def test_incident_rows_put_the_reason_last_and_shorten_a_stop():
    story = story_for("crash")
    stopped = {**story, "outcome": "stopped: restart limit reached", "nodes": ["n2", "n3"]}
    (row,) = read_cmds.incident_rows([stopped])
    assert row[0] == 7 and row[2] == 42 and row[3] == "crash" and row[4] == "hardware"
    assert row[5] == "n[2-3]" and row[6] == "requeue_exclude" and row[7] == "act"
    assert row[8] == "stopped" and row[9] == story["advice"]["reason"]
    assert read_cmds.short_outcome({"closed_at": None}) == "open"


# ------------------------------------------------------------------ the store's queries


@pytest.fixture
def store(tmp_path: Path):
    with Store.open(tmp_path / "state.db") as s:
        yield s


def _incident(store: Store, job: int, kind: str, cls: str, nodes, ran_on, opened, closed=False):
    attempt = store.resolve_attempt(JobAttempt("c1", job, 100 + job, 0), seen_at=opened)
    (ev,) = store.add_evidence([Evidence("operator", "xid", opened, node=ran_on[0])])
    incident = store.open_incident(attempt.id, kind, opened_at=opened)
    store.add_advice(
        incident.id,
        decision="requeue",
        reason="because",
        verdict={
            "mode": "act",
            "verdict": {"fault_class": cls, "nodes": nodes, "confidence": 0.9},
            "job": {"nodes": ran_on},
        },
        evidence_ids=[ev],
        created_at=opened,
    )
    store.append_audit("controller", "advice", f"job {job}", {"incident": incident.id}, ts=opened)
    if closed:
        store.close_incident(incident.id, outcome="done", closed_at=opened + 1)
    return incident.id


def test_find_incidents_filters_in_the_store(store):
    a = _incident(store, 1, "crash", "unknown", [], ["n1"], T0, closed=True)
    b = _incident(store, 2, "doomed", "hardware", ["n2"], ["n2", "n3"], T0 + 10)
    c = _incident(store, 3, "hang", "unknown", [], ["n3"], T0 + 20)
    assert [i.id for i in store.find_incidents()] == [c, b, a]
    assert [i.id for i in store.find_incidents(oldest_first=True, limit=2)] == [a, b]
    assert [i.id for i in store.find_incidents(node="n3")] == [c, b]  # ran on n3
    assert [i.id for i in store.find_incidents(node="n2")] == [b]  # implicated
    assert [i.id for i in store.find_incidents(fault_class="hardware")] == [b]
    assert [i.id for i in store.find_incidents(state="closed")] == [a]
    assert [i.id for i in store.find_incidents(state="open")] == [c, b]
    assert [i.id for i in store.find_incidents(kinds=["crash", "hang"])] == [c, a]
    assert [i.id for i in store.find_incidents(job_id=2)] == [b]
    assert [i.id for i in store.find_incidents(since=T0 + 5, until=T0 + 15)] == [b]
    assert store.implicated_since(T0) == [("n2", b, T0 + 10, 0.9)]
    assert store.implicated_since(T0 + 11) == []
    rows = store.audit_about(incidents=[b], since=T0 + 5)
    assert [r.payload["incident"] for r in rows] == [b]
    assert [r.payload["incident"] for r in store.audit_about(incidents=[a, c])] == [a, c]
    with pytest.raises(ValueError):
        store.find_incidents(state="maybe")


def test_latest_findings_and_node_drains(store):
    ids = store.add_evidence(
        [
            Evidence(
                "sidecar",
                "gpu_finding",
                T0,
                node="n2",
                gpu=1,
                payload={"check": "ecc_dbe", "severity": "fatal"},
            ),
            Evidence(
                "sidecar",
                "gpu_finding",
                T0 + 5,
                node="n2",
                gpu=1,
                payload={"check": "ecc_dbe", "severity": "info", "cleared": True},
            ),
            Evidence(
                "sidecar",
                "gpu_finding",
                T0 + 1,
                node="n2",
                gpu=2,
                payload={"check": "ecc_dbe", "severity": "fatal"},
            ),
            Evidence(
                "sidecar",
                "ib_finding",
                T0 + 2,
                node="n3",
                payload={"check": "port_down", "severity": "fatal", "port": "mlx5_0/1"},
            ),
            Evidence("sidecar", "progress", T0 + 3, node="n2", payload={"step": 1}),
        ]
    )
    latest = store.latest_findings()
    assert [r.id for r in latest] == [ids[2], ids[3], ids[1]]
    assert [r.id for r in store.latest_findings(node="n3")] == [ids[3]]
    found = views.open_findings([views.evidence_json(r) for r in latest])
    assert [(f["check"], f["gpu"]) for f in found] == [("ecc_dbe", 2), ("port_down", None)]
    assert [r.id for r in store.evidence_by_kinds(["gpu_finding"], node="n2", since=T0 + 1)] == [
        ids[2],
        ids[1],
    ]
    newest = store.evidence_by_kinds(["gpu_finding", "progress"], node="n2", newest_first=True)
    assert [r.id for r in newest] == [ids[1], ids[4], ids[2], ids[0]]

    b = _incident(store, 2, "doomed", "hardware", ["n2"], ["n2"], T0 + 10)
    advice = store.latest_advice(b)
    store.record_action("drain", "n2", result="ok", started_at=T0 + 11, advice_id=advice.id)
    store.record_action("drain", "n3", result="failed", started_at=T0 + 11, advice_id=advice.id)
    ((action, incident, reason),) = store.node_drains(node="n2")
    assert (action.target, incident, reason) == ("n2", b, f"srecovery:{b}:hardware")
    assert store.node_drains(node="n3") == []


def test_a_reused_job_id_tells_only_the_newest_jobs_story(store):
    """Slurm reuses job ids (a new cluster's job 1 after an old one's): `explain 1` must not tell
    the earlier job's incidents as this job's; they are listed apart, by incident id."""
    old = store.resolve_attempt(JobAttempt("c1", 1, 1_000, 0), seen_at=1_000)
    old_incident = store.open_incident(old.id, "crash", opened_at=1_010)
    store.close_incident(old_incident.id, outcome="done", closed_at=1_011)
    new = store.resolve_attempt(JobAttempt("c1", 1, 900, 0), seen_at=5_000)  # an earlier submit
    assert new.history_id != old.history_id  # the store saw another job
    new_incident = store.open_incident(new.id, "hang", opened_at=5_010)
    out = read_api.job_stories(store, 1)
    assert [s["id"] for s in out["incidents"]] == [new_incident.id]
    assert out["earlier_jobs"] == [{"first_seen": views.iso(1_000), "incidents": [old_incident.id]}]
    requeued = store.resolve_attempt(JobAttempt("c1", 1, 900, 1), seen_at=6_000)
    assert requeued.history_id == new.history_id  # its requeue: the same job
    again = store.open_incident(requeued.id, "crash", opened_at=6_010)
    out = read_api.job_stories(store, 1)
    assert [s["id"] for s in out["incidents"]] == [new_incident.id, again.id]
