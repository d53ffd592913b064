"""Slurm 25.11+ alone, as sites now run it, against slurm-recovery, on one 26.05 cluster.

    .venv/bin/python bench/expedited_vs_slurm.py --json docs/img/expedited_vs_slurm.json
    .venv/bin/python bench/expedited_vs_slurm.py --quick    # CI: 1 trial of crash and app_bug

One invocation, one cluster: ``srecovery dev up --slurm 26.05 --mode act`` with
``SlurmctldParameters=enable_expedited_requeue``, every job ``sbatch --requeue=expedite
--exclusive -N2`` (4 nodes: one job at a time). Two arms over the same faults, interleaved by
kind (all trials of a kind for Slurm alone, then for the tool, then the next kind):

**Slurm alone.** The controller, watchdog and sidecars stopped, and the hook wrappers slurm.conf
names replaced: Prolog, TaskProlog and EpilogSlurmctld do nothing, and the Epilog is the site's
GPU health check, which fails (exit 1) on a node with a GPU whose fatal XID was not reset since.
It reads the simulated GPU's state at once, which flatters Slurm: a real check (DCGM, NHC) takes
its own seconds. A failed Epilog drains the node and, with a non-zero exit, makes Slurm requeue
the job at once (expedited); a non-zero exit without one puts the job on requeue-hold; a DOWN
node requeues it at once.

**slurm-recovery.** The same cluster with the tool's hooks, sidecars, controller and watchdog
back, act mode, and ``hooks.epilog_gate`` on (the Epilog fails on a fault the sidecar proved).

Faults, on the job's second node (the first, the batch script's, for node death):

``crash``       XID 79 on GPU 0 and, in the same instant, the node's task SIGKILLed: the job
                fails (``srun --kill-on-bad-exit``).
``xid``         XID 79 only; the ranks keep running (as if hung in a collective until NCCL's
                timeout). Slurm alone sees nothing: watched for ``--watch`` s.
``node_death``  the slurmd of the node that runs the batch script SIGKILLed (the job's
                processes there live on, as on a host whose daemon died): the job runs on
                until Slurm marks the node DOWN (SlurmdTimeout, 60 s here, and its ping
                cycle), then Slurm requeues it at once (expedite). The tool has no evidence of
                its own for this fault yet: both arms wait for Slurm.
``hang``        the job stops printing progress (bench/support.py's workload); no fault.
``app_bug``     every rank raises ``KeyError``; the job exits 1.

Per trial: **failure to running again** (the job RUNNING with a restart count >= 1, polled every
50 ms; failure = the injection, the last progress line for a hang, the first raise for the bug),
where it ran again, whether the bad node was kept out (not in the new allocation; drained),
the restart count, and for the bug what became of the job after ``--watch`` s. A trial that
does not run again within its window is "not restarted", never a number.

Runs as root (it starts slurmd). Everything it starts is stopped at the end (unless ``--keep``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recovery_latency import APP_BUG, FALLEN_OFF, POLL_S, STEP_JOB, Ours, loadavg, task_pids
from report import write_json
from support import (
    HANG_POLICY,
    add_stack_options,
    fill_stack_options,
    hang_training_script,
    job_incidents,
    quantiles,
    run_directory,
    wait,
)

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ControllerClient
from slurm_recovery.scheduler.base import Job, SchedulerError
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.sidecar.sim import inject

KINDS = ("crash", "xid", "node_death", "hang", "app_bug")
ARMS = ("slurm", "ours")
TITLES = {
    "crash": "crash on a node with a GPU fault",
    "xid": "XID, ranks keep running",
    "node_death": "node death (slurmd killed)",
    "hang": "hang, no fault",
    "app_bug": "application bug",
}
ARM_TITLES = {"slurm": "Slurm alone", "ours": "slurm-recovery"}
#: The site's Epilog health check of the Slurm-alone arm: a fatal XID not reset since.
SITE_CHECK = """#!{python}
# The site's GPU health check (Epilog) of bench/expedited_vs_slurm.py's Slurm-alone arm: the
# simulated GPUs' state, read at once; exit 1 while a GPU has a fatal XID (79) not reset since.
import json, os, sys
try:
    state = json.load(open(os.path.join({sim!r}, os.environ["SLURMD_NODENAME"] + ".json")))
except (OSError, ValueError, KeyError):
    sys.exit(0)
bad = set()
for event in state.get("events", []):
    if event.get("type") == "xid" and event.get("xid") == 79:
        bad.add(event.get("gpu"))
    elif event.get("type") == "clear":
        bad = set() if event.get("gpu") is None else bad - {{event.get("gpu")}}
if bad:
    print(f"GPU {{sorted(bad, key=str)}}: XID 79 (fallen off the bus)")
    sys.exit(1)
"""
NOTHING = "#!/bin/sh\nexit 0\n"


class Bench:
    """The stack, and switching it between the two arms."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.up_args = dict(
            nodes=4,
            mode="act",
            port_base=args.port_base,
            api_port=args.api_port,
            policy_extra=HANG_POLICY,
            slurm=args.slurm,
            slurm_conf_extra=["SlurmctldParameters=enable_expedited_requeue"],
        )
        devstack.down(args.base)
        shutil.rmtree(args.base, ignore_errors=True)
        self.stack = devstack.up(args.base, **self.up_args)
        self._epilog_gate_on()
        self.hooks = {p: p.read_text() for p in (args.base / "hooks").iterdir() if p.is_file()}
        self.env = {**os.environ, **localcluster.slurm_env(self.stack.cluster)}
        cluster = self.stack.cluster
        self.sched = ScontrolScheduler(
            timeout=20,
            bin_dir=f"{cluster.slurm_prefix}/bin" if cluster.slurm_prefix else "",
            slurm_conf=str(cluster.slurm_conf),
        )
        self.client = ControllerClient(
            self.stack.url, munge_socket=str(self.stack.cluster.munge_socket)
        )
        self.work = run_directory("expedite")
        (self.work / "step.sh").write_text(STEP_JOB)
        (self.work / "hang.sh").write_text(hang_training_script(12, stamp_dir=self.work))
        (self.work / "app_bug.py").write_text(APP_BUG)
        (self.work / "app_bug.sh").write_text(
            "#!/bin/bash\nsrun --kill-on-bad-exit=1 python3 -u "
            f'{self.work / "app_bug.py"} "$1" {self.work}\n'
        )
        self.ours = Ours(
            self.stack,
            self.sched,
            self.client,
            self.env,
            self.work,
            "sim",
            sbatch_args=("--requeue=expedite",),
        )
        self.arm = "ours"

    def _epilog_gate_on(self) -> None:
        """hooks.epilog_gate in the stack's config.toml, which ``dev up`` writes anew."""
        config = self.stack.config
        config.write_text(config.read_text() + "epilog_gate = true\n")  # [hooks] is last

    def switch(self, arm: str) -> None:
        """Stop or start the tool's daemons and swap the hook wrappers."""
        if arm == self.arm:
            return
        if arm == "slurm":
            state = json.loads((self.args.base / devstack.STATE_FILE).read_text())
            for label, pid in state.items():
                must = f"--node {label.split(':', 1)[1]}" if ":" in label else label
                must = {"controller": "slurm_recovery.controller"}.get(must, must)
                localcluster.stop_process(pid, must)
            for path in self.hooks:
                text = NOTHING
                if path.name == "srecovery-epilog":
                    text = SITE_CHECK.format(python=sys.executable, sim=str(self.args.base / "sim"))
                path.write_text(text)
        else:
            for path, text in self.hooks.items():
                path.write_text(text)
            devstack.up(self.args.base, **self.up_args)
            self._epilog_gate_on()
        self.arm = arm

    def job(self, job_id: int) -> Job | None:
        return self.ours.job(job_id)

    def cleanup(self, job_id: int, nodes: list[str]) -> None:
        """Cancel, reset the GPUs (the sidecar's open XID), resume, wait for idle nodes."""
        for node in nodes:
            inject(self.args.base / "sim", node, clear=True)
        time.sleep(0.5)  # the sidecars read the reset
        self.ours.cleanup(job_id, nodes)


def running_again(bench: Bench, job_id: int, window: float) -> tuple[float, Job] | None:
    """(wall time, job) when the job is first seen RUNNING with restart count >= 1, or None."""
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        job = bench.job(job_id)
        if job is not None and job.restart_count >= 1 and job.state == "RUNNING":
            return time.time(), job
        time.sleep(POLL_S)
    return None


def trial(bench: Bench, kind: str, rng: random.Random) -> dict[str, Any]:
    args = bench.args
    script, extra = {"hang": ("hang.sh", ()), "app_bug": ("app_bug.sh", ("1.5",))}.get(
        kind, ("step.sh", ())
    )
    job_id = bench.ours.sbatch(bench.work / script, *extra)
    row: dict[str, Any] = {"arm": bench.arm, "kind": kind, "job_id": job_id, "problems": []}
    nodes: list[str] = []
    try:
        first = wait(lambda: (j := bench.job(job_id)) and j.state == "RUNNING" and j, 60, POLL_S)
        nodes = list(first.nodes)
        bad = nodes[0] if kind == "node_death" else nodes[-1]
        row.update(nodes=nodes, node=bad if kind in ("crash", "xid", "node_death") else None)
        if kind == "hang":  # its first progress lines: the hang comes after them
            wait(lambda: (bench.work / f"progress-{job_id}-0").exists(), 30, POLL_S)
        node_fault = kind in ("crash", "xid", "node_death")
        pids = wait(lambda: task_pids(job_id, bad), 30, POLL_S) if node_fault else []
        if kind in ("crash", "xid", "node_death"):
            time.sleep(rng.uniform(0, args.jitter))
        row["load_average"] = loadavg()
        failed = time.time()
        window = args.watch
        if kind in ("crash", "xid"):
            inject(bench.args.base / "sim", bad, gpu=0, xid=79, message=FALLEN_OFF)
            if kind == "crash":
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
        elif kind == "node_death":
            state = json.loads((bench.stack.cluster.base / "cluster.json").read_text())
            os.kill(state["pids"][f"slurmd:{bad}"], signal.SIGKILL)
            window = args.watch + 120  # SlurmdTimeout (60 s) and its ping cycle
        elif kind == "hang":
            window = args.watch + 12 * 0.5
        seen = running_again(bench, job_id, window)
        if kind == "hang":
            failed = float((bench.work / f"progress-{job_id}-0").read_text())
        elif kind == "app_bug":
            stamps = list(bench.work.glob(f"raised-{job_id}-*"))
            failed = min(float(p.read_text()) for p in stamps) if stamps else failed
        job = bench.job(job_id)
        row["final"] = (
            {
                "state": job.state,
                "reason": job.reason,
                "held": job.held,
                "restarts": job.restart_count,
            }
            if job
            else None
        )
        if seen is not None:
            at, again = seen
            row.update(
                end_to_end=at - failed,
                nodes_again=list(again.nodes),
                restart_count=again.restart_count,
            )
            if row["node"] is not None:
                row["without_bad"] = bad not in again.nodes
        if row["node"] is not None:  # drained: kept out of later jobs once it answers again
            row["drained"] = bench.sched.get_node(bad).drained
        if bench.arm == "ours":
            # the incident of what just happened: Slurm may have restarted the job before the
            # controller's next pass saw the failure
            with contextlib.suppress(TimeoutError):
                wait(lambda: job_incidents(bench.client, job_id), 10, 0.2)
            stories = job_incidents(bench.client, job_id)
            if stories:
                advice = stories[0].get("advice") or {}
                row["incident"] = {
                    "kind": stories[0]["kind"],
                    "action": advice.get("action"),
                    "fault_class": (advice.get("verdict") or {}).get("fault_class"),
                    "outcome": stories[0].get("outcome"),
                }
    except (TimeoutError, SchedulerError, OSError, ValueError, KeyError, IndexError) as exc:
        row["problems"].append(f"{type(exc).__name__}: {exc}")
    finally:
        if kind == "node_death" and nodes:
            localcluster.up(bench.stack.cluster)  # the killed slurmd back
        bench.cleanup(job_id, nodes)
    return row


def describe(row: dict[str, Any]) -> str:
    head = f"{ARM_TITLES[row['arm']]:>14} {row['kind']:>10}: job {row['job_id']}"
    if row["problems"]:
        return f"{head} FAILED: {'; '.join(row['problems'])}"
    if "end_to_end" in row:
        where = ",".join(row["nodes_again"])
        text = f"running again after {row['end_to_end']:.2f} s on {where}, restarts "
        text += f"{row['restart_count']}"
        if row.get("without_bad") is False:
            text += ", ON THE BAD NODE"
    else:
        final = row.get("final") or {}
        text = f"not restarted: {final.get('state')} ({final.get('reason')})"
    if "drained" in row:
        text += f"; {row['node']} {'drained' if row['drained'] else 'NOT drained'}"
    if row.get("incident"):
        text += f"; incident {row['incident']['kind']} -> {row['incident']['action']}"
    return f"{head} {text} (load {row['load_average'][0]:.2f})"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in KINDS:
        for arm in ARMS:
            mine = [r for r in rows if r["kind"] == kind and r["arm"] == arm]
            if not mine:
                continue
            again = [r for r in mine if "end_to_end" in r]
            finals: dict[str, int] = {}
            for r in mine:
                if "end_to_end" not in r and r.get("final"):
                    f = r["final"]
                    what = f"{f['state']}{' held' if f['held'] else ''} ({f['reason']})"
                    finals[what] = finals.get(what, 0) + 1
            out[f"{kind}/{arm}"] = {
                "trials": len(mine),
                "failed": sum(1 for r in mine if r["problems"]),
                "restarted": len(again),
                "end_to_end": quantiles([r["end_to_end"] for r in again]),
                "without_bad": sum(1 for r in again if r.get("without_bad")),
                "drained": sum(1 for r in mine if r.get("drained")),
                "restart_counts": sorted({r["restart_count"] for r in again}),
                "not_restarted": finals,
                "actions": sorted(
                    {r["incident"]["action"] or "-" for r in mine if r.get("incident")}
                ),
            }
    return out


def print_table(summary: dict[str, Any]) -> None:
    print(
        "\n| fault | arm | restarted | failure to running again p50 / max (s) | without the "
        "bad node | bad node drained | restarts | otherwise |"
    )
    print("| --- | --- | ---: | --- | ---: | ---: | --- | --- |")
    for key, s in summary.items():
        kind, arm = key.split("/")
        e2e = s["end_to_end"]
        figure = f"**{e2e['p50']:.2f}** / {e2e['max']:.2f}" if e2e.get("n") else "-"
        node_fault = kind in ("crash", "xid", "node_death")
        kept = f"{s['without_bad']}/{s['restarted']}" if node_fault else "-"
        drained = f"{s['drained']}/{s['trials']}" if node_fault else "-"
        other = "; ".join(f"{n}x {what}" for what, n in s["not_restarted"].items()) or "-"
        if s["actions"]:
            other += f"; tool: {', '.join(s['actions'])}"
        if s["failed"]:
            other += f"; {s['failed']} trial(s) FAILED"
        restarts = ",".join(map(str, s["restart_counts"])) or "-"
        print(
            f"| {TITLES[kind]} | {ARM_TITLES[arm]} | {s['restarted']}/{s['trials']} | {figure} "
            f"| {kept} | {drained} | {restarts} | {other} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="per fault kind and arm (default 5)")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--slurm", default="26.05", help="a 25.11+ series (default 26.05)")
    parser.add_argument("--watch", type=float, default=20.0, help="s to wait for a restart")
    parser.add_argument("--jitter", type=float, default=2.0, help="random 0..J s before a fault")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 trial of crash and app_bug per arm, 10 s windows (about a minute; CI)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="leave the stack running")
    add_stack_options(parser)
    args = parser.parse_args()
    fill_stack_options(args, "expedite")
    if args.quick:
        args.trials, args.kinds, args.watch = 1, ["crash", "app_bug"], 10.0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rng = random.Random(args.seed)
    started, load = time.time(), {"start": loadavg()}
    print(
        f"expedited requeue vs slurm-recovery on Slurm {args.slurm}: {args.trials} trial(s) "
        f"of {', '.join(args.kinds)} per arm; load {load['start']}",
        flush=True,
    )
    bench = Bench(args)
    rows: list[dict[str, Any]] = []
    try:
        print(f"Slurm {localcluster.slurm_release(bench.stack.cluster)}", flush=True)
        for kind in args.kinds:
            for arm in args.arms:
                bench.switch(arm)
                for _ in range(args.trials):
                    row = trial(bench, kind, rng)
                    rows.append(row)
                    print(describe(row), flush=True)
    finally:
        if not args.keep:
            devstack.down(args.base)
    load["end"] = loadavg()
    summary = summarize(rows)
    print(
        f"\nload average at the start {load['start']}, at the end {load['end']} on "
        f"{os.cpu_count()} CPUs; {time.time() - started:.0f} s"
    )
    print_table(summary)
    write_json(
        args.json,
        "expedited_vs_slurm",
        {
            "summary": summary,
            "trials": rows,
            "load_average": load,
            "seconds": time.time() - started,
            "settings": {k: str(v) for k, v in vars(args).items()},
        },
        args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
