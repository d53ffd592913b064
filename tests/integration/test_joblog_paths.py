"""The job-log follower learns the output files the hooks cannot name from the real slurmctld
(through the scheduler backend): the default ``slurm-%j.out``, a ``%x`` (job name) pattern and a
path with a space in it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from slurm_recovery.scheduler import UnknownJob
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.sidecar.sources.joblog import slurm_output_paths

pytestmark = pytest.mark.cluster


def test_slurm_names_the_default_and_the_job_name_paths(local_cluster, submit):
    work = Path(tempfile.mkdtemp(prefix="srecovery-paths-"))
    work.chmod(0o755)
    slurm = ScontrolScheduler(slurm_conf=str(local_cluster.slurm_conf))
    default = submit("--chdir", str(work), "--wrap", "sleep 30")
    named = submit("-J", "train", "-o", f"{work}/logs-%x-%j.out", "--wrap", "sleep 30")
    split = submit("-o", f"{work}/o-%j.out", "-e", f"{work}/e-%j.err", "--wrap", "sleep 30")
    spaced = submit("-J", "my run", "-o", f"{work}/my out %x.log", "--wrap", "sleep 30")
    assert slurm_output_paths(slurm, default) == {
        "stdout": f"{work}/slurm-{default}.out",
        "stderr": f"{work}/slurm-{default}.out",
    }
    assert slurm_output_paths(slurm, named)["stdout"] == (f"{work}/logs-train-{named}.out")
    assert slurm_output_paths(slurm, split) == {
        "stdout": f"{work}/o-{split}.out",
        "stderr": f"{work}/e-{split}.err",
    }
    assert slurm_output_paths(slurm, spaced) == {
        "stdout": f"{work}/my out my run.log",
        "stderr": f"{work}/my out my run.log",
    }
    with pytest.raises(UnknownJob, match="Invalid job id"):
        slurm_output_paths(slurm, 99_999_999)
