"""Recovery latency on the real local stack, four fault kinds, against plain Slurm's requeue.

    .venv/bin/python bench/recovery_latency.py --json docs/img/recovery_latency.json
    .venv/bin/python bench/recovery_latency.py --quick          # CI: 1 trial per kind, no baseline
    .venv/bin/python bench/plot_latency.py docs/img/recovery_latency.json

**Ours.** Brings up ``srecovery dev up --mode act`` (real slurmctld and slurmd, the hooks, the
controller, the watchdog, a sidecar per node with simulated GPUs) in its own base directory and
ports, with a fresh store, and a hang policy for fast-stepping jobs (floor 3 s, 3 x the job's
own step interval), and runs ``--trials`` trials of each fault kind, interleaved, one
``--exclusive`` 2-node job at a time, each fault at a random point 0..``--jitter`` s after the
job's tasks run (faults do not line up with slurmctld's scheduling tick):

``crash``    job crash with a fatal XID: XID 79 injected into GPU 0 of the job's second node
             (``srecovery sim inject``; that node's sidecar reads and sends it) and, at once, the
             job's task on that node killed (SIGKILL), so ``srun --kill-on-bad-exit`` ends the
             job FAILED. Whichever the controller sees first opens the incident: usually the
             XID (incident kind ``doomed``), sometimes the job's end (``crash``); each trial
             records which. Expected: the node drained and excluded, the job running again.
``xid``      fatal XID on a running job: the same XID (or, ``--via report``, an operator's
             signed report over HTTP), the job's processes untouched: it keeps running, the
             controller must act. Expected: as for ``crash``.
``hang``     a job that prints Megatron-style iteration lines every 0.5 s for 6 s, then stops
             stepping (bench/hang_overshoot.py's workload). The sidecar reads progress from the
             job's output at most every ~2 s, so the deadline comes out at about 6 s. The
             failure is the time of the last progress line, so "detection" includes that
             deadline by design; the deadline itself and the overshoot past it (the controller's
             ``failure`` milestone, the moment the deadline passed, to ``detected``) are
             reported on their own. Expected: requeued and running again.
``app_bug``  an application bug: every rank raises ``KeyError`` in user code (a Python
             traceback) and the job exits 1. Expected: the job stopped (not requeued), fault
             class application, no node blamed, excluded or drained. Detection and action only.

Per trial: **detection** = failure -> incident recorded (the controller's ``detected``
milestone; the failure time is the benchmark's own wall clock at injection, or the job's own
stamp of its last progress line / of the moment it raised); **action** = incident -> the
scheduler action done and verified (the controller's ``released`` milestone, recorded once
Slurm accepted the release after requeue-hold, exclusion and begin-time; for ``app_bug``, the
``stopped`` milestone); **end to end** = failure -> the benchmark sees the job RUNNING again in
Slurm, on nodes without the faulty one (its own poll, every 50 ms). Each trial's outcome is
checked (right node excluded and drained, job running again elsewhere; app bug: stopped, no
node blamed); a trial that fails a check or times out is counted and listed, never dropped.

**Baseline: plain Slurm.** A second local cluster with nothing of ours in it (no hooks, no
controller, no sidecars: ``localcluster`` with the same slurm.conf but for the hook lines),
``--baseline-nodes`` nodes (default 32) so that ``--baseline-wave`` jobs (default 10) run at
once, each ``--exclusive`` on nodes of its own. The same 2-node job, submitted with
``--requeue``. The admin's best case: at the fault time, with no reaction time at all, the
admin drains the job's second node and sets it DOWN by hand (``scontrol update nodename=X
state=drain reason=...`` then ``state=down``): DOWN makes Slurm requeue the job, the drain
keeps X out once its slurmd answers again (the local cluster's ReturnToService=2 would return
a DOWN node within 0.1 s). Slurm then sets the job's begin time about 121 s ahead and starts
it on other nodes at its next scheduling pass after that. Measured: the admin's first command
-> the job RUNNING again on nodes without X (polled every 0.25 s); also when the job was seen
requeued and the begin time Slurm set. The baseline runs after our trials, not at the same
time, so neither disturbs the other's timing. For the other fault kinds plain Slurm does not
restart the job at all (printed with the table; no number is made up for them).

Runs from a clean checkout as root (it starts slurmd), like the tests. Other Slurm stacks on the
same host make the figures noisier: the load average is printed and written with every trial.
Everything it starts is stopped at the end, also on failure (unless ``--keep``).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from report import write_json
from support import (
    HANG_POLICY,
    add_stack_options,
    fill_stack_options,
    hang_overshoot,
    hang_training_script,
    job_incidents,
    milestone_times,
    quantiles,
    run_directory,
    wait,
)

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ControllerClient
from slurm_recovery.contract.wire import event_to_json
from slurm_recovery.scheduler.base import Job, SchedulerError
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.sidecar.sim import inject

FALLEN_OFF = "GPU has fallen off the bus."
KINDS = ("crash", "xid", "hang", "app_bug")
TITLES = {
    "crash": "job crash with a fatal XID",
    "xid": "fatal XID on a running job",
    "hang": "hang (no progress)",
    "app_bug": "application bug (traceback)",
}
#: What plain Slurm does for each kind, with nobody acting (no figure: it does not restart).
PLAIN_SLURM = {
    "crash": "the job ends FAILED and is not retried, even with --requeue (Slurm requeues on "
    "node failure, not on a failed job); nothing keeps the next job off the node",
    "xid": "the job keeps running on a broken GPU until it hangs or crashes, then as above; "
    "the node stays in service",
    "hang": "the job runs until its time limit (or until NCCL's own timeout kills it, then FAILED, "
    "not retried)",
    "app_bug": "the job ends FAILED, not retried (right), with no reason beyond the exit code",
}
#: Poll Slurm this often: the end-to-end times are taken when a poll first sees the state.
POLL_S = 0.05
#: The baseline admin's reason for setting a node DOWN.
REASON = "bench: XID 79 (admin)"
STEP_JOB = "#!/bin/bash\nsrun --kill-on-bad-exit=1 sleep 600\n"
APP_BUG = """import os, sys, time
rank = os.environ.get("SLURM_PROCID", "0")
print(f"rank {rank}: step 1 loss 2.5", flush=True)
time.sleep(float(sys.argv[1]))


def labels_of(batch):
    return batch["labels"]


with open(f"{sys.argv[2]}/raised-{os.environ['SLURM_JOB_ID']}-{rank}", "w") as stamp:
    stamp.write(repr(time.time()))
labels_of({"input_ids": [1, 2, 3]})
"""


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass
class Ours:
    """Our stack and what the trials need of it."""

    stack: devstack.DevStack
    sched: ScontrolScheduler
    client: ControllerClient
    env: dict[str, str]
    work: Path
    via: str
    last_xid: float = 0.0
    #: more sbatch options (bench/expedited_vs_slurm.py: --requeue=expedite)
    sbatch_args: tuple[str, ...] = ()

    def sbatch(self, script: Path, *args: str) -> int:
        out = subprocess.run(
            # --exclusive: 2 CPUs per node, and no job of another trial may share a node; the
            # output file named without %x: the node hooks do not know the job's name, and the
            # sidecar must find the file to follow it
            [
                *("sbatch", "--parsable", "--exclusive", "-N2", *self.sbatch_args),
                *("-o", f"{self.work}/{script.stem}-%j.out", str(script), *args),
            ],
            env=self.env,
            cwd=self.work,
            capture_output=True,
            text=True,
            check=True,
        )
        return int(out.stdout.split(";")[0])

    def job(self, job_id: int) -> Job | None:
        try:
            return self.sched.get_job(job_id)
        except SchedulerError:
            return None

    def running_nodes(self, job_id: int) -> list[str]:
        """The nodes of the job once Slurm shows it RUNNING (TimeoutError after 60 s)."""
        first = wait(lambda: (j := self.job(job_id)) and j.state == "RUNNING" and j, 60, POLL_S)
        return list(first.nodes)

    def incident(self, job_id: int, timeout: float = 60.0) -> dict[str, Any]:
        """The job's first incident, once the controller has closed it (it has an outcome)."""
        return wait(
            lambda: [i for i in job_incidents(self.client, job_id) if i["outcome"]],
            timeout=timeout,
            interval=0.2,
        )[0]

    def cleanup(self, job_id: int, nodes: list[str]) -> None:
        """Cancel the job, resume the nodes a trial may have drained, wait until they are idle."""
        subprocess.run(["scancel", str(job_id)], env=self.env, capture_output=True)
        for node in nodes:
            try:
                if self.sched.get_node(node).drained:
                    self.sched.resume_node(node)
            except SchedulerError:
                pass
        try:
            wait(lambda: not ((j := self.job(job_id)) and j.active), timeout=30, interval=0.2)
            wait(lambda: self._idle(nodes), timeout=30, interval=0.2)
        except TimeoutError:
            pass

    def _idle(self, nodes: list[str]) -> bool:
        try:
            shown = {n.name: n for n in self.sched.list_nodes()}
        except SchedulerError:
            return False
        return all(n in shown and not shown[n].drained for n in nodes)


def watch(
    get: Callable[[], Job | None], marks: dict[str, Callable[[Job], bool]], timeout: float
) -> dict[str, float]:
    """Poll the job every POLL_S; the wall time each mark's predicate is first true. Returns
    when the last mark (in order) is reached; TimeoutError names the marks not reached."""
    seen: dict[str, float] = {}
    last = list(marks)[-1]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = get()
        now = time.time()
        if job is not None:
            for name, test in marks.items():
                if name not in seen and test(job):
                    seen[name] = now
        if last in seen:
            return seen
        time.sleep(POLL_S)
    raise TimeoutError(f"not reached within {timeout:.0f} s: {[m for m in marks if m not in seen]}")


def task_pids(job_id: int, node: str) -> list[int]:
    """The job's task (``sleep``) on ``node`` (every node of the local cluster is this host):
    found by SLURM_JOB_ID and SLURMD_NODENAME in its environment, in a job step (not the batch
    script). By name: the TaskProlog runs with the same environment just before the task."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "sleep":
                continue
            raw = (entry / "environ").read_bytes()
        except OSError:
            continue
        env = dict(item.partition(b"=")[::2] for item in raw.split(b"\0") if item)
        if (
            env.get(b"SLURM_JOB_ID") == str(job_id).encode()
            and env.get(b"SLURMD_NODENAME") == node.encode()
            and env.get(b"SLURM_STEP_ID", b"batch").isdigit()
        ):
            found.append(int(entry.name))
    return found


def incident_fields(story: dict) -> dict:
    """What a trial records of its incident: kind, verdict, advice, outcome."""
    advice = story["advice"] or {}
    return {
        "incident": story["id"],
        "incident_kind": story["kind"],
        "fault_class": (advice.get("verdict") or {}).get("fault_class"),
        "advice": advice.get("action"),
        "exclude": advice.get("exclude"),
        "drain": advice.get("drain"),
        "outcome": story["outcome"],
    }


def latency(ms: dict[str, float], start: str, end: str) -> float | None:
    return ms[end] - ms[start] if start in ms and end in ms else None


def xid_trial(ours: Ours, kind: str, rng: random.Random, jitter: float) -> dict[str, Any]:
    """``crash`` or ``xid``: XID 79 on the job's second node (and for ``crash`` its task there
    killed); the job must run again on two other nodes, the node drained."""
    # A one-off XID dooms a job whose attempt started at most 2 s (+ the whole second) before it:
    # never start the next job that close to the last one, or it would inherit that fault.
    time.sleep(max(0.0, ours.last_xid + 4.0 - time.time()))
    job_id = ours.sbatch(ours.work / "step.sh")
    row: dict[str, Any] = {"job_id": job_id, "problems": []}
    nodes: list[str] = []
    try:
        nodes = ours.running_nodes(job_id)
        bad = nodes[-1]
        row["nodes"], row["node"] = nodes, bad
        # srun has started the task there (found now: a scan of /proc under load can take
        # longer than the controller needs to requeue the job once the XID is in)
        pids = wait(lambda: task_pids(job_id, bad), 30, POLL_S)
        time.sleep(rng.uniform(0, jitter))
        row["load_average"] = loadavg()
        failed = ours.last_xid = time.time()
        if kind == "crash":  # the task dies and the XID is logged in the same instant
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    row["problems"].append(f"task {pid} of job {job_id} gone before the fault")
            row["killed"] = len(pids)
        if ours.via == "sim" or kind == "crash":
            inject(ours.stack.base / "sim", bad, gpu=0, xid=79, message=FALLEN_OFF)
        else:
            event = event_to_json(
                "xid", failed, node=bad, gpu=0, payload={"xid": 79, "message": FALLEN_OFF}
            )
            ours.client.post_evidence([event], role="operator")
        seen = watch(
            lambda: ours.job(job_id),
            {
                "released": lambda j: j.restart_count >= 1 and not j.held,
                "running": lambda j: j.restart_count >= 1 and j.state == "RUNNING",
            },
            timeout=60,
        )
        again = ours.job(job_id)
        story = ours.incident(job_id)
        m = milestone_times(story)
        advice = story["advice"] or {}
        row.update(
            **incident_fields(story),
            detection=m["detected"] - failed,
            action=latency(m, "detected", "released"),
            action_seen=seen["released"] - m["detected"],
            end_to_end=seen["running"] - failed,
            controller=story["latencies"],
            nodes_again=list(again.nodes) if again else None,
        )
        if again is None or bad in again.nodes or again.restart_count != 1:
            row["problems"].append(f"running again on {row['nodes_again']}, includes {bad}")
        if bad not in (advice.get("exclude") or []):
            row["problems"].append(f"{bad} not excluded: {advice.get('exclude')}")
        if not ours.sched.get_node(bad).drained:
            row["problems"].append(f"{bad} not drained")
        if row["fault_class"] != "hardware":
            row["problems"].append(f"fault class {row['fault_class']}, not hardware")
    except (TimeoutError, SchedulerError, IndexError, KeyError) as exc:
        row["problems"].append(f"{type(exc).__name__}: {exc}")
    finally:
        ours.cleanup(job_id, nodes)
    return row


def hang_trial(ours: Ours, steps: int) -> dict[str, Any]:
    """The job stops stepping; it must be declared hung and run again."""
    job_id = ours.sbatch(ours.work / "hang.sh")
    row: dict[str, Any] = {"job_id": job_id, "problems": []}
    nodes: list[str] = []
    try:
        nodes = ours.running_nodes(job_id)
        row["nodes"] = nodes
        row["load_average"] = loadavg()
        seen = watch(
            lambda: ours.job(job_id),
            {
                "released": lambda j: j.restart_count >= 1 and not j.held,
                "running": lambda j: j.restart_count >= 1 and j.state == "RUNNING",
            },
            timeout=steps * 0.5 + 60,
        )
        failed = float((ours.work / f"progress-{job_id}-0").read_text())  # the last progress
        story = ours.incident(job_id)
        m = milestone_times(story)
        advice = story["advice"] or {}
        again = ours.job(job_id)
        row.update(
            **incident_fields(story),
            deadline=m["failure"] - failed,
            overshoot=hang_overshoot(story),
            detection=m["detected"] - failed,
            action=latency(m, "detected", "released"),
            action_seen=seen["released"] - m["detected"],
            end_to_end=seen["running"] - failed,
            controller=story["latencies"],
            nodes_again=list(again.nodes) if again else None,
        )
        if story["kind"] != "hang":
            row["problems"].append(f"incident kind {story['kind']}, not hang")
        if advice.get("action") == "stop":
            row["problems"].append("stopped, not restarted")
    except (TimeoutError, SchedulerError, OSError, ValueError, IndexError, KeyError) as exc:
        row["problems"].append(f"{type(exc).__name__}: {exc}")
    finally:
        ours.cleanup(job_id, nodes)
    return row


def app_bug_trial(ours: Ours, rng: random.Random, jitter: float) -> dict[str, Any]:
    """Every rank raises in user code: stopped, no node blamed, not requeued."""
    job_id = ours.sbatch(ours.work / "app_bug.sh", f"{1.0 + rng.uniform(0, jitter):.3f}")
    row: dict[str, Any] = {"job_id": job_id, "problems": []}
    nodes: list[str] = []
    try:
        nodes = ours.running_nodes(job_id)
        row["nodes"] = nodes
        row["load_average"] = loadavg()
        story = ours.incident(job_id)
        stamps = list(ours.work.glob(f"raised-{job_id}-*"))
        failed = min(float(p.read_text()) for p in stamps)
        m = milestone_times(story)
        advice = story["advice"] or {}
        verdict = advice.get("verdict") or {}
        row.update(
            **incident_fields(story),
            blamed=verdict.get("nodes"),
            detection=m["detected"] - failed,
            action=latency(m, "detected", "stopped"),
            controller=story["latencies"],
        )
        time.sleep(3)  # a few controller passes: nothing may requeue it
        job = ours.job(job_id)
        row["final_state"] = job.state if job else None
        if advice.get("action") != "stop":
            row["problems"].append(f"advice {advice.get('action')}, not stop")
        if verdict.get("fault_class") != "application":
            row["problems"].append(f"fault class {verdict.get('fault_class')}, not application")
        if verdict.get("nodes") or advice.get("exclude") or advice.get("drain"):
            row["problems"].append(
                f"a node blamed: {verdict.get('nodes')} excluded {advice.get('exclude')} "
                f"drained {advice.get('drain')}"
            )
        if job is None or job.restart_count != 0 or job.active:
            row["problems"].append(f"job {job_id} requeued or still active: {job}")
        drained = [n.name for n in ours.sched.list_nodes() if n.name in nodes and n.drained]
        if drained:
            row["problems"].append(f"nodes drained: {drained}")
    except (TimeoutError, SchedulerError, OSError, ValueError, KeyError) as exc:
        row["problems"].append(f"{type(exc).__name__}: {exc}")
    finally:
        ours.cleanup(job_id, nodes)
    return row


def describe(kind: str, trial: int, row: dict[str, Any]) -> str:
    if "detection" not in row:
        return f"{kind:>7} {trial:>2}: job {row['job_id']} FAILED: {'; '.join(row['problems'])}"
    parts = [f"{kind:>7} {trial:>2}: job {row['job_id']} {row['incident_kind']}"]
    parts.append(f"detection {row['detection']:.2f} s")
    if row.get("overshoot") is not None:
        parts.append(f"(overshoot {row['overshoot']:.2f} s)")
    if row.get("action") is not None:
        parts.append(f"action {row['action']:.2f} s")
    if row.get("end_to_end") is not None:
        parts.append(f"end to end {row['end_to_end']:.2f} s")
    parts.append(f"load {row['load_average'][0]:.2f}")
    status = "ok" if not row["problems"] else "OUTCOME FAILED: " + "; ".join(row["problems"])
    return " ".join(parts) + f" -> {row.get('outcome')} [{status}]"


def run_ours(args: argparse.Namespace, trials: int) -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(args.seed)
    # A fresh stack and store: an earlier run's incidents would be read as this run's (Slurm
    # starts job ids at 1 again)
    devstack.down(args.base)
    shutil.rmtree(args.base, ignore_errors=True)
    stack = devstack.up(
        args.base,
        nodes=args.nodes,
        mode="act",
        port_base=args.port_base,
        api_port=args.api_port,
        policy_extra=HANG_POLICY,
    )
    work = run_directory("latency-work", keep=args.keep)
    (work / "step.sh").write_text(STEP_JOB)
    (work / "hang.sh").write_text(hang_training_script(args.hang_steps, stamp_dir=work))
    (work / "app_bug.py").write_text(APP_BUG)
    (work / "app_bug.sh").write_text(
        f'#!/bin/bash\nsrun --kill-on-bad-exit=1 python3 -u {work / "app_bug.py"} "$1" {work}\n'
    )
    ours = Ours(
        stack=stack,
        sched=ScontrolScheduler(timeout=10, slurm_conf=str(stack.cluster.slurm_conf)),
        client=ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket)),
        env=localcluster.slurm_env(stack.cluster),
        work=work,
        via=args.via,
    )
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in args.kinds}
    try:
        # interleaved (crash, xid, hang, app bug, crash, ...): a drift in the machine's load
        # falls on every kind alike
        for trial in range(1, trials + 1):
            for kind in args.kinds:
                try:
                    if kind in ("crash", "xid"):
                        row = xid_trial(ours, kind, rng, args.jitter)
                    elif kind == "hang":
                        row = hang_trial(ours, args.hang_steps)
                    else:
                        row = app_bug_trial(ours, rng, args.jitter)
                except Exception as exc:  # counted as a failed trial and shown, not hidden
                    row = {"job_id": None, "problems": [f"{type(exc).__name__}: {exc}"]}
                row["trial"] = trial
                rows[kind].append(row)
                print(describe(kind, trial, row), flush=True)
    finally:
        if not args.keep:
            devstack.down(args.base)
    return rows


# --- the baseline: plain Slurm ----------------------------------------------------------------


def run_baseline(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Waves of ``--baseline-wave`` 2-node ``--requeue`` jobs on a plain cluster; in each, every
    job's second node set DOWN by hand at a random point 0..jitter s after all run; each job's
    time until it runs again elsewhere."""
    rng = random.Random(args.seed + 1)
    spec = localcluster.ClusterSpec(
        base=args.baseline_base / "cluster",
        nodes=args.baseline_nodes,
        port_base=args.baseline_port_base,
        name="srbase",
    )
    if args.baseline_wave * 4 > args.baseline_nodes + args.baseline_wave:
        raise SystemExit(
            f"--baseline-nodes {args.baseline_nodes} too few for waves of {args.baseline_wave} "
            "2-node jobs (each needs 2 nodes, then 2 others once one of its own is down)"
        )
    args.baseline_base.mkdir(parents=True, exist_ok=True)
    work = run_directory("baseline-work", keep=args.keep)
    (work / "step.sh").write_text(STEP_JOB)
    rows: list[dict[str, Any]] = []
    try:
        localcluster.down(spec.base)
        localcluster.up(spec, timeout=180)
        sched = ScontrolScheduler(timeout=20, slurm_conf=str(spec.slurm_conf))
        env = localcluster.slurm_env(spec)
        while len(rows) < args.baseline_trials:
            size = min(args.baseline_wave, args.baseline_trials - len(rows))
            rows += baseline_wave(sched, env, work, size, rng, args.jitter, len(rows))
    finally:
        if not args.keep:
            localcluster.down(spec.base)
    return rows


def baseline_wave(
    sched: ScontrolScheduler,
    env: dict[str, str],
    work: Path,
    size: int,
    rng: random.Random,
    jitter: float,
    done: int,
) -> list[dict[str, Any]]:
    ids = []
    for _ in range(size):
        out = subprocess.run(
            [
                *("sbatch", "--parsable", "--requeue", "--exclusive", "-N2"),
                *("-o", f"{work}/step-%j.out", "step.sh"),
            ],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            check=True,
        )
        ids.append(int(out.stdout.split(";")[0]))

    def jobs() -> dict[int, Job]:
        try:
            return {j.job_id: j for j in sched.list_jobs() if j.job_id in ids}
        except SchedulerError:
            return {}

    first = wait(
        lambda: (js := jobs()) and all(js.get(i) and js[i].state == "RUNNING" for i in ids) and js,
        timeout=120,
        interval=0.5,
    )
    rows = {
        i: {"trial": done + n + 1, "job_id": i, "nodes": list(first[i].nodes), "problems": []}
        for n, i in enumerate(ids)
    }
    # each job's fault at its own random moment; Slurm is polled in between (every 0.25 s:
    # these times are minutes)
    downs = sorted((rng.uniform(0, jitter), i) for i in ids)
    start = time.time()
    pending = set(ids)
    deadline = time.monotonic() + 400
    while pending and time.monotonic() < deadline:
        while downs and start + downs[0][0] <= time.time():
            _, i = downs.pop(0)
            bad = rows[i]["nodes"][-1]
            rows[i]["node"] = bad
            rows[i]["load_average"] = loadavg()
            rows[i]["failure"] = time.time()
            # drain, then down: DOWN requeues the job, and the drain keeps the node out once
            # it answers again (ReturnToService=2 brings a DOWN node back within 0.1 s here)
            for state in ("drain", "down"):
                subprocess.run(
                    ["scontrol", "update", f"nodename={bad}", f"state={state}", f"reason={REASON}"],
                    env=env,
                    check=True,
                    capture_output=True,
                )
        shown = jobs()
        now = time.time()
        for i in list(pending):
            job, row = shown.get(i), rows[i]
            if job is None or "failure" not in row:
                continue
            if job.restart_count >= 1 and "requeued" not in row:
                row["requeued"] = now - row["failure"]
            if job.restart_count >= 1 and job.state == "PENDING" and "begin_delay" not in row:
                row["pending_reason"] = job.reason
                row["begin_delay"] = job.begin_time - row["failure"] if job.begin_time else None
            if job.restart_count >= 1 and job.state == "RUNNING":
                row["end_to_end"] = now - row["failure"]
                row["nodes_again"] = list(job.nodes)
                if row["node"] in job.nodes:
                    row["problems"].append(f"running again on {job.nodes}, includes the DOWN node")
                pending.discard(i)
        time.sleep(0.25)
    for i in pending:
        rows[i]["problems"].append("not running again within 400 s")
    subprocess.run(["scancel", *map(str, ids)], env=env, capture_output=True)
    for row in rows.values():
        subprocess.run(
            ["scontrol", "update", f"nodename={row['node']}", "state=resume"],
            env=env,
            capture_output=True,
        )
        print(
            f"baseline {row['trial']:>2}: job {row['job_id']} {row['node']} set DOWN -> "
            + (
                f"requeued after {row.get('requeued', float('nan')):.1f} s, begin time "
                f"+{row.get('begin_delay') or float('nan'):.0f} s ({row.get('pending_reason')}), "
                f"running again on {','.join(row.get('nodes_again') or [])} after "
                f"{row['end_to_end']:.1f} s"
                if "end_to_end" in row
                else ""
            )
            + f" load {row['load_average'][0]:.2f}"
            + (" [FAILED: " + "; ".join(row["problems"]) + "]" if row["problems"] else " [ok]"),
            flush=True,
        )
    try:
        wait(lambda: not any(j.active for j in jobs().values()), timeout=60, interval=0.5)
    except TimeoutError:
        print("baseline: some jobs still ending after 60 s; going on", flush=True)
    return list(rows.values())


# --- the report --------------------------------------------------------------------------------


def summarize(ours: dict[str, list[dict]], baseline: list[dict] | None) -> dict[str, Any]:
    def q(rows: list[dict], key: str) -> dict[str, float]:
        return quantiles([r[key] for r in rows if r.get(key) is not None])

    out: dict[str, Any] = {}
    base_e2e = q(baseline, "end_to_end") if baseline else None
    for kind, rows in ours.items():
        failed = [r for r in rows if r["problems"]]
        entry = {
            "trials": len(rows),
            "failed": len(failed),
            "failures": [
                {"trial": r["trial"], "job_id": r["job_id"], "problems": r["problems"]}
                for r in failed
            ],
            "detection": q(rows, "detection"),
            "action": q(rows, "action"),
            "action_seen": q(rows, "action_seen"),
            "end_to_end": q(rows, "end_to_end"),
        }
        if kind == "hang":
            entry["deadline"] = q(rows, "deadline")
            entry["overshoot"] = q(rows, "overshoot")
        e2e = entry["end_to_end"]
        # the baseline is a node fault an admin acted on at once: it compares with the node
        # faults only (plain Slurm does not notice a hang at all)
        if kind in ("crash", "xid") and base_e2e and base_e2e["n"] and e2e["n"]:
            entry["ratio_p50"] = base_e2e["p50"] / e2e["p50"]
        out[kind] = entry
    if baseline is not None:
        out["baseline"] = {
            "trials": len(baseline),
            "failed": sum(1 for r in baseline if r["problems"]),
            "failures": [
                {"trial": r["trial"], "job_id": r["job_id"], "problems": r["problems"]}
                for r in baseline
                if r["problems"]
            ],
            "requeued": q(baseline, "requeued"),
            "begin_delay": q(baseline, "begin_delay"),
            "end_to_end": base_e2e,
        }
    return out


def fmt(qs: dict[str, float] | None) -> str:
    if not qs or not qs.get("n"):
        return f"{'-':>23}"
    return f"{qs['p50']:7.2f} {qs['p95']:7.2f} {qs['max']:7.2f}"


def print_table(summary: dict[str, Any], load: dict[str, list[float]], baseline_note: str) -> None:
    print(
        f"\nseconds: p50 p95 max; load average (1, 5, 15 min) at the start "
        f"{load['start']}, at the end {load['end']} on {os.cpu_count()} CPUs"
    )
    head = f"{'fault kind':30} {'ok/n':>6}  {'detection':^23}  {'action':^23}  {'end to end':^23}"
    print(head + "  ratio")
    for kind in KINDS:
        if kind not in summary:
            continue
        s = summary[kind]
        ratio = f"{s['ratio_p50']:6.1f}x" if "ratio_p50" in s else "     -"
        ok = f"{s['trials'] - s['failed']}/{s['trials']}"
        print(
            f"{TITLES[kind]:30} {ok:>6}  {fmt(s['detection'])}  {fmt(s['action'])}  "
            f"{fmt(s['end_to_end'])}  {ratio}"
        )
        if kind == "hang":
            print(f"{'  the hang deadline (policy)':30} {'':>6}  {fmt(s['deadline'])}")
            print(f"{'  hang overshoot past deadline':30} {'':>6}  {fmt(s['overshoot'])}")
    if "baseline" in summary:
        b = summary["baseline"]
        ok = f"{b['trials'] - b['failed']}/{b['trials']}"
        print(
            f"{'plain Slurm, node DOWN by hand':30} {ok:>6}  {'(at the fault: 0)':>23}  "
            f"{fmt(b['requeued'])}  {fmt(b['end_to_end'])}"
        )
        print(f"{'  Slurm begin-time delay':30} {'':>6}  {fmt(b['begin_delay'])}")
        print(
            "ratio: plain Slurm's end-to-end p50 / ours, for the node faults (plain Slurm does "
            "not notice a hang); plain Slurm's 'action' is the DOWN command -> the job requeued."
        )
    else:
        print(baseline_note)
    print("\nplain Slurm with nobody acting (no restart, so no time to compare):")
    for kind in KINDS:
        print(f"  {TITLES[kind]}: {PLAIN_SLURM[kind]}")
    for kind, s in summary.items():
        for f in s.get("failures", []):
            print(f"FAILED {kind} trial {f['trial']} job {f['job_id']}: {'; '.join(f['problems'])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="per fault kind (default 20)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 trial per kind, no baseline (it takes over 2 minutes: Slurm's requeue delay)",
    )
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--nodes", type=int, default=4, help="nodes of our stack (default 4)")
    add_stack_options(parser)
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
        choices=("sim", "report"),
        default="sim",
        help="how the XID of the 'xid' kind arrives. sim (default): injected into the node's "
        "simulated GPU, read and sent by that node's sidecar (the production path); report: "
        "an operator's signed XID report over HTTP. The 'crash' kind always uses sim",
    )
    parser.add_argument("--hang-steps", type=int, default=12, help="steps before the hang")
    parser.add_argument("--no-baseline", action="store_true", help="skip plain Slurm")
    parser.add_argument("--baseline-trials", type=int, help="default: --trials")
    parser.add_argument("--baseline-nodes", type=int, default=32)
    parser.add_argument("--baseline-wave", type=int, default=10, help="jobs at once")
    parser.add_argument("--baseline-base", type=Path, help="default: a new directory")
    parser.add_argument("--baseline-port-base", type=int, help="default: free ports")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--keep", action="store_true", help="leave the stacks running")
    args = parser.parse_args()
    fill_stack_options(args, "latency")
    if args.baseline_base is None:
        args.baseline_base = run_directory("baseline", keep=args.keep)
    if args.baseline_port_base is None:
        args.baseline_port_base = localcluster.free_port_block(
            args.baseline_nodes + 1, start=args.api_port + 1
        )
    # SIGTERM (a CI timeout, kill PID) stops the stacks too: the finally clauses run
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    trials = 1 if args.quick else args.trials
    args.baseline_trials = args.baseline_trials or trials
    load = {"start": loadavg()}
    print(
        f"recovery latency: {trials} trial(s) of each of {', '.join(args.kinds)}; "
        f"load average {load['start']} on {os.cpu_count()} CPUs",
        flush=True,
    )
    started = time.time()
    ours = run_ours(args, trials)
    baseline_note = ""
    baseline = None
    if args.quick or args.no_baseline:
        baseline_note = (
            "baseline (plain Slurm) skipped"
            + (" in --quick mode" if args.quick else " (--no-baseline)")
            + ": each of its trials takes over 2 minutes, Slurm's ~121 s begin-time delay after "
            "every requeue"
        )
        print(baseline_note, flush=True)
    else:
        print(
            f"\nbaseline: plain Slurm, {args.baseline_trials} --requeue jobs in waves of "
            f"{args.baseline_wave} on {args.baseline_nodes} nodes, node set DOWN by hand at the "
            "fault",
            flush=True,
        )
        baseline = run_baseline(args)
    load["end"] = loadavg()
    summary = summarize(ours, baseline)
    print_table(summary, load, baseline_note)
    write_json(
        args.json,
        "recovery_latency",
        {
            "summary": summary,
            "ours": ours,
            "baseline": baseline,
            "baseline_skipped": baseline_note or None,
            "plain_slurm_without_action": PLAIN_SLURM,
            "load_average": load,
            "seconds": time.time() - started,
            "settings": {
                "trials": trials,
                "kinds": args.kinds,
                "nodes": args.nodes,
                "jitter": args.jitter,
                "seed": args.seed,
                "via": args.via,
                "hang_steps": args.hang_steps,
                "hang_policy": HANG_POLICY.strip(),
                "baseline_nodes": args.baseline_nodes,
                "baseline_wave": args.baseline_wave,
                "poll_s": POLL_S,
            },
        },
        args.quick,
    )
    return 0  # outcome failures are counted and listed above, never a crash of the benchmark


if __name__ == "__main__":
    sys.exit(main())
