"""`srecovery report` refuses bad input (issue 16, item 10) and users' text never reaches an
admin's terminal raw (item 9): the real CLI against a real controller and Slurm (dev stack)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from slurm_recovery import devstack
from slurm_recovery.contract.client import ControllerClient
from tests.conftest import _free_port_block, wait_for

pytestmark = pytest.mark.cluster

HOSTILE = "\x1b]0;pwned\x07\x1b[2J[bold]loud[/bold]"


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


def test_escape_sequences_in_a_report_reason_never_reach_the_terminal(stack):
    """(The same edge filters job output shown as evidence: tests/unit/test_cli_printable.py.)"""
    assert srecovery(stack, "report", "n3", "--reason", f"flaky {HOSTILE}").returncode == 0
    shown_escaped = False
    for args in [
        ("audit", "tail", "-n", "20"),
        ("audit", "tail", "-n", "20", "--json"),
        ("nodes", "n3"),
        ("incidents", "--since", "1h"),
        ("console", "--once"),
    ]:
        out = srecovery(stack, *args)
        shown = out.stdout + out.stderr
        assert b"\x1b" not in shown and b"\x07" not in shown, (args, shown[-2000:])
        shown_escaped |= b"^[]0;pwned^G" in shown
    assert shown_escaped, "the reason was not shown at all: nothing was tested"
