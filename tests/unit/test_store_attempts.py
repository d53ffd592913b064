"""Job attempts: a requeue continues a job's history, a reused job id starts a new one.

Slurm facts the cases follow (checked on Slurm 22.05 here): a requeue keeps the job id, adds
one to the restart count, and moves the submit time to the requeue time; while the old attempt
completes, the job shows the new restart count with the old submit time.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.store import AttemptRelation, JobAttempt, Store, relate

SAME = AttemptRelation.SAME_ATTEMPT
NEXT = AttemptRelation.NEXT_ATTEMPT
EARLIER = AttemptRelation.EARLIER_ATTEMPT
DIFFERENT = AttemptRelation.DIFFERENT_JOB


@contextmanager
def fresh_store() -> Iterator[Store]:
    with tempfile.TemporaryDirectory() as tmp, Store.open(Path(tmp) / "state.db") as store:
        yield store


def job(submit: int, restarts: int = 0, job_id: int = 42, cluster: str = "c1") -> JobAttempt:
    return JobAttempt(cluster, job_id, submit, restarts)


# ------------------------------------------------------------------------------ relate


@pytest.mark.parametrize(
    ("known", "seen", "relation"),
    [
        (job(100), job(100), SAME),
        (job(100), job(100, 1), NEXT),  # requeued, old attempt still completing
        (job(100), job(160, 1), NEXT),  # requeued: Slurm moved the submit time
        (job(100), job(400, 3), NEXT),  # requeues we did not see
        (job(100, 1), job(160, 1), SAME),  # the requeue finished: submit time moved
        (job(160, 1), job(100, 1), SAME),  # a late view from before that
        (job(160, 1), job(100, 0), EARLIER),  # a late event about the first attempt
        (job(160, 2), job(160, 1), EARLIER),
        (job(100), job(900), DIFFERENT),  # job id reused: restart count 0, other submit time
        (job(160, 2), job(900), DIFFERENT),  # reused after a requeued job
        (job(160, 1), job(100, 2), DIFFERENT),  # later attempt submitted earlier: not this job
        (job(100), job(100, job_id=43), DIFFERENT),
        (job(100), job(100, cluster="c2"), DIFFERENT),
    ],
)
def test_relate(known: JobAttempt, seen: JobAttempt, relation: AttemptRelation) -> None:
    assert relate(known, seen) is relation
    assert relation.same_job == (relation is not DIFFERENT)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cluster": ""}, "JobAttempt.cluster"),
        ({"job_id": 0}, "JobAttempt.job_id"),
        ({"job_id": "42"}, "JobAttempt.job_id"),
        ({"submit_time": 1.5}, "JobAttempt.submit_time"),
        ({"submit_time": -1}, "JobAttempt.submit_time"),
        ({"restart_count": -1}, "JobAttempt.restart_count"),
        ({"restart_count": True}, "JobAttempt.restart_count"),
    ],
)
def test_bad_job_attempt_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        JobAttempt(**({"cluster": "c1", "job_id": 1, "submit_time": 1} | kwargs))


def test_job_attempt_text() -> None:
    assert str(job(100, 2)) == "c1:42+2@100"


attempts = st.builds(
    JobAttempt,
    cluster=st.sampled_from(["c1", "c2"]),
    job_id=st.integers(1, 3),
    submit_time=st.integers(0, 50),
    restart_count=st.integers(0, 4),
)


@given(a=attempts)
def test_relate_is_reflexive(a: JobAttempt) -> None:
    assert relate(a, a) is SAME


@given(a=attempts, b=attempts)
def test_first_attempts_with_distinct_submit_times_are_different_jobs(
    a: JobAttempt, b: JobAttempt
) -> None:
    first_a = JobAttempt(a.cluster, a.job_id, a.submit_time, 0)
    first_b = JobAttempt(a.cluster, a.job_id, b.submit_time, 0)
    if first_a.submit_time != first_b.submit_time:
        assert relate(first_a, first_b) is DIFFERENT
        assert relate(first_b, first_a) is DIFFERENT


@given(a=attempts, extra=st.integers(1, 5), delay=st.integers(0, 100))
def test_restart_counts_order_attempts(a: JobAttempt, extra: int, delay: int) -> None:
    later = JobAttempt(a.cluster, a.job_id, a.submit_time + delay, a.restart_count + extra)
    assert relate(a, later) is NEXT
    assert relate(later, a) is EARLIER


# ------------------------------------------------------------------------ in the store


def test_requeues_share_a_history_and_reuse_starts_a_new_one() -> None:
    with fresh_store() as store:
        first = store.resolve_attempt(job(100), seen_at=100.0)
        incident = store.open_incident(first.id, "crash", opened_at=150.0)
        store.add_advice(incident.id, decision="requeue", reason="r", created_at=151.0)
        completing = store.resolve_attempt(job(100, 1), seen_at=152.0)
        requeued = store.resolve_attempt(job(152, 1), seen_at=153.0)
        assert completing.id == requeued.id  # the same attempt, submit time moved
        assert requeued.history_id == first.history_id and requeued.id != first.id
        assert store.latest_attempt("c1", 42) == requeued
        assert [a.attempt.restart_count for a in store.history(first.history_id)] == [0, 1]

        reused = store.resolve_attempt(job(9000), seen_at=9000.0)
        assert reused.history_id != first.history_id
        assert store.latest_attempt("c1", 42) == reused
        assert store.list_incidents(history_id=reused.history_id) == []
        assert store.find_open_incident(reused.id) is None
        assert [i.id for i in store.list_incidents(history_id=first.history_id)] == [incident.id]

        # Late events about the old job still find its history, never the new one.
        assert store.resolve_attempt(job(100), seen_at=9001.0) == first
        stale = store.resolve_attempt(job(152, 2), seen_at=9002.0)
        assert stale.history_id == first.history_id
        assert store.latest_attempt("c1", 42) == reused
        assert store.get_attempt(first.id) == first
        assert store.get_attempt(999) is None
        assert store.latest_attempt("c1", 7) is None


def test_resolve_attempt_is_idempotent_and_type_checked() -> None:
    with fresh_store() as store:
        a = store.resolve_attempt(job(5), seen_at=1.0)
        assert store.resolve_attempt(job(5), seen_at=99.0) == a  # first sighting kept
        with pytest.raises(TypeError, match="JobAttempt"):
            store.resolve_attempt(("c1", 42, 5, 0))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="seen_at"):
            store.resolve_attempt(job(6), seen_at=-1.0)


@st.composite
def slurm_history(draw: st.DrawFn, job_id: int, start: int) -> list[JobAttempt]:
    """What the controller may see of one job: each requeue shows first the new restart
    count with the old submit time (maybe), then the moved submit time; views may repeat."""
    views = [JobAttempt("c1", job_id, start, 0)]
    submit = start
    for restarts in range(1, draw(st.integers(0, 4)) + 1):
        if draw(st.booleans()):
            views.append(JobAttempt("c1", job_id, submit, restarts))
        submit += draw(st.integers(0, 300))
        views.append(JobAttempt("c1", job_id, submit, restarts))
        if draw(st.booleans()):
            views.append(draw(st.sampled_from(views)))  # a repeated or late view
    return views


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_reused_job_id_never_shares_history(data: st.DataObject) -> None:
    old = data.draw(slurm_history(42, 1000), label="old job")
    gap = data.draw(st.integers(1, 10_000), label="gap")
    new_start = max(a.submit_time for a in old) + gap
    new = data.draw(slurm_history(42, new_start), label="new job")
    with fresh_store() as store:
        old_records = [store.resolve_attempt(a, seen_at=1.0) for a in old]
        new_records = [store.resolve_attempt(a, seen_at=2.0) for a in new]
        old_histories = {r.history_id for r in old_records}
        new_histories = {r.history_id for r in new_records}
        assert len(old_histories) == 1 and len(new_histories) == 1
        assert old_histories.isdisjoint(new_histories)
        for records, views in ((old_records, old), (new_records, new)):
            history = store.history(records[0].history_id)
            counts = [a.attempt.restart_count for a in history]
            assert counts == sorted(set(counts))  # one record per attempt, in order
            assert counts[-1] == max(v.restart_count for v in views)
        latest = store.latest_attempt("c1", 42)
        assert latest is not None and latest.history_id in new_histories
        assert latest.attempt.restart_count == max(v.restart_count for v in new)
