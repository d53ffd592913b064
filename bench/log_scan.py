"""Log-scan throughput: MB/s of the signature scanner on one core, on a large synthetic log.

The log imitates a healthy multi-node training job (Megatron-LM iteration lines, NCCL INFO
channel lines, PyTorch Lightning progress lines) with rare failure lines (about one in
100,000). Usage: ``python bench/log_scan.py [--mb 500] [--keep PATH]``. Prints MB/s for the
file path (``scan_file``, what explain-log and the sidecar use) and for ``scan(lines)``.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

from slurm_recovery.signals.logs import default_catalogue

RARE = [
    "[rank3]: ValueError: Expected input batch_size (16) to match target batch_size (8).",
    "gpu07:3468:3905 [4] NCCL WARN NET/IB : Got completion from peer 10.0.0.7<54862> with "
    "status=12 opcode=0 len=0 vendor err 129 (Recv)",
    "[rank1]:[E1129 14:00:02.414640780 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=101, OpType=ALLREDUCE) ran for 600011 ms",
]


def healthy(rng: random.Random, i: int) -> str:
    kind = rng.random()
    if kind < 0.5:
        return (
            f" [2024-05-08 08:47:{i % 60:02d},261] iteration {i:8d}/  500000 | consumed samples: "
            f"{i * 512:12d} | elapsed time per iteration (ms): {rng.uniform(900, 1100):.1f} | "
            f"learning rate: 1.5E-04 | global batch size: 512 | lm loss: {rng.uniform(2, 3):.6E}"
            f" | loss scale: 65536.0 | grad norm: {rng.uniform(0.1, 1):.3f} | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |"
        )
    if kind < 0.8:
        return (
            f"gpu{i % 64:02d}:{1000 + i % 8}:{2000 + i % 16} [{i % 8}] NCCL INFO Channel "
            f"{i % 32:02d}/0 : {i % 16}[{i % 8}] -> {(i + 1) % 16}[{(i + 1) % 8}] [send] via "
            f"NET/IB/{i % 4}/GDRDMA"
        )
    return (
        f"Epoch 3:  {i % 100}%|██       | {i}/500150 [6:28:43<94:39:17,  1.37it/s, loss=2.6, "
        f"v_num=95nc, reduced_train_loss=2.590, global_step={i}]"
    )


def generate(path: Path, megabytes: int, seed: int = 1) -> int:
    rng = random.Random(seed)
    block_lines = [healthy(rng, i) for i in range(20000)]
    block = ("\n".join(block_lines) + "\n").encode("utf-8")
    target = megabytes * 1_000_000
    written = rare = 0
    with open(path, "wb") as out:
        while written < target:
            out.write(block)
            written += len(block)
            # about one failure line per 100,000 lines
            if rng.random() < 0.2:
                out.write((RARE[rare % len(RARE)] + "\n").encode("utf-8"))
                rare += 1
    return rare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=500, help="size of the synthetic log (MB)")
    parser.add_argument("--keep", type=Path, default=None, help="write the log here and keep it")
    args = parser.parse_args()
    catalogue = default_catalogue()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "synthetic.log"
        rare = generate(path, args.mb)
        size = os.path.getsize(path)
        start = time.perf_counter()
        found = sum(1 for _ in catalogue.scan_file(path))
        file_s = time.perf_counter() - start
        with open(path, "rb") as stream:
            start = time.perf_counter()
            lines_found = sum(1 for _ in catalogue.scan(stream))
            lines_s = time.perf_counter() - start
    print(
        f"log: {size / 1e6:.0f} MB, {rare} failure lines, {len(catalogue)} signatures, "
        f"{len(catalogue.anchors)} prefilter keywords"
    )
    print(f"scan_file:   {size / file_s / 1e6:7.1f} MB/s  ({found} matches, {file_s:.2f} s)")
    print(
        f"scan(lines): {size / lines_s / 1e6:7.1f} MB/s  ({lines_found} matches, {lines_s:.2f} s)"
    )


if __name__ == "__main__":
    main()
