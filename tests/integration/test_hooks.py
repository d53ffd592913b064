"""The hooks on a real local cluster: slurmd runs the node Prolog/Epilog, slurmctld runs
EpilogSlurmctld, both through the wrappers ``write_hook_wrappers`` writes (as the dev stack
does), with the slurm.conf lines docs/hooks.md gives. Real batch jobs, real exit codes, a real
controller with MUNGE, and the prolog health gate draining a node through Slurm itself."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_recovery import devstack, hooks, localcluster
from slurm_recovery.contract.spool import read_spooled
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.store import Store
from tests.conftest import _free_port_block, wait_for

pytestmark = pytest.mark.cluster

NODES = 3


@dataclass
class HookCluster:
    spec: localcluster.ClusterSpec
    base: Path
    config: Path
    url: str
    scheduler: ScontrolScheduler

    @property
    def env(self) -> dict[str, str]:
        return localcluster.slurm_env(self.spec)

    def node_events(self, node: str, job_id: int) -> list[dict]:
        spool = self.base / "spool" / node
        return [e for e in read_spooled(spool) if e.get("job_id") == job_id]

    def wait_events(self, node: str, job_id: int, count: int) -> list[dict]:
        """The node's spooled events for the job, once there are ``count`` of them."""
        wait_for(lambda: len(self.node_events(node, job_id)) >= count, timeout=10)
        return self.node_events(node, job_id)

    def ctld_events(self, job_id: int) -> list[dict]:
        spool = self.base / "spool" / "controller"
        return [e for e in read_spooled(spool) if e.get("job_id") == job_id]

    def submit(self, *args: str) -> int:
        out = subprocess.run(
            ["sbatch", "--parsable", "-o", "/dev/null", *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
            cwd="/tmp",
        )
        return int(out.stdout.strip().split(";")[0])

    def finished(self, job_id: int) -> str | None:
        state = self.scheduler.get_job(job_id).state
        return state if state in ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL") else None

    def set_gate(self, on: bool) -> None:
        """hooks.health_gate on or off; the rest of the file (hooks.job_dir too) stays."""
        text = re.sub(r"(?m)^health_gate = .*\n", "", self.config.read_text())
        gate = f"health_gate = {'true' if on else 'false'}\n"
        self.config.write_text(text.replace("\n[hooks]\n", f"\n[hooks]\n{gate}", 1))

    def set_nhc(self, path: str, timeout: str = "30s") -> None:
        """hooks.nhc and hooks.nhc_timeout ("" leaves the site's check off)."""
        text = re.sub(r"(?m)^nhc(_timeout)? = .*\n", "", self.config.read_text())
        keys = f'nhc = "{path}"\nnhc_timeout = "{timeout}"\n'
        self.config.write_text(text.replace("\n[hooks]\n", f"\n[hooks]\n{keys}", 1))

    def write_health(self, node: str, fatal: list[dict]) -> Path:
        path = self.base / "spool" / node / hooks.HEALTH_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"updated_at": time.time(), "node": node, "fatal": fatal}))
        return path


@pytest.fixture(scope="module")
def cluster() -> Iterator[HookCluster]:
    base = Path(tempfile.mkdtemp(prefix="srecovery-hooks-"))
    base.chmod(0o755)  # munged (user munge) must reach its socket directory inside
    port_base = _free_port_block(NODES + 1)
    spec = localcluster.ClusterSpec(
        base=base / "cluster", nodes=NODES, port_base=port_base, name="srhooks"
    )
    api_port = _free_port_block(1, start=port_base + 400)
    devstack.write_policy(base / "policy.toml", "monitor")
    config = devstack.write_config(base, spec, api_port)
    wrappers = hooks.write_hook_wrappers(base / "hooks", config)
    spec.extra_conf = hooks.slurm_conf_lines(wrappers)
    stack = HookCluster(
        spec=spec,
        base=base,
        config=config,
        url=f"http://127.0.0.1:{api_port}",
        scheduler=ScontrolScheduler(timeout=10, slurm_conf=str(spec.slurm_conf)),
    )
    stack.set_gate(False)
    try:
        localcluster.up(spec)
        yield stack
    finally:
        localcluster.down(spec.base)


@pytest.fixture(scope="module")
def two_jobs(cluster: HookCluster) -> dict[str, int]:
    """One job that succeeds on two nodes and one that exits 3, both run to the end while
    no controller is running."""
    jobs = {
        "ok": cluster.submit("-N2", "--wrap=sleep 1"),
        "exit3": cluster.submit("-N1", "--wrap=exit 3"),
    }
    for job_id in jobs.values():
        wait_for(lambda j=job_id: cluster.finished(j), timeout=60)
    return jobs


def test_node_hooks_spool_job_start_and_end_on_every_node(cluster, two_jobs):
    job = cluster.scheduler.get_job(two_jobs["ok"])
    assert job.state == "COMPLETED"
    nodes = sorted(job.nodes)
    assert len(nodes) == 2
    for node in nodes:
        start, end = cluster.wait_events(node, job.job_id, 2)
        assert (start["kind"], end["kind"]) == ("job_start", "job_end")
        assert start["node"] == end["node"] == node
        assert start["payload"]["context"] == "prolog"
        assert end["payload"]["context"] == "epilog"
        assert start["payload"]["nodes"] == end["payload"]["nodes"] == nodes
        assert start["payload"]["restart_count"] == 0
        assert (end["payload"]["exit_code"], end["payload"]["signal"]) == (0, 0)
        assert start["observed_at"] <= end["observed_at"]

    failed = cluster.scheduler.get_job(two_jobs["exit3"])
    assert failed.state == "FAILED"
    (node,) = failed.nodes
    start, end = cluster.wait_events(node, failed.job_id, 2)
    assert start["kind"] == "job_start" and start["payload"]["nodes"] == [node]
    assert end["kind"] == "job_end"
    assert (end["payload"]["exit_code"], end["payload"]["signal"]) == (3, 0)
    assert end["payload"]["exit_code2"] == "3:0"
    assert end["payload"]["exit_status"] == 768
    for other in cluster.spec.node_names:
        if other != node:
            assert cluster.node_events(other, failed.job_id) == []


def test_ctld_spools_while_the_controller_is_down_and_jobs_end_normally(cluster, two_jobs):
    ok, failed = (cluster.scheduler.get_job(two_jobs[k]) for k in ("ok", "exit3"))
    assert (ok.state, ok.exit_code.returncode) == ("COMPLETED", 0)
    assert (failed.state, failed.exit_code.returncode) == ("FAILED", 3)
    for job in (ok, failed):
        assert not job.held and job.restart_count == 0
        (event,) = cluster.ctld_events(job.job_id)
        assert event["kind"] == "job_end" and "node" not in event
        payload = event["payload"]
        assert payload["context"] == "epilog_slurmctld"
        assert payload["nodes"] == sorted(job.nodes)
        assert payload["restart_count"] == 0
    assert cluster.ctld_events(failed.job_id)[0]["payload"]["exit_code"] == 3
    assert cluster.ctld_events(ok.job_id)[0]["payload"]["exit_code"] == 0
    assert not any(node.drained for node in cluster.scheduler.list_nodes())


def test_ctld_events_reach_a_running_controller_and_the_spool_is_imported(cluster, two_jobs):
    db = cluster.base / "state.db"

    def stored(job_id: int) -> list:
        with Store.open(db, readonly=True) as store:
            return [
                r.evidence
                for r in store.find_evidence(job_id=job_id)
                if r.evidence.payload.get("context") == "epilog_slurmctld"
            ]

    assert all(cluster.ctld_events(job_id) for job_id in two_jobs.values())
    pid = devstack.start_controller(cluster.config, cluster.base / "controller.log")
    try:
        devstack.wait_healthy(cluster.url, pid=pid)
        # What EpilogSlurmctld spooled while the controller was down arrives now ...
        for name, job_id in two_jobs.items():
            (evidence,) = wait_for(lambda j=job_id: stored(j), timeout=15)
            assert evidence.kind == "job_end"
            assert evidence.payload["exit_code"] == (3 if name == "exit3" else 0)
            assert cluster.ctld_events(job_id) == []  # imported: gone from the spool

        # ... and a job ending while it runs is posted directly, not spooled.
        job_id = cluster.submit("-N1", "--wrap=exit 3")
        wait_for(lambda: cluster.finished(job_id), timeout=60)
        ended = time.time()
        (evidence,) = wait_for(lambda: stored(job_id), timeout=10)
        print(f"job end -> evidence stored: {time.time() - ended:.2f}s (at most)")
        assert evidence.kind == "job_end" and evidence.source == "operator"
        assert evidence.payload["exit_code"] == 3
        assert evidence.node is None
        assert cluster.ctld_events(job_id) == []
    finally:
        localcluster.stop_process(pid, "slurm_recovery.controller")
    assert cluster.finished(job_id) == "FAILED"


FATAL = [{"check": "ecc_dbe", "gpu": 0, "since": 0, "detail": "volatile DBE +1"}]


def test_health_gate_off_leaves_jobs_alone(cluster):
    devstack.write_policy(cluster.base / "policy.toml", "act")
    cluster.set_gate(False)
    health = cluster.write_health("n1", FATAL)
    try:
        job_id = cluster.submit("-N2", "--wrap=sleep 1")
        assert wait_for(lambda: cluster.finished(job_id), timeout=60) == "COMPLETED"
        job = cluster.scheduler.get_job(job_id)
        assert "n1" in job.nodes and job.restart_count == 0
        assert not cluster.scheduler.get_node("n1").drained
        (start, _end) = cluster.wait_events("n1", job_id, 2)
        assert "health_gate" not in start["payload"]
    finally:
        health.unlink()


def test_health_gate_refuses_a_node_with_a_fatal_finding(cluster):
    devstack.write_policy(cluster.base / "policy.toml", "act")
    cluster.set_gate(True)
    health = cluster.write_health("n1", FATAL)
    try:
        job_id = cluster.submit("-N2", "--wrap=sleep 1")
        node = wait_for(lambda: (n := cluster.scheduler.get_node("n1")).drained and n, timeout=30)
        assert node.reason == "Prolog error"
        refused = [e for e in cluster.node_events("n1", job_id) if e["kind"] == "job_start"]
        (event,) = refused
        assert event["payload"]["health_gate"]["refused"] is True
        assert "ecc_dbe on GPU 0" in event["payload"]["health_gate"]["reason"]

        # Slurm requeued it (not held: nohold_on_prolog_fail) with its usual begin-time delay.
        job = wait_for(
            lambda: (j := cluster.scheduler.get_job(job_id)).state == "PENDING" and j, timeout=30
        )
        assert not job.held and job.restart_count == 1
        subprocess.run(
            ["scontrol", "update", f"jobid={job_id}", "StartTime=now"],
            env=cluster.env,
            check=True,
            capture_output=True,
        )
        assert wait_for(lambda: cluster.finished(job_id), timeout=60) == "COMPLETED"
        job = cluster.scheduler.get_job(job_id)
        assert "n1" not in job.nodes and job.restart_count == 1
        for other in job.nodes:
            starts = [e for e in cluster.node_events(other, job_id) if e["kind"] == "job_start"]
            assert starts[-1]["payload"]["restart_count"] == 1
            assert "health_gate" not in starts[-1]["payload"]
    finally:
        health.unlink()
        cluster.set_gate(False)
        devstack.write_policy(cluster.base / "policy.toml", "monitor")
        cluster.scheduler.resume_node("n1")


# A stand-in for LBNL NHC, run by the prolog's health gate: on n1 a file system is missing.
NHC_FAILS_ON_N1 = """#!/bin/sh
echo "nhc on $SLURMD_NODENAME: 12 checks"
if [ "$SLURMD_NODENAME" = n1 ]; then
    echo "ERROR:  nhc:  Health check failed:  check_fs_mount:  /scratch not mounted" >&2
    exit 1
fi
"""
#: one that hangs (a stuck NFS mount, say), with a child in its process group
#: Its children sleep for times no other process on the machine uses (found by pgrep below).
NHC_HANGS = """#!/bin/sh
echo "nhc: checking /scratch"
sleep 300.0417 &
sleep 301.0417
"""


def nhc_script(cluster: HookCluster, name: str, text: str) -> Path:
    path = cluster.base / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def job_starts(cluster: HookCluster, job_id: int) -> dict[str, dict]:
    """node -> the payload of the job's first job_start event there."""
    out = {}
    for node in cluster.spec.node_names:
        starts = [e for e in cluster.node_events(node, job_id) if e["kind"] == "job_start"]
        if starts:
            out[node] = starts[0]["payload"]
    return out


def test_health_gate_runs_the_sites_nhc_and_refuses_the_node_it_fails(cluster):
    devstack.write_policy(cluster.base / "policy.toml", "act")
    cluster.set_gate(True)
    cluster.set_nhc(str(nhc_script(cluster, "nhc-fails-on-n1", NHC_FAILS_ON_N1)))
    job_id = 0
    try:
        job_id = cluster.submit(f"-N{NODES}", "--wrap=sleep 1")  # every node, n1 among them
        node = wait_for(lambda: (n := cluster.scheduler.get_node("n1")).drained and n, timeout=30)
        assert node.reason == "Prolog error"  # Slurm's drain, after the prolog's exit 1
        starts = wait_for(lambda: (s := job_starts(cluster, job_id)) and "n1" in s and s)
        gate = starts["n1"]["health_gate"]
        assert gate["refused"] is True and "/scratch not mounted" in gate["reason"]
        nhc = gate["nhc"]
        assert nhc["verdict"] == "fail" and nhc["exit_code"] == 1, nhc
        assert nhc["output"] == [
            "nhc on n1: 12 checks",
            "ERROR:  nhc:  Health check failed:  check_fs_mount:  /scratch not mounted",
        ]
        assert 0 <= nhc["duration"] < 5 and nhc["path"].endswith("nhc-fails-on-n1")
        for other, payload in starts.items():  # where it passed, the verdict is kept too
            if other != "n1":
                assert payload["health_gate"]["refused"] is False
                assert payload["health_gate"]["nhc"]["verdict"] == "pass"
    finally:
        if job_id:
            subprocess.run(["scancel", str(job_id)], env=cluster.env, capture_output=True)
        cluster.set_nhc("")
        cluster.set_gate(False)
        devstack.write_policy(cluster.base / "policy.toml", "monitor")
        cluster.scheduler.resume_node("n1")


def test_an_nhc_that_hangs_is_killed_with_its_children_and_the_job_runs(cluster):
    devstack.write_policy(cluster.base / "policy.toml", "act")
    cluster.set_gate(True)
    hangs = nhc_script(cluster, "nhc-hangs", NHC_HANGS)
    cluster.set_nhc(str(hangs), timeout="1s")
    try:
        job_id = cluster.submit("-N1", "--wrap=sleep 1")
        assert wait_for(lambda: cluster.finished(job_id), timeout=60) == "COMPLETED"
        (payload,) = job_starts(cluster, job_id).values()
        gate = payload["health_gate"]
        assert gate["refused"] is False and "failing open" in gate["reason"]
        assert gate["nhc"]["verdict"] == "timeout" and gate["nhc"]["exit_code"] is None
        assert gate["nhc"]["output"] == ["nhc: checking /scratch"]
        assert 1 <= gate["nhc"]["duration"] < 5
        assert not [n for n in cluster.scheduler.list_nodes() if n.drained]

        def gone() -> bool:  # killed at the timeout; under load they may take a moment to exit
            found = subprocess.run(["pgrep", "-f", r"sleep 30[01]\.0417"], capture_output=True)
            return found.stdout == b""

        wait_for(gone, timeout=10)  # fails the test if the check's processes outlived it
    finally:
        cluster.set_nhc("")
        cluster.set_gate(False)
        devstack.write_policy(cluster.base / "policy.toml", "monitor")


# --------------------------------------------------------------------------------- progress file

REPO = Path(__file__).resolve().parents[2]

# Each task reports 30 steps, 0.2 s apart, through the training-side API, and says where.
TASK = """
import os, time
from slurm_recovery import progress
print(os.environ["SLURMD_NODENAME"], os.environ.get("SRECOVERY_PROGRESS_FILE"),
      os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE"), flush=True)
for step in range(1, 31):
    time.sleep(0.2)
    progress.report(step, tokens=1024, loss=1.0 / step, step_time=0.1)
"""


def test_a_jobs_tasks_report_progress_through_their_nodes_files(cluster):
    """A 2-node job of an unprivileged user: the prolog makes each node's job directory for
    that user, the TaskProlog hands each task its node's progress file, the tasks write it
    with slurm_recovery.progress, both nodes' sidecars send it to the controller as
    ``progress`` evidence (origin "file"), and remove the directories when the job ends."""
    user = pwd.getpwnam("nobody")
    python = hooks.python_for_job_users(sys.executable)
    if not (hooks.runnable_by_everyone(python) and os.stat(REPO).st_mode & 0o005 == 0o005):
        pytest.skip("no Python or checkout that the job user can reach")
    out_dir = cluster.base / "out"
    out_dir.mkdir(exist_ok=True)
    out_dir.chmod(0o1777)
    script = out_dir / "train.sh"
    script.write_text(
        f"#!/bin/sh\nexport PYTHONPATH={REPO}\nsrun --ntasks-per-node=1 {python} -c '{TASK}'\n"
    )
    script.chmod(0o755)
    pid = devstack.start_controller(cluster.config, cluster.base / "controller-progress.log")
    sidecars = {
        node: devstack.start_sidecar(cluster.config, node, cluster.base / f"sidecar-{node}.log")
        for node in cluster.spec.node_names
    }
    db = cluster.base / "state.db"

    def progress(job_id: int) -> list:
        with Store.open(db, readonly=True) as store:
            found = [r.evidence for r in store.find_evidence(job_id=job_id)]
        return [e for e in found if e.kind == "progress"]

    try:
        devstack.wait_healthy(cluster.url, pid=pid)
        job_id = cluster.submit(
            "-N2",
            f"--uid={user.pw_uid}",
            f"--gid={user.pw_gid}",
            "--chdir=/tmp",
            f"--output={out_dir}/train-%j.out",
            str(script),
        )
        job = wait_for(
            lambda: (j := cluster.scheduler.get_job(job_id)).state == "RUNNING" and j, timeout=30
        )
        nodes = sorted(job.nodes)
        for node in nodes:  # while it runs: each node's directory belongs to the job user
            where = cluster.base / "jobs" / node / str(job_id)
            wait_for(lambda w=where: (w / "progress.jsonl").exists(), timeout=30)
            st = where.stat()
            assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (user.pw_uid, user.pw_gid, 0o700)
            assert (where.parent.stat().st_uid, where.parent.stat().st_mode & 0o777) == (0, 0o755)
        assert wait_for(lambda: cluster.finished(job_id), timeout=60) == "COMPLETED"

        said = (out_dir / f"train-{job_id}.out").read_text().split()
        for node in nodes:
            where = cluster.base / "jobs" / node / str(job_id)
            i = said.index(node)
            assert said[i + 1 : i + 3] == [f"{where}/progress.jsonl", f"{where}/nccl_trace_rank_"]

        def both_nodes_done() -> list:
            found = [e for e in progress(job_id) if e.payload["step"] == 30]
            return found if {e.node for e in found} == set(nodes) else []

        wait_for(both_nodes_done, timeout=15)
        evidence = progress(job_id)
        assert {e.node for e in evidence} == set(nodes)
        for e in evidence:
            assert e.source == "sidecar" and e.payload["origin"] == "file"
            assert e.payload["rank"] == nodes.index(e.node)  # one task per node, block layout
            if e.payload.get("done"):  # the end record each task writes at exit: step only
                assert e.payload["step"] == 30 and "tokens" not in e.payload
                continue
            assert e.payload["tokens"] == 1024 * e.payload["step"]
            assert e.payload["step_time"] == pytest.approx(0.1)
            assert e.payload["loss"] == pytest.approx(1.0 / e.payload["step"])
        # the sidecars removed each node's directory after the job ended
        for node in nodes:
            wait_for(lambda n=node: not (cluster.base / "jobs" / n / str(job_id)).exists(), 10)
    finally:
        for node, sidecar_pid in sidecars.items():
            localcluster.stop_process(sidecar_pid, f"--node {node}")
        localcluster.stop_process(pid, "slurm_recovery.controller")
