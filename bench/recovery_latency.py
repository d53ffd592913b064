"""Report of a fatal XID -> job running again on healthy nodes, on the real local stack.

    .venv/bin/python bench/recovery_latency.py --trials 10

Brings up ``srecovery dev up --mode act`` in its own base directory and ports, then per trial:
submits a 2-node job, waits until it runs, reports XID 79 on one of its nodes (signed, as an
operator), and waits until Slurm shows it RUNNING again. Prints each trial, the p50/p95/max of
report -> running again and of the controller's own milestones (detection, action, end to
end), and writes them as JSON with --json. Stops everything at the end unless --keep.

Most of report -> running again is Slurm's own batch scheduling tick: slurmctld starts
released batch jobs at most every ``batch_sched_delay`` seconds (SchedulerParameters,
default 3). Our part is the detection and action milestones.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import job_incidents, milestone_times, wait

from slurm_recovery import devstack, localcluster
from slurm_recovery.client import ControllerClient
from slurm_recovery.controller.wire import event_to_json
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.sidecar.sim import inject

FALLEN_OFF = "GPU has fallen off the bus."
#: Poll fast: the times measured here are taken when a wait returns.
POLL = {"timeout": 60.0, "interval": 0.02}


def detected_at(story: dict) -> float:
    return milestone_times(story)["detected"]


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50": statistics.median(ordered), "p95": p95, "max": ordered[-1], "n": len(ordered)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--base", type=Path, default=Path("/tmp/srecovery-bench"))
    parser.add_argument("--port-base", type=int, default=17400)
    parser.add_argument("--api-port", type=int, default=17865)
    parser.add_argument(
        "--jitter",
        type=float,
        default=3.0,
        help="wait a random 0..JITTER s before each failure (default 3): real faults do not "
        "line up with slurmctld's batch scheduling tick (batch_sched_delay, 3 s by default), "
        "and without this the trials would all land at the same point of that tick",
    )
    parser.add_argument("--seed", type=int, default=1, help="for the jitter")
    parser.add_argument(
        "--via",
        choices=("report", "sim"),
        default="report",
        help="report: an operator's signed XID report over HTTP; sim: an XID injected into "
        "the node's simulated GPU, read and sent by that node's sidecar (the production path)",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--keep", action="store_true", help="leave the stack running")
    args = parser.parse_args()

    stack = devstack.up(args.base, mode="act", port_base=args.port_base, api_port=args.api_port)
    sched = ScontrolScheduler(timeout=10, slurm_conf=str(stack.cluster.slurm_conf))
    client = ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))
    env = localcluster.slurm_env(stack.cluster)
    rows = []
    rng = random.Random(args.seed)
    try:
        for trial in range(1, args.trials + 1):
            job_id = int(
                subprocess.run(
                    ["sbatch", "--parsable", "-N2", "--wrap=sleep 600"],
                    env=env,
                    cwd="/tmp",
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split(";")[0]
            )
            first = wait(lambda j=job_id: (x := sched.get_job(j)).state == "RUNNING" and x, **POLL)
            bad = first.nodes[-1]
            time.sleep(rng.uniform(0, args.jitter))
            reported = time.time()
            if args.via == "sim":
                inject(stack.base / "sim", bad, gpu=0, xid=79, message=FALLEN_OFF)
            else:
                event = event_to_json(
                    "xid", reported, node=bad, gpu=0, payload={"xid": 79, "message": FALLEN_OFF}
                )
                client.post_evidence([event], role="operator")
            wait(
                lambda j=job_id: (
                    (x := sched.get_job(j)).state == "RUNNING" and x.restart_count == 1
                ),
                **POLL,
            )
            running = time.time()
            story = wait(
                lambda j=job_id: [i for i in job_incidents(client, j) if i["outcome"]], **POLL
            )[0]
            row = {
                "trial": trial,
                "job_id": job_id,
                "node": bad,
                "report_to_incident": detected_at(story) - reported,
                "report_to_running": running - reported,
                **story["latencies"],
            }
            rows.append(row)
            print(
                f"trial {trial:>2}: job {job_id} xid on {bad}: report -> running again "
                f"{row['report_to_running']:.2f} s (to incident "
                f"{row['report_to_incident'] * 1000:.0f} ms, detection "
                f"{row['detection'] * 1000:.0f} ms,"
                f" action {row['action'] * 1000:.0f} ms, end to end {row['end_to_end']:.2f} s)",
                flush=True,
            )
            subprocess.run(["scancel", str(job_id)], env=env, check=True)
            sched.resume_node(bad)
            time.sleep(1)
    finally:
        if not args.keep:
            devstack.down(args.base)
    summary = {
        k: quantiles([r[k] for r in rows])
        for k in ("report_to_incident", "report_to_running", "detection", "action", "end_to_end")
    }
    print(f"\n{'metric':<20} {'p50':>8} {'p95':>8} {'max':>8}  (seconds, {len(rows)} trials)")
    for name, q in summary.items():
        print(f"{name:<20} {q['p50']:8.3f} {q['p95']:8.3f} {q['max']:8.3f}")
    if args.json:
        args.json.write_text(json.dumps({"trials": rows, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
