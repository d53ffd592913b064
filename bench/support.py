"""What the benchmarks that drive a dev stack share: waiting for a condition, reading a job's
incidents and milestone times from the controller, quantiles, the hang workload, and a fresh
place (directory, ports) for each run's stack."""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from slurm_recovery import localcluster
from slurm_recovery.contract.client import ClientError, ControllerClient

T = TypeVar("T")


def wait(predicate: Callable[[], T], timeout: float = 90.0, interval: float = 0.1) -> T:
    """``predicate()``'s first truthy value, polled every ``interval``; TimeoutError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("condition not met")


def job_incidents(client: ControllerClient, job_id: int) -> list[dict[str, Any]]:
    """The job's incident stories; empty while the controller has none (it answers 404)."""
    try:
        return client.get(f"/v1/jobs/{job_id}")["incidents"]
    except ClientError as exc:
        if exc.status == 404:
            return []
        raise


def milestone_times(story: dict[str, Any]) -> dict[str, float]:
    """An incident story's milestones as epoch seconds."""
    return {k: datetime.fromisoformat(v).timestamp() for k, v in story["milestones"].items()}


def quantiles(values: list[float]) -> dict[str, float]:
    """p50 (the median), p95 (nearest rank), max and n of ``values``; {"n": 0} when empty."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50": statistics.median(ordered), "p95": p95, "max": ordered[-1], "n": len(ordered)}


# --- the hang workload (bench/hang_overshoot.py, bench/recovery_latency.py) ----------------

#: A hang policy for a job that steps every 0.5 s: its deadline is the 3 s floor.
HANG_POLICY = (
    '\n[hang]\nfloor = "3s"\nceiling = "20s"\ninterval_multiple = 3.0\nstartup_grace = "1m"\n'
)


def hang_training_script(steps: int = 12, stamp_dir: Path | None = None) -> str:
    """A batch script that prints Megatron-style iteration lines every 0.5 s for ``steps``
    steps, then stops stepping (hangs in ``sleep 600``). With ``stamp_dir``, each step also
    writes its time (epoch seconds) to ``<stamp_dir>/progress-<job>-<restart count>``: after
    the hang, the file holds the time of the last progress."""
    stamp = ""
    if stamp_dir is not None:
        stamp = (
            f'  date +%s.%N > "{stamp_dir}/progress-$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}"\n'
        )
    return (
        "#!/bin/bash\n"
        f"for i in $(seq 1 {steps}); do\n"
        '  echo " iteration $i/ 1000 | consumed samples: $((i * 8)) | lm loss: 2.5E+00 |"\n'
        f"{stamp}"
        "  sleep 0.5\n"
        "done\n"
        "sleep 600\n"
    )


def hang_overshoot(story: dict[str, Any]) -> float:
    """How long after its deadline a hang incident was recorded: for a hang the controller's
    ``failure`` milestone is the moment the no-progress deadline passed."""
    m = milestone_times(story)
    return m["detected"] - m["failure"]


#: Set (to anything) to keep a run's own base directory (its logs, store and cluster files).
KEEP_ENV = "SRECOVERY_BENCH_KEEP"


def add_stack_options(parser: argparse.ArgumentParser, *, api_port: bool = True) -> None:
    """--base, --port-base (and --api-port): unset, each run gets a new base directory and free
    ports, as the tests do, so runs on different Slurm releases never share state. A base
    directory the run made itself is removed when it exits (a few MB each, and nothing else
    removes them), unless ``$SRECOVERY_BENCH_KEEP`` is set; one given with --base is kept."""
    parser.add_argument("--base", type=Path, help="stack directory (default: a new one)")
    parser.add_argument("--port-base", type=int, help="slurmctld's port (default: free ports)")
    if api_port:
        parser.add_argument("--api-port", type=int, help="controller port (default: a free one)")


def run_directory(name: str, *, keep: bool = False) -> Path:
    """A new directory /tmp/srecovery-bench-NAME-*, readable by munged (user munge must reach
    its socket inside), removed when the run exits (after the stacks' own teardown, in their
    ``finally`` blocks, stopped what ran in it) unless ``keep`` or ``$SRECOVERY_BENCH_KEEP``."""
    path = Path(tempfile.mkdtemp(prefix=f"srecovery-bench-{name}-"))
    path.chmod(0o755)
    if not keep and not os.environ.get(KEEP_ENV):
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def fill_stack_options(args: argparse.Namespace, name: str, ports: int = 80) -> None:
    """Fill what :func:`add_stack_options` left unset."""
    if args.base is None:
        args.base = run_directory(name, keep=getattr(args, "keep", False))
    if args.port_base is None:
        args.port_base = localcluster.free_port_block(ports)
    if getattr(args, "api_port", 0) is None:
        args.api_port = localcluster.free_port_block(1, start=args.port_base + ports)
