"""A job's own recovery settings (SPANK options) from its job_start, and what they change."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.decide.hang import hang_incidents
from slurm_recovery.decide.jobsettings import (
    JobSettings,
    job_settings,
    policy_for_job,
    settings_from_payload,
)
from slurm_recovery.decide.model import ClusterView, Evidence, Mode
from slurm_recovery.decide.policy import policy_from_toml
from slurm_recovery.scheduler.base import Job, Node

POLICY = policy_from_toml(
    'mode = "act"\nmax_restarts = 3\n[partitions.gpu]\nmode = "act"\n'
    '[hang]\nfloor = "5s"\nceiling = "10m"\ninterval_multiple = 3.0\n'
)


def start(ev_id: int, job_id: int, at: float, **recovery) -> Evidence:
    return Evidence(
        ev_id, "hook", "job_start", at, node="n1", job_id=job_id, payload={"recovery": recovery}
    )


def test_the_latest_job_start_with_settings_wins_and_bad_values_fall_back():
    found = job_settings(
        [
            start(1, 7, 10.0, mode="monitor", max_restarts=1),
            start(2, 7, 20.0, mode="off", hang_timeout=90),
            start(3, 8, 5.0, mode="sideways", max_restarts=-1, hang_timeout="soon"),
            Evidence(4, "hook", "job_start", 30.0, node="n1", job_id=9, payload={}),
        ]
    )
    assert found[7] == JobSettings(mode="off", hang_timeout=90.0)
    assert found[8] == JobSettings()  # nonsense: the defaults, never an error
    assert 9 not in found


def test_monitor_and_max_restarts_change_only_this_jobs_policy():
    policy = policy_for_job(POLICY, JobSettings(mode="monitor", max_restarts=0))
    assert policy.mode_for("gpu") is Mode.MONITOR and policy.mode_for("other") is Mode.MONITOR
    assert policy.max_restarts == 0
    assert POLICY.mode_for("gpu") is Mode.ACT and POLICY.max_restarts == 3
    assert policy_for_job(POLICY, JobSettings(mode="auto")) == POLICY
    assert policy_for_job(POLICY, None) is POLICY


def test_the_jobs_hang_timeout_replaces_the_adaptive_deadline():
    job = Job(
        job_id=7, name="t", state="RUNNING", reason="", user="u", partition="gpu",
        nodes=("n1",), num_nodes=1, submit_time=900, restart_count=0, start_time=1000,
    )  # fmt: skip
    steps = [
        Evidence(i, "sidecar", "progress", 1000 + i, node="n1", job_id=7,
                 payload={"step": i, "ts": 1000 + i, "origin": "log"})
        for i in range(1, 11)
    ]  # fmt: skip
    view = ClusterView(now=1030, jobs={7: job}, nodes={"n1": Node("n1", "ALLOCATED")})
    assert hang_incidents(view, steps, set(), POLICY)  # adaptive: 3 x 1 s, floor 5 s
    assert hang_incidents(view, steps, set(), POLICY, {7: 60.0}) == []  # its own: 60 s


@given(st.dictionaries(st.text(max_size=12), st.one_of(st.none(), st.integers(), st.text(),
                                                       st.floats(), st.booleans())))  # fmt: skip
def test_any_payload_gives_valid_settings(raw):
    settings = settings_from_payload(raw)
    assert settings.mode in ("auto", "monitor", "off")
    assert settings.max_restarts is None or 0 <= settings.max_restarts <= 100
    assert settings.hang_timeout is None or settings.hang_timeout > 0
