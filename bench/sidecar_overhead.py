"""CPU and memory of one sidecar with 8 simulated GPUs polled every 10 s (target: < 1 % of one
core on average, < 60 MB RSS).

    .venv/bin/python bench/sidecar_overhead.py [--seconds 60] [--gpus 8] [--poll 10]
                                               [--inject-every S] [--url URL --node N
                                               --munge-socket PATH] [--quick] [--json FILE]

Starts ``python -m slurm_recovery.sidecar`` (the daemon exactly as installed: simulated GPU
backend, hook spool, outbox, sender; the kernel log and InfiniBand off, as on a host without
them) in a temporary directory, delivering either to a local dummy receiver that answers 202
(default; the sidecar then sends without MUNGE) or, with ``--url``, to a real controller
(signed with MUNGE; ``--node`` must be a node of its cluster whose address is this host).
After the sidecar's start-up status has been delivered, samples its CPU time and RSS (psutil)
every second for ``--seconds``; prints the average CPU as a percentage of one core, the
start-up CPU time, and the largest RSS. ``--inject-every S`` injects an XID every S seconds
through ``srecovery sim inject``'s library call, to include the fast path's work.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from report import write_json  # noqa: E402

from slurm_recovery.sidecar.sim import inject  # noqa: E402


class Receiver:
    """A stand-in controller on 127.0.0.1: ``POST /v1/evidence`` -> 202, counting events."""

    def __init__(self) -> None:
        self.events = 0
        self.kinds: dict[str, int] = {}
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> str:
        self._thread.start()
        self._ready.wait(10)
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        from aiohttp import web

        async def evidence(request: web.Request) -> web.Response:
            body = await request.json()
            for event in body["events"]:
                self.kinds[event["kind"]] = self.kinds.get(event["kind"], 0) + 1
            self.events += len(body["events"])
            return web.json_response({"accepted": len(body["events"])}, status=202)

        async def run() -> None:
            app = web.Application()
            app.router.add_post("/v1/evidence", evidence)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]
            self._ready.set()
            await asyncio.Event().wait()

        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(run())


def write_config(base: Path, args: argparse.Namespace, url: str) -> Path:
    auth = f'[auth]\nmunge_socket = "{args.munge_socket}"\n' if args.munge_socket else ""
    config = base / "config.toml"
    config.write_text(
        f"""[log]
level = "warning"

[client]
url = "{url}"

{auth}
[sidecar]
gpu_backend = "sim"
sim_dir = "{base / "sim"}"
sim_gpus = {args.gpus}
poll_interval = {args.poll}
spool_dir = "{base / "spool"}/{{node}}"
kmsg = false
ib_sysfs = ""
"""
    )
    config.chmod(0o644)
    return config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured time (default 60)")
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs (default 8)")
    parser.add_argument("--poll", type=float, default=10.0, help="poll interval, s (default 10)")
    parser.add_argument("--inject-every", type=float, default=0.0, help="XID every S seconds")
    parser.add_argument("--url", help="a real controller (default: a local dummy receiver)")
    parser.add_argument("--node", default="bench1", help="node name the sidecar speaks for")
    parser.add_argument("--munge-socket", default="", help="munged socket (with --url)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--quick", action="store_true", help="5 s with a 1 s poll (for CI)")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.poll = min(args.seconds, 5.0), min(args.poll, 1.0)

    receiver = None if args.url else Receiver()
    url = args.url or receiver.start()
    base = Path(tempfile.mkdtemp(prefix="srecovery-bench-sidecar-"))
    base.chmod(0o755)
    config = write_config(base, args, url)
    argv = [sys.executable, "-m", "slurm_recovery.sidecar", "--config", str(config)]
    argv += ["--node", args.node] + ([] if args.url else ["--insecure-no-auth"])
    with open(base / "sidecar.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    ps = psutil.Process(proc.pid)

    # the sidecar is up when its start-up status went out (the dummy counts it; a real
    # controller: give it the same few seconds)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (receiver is None or receiver.events == 0):
        if proc.poll() is not None:
            print((base / "sidecar.log").read_text(), file=sys.stderr)
            return 1
        time.sleep(0.05)
    if receiver is None:
        time.sleep(3)
    startup = ps.cpu_times()
    startup_cpu = startup.user + startup.system
    started = time.monotonic()
    next_inject = started + args.inject_every if args.inject_every else float("inf")
    rss_max = ps.memory_info().rss
    injected = 0
    while (now := time.monotonic()) - started < args.seconds:
        if now >= next_inject:
            inject(base / "sim", args.node, gpu=injected % args.gpus, xid=48)
            injected += 1
            next_inject += args.inject_every
        rss_max = max(rss_max, ps.memory_info().rss)
        time.sleep(min(1.0, max(0.0, started + args.seconds - time.monotonic())))
    end = ps.cpu_times()
    wall = time.monotonic() - started
    used = (end.user + end.system) - startup_cpu
    rss_max = max(rss_max, ps.memory_info().rss)
    threads = ps.num_threads()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(30)

    figures = {
        "seconds": round(wall, 1),
        "gpus": args.gpus,
        "poll_interval_s": args.poll,
        "cpu_percent_of_one_core": round(100 * used / wall, 3),
        "startup_cpu_s": round(startup_cpu, 3),
        "rss_max_mb": round(rss_max / 1e6, 1),
        "threads": threads,
        "xids_injected": injected,
        "events_received": receiver.events if receiver else None,
        "received_by_kind": receiver.kinds if receiver else None,
        "exit_code": code,
        "receiver": "dummy (no MUNGE)" if receiver else url,
    }
    print(
        f"sidecar, {args.gpus} simulated GPUs, poll {args.poll:g}s, {wall:.0f}s measured: "
        f"CPU {figures['cpu_percent_of_one_core']:.2f}% of one core "
        f"(start-up {startup_cpu:.2f}s CPU), max RSS {figures['rss_max_mb']:.1f} MB, "
        f"{threads} threads, {injected} XIDs injected, exit {code}"
    )
    if receiver:
        print(f"events received: {receiver.events} {receiver.kinds}")
    write_json(args.json, "sidecar_overhead", figures, args.quick)
    if os.environ.get("SRECOVERY_BENCH_KEEP") is None:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
