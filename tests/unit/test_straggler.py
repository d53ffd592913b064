"""Straggler detection: a sustained drop against the job's own baseline, and who is to blame."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.decide.model import Evidence
from slurm_recovery.decide.policy import PolicyError, StragglerPolicy, policy_from_toml
from slurm_recovery.decide.straggler import (
    RatePoint,
    detect_straggler,
    find_drop,
    throughput,
)
from slurm_recovery.signals.progress import ProgressSample

POLICY = StragglerPolicy()  # 10 min baseline, 20 % drop, 3 min, 30 s periods, 20 % rank lag
START = 50_000.0
NODES = {0: "n1", 1: "n1", 2: "n2", 3: "n2"}


def run(
    phases,
    ranks=(0,),
    tokens_per_step=None,
    step_times=None,
    start=START + 30,
):
    """Progress of ``ranks`` through ``phases`` of (seconds, step interval); every rank reports
    every step (synchronous training: the same pace everywhere)."""
    samples, ts, step = [], start, 0
    for seconds, interval in phases:
        end = ts + seconds
        while ts < end:
            step += 1
            ts += interval
            for rank in ranks:
                samples.append(
                    ProgressSample(
                        ts=ts,
                        step=step,
                        rank=rank,
                        node=NODES.get(rank),
                        tokens=step * tokens_per_step if tokens_per_step else None,
                        step_time=(step_times or {}).get(rank),
                    )
                )
    return samples


def gpu_finding(ev_id, node, check, at, gpu=0, **payload):
    return Evidence(
        id=ev_id,
        source="sidecar",
        kind="gpu_finding",
        observed_at=at,
        node=node,
        gpu=gpu,
        payload={"check": check, "severity": "warning", "detail": "", **payload},
    )


def test_a_steady_job_is_no_straggler():
    assert detect_straggler(1, run([(3600, 1.0)]), START, POLICY) is None


def test_a_sustained_drop_is_found_with_its_onset_and_size():
    samples = run([(1200, 1.0), (300, 1.5)])
    finding = detect_straggler(1, samples, START, POLICY)
    assert finding is not None
    assert finding.unit == "steps"
    assert finding.drop_percent == pytest.approx(33.3, abs=2)
    assert finding.baseline_rate == pytest.approx(1.0, rel=0.05)
    assert START + 1230 - 30 <= finding.onset <= START + 1230 + 1.5
    assert finding.nodes == frozenset()
    assert finding.summary.endswith("no node explains it")


def test_a_drop_shorter_than_min_duration_is_not_reported():
    assert detect_straggler(1, run([(1200, 1.0), (120, 1.5)]), START, POLICY) is None


def test_a_small_drop_is_not_reported():
    assert detect_straggler(1, run([(1200, 1.0), (600, 1.1)]), START, POLICY) is None


def test_a_brief_dip_then_recovery_is_not_reported():
    samples = run([(1200, 1.0), (300, 2.0), (120, 1.0)])
    assert detect_straggler(1, samples, START, POLICY) is None


def test_a_job_that_speeds_up_after_warm_up_is_no_straggler():
    assert detect_straggler(1, run([(300, 3.0), (1800, 1.0)]), START, POLICY) is None


def test_tokens_are_counted_when_reported():
    samples = run([(1200, 1.0), (300, 2.0)], tokens_per_step=4096)
    finding = detect_straggler(1, samples, START, POLICY)
    assert finding.unit == "tokens"
    assert finding.baseline_rate == pytest.approx(4096, rel=0.05)
    assert finding.drop_percent == pytest.approx(50, abs=3)


def test_sparse_log_progress_is_averaged_not_read_as_zero():
    # a log line every 5 minutes: most 30 s periods have no report
    samples = [ProgressSample(START + 300 * i, 100 * i) for i in range(1, 20)]
    unit, points = throughput(samples, START, 30.0)
    assert unit == "steps"
    assert all(p.rate == pytest.approx(1 / 3) for p in points)
    assert detect_straggler(1, samples, START, POLICY) is None


def test_a_restarted_counter_starts_over_without_a_drop():
    samples = run([(1200, 1.0)]) + [
        ProgressSample(START + 1300 + i, i + 1, 0, "n1") for i in range(600)
    ]
    _, points = throughput(samples, START, 30.0)
    assert all(p.rate > 0 for p in points)
    assert detect_straggler(1, samples, START, POLICY) is None


def test_a_throttled_node_is_named():
    samples = run([(1200, 1.0), (300, 1.5)], ranks=(0, 2))
    evidence = [
        gpu_finding(11, "n2", "throttle_thermal", START + 1240, gpu=3),
        gpu_finding(12, "n1", "throttle_thermal", START + 200),  # long before: ran fast anyway
        gpu_finding(13, "n1", "ecc_sbe_storm", START + 1240),  # not a slowdown
        gpu_finding(14, "n9", "pcie_link_downgrade", START + 1240),  # not the job's node
    ]
    finding = detect_straggler(1, samples, START, POLICY, evidence=evidence, job_nodes={"n1", "n2"})
    assert finding.nodes == frozenset({"n2"})
    assert finding.evidence_ids == (11,)
    assert "throttle_thermal on n2" in finding.summary


def test_a_condition_cleared_before_the_drop_does_not_explain_it():
    samples = run([(1200, 1.0), (300, 1.5)])
    evidence = [
        gpu_finding(11, "n1", "pcie_link_downgrade", START + 1205),
        gpu_finding(12, "n1", "pcie_link_downgrade", START + 1210, cleared=True, severity="info"),
    ]
    finding = detect_straggler(1, samples, START, POLICY, evidence=evidence)
    assert finding.nodes == frozenset()


def test_a_lagging_rank_names_its_node():
    times = {0: 0.5, 1: 0.5, 2: 0.5, 3: 1.4}  # rank 3 works 1.4 s a step, the others 0.5 s
    samples = run([(1200, 1.0)], ranks=(0, 1, 2, 3), step_times={r: 0.5 for r in times})
    samples += run([(300, 1.5)], ranks=(0, 1, 2, 3), step_times=times, start=samples[-1].ts)
    samples = [
        ProgressSample(s.ts, i // 4 + 1, s.rank, s.node, step_time=s.step_time)
        for i, s in enumerate(samples)
    ]
    finding = detect_straggler(1, samples, START, POLICY)
    assert finding.lagging_ranks == (3,)
    assert finding.nodes == frozenset({"n2"})
    assert "rank 3 lags the other ranks" in finding.summary


def test_equal_step_times_blame_nobody():
    samples = run([(1200, 1.0), (300, 1.5)], ranks=(0, 2), step_times={0: 0.9, 2: 0.9})
    finding = detect_straggler(1, samples, START, POLICY)
    assert finding.lagging_ranks == ()
    assert finding.nodes == frozenset()


def test_rank_nodes_from_the_task_layout():
    samples = run([(1200, 1.0), (300, 1.5)], ranks=(0, 7), step_times={0: 0.2, 7: 0.9})
    samples = [ProgressSample(s.ts, s.step, s.rank, None, step_time=s.step_time) for s in samples]
    finding = detect_straggler(1, samples, START, POLICY, rank_nodes={0: "a1", 7: "a2"})
    assert finding.nodes == frozenset({"a2"})


def test_the_policy_section_loads_and_refuses_nonsense():
    policy = policy_from_toml(
        '[straggler]\nbaseline_window = "20m"\ndrop_percent = 30\nmin_duration = "5m"\n'
        'rate_interval = "1m"\nrank_lag_percent = 50\n'
    )
    assert policy.straggler == StragglerPolicy(1200.0, 30.0, 300.0, 60.0, 50.0)
    for text, words in [
        ("[straggler]\ndrop_percent = 0", "straggler.drop_percent = 0: must be more than 0"),
        ("[straggler]\ndrop_percent = 150", "must be more than 0 and at most 100"),
        ('[straggler]\nrate_interval = "0s"', "more than 0"),
        ("[straggler]\nwindow = 3", "straggler.window: unknown key"),
    ]:
        with pytest.raises(PolicyError) as caught:
            policy_from_toml(text, "policy.toml")
        assert words in str(caught.value)


# --------------------------------------------------------------------------------- properties


@st.composite
def rate_series(draw):
    """Contiguous 30 s periods with arbitrary positive rates."""
    rates = draw(st.lists(st.floats(min_value=0.01, max_value=1000), min_size=0, max_size=80))
    return [RatePoint(START + 30 * i, START + 30 * (i + 1), r) for i, r in enumerate(rates)]


@st.composite
def straggler_policies(draw):
    return StragglerPolicy(
        baseline_window=draw(st.floats(min_value=60, max_value=3600)),
        drop_percent=draw(st.floats(min_value=1, max_value=99)),
        min_duration=draw(st.floats(min_value=1, max_value=1800)),
        rate_interval=30.0,
        rank_lag_percent=draw(st.floats(min_value=1, max_value=200)),
    )


@settings(max_examples=300, deadline=None)
@given(rate_series(), straggler_policies())
def test_a_drop_is_sustained_and_deep_enough(points, policy):
    drop = find_drop(points, policy)
    if drop is None:
        return
    run_rates = [p.rate for p in points if p.start >= drop.onset]
    assert run_rates and points[-1].end == drop.last
    assert max(run_rates) <= (1 - policy.drop_percent / 100) * drop.baseline + 1e-9
    assert drop.duration >= policy.min_duration
    assert drop.percent >= policy.drop_percent - 1e-6


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(min_value=0.2, max_value=5.0), min_size=2, max_size=12),
    st.integers(min_value=1, max_value=4),
    straggler_policies(),
    st.booleans(),
)
def test_no_node_is_blamed_without_per_node_evidence(intervals, ranks, policy, other_evidence):
    """Whatever the throughput does, without slowdown findings from a node and without per-rank
    step times, the finding names no node; evidence of other kinds changes nothing."""
    phases = [(600, interval) for interval in intervals]
    samples = run(phases, ranks=tuple(range(ranks)))
    evidence = (
        [
            gpu_finding(1, "n1", "ecc_sbe_storm", START + 600),
            gpu_finding(2, "n2", "nvml_error", START + 1200),
            Evidence(3, "sidecar", "xid", START + 900, node="n2", payload={"xid": 13}),
        ]
        if other_evidence
        else []
    )
    finding = detect_straggler(1, samples, START, policy, evidence=evidence)
    if finding is not None:
        assert finding.nodes == frozenset()
        assert finding.lagging_ranks == ()
        assert finding.evidence_ids == ()


@settings(max_examples=30, deadline=None)
@given(st.floats(min_value=0.3, max_value=3.0), st.floats(min_value=0.1, max_value=0.7))
def test_a_lasting_drop_is_found_within_min_duration_plus_two_periods(interval, keep):
    """A drop to ``keep`` of the rate (deeper than the threshold) is reported once it has lasted
    ``min_duration`` plus at most two measuring periods."""
    policy = POLICY
    slow = interval / keep
    before = run([(1200, interval)])
    onset = before[-1].ts
    found_after = None
    for extra in range(150, 600, 10):
        samples = before + run([(extra, slow)], start=onset)
        samples = [ProgressSample(s.ts, i + 1, s.rank, s.node) for i, s in enumerate(samples)]
        seen = [s for s in samples if s.ts <= onset + extra]
        if detect_straggler(1, seen, START, policy) is not None:
            found_after = extra
            break
    assert found_after is not None
    assert found_after <= policy.min_duration + 2 * policy.rate_interval + slow + 10


def test_a_job_that_finished_is_no_straggler_and_end_records_carry_no_work():
    samples = run([(1200, 1.0)], ranks=(0, 1))
    end = samples[-1].ts + 400  # the end records come long after the last step
    ended = [ProgressSample(ts=end, step=s.step, rank=s.rank, done=True) for s in samples[-2:]]
    assert detect_straggler(1, samples + ended, START, POLICY) is None
    assert detect_straggler(1, samples + ended[:1], START, POLICY) is None
