"""Fault soak: kill the controller at random points of a recovery; restart the controller and a
sidecar during a controller outage. Prints what was tried, how many times, and what was lost.

    .venv/bin/python bench/soak_faults.py --trials 100                  # kill: 100 recoveries
    .venv/bin/python bench/soak_faults.py --scenario outage --outage 600  # a 10-minute outage
    .venv/bin/python bench/soak_faults.py --quick                       # CI: 3 kills, 20 s outage

Both scenarios run on their own local cluster (4 nodes, ``--base``, ports from ``--port-base``)
with one controller (act mode, MUNGE on) as its own process; ``outage`` adds n2's sidecar with
simulated GPUs. Root is needed, as for the tests. docs/reliability.md has the figures.

``kill`` (docs/reliability.md, "controller killed at random points"): per trial a 2-node job
runs, a fatal XID on one of its nodes is reported over HTTP (202: the evidence is stored), and
after a random delay (0 to ``--max-delay`` s: before the incident, between any two steps, after
the release) the controller gets SIGKILL and is started again on the same store. Checked per
trial: the job runs again once (restart count 1) away from the node, not held; no step of the
restart is recorded ``ok`` twice (steps done but recorded only as "found done" by the restarted
controller, or not at all, are counted); the incident, its advice and the advice's audit row are
there; at the end, the audit chain verifies and ``PRAGMA integrity_check`` says ok.

``outage`` (docs/reliability.md, "restarts during an outage"): the controller is killed
(SIGKILL); for ``--outage`` seconds an XID is injected on n2 and a ``job_end`` left in n2's hook
spool every ``--every`` seconds; n2's sidecar is stopped (SIGTERM) and started again a third
of the way in, killed (SIGKILL) and started again two thirds in; then the controller is started
on the same store. Counted: events made, stored, lost (made, never stored) and stored twice.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import write_json
from bench.support import add_stack_options, fill_stack_options
from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ControllerClient
from slurm_recovery.contract.spool import HookSpool
from slurm_recovery.contract.wire import event_to_json
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.sidecar.sim import inject
from slurm_recovery.store import Store

FALLEN_OFF = {"xid": 79, "message": "GPU has fallen off the bus."}
#: The steps of a restart (act mode), each to be recorded ok exactly once.
RESTART_STEPS = ("drain", "mark", "requeue_hold", "exclude", "begin_now", "release", "unmark")
CONTROLLER = "slurm_recovery.controller"


def wait(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what}: not within {timeout:.0f}s")


@dataclass
class Controller:
    """One controller process with its own base directory, store and port on a cluster."""

    cluster: localcluster.ClusterSpec
    base: Path
    port: int
    pid: int = 0
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def db(self) -> Path:
        return self.base / "state.db"

    @property
    def config(self) -> Path:
        return self.base / "config.toml"

    @property
    def client(self) -> ControllerClient:
        return ControllerClient(self.url, munge_socket=str(self.cluster.munge_socket))

    @classmethod
    def create(
        cls, cluster: localcluster.ClusterSpec, base: Path, port: int, mode: str = "act"
    ) -> Controller:
        base.mkdir(parents=True, exist_ok=True)
        base.chmod(0o755)
        devstack.write_policy(base / "policy.toml", mode)
        devstack.write_config(base, cluster, port)
        return cls(cluster, base, port)

    def start(self) -> None:
        self.pid = devstack.start_controller(self.config, self.base / "controller.log")
        self.starts += 1
        devstack.wait_healthy(self.url, timeout=60, pid=self.pid)

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would."""
        if localcluster.process_alive(self.pid, CONTROLLER):
            os.kill(self.pid, signal.SIGKILL)
        wait(lambda: not localcluster.process_alive(self.pid, CONTROLLER), 10, "controller exit")

    def stop(self) -> None:
        localcluster.stop_process(self.pid, CONTROLLER)


# --------------------------------------------------------------------------------- kill


def sbatch(cluster: localcluster.ClusterSpec, *args: str) -> int:
    out = subprocess.run(
        ["sbatch", "--parsable", *args],
        env=localcluster.slurm_env(cluster),
        capture_output=True,
        text=True,
        check=True,
        cwd="/tmp",
    )
    return int(out.stdout.strip().split(";")[0])


def scancel(cluster: localcluster.ClusterSpec, job_id: int) -> None:
    subprocess.run(
        ["scancel", str(job_id)], env=localcluster.slurm_env(cluster), capture_output=True
    )


def job_incidents(store: Store, job_id: int) -> list[Any]:
    """The incidents of a job (every attempt), newest first."""
    return [
        i
        for i in store.list_incidents(limit=1_000_000)
        if (a := store.get_attempt(i.attempt_id)) is not None and a.attempt.job_id == job_id
    ]


def _steps_done(db: Path, job_id: int, found: bool = False) -> list[str]:
    """The steps recorded ok for the job's incidents, in order, as ``step`` or ``step target``
    for a drain (one per node); ``found``: only those the controller recorded as found done in
    Slurm after a restart, with no record of its own."""
    with Store.open(db, readonly=True) as store:
        steps = []
        for incident in job_incidents(store, job_id):
            steps += [
                f"{a.step} {a.target}" if a.step == "drain" else a.step
                for a in store.actions(incident_id=incident.id)
                if a.result == "ok" and (not found or a.message.startswith("found done"))
            ]
    return steps


def kill_trial(
    ctl: Controller, sched: ScontrolScheduler, rng: random.Random, max_delay: float
) -> dict[str, Any]:
    """One recovery with the controller killed at a random moment; what was checked."""
    cluster = ctl.cluster
    job_id = sbatch(cluster, "-N2", "--wrap=sleep 600")
    try:
        first = wait(
            lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j, 60, "job running"
        )
        bad = first.nodes[0]
        ctl.client.post_evidence(
            [event_to_json("xid", time.time(), node=bad, gpu=1, payload=FALLEN_OFF)],
            role="operator",
        )
        delay = rng.uniform(0.0, max_delay)
        time.sleep(delay)
        ctl.kill()
        done_at_kill = _steps_done(ctl.db, job_id)
        ctl.start()
        again = wait(
            lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j.restart_count >= 1 and j,
            90,
            f"job {job_id} running again",
        )

        def closed() -> list[Any]:
            with Store.open(ctl.db, readonly=True) as store:
                return [i for i in job_incidents(store, job_id) if i.closed_at]

        wait(closed, 30, f"job {job_id}'s incident closed")
        time.sleep(1.5)  # a pass or two more: a step done twice would show now
        steps = _steps_done(ctl.db, job_id)
        job = sched.get_job(job_id)
        with Store.open(ctl.db, readonly=True) as store:
            incidents = job_incidents(store, job_id)
            advice = [store.latest_advice(i.id) for i in incidents]
            audited = {
                r.payload.get("incident")
                for r in store.iter_audit()
                if r.kind == "advice" and r.subject == f"job {job_id}"
            }
        counts = Counter(steps)
        return {
            "job_id": job_id,
            "delay": round(delay, 3),
            "steps_before_kill": len(done_at_kill),
            "killed_after": done_at_kill[-1].split()[0] if done_at_kill else "(no step yet)",
            "steps_twice": sorted(s for s, n in counts.items() if n > 1),
            # done in Slurm (the job runs again) but not recorded: killed between the call
            # and the commit of its record, and not visible in Slurm afterwards (begin_now)
            "steps_missing": [
                s for s in RESTART_STEPS if not any(d == s or d.startswith(f"{s} ") for d in counts)
            ],
            "steps_found": _steps_done(ctl.db, job_id, found=True),
            "restart_count": job.restart_count,
            "left_held": job.held,
            "on_bad_node": bad in again.nodes,
            "incidents": len(incidents),
            "advice_lost": sum(1 for a in advice if a is None)
            + sum(1 for i in incidents if i.id not in audited)
            + (0 if incidents else 1),
            "outcome": incidents[0].outcome if incidents else None,
        }
    finally:
        scancel(cluster, job_id)
        for node in sched.list_nodes():  # the blast radius counts the tool's drains in force
            if node.drained:
                sched.resume_node(node.name)


def store_health(db: Path) -> dict[str, Any]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
    with Store.open(db, readonly=True) as store:
        chain = store.verify_audit()
    return {
        "integrity_check": integrity,
        "audit_chain_ok": chain.ok,
        "audit_rows": chain.rows_checked,
    }


def run_kill(
    cluster: localcluster.ClusterSpec,
    base: Path,
    port: int,
    trials: int,
    *,
    seed: int = 1,
    max_delay: float = 2.5,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    rng = random.Random(seed)
    sched = ScontrolScheduler(timeout=10, slurm_conf=str(cluster.slurm_conf))
    ctl = Controller.create(cluster, base, port)
    ctl.start()
    rows = []
    try:
        for n in range(trials):
            row = kill_trial(ctl, sched, rng, max_delay)
            rows.append(row)
            bad = row["steps_twice"] or row["left_held"] or row["restart_count"] != 1
            say(
                f"trial {n + 1}/{trials}: killed after {row['delay']:.2f}s "
                f"({row['killed_after']}); restart count {row['restart_count']}"
                f"{'; PROBLEM ' + json.dumps(row) if bad or row['advice_lost'] else ''}"
            )
    finally:
        ctl.stop()
    health = store_health(ctl.db)
    return {
        "trials": len(rows),
        "controller_starts": ctl.starts,
        "killed_after_step": dict(Counter(r["killed_after"] for r in rows)),
        "steps_done_twice": sum(len(r["steps_twice"]) for r in rows),
        "steps_recorded_as_found": dict(
            Counter(s.split()[0] for r in rows for s in r["steps_found"])
        ),
        "steps_done_not_recorded": sum(len(r["steps_missing"]) for r in rows),
        "steps_not_recorded": dict(Counter(s for r in rows for s in r["steps_missing"])),
        "restarted_more_than_once": sum(1 for r in rows if r["restart_count"] != 1),
        "jobs_left_held": sum(1 for r in rows if r["left_held"]),
        "jobs_back_on_the_bad_node": sum(1 for r in rows if r["on_bad_node"]),
        "incidents_not_one": sum(1 for r in rows if r["incidents"] != 1),
        "advice_lost": sum(r["advice_lost"] for r in rows),
        **health,
        "rows": rows,
    }


# --------------------------------------------------------------------------------- outage


def _stored(db: Path, node: str) -> tuple[list[int], list[int]]:
    """Injection ids of the stored XIDs and job ids of the stored job_ends from ``node``."""
    with Store.open(db, readonly=True) as store:
        found = [r.evidence for r in store.find_evidence(node=node, limit=1_000_000)]
    xids = [e.payload.get("injection") for e in found if e.kind == "xid"]
    ends = [e.job_id for e in found if e.kind == "job_end"]
    return [x for x in xids if x is not None], [j for j in ends if j is not None]


@dataclass
class Sidecar:
    config: Path
    node: str
    log: Path
    pid: int = 0
    starts: int = 0
    pids: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.pid = devstack.start_sidecar(self.config, self.node, self.log)
        self.starts += 1

    def stop(self, sig: int = signal.SIGTERM) -> None:
        must = f"--node {self.node}"
        if sig == signal.SIGKILL and localcluster.process_alive(self.pid, must):
            os.kill(self.pid, signal.SIGKILL)
        localcluster.stop_process(self.pid, must, timeout=30)


def run_outage(
    cluster: localcluster.ClusterSpec,
    base: Path,
    port: int,
    outage: float,
    *,
    every: float = 2.0,
    node: str = "n2",
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    ctl = Controller.create(cluster, base, port, mode="monitor")
    ctl.start()
    sidecar = Sidecar(ctl.config, node, base / f"sidecar-{node}.log")
    sidecar.start()
    spool = HookSpool(base / "spool" / node)
    made_xids: list[int] = []
    made_ends: list[int] = []
    job_id = 900_000  # job ids no Slurm job has: these job_ends are records only
    try:
        wait(lambda: _stored_status(ctl.db, node), 60, "the sidecar's first status")
        ctl.kill()
        began = time.monotonic()
        say(f"controller killed; outage of {outage:.0f}s, an XID and a job_end every {every}s")
        restarted = {"term": False, "kill": False}
        while (elapsed := time.monotonic() - began) < outage:
            (event,) = inject(base / "sim", node, gpu=len(made_xids) % 8, xid=48)
            made_xids.append(event["id"])
            job_id += 1
            spool.put(
                event_to_json(
                    "job_end",
                    time.time(),
                    node=node,
                    job_id=job_id,
                    payload={"exit_code": 1, "signal": 0, "restart_count": 0, "nodes": [node]},
                )
            )
            made_ends.append(job_id)
            if elapsed > outage / 3 and not restarted["term"]:
                sidecar.stop(signal.SIGTERM)
                sidecar.start()
                restarted["term"] = True
                say(f"{elapsed:.0f}s: sidecar stopped (SIGTERM) and started again")
            elif elapsed > 2 * outage / 3 and not restarted["kill"]:
                sidecar.stop(signal.SIGKILL)
                sidecar.start()
                restarted["kill"] = True
                say(f"{elapsed:.0f}s: sidecar killed (SIGKILL) and started again")
            time.sleep(every)
        ctl.start()
        back = time.monotonic()
        say(f"controller started again after {back - began:.0f}s")

        def all_in() -> bool:
            xids, ends = _stored(ctl.db, node)
            return set(made_xids) <= set(xids) and set(made_ends) <= set(ends)

        with contextlib.suppress(TimeoutError):  # counted below
            wait(all_in, 120, "every event stored", interval=0.5)
        delivered_in = time.monotonic() - back
        time.sleep(2)  # a duplicate still on its way would show now
        xids, ends = _stored(ctl.db, node)
    finally:
        sidecar.stop()
        ctl.stop()
    dropped = _dropped(base / "spool" / node / "outbox" / "outbox.db")
    return {
        "outage_seconds": round(outage, 1),
        "sidecar_restarts": sidecar.starts - 1,
        "controller_starts": ctl.starts,
        "xids_made": len(made_xids),
        "xids_stored": len(set(xids) & set(made_xids)),
        "xids_lost": len(set(made_xids) - set(xids)),
        "xids_stored_twice": len(xids) - len(set(xids)),
        "job_ends_made": len(made_ends),
        "job_ends_stored": len(set(ends) & set(made_ends)),
        "job_ends_lost": len(set(made_ends) - set(ends)),
        "job_ends_stored_twice": len(ends) - len(set(ends)),
        "outbox_dropped": dropped,
        "all_delivered_seconds_after_controller_start": round(delivered_in, 2),
        **store_health(ctl.db),
    }


def _stored_status(db: Path, node: str) -> bool:
    if not db.exists():
        return False
    with Store.open(db, readonly=True) as store:
        return any(
            r.evidence.kind == "sidecar_status" for r in store.find_evidence(node=node, limit=100)
        )


def _dropped(outbox: Path) -> int | None:
    if not outbox.exists():
        return None
    with sqlite3.connect(f"file:{outbox}?mode=ro", uri=True) as conn:
        row = conn.execute("SELECT value FROM counters WHERE name = 'dropped'").fetchone()
    return int(row[0]) if row else 0


# --------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["kill", "outage", "both"], default="both")
    parser.add_argument("--trials", type=int, default=100, help="kill: recoveries")
    parser.add_argument("--max-delay", type=float, default=2.5, help="kill: latest SIGKILL, s")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--outage", type=float, default=600.0, help="outage: seconds")
    parser.add_argument("--every", type=float, default=2.0, help="outage: event interval, s")
    parser.add_argument("--quick", action="store_true", help="3 kill trials, a 20 s outage")
    add_stack_options(parser, api_port=False)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    fill_stack_options(args, "faults", ports=120)  # the controllers' ports follow the cluster's
    # stopped with SIGTERM (or SIGINT in the background): stop the cluster on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
    if args.quick:
        args.trials, args.outage = 3, 20.0
    localcluster.down(args.base / "cluster")
    shutil.rmtree(args.base, ignore_errors=True)
    args.base.mkdir(parents=True)
    args.base.chmod(0o755)
    cluster = localcluster.ClusterSpec(
        base=args.base / "cluster", nodes=4, port_base=args.port_base, name="srfault"
    )
    figures: dict[str, Any] = {}
    localcluster.up(cluster)
    try:
        api = localcluster.free_port_block(1, start=args.port_base + 100)
        if args.scenario in ("kill", "both"):
            figures["kill"] = run_kill(
                cluster,
                Path(tempfile.mkdtemp(prefix="kill-", dir=args.base)),
                api,
                args.trials,
                seed=args.seed,
                max_delay=args.max_delay,
            )
        if args.scenario in ("outage", "both"):
            figures["outage"] = run_outage(
                cluster,
                Path(tempfile.mkdtemp(prefix="outage-", dir=args.base)),
                localcluster.free_port_block(1, start=api + 1),
                args.outage,
                every=args.every,
            )
    finally:
        localcluster.down(cluster.base)
    for name, result in figures.items():
        print(f"\n{name}:")
        for key, value in result.items():
            if key != "rows":
                print(f"  {key:46} {value}")
    write_json(args.json, "soak_faults", figures, args.quick)
    lost = [
        f"{name}.{key}"
        for name, result in figures.items()
        for key, value in result.items()
        if key
        in (
            "steps_done_twice",
            "restarted_more_than_once",
            "jobs_left_held",
            "jobs_back_on_the_bad_node",
            "incidents_not_one",
            "advice_lost",
            "xids_lost",
            "job_ends_lost",
        )
        and value
    ]
    if lost:
        print(f"\nPROBLEMS: {', '.join(lost)}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
