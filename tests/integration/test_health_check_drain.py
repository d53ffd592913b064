"""Issue 20, part 4: a drain by the site's health check (an NHC stand-in: a real shell script
that drains the node the way LBNL NHC does, `scontrol update ... reason="NHC: ..."`) on the
real local cluster is evidence against the node: `srecovery explain` shows it, the job's
restart excludes the node, and the tool neither resumes it nor counts it as its own."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from slurm_recovery.store import Store
from tests.conftest import wait_for, wait_passes
from tests.integration.test_controller import running, scheduler, stacks  # noqa: F401

pytestmark = pytest.mark.cluster

NHC_REASON = "NHC: check_fs_mount:  /scratch not mounted"


def srecovery(stack, *args: str) -> subprocess.CompletedProcess:
    """The real CLI, as an admin runs it, against this stack's config."""
    argv = [sys.executable, "-m", "slurm_recovery.cli", "--config", str(stack.config), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def health_check_script(folder: Path, slurm_conf: str) -> Path:
    """What NHC does when a check fails on a Slurm node: drain it with its reason, exit 1."""
    path = folder / "nhc"
    path.write_text(
        "#!/bin/sh\n"
        f"SLURM_CONF={slurm_conf}; export SLURM_CONF\n"
        f'scontrol update nodename="$1" state=drain reason="{NHC_REASON}" || exit 2\n'
        'echo "ERROR:  nhc:  Health check failed:  check_fs_mount:  /scratch not mounted" >&2\n'
        "exit 1\n"
    )
    path.chmod(0o755)
    return path


def test_an_nhc_drain_on_a_jobs_node_is_evidence_and_stays_the_health_checks(
    stacks,  # noqa: F811
    submit,
    scheduler,  # noqa: F811
    slurm_env,
):
    stack = stacks("act")
    folder = Path(tempfile.mkdtemp(prefix="srecovery-nhc-"))
    folder.chmod(0o777)  # the job (any user) leaves its flag here
    flag = folder / "fail-now"
    # the first attempt fails once told to; a restarted attempt keeps running
    script = (
        '[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && exec sleep 600; '
        f"while [ ! -e {flag} ]; do sleep 0.2; done; exit 1"
    )
    job_id = submit("-N2", f"--wrap={script}")
    first = wait_for(lambda: running(scheduler, job_id))
    bad = first.nodes[1]

    nhc = health_check_script(folder, slurm_env["SLURM_CONF"])
    ran = subprocess.run([str(nhc), bad], capture_output=True, text=True, timeout=30)
    assert ran.returncode == 1, ran.stderr
    assert scheduler.get_node(bad).reason == NHC_REASON

    def recorded() -> list:
        with Store.open(stack.db, readonly=True) as store:
            return store.evidence_by_kinds(("health_check_drain",), node=bad, limit=10)

    (row,) = wait_for(recorded, timeout=15)
    assert row.evidence.payload["reason"] == NHC_REASON
    assert running(scheduler, job_id), "a health-check drain alone must not stop a running job"

    flag.touch()  # the job now fails on the node the health check drained
    again = wait_for(lambda: running(scheduler, job_id, restarts=1), timeout=60)
    assert bad not in again.nodes and bad in again.excluded_nodes

    out = srecovery(stack, "explain", str(job_id))
    assert out.returncode == 0, out.stderr
    assert f"the site's health check drained {bad}" in out.stdout, out.stdout
    story = json.loads(srecovery(stack, "explain", str(job_id), "--json").stdout)
    (incident,) = story["incidents"]
    kinds = [e["kind"] for e in incident["evidence"]]
    assert "health_check_drain" in kinds, incident["evidence"]
    verdict = incident["advice"]["verdict"]
    assert verdict["nodes"] == [bad] and verdict["fault_class"] == "system"
    assert incident["advice"]["exclude"] == [bad] and incident["advice"]["drain"] == []

    # never the tool's drain: not resumed, not re-drained, not counted
    wait_passes(stack.url, 3)
    node = scheduler.get_node(bad)
    assert node.drained and node.reason == NHC_REASON, node
    assert not [a for a in stack.actions() if a.step in ("drain", "resume")]
    with Store.open(stack.db, readonly=True) as store:
        state = store.get_node(bad)
        assert state is None or not state.drained_by_tool

    # the scorecard: the health check's drain, neither the tool's nor an operator's
    compare = srecovery(stack, "compare", "--since", "1h", "--json")
    assert compare.returncode == 0, compare.stderr
    card = json.loads(compare.stdout)
    assert [d["node"] for d in card["health_check_drains"]] == [bad], card
    assert bad not in [d["node"] for d in card["operator_actions"]["drains"]]
    assert card["agreement"]["health_check_drains"] == 1
