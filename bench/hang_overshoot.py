"""How long after its deadline a hung training job is declared hung, on the real local stack.

    .venv/bin/python bench/hang_overshoot.py --trials 5 [--quick] [--json FILE]

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

from report import write_json
from support import (
    HANG_POLICY,
    add_stack_options,
    fill_stack_options,
    hang_overshoot,
    hang_training_script,
    job_incidents,
    wait,
)

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ControllerClient
from slurm_recovery.scheduler.scontrol import ScontrolScheduler


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    add_stack_options(parser)
    parser.add_argument("--quick", action="store_true", help="one trial (for CI)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    fill_stack_options(args, "hang")
    if args.quick:
        args.trials = 1
    stack = devstack.up(
        args.base,
        mode="act",
        port_base=args.port_base,
        api_port=args.api_port,
        policy_extra=HANG_POLICY,
    )
    sched = ScontrolScheduler(timeout=10, slurm_conf=str(stack.cluster.slurm_conf))
    client = ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))
    env = localcluster.slurm_env(stack.cluster)
    work = Path(tempfile.mkdtemp(prefix="srecovery-hang-"))
    work.chmod(0o755)
    script = work / "train.sh"
    script.write_text(hang_training_script())
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
            overshoot = hang_overshoot(story)
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
    figures = {
        "overshoot_s": {
            "p50": round(statistics.median(overshoots), 3),
            "max": round(max(overshoots), 3),
            "all": [round(x, 3) for x in overshoots],
        },
        "trials": len(overshoots),
        "policy": {"floor_s": 3, "ceiling_s": 20, "interval_multiple": 3.0},
    }
    write_json(args.json, "hang_overshoot", figures, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
