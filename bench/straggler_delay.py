"""How long after a job slows down it is reported as a straggler, on the real local stack.

    .venv/bin/python bench/straggler_delay.py --trials 5 [--quick] [--json FILE]

Brings up ``srecovery dev up`` (monitor mode) with a short straggler policy (rate_interval 2 s,
baseline_window 20 s, min_duration 10 s, drop 30 %), then per trial runs a 2-node job whose two
ranks report every step through ``slurm_recovery.progress`` (the TaskProlog hands them the
progress file; each node's sidecar follows its own). Both ranks step every 0.25 s; from 12 s
after the start every step takes 0.75 s, as in synchronous training where one rank got slow:
rank 1 reports 0.7 s of its own work per step, rank 0 still 0.2 s (the rest is waiting). The
slowdown's true onset is the first slow step. Prints, per trial, the delay from the onset to the
incident and the node the verdict names (n2 expected), and p50 / max over the trials.

The delay is bounded below by the policy: the drop must last ``min_duration``, plus up to one
``rate_interval`` to see it, plus the progress report interval (1 s by default) and the sidecar's
send interval (2 s). With the default policy (3 min, 30 s periods) it is about 3.5 minutes.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report import write_json
from support import add_stack_options, fill_stack_options, job_incidents, milestone_times, wait

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ControllerClient

ROOT = Path(__file__).resolve().parents[1]
POLICY = (
    '\n[hang]\nfloor = "5m"\nceiling = "10m"\n'
    '[straggler]\nrate_interval = "2s"\nbaseline_window = "20s"\nmin_duration = "10s"\n'
    "drop_percent = 30.0\n"
)
RANK = """
import os, sys, time
sys.path.insert(0, {root!r})
from slurm_recovery import progress
rank = int(os.environ["SLURM_PROCID"])
start = float(sys.argv[1])
onset_file = sys.argv[2]
step, slow = 0, False
while True:
    now = time.time()
    if not slow and now >= start + 12:
        slow = True
        if rank == 1:
            with open(onset_file, "w") as fh:
                fh.write(repr(now))
    time.sleep(0.75 if slow else 0.25)
    step += 1
    own = (0.7 if rank == 1 else 0.2) if slow else 0.2
    progress.report(step, samples=8, step_time=own)
"""
BATCH = """#!/bin/bash
srun -N2 -n2 {python} {rank} "$(date +%s.%N)" {onset}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    add_stack_options(parser)
    parser.add_argument("--quick", action="store_true", help="one trial (for CI)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    fill_stack_options(args, "straggler")
    if args.quick:
        args.trials = 1
    stack = devstack.up(
        args.base,
        mode="monitor",
        port_base=args.port_base,
        api_port=args.api_port,
        policy_extra=POLICY,
        nodes=3,
    )
    client = ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))
    env = localcluster.slurm_env(stack.cluster)
    work = Path(tempfile.mkdtemp(prefix="srecovery-straggler-"))
    work.chmod(0o777)
    rank = work / "rank.py"
    rank.write_text(RANK.format(root=str(ROOT)))
    delays = []
    trials = []
    try:
        for trial in range(1, args.trials + 1):
            onset = work / f"onset-{trial}"
            script = work / f"train-{trial}.sh"
            script.write_text(BATCH.format(python=sys.executable, rank=rank, onset=onset))
            job_id = int(
                subprocess.run(
                    ["sbatch", "--parsable", "-N2", "-o", str(work / "train-%j.out"), str(script)],
                    env=env,
                    cwd="/tmp",
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split(";")[0]
            )
            story = wait(lambda j=job_id: job_incidents(client, j), timeout=120.0, interval=0.2)[0]
            m = milestone_times(story)
            started = float(onset.read_text())
            delay = m["detected"] - started
            delays.append(delay)
            verdict = story["advice"]["verdict"]
            trials.append({"job": job_id, "delay_s": round(delay, 3), "nodes": verdict["nodes"]})
            print(
                f"trial {trial}: job {job_id} {story['kind']} detected {delay:.2f} s after the "
                f"slowdown; nodes {verdict['nodes']}: {story['advice']['reason']}",
                flush=True,
            )
            subprocess.run(["scancel", str(job_id)], env=env, check=True)
            time.sleep(1)
    finally:
        devstack.down(args.base)
    print(
        f"\nstraggler detection delay after the slowdown began: p50 "
        f"{statistics.median(delays):.2f} s, max {max(delays):.2f} s ({len(delays)} trials; "
        "policy min_duration 10 s, rate_interval 2 s)"
    )
    figures = {
        "delay_s": {"p50": round(statistics.median(delays), 3), "max": round(max(delays), 3)},
        "named_n2": sum(1 for t in trials if t["nodes"] == ["n2"]),
        "trials": trials,
        "policy": {"min_duration_s": 10, "rate_interval_s": 2},
    }
    write_json(args.json, "straggler_delay", figures, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
