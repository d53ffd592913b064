"""Slurm 25.11+'s own fast path, cooperated with: ``enable_expedited_requeue`` on, jobs
submitted ``--requeue=expedite``, the dev stack in act mode on the real cluster.

- the job's own crash, no Epilog failing: Slurm holds the job itself (REQUEUE_HOLD, restart
  count 1, "job requeued in held state"). Before, the tool opened no incident and the job
  waited for a person; now it is judged as the attempt that failed (an application bug:
  stopped with the reason, no node blamed);
- a GPU fault under a running job: running again once, without the node, restart count 1;
- a node death: Slurm holds the job once it marks the node DOWN; the tool releases it, and
  it runs again elsewhere (before, it stayed held).

Skipped below 25.11, where ``--requeue=expedite`` does not exist (CI runs these on 26.05)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ClientError, ControllerClient
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from tests.conftest import _free_port_block, wait_for

pytestmark = pytest.mark.cluster

CLI = (sys.executable, "-m", "slurm_recovery.cli")
BUG = "import sys; print('step 1', flush=True); data = {}; data['sample_7']"


@pytest.fixture(scope="module")
def stack(local_cluster):
    release = localcluster.slurm_release(local_cluster)
    if tuple(int(p) for p in release.split(".")) < (25, 11):
        pytest.skip(f"Slurm {release}: expedited requeue is 25.11+ (CI runs this on 26.05)")
    base = Path(tempfile.mkdtemp(prefix="srecovery-expedite-"))
    base.chmod(0o755)
    port = _free_port_block(7, start=local_cluster.port_base + 700)
    stack = devstack.up(
        base,
        nodes=4,
        mode="act",
        port_base=port,
        api_port=port + 6,
        slurm=os.environ.get("SRECOVERY_SLURM", "default"),
        slurm_conf_extra=["SlurmctldParameters=enable_expedited_requeue"],
    )
    try:
        yield stack
    finally:
        devstack.down(base)


@pytest.fixture
def sched(stack):
    return ScontrolScheduler(timeout=10, slurm_conf=str(stack.cluster.slurm_conf))


@pytest.fixture
def client(stack):
    return ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))


def sbatch(stack, *args: str) -> int:
    out = subprocess.run(
        ["sbatch", "--parsable", "--requeue=expedite", *args],
        env=localcluster.slurm_env(stack.cluster),
        cwd="/tmp",
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split(";")[0])


def incidents(client, job_id: int) -> list[dict]:
    try:
        return client.get(f"/v1/jobs/{job_id}")["incidents"]
    except ClientError as exc:
        if exc.status != 404:  # 404: none recorded yet
            raise
        return []


def test_slurms_hold_of_a_crashed_job_gets_an_incident_and_the_verdict(stack, sched, client):
    job_id = sbatch(stack, "-N1", f'--wrap=python3 -c "{BUG}"')
    try:
        held = wait_for(
            lambda: (j := sched.get_job(job_id)).restart_count == 1 and j.held and j, timeout=30
        )
        assert held.expedited_requeue  # Slurm held it: the case that used to go unseen
        story = wait_for(
            lambda: [i for i in incidents(client, job_id) if (i.get("advice") or {}).get("action")],
            timeout=30,
        )[0]
        advice = story["advice"]
        assert story["kind"] == "crash" and story["restart_count"] == 0, story
        assert advice["action"] == "stop", advice
        assert advice["verdict"]["fault_class"] == "application", advice
        assert not advice["verdict"].get("nodes") and not advice.get("drain"), advice
        ended = wait_for(lambda: not (j := sched.get_job(job_id)).active and j, timeout=30)
        assert ended.state == "CANCELLED" and ended.restart_count == 1, ended
        assert not [n.name for n in sched.list_nodes() if n.drained]
    finally:
        subprocess.run(["scancel", str(job_id)], env=localcluster.slurm_env(stack.cluster))


def test_a_gpu_fault_restarts_the_expedited_job_once_without_the_node(stack, sched, client):
    job_id = sbatch(stack, "-N2", "--wrap=sleep 600")
    env = {**os.environ, **stack.exports()}
    try:
        first = wait_for(lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j)
        bad = first.nodes[1]
        subprocess.run(
            [*CLI, "sim", "inject", "--node", bad, "--gpu", "1", "--xid", "79"],
            env=env,
            check=True,
            capture_output=True,
        )
        again = wait_for(
            lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j.restart_count >= 1 and j,
            timeout=30,
        )
        time.sleep(3)  # two more passes: no second restart
        again = sched.get_job(job_id)
        assert again.restart_count == 1 and bad not in again.nodes, again
        assert sched.get_node(bad).drained
    finally:
        subprocess.run(["scancel", str(job_id)], env=localcluster.slurm_env(stack.cluster))
        subprocess.run(  # leave the module's stack as found for the next test
            ["scontrol", "update", f"nodename={bad}", "state=resume"],
            env=localcluster.slurm_env(stack.cluster),
            capture_output=True,
        )


def test_a_dead_node_does_not_leave_the_expedited_job_held(stack, sched, client):
    """The node's slurmd killed: srun loses it, the batch script exits non-zero, the job sits
    COMPLETING until Slurm marks the node DOWN (SlurmdTimeout), then Slurm holds it. Before,
    it stayed held; now it runs again, on other nodes, once, seconds after the hold."""
    job_id = sbatch(stack, "-N2", "--wrap=srun sleep 600")
    env = localcluster.slurm_env(stack.cluster)
    dead = ""
    try:
        first = wait_for(lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j)
        dead = first.nodes[1]
        state = json.loads((stack.cluster.base / "cluster.json").read_text())
        os.kill(state["pids"][f"slurmd:{dead}"], signal.SIGKILL)
        held = wait_for(
            lambda: (j := sched.get_job(job_id)).restart_count == 1 and not j.nodes and j,
            timeout=120,
            interval=0.2,
        )
        held_at = time.monotonic()
        again = wait_for(lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j, timeout=30)
        assert time.monotonic() - held_at < 10, "not restarted within seconds of Slurm's hold"
        assert again.restart_count == 1 and dead not in again.nodes, (held, again)
        (story,) = incidents(client, job_id)
        assert story["kind"] == "crash" and story["restart_count"] == 0, story
        steps = client.get(f"/v1/incidents/{story['id']}")
        assert "expedited requeue" in json.dumps(steps), "the audit must say Slurm requeued it"
    finally:
        subprocess.run(["scancel", str(job_id)], env=env)
        localcluster.up(stack.cluster)  # the killed slurmd back
        subprocess.run(
            ["scontrol", "update", f"nodename={dead}", "state=resume"], env=env, capture_output=True
        )


def test_the_epilog_gate_lets_slurm_requeue_the_expedited_job_without_the_node(
    stack, sched, client
):
    """hooks.epilog_gate on: a rank dies on a node the sidecar just saw an XID on. The Epilog
    there fails, so Slurm itself requeues the expedite job at once (here 0.7 s from the crash
    to running again, against 2-4 s by the tool's own restart): without the node, restarted
    once, not twice, though the tool acts on the same XID meanwhile (its drain or Slurm's
    "Epilog error", whichever lands first, 1 run in 3 the tool's here)."""
    config = stack.base / "config.toml"
    before = config.read_text()
    # a long wait, which the healthy node's Epilog must not sit out: it passes once its sidecar
    # has read the fault sources after the job's end and found nothing
    config.write_text(before + "epilog_gate = true\nepilog_gate_wait = 10\n")  # [hooks] is last
    flag = Path(tempfile.mkdtemp(prefix="srecovery-gate-"))
    flag.chmod(0o777)
    script = f"while [ ! -e {flag}/$SLURMD_NODENAME ]; do sleep 0.05; done; exit 1"
    job_id = sbatch(stack, "-N2", f"--wrap=srun --kill-on-bad-exit=1 bash -c '{script}'")
    env = localcluster.slurm_env(stack.cluster)
    bad = ""
    try:
        first = wait_for(lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j)
        bad = first.nodes[1]
        time.sleep(1)  # the steps started
        subprocess.run(
            [*CLI, "sim", "inject", "--node", bad, "--gpu", "1", "--xid", "79"],
            env={**os.environ, **stack.exports()},
            check=True,
            capture_output=True,
        )
        (flag / bad).touch()
        crashed = time.monotonic()
        # Slurm requeues it once every Epilog is done: this is what the wait would delay
        wait_for(lambda: sched.get_job(job_id).restart_count >= 1, timeout=30, interval=0.05)
        requeued = time.monotonic() - crashed
        # then it starts at Slurm's next scheduling pass: at once, or (a step still cleaning up
        # when it was requeued, seen here under load) at the next backfill pass, up to 30 s
        again = wait_for(
            lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j.restart_count >= 1 and j,
            timeout=60,
            interval=0.05,
        )
        took = time.monotonic() - crashed
        time.sleep(3)  # more passes: no second restart
        again = sched.get_job(job_id)
        node = sched.get_node(bad)
        print(
            f"requeued {requeued:.2f} s, running again {took:.2f} s after the crash; "
            f"{bad}: {node.reason!r}"
        )
        assert again.restart_count == 1 and bad not in again.nodes, again
        assert requeued < 5, f"{requeued:.1f} s: the healthy node's Epilog sat out the 10 s wait"
        # Slurm's drain ("Epilog error") or the tool's, whichever came first: both see the XID
        assert node.drained and (node.reason == "Epilog error" or "xid 79" in node.reason), node
        # never silent: the failed attempt has its incident, whose audit says Slurm requeued it
        story = wait_for(
            lambda: [i for i in incidents(client, job_id) if i["outcome"]], timeout=20
        )[0]
        assert story["restart_count"] == 0 and story["kind"] in ("crash", "doomed"), story
        assert bad in (story["advice"] or {}).get("exclude", []), story
        if story["kind"] == "crash":  # the XID reached the tool after Slurm's requeue
            steps = client.get(f"/v1/incidents/{story['id']}")
            assert "expedited requeue" in json.dumps(steps), "the audit must say Slurm did it"
    finally:
        config.write_text(before)
        subprocess.run(["scancel", str(job_id)], env=env)
        if bad:
            subprocess.run(
                ["scontrol", "update", f"nodename={bad}", "state=resume"],
                env=env,
                capture_output=True,
            )


def test_the_shipped_job_submit_lua_marks_multi_node_jobs_expedite(local_cluster):
    """packaging/slurm/job_submit.lua (the RPM's /usr/share/slurm-recovery/job_submit.lua) on
    a real slurmctld with JobSubmitPlugins=lua: a multi-node job is submitted --requeue=expedite
    for the user; a one-node job, and a job submitted --no-requeue, are left as they came; and
    where slurmctld runs without enable_expedited_requeue (which would refuse an expedite job)
    nothing is marked and submissions go through."""
    release = localcluster.slurm_release(local_cluster)
    if tuple(int(p) for p in release.split(".")) < (25, 11):
        pytest.skip(f"Slurm {release}: expedited requeue is 25.11+ (CI runs this on 26.05)")
    base = Path(tempfile.mkdtemp(prefix="srecovery-lua-"))
    base.chmod(0o755)
    spec = localcluster.ClusterSpec(
        base=base / "cluster",
        nodes=2,
        port_base=_free_port_block(3, start=local_cluster.port_base + 800),
        name="srlua",
        slurm_prefix=local_cluster.slurm_prefix,
        extra_conf=["JobSubmitPlugins=lua"],
    )
    expedite = "SlurmctldParameters=enable_expedited_requeue"
    spec.slurm_conf.parent.mkdir(parents=True, exist_ok=True)
    shipped = Path(__file__).resolve().parents[2] / "packaging" / "slurm" / "job_submit.lua"
    shutil.copy(shipped, spec.slurm_conf.parent / "job_submit.lua")
    env = localcluster.slurm_env(spec)
    try:
        localcluster.up(spec)
        sched = ScontrolScheduler(timeout=10, slurm_conf=str(spec.slurm_conf))

        def submit(*args: str) -> int:
            out = subprocess.run(
                ["sbatch", "--parsable", "--hold", *args, "--wrap=sleep 60"],
                env=env,
                cwd="/tmp",
                capture_output=True,
                text=True,
                check=True,
            )
            return int(out.stdout.split(";")[0])

        plain = sched.get_job(submit("-N2"))  # expedited requeue off: left as it came
        assert not plain.expedited_requeue, plain
        localcluster.down(spec.base)
        spec.extra_conf.append(expedite)
        localcluster.up(spec)
        marked = sched.get_job(submit("-N2"))
        single = sched.get_job(submit("-N1"))
        refused = sched.get_job(submit("-N2", "--no-requeue"))
        assert marked.expedited_requeue, marked
        assert not single.expedited_requeue and not refused.expedited_requeue, (single, refused)
        shown = subprocess.run(
            ["scontrol", "show", "job", str(marked.job_id)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "Requeue=1" in shown, shown
    finally:
        localcluster.down(spec.base)
