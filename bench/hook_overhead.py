"""Time each slurm-recovery hook as Slurm sees it: from starting the process to its exit.

    .venv/bin/python bench/hook_overhead.py [--runs 200] [--url URL --munge-socket PATH]
                                            [--quick] [--json FILE]

slurmd (Prolog/Epilog) and slurmctld (EpilogSlurmctld) fork the hook and wait for it, so its
whole wall time is what a job start or end pays. Each case runs the hook executable itself
(``hooks/*/srecovery-*``, through its ``#!/usr/bin/env python3`` line with this Python first
on PATH) N times with a recorded 22.05 environment and a config file of its own under a
temporary directory:

- ``prolog`` and ``epilog``: the event written into the node spool (the prolog also creates the
  job's directory, owned by the job user);
- ``task_prolog``: the ``export`` lines for a task of a job whose directory exists, run with
  ``-I`` as the wrapper runs it (slurmstepd runs it before every task, as the job user);
- ``prolog, gate on``: the health gate reading a fresh health file with no fatal finding;
- ``epilog_slurmctld, controller down``: nothing listens at client.url; the event is spooled;
- ``epilog_slurmctld, controller up`` (only with ``--url``): the event is signed with MUNGE
  (``--munge-socket``) and posted to that controller, which must accept this user as an
  operator (root or the SlurmUser). The dev stack's (``srecovery dev up``):
  ``--url http://127.0.0.1:17765 --munge-socket /tmp/srecovery-dev/cluster/munge/munge.socket``.

Two floors for comparison: ``/bin/true`` (fork and exec) and ``python -c pass`` (interpreter
start). Prints wall p50/p99/max in milliseconds (p99 by nearest rank) and the median CPU time
of the hook process (user + system), which other load on the host does not inflate.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import write_json

from slurm_recovery.contract import jobdir

REPO = Path(__file__).resolve().parent.parent
HOOKS = REPO / "hooks"
SCRIPTS = {
    "prolog": HOOKS / "prolog" / "srecovery-prolog",
    "epilog": HOOKS / "epilog" / "srecovery-epilog",
    "epilog_slurmctld": HOOKS / "epilog_slurmctld" / "srecovery-epilog-slurmctld",
    "task_prolog": HOOKS / "task_prolog" / "srecovery-task-prolog",
}

# Environments as Slurm 22.05 gives them (recorded on the local cluster), minus SLURM_JOB_ID.
NODE_ENV = {
    "SLURMD_NODENAME": "n1",
    "SLURM_CLUSTER_NAME": "bench",
    "SLURM_JOB_CPUS_PER_NODE": "64(x8)",
    "SLURM_JOB_GID": "1000",
    "SLURM_JOB_NUM_NODES": "8",
    "SLURM_JOB_PARTITION": "gpu",
    "SLURM_JOB_RESTART_COUNT": "0",
    "SLURM_JOB_STDIN": "/dev/null",
    "SLURM_JOB_STDOUT": "/home/alice/runs/train-%j.out",
    "SLURM_JOB_UID": "1000",
    "SLURM_JOB_USER": "alice",
    "SLURM_JOB_WORK_DIR": "/home/alice",
    "SLURM_NODELIST": "gpu[001-008]",
    "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
}
EPILOG_ENV = {
    **NODE_ENV,
    "SLURM_SCRIPT_CONTEXT": "epilog_slurmd",
    "SLURM_JOB_EXIT_CODE": "0",
    "SLURM_JOB_EXIT_CODE2": "0:0",
    "SLURM_JOB_DERIVED_EC": "0",
}
# What slurmstepd gives the TaskProlog, besides the job's own environment.
TASK_ENV = {
    "SLURMD_NODENAME": "n1",
    "SLURM_JOB_GID": "1000",
    "SLURM_JOB_NODELIST": "gpu[001-008]",
    "SLURM_JOB_UID": "1000",
    "SLURM_JOB_USER": "alice",
    "SLURM_LOCALID": "0",
    "SLURM_PROCID": "0",
    "SLURM_SCRIPT_CONTEXT": "prolog_task",
    "SLURM_STEP_ID": "0",
}
CTLD_ENV = {
    "SLURM_CLUSTER_NAME": "bench",
    "SLURM_JOB_ACCOUNT": "(null)",
    "SLURM_JOB_NAME": "train",
    "SLURM_JOB_NODELIST": "gpu[001-008]",
    "SLURM_JOB_NUM_NODES": "8",
    "SLURM_JOB_PARTITION": "gpu",
    "SLURM_JOB_RESTART_COUNT": "0",
    "SLURM_JOB_STDOUT": "/home/alice/runs/train-%j.out",
    "SLURM_JOB_USER": "alice",
    "SLURM_JOB_WORK_DIR": "/home/alice",
    "SLURM_JOB_EXIT_CODE": "0",
    "SLURM_JOB_EXIT_CODE2": "0:0",
    "SLURM_JOB_DERIVED_EC": "0",
    "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld",
}


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(base: Path, url: str, munge_socket: str, gate: bool) -> Path:
    path = base / f"config-{'gate' if gate else 'plain'}-{abs(hash(url))}.toml"
    path.write_text(
        f'[sidecar]\nspool_dir = "{base}/spool/{{node}}"\n'
        f'[controller]\nspool_dir = "{base}/controller-spool"\npolicy = "{base}/policy.toml"\n'
        f'[client]\nurl = "{url}"\n'
        f'[auth]\nmunge_socket = "{munge_socket}"\n'
        f"[hooks]\nhealth_gate = {'true' if gate else 'false'}\ncontroller_timeout = 0.5\n"
        f'job_dir = "{base}/jobs/{{node}}"\n'
    )
    path.chmod(0o644)
    return path


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_runs(
    argv: list[str], env: dict[str, str], runs: int, job_base: int
) -> tuple[list[float], list[float]]:
    """Wall and CPU (user + system) milliseconds of each run; every run must exit 0."""
    walls, cpus = [], []
    for i in range(runs):
        run_env = {**env, "SLURM_JOB_ID": str(job_base + i), "SLURM_JOBID": str(job_base + i)}
        cpu = _children_cpu()
        started = time.perf_counter()
        done = subprocess.run(argv, env=run_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        walls.append((time.perf_counter() - started) * 1000)
        cpus.append((_children_cpu() - cpu) * 1000)
        if done.returncode != 0:
            raise SystemExit(f"{argv[0]} exited {done.returncode}: {done.stderr.decode()}")
    return walls, cpus


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def summary(walls: list[float], cpus: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(walls), 1),
        "p99_ms": round(percentile(walls, 0.99), 1),
        "max_ms": round(max(walls), 1),
        "cpu_p50_ms": round(statistics.median(cpus), 1),
        "runs": len(walls),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="runs per case (default 200)")
    parser.add_argument("--url", help="a running controller, for the 'controller up' case")
    parser.add_argument("--munge-socket", default="", help="munged socket for --url")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--quick", action="store_true", help="10 runs per case (for CI)")
    args = parser.parse_args()
    if args.quick:
        args.runs = min(args.runs, 10)

    python_dir = str(Path(sys.executable).parent)
    base_env = {"PATH": f"{python_dir}:/usr/bin:/bin"}  # slurmd's own PATH is minimal
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="srecovery-hookbench-") as tmp:
        base = Path(tmp)
        (base / "policy.toml").write_text('mode = "act"\n')
        (base / "policy.toml").chmod(0o644)
        down = f"http://127.0.0.1:{unused_port()}"
        plain = write_config(base, down, args.munge_socket, gate=False)
        gated = write_config(base, down, args.munge_socket, gate=True)
        health = base / "spool" / "n1" / "health.json"
        health.parent.mkdir(parents=True)

        cases: list[tuple[str, list[str], dict[str, str]]] = [
            ("floor: /bin/true", ["/bin/true"], {}),
            ("floor: python -c pass", [sys.executable, "-c", "pass"], {}),
            ("prolog", [str(SCRIPTS["prolog"])], {**NODE_ENV, "SRECOVERY_CONFIG": str(plain)}),
            (
                "prolog, gate on",
                [str(SCRIPTS["prolog"])],
                {**NODE_ENV, "SRECOVERY_CONFIG": str(gated)},
            ),
            ("epilog", [str(SCRIPTS["epilog"])], {**EPILOG_ENV, "SRECOVERY_CONFIG": str(plain)}),
            (
                "task_prolog",
                [sys.executable, "-I", str(SCRIPTS["task_prolog"])],
                {**TASK_ENV, "SRECOVERY_CONFIG": str(plain)},
            ),
            (
                "epilog_slurmctld, controller down",
                [str(SCRIPTS["epilog_slurmctld"])],
                {**CTLD_ENV, "SRECOVERY_CONFIG": str(plain)},
            ),
        ]
        if args.url:
            up = write_config(base, args.url, args.munge_socket, gate=False)
            cases.append(
                (
                    "epilog_slurmctld, controller up",
                    [str(SCRIPTS["epilog_slurmctld"])],
                    {**CTLD_ENV, "SRECOVERY_CONFIG": str(up)},
                )
            )
        print(
            f"{'case':36} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'CPU p50':>8}"
            f"   ({args.runs} runs each; wall time, and CPU time of the hook process)"
        )
        for number, (name, argv, env) in enumerate(cases):
            health.write_text(json.dumps({"updated_at": time.time(), "node": "n1", "fatal": []}))
            if name == "task_prolog":  # the directories the prolog makes for those jobs
                for job in [
                    *range(900_000_000, 900_000_005),
                    *range(1_000_000 * (number + 1), 1_000_000 * (number + 1) + args.runs),
                ]:
                    jobdir.create(f"{base}/jobs/{{node}}", "n1", job, os.getuid(), os.getgid())
            time_runs(argv, {**base_env, **env}, 5, 900_000_000)  # warm the page cache
            walls, cpus = time_runs(argv, {**base_env, **env}, args.runs, 1_000_000 * (number + 1))
            results[name] = row = summary(walls, cpus)
            print(
                f"{name:36} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f} {row['max_ms']:8.1f}"
                f" {row['cpu_p50_ms']:8.1f}"
            )
        spooled = len(list((base / "controller-spool" / "events").glob("*.json")))
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(
            f"(controller-down runs spooled {spooled} events; {os.cpu_count()} CPUs; "
            f"load average now {load})"
        )
    write_json(args.json, "hook_overhead", {"runs": args.runs, "cases": results}, args.quick)


if __name__ == "__main__":
    main()
