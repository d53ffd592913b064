"""The progress API's stall dump with real PyTorch: two gloo processes, one stops before an
all-reduce, the other waits in it; both dump their flight recorder after the stall, and the
reader names the rank that never entered the collective."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from slurm_recovery.localcluster import free_port_block
from slurm_recovery.signals.flight_recorder import read_dumps, stuck_collective

RANK = textwrap.dedent(
    """
    import os, sys, time
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    from slurm_recovery import progress

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    progress.dump_flight_recorder_when_stalled(1.0)
    t = torch.ones(4)
    for step in range(1, 6):
        if rank == 1 and step == 4:
            time.sleep(60)  # stops before the 4th all-reduce
        dist.all_reduce(t)
        progress.report(step)
    """
)


def test_a_stalled_job_dumps_and_the_reader_names_the_rank_that_never_entered(tmp_path):
    try:
        import torch  # noqa: F401
    except ImportError as exc:  # scripts/bootstrap installs it: a missing torch is a defect
        raise AssertionError(f"torch is not installed ({exc}); run scripts/bootstrap") from None
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    root = Path(__file__).resolve().parents[2]
    port = free_port_block(1)  # free now, not one derived from the pid: other runs share it
    procs = []
    for rank in (0, 1):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            SRECOVERY_PROGRESS_FILE=str(tmp_path / "progress.jsonl"),
            TORCH_NCCL_DEBUG_INFO_TEMP_FILE=str(tmp_path / "nccl_trace_rank_"),
            PYTHONPATH=str(root),
            OMP_NUM_THREADS="1",
        )
        env.pop("TORCH_FR_DUMP_TEMP_FILE", None)
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env))
    try:
        seen: dict = {}
        traces = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len({t.rank for t in traces}) < 2:
            traces += read_dumps(tmp_path, seen)
            time.sleep(0.5)
        assert {t.rank for t in traces} == {0, 1}, "both ranks dump while the job is stuck"
        stuck = stuck_collective(traces)
        assert stuck is not None
        assert stuck.suspects == (1,) and stuck.waiting == (0,)
        assert "all_reduce" in stuck.op
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
