"""Log-scan throughput: MB/s of the signature scanner on one core, on a large synthetic log.

The log imitates a healthy multi-node training job (Megatron-LM iteration lines, NCCL INFO
channel lines, PyTorch Lightning progress lines) with rare failure lines (about one in
100,000). Usage: ``python bench/log_scan.py [--mb 500] [--keep PATH] [--quick] [--json FILE]``
(``--quick``: a 20 MB log). Prints MB/s, on one core, for each way in:

- ``scan_file``: a whole file (``srecovery explain-log``);
- ``scan(lines)``: the lines of a file opened in binary mode;
- ``scan(decoded lines)``: ``str`` lines, as a caller that decodes 4 MB blocks and splits them
  passes them (the time of decoding and splitting is left out and printed apart);
- ``scan_text(block)``: 4 MB blocks of bytes, as the sidecar's job-log follower reads them.

Throughput is per CPU second of this process (``time.process_time``), so that other work on a
shared machine does not count; wall-clock seconds are printed next to it.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from report import write_json

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


BLOCK = 4 * 1024 * 1024  # what the job-log follower reads per poll


def blocks(path: Path) -> Iterator[bytes]:
    """Whole-line blocks of about BLOCK bytes, as the job-log follower reads a file."""
    rest = b""
    with open(path, "rb") as stream:
        while chunk := stream.read(BLOCK):
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            if cut:
                yield data[:cut]
            rest = data[cut:]
    if rest:
        yield rest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=500, help="size of the synthetic log (MB)")
    parser.add_argument("--keep", type=Path, default=None, help="write the log here and keep it")
    parser.add_argument("--quick", action="store_true", help="a 20 MB log (seconds; for CI)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.mb = min(args.mb, 20)
    catalogue = default_catalogue()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "synthetic.log"
        rare = generate(path, args.mb)
        size = os.path.getsize(path)
        timings: dict[str, tuple[float, float, int]] = {}

        cpu, wall = time.process_time(), time.perf_counter()
        found = sum(1 for _ in catalogue.scan_file(path))
        timings["scan_file"] = (time.process_time() - cpu, time.perf_counter() - wall, found)

        with open(path, "rb") as stream:
            cpu, wall = time.process_time(), time.perf_counter()
            found = sum(1 for _ in catalogue.scan(stream))
            timings["scan(lines)"] = (time.process_time() - cpu, time.perf_counter() - wall, found)

        split = [0.0, 0.0]
        lines_t = [0.0, 0.0, 0]
        text_t = [0.0, 0.0, 0]
        for block in blocks(path):
            cpu, wall = time.process_time(), time.perf_counter()
            lines = block.decode("utf-8", errors="replace").splitlines()
            split[0] += time.process_time() - cpu
            split[1] += time.perf_counter() - wall
            cpu, wall = time.process_time(), time.perf_counter()
            lines_t[2] += sum(1 for _ in catalogue.scan(lines))
            lines_t[0] += time.process_time() - cpu
            lines_t[1] += time.perf_counter() - wall
            cpu, wall = time.process_time(), time.perf_counter()
            text_t[2] += sum(1 for _ in catalogue.scan_text(block))
            text_t[0] += time.process_time() - cpu
            text_t[1] += time.perf_counter() - wall
        timings["scan(decoded lines)"] = (lines_t[0], lines_t[1], int(lines_t[2]))
        timings["scan_text(block)"] = (text_t[0], text_t[1], int(text_t[2]))
    print(
        f"log: {size / 1e6:.0f} MB, {rare} failure lines, {len(catalogue)} signatures, "
        f"{len(catalogue.anchors)} prefilter keywords in {len(catalogue.prefilters)} regexes"
    )
    for name, (cpu_s, wall_s, matches) in timings.items():
        print(
            f"{name:20s} {size / cpu_s / 1e6:7.1f} MB/s per CPU second  "
            f"({matches} matches, {cpu_s:.2f} s CPU, {wall_s:.2f} s wall)"
        )
    print(
        f"{'decode+splitlines':20s} {size / split[0] / 1e6:7.1f} MB/s per CPU second  "
        "(the caller's, not counted above)"
    )
    figures = {
        "log_mb": round(size / 1e6, 1),
        "failure_lines": rare,
        "signatures": len(catalogue),
        "mb_per_cpu_second": {name: round(size / t[0] / 1e6, 1) for name, t in timings.items()},
        "mb_per_wall_second": {name: round(size / t[1] / 1e6, 1) for name, t in timings.items()},
        "matches": {name: t[2] for name, t in timings.items()},
    }
    write_json(args.json, "log_scan", figures, args.quick)


if __name__ == "__main__":
    main()
