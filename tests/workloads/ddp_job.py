#!/usr/bin/env python3
"""A tiny multi-node PyTorch DistributedDataParallel job that really fails, for the tests.

CPU only, gloo backend, a small MLP on synthetic data, one task per node, launched by ``srun``
inside an ``sbatch`` script::

    srun python tests/workloads/ddp_job.py --master-port 29500 --ckpt-dir /shared/ckpt \\
        --fault hang --fault-rank 1 --fault-step 12

Rank and world size come from Slurm (``SLURM_PROCID``, ``SLURM_NTASKS``); the rendezvous is
the first node of the job (``MASTER_ADDR``, else that node's ``NodeAddr`` from ``scontrol``).
Each step it prints a Megatron-style progress line (rank 0 only, as trainers do) and calls
``slurm_recovery.progress.report`` with this rank's own compute time (``step_time``, without
the wait for the other ranks). Rank 0 writes a checkpoint every ``--ckpt-every`` steps and every
rank resumes from it, so a requeued job carries on where it was.

Faults (``--fault``), injected by rank ``--fault-rank`` at step ``--fault-step``, only in the
attempt whose ``SLURM_RESTART_COUNT`` is ``--fault-attempt`` (so a requeued job then succeeds):

- ``crash``: the rank kills itself with SIGKILL at the start of the step; the others fail in
  the gradient all-reduce when gloo sees the connection close.
- ``hang``: the rank stops for good (sleeps, never calls another collective). With
  ``--hang-point after-sync`` (default) it stops after the step's gradient all-reduce, before
  the step is done (stuck in local work: an optimizer or I/O stall): the other ranks finish the
  step and block in the next step's all-reduce, so the stopped rank is one step behind. With
  ``before-sync`` it stops before the step's forward pass: every rank's last finished step is
  the same, and progress alone cannot tell which rank stopped.
- ``slow``: from that step on, the rank does ``--slow-factor`` times its normal work per step;
  the others wait for it in every all-reduce.
- ``app-bug``: the rank hits a real error in user code: a tensor shape mismatch raised by
  torch (``--bug shape``, default) or a ``KeyError`` in data loading (``--bug key``).

The collective timeout (``--timeout``, 5 minutes) is far above slurm-recovery's hang deadline
in the tests, so a hang is found by slurm-recovery, not by gloo.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import subprocess
import sys
import time

try:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
except ImportError as exc:  # the tests check for torch first; say it plainly anyway
    sys.exit(f"ddp_job: PyTorch is not installed ({exc}); run scripts/bootstrap")

try:
    from slurm_recovery import progress
except ImportError:  # the progress API is one standard-library file; without it, no reports

    class progress:  # type: ignore[no-redef]
        @staticmethod
        def report(*_args: object, **_kwargs: object) -> None:
            return None

        @staticmethod
        def flush() -> None:
            return None


IN_FEATURES = 32
HIDDEN = 64
BATCH = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--steps", type=int, default=40, help="training steps in all")
    p.add_argument("--step-sleep", type=float, default=0.3, help="seconds of work per step")
    p.add_argument("--ckpt-dir", required=True, help="shared checkpoint folder")
    p.add_argument("--ckpt-every", type=int, default=5, help="checkpoint every K steps")
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR", ""))
    p.add_argument("--timeout", type=float, default=300.0, help="collective timeout, seconds")
    p.add_argument("--fault", choices=("none", "crash", "hang", "slow", "app-bug"), default="none")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=10)
    p.add_argument("--fault-attempt", type=int, default=0, help="SLURM_RESTART_COUNT to fault in")
    p.add_argument("--hang-point", choices=("after-sync", "before-sync"), default="after-sync")
    p.add_argument("--slow-factor", type=float, default=3.0)
    p.add_argument("--bug", choices=("shape", "key"), default="shape")
    return p.parse_args(argv)


def log(rank: int, text: str) -> None:
    print(f"[ddp_job rank {rank} t={time.time():.3f}] {text}", flush=True)


def master_addr(given: str) -> str:
    """The first node of the job, as an address: MASTER_ADDR if set, else its NodeAddr."""
    if given:
        return given
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    if not nodelist:
        return "127.0.0.1"
    first = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    shown = subprocess.run(
        ["scontrol", "show", "node", "-o", first], capture_output=True, text=True, check=True
    ).stdout
    for field in shown.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return first


def batch(rank: int, step: int, bug_key: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic data: a fixed linear target plus noise, a different batch per rank and step."""
    if bug_key:
        samples = {f"sample_{i}": i for i in range(BATCH)}
        _ = samples[f"sample_{BATCH + step}"]  # the loader asks for a sample it does not have
    gen = torch.Generator().manual_seed(rank * 100_003 + step)
    x = torch.randn(BATCH, IN_FEATURES, generator=gen)
    w = torch.linspace(-1.0, 1.0, IN_FEATURES).unsqueeze(1)
    y = x @ w + 0.01 * torch.randn(BATCH, 1, generator=gen)
    return x, y


def checkpoint_path(folder: str) -> str:
    return os.path.join(folder, "ckpt.pt")


def save_checkpoint(folder: str, step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    os.makedirs(folder, exist_ok=True)
    tmp = checkpoint_path(folder) + f".tmp{os.getpid()}"
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    os.replace(tmp, checkpoint_path(folder))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    world = int(os.environ.get("SLURM_NTASKS", "1"))
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    node = os.environ.get("SLURMD_NODENAME", "?")
    faulty = args.fault != "none" and rank == args.fault_rank and attempt == args.fault_attempt
    addr = master_addr(args.master_addr)
    log(rank, f"node {node} world {world} attempt {attempt} master {addr}:{args.master_port}")

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{args.master_port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    torch.manual_seed(0)  # the same initial weights on every rank
    net = nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    start = 0
    path = checkpoint_path(args.ckpt_dir)
    if os.path.exists(path):
        state = torch.load(path, weights_only=True)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
        log(rank, f"resumed from checkpoint at step {start}")
    model = DistributedDataParallel(net)
    loss_fn = nn.MSELoss()
    samples = start * BATCH * world

    for step in range(start + 1, args.steps + 1):
        fault_now = faulty and step == args.fault_step
        t0 = time.monotonic()
        if fault_now and args.fault == "crash":
            log(rank, f"step {step}: crash (SIGKILL)")
            os.kill(os.getpid(), signal.SIGKILL)
        if fault_now and args.fault == "hang" and args.hang_point == "before-sync":
            log(rank, f"step {step}: hang before the forward pass and its all-reduce")
            while True:
                time.sleep(3600)
        bug = fault_now and args.fault == "app-bug"
        x, y = batch(rank, step, bug and args.bug == "key")
        if bug:  # a wrong reshape in user code: torch refuses the matmul
            x = x.reshape(BATCH * 2, IN_FEATURES // 2)
        out = model(x)
        loss = loss_fn(out, y)
        work = args.step_sleep  # stands in for this rank's compute
        if args.fault == "slow" and faulty and step >= args.fault_step:
            work *= args.slow_factor
        time.sleep(work)
        step_time = time.monotonic() - t0  # own work, before the gradient all-reduce
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradients here: waits for every rank
        if fault_now and args.fault == "hang":
            log(rank, f"step {step}: hang after the all-reduce, before the step is done")
            while True:
                time.sleep(3600)
        opt.step()
        samples += BATCH * world
        elapsed = time.monotonic() - t0
        progress.report(step, samples=BATCH, loss=loss.item(), step_time=step_time)
        if rank == 0:
            print(
                f" iteration {step:8d}/{args.steps:8d} | consumed samples: {samples:10d} |"
                f" elapsed time per iteration (ms): {elapsed * 1000:.1f} |"
                f" lm loss: {loss.item():.6E} |",
                flush=True,
            )
        if step % args.ckpt_every == 0 and rank == 0:
            save_checkpoint(args.ckpt_dir, step, model.module, opt)
    progress.flush()
    dist.barrier()
    dist.destroy_process_group()
    log(rank, f"done: {args.steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
