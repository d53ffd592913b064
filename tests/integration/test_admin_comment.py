"""The site's AdminComment survives the tool on the real cluster (issue 16, item 8): the tool
adds and removes only its own tagged part, within what slurmctld accepts."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from slurm_recovery.holdmark import SLURM_MAX, hold_mark, parse_hold_mark, without_tool_text
from slurm_recovery.scheduler.base import InvalidRequest, SchedulerError, earliest_restart
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.watchdog import released_note, sweep
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster

SITE = "billing=projX;ticket=INC-4711"
INCIDENT = 7


@pytest.fixture
def scheduler(local_cluster) -> ScontrolScheduler:
    return ScontrolScheduler(timeout=5.0, slurm_conf=str(local_cluster.slurm_conf))


def scontrol_comment(slurm_env: dict[str, str], job_id: int, comment: str):
    return subprocess.run(
        ["scontrol", "update", f"JobId={job_id}", f"AdminComment={comment}"],
        env=slurm_env,
        capture_output=True,
        text=True,
    )


def running_job(scheduler: ScontrolScheduler, submit, *args: str) -> int:
    job_id = submit("-N1", *args, "--wrap=sleep 600")
    wait_for(lambda: scheduler.get_job(job_id).state == "RUNNING")
    return job_id


def test_slurm_stores_a_comment_as_long_as_the_tool_allows(scheduler, submit, slurm_env):
    """slurmctld sets no limit of its own on update; the tool's bound is accounting's column."""
    job_id = running_job(scheduler, submit)
    assert scontrol_comment(slurm_env, job_id, "a" * SLURM_MAX).returncode == 0
    assert scheduler.get_job(job_id).admin_comment == "a" * SLURM_MAX


def test_the_watchdog_release_keeps_the_site_comment(scheduler, submit, slurm_env, tmp_path: Path):
    job_id = running_job(scheduler, submit)  # (sbatch has no --admin-comment before 23.11)
    assert scontrol_comment(slurm_env, job_id, SITE).returncode == 0
    until = int(time.time()) - 60
    scheduler.set_admin_comment(job_id, hold_mark(INCIDENT, until))  # as the loop marks it
    marked = scheduler.get_job(job_id).admin_comment
    assert marked == f"{SITE} [{hold_mark(INCIDENT, until)}]"
    requeued_at = time.time()
    scheduler.requeue_hold(job_id)
    wait_for(lambda: (j := scheduler.get_job(job_id)).state == "PENDING" and j.held)
    time.sleep(max(0.0, earliest_restart(requeued_at) - time.time()))

    (released,) = sweep(scheduler, now=time.time(), spool=tmp_path)
    job = wait_for(lambda: (j := scheduler.get_job(job_id)).state == "RUNNING" and j, timeout=20)
    assert job.admin_comment == f"{SITE} [{released_note(released)}]"
    assert parse_hold_mark(job.admin_comment) is None


def test_cancel_keeps_the_site_comment(scheduler, submit, slurm_env):
    job_id = running_job(scheduler, submit)
    assert scontrol_comment(slurm_env, job_id, SITE).returncode == 0
    scheduler.cancel(job_id, "application fault: CUDA illegal memory access on rank 3")
    job = wait_for(lambda: (j := scheduler.get_job(job_id)).state == "CANCELLED" and j)
    assert job.admin_comment == (
        f"{SITE} [srecovery: cancelled: application fault: CUDA illegal memory access on rank 3]"
    )
    assert without_tool_text(job.admin_comment) == SITE


def test_a_full_site_comment_is_never_cut_for_the_tool(scheduler, submit, slurm_env):
    site = "c" * (SLURM_MAX - 40)
    job_id = running_job(scheduler, submit)
    assert scontrol_comment(slurm_env, job_id, site).returncode == 0
    scheduler.set_admin_comment(job_id, "srecovery: requeued after incident 7, excluding n2")
    comment = scheduler.get_job(job_id).admin_comment
    assert comment.startswith(site + " [srecovery: requeued") and len(comment) <= SLURM_MAX
    full = "d" * (SLURM_MAX - 10)
    assert scontrol_comment(slurm_env, job_id, full).returncode == 0
    with pytest.raises(InvalidRequest):  # no room for the mark: refused, nothing written
        scheduler.set_admin_comment(job_id, hold_mark(INCIDENT, time.time()))
    assert scheduler.get_job(job_id).admin_comment == full
    assert issubclass(InvalidRequest, SchedulerError)
