"""Progress evidence -> HANG incidents, and what the core advises for them."""

from __future__ import annotations

from slurm_recovery.decide.advise import advise
from slurm_recovery.decide.attribute import attribute
from slurm_recovery.decide.hang import hang_incidents, progress_samples
from slurm_recovery.decide.model import Action, ClusterView, Evidence, FaultClass, IncidentKind
from slurm_recovery.decide.policy import policy_from_toml
from slurm_recovery.scheduler.base import Job, Node
from slurm_recovery.signals.xid import load_xid_catalogue

POLICY = policy_from_toml(
    '[hang]\nfloor = "5s"\nceiling = "1m"\ninterval_multiple = 3.0\nstartup_grace = "1m"\n'
)
START = 1_000


def job(state="RUNNING") -> Job:
    return Job(
        job_id=7,
        name="t",
        state=state,
        reason="",
        user="u",
        partition="p",
        nodes=("n1", "n2"),
        num_nodes=2,
        submit_time=900,
        restart_count=0,
        start_time=START,
    )


def progress(ev_id: int, ts: float, step: int, rank: int = 0) -> Evidence:
    return Evidence(
        ev_id,
        "sidecar",
        "progress",
        ts + 0.5,
        node="n1",
        job_id=7,
        payload={"step": step, "rank": rank, "ts": ts, "origin": "log"},
    )


def view(now: float, state="RUNNING") -> ClusterView:
    return ClusterView(
        now=now,
        jobs={7: job(state)},
        nodes={n: Node(n, "ALLOCATED", partitions=("p",)) for n in ("n1", "n2")},
    )


STEADY = [progress(i, START + 10 + i, step=i) for i in range(1, 11)]  # one step a second


def test_samples_use_the_time_the_step_was_reached():
    samples = progress_samples([*STEADY, Evidence(99, "sidecar", "xid", 1.0, node="n1")], 7)
    assert [s.step for s in samples] == list(range(1, 11))
    assert samples[0].ts == START + 11 and samples[0].rank == 0


def test_a_job_that_keeps_stepping_is_not_hung():
    assert hang_incidents(view(START + 21), STEADY, set(), POLICY) == []


def test_a_stall_past_the_deadline_is_a_hang_incident():
    (incident,) = hang_incidents(view(START + 20 + 6), STEADY, set(), POLICY)
    assert incident.kind is IncidentKind.HANG and incident.job_id == 7
    assert incident.failed_at <= START + 26 and incident.failed_at >= START + 20
    assert incident.trigger_ids and "10" in incident.summary
    verdict = attribute(incident, job(), STEADY, load_xid_catalogue(), POLICY)
    assert verdict.fault_class is FaultClass.UNKNOWN and verdict.nodes == frozenset()
    advice = advise(incident, verdict, job(), POLICY, view(START + 26), 0)
    assert advice.action is Action.REQUEUE and incident.summary in advice.reason


def test_jobs_without_progress_or_not_running_or_known_are_not_judged():
    assert hang_incidents(view(START + 600), [], set(), POLICY) == []
    assert hang_incidents(view(START + 600, state="PENDING"), STEADY, set(), POLICY) == []
    assert hang_incidents(view(START + 600), STEADY, {(7, 0)}, POLICY) == []


def test_flight_recorder_dumps_name_the_rank_that_never_entered_the_collective():
    from pathlib import Path

    from slurm_recovery.signals.flight_recorder import evidence_payload, read_dump

    folder = Path(__file__).parent / "data" / "flight_recorder" / "hang"
    dumps = []
    for rank in range(4):
        trace = read_dump(folder / f"nccl_trace_rank_{rank}")
        assert trace is not None
        payload = evidence_payload(trace) | {"restart_count": 0}
        node = "n1" if rank < 2 else "n2"
        dumps.append(
            Evidence(100 + rank, "sidecar", "flight_recorder", START + 21, node, job_id=7,
                     payload=payload)
        )  # fmt: skip
    other_attempt = Evidence(
        200, "sidecar", "flight_recorder", START + 21, "n1", job_id=7,
        payload=dumps[0].payload | {"restart_count": 1, "rank": 3},
    )  # fmt: skip
    (incident,) = hang_incidents(view(START + 26), [*STEADY, *dumps, other_attempt], set(), POLICY)
    assert "flight recorder: rank 0 on n1, rank 1 on n1, rank 2 on n2 wait in" in incident.summary
    assert "never entered it: rank 3 on n2" in incident.summary
    assert {100, 101, 102, 103} <= set(incident.trigger_ids) and 200 not in incident.trigger_ids
