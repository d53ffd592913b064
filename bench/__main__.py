"""Run the benchmarks: ``python -m bench [--quick] [--only NAME ...] [--out DIR] [--slurm S]``.

Each benchmark is its own script (``bench/NAME.py``, one command that prints a table) and runs
here as a subprocess with ``--json OUT/NAME.json``; ``--quick`` passes ``--quick`` to each, a
mode of seconds to a couple of minutes that runs in CI so the benchmarks never rot (no
thresholds are asserted: the figures are for people, in docs/performance.md). The ones that
bring up the local Slurm stack need root, as the tests do. Exit status: 0 when every benchmark
that ran exited 0. ``--slurm 24.11`` runs them on that release (built by scripts/build-slurm):
its programs go first on the benchmarks' PATH. Each run gets a new stack directory and free
ports, so runs on different releases never share state.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Benchmark:
    name: str
    what: str
    #: the munged socket goes in this option (None: needs no munged of its own)
    munge_option: str | None = None


BENCHMARKS = (
    Benchmark("recovery_latency", "failure -> incident -> action -> running again, vs plain Slurm"),
    Benchmark(
        "expedited_vs_slurm", "Slurm 26.05 alone (expedited requeue) vs slurm-recovery, 5 faults"
    ),
    Benchmark("hang_overshoot", "hang declared how long after its deadline"),
    Benchmark("straggler_delay", "slowdown -> straggler incident"),
    Benchmark("controller_scale", "ingest rate, latency, CPU, RSS at 100 to 10,000 nodes"),
    Benchmark("decision_scale", "the decision core's time per pass and incident, 100-50,000 nodes"),
    Benchmark("sidecar_overhead", "sidecar CPU and RSS with 8 simulated GPUs"),
    Benchmark("hook_overhead", "prolog/epilog/TaskProlog time added to job start and end"),
    Benchmark("attribution", "explain-log accuracy on the corpus of real failure logs"),
    Benchmark("log_scan", "log signature scan, MB/s per core"),
    Benchmark("progress_api", "cost of progress.report() per call"),
    Benchmark("munge_rate", "MUNGE credentials per second", munge_option="--socket"),
    Benchmark("soak_faults", "controller killed at random points; restarts during an outage"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark's quick mode")
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=[b.name for b in BENCHMARKS])
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="JSON files here")
    parser.add_argument("--munge-socket", help="a running munged's socket, for munge_rate")
    parser.add_argument("--slurm", default="default", help="Slurm release: default or 24.11...")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    from slurm_recovery import localcluster

    env = dict(os.environ)
    prefix = localcluster.resolve_slurm(args.slurm)
    if prefix:
        env["PATH"] = localcluster.path_with_slurm(prefix, env.get("PATH", ""))
    chosen = [b for b in BENCHMARKS if not args.only or b.name in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str, float, str]] = []
    for bench in chosen:
        out = args.out / f"{bench.name}.json"
        out.unlink(missing_ok=True)
        argv_ = [sys.executable, str(HERE / f"{bench.name}.py"), "--json", str(out)]
        argv_ += ["--quick"] if args.quick else []
        if bench.munge_option:
            if not args.munge_socket:
                rows.append((bench.name, "not run: needs --munge-socket", 0.0, ""))
                continue
            argv_ += [bench.munge_option, args.munge_socket]
        print(f"\n=== {bench.name}: {bench.what}\n$ {' '.join(argv_[1:])}", flush=True)
        started = time.monotonic()
        code = subprocess.run(argv_, cwd=HERE.parent, env=env).returncode
        seconds = time.monotonic() - started
        status = "ok" if code == 0 and out.exists() else f"FAILED (exit {code})"
        if code == 0 and not out.exists():
            status = "FAILED (no JSON written)"
        rows.append((bench.name, status, seconds, str(out) if out.exists() else ""))
    print(f"\n{'benchmark':20} {'result':32} {'seconds':>8}  json")
    for name, status, seconds, path in rows:
        print(f"{name:20} {status:32} {seconds:8.1f}  {path}")
    return 0 if all(not r[1].startswith("FAILED") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
