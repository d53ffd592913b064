"""How long after its deadline a hung training job is declared hung, on the real local stack.

    .venv/bin/python bench/hang_overshoot.py --trials 5

Brings up ``srecovery dev up --mode act`` with a short hang policy (floor 3 s, ceiling 20 s,
3 x the job's own step interval), then per trial runs a 2-node job that prints Megatron-style
iteration lines every 0.5 s for 6 s and then stops stepping. The batch node's sidecar follows
its stdout; the controller declares the hang and requeues the job. Prints, per trial, the
deadline the controller computed, and the overshoot: incident recorded minus deadline passed.
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

from support import job_incidents, milestone_times, wait

from slurm_recovery import devstack, localcluster
from slurm_recovery.client import ControllerClient
from slurm_recovery.scheduler.scontrol import ScontrolScheduler

POLICY = '\n[hang]\nfloor = "3s"\nceiling = "20s"\ninterval_multiple = 3.0\nstartup_grace = "1m"\n'
TRAINING = """#!/bin/bash
for i in $(seq 1 12); do
  echo " iteration $i/ 1000 | consumed samples: $((i * 8)) | lm loss: 2.5E+00 |"
  sleep 0.5
done
sleep 600
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--base", type=Path, default=Path("/tmp/srecovery-bench-hang"))
    parser.add_argument("--port-base", type=int, default=17500)
    parser.add_argument("--api-port", type=int, default=17965)
    args = parser.parse_args()
    stack = devstack.up(
        args.base, mode="act", port_base=args.port_base, api_port=args.api_port, policy_extra=POLICY
    )
    sched = ScontrolScheduler(timeout=10, slurm_conf=str(stack.cluster.slurm_conf))
    client = ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))
    env = localcluster.slurm_env(stack.cluster)
    work = Path(tempfile.mkdtemp(prefix="srecovery-hang-"))
    work.chmod(0o755)
    script = work / "train.sh"
    script.write_text(TRAINING)
    overshoots = []
    try:
        for trial in range(1, args.trials + 1):
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
            wait(lambda j=job_id: sched.get_job(j).restart_count == 1)
            story = wait(lambda j=job_id: job_incidents(client, j))[0]
            m = milestone_times(story)
            overshoot = m["detected"] - m["failure"]
            overshoots.append(overshoot)
            print(
                f"trial {trial}: job {job_id} {story['kind']}: {story['advice']['reason']}; "
                f"overshoot past the deadline {overshoot:.2f} s",
                flush=True,
            )
            subprocess.run(["scancel", str(job_id)], env=env, check=True)
            time.sleep(1)
    finally:
        devstack.down(args.base)
    print(
        f"\nhang overshoot past the deadline: p50 {statistics.median(overshoots):.2f} s, "
        f"max {max(overshoots):.2f} s ({len(overshoots)} trials)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
