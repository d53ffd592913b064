"""``srecovery demo``, the quickstart, run for real: the `srecovery dev up` stack in a base of
its own on ports of its own, every stage's outcome checked in its output (and, with ``--keep``,
in Slurm itself), then ``srecovery demo down`` leaves nothing of it running."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_recovery import localcluster
from slurm_recovery.cli import cli
from slurm_recovery.cli.demo import TRAIN_PY
from slurm_recovery.contract import hostlist
from slurm_recovery.scheduler.scontrol import ScontrolScheduler

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

NODES = 4


def _ports(count: int) -> int:
    """A block of ``count`` free loopback ports in the demo tests' range."""
    return localcluster.free_port_block(count, start=19000, stop=20000)


def _srecovery(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slurm_recovery.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/tmp",
    )


def _of_base(base: Path) -> list[str]:
    """Processes that belong to the demo in ``base``: its path in their command line (munged,
    slurmctld, slurmd, controller, sidecars, watchdog, the job's own processes), or, for
    slurmstepd, in their SLURM_CONF."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        conf = [e for e in env if e.startswith(b"SLURM_CONF=") and str(base).encode() in e]
        if str(base) in cmd or (cmd.startswith("slurmstepd") and conf):
            found.append(f"{entry.name}: {cmd.strip()}")
    return found


def _one(pattern: str, text: str) -> re.Match:
    found = re.search(pattern, text, re.M)
    assert found, f"no line matching {pattern!r} in the demo's output:\n{text}"
    return found


def test_the_training_script_resumes_from_its_checkpoint_and_has_its_bug(tmp_path):
    """The demo's stand-in trainer, outside Slurm: checkpoints, resumes, and its bug is a
    traceback whose last line the python.exception signature takes."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN_PY)
    ckpt = str(tmp_path / "ckpt.json")

    def train(*args: str, attempt: int = 0) -> subprocess.CompletedProcess:
        env = {**os.environ, "SLURM_RESTART_COUNT": str(attempt), "SLURM_JOB_NODELIST": "n1"}
        env.pop("SRECOVERY_PROGRESS_FILE", None)
        argv = [sys.executable, str(script), "--ckpt", ckpt, "--step-time", "0", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)

    first = train("--steps", "7")
    assert first.returncode == 0 and "attempt 0 on n1: no checkpoint" in first.stdout
    assert json.loads(Path(ckpt).read_text())["step"] == 5
    second = train("--steps", "12", attempt=1)
    assert "attempt 1 on n1: resumed from checkpoint at step 5" in second.stdout
    Path(ckpt).unlink()
    bug = train("--bug-at-step", "3")
    assert bug.returncode == 1
    assert bug.stderr.splitlines()[-1] == "KeyError: 'sample_2'", bug.stderr


def test_demo_refuses_a_base_munged_cannot_reach(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    result = CliRunner().invoke(cli, ["demo", "--base", str(private / "demo")], obj={})
    assert result.exit_code == 1
    assert "stage 0 (the stack and a training job) failed" in result.output
    assert "munged runs as user munge and cannot reach" in result.output


def test_a_stage_that_fails_names_itself_and_stops_what_it_started():
    """The controller cannot listen (its port is taken): exit 1, the stage named, the logs
    pointed to, and nothing of the demo left running."""
    base = Path(tempfile.mkdtemp(prefix="srecovery-demo-"))
    base.chmod(0o755)
    port = _ports(NODES + 2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + NODES + 1))
        taken.listen()
        run = _srecovery(
            "demo",
            "--base",
            str(base),
            "--port-base",
            str(port),
            "--api-port",
            str(port + NODES + 1),
        )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "stage 0 (the stack and a training job) failed: the controller" in out, out
    assert f"logs of every daemon: {base / 'log'}" in out and "demo finished" not in out
    assert _of_base(base) == []
    shutil.rmtree(base)


def test_demo_shows_every_stage_and_down_leaves_nothing_running():
    base = Path(tempfile.mkdtemp(prefix="srecovery-demo-"))
    base.chmod(0o755)
    port = _ports(NODES + 2)
    try:
        run = _srecovery(
            "demo",
            "--keep",
            "--nodes",
            str(NODES),
            "--gpus-per-node",
            "4",
            "--base",
            str(base),
            "--port-base",
            str(port),
            "--api-port",
            str(port + NODES + 1),
        )
        out = run.stdout + run.stderr
        print(out)  # the whole narrative, for the record (pytest -s)
        assert run.returncode == 0, out
        assert "Traceback" not in out, out

        # 0: the stack and a job that checkpoints and reports progress
        _one(r"ok Slurm cluster srdev: slurmctld \+ 4 slurmd .* 4 simulated GPUs", out)
        _one(
            r"ok training: checkpoint at step [1-9]\d*; each rank's progress\.report\(\) is in", out
        )

        # 1: monitor mode: advice shown, Slurm untouched
        monitor = out.split("1. monitor mode", 1)[1].split("2. act mode", 1)[0]
        _one(r"srecovery sim inject --node n\d --gpu 1 --xid 79", monitor)
        bad1 = _one(r"verdict: hardware on (n\d), confidence 0\.95", monitor).group(1)
        _one(rf"advice \(monitor mode\): xid 79 .* requeue excluding {bad1}", monitor)
        _one(rf"outcome: monitor: would requeue job \d+ excluding {bad1}, drain {bad1}", monitor)
        untouched = _one(
            r"ok Slurm untouched: job (\d+) still RUNNING on (\S+) \(restart count 0\), "
            r"(n\d) not drained",
            monitor,
        )
        assert untouched.group(3) == bad1 and bad1 in hostlist.expand(untouched.group(2))
        assert "no scheduler action recorded" in monitor

        # 2: act mode: the mode command, then detection, drain, exclusion, requeue, resume
        act = out.split("2. act mode", 1)[1].split("3. an application bug", 1)[0]
        _one(r"\$ srecovery mode act --yes --reason 'quickstart demo'", act)
        _one(r"the default mode: monitor -> act \(override\)", act)
        _one(r"advice \(act mode\): xid 79 .* requeue excluding (n\d)", act)
        for milestone in ("detected", "attributed", "requeued and held", "released"):
            _one(rf"^\s+\+\d+\.\d{{3}} s  {milestone}", act)
        _one(r"^\s+\+\d+\.\d{3} s  drain n\d: ok", act)
        _one(r"^\s+\+\d+\.\d{3} s  running again", act)
        _one(r"^\s+\+\d+\.\d{3} s  job log: resumed from checkpoint at step [1-9]", act)
        again = _one(
            r"ok job (\d+) RUNNING again on (\S+) \(restart count 1, excludes (\S+)\), "
            r"resumed from its checkpoint at step (\d+)",
            act,
        )
        job_b, nodes_b, excluded, step = again.groups()
        bad2 = _one(r"ok (n\d) drained for everyone, in `sinfo -R`: 'srecovery:", act).group(1)
        assert bad2 not in hostlist.expand(nodes_b) and bad2 in hostlist.expand(excluded)
        assert int(step) > 0
        _one(r"detection \d+ ms, recovery action .*, failure -> running again", act)

        # 3: the application bug: stopped, with a reason, no node blamed
        bug = out.split("3. an application bug", 1)[1]
        _one(r"ok incident \d+ \((crash|app_fault)\) opened", bug)
        _one(r"job log: KeyError: 'sample_\d+'", bug)
        _one(r"verdict: application, nodes -$", bug)
        _one(r"advice \(act mode\): log: python\.exception: stop \(application fault", bug)
        stopped = _one(
            r"ok job (\d+) stopped \((FAILED|CANCELLED), not requeued\); no node blamed", bug
        )
        job_c = stopped.group(1)

        # the pointers, the exports of the kept stack, the total time
        for pointer in (f"srecovery explain {job_b}", "srecovery console", "docs/quickstart.md"):
            assert pointer in out
        conf = _one(r"^export SLURM_CONF=(\S+)$", out).group(1)
        _one(r"^export SRECOVERY_URL=http://127\.0\.0\.1:\d+$", out)
        seconds = int(_one(r"demo finished in (\d+) s", out).group(1))
        print(f"demo took {seconds} s")
        assert seconds < 240, f"the demo took {seconds} s (target: under 120 s on a quiet machine)"

        # the kept stack agrees with what the demo said
        sched = ScontrolScheduler(timeout=10, slurm_conf=conf)
        job = sched.get_job(int(job_b))
        assert job.state == "RUNNING" and job.restart_count == 1, job
        assert bad2 not in job.nodes and bad2 in job.excluded_nodes, job
        assert sched.get_node(bad2).drained
        assert sched.get_job(int(job_c)).restart_count == 0
        told = subprocess.run(
            [sys.executable, "-m", "slurm_recovery.cli", "explain", job_b],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "SRECOVERY_CONFIG": str(base / "config.toml")},
        )
        assert told.returncode == 0 and "restarted on" in told.stdout, told.stdout + told.stderr
    finally:
        down = _srecovery("demo", "down", "--base", str(base), timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped controller" in down.stdout and "stopped slurmctld" in down.stdout
    assert _of_base(base) == []
    again = _srecovery("demo", "down", "--base", str(base), timeout=180)
    assert again.returncode == 0 and "nothing running" in again.stdout
    assert not localcluster.any_running(
        localcluster.ClusterSpec.from_json(
            json.loads((base / "cluster" / localcluster.STATE_FILE).read_text())["spec"]
        )
    )
    shutil.rmtree(base)  # kept when a check failed, for its logs
