"""`srecovery dev up` when its controller cannot start: nothing is left running."""

from __future__ import annotations

import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from slurm_recovery import devstack, localcluster
from tests.conftest import _free_port_block

pytestmark = pytest.mark.cluster


def test_a_controller_that_cannot_start_stops_the_whole_stack(local_cluster):
    base = Path(tempfile.mkdtemp(prefix="srecovery-devfail-"))
    port = _free_port_block(7, start=local_cluster.port_base + 1950)
    with socket.socket() as taken:  # the controller's port is someone else's
        taken.bind(("127.0.0.1", port + 6))
        taken.listen()
        with pytest.raises(localcluster.ClusterError, match="stack stopped, logs in"):
            devstack.up(base, nodes=2, port_base=port, api_port=port + 6)
    left = subprocess.run(["pgrep", "-f", str(base)], capture_output=True, text=True)
    assert left.stdout == "", f"still running: {left.stdout}"
    assert "address already in use" in (base / "log" / "controller.log").read_text()
