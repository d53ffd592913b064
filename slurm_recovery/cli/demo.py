"""``srecovery demo``: the whole recovery loop on this host, no GPU needed.

It brings up the ``srecovery dev up`` stack (a real Slurm cluster with the hooks, the
controller, the watchdog and a sidecar per node with simulated GPUs: what an admin gets), runs
a small checkpointing multi-node training job on it, and walks through:

0. the stack and the training job (it reports progress with ``slurm_recovery.progress``);
1. monitor mode: a fatal XID on one of the job's nodes gives advice, and Slurm is not touched;
2. act mode (``srecovery mode act``): the same fault again; the node is drained, the job is
   requeued away from it and resumes from its checkpoint, with each milestone's latency;
3. an application bug: the job is stopped with a reason and no node is blamed.

Every stage checks its outcome and fails loudly (exit 1, naming the stage) when it is wrong.
``--keep`` leaves the stack running; ``srecovery demo down`` stops everything it started.
docs/quickstart.md has a transcript and explains each latency.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape

from slurm_recovery import devstack, localcluster
from slurm_recovery.cli.dev import slurm_release_option
from slurm_recovery.contract import hostlist
from slurm_recovery.contract.client import ClientError, ControllerClient
from slurm_recovery.scheduler import Job, SchedulerError
from slurm_recovery.scheduler.scontrol import ScontrolScheduler

DEMO_BASE = Path("/tmp/srecovery-demo")
DEMO_PORT_BASE = 17100
DEMO_API_PORT = 17199
#: The fault injected in stages 1 and 2: XID 79 (GPU has fallen off the bus) on GPU 1.
XID, XID_GPU = 79, 1
#: Seconds per training step, and a checkpoint every CKPT_EVERY steps.
STEP_SECONDS, CKPT_EVERY = 0.2, 5
#: The application bug (stage 3) hits at this step.
BUG_STEP = 8
#: How long the demo waits for any one thing; generous, for a busy machine.
WAIT = 60.0

T = TypeVar("T")

TRAIN_PY = '''\
"""A stand-in for a multi-node training job: no GPU, no torch. One task per node (srun);
each rank steps every --step-time seconds and reports progress with slurm_recovery.progress;
rank 0 checkpoints every --ckpt-every steps, and every rank resumes from the checkpoint, so a
requeued job carries on where it was. --bug-at-step N: rank 0 hits a bug in its data loading."""

import argparse
import json
import os
import time

from slurm_recovery import progress


def log(text):
    print(f"[t={time.time():.3f}] {text}", flush=True)


def load(path):
    try:
        with open(path) as f:
            return json.load(f)["step"]
    except (OSError, ValueError, KeyError):
        return 0


def save(path, step):
    with open(path + ".tmp", "w") as f:
        json.dump({"step": step, "saved_at": time.time()}, f)
    os.replace(path + ".tmp", path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", required=True)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--step-time", type=float, default=0.2)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--bug-at-step", type=int, default=0)
    args = p.parse_args()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    attempt = os.environ.get("SLURM_RESTART_COUNT", "0")
    nodes = os.environ.get("SLURM_JOB_NODELIST", "?")
    step = load(args.ckpt)
    if rank == 0:
        if step:
            log(f"attempt {attempt} on {nodes}: resumed from checkpoint at step {step}")
        else:
            log(f"attempt {attempt} on {nodes}: no checkpoint, starting at step 0")
    dataset = {f"sample_{i}": i for i in range(args.bug_at_step - 1)}
    while step < args.steps:
        time.sleep(args.step_time)
        step += 1
        if args.bug_at_step and rank == 0:
            sample = dataset[f"sample_{step - 1}"]  # the bug: the loader runs past its data
        progress.report(step, samples=32)
        if rank == 0 and step % args.ckpt_every == 0:
            save(args.ckpt, step)
            log(f"step {step}: checkpoint saved")


main()
'''

TRAIN_SH = """#!/bin/bash
# The demo's training job: one task per node, arguments go to train.py.
srun --ntasks-per-node=1 {python} -u {work}/train.py --ckpt {work}/ckpt-$SLURM_JOB_ID.json \\
    --step-time {step} --ckpt-every {every} "$@"
"""


class DemoFailed(click.ClickException):
    """A stage's outcome was not what it should be: exit 1, the message names the stage."""


class Show:
    """The narrative: stage headings, plain text, and steps that show a spinner while they
    wait on a terminal and one line each when done (readable in CI logs too)."""

    def __init__(self) -> None:
        self.console = Console(highlight=False, soft_wrap=True)
        self.tty = self.console.is_terminal
        self.stage = "setup"
        self.t0 = time.monotonic()

    def heading(self, number: int, title: str) -> None:
        self.stage = f"stage {number} ({title})"
        self.console.print()
        self.console.rule(f"[bold cyan]{number}. {escape(title)}", style="cyan")

    def say(self, text: str) -> None:
        self.console.print(text)

    def ok(self, text: str, seconds: float | None = None) -> None:
        took = f" [dim]({seconds:.1f} s)[/]" if seconds is not None else ""
        self.console.print(f"  [bold green]ok[/] {text}{took}")

    def detail(self, text: str, style: str = "") -> None:
        self.console.print(f"     {escape(text)}", style=style)

    def fail(self, message: str) -> DemoFailed:
        return DemoFailed(f"{self.stage} failed: {message}")

    @contextlib.contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        if self.tty:
            with self.console.status(f"{escape(what)}..."):
                yield
        else:
            yield

    def wait(
        self, what: str, check: Callable[[], T | None], timeout: float = WAIT, every: float = 0.1
    ) -> T:
        """``check()``'s first truthy value; the stage fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        last: Any = None
        with self.waiting(f"waiting for {what}"):
            while True:
                try:
                    value = check()
                except (SchedulerError, ClientError) as exc:
                    value, last = None, exc
                if value:
                    return value
                if time.monotonic() > deadline:
                    seen = f" (last seen: {last})" if last else ""
                    raise self.fail(f"timed out after {timeout:.0f} s waiting for {what}{seen}")
                time.sleep(every)


# ------------------------------------------------------------------------------ the command


@click.group(invoke_without_command=True)
@click.option("--keep", is_flag=True, help="Leave the stack and the jobs running to explore.")
@click.option(
    "--nodes",
    type=click.IntRange(4, 32),
    default=4,
    show_default=True,
    help="Slurm nodes (slurmd) in the local cluster, n1..nN.",
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(2, 64),
    default=8,
    show_default=True,
    help="Simulated GPUs per node.",
)
@click.option(
    "--base",
    type=click.Path(path_type=Path),
    default=DEMO_BASE,
    show_default=True,
    help="Directory for the whole stack (wiped at the start of a demo).",
)
@click.option(
    "--port-base",
    type=int,
    default=DEMO_PORT_BASE,
    show_default=True,
    help="slurmctld's port; slurmd nI listens on port-base+I.",
)
@click.option(
    "--api-port",
    type=int,
    default=DEMO_API_PORT,
    show_default=True,
    help="The controller's API port (on 127.0.0.1).",
)
@slurm_release_option
@click.pass_context
def demo(
    ctx: click.Context,
    keep: bool,
    nodes: int,
    gpus_per_node: int,
    base: Path,
    port_base: int,
    api_port: int,
    slurm: str,
) -> None:
    """The whole recovery loop on a real local Slurm cluster, in under 2 minutes: monitor
    mode, act mode (a job moved off a failed node, resumed from its checkpoint) and an
    application bug. No GPU needed (simulated GPUs). See docs/quickstart.md."""
    ctx.obj = {**(ctx.obj or {}), "base": base}
    if ctx.invoked_subcommand:
        return
    show = Show()
    show.say(
        "[bold]slurm-recovery quickstart[/]: a real Slurm cluster on this machine, the "
        "controller, the watchdog and a sidecar per node with simulated GPUs."
    )
    stack: devstack.DevStack | None = None
    failed = False
    try:
        show.heading(0, "the stack and a training job")
        _fresh(base)
        started = time.monotonic()
        with show.waiting(f"starting the stack in {base}"):
            stack = devstack.up(
                base,
                nodes=nodes,
                mode="monitor",
                port_base=port_base,
                api_port=api_port,
                gpus_per_node=gpus_per_node,
                slurm=slurm,
            )
        show.say(f"Slurm {localcluster.slurm_release(stack.cluster)}")
        Demo(show, stack, gpus_per_node).run(started)
    except localcluster.ClusterError as exc:
        failed = True
        raise show.fail(str(exc)) from exc
    except SchedulerError as exc:
        failed = True
        raise show.fail(f"Slurm refused a step: {exc}") from exc
    except ClientError as exc:
        failed = True
        raise show.fail(f"the controller refused a request: {exc}") from exc
    except DemoFailed:
        failed = True
        raise
    except Exception as exc:  # a bug, or something unforeseen: still name the stage
        failed = True
        traceback.print_exc()
        raise show.fail(f"unexpected {type(exc).__name__}: {exc}") from exc
    except BaseException:  # ^C: stop what was started, unless --keep
        failed = True
        raise
    finally:
        if failed and (stack is not None or _started_here(base)):
            show.say(f"[red]the demo failed; logs of every daemon: {base / 'log'}[/]")
        if stack is not None and keep:
            _print_exports(show, stack)
        elif stack is not None or _started_here(base):
            with show.waiting("stopping the stack"):
                devstack.down(base)
            show.say(f"stack stopped (`--keep` leaves it running); logs in {base / 'log'}")
        if not failed:
            show.say(f"[bold]demo finished in {time.monotonic() - show.t0:.0f} s[/]")


@demo.command("down")
@click.option(
    "--base",
    "down_base",
    type=click.Path(path_type=Path),
    default=None,
    help="The demo's directory (default: the demo's --base).",
)
@click.pass_context
def demo_down(ctx: click.Context, down_base: Path | None) -> None:
    """Stop everything the demo started (after `srecovery demo --keep`)."""
    base = down_base or ctx.obj["base"]
    stopped = devstack.down(base)
    if (base / localcluster.STATE_FILE).exists():  # a cluster of the earlier demo, in base
        stopped += localcluster.down(base)
    for item in stopped:
        click.echo(f"stopped {item}")
    if not stopped:
        click.echo(f"nothing running in {base}")


def _fresh(base: Path) -> None:
    """Stop and remove an earlier demo in ``base``, so each run starts from an empty store and
    a fresh cluster; refuse a directory that holds something else."""
    if not base.exists():
        return
    ours = (base / devstack.STATE_FILE).exists() or (base / localcluster.STATE_FILE).exists()
    if not ours:
        if any(base.iterdir()):
            raise localcluster.ClusterError(
                f"{base} is not empty and holds no earlier demo: choose another --base"
            )
        return
    devstack.down(base)
    if (base / localcluster.STATE_FILE).exists():
        localcluster.down(base)
    shutil.rmtree(base)


def _started_here(base: Path) -> bool:
    """Whether ``devstack.up`` got far enough in ``base`` to leave something to stop."""
    cluster = base / "cluster" / localcluster.STATE_FILE
    return (base / devstack.STATE_FILE).exists() or cluster.exists()


def _print_exports(show: Show, stack: devstack.DevStack) -> None:
    show.say("\n[bold]The stack is still running.[/] To use it from a shell:")
    for key, value in stack.exports().items():
        show.console.print(escape(f"export {key}={value}"))
    show.say(f"Stop everything with `srecovery demo down --base {stack.base}`.")


# ------------------------------------------------------------------------------ the story


class Demo:
    def __init__(self, show: Show, stack: devstack.DevStack, gpus_per_node: int) -> None:
        self.show = show
        self.stack = stack
        self.gpus_per_node = gpus_per_node
        prefix = stack.cluster.slurm_prefix
        self.sched = ScontrolScheduler(
            timeout=10,
            slurm_conf=str(stack.cluster.slurm_conf),
            bin_dir=f"{prefix}/bin" if prefix else "",
        )
        self.client = ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))
        self.work = stack.base / "work"
        self.env = {**localcluster.slurm_env(stack.cluster), **stack.exports()}

    # ------------------------------------------------------------------ helpers

    def srecovery(self, *args: str) -> str:
        """Run ``srecovery ARGS`` as an admin would (against this stack) and show it."""
        self.show.console.print(f"  [bold]$ srecovery {escape(shlex.join(args))}[/]")
        try:
            out = subprocess.run(
                [sys.executable, "-m", "slurm_recovery.cli", *args],
                capture_output=True,
                text=True,
                timeout=WAIT,
                env=self.env,
            )
        except subprocess.TimeoutExpired as exc:
            raise self.show.fail(f"`srecovery {shlex.join(args)}` took over {WAIT:.0f} s") from exc
        text = (out.stdout + out.stderr).rstrip()
        for line in text.splitlines():
            self.show.detail(line.rstrip(), style="dim")
        if out.returncode != 0:
            raise self.show.fail(f"`srecovery {' '.join(args)}` exited {out.returncode}: {text}")
        return text

    def submit(self, name: str, nodes: int, *args: str) -> int:
        argv = [
            "sbatch",
            "--parsable",
            f"-N{nodes}",
            "--ntasks-per-node=1",
            f"--job-name={name}",
            "--open-mode=append",
            "-o",
            str(self.work / f"{name}-%j.out"),
            str(self.work / "train.sh"),
            *args,
        ]
        shown = [*argv[2:6], "-o", f"{name}-%j.out", "train.sh", *args]
        self.show.console.print(f"  [bold]$ sbatch {escape(' '.join(shown))}[/]")
        try:
            out = subprocess.run(
                argv, env=self.env, cwd=self.work, capture_output=True, text=True, timeout=WAIT
            )
        except subprocess.TimeoutExpired as exc:
            raise self.show.fail(f"sbatch took over {WAIT:.0f} s") from exc
        if out.returncode != 0:
            raise self.show.fail(f"sbatch refused the job: {out.stderr.strip()}")
        return int(out.stdout.strip().split(";")[0])

    def log(self, name: str, job_id: int) -> str:
        path = self.work / f"{name}-{job_id}.out"
        return path.read_text(errors="replace") if path.is_file() else ""

    def checkpoint(self, job_id: int) -> int:
        try:
            return json.loads((self.work / f"ckpt-{job_id}.json").read_text())["step"]
        except (OSError, ValueError, KeyError):
            return 0

    def running(self, job_id: int, restart_count: int = 0) -> Job | None:
        job = self.sched.get_job(job_id)
        ok = job.state == "RUNNING" and job.restart_count == restart_count
        return job if ok else None

    def incidents(self, job_id: int) -> list[dict[str, Any]]:
        try:
            return self.client.get(f"/v1/jobs/{job_id}")["incidents"]
        except ClientError as exc:
            if exc.status == 404:
                return []
            raise

    def closed_incident(self, job_id: int, *kinds: str) -> dict[str, Any] | None:
        """The job's first incident of one of ``kinds``, once it is closed."""
        found = [s for s in self.incidents(job_id) if s["kind"] in kinds]
        return found[0] if found and found[0]["state"] == "closed" else None

    def progress_lines(self, job_id: int) -> list[dict[str, Any]]:
        """The last line of each node's progress file for the job (written by the job's
        ``progress.report`` calls, where the TaskProlog pointed them)."""
        lines = []
        for path in sorted((self.stack.base / "jobs").glob(f"*/{job_id}/progress.jsonl")):
            with contextlib.suppress(OSError, ValueError, IndexError):
                lines.append(json.loads(path.read_text().splitlines()[-1]))
        return lines

    # ------------------------------------------------------------------ stages

    def run(self, started: float) -> None:
        show, stack = self.show, self.stack
        spec = stack.cluster
        show.ok(
            f"Slurm cluster {spec.name}: slurmctld + {spec.nodes} slurmd "
            f"({hostlist.compress(spec.node_names)}), munged, hooks in slurm.conf; controller "
            f"at {stack.url} (policy: monitor mode); watchdog; a sidecar per node with "
            f"{self.gpus_per_node} simulated GPUs",
            time.monotonic() - started,
        )
        self.work.mkdir(exist_ok=True)
        self.work.chmod(0o755)
        (self.work / "train.py").write_text(TRAIN_PY)
        (self.work / "train.sh").write_text(
            TRAIN_SH.format(
                python=sys.executable, work=self.work, step=STEP_SECONDS, every=CKPT_EVERY
            )
        )
        job_a = self.start_training("train")
        bad = self.monitor_stage(job_a)
        job_b = self.act_stage(job_a, bad)
        job_c = self.app_bug_stage()
        self.epilogue(job_b, job_c)

    def start_training(self, name: str) -> Job:
        show = self.show
        t = time.monotonic()
        job_id = self.submit(name, 2)
        job = show.wait(f"job {job_id} to start", lambda: self.running(job_id))
        show.ok(f"job {job_id} RUNNING on {hostlist.compress(job.nodes)}", time.monotonic() - t)
        show.wait(
            f"job {job_id}'s first checkpoint", lambda: self.checkpoint(job_id) >= 2 * CKPT_EVERY
        )
        reports = show.wait(
            f"job {job_id}'s progress reports",
            lambda: len(lines := self.progress_lines(job_id)) >= 2 and lines,
        )
        ranks = ", ".join(f"rank {r['rank']} on {r['host']} at step {r['step']}" for r in reports)
        show.ok(
            f"training: checkpoint at step {self.checkpoint(job_id)}; each rank's "
            f"progress.report() is in its node's progress file for the sidecar ({ranks})"
        )
        return job

    def monitor_stage(self, job: Job) -> str:
        """Stage 1; returns the node that got the fault."""
        show = self.show
        show.heading(1, "monitor mode: advice only")
        show.say(
            "A new deployment runs in monitor mode: the whole loop runs and records its "
            "advice, but Slurm is never touched."
        )
        bad = job.nodes[-1]
        self.srecovery("sim", "inject", "--node", bad, "--gpu", str(XID_GPU), "--xid", str(XID))
        story = show.wait(
            f"the controller's advice for job {job.job_id}",
            lambda: self.closed_incident(job.job_id, "doomed"),
        )
        advice = story["advice"] or {}
        verdict = advice.get("verdict") or {}
        lat = story.get("latencies", {})
        show.ok(
            f"incident {story['id']} ({story['kind']}) opened "
            f"{_ms(lat.get('detection'))} after the XID"
        )
        show.detail(
            f"verdict: {verdict.get('fault_class')} on {','.join(verdict.get('nodes', [])) or '-'}"
            f", confidence {verdict.get('confidence')}"
        )
        show.detail(f"advice ({advice.get('mode')} mode): {advice.get('reason')}")
        show.detail(f"outcome: {story['outcome']}")
        if advice.get("mode") != "monitor" or not str(story["outcome"]).startswith("monitor:"):
            raise show.fail(f"expected monitor-mode advice, got {advice.get('mode')}: {story}")
        if bad not in verdict.get("nodes", []):
            raise show.fail(f"the advice does not implicate {bad}: {verdict}")
        with show.waiting("watching Slurm for 3 s (three controller passes)"):
            time.sleep(3)  # nothing may change in Slurm
        now = self.sched.get_job(job.job_id)
        node = self.sched.get_node(bad)
        story = self.closed_incident(job.job_id, "doomed") or story
        if now.state != "RUNNING" or now.nodes != job.nodes or now.restart_count != 0:
            raise show.fail(
                f"Slurm was touched in monitor mode: job {job.job_id} is {now.state} on "
                f"{hostlist.compress(now.nodes)}, restart count {now.restart_count}"
            )
        if node.drained:
            raise show.fail(f"{bad} was drained in monitor mode ({node.reason})")
        if story["actions"]:
            raise show.fail(f"scheduler actions were recorded in monitor mode: {story['actions']}")
        show.ok(
            f"Slurm untouched: job {job.job_id} still RUNNING on {hostlist.compress(now.nodes)} "
            f"(restart count 0), {bad} not drained (sinfo: {node.state.lower()}), no scheduler "
            f"action recorded; checkpoint at step {self.checkpoint(job.job_id)}"
        )
        return bad

    def act_stage(self, job_a: Job, bad: str) -> Job:
        """Stage 2; returns the job as it runs again."""
        show = self.show
        show.heading(2, "act mode: detect, attribute, exclude, drain, requeue, resume")
        show.say(
            "After weeks of advice that matches their own calls, the admins switch to act "
            "mode, without editing the policy file:"
        )
        self.srecovery("mode", "act", "--yes", "--reason", "quickstart demo")
        show.say(
            f"{bad}'s GPU is reset (healthy again). Job {job_a.job_id}'s incident was only "
            "advised and only new incidents follow the new mode, so the run is cancelled and "
            "submitted again:"
        )
        self.srecovery("sim", "inject", "--node", bad, "--clear")
        show.console.print(f"  [bold]$ scancel {job_a.job_id}[/]")
        out = subprocess.run(
            ["scancel", str(job_a.job_id)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        if out.returncode != 0:
            raise show.fail(f"scancel {job_a.job_id} failed: {out.stderr.strip()}")
        show.wait(  # so that the new job can take the same nodes (Slurm's first choice)
            f"job {job_a.job_id}'s nodes to be idle",
            lambda: (
                not self.sched.get_job(job_a.job_id).active
                and all(
                    localcluster.node_states(self.stack.cluster).get(n) == "idle"
                    for n in job_a.nodes
                )
            ),
        )
        job = self.start_training("train")
        if bad in job.nodes:
            show.say(f"The same fault again, on {bad}:")
        else:
            bad = job.nodes[-1]
            show.say(f"The same fault, on {bad} (one of job {job.job_id}'s nodes):")
        self.srecovery("sim", "inject", "--node", bad, "--gpu", str(XID_GPU), "--xid", str(XID))
        story = show.wait(
            f"job {job.job_id} running again",
            lambda: self.closed_incident(job.job_id, "doomed"),
        )
        if not str(story["outcome"]).startswith("restarted"):
            raise show.fail(f"incident {story['id']} ended {story['outcome']!r}, not restarted")
        again = show.wait(
            f"job {job.job_id} RUNNING at restart 1", lambda: self.running(job.job_id, 1)
        )
        resumed = show.wait(
            f"job {job.job_id}'s resume line in its log",
            lambda: re.search(
                r"\[t=([\d.]+)\] attempt 1 on (\S+): resumed from checkpoint at step (\d+)",
                self.log("train", job.job_id),
            ),
            timeout=30,
        )
        node = self.sched.get_node(bad)
        advice = story["advice"] or {}
        verdict = advice.get("verdict") or {}
        show.ok(
            f"incident {story['id']} ({story['kind']}): {verdict.get('fault_class')} on "
            f"{','.join(verdict.get('nodes', []))}, confidence {verdict.get('confidence')}"
        )
        show.detail(f"advice ({advice.get('mode')} mode): {advice.get('reason')}")
        self.timeline(story, float(resumed.group(1)), int(resumed.group(3)))
        problems = []
        if bad in again.nodes:
            problems.append(f"job {job.job_id} runs on {bad} again")
        if bad not in again.excluded_nodes:
            problems.append(f"{bad} is not excluded from job {job.job_id}")
        if not node.drained:
            problems.append(f"{bad} is not drained")
        if int(resumed.group(3)) <= 0:
            problems.append("the job did not resume from a checkpoint")
        if problems:
            raise show.fail("; ".join(problems))
        show.ok(
            f"job {job.job_id} RUNNING again on {hostlist.compress(again.nodes)} (restart "
            f"count 1, excludes {','.join(sorted(again.excluded_nodes))}), resumed from its "
            f"checkpoint at step {resumed.group(3)}, not from step 0"
        )
        show.ok(f"{bad} drained for everyone, in `sinfo -R`: {node.reason!r}")
        lat = story.get("latencies", {})
        show.say(
            f"  [bold]detection {_ms(lat.get('detection'))}, recovery action "
            f"{_ms(lat.get('action'))}, failure -> running again "
            f"{_ms(lat.get('end_to_end'))}[/] (plain Slurm: the job would crash and not be "
            "retried, or wait ~2 min for its begin time after a requeue)"
        )
        return again

    def timeline(self, story: dict[str, Any], resumed_at: float, step: int) -> None:
        """The incident's milestones and Slurm steps, each with its time after the failure,
        from the controller's own record (GET /v1/jobs/ID), then the job's resume line."""
        origin = _epoch(story["milestones"].get("failure")) or 0.0
        rows = [
            (e["offset"], e["text"])
            for e in story.get("timeline", [])
            if e["type"] == "milestone"
            or (e["type"] == "action" and e["name"].split(" ")[0] in ("drain", "requeue_hold"))
        ]
        rows.append((resumed_at - origin, f"job log: resumed from checkpoint at step {step}"))
        for offset, text in sorted(rows, key=lambda r: r[0]):
            self.show.detail(f"{offset:+8.3f} s  {text}")

    def app_bug_stage(self) -> Job:
        show = self.show
        show.heading(3, "an application bug: stopped, no node blamed")
        show.say(
            f"A job whose own code raises an exception at step {BUG_STEP}: restarting it "
            "elsewhere would fail the same way, and no node is at fault."
        )
        job_id = self.submit("bug", 1, "--bug-at-step", str(BUG_STEP))
        story = show.wait(
            f"job {job_id}'s incident", lambda: self.closed_incident(job_id, "crash", "app_fault")
        )
        ended = show.wait(
            f"job {job_id} to end", lambda: (j := self.sched.get_job(job_id)).active is False and j
        )
        time.sleep(2)  # two controller passes: nothing may requeue it
        ended = self.sched.get_job(job_id)
        advice = story["advice"] or {}
        verdict = advice.get("verdict") or {}
        exc = re.findall(r"^(\w+Error: .*)$", self.log("bug", job_id), re.M)
        show.ok(
            f"incident {story['id']} ({story['kind']}) opened "
            f"{_ms(story.get('latencies', {}).get('detection'))} after the failure"
        )
        show.detail(f"job log: {exc[-1] if exc else '?'}")
        show.detail(
            f"verdict: {verdict.get('fault_class')}, nodes "
            f"{','.join(verdict.get('nodes', [])) or '-'}"
        )
        show.detail(f"advice ({advice.get('mode')} mode): {advice.get('reason')}")
        drained = [n.name for n in self.sched.list_nodes() if n.drained]
        problems = []
        if verdict.get("fault_class") != "application" or advice.get("action") != "stop":
            problems.append(f"advice {advice.get('action')} for {verdict.get('fault_class')}")
        if verdict.get("nodes") or advice.get("drain") or advice.get("exclude"):
            problems.append(f"a node was blamed: {verdict.get('nodes')}")
        if ended.restart_count != 0 or ended.state not in ("FAILED", "CANCELLED"):
            problems.append(f"job {job_id} is {ended.state}, restart {ended.restart_count}")
        if any(n in ended.nodes for n in drained):
            problems.append(f"{hostlist.compress(ended.nodes)} drained")
        if problems:
            raise show.fail("; ".join(problems))
        show.ok(
            f"job {job_id} stopped ({ended.state}, not requeued); no node blamed, "
            f"{hostlist.compress(ended.nodes)} not drained; outcome: {story['outcome']}"
        )
        return ended

    def epilogue(self, job_b: Job, job_c: Job) -> None:
        show = self.show
        show.heading(4, "what was recorded, and where to look next")
        self.srecovery("incidents")
        show.say(
            "\nEvery decision is in the tamper-evident audit trail. Explore (with --keep, "
            "or on your own `srecovery dev up` stack):\n"
            f"  srecovery explain {job_b.job_id}     the story of the restart: evidence, "
            "verdict, every step with its time\n"
            f"  srecovery explain {job_c.job_id}     why the buggy job was stopped\n"
            "  srecovery console       the live dashboard\n"
            "  srecovery audit verify  check the audit chain\n"
            "Docs: docs/quickstart.md (this demo, each latency), docs/cli.md, "
            "docs/install.md (a real cluster, monitor then act)"
        )


def _epoch(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"
