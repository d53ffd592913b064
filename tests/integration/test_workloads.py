"""Real PyTorch jobs that really fail, on the production path.

`srecovery dev up --mode act` (cluster with the hooks, controller, watchdog, a sidecar per node)
with a policy tuned for test speed, and tiny multi-node DistributedDataParallel jobs
(tests/workloads/ddp_job.py: CPU, gloo, torch 2.13) submitted with ``sbatch --requeue
--exclusive``, one task per node. Each job injects one real fault: a rank killed (crash), a
rank that stops between two collectives and one that stops before a collective (hangs), a
rank that does 4x its work from some step on (slow), a tensor shape mismatch in user code
(application bug); one runs clean. All jobs are submitted once the stack is up and run side
by side on nodes of their own; each test then checks its own job through the controller's
API, the store and ``srecovery explain``. docs/progress.md, "Real workloads in the tests".

PyTorch missing fails every test here (it is part of ``scripts/bootstrap``); it never skips.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ClientError, ControllerClient
from slurm_recovery.scheduler.base import Job
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.store import Store
from tests.conftest import _free_port_block, wait_for, wait_passes

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

WORKLOAD = Path(__file__).resolve().parents[1] / "workloads" / "ddp_job.py"
TORCH_VERSION = "2.13"
NODES = 13  # every job on nodes of its own (--exclusive), all at once

#: Fast verdicts: a job stepping every ~0.3 s is hung after a few seconds without progress, and
#: a throughput drop of half or more that lasts 4 s is a straggler.
POLICY = """
[hang]
floor = "3s"
ceiling = "20s"
interval_multiple = 3.0
startup_grace = "1m"

[straggler]
baseline_window = "6s"
rate_interval = "1s"
min_duration = "4s"
drop_percent = 50.0
rank_lag_percent = 50.0
"""

#: The seconds a step takes; the fault steps below come after a checkpoint (every 5 steps).
STEP = 0.3
FAULT_RANK = 1


@dataclass(frozen=True)
class Case:
    name: str
    nodes: int
    args: tuple[str, ...]


#: Submitted in this order: the slow and the hang jobs need the longest, so they go first.
CASES = (
    Case(
        "slow", 2, ("--fault", "slow", "--fault-step", "25", "--slow-factor", "4", "--steps", "45")
    ),
    Case("hang", 3, ("--fault", "hang", "--fault-step", "12", "--steps", "20")),
    Case("crash", 2, ("--fault", "crash", "--fault-step", "8", "--steps", "20")),
    Case(
        "hang_before",
        2,
        ("--fault", "hang", "--hang-point", "before-sync", "--fault-step", "12", "--steps", "20"),
    ),
    Case("app_bug", 2, ("--fault", "app-bug", "--fault-step", "8", "--steps", "20")),
    Case("clean", 2, ("--fault", "none", "--steps", "20")),
)

SCRIPT = """#!/bin/bash
# {name}: attempt ${{SLURM_RESTART_COUNT:-0}} on $SLURM_JOB_NODELIST
export GLOO_SOCKET_IFNAME=lo  # every node of the local cluster is this host (127.0.0.1)
# the job's own progress file interval: every step is written (see docs/progress.md)
export SRECOVERY_PROGRESS_INTERVAL=0
srun --ntasks-per-node=1 {python} -u {workload} \\
    --master-port $(({port} + ${{SLURM_RESTART_COUNT:-0}})) --ckpt-dir {ckpt} \\
    --step-sleep {step} --fault-rank {rank} {args}
"""


@dataclass(frozen=True)
class Submitted:
    case: Case
    job_id: int
    out: Path

    def log(self) -> str:
        try:
            return self.out.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def rank_node(self, rank: int) -> str:
        """The node a rank ran on, from the job's own first line for that rank."""
        found = re.search(rf"\[ddp_job rank {rank} t=[\d.]+\] node (\S+) ", self.log())
        assert found, f"no start line for rank {rank} in:\n{self.log()}"
        return found.group(1)

    def event_time(self, rank: int, text: str) -> float:
        found = re.search(
            rf"\[ddp_job rank {rank} t=([\d.]+)\] [^\n]*{re.escape(text)}", self.log()
        )
        assert found, f"no {text!r} from rank {rank} in:\n{self.log()}"
        return float(found.group(1))


@pytest.fixture(scope="module", autouse=True)
def torch_installed() -> str:
    """The jobs run this interpreter: PyTorch must be importable in it (never a skip)."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch, torch.distributed as d; print(torch.__version__, d.is_gloo_available())",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.fail(
            f"PyTorch is not installed in {sys.executable} ({last}): these tests run real "
            f"torch {TORCH_VERSION} jobs. Run scripts/bootstrap (pip install torch==2.13.0).",
            pytrace=False,
        )
    version, gloo = probe.stdout.split()
    if not version.startswith(TORCH_VERSION) or gloo != "True":
        pytest.fail(
            f"{sys.executable} has torch {version} (gloo available: {gloo}); these tests are "
            f"written for torch {TORCH_VERSION} CPU with gloo: run scripts/bootstrap",
            pytrace=False,
        )
    return version


@pytest.fixture(scope="module")
def stack(local_cluster, torch_installed) -> Iterator[devstack.DevStack]:
    base = Path(tempfile.mkdtemp(prefix="srecovery-workloads-"))
    base.chmod(0o755)
    port = _free_port_block(NODES + 3, start=local_cluster.port_base + 1100)
    stack = devstack.up(
        base,
        nodes=NODES,
        mode="act",
        port_base=port,
        api_port=port + NODES + 2,
        policy_extra=POLICY,
    )
    try:
        yield stack
    finally:
        devstack.down(base)


@pytest.fixture(scope="module")
def sched(stack) -> ScontrolScheduler:
    return ScontrolScheduler(timeout=10, slurm_conf=str(stack.cluster.slurm_conf))


@pytest.fixture(scope="module")
def client(stack) -> ControllerClient:
    return ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))


@pytest.fixture(scope="module")
def jobs(stack, tmp_path_factory) -> Iterator[dict[str, Submitted]]:
    """Every case's job, submitted at once (they run side by side); cancelled at the end."""
    env = localcluster.slurm_env(stack.cluster)
    work = tmp_path_factory.mktemp("workloads")
    work.chmod(0o755)
    # Below the kernel's ephemeral range (32768-60999): a port free now can be handed to any
    # outgoing connection before the job listens on it (seen: EADDRINUSE at init_process_group).
    ports = _free_port_block(3 * len(CASES), start=20000, stop=32000)
    submitted: dict[str, Submitted] = {}
    for i, case in enumerate(CASES):
        script = work / f"{case.name}.sh"
        script.write_text(
            SCRIPT.format(
                name=case.name,
                python=sys.executable,
                workload=WORKLOAD,
                port=ports + 3 * i,
                ckpt=work / f"{case.name}-ckpt",
                step=STEP,
                rank=FAULT_RANK,
                args=" ".join(case.args),
            )
        )
        out = work / f"{case.name}-%j.out"
        job_id = int(
            subprocess.run(
                [
                    "sbatch",
                    "--parsable",
                    "--requeue",
                    "--exclusive",
                    f"-N{case.nodes}",
                    "--ntasks-per-node=1",
                    f"--job-name={case.name}",
                    "--open-mode=append",
                    "-o",
                    str(out),
                    str(script),
                ],
                env=env,
                cwd="/tmp",
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split(";")[0]
        )
        submitted[case.name] = Submitted(case, job_id, work / f"{case.name}-{job_id}.out")
    try:
        yield submitted
    finally:
        subprocess.run(["scancel", *(str(s.job_id) for s in submitted.values())], env=env)
        for name, s in submitted.items():  # kept for the record (pytest -s shows them)
            print(f"\n===== {name}: job {s.job_id}, {s.out}\n{s.log()[-6000:]}")


# ------------------------------------------------------------------------------ helpers


def stories(client: ControllerClient, job_id: int) -> list[dict[str, Any]]:
    """The job's incidents as the controller tells them (oldest first); none: []."""
    try:
        return client.get(f"/v1/jobs/{job_id}")["incidents"]
    except ClientError as exc:
        if exc.status == 404:
            return []
        raise


def summaries(stack, job_id: int) -> dict[int, tuple[str, str]]:
    """incident id -> (kind, summary), from the store (the API does not show summaries)."""
    out = {}
    with Store.open(stack.base / "state.db", readonly=True) as store:
        for incident in store.list_incidents(limit=10_000):
            attempt = store.get_attempt(incident.attempt_id)
            if attempt is not None and attempt.attempt.job_id == job_id:
                out[incident.id] = (incident.kind, incident.summary)
    return out


def evidence(stack, job_id: int, kind: str) -> list[Any]:
    with Store.open(stack.base / "state.db", readonly=True) as store:
        return [e for e in store.find_evidence(job_id=job_id) if e.evidence.kind == kind]


def explain(stack, job_id: int) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "slurm_recovery.cli", "explain", str(job_id)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **stack.exports()},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def when(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def finished(sched: ScontrolScheduler, job_id: int, restart_count: int) -> Job | None:
    job = sched.get_job(job_id)
    if job.restart_count == restart_count and not job.active:
        return job
    return None


def first_incident(client, job: Submitted, timeout: float) -> dict[str, Any]:
    found = wait_for(lambda: stories(client, job.job_id), timeout=timeout, interval=0.25)
    return found[0]


def context(job: Submitted, story: dict[str, Any] | None = None) -> str:
    told = "" if story is None else f"\nincident: {story}"
    return f"{told}\njob {job.job_id} log:\n{job.log()[-4000:]}"


# ------------------------------------------------------------------------------ the cases


def test_a_killed_rank_is_a_crash_that_blames_no_surviving_node(stack, sched, client, jobs):
    """Rank 1 SIGKILLs itself; the survivors fail in the all-reduce with gloo's "Connection
    closed by peer". A CRASH, cause unknown, requeued without exclusion; nobody's node blamed.
    The requeued attempt resumes from the step-5 checkpoint and finishes."""
    job = jobs["crash"]
    story = first_incident(client, job, timeout=120)
    assert story["kind"] == "crash", context(job, story)
    assert story["restart_count"] == 0
    advice = story["advice"]
    assert advice["action"] == "requeue", context(job, story)
    assert advice["verdict"]["fault_class"] == "unknown", context(job, story)
    assert advice["verdict"]["nodes"] == [] and advice["exclude"] == [] and advice["drain"] == []

    signatures = evidence(stack, job.job_id, "log_signature")
    gloo = [e for e in signatures if e.evidence.payload["signature"] == "gloo.connection_closed"]
    assert gloo, f"the survivors' gloo errors were not recognised{context(job, story)}"
    for e in signatures:  # no survivor's line blames its node or reads as an application bug
        payload = e.evidence.payload
        assert payload["blame_node"] is False, payload
        assert payload["fault_class"] != "application", payload

    done = wait_for(lambda: finished(sched, job.job_id, 1), timeout=120)
    assert done.state == "COMPLETED", context(job)
    assert "resumed from checkpoint at step 5" in job.log()
    assert not any(sched.get_node(n).drained for n in done.nodes)
    assert len(stories(client, job.job_id)) == 1  # the clean second attempt: no incident
    # the output file is appended to: the first attempt's lines are not the second's evidence
    again = [
        e
        for e in evidence(stack, job.job_id, "log_signature")
        if e.evidence.payload.get("restart_count") == 1
    ]
    assert again == [], [e.evidence.payload for e in again]


def test_an_application_bug_is_stopped_and_blames_no_node(stack, sched, client, jobs):
    """Rank 1 feeds a wrongly shaped tensor to the model: torch raises "mat1 and mat2 shapes
    cannot be multiplied". Fault class application, action stop, no node blamed, the job not
    restarted, and the traceback's last line among the signatures."""
    job = jobs["app_bug"]
    # The other ranks may run on for seconds after rank 1's exception (gloo notices the lost
    # peer): the log line alone is advice only (app_fault, action none); the job's crash is
    # what stops it, judged with the same lines.
    story = wait_for(
        lambda: next((s for s in stories(client, job.job_id) if s["kind"] == "crash"), None),
        timeout=120,
        interval=0.25,
    )
    advice = story["advice"]
    verdict = advice["verdict"]
    assert verdict["fault_class"] == "application", context(job, story)
    assert advice["action"] == "stop", context(job, story)
    assert verdict["nodes"] == [] and advice["exclude"] == [] and advice["drain"] == []

    decisive = [
        e["payload"]
        for e in story["evidence"]
        if e["kind"] == "log_signature" and e["payload"]["fault_class"] == "application"
    ]
    assert any(
        p["signature"] == "python.exception"
        and "mat1 and mat2 shapes cannot be multiplied" in p["text"]
        for p in decisive
    ), context(job, story)

    ended = wait_for(
        lambda: (
            (j := sched.get_job(job.job_id)).state
            not in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING")
            and j
        ),
        timeout=60,
    )
    wait_passes(stack.url, 3)  # a few controller passes: nothing may requeue it
    assert sched.get_job(job.job_id).restart_count == 0, context(job, story)
    assert ended.state in ("FAILED", "CANCELLED"), ended
    others = [s for s in stories(client, job.job_id) if s["id"] != story["id"]]
    assert all(s["kind"] == "app_fault" and s["advice"]["action"] == "none" for s in others)
    told = explain(stack, job.job_id)
    assert "verdict  application nodes=-" in told and "advice   stop" in told, told


def test_a_rank_that_stops_between_collectives_is_a_hang_naming_it(stack, sched, client, jobs):
    """Rank 1 of 3 stops after step 12's all-reduce and never joins another collective; ranks
    0 and 2 finish step 12 and wait in step 13's all-reduce (gloo would wait 5 minutes). A HANG
    within seconds of the deadline, naming rank 1 and its node as the one that stopped first;
    requeued, it resumes from the step-10 checkpoint and finishes."""
    job = jobs["hang"]
    story = first_incident(client, job, timeout=120)
    assert story["kind"] == "hang", context(job, story)
    stuck_node = job.rank_node(FAULT_RANK)
    stopped_at = job.event_time(FAULT_RANK, "hang after the all-reduce")
    detected = when(story["milestones"]["detected"])
    deadline_passed = when(story["milestones"]["failure"])
    print(
        f"hang: rank {FAULT_RANK} on {stuck_node} stopped at {stopped_at:.2f}, deadline passed "
        f"{deadline_passed - stopped_at:.2f}s later, detected {detected - stopped_at:.2f}s after "
        f"the stop ({detected - deadline_passed:.2f}s after the deadline)"
    )
    assert detected - deadline_passed < 5.0, context(job, story)
    assert detected - stopped_at < 60.0, "found by gloo's timeout, not by slurm-recovery?"

    ((kind, summary),) = summaries(stack, job.job_id).values()
    assert kind == "hang"
    assert f"stopped first: rank {FAULT_RANK} on {stuck_node}" in summary, (
        f"summary {summary!r}{context(job, story)}"
    )
    others = {job.rank_node(r) for r in range(job.case.nodes)} - {stuck_node}
    assert not any(node in summary for node in others), summary
    verdict = story["advice"]["verdict"]
    assert set(verdict["nodes"]) <= {stuck_node}, verdict  # never a waiting rank's node
    assert story["advice"]["action"] in ("requeue", "requeue_exclude"), context(job, story)

    done = wait_for(lambda: finished(sched, job.job_id, 1), timeout=120)
    assert done.state == "COMPLETED", context(job)
    assert "resumed from checkpoint at step 10" in job.log()


def test_a_rank_that_stops_before_the_collective_is_a_hang_that_names_no_one(
    stack, sched, client, jobs
):
    """Rank 1 stops before step 12's forward pass; rank 0 waits in step 12's all-reduce. Both
    last finished step 11: progress cannot tell which rank stopped, so the HANG (within
    seconds of the deadline) names no rank and blames no node; requeued, the job finishes."""
    job = jobs["hang_before"]
    story = first_incident(client, job, timeout=120)
    assert story["kind"] == "hang", context(job, story)
    stopped_at = job.event_time(FAULT_RANK, "hang before the forward pass")
    detected = when(story["milestones"]["detected"])
    assert detected - when(story["milestones"]["failure"]) < 5.0, context(job, story)
    assert detected - stopped_at < 60.0, "found by gloo's timeout, not by slurm-recovery?"
    ((kind, summary),) = summaries(stack, job.job_id).values()
    assert kind == "hang" and "last step 11" in summary, f"summary {summary!r}{context(job)}"
    assert "stopped first" not in summary, summary
    assert story["advice"]["verdict"]["nodes"] == [], story["advice"]
    assert story["advice"]["action"] == "requeue", context(job, story)
    done = wait_for(lambda: finished(sched, job.job_id, 1), timeout=120)
    assert done.state == "COMPLETED", context(job)


def test_a_rank_that_slows_down_is_a_straggler_naming_its_node(stack, sched, client, jobs):
    """From step 25 rank 1 does 4x its work each step; rank 0 waits for it in every
    all-reduce, so the job's throughput falls by three quarters. A straggler incident whose
    summary or verdict names rank 1's node (its own step_time lags), and no other node."""
    job = jobs["slow"]
    story = first_incident(client, job, timeout=150)
    assert story["kind"] == "straggler" and story["restart_count"] == 0, context(job, story)
    kind, summary = summaries(stack, job.job_id)[story["id"]]
    assert kind == "straggler"
    slow_node = job.rank_node(FAULT_RANK)
    fast_node = job.rank_node(0)
    verdict = story["advice"]["verdict"]
    told = f"{summary} {verdict.get('cause', '')}"
    assert slow_node in told or slow_node in verdict["nodes"], f"{told!r}{context(job, story)}"
    assert fast_node not in told and fast_node not in verdict["nodes"], told
    started = job.event_time(FAULT_RANK, "node")  # for the record
    after = when(story["milestones"]["detected"]) - started
    print(f"straggler: {summary!r}; {after:.1f}s after the job started")


def test_a_straggler_restarted_off_its_slow_node_runs_on_without_a_new_incident(
    stack, sched, client, jobs
):
    """What the straggler's advice asked for, seen through: the job requeued off the slow node
    resumes from its checkpoint and finishes, with no incident of its own on the way (the
    previous attempt's last progress reports are not the new attempt's)."""
    job = jobs["slow"]
    story = first_incident(client, job, timeout=150)
    assert story["kind"] == "straggler", context(job, story)
    slow_node = job.rank_node(FAULT_RANK)
    advice = story["advice"]  # the shipped [straggler] policy restarts off the node it names
    assert (advice["action"], advice["exclude"]) == ("requeue_exclude", [slow_node]), advice
    done = wait_for(
        lambda: (j := sched.get_job(job.job_id)).restart_count >= 1 and not j.active and j, 150
    )
    told = [
        (s["restart_count"], s["kind"], s["advice"]["reason"]) for s in stories(client, job.job_id)
    ]
    assert (done.state, done.restart_count, len(told)) == ("COMPLETED", 1, 1), (
        f"ended {done.state} at restart {done.restart_count}; incidents: {told}{context(job)}"
    )
    assert slow_node not in done.nodes


def test_a_clean_run_has_no_incident(stack, sched, client, jobs):
    job = jobs["clean"]
    done = wait_for(lambda: finished(sched, job.job_id, 0), timeout=150)
    assert done.state == "COMPLETED", context(job)
    wait_passes(stack.url, 3)  # a few controller passes after the end
    assert stories(client, job.job_id) == [], context(job)
    steps = [e.evidence.payload["step"] for e in evidence(stack, job.job_id, "progress")]
    assert steps and max(steps) == 20, f"progress seen: {steps}"


def test_every_rank_reports_progress_through_the_api(stack, sched, jobs):
    """The job's ``progress.report`` calls reach the controller from every rank's own node
    (the TaskProlog exports SRECOVERY_PROGRESS_FILE; the node's sidecar reads it)."""
    job = jobs["clean"]
    wait_for(lambda: finished(sched, job.job_id, 0), timeout=150)
    seen = {}
    for e in evidence(stack, job.job_id, "progress"):
        payload = e.evidence.payload
        if payload.get("origin") == "file":
            seen.setdefault(payload.get("rank"), set()).add(e.evidence.node)
    expected = {r: {job.rank_node(r)} for r in range(job.case.nodes)}
    assert seen == expected, f"file progress by rank -> nodes: {seen}{context(job)}"

    def last_reports() -> dict[int, dict]:
        """Each rank's latest file report: its end record, written at exit, once it arrived."""
        last = {}
        for e in evidence(stack, job.job_id, "progress"):
            if e.evidence.payload.get("origin") == "file":
                last[e.evidence.payload["rank"]] = e.evidence.payload
        return last

    ended = wait_for(
        lambda: (last := last_reports()) and all(p.get("done") is True for p in last.values()),
        timeout=20,
    )
    assert ended and all(p["step"] == 20 for p in last_reports().values()), last_reports()
