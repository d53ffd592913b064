"""``srecovery demo``: the recovery step on a real local Slurm cluster, start to finish.

Today it shows the scheduler step the controller will take: a running 2-node job is moved
off a failed node (drain, requeue held, exclude, begin now, release) and resumes from its
checkpoint on healthy nodes, with each latency measured. Later issues grow it into the full
loop (sidecars, detection, attribution, monitor then act).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import click

from slurm_recovery import localcluster
from slurm_recovery.scheduler import Job, SchedulerError
from slurm_recovery.scheduler.base import earliest_restart
from slurm_recovery.scheduler.scontrol import ScontrolScheduler

DEMO_BASE = Path("/tmp/srecovery-demo")
DEMO_PORT_BASE = 17100

TRAINING_SCRIPT = """#!/bin/bash
# A stand-in for a training job: one step every 0.2 s, checkpointed, resumed on restart.
ckpt="{workdir}/checkpoint-$SLURM_JOB_ID"
step=$(cat "$ckpt" 2>/dev/null || echo 0)
echo "attempt ${{SLURM_RESTART_COUNT:-0}} on $SLURM_JOB_NODELIST: resuming from step $step"
while true; do
  step=$((step + 1))
  echo "$step" > "$ckpt.tmp" && mv "$ckpt.tmp" "$ckpt"
  sleep 0.2
done
"""


def _wait(what: str, check: Callable[[], Job | None], timeout: float = 30.0) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise click.ClickException(f"timed out after {timeout:.0f}s waiting for {what}")


def _say(text: str) -> None:
    click.echo(click.style("==> ", fg="cyan", bold=True) + text)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


@click.group(invoke_without_command=True)
@click.option("--keep", is_flag=True, help="Leave the cluster and the job running to explore.")
@click.option("--base", type=click.Path(path_type=Path), default=DEMO_BASE, show_default=True)
@click.option("--port-base", type=int, default=DEMO_PORT_BASE, show_default=True)
@click.pass_context
def demo(ctx: click.Context, keep: bool, base: Path, port_base: int) -> None:
    """Bring up a 4-node Slurm cluster here and recover a job from a failed node."""
    ctx.obj = {**(ctx.obj or {}), "base": base}
    if ctx.invoked_subcommand:
        return
    spec = localcluster.ClusterSpec(base=base, nodes=4, port_base=port_base, name="srdemo")
    _say(f"starting a real Slurm cluster in {base} (munged, slurmctld, slurmd n1..n4)")
    try:
        localcluster.up(spec)
    except localcluster.ClusterError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        _run(spec)
    except SchedulerError as exc:
        raise click.ClickException(f"Slurm refused a step: {exc}") from exc
    finally:
        if keep:
            _say(
                f"left running: `export SLURM_CONF={spec.slurm_conf}`; "
                "stop with `srecovery demo down`"
            )
        else:
            localcluster.down(base)
            _say("cluster stopped (`--keep` leaves it running)")


@demo.command("down")
@click.pass_context
def demo_down(ctx: click.Context) -> None:
    """Stop everything the demo started."""
    for item in localcluster.down(ctx.obj["base"]):
        click.echo(f"stopped {item}")


def _run(spec: localcluster.ClusterSpec) -> None:
    sched = ScontrolScheduler(timeout=10, slurm_conf=str(spec.slurm_conf))
    workdir = spec.base / "jobs"
    workdir.mkdir(exist_ok=True)
    script = workdir / "train.sh"
    script.write_text(TRAINING_SCRIPT.format(workdir=workdir))
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-N2",
            "-J",
            "train-demo",
            "--open-mode=append",
            "-o",
            str(workdir / "train-%j.out"),
            str(script),
        ],
        env=localcluster.slurm_env(spec),
        capture_output=True,
        text=True,
        check=True,
    )
    job_id = int(out.stdout.strip().split(";")[0])

    def running() -> Job | None:
        job = sched.get_job(job_id)
        return job if job.state == "RUNNING" else None

    job = _wait("the job to start", running)
    _say(f"job {job_id} RUNNING on {','.join(job.nodes)}; training...")
    time.sleep(2)
    bad = job.nodes[0]
    ckpt = workdir / f"checkpoint-{job_id}"
    _say(f"{bad} fails (simulated GPU fault) at step {ckpt.read_text().strip()}")

    t0 = time.monotonic()
    sched.drain_node(bad, "slurm-recovery demo: simulated GPU fault")
    t_drain = time.monotonic()
    requeued_at = time.time()
    sched.requeue_hold(job_id)
    held = _wait(
        "the job to be pending", lambda: (j := sched.get_job(job_id)).state == "PENDING" and j
    )
    t_held = time.monotonic()
    slurm_delay = held.begin_time - time.time()
    excluded = sched.add_excluded_nodes(job_id, [bad])
    sched.set_begin_now(job_id)
    time.sleep(max(0.0, earliest_restart(requeued_at) - time.time()))
    sched.release(job_id)
    t_released = time.monotonic()
    again = _wait("the job to run again", running)
    t_running = time.monotonic()

    steps = [
        (f"drain {bad}", t_drain - t0),
        ("requeue held, job pending", t_held - t_drain),
        (f"exclude {','.join(sorted(excluded))}, begin now, release", t_released - t_held),
        (f"RUNNING again on {','.join(again.nodes)}", t_running - t_released),
    ]
    for label, seconds in steps:
        click.echo(f"    {label:<40} {_ms(seconds):>8}")
    total = f"    {'failure -> running again':<40} {_ms(t_running - t0):>8}"
    click.echo(click.style(total, bold=True))
    if slurm_delay > 5:
        click.echo(f"    (plain requeue: Slurm had set the begin time {slurm_delay:.0f} s ahead)")
    log = Path(again.stdout_path or "")

    def attempts() -> list[str]:
        text = log.read_text() if log.is_file() else ""
        return [ln for ln in text.splitlines() if ln.startswith("attempt")]

    # RUNNING in slurmctld comes before the batch script's first line reaches the file.
    deadline = time.monotonic() + 15
    while len(lines := attempts()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    for line in lines:
        click.echo(f"    {log.name}: {line}")
    if bad in again.nodes or len(lines) < 2 or "from step 0" in lines[-1]:
        raise click.ClickException("the job did not resume from its checkpoint on healthy nodes")
    sched.resume_node(bad)
    _say(f"{bad} resumed; job {job_id} resumed from its checkpoint on healthy nodes")
