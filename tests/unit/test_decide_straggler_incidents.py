"""Progress evidence -> STRAGGLER incidents, their verdicts and advice; progress samples from
the progress file versus log lines."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.decide.advise import advise
from slurm_recovery.decide.attribute import attribute
from slurm_recovery.decide.hang import progress_samples, rank_node
from slurm_recovery.decide.model import Action, ClusterView, Evidence, FaultClass, IncidentKind
from slurm_recovery.decide.policy import policy_from_toml
from slurm_recovery.decide.straggler import straggler_incidents
from slurm_recovery.scheduler.base import Job, Node
from slurm_recovery.signals.xid import load_xid_catalogue

POLICY = policy_from_toml(
    '[straggler]\nbaseline_window = "60s"\nmin_duration = "20s"\nrate_interval = "5s"\n'
    "drop_percent = 30.0\n"
)
START = 1_000
NODES = ("n1", "n2", "n3")


def job(**changes) -> Job:
    fields = dict(
        job_id=7,
        name="t",
        state="RUNNING",
        reason="",
        user="u",
        partition="p",
        nodes=NODES,
        num_nodes=3,
        submit_time=900,
        restart_count=0,
        start_time=START,
    )
    fields.update(changes)
    return Job(**fields)


def view(now: float, **changes) -> ClusterView:
    return ClusterView(
        now=now,
        jobs={7: job(**changes)},
        nodes={n: Node(n, "ALLOCATED", partitions=("p",)) for n in NODES},
    )


def run(slow_from: float, until: float, lag_rank: int | None = None, origin="file"):
    """Three ranks (one per node) stepping once a second, every 2.5 s from ``slow_from`` on;
    ``lag_rank``'s own step time is 3x the others' once slow (the rank that sleeps)."""
    evidence = []
    ts, step, ev_id = START + 1.0, 0, 1
    while ts <= until:
        slow = ts >= slow_from
        for rank, node in enumerate(NODES):
            step_time = 0.3 * (3 if slow and rank == lag_rank else 1)
            payload = {"step": step, "rank": rank, "ts": ts, "origin": origin}
            if origin == "file":
                payload |= {"step_time": step_time, "samples": float(8 * step)}
            evidence.append(
                Evidence(
                    ev_id, "sidecar", "progress", ts + 0.1, node=node, job_id=7, payload=payload
                )
            )
            ev_id += 1
        step += 1
        ts += 2.5 if slow else 1.0
    return evidence


def throttle(ev_id: int, node: str, at: float) -> Evidence:
    return Evidence(
        ev_id,
        "sidecar",
        "gpu_finding",
        at,
        node=node,
        gpu=3,
        payload={"check": "throttle_thermal", "severity": "warning"},
    )


def decide(evidence, now):
    (incident,) = straggler_incidents(view(now), evidence, set(), POLICY)
    verdict = attribute(incident, job(), evidence, load_xid_catalogue(), POLICY)
    return incident, verdict, advise(incident, verdict, job(), POLICY, view(now), 0)


def test_a_steady_job_is_not_a_straggler():
    assert straggler_incidents(view(START + 120), run(10**9, START + 120), set(), POLICY) == []


def test_a_lagging_rank_names_its_node_and_the_job_is_moved_off_it():
    evidence = run(START + 70, START + 110, lag_rank=1)
    incident, verdict, advice = decide(evidence, START + 110)
    assert incident.kind is IncidentKind.STRAGGLER and incident.suspects
    assert START + 65 <= incident.failed_at <= START + 72
    assert verdict.fault_class is FaultClass.SYSTEM and verdict.nodes == {"n2"}
    assert "rank 1 lags" in verdict.cause
    assert advice.action is Action.REQUEUE_EXCLUDE and advice.exclude == {"n2"}
    assert advice.drain == frozenset()  # straggler.drain is off by default


def test_a_throttled_gpu_is_hardware_and_drains_only_when_the_policy_says_so():
    evidence = [*run(START + 70, START + 110), throttle(10_000, "n3", START + 69)]
    _, verdict, advice = decide(evidence, START + 110)
    assert verdict.fault_class is FaultClass.HARDWARE and verdict.nodes == {"n3"}
    assert verdict.evidence_ids == (10_000,) and "throttle_thermal (GPU 3) on n3" in verdict.cause
    assert advice.action is Action.REQUEUE_EXCLUDE and not advice.drain
    draining = policy_from_toml(
        '[straggler]\nbaseline_window = "60s"\nmin_duration = "20s"\nrate_interval = "5s"\n'
        "drop_percent = 30.0\ndrain = true\n[classes.hardware]\ndrain_min_confidence = 0.5\n"
        "[blast_radius]\nmax_percent = 100.0\n"  # 1 of 3 nodes is over the default 10 %
    )
    (incident,) = straggler_incidents(view(START + 110), evidence, set(), draining)
    verdict = attribute(incident, job(), evidence, load_xid_catalogue(), draining)
    assert advise(incident, verdict, job(), draining, view(START + 110), 0).drain == {"n3"}


def test_a_drop_no_node_explains_is_reported_not_restarted():
    incident, verdict, advice = decide(run(START + 70, START + 110), START + 110)
    assert verdict.fault_class is FaultClass.UNKNOWN and verdict.nodes == frozenset()
    assert advice.action is Action.NONE and advice.rule == "straggler.no_node"
    assert "no node explains it" in incident.summary


def test_restart_false_only_reports():
    policy = policy_from_toml(
        '[straggler]\nbaseline_window = "60s"\nmin_duration = "20s"\nrate_interval = "5s"\n'
        "drop_percent = 30.0\nrestart = false\n"
    )
    evidence = run(START + 70, START + 110, lag_rank=1)
    (incident,) = straggler_incidents(view(START + 110), evidence, set(), policy)
    verdict = attribute(incident, job(), evidence, load_xid_catalogue(), policy)
    advice = advise(incident, verdict, job(), policy, view(START + 110), 0)
    assert advice.action is Action.NONE and advice.rule == "straggler.restart"
    assert verdict.nodes == {"n2"}  # still named: the report says where


def test_only_running_unreported_attempts_are_judged():
    evidence = run(START + 70, START + 110, lag_rank=1)
    assert straggler_incidents(view(START + 110), evidence, {(7, 0)}, POLICY) == []
    assert straggler_incidents(view(START + 110, state="PENDING"), evidence, set(), POLICY) == []


def test_file_progress_is_preferred_and_log_lines_name_no_reading_node():
    file = run(START + 10**6, START + 5)
    log = [
        Evidence(900, "sidecar", "progress", START + 3, node="n1", job_id=7,
                 payload={"step": 99, "rank": 2, "ts": START + 3, "origin": "log"}),
    ]  # fmt: skip
    samples = progress_samples([*file, *log], 7, NODES)
    assert {s.step for s in samples} == {0, 1, 2, 3, 4} and all(s.step_time for s in samples)
    assert {s.node for s in samples} == set(NODES)
    (only_log,) = progress_samples(log, 7, NODES)
    assert only_log.node == "n3"  # rank 2 of (at least) 3, block layout: not the reader n1


def test_nan_loss_and_totals_come_through():
    payload = {"step": 3, "ts": 4.0, "origin": "file", "loss": "nan", "tokens": 512}
    ev = Evidence(
        1, "sidecar", "progress", 5.0, node="n1", job_id=7, payload=payload | {"step_time": -1}
    )
    (sample,) = progress_samples([ev], 7)
    assert sample.loss != sample.loss and sample.tokens == 512.0 and sample.step_time is None


def test_rank_node_block_layout():
    assert [rank_node(r, 4, ("a", "b")) for r in range(4)] == ["a", "a", "b", "b"]
    assert [rank_node(r, 5, ("a", "b")) for r in range(5)] == ["a", "a", "a", "b", "b"]
    assert rank_node(1, 2, ("a", "b", "c")) == "b"
    assert rank_node(None, 2, ("a",)) is None and rank_node(0, 1, ()) is None
    assert rank_node(5, 2, ("a", "b")) is None


@given(st.integers(1, 64), st.lists(st.text("abc", min_size=1), min_size=1, max_size=16))
def test_block_layout_is_contiguous_and_balanced(world, nodes):
    placed = [rank_node(r, world, nodes) for r in range(world)]
    assert None not in placed
    used = [nodes.index(n) for n in placed] if len(set(nodes)) == len(nodes) else None
    if used is not None:
        assert used == sorted(used)  # block: rank order follows node order
        counts = [used.count(i) for i in set(used)]
        assert max(counts) - min(counts) <= 1
