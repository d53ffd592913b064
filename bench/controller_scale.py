"""Controller scale: one controller process under simulated sidecars, 100 to 10,000 nodes.

    .venv/bin/python bench/controller_scale.py [--slurm 24.11] [--json PATH]   # 100 ... 10,000
    .venv/bin/python bench/controller_scale.py --quick            # N = 100, 1,000; ~35 s (CI)
    .venv/bin/python bench/controller_scale.py --nodes 10000 --decide-nodes 100 1000 10000

No thresholds are asserted (the target is one core and p99 < 100 ms at 10,000 nodes); every
figure printed is measured in the run. Root, Slurm and munge installed (as the local cluster).

What runs, all real and on this host: munged, a slurmctld (apt's, or ``--slurm SERIES`` built
under /opt/slurm) whose slurm.conf defines the largest N nodes (2 with a slurmd, the rest
defined only: no slurmd, with ``SlurmdTimeout=900``), and the controller started as
``srecovery dev up`` starts it (``python -m slurm_recovery.controller``, MUNGE on, monitor
mode, production loop interval).
For each N, with a fresh store:

- a load generator (a separate process, raw asyncio) sends, for each of N nodes, one request
  every ``--period`` seconds carrying the event the sidecar sends periodically: the
  ``sidecar_status`` event of a real :class:`~slurm_recovery.sidecar.daemon.Sidecar` with 8
  simulated GPUs (queue, sources, delivery, per-GPU telemetry), and ``--job-rate`` hook
  events per second (``job_start``/``job_end`` built by the real prolog/epilog code and taken
  from the sidecar's hook spool), each in its own request as the sidecar sends them. (A
  healthy node's sidecar sends its status every 60 s and GPU findings only when they change:
  the default 10 s period is the target's, six times what a real sidecar sends.) The wire
  bytes are the sidecar's: urllib's request (``Connection: close``, one TCP connection per
  request; ``--keep-alive``: each sidecar on one kept-alive connection), the compact JSON body
  of ``ControllerClient.post_evidence``, and a real MUNGE credential per request bound to
  that body (``Authorization: MUNGE``), encoded before the measured window (a sidecar encodes
  on its own node; the controller decodes every one of them in the window, as in
  production). ``--sessions``: each simulated sidecar opens its session first (one MUNGE
  credential, ``POST /v1/session``) and signs each status in it as it is sent (HMAC), as a
  real sidecar does by default since issue 29; hook events keep a MUNGE credential each.
  ``--heartbeats``: each node's first status goes in full, then, as a real sidecar sends them
  since issue 29, a heartbeat (``POST /v1/heartbeat``, the status's condition digest) for each
  unchanged status, and the status in full every ``--full-every`` s (300, staggered across the
  nodes; "heartbeats answered wanted" counts the controller asking for one in full).
  ``--datagrams``: each heartbeat a UDP datagram to the port the sessions offer, signed in the
  session, as a real sidecar sends them since heartbeat datagrams (contract.datagrams); one
  unanswered within a second counts as not accepted (a sidecar would send it over HTTP). The
  schedule is open-loop: a slow answer does not delay the next request. The first statuses
  take one period from the start: with ``--warmup`` shorter than a period and a half, the last
  of them (each a node's first report, stored) can fall in the window ("stored in it, by
  kind").
- measured over the window: the rate of accepted events, latency from the start of the
  request (connect) to the end of the answer (p50/p99/max), the CPU of the controller process
  (fraction of one core, from /proc; its Slurm commands counted apart), its RSS, the CPU of
  munged (it decodes the credentials), slurmctld and the generator, the time the controller's
  threads were runnable but waiting for a CPU (this machine is shared: read the CPU and latency
  figures with it and the load average), the RPCs slurmctld served per second (``sdiag``), and
  the store's growth (bytes per event, per simulated day). ``--profile DIR`` also samples the
  controller with py-spy (if installed).

Then the time to decide an incident on the largest cluster: an XID 79 on a running job's node,
posted as that node's sidecar, to the incident's ``detected`` and ``advised`` milestones, under
the load of the largest N and idle; and what one pass of the loop spends on that cluster (the
node listing it reads, ``scontrol -o show nodes``, against the JSON listing it replaced; the
jobs; the last hour of evidence). ``--decide-nodes`` repeats the idle decision on a fresh
slurmctld for each size given (50,000 does not start here: slurmctld cannot create the threads
to ping that many absent nodes, and says so).

Why ``SlurmdTimeout=900``: slurmctld asks every node that has never registered to register,
once per ping interval (SlurmdTimeout / 3), and for nodes with no slurmd it starts about one
thread each (9,960 threads seen at 10,000 nodes). On this 2-vCPU machine that storm stalls every
process for about 10 s, each 20 s at the local cluster's 60 s, and the stalls, not the
controller, made the p99. A real cluster's slurmds answer through Slurm's forwarding tree. So
the benchmark waits for the first round to end (slurmctld's threads rise and fall again)
before it starts the controller, and at 900 the next round is 300 s away.

Base directory /tmp/srecovery-scale, ports 18000-18999 (options). Stops everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import random
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil
from report import write_json
from support import add_stack_options, fill_stack_options

from slurm_recovery import devstack, localcluster
from slurm_recovery.config import DEFAULTS
from slurm_recovery.contract import datagrams, sessions
from slurm_recovery.contract.status import (
    HEARTBEAT_PATH,
    HELD,
    WANTED,
    heartbeat_body,
    payload_digest,
)
from slurm_recovery.controller.service import WANTED_ANSWER
from slurm_recovery.store.store import ROUTINE_EVIDENCE

SLURMD_NODES = 2  # n1, n2 run a slurmd (the decide phase runs its jobs there)
PHANTOM_PORT_OFFSET = 999  # every node without a slurmd "listens" on port_base + 999
FALLEN_OFF = "GPU has fallen off the bus."
#: The generator's UDP sockets for --datagrams, shared by the simulated sidecars.
DATAGRAM_SOCKETS = 16


# --------------------------------------------------------------------------------- helpers


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]

    return {
        "n": len(ordered),
        "p50": statistics.median(ordered),
        "p99": q(0.99),
        "max": ordered[-1],
    }


def cpu(pid: int) -> dict[str, float]:
    """CPU seconds of ``pid`` (itself, and its reaped children) from /proc."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return {"self": 0.0, "children": 0.0}
    return {"self": t.user + t.system, "children": t.children_user + t.children_system}


def cpu_wait(pid: int) -> float:
    """Seconds the threads of ``pid`` spent runnable but waiting for a CPU (schedstat): how
    much the other processes on this shared machine held the controller back."""
    total = 0
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[1])
    return total / 1e9


def rss_mb(pid: int) -> float:
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return 0.0


def db_usage(path: Path) -> tuple[int, int]:
    """(bytes in use by the database, including pages still in the WAL; evidence rows)."""
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=10)
    try:
        conn.execute("BEGIN")
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        rows = conn.execute("SELECT COALESCE(MAX(id), 0) FROM evidence").fetchone()[0]
        conn.execute("COMMIT")
    finally:
        conn.close()
    return (pages - free) * size, rows


def stored_by_kind(path: Path, after_id: int) -> dict[str, int]:
    """Evidence rows stored after ``after_id``, by kind (what the store's growth is made of)."""
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute(
            "SELECT kind, source, COUNT(*) FROM evidence WHERE id > ? GROUP BY kind, source",
            (after_id,),
        ).fetchall()
    finally:
        conn.close()
    return {f"{kind} ({source})": count for kind, source, count in rows}


def files_on_disk(path: Path) -> dict[str, int]:
    """The store's files' sizes on disk, bytes: the database and its write-ahead log."""
    return {
        name: (Path(f"{path}{suffix}").stat().st_size if Path(f"{path}{suffix}").exists() else 0)
        for name, suffix in (("db", ""), ("wal", "-wal"))
    }


def sdiag_rpcs(env: dict[str, str]) -> dict[str, int]:
    """slurmctld's RPC counts by message type (``sdiag``), less sdiag's own and the slurmds'
    registrations: what clients asked of it."""
    out = subprocess.run(["sdiag"], env=env, capture_output=True, text=True, timeout=30).stdout
    counts: dict[str, int] = {}
    in_types = False
    for line in out.splitlines():
        if line.startswith("Remote Procedure Call statistics by message type"):
            in_types = True
            continue
        if in_types and not line.startswith("\t"):
            break
        if in_types:
            parts = line.split()
            count = next((p for p in parts if p.startswith("count:")), "")
            if parts and count:
                counts[parts[0]] = int(count.split(":")[1])
    for own in ("REQUEST_STATS_INFO", "MESSAGE_NODE_REGISTRATION_STATUS"):
        counts.pop(own, None)
    return counts


def rpc_rates(before: dict[str, int], after: dict[str, int], seconds: float) -> dict[str, float]:
    """RPCs per second by type over a window (types seen in it only)."""
    rates = {k: (after.get(k, 0) - before.get(k, 0)) / seconds for k in after}
    return {k: v for k, v in sorted(rates.items()) if v > 0}


# --------------------------------------------------------------------------------- the stack


class Stack:
    """munged + slurmctld (``nodes`` defined, SLURMD_NODES running) + one controller."""

    def __init__(
        self, base: Path, nodes: int, port_base: int, api_port: int, slurm_prefix: str = ""
    ) -> None:
        self.base = base
        self.nodes = nodes
        self.api_port = api_port
        self.url = f"http://127.0.0.1:{api_port}"
        host = socket.gethostname()
        self.spec = localcluster.ClusterSpec(
            base=base / "cluster",
            nodes=SLURMD_NODES,
            port_base=port_base,
            name="srscale",
            slurm_prefix=slurm_prefix,
        )
        if nodes > SLURMD_NODES:
            first = SLURMD_NODES + 1
            self.spec.extra_conf = [
                "SlurmdTimeout=900",  # no registration storm in the window (module docstring)
                f"NodeName=n[{first}-{nodes}] NodeHostname={host} NodeAddr=127.0.0.1 "
                f"Port={port_base + PHANTOM_PORT_OFFSET} CPUs=2 RealMemory=1000 State=UNKNOWN",
                f"PartitionName=big Nodes=n[{first}-{nodes}] MaxTime=INFINITE State=UP",
            ]
        self.config = base / "config.toml"
        self.store = base / "state.db"
        self.controller = 0
        self.launcher: Path | None = None
        #: auth.session_ttl, s: longer than the run, since the generator, unlike a sidecar,
        #: does not renew its sessions (an hour's run otherwise ends in 401s)
        self.session_ttl = 3600.0

    def up(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.base.chmod(0o755)
        devstack.write_policy(self.base / "policy.toml", "monitor")
        devstack.write_config(self.base, self.spec, self.api_port)
        text = self.config.read_text()
        self.config.write_text(
            text.replace("[auth]\n", f"[auth]\nsession_ttl = {self.session_ttl:.0f}\n", 1)
        )
        # localcluster waits until every node it knows answers; only SLURMD_NODES ever will.
        real = localcluster.node_states
        running = set(self.spec.node_names)
        localcluster.node_states = lambda spec: {  # type: ignore[assignment]
            k: v for k, v in real(spec).items() if k in running
        }
        try:
            localcluster.up(self.spec, timeout=120)
        finally:
            localcluster.node_states = real  # type: ignore[assignment]
        if self.nodes - SLURMD_NODES >= 1_000:  # below that, the round is short and small
            self.sit_out_registration_round()

    def sit_out_registration_round(self, timeout: float = 90.0) -> None:
        """Wait for slurmctld's first round of registration requests to the absent nodes to
        end (module docstring): its threads rise past half the absent nodes, then fall. The
        next round comes SlurmdTimeout / 3 = 300 s later, after the measurements."""
        status = Path(f"/proc/{self.pid('slurmctld')}/status")
        started, peak = time.monotonic(), 0
        while time.monotonic() - started < timeout:
            threads = int(
                next(
                    li for li in status.read_text().splitlines() if li.startswith("Threads:")
                ).split()[1]
            )
            peak = max(peak, threads)
            if peak > (self.nodes - SLURMD_NODES) // 2 and threads < 200:
                break
            time.sleep(0.5)
        took = time.monotonic() - started
        print(
            f"slurmctld's first registration round of the absent nodes: {peak} threads at "
            f"most, over after {took:.0f} s",
            flush=True,
        )

    def start_controller(self) -> None:
        """A controller with a fresh store; returns once it has made a pass (it then knows
        every node's addresses, which it checks sidecar credentials against)."""
        self.stop_controller()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.store}{suffix}").unlink(missing_ok=True)
        log = self.base / "controller.log"
        if self.launcher:  # a patched controller, for what-if measurements
            argv = [sys.executable, str(self.launcher), "--config", str(self.config)]
            self.controller = localcluster.spawn_daemon(argv, log, dict(os.environ))
        else:
            self.controller = devstack.start_controller(self.config, log)
        devstack.wait_healthy(self.url, timeout=120, pid=self.controller)

    def stop_controller(self) -> None:
        if self.controller:
            # a launcher's command line names the launcher, not the controller's module
            name = str(self.launcher) if self.launcher else "slurm_recovery.controller"
            localcluster.stop_process(self.controller, name)
            self.controller = 0

    def down(self) -> None:
        self.stop_controller()
        localcluster.down(self.spec.base)

    def env(self) -> dict[str, str]:
        return localcluster.slurm_env(self.spec)

    def pid(self, name: str) -> int:
        state = json.loads((self.spec.base / localcluster.STATE_FILE).read_text())
        return int(state["pids"].get(name, 0))


# --------------------------------------------------------------------------------- wire bodies


def sidecar_templates(base: Path, config: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The events a real sidecar sends: its ``sidecar_status`` event (8 simulated GPUs) and
    hook ``job_start``/``job_end`` events as they come out of its hook spool, for node n1."""
    from slurm_recovery import hooks
    from slurm_recovery.config import load_config
    from slurm_recovery.contract.spool import HookSpool, spool_event
    from slurm_recovery.sidecar.daemon import Sidecar
    from slurm_recovery.sidecar.outbox import Outbox, Sender
    from slurm_recovery.sidecar.registry import build
    from slurm_recovery.sidecar.spool import SpoolSource

    cfg = load_config(config)
    node = "n1"
    spool = base / "template" / node
    shutil.rmtree(spool, ignore_errors=True)
    spool.mkdir(parents=True)
    registry = build(cfg.sidecar, node, spool, None)
    outbox = Outbox(spool / "outbox", 1000)
    sender = Sender(outbox, client=None, node=node)  # type: ignore[arg-type]
    sidecar = Sidecar(node, registry, outbox, sender, spool, fast_interval=0.2, poll_interval=10.0)
    now = time.time()
    sidecar.tick_slow(now)  # the first poll: inventory, so the status has GPU readings
    status = sidecar.status(now).to_event(node)
    # Hook events: built by the real prolog/epilog code, spooled, read back by the sidecar.
    env = {
        "SLURM_JOB_ID": "1000001",
        "SLURM_NODELIST": "n[1-4]",
        "SLURMD_NODENAME": node,
        "SLURM_JOB_RESTART_COUNT": "0",
        "SLURM_JOB_PARTITION": "big",
        "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
        "SLURM_JOB_EXIT_CODE": "0",
        "SLURM_JOB_EXIT_CODE2": "0:0",
        "SLURM_JOB_DERIVED_EC": "0:0",
    }
    for hook in ("prolog", "epilog"):
        spool_event(spool, hooks.build_event(hook, env, now, node=node))
    source = SpoolSource(HookSpool(spool), node)
    job_events = [f.to_event(node) for f in source.poll(now)]
    source.commit()
    registry.close()
    outbox.close()
    if len(job_events) != 2 or "gpus" not in status["payload"]:
        raise RuntimeError(f"unexpected sidecar events: {status}, {job_events}")
    return status, job_events


def request_bytes(
    host: str,
    port: int,
    body: bytes,
    authorization: str,
    keep_alive: bool = False,
    path: str = "/v1/evidence",
) -> bytes:
    """The request as ControllerClient writes it: urllib's one-shot (``Connection: close``),
    or on a kept-alive connection (the sidecar's)."""
    head = (
        f"POST {path} HTTP/1.1\r\n"
        "Accept-Encoding: identity\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Host: {host}:{port}\r\n"
        f"User-Agent: Python-urllib/{sys.version_info[0]}.{sys.version_info[1]}\r\n"
        f"Authorization: {authorization}\r\n"
        "Content-Type: application/json\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode("latin-1") + body


# --------------------------------------------------------------------------------- generator


class _Exchange(asyncio.Protocol):
    """One request on its own connection; done when the server closes it."""

    __slots__ = ("done", "head", "payload")

    def __init__(self, payload: bytes, done: asyncio.Future) -> None:
        self.payload = payload
        self.done = done
        self.head = b""

    def connection_made(self, transport: Any) -> None:
        transport.write(self.payload)

    def data_received(self, data: bytes) -> None:
        if len(self.head) < 12:
            self.head += data

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            if exc is not None:
                self.done.set_exception(exc)
            else:
                self.done.set_result(self.head[9:12])


def generate(spec: dict[str, Any]) -> None:
    """The load generator process: build and sign every request, say "ready", wait for a
    line on stdin, run the schedule, write the results to spec["out"]."""
    from slurm_recovery.contract import requests as signing

    host, port = "127.0.0.1", spec["port"]
    nodes, period, job_rate = spec["nodes"], spec["period"], spec["job_rate"]
    total = spec["warmup"] + spec["duration"] + spec["tail"]
    rng = random.Random(1)
    status, job_events = spec["status"], spec["job_events"]

    keep_alive = spec.get("keep_alive", False)
    keys, datagram_port = (
        open_sessions(host, port, nodes, spec["munge_socket"]) if spec.get("sessions") else ({}, 0)
    )
    if spec.get("datagrams") and not datagram_port:
        raise SystemExit("--datagrams: the controller offered no datagram port in its sessions")
    spec["datagram_port"] = datagram_port
    counters: dict[str, int] = {}

    def in_session(body: bytes, node: str, path: str) -> Callable[[], bytes]:
        """The request, signed in the node's session when it is sent (its time and counter)."""
        session_id, key = keys[node]

        def make() -> bytes:
            counters[node] = counters.get(node, 0) + 1
            value = sessions.authorization(
                session_id, key, "POST", path, body, now=time.time(), counter=counters[node]
            )
            return request_bytes(host, port, body, value, keep_alive, path)

        return make

    def signed(body: bytes, role: str, node: str, path: str = "/v1/evidence") -> bytes:
        headers = signing.sign(
            "POST", path, body, role=role, node=node, socket=spec["munge_socket"]
        )
        # a sidecar keeps its connection (--keep-alive); a hook is a process: one request
        kept = keep_alive and role == "sidecar"
        return request_bytes(host, port, body, headers["Authorization"], kept, path)

    def body_of(event: dict[str, Any], name: str) -> bytes:
        return json.dumps({"events": [{**event, "node": name}]}, separators=(",", ":")).encode()

    def sidecar_request(body: bytes, name: str, path: str = "/v1/evidence") -> Any:
        return in_session(body, name, path) if keys else signed(body, "sidecar", name, path)

    # --heartbeats: after its first full status, each node sends a heartbeat naming that
    # status's condition, and its status in full every "full_every" s (staggered by node)
    full_every = spec.get("full_every", 0.0)
    digest = payload_digest(status["payload"])

    def report(slot: int, i: int, name: str, body: bytes) -> Any:
        if full_every > 0 and slot > 0:
            phase = full_every * i / nodes
            if int((slot * period + phase) // full_every) == int(
                ((slot - 1) * period + phase) // full_every
            ):
                return heartbeat_request(name)
        return sidecar_request(body, name)

    def heartbeat_request(name: str) -> Any:
        """A heartbeat: over HTTP, or (--datagrams) a datagram signed in the session when it
        is sent, with the MACs of the two answers the controller may give to it."""
        body = heartbeat_body(name, digest)
        if not spec.get("datagrams"):
            return sidecar_request(body, name, HEARTBEAT_PATH)
        session_id, key = keys[name]

        def make() -> Datagram:
            counters[name] = counters.get(name, 0) + 1
            authorization = datagrams.sign(
                session_id, key, body, now=time.time(), counter=counters[name]
            )
            answers = {datagrams.answer_mac(key, authorization, a): a for a in (HELD, WANTED)}
            return Datagram(datagrams.encode(authorization, body), answers)

        return make

    bodies = [(f"n{i}", body_of(status, f"n{i}")) for i in range(1, nodes + 1)]
    # (offset, request or what makes it at send time, events in it, the sidecar whose
    # connection it goes on; -1: its own)
    schedule: list[tuple[float, Any, int, int]] = []
    t_build = time.perf_counter()
    # "prime": each sidecar first sends this (its quiet status), spread over all but the last
    # 3 s of "prime_lead", so the events that follow, from "prime_lead" s on, go on
    # connections already open (and the opening of 10,000 is not itself a burst)
    lead = spec.get("prime_lead", 0.0)
    if spec.get("prime"):
        for i, (name, _) in enumerate(bodies):
            request = sidecar_request(body_of(spec["prime"], name), name)
            schedule.append(((lead - 3.0) * i / nodes, request, 1, i))
    for slot in range(int((total - lead) / period) + 1):
        for i, (name, body) in enumerate(bodies):
            offset = lead + slot * period + period * i / nodes
            if offset < total:
                schedule.append((offset, report(slot, i, name, body), 1, i))
    job_id = 2_000_000
    for k in range(int(total * job_rate)):
        name = f"n{rng.randint(1, nodes)}"
        template = job_events[k % 2]
        job_id += k % 2 == 0
        event = {**template, "node": name, "job_id": job_id}
        body = json.dumps({"events": [event]}, separators=(",", ":")).encode()
        schedule.append((k / job_rate, signed(body, "hook", name), 1, -1))
    schedule.sort(key=lambda item: item[0])
    build_s = time.perf_counter() - t_build
    print(f"ready {len(schedule)} {build_s:.2f}", flush=True)
    sys.stdin.readline()

    results = asyncio.run(_run(schedule, host, port, spec))
    results["build_s"] = build_s
    results["requests_built"] = len(schedule)
    Path(spec["out"]).write_text(json.dumps(results))


def open_sessions(
    host: str, port: int, nodes: int, socket: str
) -> tuple[dict[str, tuple[str, bytes]], int]:
    """node -> (session id, key), and the datagram port the sessions offer (0: none): each
    simulated sidecar opens its session as a real one does (a MUNGE-signed POST /v1/session,
    the key read back through munged), before the window."""
    from concurrent.futures import ThreadPoolExecutor

    from slurm_recovery.contract import munge
    from slurm_recovery.contract import requests as signing

    offered: set[int] = set()

    def open_one(node: str) -> tuple[str, tuple[str, bytes]]:
        body = b"{}"
        headers = signing.sign(
            "POST", "/v1/session", body, role="sidecar", node=node, socket=socket
        )
        conn = http.client.HTTPConnection(host, port, timeout=60)
        try:
            conn.request(
                "POST", "/v1/session", body, {**headers, "Content-Type": "application/json"}
            )
            resp = conn.getresponse()
            answer = json.loads(resp.read())
        finally:
            conn.close()
        if resp.status != 201:
            raise RuntimeError(f"session for {node}: {resp.status} {answer}")
        key = munge.decode(answer["key"], socket=socket).payload
        offered.add(int(answer.get("datagram_port") or 0))
        return node, (answer["session"], key)

    with ThreadPoolExecutor(max_workers=8) as pool:
        keys = dict(pool.map(open_one, [f"n{i}" for i in range(1, nodes + 1)]))
    return keys, max(offered, default=0)


class Datagram:
    """A heartbeat datagram to send, and its possible answers' MACs -> the answer."""

    def __init__(self, data: bytes, answers: dict[str, str]) -> None:
        self.data = data
        self.answers = answers


class _Answers(asyncio.DatagramProtocol):
    """Takes the controller's answers to heartbeat datagrams: each resolves the future of
    the datagram whose answer MAC it carries (datagrams.answer_mac)."""

    def __init__(self, waiting: dict[str, asyncio.Future]) -> None:
        self.waiting = waiting

    def datagram_received(self, data: bytes, addr: Any) -> None:
        try:
            mac = json.loads(data).get("mac")
        except (ValueError, AttributeError):
            return
        future = self.waiting.pop(mac, None) if isinstance(mac, str) else None
        if future is not None and not future.done():
            future.set_result(mac)


async def _run(
    schedule: list[tuple[float, Any, int, int]], host: str, port: int, spec: dict[str, Any]
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    t0_wall = time.time() + 0.5
    t0 = loop.time() + 0.5
    print(f"start {t0_wall:.6f}", flush=True)
    w0, w1 = spec["warmup"], spec["warmup"] + spec["duration"]
    latencies: list[float] = []
    lags: list[float] = []
    timeline: list[tuple[float, float]] = []  # (sent at, s after the start; latency, s)
    statuses: dict[str, int] = {}
    state = {"outstanding": 0, "capped": 0, "errors": 0, "events_ok": 0, "late": 0, "wanted": 0}
    cap = spec["max_outstanding"]
    pending: set[asyncio.Task] = set()

    kept: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
    locks: dict[int, asyncio.Lock] = {}
    # --datagrams: a few UDP sockets for all the simulated sidecars (the controller checks
    # the address, not the port), answers matched to their datagram by MAC
    waiting: dict[str, asyncio.Future] = {}
    udp = [
        (
            await loop.create_datagram_endpoint(
                lambda: _Answers(waiting), remote_addr=(host, spec["datagram_port"])
            )
        )[0]
        for _ in range(DATAGRAM_SOCKETS if spec.get("datagrams") else 0)
    ]

    async def exchange_datagram(sidecar: int, datagram: Datagram) -> str:
        """One heartbeat datagram and its answer: "200" as an HTTP answer would count."""
        future = loop.create_future()
        for mac in datagram.answers:
            waiting[mac] = future
        try:
            udp[sidecar % len(udp)].sendto(datagram.data)
            mac = await asyncio.wait_for(future, datagrams.ANSWER_WAIT)
        finally:
            for mac_ in datagram.answers:
                waiting.pop(mac_, None)
        if datagram.answers[mac] == WANTED:
            state["wanted"] += 1
        return "200"

    async def exchange_kept(sidecar: int, payload: bytes) -> str:
        """One request on the sidecar's kept-alive connection (opened at its first), after
        the one before it on that connection (as one sidecar thread sends)."""
        async with locks.setdefault(sidecar, asyncio.Lock()):
            for attempt in (0, 1):
                if sidecar not in kept:
                    kept[sidecar] = await asyncio.open_connection(host, port)
                reader, writer = kept[sidecar]
                try:
                    writer.write(payload)
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next(
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                    answer = await reader.readexactly(length)
                    if answer == WANTED_ANSWER:
                        state["wanted"] += 1
                    return head[9:12].decode("ascii", "replace")
                except (asyncio.IncompleteReadError, ConnectionError):
                    kept.pop(sidecar, None)  # closed by the server while idle: reconnect
                    if attempt:
                        raise
            raise AssertionError("unreachable")

    async def send(payload: bytes, due: float, events: int, window: bool, sidecar: int) -> None:
        start = loop.time()
        done = loop.create_future()
        try:
            if isinstance(payload, Datagram):
                code = await exchange_datagram(sidecar, payload)
            elif spec.get("keep_alive") and sidecar >= 0:
                code = await asyncio.wait_for(exchange_kept(sidecar, payload), 30.0)
            else:
                await loop.create_connection(lambda: _Exchange(payload, done), host, port)
                code = (await asyncio.wait_for(done, 30.0)).decode("ascii", "replace")
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            code = type(exc).__name__
        end = loop.time()
        state["outstanding"] -= 1
        if window:
            statuses[code] = statuses.get(code, 0) + 1
            if code.startswith("2"):
                latencies.append(end - start)
                lags.append(start - due)
                timeline.append((round(start - t0, 3), round(end - start, 4)))
                state["events_ok"] += events

    for offset, payload, events, sidecar in schedule:
        due = t0 + offset
        delay = due - loop.time()
        if delay > 0.001:
            await asyncio.sleep(delay)
        window = w0 <= offset < w1
        if callable(payload):
            payload = payload()
        if state["outstanding"] >= cap:
            state["capped"] += window
            continue
        state["outstanding"] += 1
        task = loop.create_task(send(payload, due, events, window, sidecar))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.wait(pending, timeout=35)
    for _, writer in kept.values():
        writer.close()
    for transport in udp:
        transport.close()
    return {
        "t0": t0_wall,
        "latency": quantiles(latencies),
        "slowest": sorted(timeline, key=lambda item: -item[1])[: max(1, len(timeline) // 100)],
        "lag": quantiles(lags),
        "statuses": statuses,
        "capped": state["capped"],
        "events_ok": state["events_ok"],
        "heartbeats_wanted": state["wanted"],
    }


# --------------------------------------------------------------------------------- one run


def generator_spec(
    stack: Stack,
    nodes: int,
    args: argparse.Namespace,
    templates: tuple,
    *,
    name: str,
    status: dict[str, Any] | None = None,
    **schedule: float,
) -> dict[str, Any]:
    """What the generator process is told: where, how many nodes, the event each node sends
    (``status``: the sidecar's status unless given), and the schedule (period, job_rate,
    warmup, duration, tail)."""
    return {
        "port": stack.api_port,
        "nodes": nodes,
        **schedule,
        "munge_socket": str(stack.spec.munge_socket),
        "status": status or templates[0],
        "job_events": templates[1],
        "max_outstanding": args.max_outstanding,
        "keep_alive": args.keep_alive,
        "sessions": args.sessions,
        "full_every": args.full_every if args.heartbeats else 0.0,
        "datagrams": args.datagrams,
        "out": str(stack.base / f"{name}.json"),
    }


def start_generator(spec: dict[str, Any], spec_path: Path) -> tuple[subprocess.Popen, float]:
    """The generator process, once it has built and signed its requests, told to go: the
    process and the wall time its schedule starts at."""
    spec_path.write_text(json.dumps(spec))
    gen = subprocess.Popen(
        [sys.executable, __file__, "--generator", str(spec_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert gen.stdin is not None and gen.stdout is not None
    ready = gen.stdout.readline().split()
    if not ready or ready[0] != "ready":
        gen.kill()
        raise RuntimeError("the load generator did not start")
    gen.stdin.write("go\n")
    gen.stdin.flush()
    return gen, float(gen.stdout.readline().split()[1])


def run_load(
    stack: Stack, nodes: int, args: argparse.Namespace, templates: tuple, decide_job: int
) -> dict[str, Any]:
    stack.start_controller()
    spec = generator_spec(
        stack,
        nodes,
        args,
        templates,
        name=f"gen-{nodes}",
        period=args.period,
        job_rate=args.job_rate,
        warmup=args.warmup,
        duration=args.duration,
        tail=args.tail if decide_job else 1.0,
    )
    gen, t0 = start_generator(spec, stack.base / f"gen-{nodes}.spec.json")
    pids = {
        "controller": stack.controller,
        "munged": stack.pid("munged"),
        "slurmctld": stack.pid("slurmctld"),
        "generator": gen.pid,
    }

    def sleep_until(t: float) -> None:
        time.sleep(max(0.0, t - time.time()))

    rss_peak = [0.0]
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.wait(0.5):
            rss_peak[0] = max(rss_peak[0], rss_mb(stack.controller))

    sleep_until(t0 + args.warmup)
    threading.Thread(target=sample, daemon=True).start()
    profiler = None
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        profiler = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("py-spy")),
                "record",
                "--nonblocking",
                "-r",
                "50",
                "-d",
                str(int(args.duration)),
                "-f",
                "raw",
                "-p",
                str(stack.controller),
                "-o",
                str(args.profile / f"controller-{nodes}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    load0 = os.getloadavg()
    rpcs0 = sdiag_rpcs(stack.env())
    cpu0 = {k: cpu(p) for k, p in pids.items()}
    wait0 = cpu_wait(stack.controller)
    db0 = db_usage(stack.store)
    files0 = files_on_disk(stack.store)
    w0 = time.time()
    sleep_until(t0 + args.warmup + args.duration)
    cpu1 = {k: cpu(p) for k, p in pids.items()}
    wait1 = cpu_wait(stack.controller)
    w1 = time.time()
    rpcs1 = sdiag_rpcs(stack.env())
    db1 = db_usage(stack.store)
    kinds = stored_by_kind(stack.store, db0[1])
    files1 = files_on_disk(stack.store)
    load1 = os.getloadavg()
    rss_end = rss_mb(stack.controller)
    stop_sampling.set()
    if profiler is not None:
        profiler.wait(timeout=60)
    decide = None
    if decide_job:
        decide = decide_incident(stack, decide_job, "n1")
    gen.stdin.close()
    gen.wait(timeout=120)
    gen_result = json.loads(Path(spec["out"]).read_text())
    wall = w1 - w0
    accepted = sum(v for k, v in gen_result["statuses"].items() if k.startswith("2"))
    share = {k: (cpu1[k]["self"] - cpu0[k]["self"]) / wall for k in pids}
    slurm_cmds = (cpu1["controller"]["children"] - cpu0["controller"]["children"]) / wall
    events = db1[1] - db0[1]
    grown = db1[0] - db0[0]
    offered = nodes / args.period + args.job_rate
    result = {
        "nodes": nodes,
        "gpus_per_node": 8,
        "offered_requests_per_s": offered,
        "accepted_events_per_s": gen_result["events_ok"] / args.duration,
        "stored_events_per_s": events / wall,
        "latency_s": gen_result["latency"],
        "slowest_1pct": gen_result["slowest"],
        "generator_lag_s": gen_result["lag"],
        "statuses": gen_result["statuses"],
        "capped_by_generator": gen_result["capped"],
        "heartbeats_wanted": gen_result.get("heartbeats_wanted", 0),
        "controller_cpu_cores": share["controller"],
        "controller_cpu_ms_per_request": (
            1000 * share["controller"] * wall / accepted if accepted else None
        ),
        "controller_slurm_commands_cpu_cores": slurm_cmds,
        "controller_runnable_waiting_for_cpu": (wait1 - wait0) / wall,
        "controller_rss_mb": rss_end,
        "controller_rss_peak_mb": max(rss_peak[0], rss_end),
        "munged_cpu_cores": share["munged"],
        "slurmctld_cpu_cores": share["slurmctld"],
        "generator_cpu_cores": share["generator"],
        "generator_build_s": gen_result["build_s"],
        "loadavg_start": load0,
        "loadavg_end": load1,
        "window_s": wall,
        "slurm_rpcs_per_s": rpc_rates(rpcs0, rpcs1, wall),
        "db_bytes_per_event": grown / events if events else None,
        "stored_by_kind": kinds,
        # the store's growth over the window, at this load for a day (a sidecar status is
        # stored only when it changes: growth follows stored events, not requests)
        "db_bytes_per_day": grown / wall * 86400,
        "db_bytes_at_start": db0[0],
        "db_bytes_at_end": db1[0],
        # what the disk holds: the database file and the write-ahead log file, at the
        # window's start and end
        "files_at_start": files0,
        "files_at_end": files1,
    }
    if decide:
        result["decide_under_load"] = decide
    return result


# --------------------------------------------------------------------------------- a burst


#: What every node reports at once in ``--burst``: a fabric-wide event (a warning, as a flapping
#: switch gives every node behind it), marked so that the store can be counted.
BURST_EVENT = {
    "kind": "ib_finding",
    "payload": {
        "port": "mlx5_0/1",
        "check": "symbol_errors_rising",
        "severity": "warning",
        "detail": "symbol_error +12 since the last poll (bench burst)",
        "link_layer": "InfiniBand",
        "burst": True,
    },
}


def count_burst(store: Path) -> int:
    conn = sqlite3.connect(f"{store.as_uri()}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(
            "SELECT COUNT(*) FROM evidence WHERE kind = 'ib_finding' "
            "AND json_extract(payload, '$.burst') = 1"
        ).fetchone()[0]
    finally:
        conn.close()


def run_burst(
    stack: Stack, nodes: int, args: argparse.Namespace, templates: tuple, decide_job: int
) -> dict[str, Any]:
    """Every node reports a new finding within one second, on the running controller (issue
    29, item 4): how many are accepted, how fast, how many are in the store (none may be
    lost), and an XID posted in the middle of the burst: the loop keeps deciding.
    ``--burst-on new``: each finding on a connection of its own (a sidecar reporting less
    often than its client keeps a connection, contract.client.KEEP_ALIVE_IDLE); ``kept``: on
    the connection each sidecar's quiet status opened in the 5 s before (3 s or more before)."""
    kept = args.burst_on == "kept"
    lead = 8.0 if kept else 0.0
    spec = generator_spec(
        stack,
        nodes,
        args,
        templates,
        name=f"burst-{nodes}",
        status={**BURST_EVENT, "observed_at": time.time()},
        period=1.0,
        job_rate=0.0,
        warmup=lead,
        duration=1.0,
        tail=0.0,
    )
    # every node's request in flight at once if need be: a cap below that is the generator's
    # limit, not the controller's, and reads as a request not sent
    spec["max_outstanding"] = max(spec["max_outstanding"], nodes)
    spec["keep_alive"] = kept
    if kept:
        spec["prime"], spec["prime_lead"] = {**templates[0], "observed_at": time.time()}, lead
    before = count_burst(stack.store)
    gen, t0 = start_generator(spec, stack.base / f"burst-{nodes}.spec.json")
    time.sleep(max(0.0, t0 + lead + 0.5 - time.time()))  # the middle of the burst
    decide = decide_incident(stack, decide_job, "n1") if decide_job else None
    gen.stdin.close()
    gen.wait(timeout=120)
    result = json.loads(Path(spec["out"]).read_text())
    stored = 0
    deadline = time.monotonic() + 30  # answered means stored; allow the last group's commit
    while time.monotonic() < deadline:
        stored = count_burst(stack.store) - before
        if stored >= nodes:
            break
        time.sleep(0.5)
    accepted = sum(v for k, v in result["statuses"].items() if k.startswith("2"))
    return {
        "nodes": nodes,
        "sent_within_s": 1.0,
        "connections": "kept" if kept else "new",
        "accepted": accepted,
        "statuses": result["statuses"],
        "capped_by_generator": result["capped"],
        "latency_s": result["latency"],
        "stored": stored,
        "lost": accepted - stored,
        "decide_during_burst": decide,
    }


# --------------------------------------------------------------------------------- deciding


def submit_job(stack: Stack, node: str) -> int:
    """A one-node job that runs on ``node`` (the other slurmd node excluded, not --nodelist:
    a job pinned to a node is stopped, not requeued, and we want the usual decision)."""
    other = "n2" if node == "n1" else "n1"
    argv = ["sbatch", "--parsable", "-p", "debug", "-N1", "-x", other, "-o", "/dev/null"]
    out = subprocess.run(
        [*argv, "--wrap", "sleep 3600"],
        env=stack.env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip().split(";")[0])


def wait_running(stack: Stack, job_id: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["squeue", "-h", "-j", str(job_id), "-o", "%T"],
            env=stack.env(),
            capture_output=True,
            text=True,
        )
        if out.stdout.strip() == "RUNNING":
            return
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id} not running after {timeout:.0f}s")


def milestones(store: Path, job_id: int) -> dict[str, float]:
    conn = sqlite3.connect(f"{store.as_uri()}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute(
            "SELECT m.name, m.at FROM milestones m JOIN incidents i ON i.id = m.incident_id "
            "JOIN job_attempts a ON a.id = i.attempt_id WHERE a.job_id = ?",
            (job_id,),
        ).fetchall()
    finally:
        conn.close()
    return dict(rows)


def decide_incident(stack: Stack, job_id: int, node: str) -> dict[str, Any]:
    """Post an XID 79 on ``node`` as its sidecar; time until the incident is advised."""
    from slurm_recovery.contract.client import ClientError, ControllerClient
    from slurm_recovery.contract.wire import event_to_json

    client = ControllerClient(stack.url, munge_socket=str(stack.spec.munge_socket))
    posted = time.time()
    event = event_to_json(
        "xid", posted, node=node, gpu=0, payload={"xid": 79, "message": FALLEN_OFF}
    )
    try:
        client.post_evidence([event], role="sidecar", node=node)
    except ClientError as exc:
        return {"error": f"the XID report was not accepted: {exc}"}
    accepted = time.time()
    deadline = time.monotonic() + 120
    found: dict[str, float] = {}
    while time.monotonic() < deadline:
        found = milestones(stack.store, job_id)
        if "advised" in found:
            break
        time.sleep(0.02)
    if "advised" not in found:
        return {"error": "no incident within 120 s", "milestones": found}
    return {
        "job_id": job_id,
        "post_s": accepted - posted,
        "detected_s": found["detected"] - posted,
        "advised_s": found["advised"] - posted,
        "decision_s": found["advised"] - found["detected"],
    }


def pass_costs(stack: Stack) -> dict[str, Any]:
    """What one pass of the controller's loop spends on a large cluster, measured with the
    controller's own code: its node read (``scontrol -o show nodes``, parsed line by line: a
    first read, then a read with nothing changed), the JSON listing it replaced (the command,
    then one ``json.loads`` that holds the GIL throughout), the jobs, and the evidence of the
    last hour read from the store just loaded."""
    from slurm_recovery.controller.loop import EVIDENCE_HORIZON
    from slurm_recovery.scheduler.scontrol import ScontrolScheduler
    from slurm_recovery.store import Store

    sched = ScontrolScheduler(timeout=120, slurm_conf=str(stack.spec.slurm_conf))
    if stack.spec.slurm_prefix:
        sched.bin_dir = f"{stack.spec.slurm_prefix}/bin"

    def timed(fn: Any) -> tuple[Any, float, float]:
        """(result, wall s, CPU s of this process and its children)"""
        c0, t0 = os.times(), time.perf_counter()
        result = fn()
        t1, c1 = time.perf_counter(), os.times()
        used = sum(c1[:4]) - sum(c0[:4])
        return result, t1 - t0, used

    nodes, first_s, first_cpu = timed(sched.list_nodes)
    _, again_s, again_cpu = timed(sched.list_nodes)
    again_parsed = sched._node_lines.parsed
    _, jobs_s, _ = timed(sched.list_jobs)
    listing = sched._per_node_json()  # sinfo --json on 22.05, scontrol show nodes --json after
    out, json_cmd_s, json_cmd_cpu = timed(lambda: sched._run(listing))
    _, json_loads_s, _ = timed(lambda: json.loads(out))
    with Store.open(stack.store, readonly=True) as store:
        rows, evidence_s, _ = timed(
            lambda: store.find_evidence(since=time.time() - EVIDENCE_HORIZON, limit=1_000_000)
        )
    return {
        "nodes": len(nodes),
        "text_first_read_s": first_s,
        "text_first_read_cpu_s": first_cpu,
        "text_read_s": again_s,
        "text_read_cpu_s": again_cpu,
        "text_lines_parsed_again": again_parsed,
        "jobs_read_s": jobs_s,
        "json_listing": " ".join(listing),
        "json_bytes": len(out),
        "json_command_s": json_cmd_s,
        "json_command_cpu_s": json_cmd_cpu,
        "json_loads_s": json_loads_s,
        "evidence_rows_in_horizon": len(rows),
        "evidence_read_s": evidence_s,
    }


def decide_idle(stack: Stack, job_id: int, node: str, nodes: int) -> dict[str, Any]:
    stack.start_controller()
    time.sleep(2.0)  # a few passes: a steady, idle controller
    result = decide_incident(stack, job_id, node)
    result["nodes_in_view"] = nodes
    return result


def decide_at(nodes: int, args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    """A fresh slurmctld with ``nodes`` defined, an idle controller: decide an incident (an
    XID on a running job's node), then one pass's reads. Its own directory and ports."""
    base = args.base / f"decide-{nodes}"
    port_base = localcluster.free_port_block(PHANTOM_PORT_OFFSET + 1)  # the load's stack is down
    api_port = localcluster.free_port_block(1, start=port_base + PHANTOM_PORT_OFFSET + 1)
    stack = Stack(base, nodes, port_base, api_port, prefix)
    print(f"decide at {nodes} nodes: starting slurmctld ...", flush=True)
    t = time.monotonic()
    result: dict[str, Any] = {"nodes": nodes}
    try:
        stack.up()
    except (localcluster.ClusterError, subprocess.SubprocessError) as exc:  # e.g. no threads
        stack.down()
        log = stack.spec.base / "log" / "slurmctld.log"
        fatal = [ln for ln in log.read_text(errors="replace").splitlines() if "fatal" in ln]
        result["error"] = f"{exc}{': ' + fatal[-1] if fatal else ''}"
        print(f"  {result['error']}", flush=True)
        return result
    result["cluster_up_s"] = time.monotonic() - t
    try:
        job = submit_job(stack, "n1")
        wait_running(stack, job)
        stack.start_controller()
        time.sleep(3.0)  # a few passes: a steady, idle controller
        rpcs0, t0 = sdiag_rpcs(stack.env()), time.time()
        time.sleep(5.0)
        rpcs1 = sdiag_rpcs(stack.env())
        result["idle_slurm_rpcs_per_s"] = rpc_rates(rpcs0, rpcs1, time.time() - t0)
        c0, w0 = cpu(stack.controller), time.time()
        time.sleep(5.0)
        c1 = cpu(stack.controller)
        result["idle_controller_cpu_cores"] = (
            c1["self"] + c1["children"] - c0["self"] - c0["children"]
        ) / (time.time() - w0)
        result["rss_mb"] = rss_mb(stack.controller)
        result["decide"] = [decide_incident_again(stack, job, k) for k in range(3)]
        result["pass_costs"] = pass_costs(stack)
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--quiet", "-u", "root"], env=stack.env(), timeout=10)
        stack.down()
    return result


def decide_incident_again(stack: Stack, job: int, k: int) -> dict[str, Any]:
    """The k-th decision on ``job``: each on a fresh controller and store (an incident per
    job attempt), 2 s after it starts."""
    if k:
        stack.start_controller()
        time.sleep(2.0)
    return decide_incident(stack, job, "n1")


# --------------------------------------------------------------------------------- report


def _ms(q: dict[str, float], key: str) -> str:
    return f"{q[key] * 1000:8.1f}" if key in q else "       -"


def _num(value: float | None, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def print_table(report: dict[str, Any]) -> None:
    runs = report["runs"]
    print()
    print(
        f"controller scale: {report['period']:g} s report period, {report['job_rate']:g} job "
        f"events/s, window {report['duration']:g} s; auth: {report['auth']}"
    )
    print(f"node view: {report['node_view']}")
    print(f"connections: {report['connections']}")
    print(f"reports: {report.get('reports', 'every status in full')}")
    print(f"controller: {report['controller']}")
    header = (
        f"{'nodes':>6} {'req/s':>7} {'ev/s ok':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'ctl cpu':>7} {'ms/req':>6} {'wait':>5} {'+slurm':>6} {'rss MB':>7} {'munged':>6} "
        f"{'gen':>5} {'ctld':>5} {'rpc/s':>5} {'B/ev':>6} {'GB/day':>7} {'non-2xx':>7} "
        f"{'load':>10}"
    )
    print(header)
    for r in runs:
        bad = sum(v for k, v in r["statuses"].items() if not k.startswith("2"))
        bad += r["capped_by_generator"]
        bpe = r["db_bytes_per_event"]
        per_day = r["db_bytes_per_day"]
        print(
            f"{r['nodes']:>6} {r['offered_requests_per_s']:>7.0f} "
            f"{r['accepted_events_per_s']:>8.0f} {_ms(r['latency_s'], 'p50')} "
            f"{_ms(r['latency_s'], 'p99')} {_ms(r['latency_s'], 'max')} "
            f"{r['controller_cpu_cores']:>7.2f} {_num(r['controller_cpu_ms_per_request'], 6, 2)} "
            f"{r['controller_runnable_waiting_for_cpu']:>5.2f} "
            f"{r['controller_slurm_commands_cpu_cores']:>6.2f} "
            f"{r['controller_rss_mb']:>7.0f} {r['munged_cpu_cores']:>6.2f} "
            f"{r['generator_cpu_cores']:>5.2f} {r['slurmctld_cpu_cores']:>5.2f} "
            f"{sum(r['slurm_rpcs_per_s'].values()):>5.1f} "
            f"{'-' if bpe is None else round(bpe):>6} "
            f"{'-' if per_day is None else f'{per_day / 1e9:.1f}':>7} {bad:>7} "
            f"{r['loadavg_start'][0]:>4.1f}-{r['loadavg_end'][0]:<4.1f}"
        )
    print(
        "cpu columns: cores (1.00 = one core busy); ms/req: controller CPU per accepted "
        "request (its loop's passes included); wait: controller threads runnable but "
        "waiting for a CPU (held back by other processes); +slurm: the controller's "
        "squeue/sinfo children; rpc/s: RPCs slurmctld served per second (sdiag, all but "
        "its own and slurmd registrations); load: 1-min load average at window start-end"
    )
    for r in runs:
        print(f"  {r['nodes']} nodes, RPCs/s by type: {r['slurm_rpcs_per_s']}")
        if "heartbeat" in report.get("reports", ""):
            print(
                f'  {r["nodes"]} nodes: heartbeats answered "wanted" (the controller held '
                f"another condition): {r.get('heartbeats_wanted', 0)}"
            )
        a, b = r["files_at_start"], r["files_at_end"]
        print(
            f"  {r['nodes']} nodes, the store over the {r['window_s']:.0f} s window: in use "
            f"{r['db_bytes_at_start'] / 1e6:.1f} -> {r['db_bytes_at_end'] / 1e6:.1f} MB; on "
            f"disk: state.db {a['db'] / 1e6:.1f} -> {b['db'] / 1e6:.1f} MB, state.db-wal "
            f"{a['wal'] / 1e6:.1f} -> {b['wal'] / 1e6:.1f} MB; stored in it, by kind: "
            f"{r.get('stored_by_kind') or 'nothing'}"
        )
    print(f"retention: {report['retention']}")
    c = report.get("pass_costs")
    if c:
        ms = {k: f"{v * 1000:.0f} ms" for k, v in c.items() if k.endswith("_s")}
        print(
            f"one pass over {c['nodes']} nodes: node read (scontrol -o show nodes) "
            f"{ms['text_read_s']} wall, {ms['text_read_cpu_s']} CPU with nothing changed "
            f"({c['text_lines_parsed_again']} lines parsed), first read {ms['text_first_read_s']}"
            f"; jobs {ms['jobs_read_s']}; the JSON listing it replaces ({c['json_listing']}): "
            f"{ms['json_command_s']} ({c['json_bytes'] / 1e6:.1f} MB, "
            f"{ms['json_command_cpu_s']} CPU) + json.loads {ms['json_loads_s']} holding the "
            f"GIL; evidence of the last hour: {c['evidence_rows_in_horizon']} rows in "
            f"{ms['evidence_read_s']}"
        )
    b = report.get("burst")
    if b:
        d = b.get("decide_during_burst") or {}
        decided = (
            f"an XID posted in the middle of it: detected {d['detected_s'] * 1000:.0f} ms, "
            f"advised {d['advised_s'] * 1000:.0f} ms"
            if "advised_s" in d
            else f"the XID in the middle of it: {d.get('error', 'not decided')}"
        )
        print(
            f"burst: {b['nodes']} nodes, one new finding each within 1 s, on "
            f"{b.get('connections', 'new')} connections: {b['accepted']} "
            f"accepted ({b['statuses']}, {b['capped_by_generator']} not sent), p50 "
            f"{_ms(b['latency_s'], 'p50').strip()} ms, p99 {_ms(b['latency_s'], 'p99').strip()} "
            f"ms, max {_ms(b['latency_s'], 'max').strip()} ms; stored {b['stored']}, lost "
            f"{b['lost']}; {decided}"
        )
    for label, key in (("under load", "decide_under_load"), ("idle", "decide_idle")):
        d = report.get(key)
        if d and "advised_s" in d:
            print(
                f"decide an incident ({report['nodes_defined']} nodes, {label}): XID posted -> "
                f"detected {d['detected_s'] * 1000:.0f} ms, advised {d['advised_s'] * 1000:.0f} "
                f"ms (the decision, detected -> advised: {d['decision_s'] * 1000:.1f} ms)"
            )
        elif d:
            print(f"decide an incident ({label}): {d.get('error')}")
    if report.get("decide_by_nodes"):
        print()
        print(
            f"{'nodes':>6} {'posted->advised ms':>19} {'decision ms':>12} {'node read ms':>13} "
            f"{'idle cpu':>8} {'rss MB':>7} {'idle rpc/s':>10}"
        )
        for r in report["decide_by_nodes"]:
            ok = [d for d in r.get("decide", []) if "advised_s" in d]
            if not ok:
                print(f"{r['nodes']:>6} {r.get('error') or r['decide']}")
                continue
            advised = "/".join(f"{d['advised_s'] * 1000:.0f}" for d in ok)
            decision = "/".join(f"{d['decision_s'] * 1000:.1f}" for d in ok)
            print(
                f"{r['nodes']:>6} {advised:>19} {decision:>12} "
                f"{r['pass_costs']['text_read_s'] * 1000:>13.0f} "
                f"{r['idle_controller_cpu_cores']:>8.3f} {r['rss_mb']:>7.0f} "
                f"{sum(r['idle_slurm_rpcs_per_s'].values()):>10.1f}"
            )
        print(
            "  (three decisions each, on a fresh controller; idle cpu: cores, with its "
            "Slurm commands)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 100, 1,000; short windows")
    parser.add_argument("--nodes", type=int, nargs="+", help="N values (default 100 1000 10000)")
    parser.add_argument("--period", type=float, default=10.0, help="seconds between reports")
    parser.add_argument("--job-rate", type=float, default=100.0, help="job events per second")
    parser.add_argument("--duration", type=float, help="measured window, s (default 30; 4 quick)")
    parser.add_argument("--warmup", type=float, help="s before the window (default 5; 2 quick)")
    parser.add_argument("--tail", type=float, default=15.0, help="load kept on while deciding")
    parser.add_argument("--max-outstanding", type=int, default=4000)
    add_stack_options(parser)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--keep", action="store_true", help="leave the stack running")
    parser.add_argument(
        "--profile",
        type=Path,
        help="sample the controller with py-spy over each window (collapsed stacks to DIR)",
    )
    parser.add_argument(
        "--burst",
        action="store_true",
        help="after the load, every node of the largest N reports a new finding within 1 s "
        "(a fabric-wide event): accepted, latency, stored (none lost), and an XID decided "
        "in the middle of it",
    )
    parser.add_argument(
        "--burst-on",
        choices=("new", "kept"),
        default="new",
        help="the burst's connections: a new one for each finding (default), or the one each "
        "sidecar keeps open (its quiet status sent on it just before)",
    )
    parser.add_argument(
        "--sessions",
        action="store_true",
        help="each simulated sidecar reports in a session (auth.sessions), as a real one does "
        "by default; without it, one MUNGE credential per status (the code before sessions)",
    )
    parser.add_argument(
        "--heartbeats",
        action="store_true",
        help="after its first full status each simulated sidecar sends heartbeats (POST "
        "/v1/heartbeat, the status's condition digest) and its status in full every "
        "--full-every s, as a real one does by default; without it, every status in full",
    )
    parser.add_argument(
        "--datagrams",
        action="store_true",
        help="with --sessions --heartbeats: heartbeats as UDP datagrams to the port the "
        "sessions offer (controller.heartbeat_datagrams), as a real sidecar sends them by "
        "default; without it, over HTTP",
    )
    parser.add_argument(
        "--full-every",
        type=float,
        default=300.0,
        help="with --heartbeats: seconds between a node's full statuses (sidecar."
        "full_status_interval; default 300), staggered across the nodes",
    )
    parser.add_argument(
        "--keep-alive",
        action="store_true",
        help="each simulated sidecar sends on one kept-alive connection (hooks still one "
        "request per connection, as a hook process does)",
    )
    parser.add_argument(
        "--slurm",
        default="default",
        help="Slurm release: apt's (default) or a series built under /opt/slurm (24.11)",
    )
    parser.add_argument(
        "--decide-nodes",
        type=int,
        nargs="*",
        default=[],
        help="also: for each N, a fresh slurmctld with N nodes defined and an idle controller: "
        "the time to decide an incident and one pass's reads (e.g. 100 1000 10000 50000)",
    )
    parser.add_argument("--generator", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--launcher",
        type=Path,
        help="run this script (same arguments) instead of python -m slurm_recovery.controller: "
        "a patched controller, for before/after and what-if measurements; said in the output",
    )
    args = parser.parse_args()
    if args.generator:
        generate(json.loads(args.generator.read_text()))
        return 0
    if args.datagrams and not (args.sessions and args.heartbeats):
        parser.error("--datagrams needs --sessions and --heartbeats (a datagram is a heartbeat)")
    fill_stack_options(args, "scale", ports=PHANTOM_PORT_OFFSET + 1)
    nodes = args.nodes or ([100, 1000] if args.quick else [100, 1000, 10_000])
    args.duration = args.duration or (4.0 if args.quick else 30.0)
    args.warmup = args.warmup if args.warmup is not None else (2.0 if args.quick else 5.0)
    if args.quick:
        args.tail = min(args.tail, 8.0)
    defined = max(max(nodes), SLURMD_NODES)
    prefix = localcluster.resolve_slurm(args.slurm)

    stack = Stack(args.base, defined, args.port_base, args.api_port, prefix)
    release = localcluster.slurm_release(stack.spec)
    stack.launcher = args.launcher
    stack.session_ttl = max(3600.0, args.warmup + args.duration + args.tail + 900.0)
    print(f"starting munged, slurmctld ({defined} nodes defined) in {args.base} ...", flush=True)
    t = time.monotonic()
    stack.up()
    cluster_up_s = time.monotonic() - t
    report: dict[str, Any] = {
        "quick": args.quick,
        "period": args.period,
        "job_rate": args.job_rate,
        "duration": args.duration,
        "nodes_defined": defined,
        "cluster_up_s": cluster_up_s,
        "slurm": release,
        "node_view": (
            f"real slurmctld (Slurm {release}), slurm.conf defines {defined} nodes "
            f"({SLURMD_NODES} with a slurmd); the controller reads them with "
            "scontrol -o show nodes (a listing under 1 s old reused by passes woken by evidence)"
        ),
        "connections": (
            "each sidecar on one kept-alive connection; each hook event on its own"
            if args.keep_alive
            else "one TCP connection per request (Connection: close)"
        ),
        "auth": (
            "sidecars in sessions: each opened with one MUNGE credential before the window, "
            "each status signed in it (HMAC) as it is sent; hook events: one MUNGE credential "
            "per request, decoded by the controller through munged"
            if args.sessions
            else "real MUNGE: one credential per request (role sidecar/hook), encoded by the "
            "generator before the window, decoded by the controller through munged in it"
        ),
        "reports": (
            f"heartbeats: each node's first status in full, then a heartbeat (POST "
            f"/v1/heartbeat, its condition's digest) for each unchanged status, and its status "
            f"in full every {args.full_every:g} s (staggered)"
            + (
                "; each heartbeat a UDP datagram signed in the session (contract.datagrams), "
                "not an HTTP request"
                if args.datagrams
                else ""
            )
            if args.heartbeats
            else "every status in full (POST /v1/evidence)"
        ),
        "retention": (
            f"store.retention (default {DEFAULTS['store.retention'] / 86400:g} days) deletes "
            f"routine evidence ({', '.join(ROUTINE_EVIDENCE)}) once it is older, hourly: the "
            "store then holds at most that many days of the GB/day shown (all of it routine "
            "here) and stops growing; SQLite reuses the freed pages"
        ),
        "runs": [],
        "cpu_count": os.cpu_count(),
        "controller": (
            f"PATCHED: {args.launcher} "
            + " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("WHATIF_"))
            if args.launcher
            else "python -m slurm_recovery.controller (as srecovery dev up starts it)"
        ),
    }
    try:
        templates = sidecar_templates(args.base, stack.config)
        report["status_event_bytes"] = len(json.dumps(templates[0], separators=(",", ":")))
        jobs = [submit_job(stack, "n1"), submit_job(stack, "n2")]
        for job in jobs:
            wait_running(stack, job)
        for n in nodes:
            print(f"N = {n}: fresh controller, building and signing requests ...", flush=True)
            run = run_load(stack, n, args, templates, jobs[0] if n == max(nodes) else 0)
            report["runs"].append(run)
            print(
                f"  {run['accepted_events_per_s']:.0f} events/s, p99 "
                f"{run['latency_s'].get('p99', float('nan')) * 1000:.1f} ms, controller "
                f"{run['controller_cpu_cores']:.2f} cores",
                flush=True,
            )
            if "decide_under_load" in run:
                report["decide_under_load"] = run.pop("decide_under_load")
        if args.burst:
            n = max(nodes)
            print(f"burst: {n} nodes each report a new finding within 1 s ...", flush=True)
            burst_job = submit_job(stack, "n1")  # a job with no incident yet, to decide
            wait_running(stack, burst_job)
            report["burst"] = run_burst(stack, n, args, templates, burst_job)
        report["pass_costs"] = pass_costs(stack)
        report["decide_idle"] = decide_idle(stack, jobs[1], "n2", defined)
    finally:
        if not args.keep:
            with contextlib.suppress(Exception):
                subprocess.run(["scancel", "--quiet", "-u", "root"], env=stack.env(), timeout=10)
            stack.down()
    report["decide_by_nodes"] = [decide_at(n, args, prefix) for n in args.decide_nodes]
    if args.json:  # first: the figures are kept whatever the table makes of them
        write_json(args.json, "controller_scale", report, args.quick)
    print_table(report)
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
