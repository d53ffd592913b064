"""Shared fixtures. ``local_cluster`` starts a real Slurm cluster (munged, slurmctld, 4 slurmd).

The Slurm release the integration tests run on is apt's, or the one ``SRECOVERY_SLURM`` names
(``scripts/test --slurm 24.11``: built by scripts/build-slurm under /opt/slurm/24.11). Its
programs go first on this process's PATH, so every cluster, daemon and command a test starts
uses that release."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurm_recovery import localcluster

NODES = 4
#: Install prefix of the Slurm under test ("" = the programs on PATH, apt's).
SLURM_PREFIX = localcluster.resolve_slurm(os.environ.get("SRECOVERY_SLURM", "default"))
if SLURM_PREFIX:
    os.environ["PATH"] = localcluster.path_with_slurm(SLURM_PREFIX, os.environ.get("PATH", ""))


#: Kept under this name: many tests import it from here.
_free_port_block = localcluster.free_port_block


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the cluster is a ``cluster`` test, marked or not, so the fast tier
    (``-m "not cluster"``) never starts a cluster for a test that forgot its marker."""
    for item in items:
        if "local_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[localcluster.ClusterSpec]:
    """A real Slurm cluster for the whole session, stopped (every process) at the end."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.fail("the cluster tests share one cluster per session: run them without -n")
    if os.geteuid() != 0:
        pytest.fail("the integration tests start slurmd and munged: run them as root")
    base = Path(tempfile.mkdtemp(prefix="srecovery-test-"))
    base.chmod(0o755)  # munged (user munge) must reach its socket directory inside
    spec = localcluster.ClusterSpec(
        base=base, nodes=NODES, port_base=_free_port_block(NODES + 1), name="srtest"
    )
    localcluster.up(spec)
    try:
        yield spec
    finally:
        localcluster.down(base)


@pytest.fixture
def slurm_env(local_cluster: localcluster.ClusterSpec) -> dict[str, str]:
    return localcluster.slurm_env(local_cluster)


@pytest.fixture
def submit(slurm_env: dict[str, str]) -> Iterator[Callable[..., int]]:
    """``submit("-N2", "--wrap=sleep 600")`` -> job id; the test's jobs are cancelled after."""
    jobs: list[int] = []

    def _submit(*args: str) -> int:
        out = subprocess.run(
            ["sbatch", "--parsable", *args],
            env=slurm_env,
            capture_output=True,
            text=True,
            check=True,
            cwd="/tmp",
        )
        job_id = int(out.stdout.strip().split(";")[0])
        jobs.append(job_id)
        return job_id

    yield _submit
    if jobs:
        subprocess.run(["scancel", *map(str, jobs)], env=slurm_env, capture_output=True)


def wait_for(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.1):
    """Poll until ``predicate()`` is truthy; returns it, or fails the test with its last value."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"condition not met within {timeout}s (last value: {value!r})")


def wait_passes(url: str, passes: int = 2, timeout: float = 30.0) -> None:
    """Wait until the controller at ``url`` has read Slurm's node listing afresh and then run
    ``passes`` whole loop passes (its /healthz ``node_reads`` and ``passes``: the listing is
    read by a thread of its own, every loop interval): what a test that shows that nothing
    happens later waits for, instead of a fixed sleep that passes whether or not the loop ran."""

    def counts() -> tuple[int, int]:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:  # 503 "degraded" still counts its passes
            body = json.load(exc)
        return int(body["passes"]), int(body["node_reads"])

    # the read (and the pass) running now may have begun before this call
    reads = counts()[1] + 2
    wait_for(lambda: counts()[1] >= reads, timeout=timeout, interval=0.05)
    target = counts()[0] + passes + 1
    wait_for(lambda: counts()[0] >= target, timeout=timeout, interval=0.05)
