"""Produce the flight-recorder fixture dumps with a real PyTorch gloo job on CPU.

Run with torch installed (fixtures were made with torch 2.13.0+cpu):

    python tests/unit/data/flight_recorder/generate.py tests/unit/data/flight_recorder

Two scenarios, each a tiny job of local processes on the gloo backend with the flight
recorder on (``TORCH_FR_BUFFER_SIZE``). gloo never writes a dump by itself, so each rank
writes its own with the call a dump-on-timeout handler would make, to
``<dir>/nccl_trace_rank_<rank>`` (the name the NCCL backend's writer gives it with
``TORCH_FR_DUMP_TEMP_FILE=<dir>/nccl_trace_rank_``):

- ``hang/`` (pickle) and ``hang_json/`` (JSON): 4 ranks; a second group holds ranks 2 and 3.
  After 5 collectives on the default group, rank 3 stops before the 6th (an all-reduce);
  ranks 0-2 enter it asynchronously and dump while they wait; rank 3 dumps too. Then rank 3
  joins and the job ends cleanly.
- ``timeout/`` (pickle): 3 ranks with a 3 s collective timeout; rank 2 sleeps before the 5th
  collective, ranks 0 and 1 time out in it (gloo raises) and dump afterwards; rank 2 dumps
  after its sleep, never having entered it.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch._C._distributed_c10d as c10d
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _dump(path: Path, json: bool) -> None:
    data = c10d._dump_fr_trace_json() if json else c10d._dump_fr_trace()
    path.write_bytes(data)


def _hang(rank: int, world: int, out: Path, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    pair = dist.new_group([2, 3])
    tensor = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(tensor)
    dist.broadcast(tensor, 0)
    if rank in (2, 3):
        dist.all_reduce(torch.ones(2), group=pair)
    dist.barrier()
    work = None
    if rank == world - 1:
        time.sleep(2)  # the straggler: not in the next collective yet
    else:
        work = dist.all_reduce(torch.ones(8, 2), async_op=True)
        time.sleep(1)
    _dump(out / "hang" / f"nccl_trace_rank_{rank}", json=False)
    _dump(out / "hang_json" / f"nccl_trace_rank_{rank}", json=True)
    time.sleep(2)  # every rank has dumped before the straggler joins
    if work is None:
        dist.all_reduce(torch.ones(8, 2))
    else:
        work.wait()
    dist.destroy_process_group()


def _timeout(rank: int, world: int, out: Path, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=3)
    )
    tensor = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(tensor)
    dist.broadcast(tensor, 0)
    if rank == world - 1:
        time.sleep(6)
    else:
        try:
            dist.all_reduce(torch.ones(8, 2))
        except RuntimeError as exc:
            print(f"rank {rank}: {str(exc)[:120]}", flush=True)
    _dump(out / "timeout" / f"nccl_trace_rank_{rank}", json=False)
    time.sleep(1)
    os._exit(0)  # the group is broken: skip the teardown that would wait on peers


def main() -> None:
    out = Path(sys.argv[1])
    for name in ("hang", "hang_json", "timeout"):
        (out / name).mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_FR_BUFFER_SIZE"] = "100"
    mp.spawn(_hang, args=(4, out, _free_port()), nprocs=4)
    mp.spawn(_timeout, args=(3, out, _free_port()), nprocs=3)
    print(f"torch {torch.__version__}: dumps written under {out}")


if __name__ == "__main__":
    main()
