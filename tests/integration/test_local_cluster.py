"""scripts/local-cluster: up is idempotent, two clusters never clash, down leaves nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from slurm_recovery import localcluster
from tests.conftest import _free_port_block, wait_for

pytestmark = pytest.mark.cluster
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local-cluster"


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=check
    )


def processes_with_conf(conf: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"SLURM_CONF={conf}".encode() in env:
                found.append(int(entry.name))
    return found


def test_lifecycle_beside_the_session_cluster(local_cluster, slurm_env):
    base = Path(tempfile.mkdtemp(prefix="srecovery-lc-"))
    base.chmod(0o755)
    port = _free_port_block(3, start=local_cluster.port_base + 100)
    common = ["--base", str(base)]
    try:
        first = run(*common, "up", "--nodes", "2", "--port-base", str(port), "--name", "lc")
        conf = base / "etc" / "slurm.conf"
        assert first.stdout.strip() == f"export SLURM_CONF={conf}"
        status = json.loads(run(*common, "status").stdout)
        assert all(p["running"] for p in status["processes"].values())
        assert sorted(status["processes"]) == ["munged", "slurmctld", "slurmd:n1", "slurmd:n2"]
        assert status["nodes"] == {"n1": "idle", "n2": "idle"}

        again = run(*common, "up", "--nodes", "2", "--port-base", str(port), "--name", "lc")
        assert again.returncode == 0
        assert json.loads(run(*common, "status").stdout)["processes"] == status["processes"]

        clash = run(*common, "up", "--nodes", "3", "--port-base", str(port), check=False)
        assert clash.returncode == 1 and "run `down" in clash.stderr
        assert run(*common, "env").stdout.strip() == f"export SLURM_CONF={conf}"

        env = {**os.environ, "SLURM_CONF": str(conf)}
        job = subprocess.run(
            ["sbatch", "--parsable", "-N2", "--wrap=sleep 600"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd="/tmp",
        ).stdout.strip()
        wait_for(
            lambda: (
                subprocess.run(
                    ["squeue", "-h", "-j", job, "-o", "%T"],
                    env=env,
                    capture_output=True,
                    text=True,
                ).stdout.strip()
                == "RUNNING"
            )
        )
        ours = processes_with_conf(conf)
        assert len(ours) >= 5  # slurmctld, 2 slurmd, slurmstepd(s), the job's shell

        stopped = run(*common, "down").stdout
        assert "stopped slurmctld" in stopped and "stopped munged" in stopped
        pids = [p["pid"] for p in status["processes"].values()]
        assert not [p for p in pids if localcluster.process_alive(p, "")]
        assert processes_with_conf(conf) == []
        # the session's cluster was never touched
        nodes = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N"], env=slurm_env, capture_output=True, text=True
        ).stdout.split()
        assert len(nodes) == local_cluster.nodes
    finally:
        run(*common, "down", check=False)
    assert run(*common, "down").stdout == ""  # down twice is harmless


def test_dev_stack_up_and_down(local_cluster):
    from slurm_recovery import devstack

    base = Path(tempfile.mkdtemp(prefix="srecovery-dev-"))
    base.chmod(0o755)
    port = _free_port_block(6, start=local_cluster.port_base + 600)
    up = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_recovery.cli",
            "dev",
            "--base",
            str(base),
            "up",
            "--mode",
            "act",
            "--nodes",
            "2",
            "--port-base",
            str(port),
            "--api-port",
            str(port + 4),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert up.returncode == 0, up.stderr
        exports = dict(
            line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines()
        )
        assert exports["SRECOVERY_URL"] == f"http://127.0.0.1:{port + 4}"
        assert exports["SLURM_CONF"] == str(base / "cluster" / "etc" / "slurm.conf")
        assert exports["SRECOVERY_CONFIG"] == str(base / "config.toml")
        state = json.loads((base / "dev.json").read_text())
        assert localcluster.process_alive(state["controller"], "slurm_recovery.controller")
        assert localcluster.process_alive(state["watchdog"], "watchdog")
        devstack.wait_healthy(exports["SRECOVERY_URL"], timeout=5)
    finally:
        down = subprocess.run(
            [sys.executable, "-m", "slurm_recovery.cli", "dev", "--base", str(base), "down"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert down.returncode == 0, down.stderr
    assert "stopped controller" in down.stdout and "stopped watchdog" in down.stdout
    assert not localcluster.process_alive(state["controller"], "")
    assert not localcluster.process_alive(state["watchdog"], "")
    assert processes_with_conf(base / "cluster" / "etc" / "slurm.conf") == []


def _munged_for(socket: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and f"--socket={socket}" in " ".join(
            localcluster._cmdline(int(entry.name))
        ):
            found.append(int(entry.name))
    return found


def test_an_up_that_fails_stops_what_it_started(local_cluster):
    """slurmctld refuses the config (a key slurm.conf does not know): `up` fails at once with
    slurmctld's own words and stops the munged it started, leaving no pid recorded; the base
    then serves a good `up`."""
    base = Path(tempfile.mkdtemp(prefix="srecovery-lc-bad-"))
    base.chmod(0o755)
    port = _free_port_block(3, start=local_cluster.port_base + 200)
    spec = localcluster.ClusterSpec(
        base=base, nodes=2, port_base=port, name="bad", extra_conf=["NoSuchSlurmKey=1"]
    )
    try:
        with pytest.raises(localcluster.ClusterError, match="it exited") as err:
            localcluster.up(spec, timeout=30)
        assert "NoSuchSlurmKey" in str(err.value)
        assert json.loads((base / "cluster.json").read_text())["pids"] == {}
        assert _munged_for(spec.munge_socket) == []
        spec.extra_conf = []
        localcluster.up(spec, timeout=60)
        assert localcluster.node_states(spec) == {"n1": "idle", "n2": "idle"}
    finally:
        localcluster.down(base)
    assert _munged_for(spec.munge_socket) == []
