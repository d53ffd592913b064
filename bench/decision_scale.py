"""The decision core at 100 to 50,000 nodes: is deciding an incident independent of the size?

    .venv/bin/python bench/decision_scale.py [--quick | --nodes N ...] [--json PATH]

Pure code, no Slurm (the controller's end-to-end figures are bench/controller_scale.py's; its
slurmctld here cannot start 50,000 nodes). For each N: a cluster view of N nodes with 8 GPUs in
one partition, every node busy with 4-node jobs (N/4 running jobs), one fatal XID on the first
job's second node, and the rest of the hour's evidence (job starts, 100 other XIDs). Timed, as
the loop calls them (best of 5 after a warm-up):

- ``detect`` over every job (what one pass spends finding incidents: follows the number of
  jobs, which grows with the cluster), and the pass's other detectors (job settings, hangs,
  stragglers) over the same view and evidence;
- the decision for the one incident: ``attribute`` then ``advise``, with the partition sizes
  counted once per listing as the loop does (``ClusterView.partition_sizes``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report import write_json

from slurm_recovery.decide.advise import advise
from slurm_recovery.decide.attribute import attribute
from slurm_recovery.decide.detect import detect
from slurm_recovery.decide.hang import hang_incidents
from slurm_recovery.decide.jobsettings import job_settings
from slurm_recovery.decide.model import ClusterView, Evidence, partition_sizes
from slurm_recovery.decide.policy import BlastRadius, Policy
from slurm_recovery.decide.straggler import straggler_incidents
from slurm_recovery.scheduler.base import Job, Node
from slurm_recovery.signals.xid import load_xid_catalogue

NOW = 1_800_000_000.0
JOB_NODES = 4


def cluster(n: int) -> tuple[ClusterView, list[Evidence]]:
    nodes = {
        f"gpu{i:05d}": Node(f"gpu{i:05d}", "ALLOCATED", partitions=("gpu",), gpus=8)
        for i in range(n)
    }
    names = list(nodes)
    jobs = {}
    for k in range(max(1, n // JOB_NODES)):
        on = tuple(names[k * JOB_NODES : (k + 1) * JOB_NODES])
        jobs[k + 1] = Job(
            job_id=k + 1,
            name="train",
            state="RUNNING",
            reason="",
            user="alice",
            partition="gpu",
            nodes=on,
            num_nodes=len(on),
            submit_time=int(NOW) - 3600,
            restart_count=0,
            start_time=int(NOW) - 3000,
            end_time=0,
            gpus={node: frozenset(range(8)) for node in on},
        )
    evidence = [
        Evidence(
            id=i + 1,
            source="hook",
            kind="job_start",
            observed_at=NOW - 3000,
            node=job.nodes[0],
            job_id=job.job_id,
        )
        for i, job in enumerate(list(jobs.values())[:5000])
    ]
    base = len(evidence)
    evidence += [  # XIDs that decide nothing (a non-fatal code) on other nodes
        Evidence(
            id=base + i + 1,
            source="sidecar",
            kind="xid",
            observed_at=NOW - 600 + i,
            node=names[(7 * i + 11) % n],
            gpu=i % 8,
            payload={"xid": 13, "message": "Graphics Engine Exception"},
        )
        for i in range(100)
    ]
    fatal = Evidence(
        id=len(evidence) + 1,
        source="sidecar",
        kind="xid",
        observed_at=NOW - 1,
        node=jobs[1].nodes[1],
        gpu=3,
        payload={"xid": 79, "message": "GPU has fallen off the bus."},
    )
    evidence.append(fatal)
    view = ClusterView(
        now=NOW, jobs=jobs, nodes=nodes, partition_sizes=partition_sizes(nodes.values())
    )
    return view, evidence


def best(fn: Any, runs: int = 5) -> tuple[float, Any]:
    fn()  # warm-up
    times, result = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def measure(n: int) -> dict[str, Any]:
    catalogue = load_xid_catalogue()
    policy = Policy(blast_radius=BlastRadius(max_nodes=10, max_percent=10.0))
    view, evidence = cluster(n)
    detect_s, found = best(lambda: detect(view, evidence, set(), catalogue, policy))
    (incident,) = found
    known = {(incident.job_id, incident.restart_count)}
    others_s, _ = best(
        lambda: (
            job_settings(evidence),
            hang_incidents(view, evidence, known, policy, {}),
            straggler_incidents(view, evidence, known, policy),
        )
    )
    job = view.jobs[incident.job_id]

    def decide() -> Any:
        verdict = attribute(incident, job, evidence, catalogue, policy, view.nodes)
        return advise(incident, verdict, job, policy, view, 0)

    decide_s, advice = best(decide)
    return {
        "nodes": n,
        "running_jobs": len(view.jobs),
        "evidence_rows": len(evidence),
        "detect_ms": 1000 * detect_s,
        "hang_straggler_settings_ms": 1000 * others_s,
        "decide_ms": 1000 * decide_s,
        "action": str(advice.action),
        "drain": sorted(advice.drain),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", help="N (default 100 1000 10000 50000)")
    parser.add_argument("--quick", action="store_true", help="N = 100, 1,000")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    sizes = args.nodes or ([100, 1000] if args.quick else [100, 1000, 10_000, 50_000])
    rows = [measure(n) for n in sizes]
    print(
        f"{'nodes':>6} {'jobs':>6} {'evidence':>8} {'detect ms':>10} {'hang+strag ms':>13} "
        f"{'decide ms':>10}  advice"
    )
    for r in rows:
        print(
            f"{r['nodes']:>6} {r['running_jobs']:>6} {r['evidence_rows']:>8} "
            f"{r['detect_ms']:>10.2f} {r['hang_straggler_settings_ms']:>13.2f} "
            f"{r['decide_ms']:>10.3f}  {r['action']} "
            f"drain {','.join(r['drain'])}"
        )
    spread = statistics.pstdev(r["decide_ms"] for r in rows)
    print(f"decide: mean {statistics.mean(r['decide_ms'] for r in rows):.3f} ms, sd {spread:.3f}")
    if args.json:
        write_json(args.json, "decision_scale", {"runs": rows}, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
