"""The SPANK plugin (spank/slurm_recovery.c) on a real local cluster: built here with
spank/build, loaded by sbatch, srun and slurmstepd through ``PlugStackConfig``, with the node
Prolog/Epilog of docs/hooks.md. Bad option values are refused at submission; good ones and the
plugstack.conf defaults reach the Prolog's ``job_start`` event (``payload.recovery``) through
Slurm's job control environment, and the tasks' environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_recovery import devstack, hooks, localcluster
from slurm_recovery.contract.spool import read_spooled
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from tests.conftest import SLURM_PREFIX, _free_port_block, wait_for

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "spank" / "build"
#: The headers of the Slurm under test: a plugin built for another release is refused.
SLURM_INCLUDE = Path(SLURM_PREFIX or "/usr") / "include"
SPANK_H = SLURM_INCLUDE / "slurm" / "spank.h"
NODES = 2
OPTIONS = (
    "--recovery=",
    "--recovery-max-restarts=",
    "--recovery-hang-timeout=",
    "--recovery-progress=",
)


def build_plugin(out: Path) -> Path:
    """spank/build into ``out``; fails (never skips) when the compiler or headers are missing."""
    missing = [
        name
        for name, ok in (("gcc", shutil.which("gcc")), (str(SPANK_H), SPANK_H.exists()))
        if not ok
    ]
    if missing:
        pytest.fail(
            f"building the SPANK plugin needs {' and '.join(missing)}: apt install gcc libslurm-dev"
        )
    done = subprocess.run(
        [str(BUILD), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_INCLUDE": str(SLURM_INCLUDE)},
    )
    if done.returncode != 0:
        pytest.fail(f"spank/build failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    plugin = out / "slurm_recovery.so"
    assert plugin.is_file()
    return plugin


@dataclass
class SpankCluster:
    spec: localcluster.ClusterSpec
    base: Path
    scheduler: ScontrolScheduler

    @property
    def env(self) -> dict[str, str]:
        return localcluster.slurm_env(self.spec)

    def sbatch(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sbatch", "--parsable", *args],
            env=self.env,
            capture_output=True,
            text=True,
            cwd="/tmp",
        )

    def run_job(self, *args: str) -> tuple[int, str]:
        """Submit, wait until it ends COMPLETED; (job id, the job's output)."""
        out = self.base / "out"
        done = self.sbatch(f"--output={out}/%j.out", *args)
        assert done.returncode == 0, done.stderr
        job_id = int(done.stdout.strip().split(";")[0])

        def finished() -> str | None:
            state = self.scheduler.get_job(job_id).state
            return state if state in ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL") else None

        assert wait_for(finished, timeout=60) == "COMPLETED"
        return job_id, (out / f"{job_id}.out").read_text()

    def job_start(self, job_id: int) -> dict:
        """The Prolog's job_start event for the job, from its node's sidecar spool."""
        (node,) = self.scheduler.get_job(job_id).nodes

        def starts() -> list[dict]:
            spool = self.base / "spool" / node
            return [
                e
                for e in read_spooled(spool)
                if e.get("job_id") == job_id and e["kind"] == "job_start"
            ]

        (event,) = wait_for(starts, timeout=10)
        return event


@pytest.fixture(scope="module")
def cluster() -> Iterator[SpankCluster]:
    base = Path(tempfile.mkdtemp(prefix="srecovery-spank-"))
    base.chmod(0o755)  # munged (user munge) must reach its socket directory inside
    plugin = build_plugin(base / "plugin")
    plugstack = base / "plugstack.conf"
    plugstack.write_text(f"optional {plugin} default=monitor max_restarts=2\n")
    (base / "out").mkdir()
    port_base = _free_port_block(NODES + 1)
    spec = localcluster.ClusterSpec(
        base=base / "cluster", nodes=NODES, port_base=port_base, name="srspank"
    )
    devstack.write_policy(base / "policy.toml", "monitor")
    config = devstack.write_config(base, spec, _free_port_block(1, start=port_base + 400))
    wrappers = hooks.write_hook_wrappers(base / "hooks", config)
    spec.extra_conf = [*hooks.slurm_conf_lines(wrappers), f"PlugStackConfig={plugstack}"]
    try:
        localcluster.up(spec)
        yield SpankCluster(
            spec=spec,
            base=base,
            scheduler=ScontrolScheduler(timeout=10, slurm_conf=str(spec.slurm_conf)),
        )
    finally:
        localcluster.down(spec.base)


def test_sbatch_help_lists_the_four_options(cluster):
    done = subprocess.run(["sbatch", "--help"], env=cluster.env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    plugins = done.stdout.split("Options provided by plugins:", 1)[1]
    for option in OPTIONS:
        assert option in plugins
    assert "auto|monitor|off" in plugins


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            "--recovery=bogus",
            "--recovery=bogus: invalid value; accepted values: auto, monitor, off",
        ),
        ("--recovery-hang-timeout=5x", "--recovery-hang-timeout=5x: invalid value"),
        ("--recovery-hang-timeout=5s", "a duration from 10s to 24h"),
        ("--recovery-hang-timeout=25h", "a duration from 10s to 24h"),
        ("--recovery-max-restarts=101", "a whole number from 0 to 100"),
        ("--recovery-max-restarts=-1", "--recovery-max-restarts=-1: invalid value"),
        ("--recovery-progress=step [0-9]+", "has no capture group"),
        ("--recovery-progress=step ([0-9]+", "does not compile"),
        ("--recovery-progress=(" + "x" * 512 + ")", "longer than 512 characters"),
    ],
)
def test_a_bad_value_is_refused_at_submission(cluster, option, message):
    done = cluster.sbatch(option, "--wrap=true")
    assert done.returncode != 0
    assert done.stdout.strip() == ""  # no job id: nothing was submitted
    assert "sbatch: error: slurm_recovery: " + option.split("=")[0] in done.stderr
    assert message in done.stderr


def test_the_jobs_settings_reach_the_prolog_event_and_the_tasks(cluster):
    job_id, output = cluster.run_job(
        "--recovery=off",
        "--recovery-max-restarts=1",
        "--recovery-hang-timeout=2m",
        "--recovery-progress=step ([0-9]+)",
        "--wrap=env | grep ^SRECOVERY_RECOVERY_ | sort",
    )
    event = cluster.job_start(job_id)
    assert event["payload"]["context"] == "prolog"
    assert event["payload"]["recovery"] == {
        "mode": "off",
        "max_restarts": 1,
        "hang_timeout": 120,
        "progress": "step ([0-9]+)",
    }
    assert output.splitlines() == [
        "SRECOVERY_RECOVERY_HANG_TIMEOUT=120",
        "SRECOVERY_RECOVERY_MAX_RESTARTS=1",
        "SRECOVERY_RECOVERY_MODE=off",
        "SRECOVERY_RECOVERY_PROGRESS=step ([0-9]+)",
    ]


def test_the_plugstack_defaults_apply_without_options(cluster):
    job_id, output = cluster.run_job("--wrap=env | grep ^SRECOVERY_RECOVERY_ | sort")
    assert cluster.job_start(job_id)["payload"]["recovery"] == {
        "mode": "monitor",
        "max_restarts": 2,
    }
    assert output.splitlines() == [
        "SRECOVERY_RECOVERY_MAX_RESTARTS=2",
        "SRECOVERY_RECOVERY_MODE=monitor",
    ]


def test_an_option_overrides_one_default_and_keeps_the_other(cluster):
    job_id, _ = cluster.run_job("--recovery=auto", "--recovery-hang-timeout=1h30m", "--wrap=true")
    assert cluster.job_start(job_id)["payload"]["recovery"] == {
        "mode": "auto",
        "max_restarts": 2,
        "hang_timeout": 5400,
    }


def test_the_prolog_drops_settings_that_are_not_valid():
    """What the plugin let through is checked again in Python (a hand-set or older plugin)."""
    env = {
        "SLURM_JOB_ID": "7",
        "SPANK_SRECOVERY_RECOVERY_MODE": "sometimes",
        "SPANK_SRECOVERY_RECOVERY_MAX_RESTARTS": "101",
        "SPANK_SRECOVERY_RECOVERY_HANG_TIMEOUT": "9",
        "SPANK_SRECOVERY_RECOVERY_PROGRESS": "step [0-9]+",
    }
    assert "recovery" not in hooks.build_event("prolog", env, 0.0, node="n1")["payload"]
    env["SPANK_SRECOVERY_RECOVERY_HANG_TIMEOUT"] = "86400"
    env["SPANK_SRECOVERY_RECOVERY_PROGRESS"] = "(x" + "y" * 511
    assert hooks.recovery_settings(env) == {"hang_timeout": 86400}
    assert "recovery" not in hooks.build_event("epilog", env, 0.0, node="n1")["payload"]
