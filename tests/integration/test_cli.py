"""srecovery CLI against the real local cluster."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from slurm_recovery.cli import EXIT_USAGE, cli

pytestmark = pytest.mark.cluster


def test_slurm_shows_the_cluster(local_cluster, tmp_path, submit):
    config = tmp_path / "config.toml"
    config.write_text(
        f'[scheduler]\nbackend = "scontrol"\nslurm_conf = "{local_cluster.slurm_conf}"\n'
    )
    config.chmod(0o644)
    job_id = submit("-N2", "--wrap=sleep 600")
    result = CliRunner().invoke(cli, ["--config", str(config), "slurm", "--json"], obj={})
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["backend"] == "scontrol" and info["cluster"] == "srtest"
    assert [n["name"] for n in info["nodes"]] == ["n1", "n2", "n3", "n4"]
    assert job_id in [j["job_id"] for j in info["jobs"]]
    table = CliRunner().invoke(cli, ["--config", str(config), "slurm"], obj={})
    assert table.exit_code == 0 and f"{job_id:>8}" in table.output


def test_bad_config_names_the_key(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[scheduler]\nbackend = "slurmrest"\n')
    config.chmod(0o644)
    result = CliRunner().invoke(cli, ["--config", str(config), "config", "check"], obj={})
    assert result.exit_code == EXIT_USAGE
    assert "scheduler.backend" in result.output and "slurmrest" in result.output
