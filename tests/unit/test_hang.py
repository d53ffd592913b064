"""Hang detection: the adaptive no-progress deadline and who stopped first."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from slurm_recovery.decide.hang import (
    HangFinding,
    ProgressSample,
    detect_hang,
    progress_deadline,
)
from slurm_recovery.decide.policy import HangPolicy, policy_from_toml

POLICY = HangPolicy()  # x10 the median interval, 1 min floor, 30 min ceiling, 30 min grace
START = 10_000.0


def steady(interval: float, count: int, start: float = START + 60, ranks=((0, "n1"),)):
    return [
        ProgressSample(ts=start + i * interval, step=i + 1, rank=rank, node=node)
        for i in range(count)
        for rank, node in ranks
    ]


def test_a_job_that_steps_every_2_seconds_is_hung_after_the_floor():
    samples = steady(2.0, 100)
    last = samples[-1].ts
    assert progress_deadline(samples, POLICY) == 60.0  # 10 x 2 s is below the 1 min floor
    assert detect_hang(1, samples, START, last + 59.9, POLICY) is None
    finding = detect_hang(1, samples, START, last + 60.0, POLICY)
    assert finding == HangFinding(
        job_id=1,
        last_progress_at=last,
        deadline=60.0,
        hung_since=last + 60.0,
        last_step=100,
        summary="no progress for 60.0 s (deadline 60.0 s); last step 100",
    )


def test_a_slow_job_gets_a_longer_deadline_up_to_the_ceiling():
    assert progress_deadline(steady(30.0, 20), POLICY) == 300.0
    assert progress_deadline(steady(600.0, 5), POLICY) == 1800.0


def test_the_deadline_follows_the_recent_pace():
    slow_then_fast = steady(60.0, 10) + steady(5.0, 40, start=START + 60 + 10 * 60)
    no_gap_rule = HangPolicy(floor=1.0, longest_gap_multiple=0)
    assert progress_deadline(slow_then_fast, no_gap_rule) == 50.0  # 10 x the last 20's median
    # ... but not below 1.5 x the longest pause it came back from (60 s)
    assert progress_deadline(slow_then_fast, HangPolicy(floor=1.0)) == 90.0


def test_a_pause_the_job_came_back_from_raises_the_deadline():
    samples = steady(2.0, 50)
    after_checkpoint = samples[-1].ts + 240  # a 4-minute checkpoint save
    samples += steady(2.0, 50, start=after_checkpoint)
    samples = [ProgressSample(s.ts, i + 1, s.rank, s.node) for i, s in enumerate(samples)]
    assert progress_deadline(samples, POLICY) == 360.0
    assert progress_deadline(samples, HangPolicy(longest_gap_multiple=0)) == 60.0


def test_one_report_gives_no_pace_so_the_ceiling_applies():
    assert progress_deadline(steady(2.0, 1), POLICY) == POLICY.ceiling


def test_a_per_job_override_stays_between_floor_and_ceiling():
    samples = steady(2.0, 100)
    assert progress_deadline(samples, POLICY, override=300.0) == 300.0
    assert progress_deadline(samples, POLICY, override=5.0) == 60.0
    assert progress_deadline(samples, POLICY, override=7200.0) == 1800.0


def test_before_the_first_step_the_start_up_grace_applies():
    assert detect_hang(1, [], START, START + 1799, POLICY) is None
    finding = detect_hang(1, [], START, START + 1800, POLICY)
    assert finding is not None
    assert finding.last_progress_at is None
    assert finding.deadline == 1800.0
    assert finding.hung_since == START + 1800
    assert finding.summary == "no progress in the 30.0 min start-up grace"


def test_a_previous_attempts_samples_do_not_count():
    old = steady(2.0, 50, start=START - 3600)
    assert detect_hang(1, old, START, START + 600, POLICY) is None  # in its start-up grace
    assert detect_hang(1, old, START, START + 1800, POLICY).last_progress_at is None


def test_the_ranks_behind_the_others_stopped_first():
    ranks = [(r, f"n{r // 4 + 1}") for r in range(8)]
    samples = steady(2.0, 30, ranks=ranks)
    last = samples[-1].ts
    # rank 5 (on n2) never finished step 31; the others did, then waited for it
    samples += [ProgressSample(last + 2, 31, r, n) for r, n in ranks if r != 5]
    finding = detect_hang(7, samples, START, last + 2 + 60, POLICY)
    assert finding.stalled_ranks == (5,)
    assert finding.stalled_nodes == frozenset({"n2"})
    assert finding.last_step == 31
    assert finding.summary.endswith("stopped first: rank 5 on n2")


def test_no_rank_is_named_when_all_stopped_at_the_same_step():
    samples = steady(2.0, 30, ranks=[(0, "n1"), (1, "n2")])
    finding = detect_hang(7, samples, START, samples[-1].ts + 60, POLICY)
    assert finding.stalled_ranks == ()
    assert finding.stalled_nodes == frozenset()


def test_progress_of_any_rank_keeps_the_job_alive():
    samples = steady(2.0, 30, ranks=[(0, "n1"), (1, "n2")])
    last = samples[-1].ts
    samples += [ProgressSample(last + 50 + 2 * i, 31 + i, 0, "n1") for i in range(20)]
    assert detect_hang(7, samples, START, last + 100, POLICY) is None


def test_repeating_the_same_step_is_not_progress():
    samples = steady(2.0, 30)
    last = samples[-1].ts
    samples += [ProgressSample(last + t, 30, 0, "n1") for t in range(1, 60)]
    finding = detect_hang(1, samples, START, last + 60, POLICY)
    assert finding is not None and finding.last_progress_at == last


def test_the_policy_section_loads():
    policy = policy_from_toml(
        '[hang]\ninterval_multiple = 5\nfloor = "20s"\nceiling = "10m"\nrecent_intervals = 10\n'
        'longest_gap_multiple = 0\nstartup_grace = "1h"\n'
    )
    assert policy.hang == HangPolicy(5.0, 20.0, 600.0, 10, 0.0, 3600.0)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[hang]\nfloor = "10m"\nceiling = "5m"', "hang.ceiling = 300s is below hang.floor"),
        ("[hang]\ninterval_multiple = 0.5", "hang.interval_multiple = 0.5: must be from 1"),
        ("[hang]\nrecent_intervals = 0", "hang.recent_intervals = 0: must be at least 1"),
        ('[hang]\nfloor = "0s"', "more than 0"),
        ("[hang]\ndeadline = 60", "hang.deadline: unknown key"),
    ],
)
def test_bad_hang_settings_are_refused(text, words):
    from slurm_recovery.decide.policy import PolicyError

    with pytest.raises(PolicyError) as caught:
        policy_from_toml(text, "policy.toml")
    assert words in str(caught.value)


# --------------------------------------------------------------------------------- properties

durations = st.floats(min_value=0.5, max_value=7200, allow_nan=False)


@st.composite
def policies(draw):
    floor = draw(st.floats(min_value=1, max_value=600))
    ceiling = draw(st.floats(min_value=floor, max_value=7200))
    return HangPolicy(
        interval_multiple=draw(st.floats(min_value=1, max_value=100)),
        floor=floor,
        ceiling=ceiling,
        recent_intervals=draw(st.integers(min_value=1, max_value=50)),
        longest_gap_multiple=draw(st.floats(min_value=0, max_value=10)),
        startup_grace=draw(st.floats(min_value=1, max_value=7200)),
    )


@st.composite
def histories(draw, max_gap: float = 3600.0):
    """Progress of 1-4 ranks: each report a step, gaps up to ``max_gap``, ranks may lag."""
    ranks = draw(st.integers(min_value=1, max_value=4))
    gaps = draw(st.lists(st.floats(min_value=0.01, max_value=max_gap), min_size=1, max_size=40))
    samples = []
    ts = START + draw(st.floats(min_value=0, max_value=600))
    for step, gap in enumerate(gaps, start=1):
        for rank in range(ranks):
            if draw(st.booleans()) or rank == 0:
                samples.append(ProgressSample(ts + rank * 0.001, step, rank, f"n{rank}"))
        ts += gap
    return samples


@settings(max_examples=300, deadline=None)
@given(histories(), policies(), st.none() | durations)
def test_the_deadline_always_lies_between_floor_and_ceiling(samples, policy, override):
    deadline = progress_deadline(samples, policy, override)
    assert policy.floor <= deadline <= policy.ceiling


@settings(max_examples=300, deadline=None)
@given(
    st.data(),
    policies(),
    st.floats(min_value=0.01, max_value=1.0),
    st.integers(min_value=2, max_value=200),
)
def test_a_job_that_keeps_stepping_is_never_hung(data, policy, fraction, count):
    """Reports never further apart than the floor: at no moment is the job hung."""
    gaps = data.draw(
        st.lists(
            st.floats(min_value=policy.floor * fraction / 2, max_value=policy.floor * fraction),
            min_size=count,
            max_size=count,
        )
    )
    ts, samples = START + 1.0, []
    for step, gap in enumerate(gaps, start=1):
        samples.append(ProgressSample(ts, step, 0, "n1"))
        ts += gap
    last = samples[-1].ts
    now = data.draw(st.floats(min_value=samples[0].ts, max_value=last + policy.floor * fraction))
    assume(now < last + policy.floor)
    seen = [s for s in samples if s.ts <= now]
    assert detect_hang(1, seen, START, now, policy) is None


@settings(max_examples=300, deadline=None)
@given(histories(), policies(), st.floats(min_value=0.5, max_value=120), st.none() | durations)
def test_a_stall_is_reported_within_deadline_plus_one_evaluation(samples, policy, every, override):
    """Evaluated every ``every`` seconds after the last report, the first finding comes no later
    than last progress + deadline + one evaluation interval, and says when the deadline passed."""
    last = max(s.ts for s in samples)
    deadline = progress_deadline(samples, policy, override)
    now = last
    while True:
        finding = detect_hang(1, samples, START, now, policy, override)
        if finding is not None:
            break
        assert now < last + deadline
        now += every
    assert now <= last + deadline + every
    assert finding.hung_since == pytest.approx(last + deadline)
    assert finding.last_progress_at == last
    assert finding.deadline == deadline


@settings(max_examples=200, deadline=None)
@given(histories(), policies())
def test_only_ranks_behind_the_top_step_are_named(samples, policy):
    finding = detect_hang(1, samples, START, max(s.ts for s in samples) + 10**6, policy)
    assert finding is not None
    last_step = {}
    for sample in sorted(samples, key=lambda s: s.ts):
        last_step[sample.rank] = sample.step
    assert set(finding.stalled_ranks) == {r for r, s in last_step.items() if s < finding.last_step}
    assert finding.stalled_nodes == {f"n{r}" for r in finding.stalled_ranks}


def done(samples, at: float):
    """Each stream's end record (``done``) at ``at``, after ``samples``."""
    last = {s.key: s for s in samples}
    return [
        ProgressSample(ts=at, step=s.step, rank=s.rank, node=s.node, done=True)
        for s in last.values()
    ]


def test_a_job_whose_ranks_all_finished_is_not_hung_while_it_tears_down():
    ranks = ((0, "n1"), (1, "n2"))
    samples = steady(2.0, 20, ranks=ranks)
    last = samples[-1].ts
    finished = samples + done(samples, last + 1)
    assert detect_hang(1, finished, START, last + 3600, POLICY) is None
    # one rank still short of its end record: the job is judged as before
    one_left = samples + done(samples[-1:], last + 1)
    finding = detect_hang(1, one_left, START, last + 60.0, POLICY)
    assert finding is not None and finding.last_progress_at == last


def test_an_end_record_is_not_progress():
    samples = steady(2.0, 20, ranks=((0, "n1"), (1, "n2")))
    last = samples[-1].ts
    late_end = samples + done(samples[-1:], last + 50)  # rank 1 ended; rank 0 is stuck
    finding = detect_hang(1, late_end, START, last + 60.0, POLICY)
    assert finding is not None and finding.hung_since == last + 60.0
