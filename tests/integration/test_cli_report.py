"""`srecovery report` refuses bad input (issue 16, item 10) and users' text never reaches an
admin's terminal raw (item 9): the real CLI against a real controller and Slurm (dev stack)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.client import ControllerClient
from tests.conftest import _free_port_block, wait_for

pytestmark = pytest.mark.cluster

HOSTILE = "\x1b]0;pwned\x07\x1b[2J[bold]loud[/bold]"
CUDA_ERROR = "RuntimeError: CUDA error: an illegal memory access was encountered"


@pytest.fixture(scope="module")
def stack(local_cluster):
    base = Path(tempfile.mkdtemp(prefix="srecovery-report-"))
    base.chmod(0o755)
    port = _free_port_block(7, start=local_cluster.port_base + 1500)
    stack = devstack.up(base, nodes=4, mode="monitor", port_base=port, api_port=port + 6)
    try:
        yield stack
    finally:
        devstack.down(base)


def srecovery(stack, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "slurm_recovery.cli", *args],
        capture_output=True,
        timeout=120,
        env={**os.environ, **stack.exports(), "COLUMNS": "200"},
        cwd="/tmp",
    )


def test_report_refuses_a_typo_a_blank_reason_and_an_unknown_job(stack):
    client = ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))
    wait_for(lambda: client.get("/v1/nodes")["nodes"], timeout=30)  # the first pass read Slurm
    for args, words in [
        (("n99", "--reason", "GPU fell off"), b"unknown node 'n99'"),
        (("n1", "--reason", "   "), b"--reason is blank"),
        (("n1", "--reason", "GPU fell off", "--job", "987654"), b"unknown job 987654"),
    ]:
        out = srecovery(stack, "report", *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert words in out.stderr
    assert srecovery(stack, "report", "n4", "--reason", "fans loud").returncode == 0


def test_users_escape_sequences_never_reach_the_terminal(stack):
    env = localcluster.slurm_env(stack.cluster)
    work = Path(tempfile.mkdtemp(prefix="srecovery-hostile-"))
    work.chmod(0o777)
    script = work / "hostile.sh"
    script.write_text(
        "#!/bin/bash\nsleep 1\n"
        f"printf '{CUDA_ERROR} \\033]0;pwned\\007 \\033[2J [bold]loud[/bold]\\n'\nexit 1\n"
    )
    since = time.time()
    job_id = int(
        subprocess.run(
            [
                "sbatch",
                "--parsable",
                "-N1",
                "--no-requeue",
                "-o",
                str(work / "%j.out"),
                str(script),
            ],
            env=env,
            cwd="/tmp",
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split(";")[0]
    )
    client = ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))

    def evidence_with_escapes():
        print("JOB", _known(client, job_id), subprocess.run(["scontrol", "show", "job", str(job_id)], env=env, capture_output=True, text=True).stdout[:300].replace("\n", " "), flush=True)
        stories = client.get(f"/v1/jobs/{job_id}")["incidents"] if _known(client, job_id) else []
        story = stories and client.get(f"/v1/incidents/{stories[0]['id']}")
        print("STORY", json.dumps(story)[:3000], flush=True)
        return story and "\x1b]0;pwned" in json.dumps(story, ensure_ascii=False)

    wait_for(evidence_with_escapes, timeout=90, interval=0.5)
    assert srecovery(stack, "report", "n3", "--reason", f"flaky {HOSTILE}").returncode == 0

    for args in [
        ("explain", str(job_id)),
        ("incidents", "--since", "1h"),
        ("nodes", "n3"),
        ("audit", "tail", "-n", "20"),
        ("console", "--once"),
    ]:
        out = srecovery(stack, *args)
        shown = out.stdout + out.stderr
        assert b"\x1b" not in shown and b"\x07" not in shown, (args, shown[-2000:])
    explained = srecovery(stack, "explain", str(job_id)).stdout
    assert b"^[]0;pwned^G" in explained
    assert since  # the evidence is this test's own


def _known(client: ControllerClient, job_id: int) -> bool:
    from slurm_recovery.client import ClientError

    try:
        client.get(f"/v1/jobs/{job_id}")
        return True
    except ClientError:
        return False
