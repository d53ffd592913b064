"""The watchdog against the real local cluster: it releases exactly the jobs the tool held past
their deadline, at once (begin time cleared), records each release, and fails open."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_recovery import localcluster
from slurm_recovery.holdmark import hold_mark
from slurm_recovery.scheduler.base import earliest_restart
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.watchdog import (
    EXIT_OK,
    EXIT_UNREACHABLE,
    RELEASES_FILE,
    read_releases,
    released_note,
    sweep,
    sweep_result,
    watchdog_command,
)
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster

TIMEOUT = 5.0  # the bound on one Slurm call in these tests
INCIDENT = 7


@pytest.fixture
def scheduler(local_cluster) -> ScontrolScheduler:
    return ScontrolScheduler(timeout=TIMEOUT, slurm_conf=str(local_cluster.slurm_conf))


@pytest.fixture
def config_file(local_cluster, tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(
        "[scheduler]\n"
        'backend = "scontrol"\n'
        f'slurm_conf = "{local_cluster.slurm_conf}"\n'
        f"command_timeout = {TIMEOUT}\n"
        "[watchdog]\n"
        f'spool_dir = "{tmp_path / "spool"}"\n'
        "interval = 0.5\n"
    )
    return path


def running(scheduler: ScontrolScheduler, job_id: int):
    job = scheduler.get_job(job_id)
    return job if job.state == "RUNNING" else None


def held(scheduler: ScontrolScheduler, job_id: int):
    job = scheduler.get_job(job_id)
    return job if job.state == "PENDING" and job.held else None


def set_admin_comment(slurm_env: dict[str, str], job_id: int, comment: str) -> None:
    subprocess.run(
        ["scontrol", "update", f"JobId={job_id}", f"AdminComment={comment}"],
        env=slurm_env,
        check=True,
        capture_output=True,
    )


def held_job(scheduler, submit, slurm_env, comment: str | None) -> int:
    """A running 1-node job, then (like the controller) the mark written and requeue-held."""
    job_id = submit("-N1", "--wrap=sleep 600")
    wait_for(lambda: running(scheduler, job_id))
    if comment is not None:
        set_admin_comment(slurm_env, job_id, comment)
    requeued_at = time.time()
    scheduler.requeue_hold(job_id)
    wait_for(lambda: held(scheduler, job_id))
    # In production the watchdog acts hold_deadline after the requeue; these tests act at once,
    # so wait out the second in which Slurm revoked the previous attempt's credential.
    time.sleep(max(0.0, earliest_restart(requeued_at) - time.time()))
    return job_id


def test_a_job_held_past_its_deadline_runs_again_at_once(scheduler, submit, slurm_env, tmp_path):
    until = int(time.time()) - 60
    job_id = held_job(scheduler, submit, slurm_env, hold_mark(INCIDENT, until))
    assert scheduler.get_job(job_id).begin_time > time.time() + 30  # Slurm's ~121 s

    started = time.monotonic()
    released = sweep(scheduler, now=time.time(), spool=tmp_path)
    assert [(r.job_id, r.incident_id, r.held_until) for r in released] == [
        (job_id, INCIDENT, until)
    ]
    again = wait_for(lambda: running(scheduler, job_id), timeout=20)
    assert time.monotonic() - started < 5, "begin time not cleared: the job waited ~2 min"
    assert again.restart_count == 1 and not again.held

    lines = (tmp_path / RELEASES_FILE).read_text().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record.pop("ts") == pytest.approx(time.time(), abs=30)
    assert record == {
        "job_id": job_id,
        "incident_id": INCIDENT,
        "held_until": until,
        "action": "released",
        "watchdog_host": os.uname().nodename,
    }

    # The mark is replaced by a note admins read in `scontrol show job`.
    assert again.admin_comment == f"[{released_note(released[0])}]"
    # Running, not held: the next sweep leaves it alone (level-triggered).
    assert sweep(scheduler, now=time.time(), spool=tmp_path) == []
    # Someone else holds it again later: not ours, it stays held. Even with our old mark
    # still on it (as if the note had not been written), the spool says the watchdog let go
    # of that hold already.
    scheduler.requeue_hold(job_id)
    wait_for(lambda: held(scheduler, job_id))
    assert sweep(scheduler, now=time.time(), spool=tmp_path) == []
    set_admin_comment(slurm_env, job_id, hold_mark(INCIDENT, until))
    assert sweep(scheduler, now=time.time(), spool=tmp_path) == []
    assert held(scheduler, job_id)
    assert len(read_releases(tmp_path)) == 1


def test_a_job_within_its_deadline_stays_held_until_it_passes(
    scheduler, submit, slurm_env, tmp_path
):
    until = int(time.time()) + 3600
    job_id = held_job(scheduler, submit, slurm_env, hold_mark(INCIDENT, until))
    assert sweep(scheduler, now=time.time(), spool=tmp_path) == []
    assert held(scheduler, job_id)
    assert not (tmp_path / RELEASES_FILE).exists()
    # One second past the deadline (as the watchdog's clock will say in an hour), it goes.
    released = sweep(scheduler, now=until + 1, spool=tmp_path)
    # an hour ahead, any other marked job still held on the shared cluster goes too
    assert job_id in [r.job_id for r in released]
    wait_for(lambda: running(scheduler, job_id), timeout=20)


def test_a_job_held_by_someone_else_stays_held(scheduler, submit, slurm_env, tmp_path):
    job_id = held_job(scheduler, submit, slurm_env, comment=None)
    try:
        assert sweep(scheduler, now=time.time(), spool=tmp_path) == []
        assert held(scheduler, job_id)
        set_admin_comment(slurm_env, job_id, "held by ops for a firmware update")
        assert sweep(scheduler, now=time.time(), spool=tmp_path) == []
        assert held(scheduler, job_id)
    finally:
        scheduler.release(job_id)
    assert not (tmp_path / RELEASES_FILE).exists()


def test_a_marked_job_that_is_not_held_is_left_alone(scheduler, submit, slurm_env, tmp_path):
    job_id = submit("-N1", "--wrap=sleep 600")
    before = wait_for(lambda: running(scheduler, job_id))
    set_admin_comment(slurm_env, job_id, hold_mark(INCIDENT, int(time.time()) - 60))
    assert sweep(scheduler, now=time.time(), spool=tmp_path) == []
    after = scheduler.get_job(job_id)
    assert (after.state, after.restart_count, after.nodes) == ("RUNNING", 0, before.nodes)


def test_slurmctld_down_the_sweep_returns_and_once_exits_3(
    scheduler, submit, slurm_env, local_cluster, config_file, tmp_path
):
    job_id = held_job(scheduler, submit, slurm_env, hold_mark(INCIDENT, int(time.time()) - 60))
    localcluster.stop_slurmctld(local_cluster.base)
    try:
        started = time.monotonic()
        result = sweep_result(scheduler, now=time.time(), spool=tmp_path)
        assert (result.released, result.unreachable) == ([], True)
        assert sweep(scheduler, now=time.time(), spool=tmp_path) == []
        assert time.monotonic() - started < 4 * TIMEOUT + 2

        cli = CliRunner().invoke(watchdog_command, ["--once"], obj={"config_path": config_file})
        assert cli.exit_code == EXIT_UNREACHABLE, cli.output
        assert "slurmctld unreachable" in cli.stderr
    finally:
        localcluster.up(local_cluster, keep_state=True)
    # Slurm is back: the next sweep does what the last could not.
    released = sweep(scheduler, now=time.time(), spool=tmp_path)
    assert [r.job_id for r in released] == [job_id]
    wait_for(lambda: running(scheduler, job_id), timeout=20)


def test_once_releases_and_logs_a_line_per_release(
    scheduler, submit, slurm_env, config_file, tmp_path
):
    job_id = held_job(scheduler, submit, slurm_env, hold_mark(INCIDENT, int(time.time()) - 60))
    cli = CliRunner().invoke(watchdog_command, ["--once"], obj={"config_path": config_file})
    assert cli.exit_code == EXIT_OK, cli.output
    assert f"released job {job_id}, held by incident {INCIDENT} past its deadline" in cli.stderr
    wait_for(lambda: running(scheduler, job_id), timeout=20)
    assert [r.job_id for r in read_releases(tmp_path / "spool")] == [job_id]
    # Nothing left to do: exit 0, nothing more written.
    cli = CliRunner().invoke(watchdog_command, ["--once"], obj={"config_path": config_file})
    assert cli.exit_code == EXIT_OK, cli.output
    assert len(read_releases(tmp_path / "spool")) == 1


def test_the_daemon_releases_a_job_whose_deadline_passes_and_stops_on_sigterm(
    scheduler, submit, slurm_env, config_file, tmp_path
):
    """The rollout check: the controller is gone while a job is held; the watchdog lets it go."""
    until = int(time.time()) + 3
    job_id = held_job(scheduler, submit, slurm_env, hold_mark(INCIDENT, until))
    log = tmp_path / "watchdog.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from slurm_recovery.watchdog import watchdog_command; watchdog_command()",
                "--interval",
                "0.5",
            ],
            env={**os.environ, "SRECOVERY_CONFIG": str(config_file)},
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=Path(__file__).resolve().parents[2],
        )
    try:
        again = wait_for(lambda: running(scheduler, job_id), timeout=30)
        assert time.time() - until < 8, "released late: deadline + interval + start-up"
        assert again.restart_count == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=2 * TIMEOUT + 5)
    text = log.read_text()
    assert code == EXIT_OK, text
    assert "watchdog started" in text and "watchdog stopped" in text
    assert text.count(f"released job {job_id}") == 1
    assert [r.job_id for r in read_releases(tmp_path / "spool")] == [job_id]
