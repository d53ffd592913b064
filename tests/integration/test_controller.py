"""The controller on the real local cluster: real slurmctld and slurmd, real munged, real
SQLite, the controller as its own process, evidence signed with MUNGE over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract import requests
from slurm_recovery.contract.client import ClientError, ControllerClient
from slurm_recovery.contract.wire import event_to_json
from slurm_recovery.scheduler import Job
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.store import Store
from tests.conftest import _free_port_block, wait_for, wait_passes

pytestmark = pytest.mark.cluster

FALLEN_OFF = {"xid": 79, "message": "GPU has fallen off the bus."}


@dataclass
class Stack:
    base: Path
    config: Path
    url: str
    client: ControllerClient
    pid: int = 0

    @property
    def db(self) -> Path:
        return self.base / "state.db"

    def start(self, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> None:
        self.pid = devstack.start_controller(
            self.config, self.base / "controller.log", env=env, args=args
        )
        devstack.wait_healthy(self.url, pid=self.pid)

    def stop(self) -> None:
        localcluster.stop_process(self.pid, "slurm_recovery.controller")

    def log(self) -> str:
        return (self.base / "controller.log").read_text(errors="replace")[-4000:]

    def report_xid(self, node: str, payload: dict = FALLEN_OFF, gpu: int = 1) -> float:
        at = time.time()
        self.client.post_evidence(
            [event_to_json("xid", at, node=node, gpu=gpu, payload=payload)], role="operator"
        )
        return at

    def actions(self, step: str | None = None) -> list:
        with Store.open(self.db, readonly=True) as store:
            acts = [a for i in store.list_incidents() for a in store.actions(incident_id=i.id)]
        return [a for a in acts if step is None or a.step == step]


@pytest.fixture
def scheduler(local_cluster) -> ScontrolScheduler:
    return ScontrolScheduler(timeout=10, slurm_conf=str(local_cluster.slurm_conf))


@pytest.fixture
def stacks(local_cluster, scheduler) -> Iterator[Callable[..., Stack]]:
    """Factory: a controller (own process, store, policy, port) on the session cluster."""
    made: list[Stack] = []

    def make(
        mode: str = "act",
        policy_extra: str = "",
        hold_deadline: str = "2m",
        start: bool = True,
        env: dict[str, str] | None = None,
    ) -> Stack:
        base = Path(tempfile.mkdtemp(prefix="srecovery-ctl-"))
        base.chmod(0o755)
        port = _free_port_block(1, start=local_cluster.port_base + 300 + 10 * len(made))
        devstack.write_policy(base / "policy.toml", mode, policy_extra)
        config = devstack.write_config(base, local_cluster, port, hold_deadline=hold_deadline)
        url = f"http://127.0.0.1:{port}"
        stack = Stack(
            base, config, url, ControllerClient(url, munge_socket=str(local_cluster.munge_socket))
        )
        made.append(stack)
        if start:
            stack.start(env)
        return stack

    yield make
    for stack in made:
        stack.stop()
    for node in scheduler.list_nodes():  # leave the cluster as we found it
        if node.drained:
            scheduler.resume_node(node.name)


def running(scheduler: ScontrolScheduler, job_id: int, restarts: int = 0) -> Job | None:
    job = scheduler.get_job(job_id)
    return job if job.state == "RUNNING" and job.restart_count == restarts else None


def story(stack: Stack, job_id: int) -> dict:
    return stack.client.get(f"/v1/jobs/{job_id}")


# --- (a) act mode: a fatal XID on a running job's node -------------------------------------


def test_act_fatal_xid_requeues_away_and_drains(stacks, submit, scheduler):
    stack = stacks("act")
    job_id = submit("-N2", "--wrap=sleep 600")
    first = wait_for(lambda: running(scheduler, job_id))
    bad = first.nodes[1]

    reported = stack.report_xid(bad)
    again = wait_for(lambda: running(scheduler, job_id, restarts=1), timeout=30)
    elapsed = time.time() - reported

    assert bad not in again.nodes
    assert bad in again.excluded_nodes
    node = scheduler.get_node(bad)
    assert node.drained
    assert node.reason.startswith("srecovery:")
    assert "xid 79" in node.reason.lower()
    assert "srecovery: requeued after incident" in again.admin_comment

    (incident,) = wait_for(lambda: [i for i in story_or_none(stack, job_id) if i["outcome"]])
    assert incident["outcome"].startswith("restarted on")
    advice = incident["advice"]
    assert advice["action"] == "requeue_exclude" and advice["mode"] == "act"
    assert advice["verdict"]["fault_class"] == "hardware"
    assert advice["verdict"]["nodes"] == [bad]
    assert advice["exclude"] == [bad] and advice["drain"] == [bad]
    assert [e["kind"] for e in incident["evidence"]] == ["xid"]
    for name in (
        "failure",
        "detected",
        "attributed",
        "advised",
        "held",
        "excluded",
        "released",
        "running_again",
    ):
        assert name in incident["milestones"], name
    steps = [a["step"] for a in incident["actions"] if a["result"] == "ok"]
    assert steps == ["drain", "mark", "requeue_hold", "exclude", "begin_now", "release", "unmark"]
    assert elapsed < 10, f"report -> running again took {elapsed:.1f}s"
    with urllib.request.urlopen(f"{stack.url}/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    assert 'srecovery_incidents_total{fault_class="hardware"} 1.0' in metrics
    assert "srecovery_end_to_end_seconds_count 1.0" in metrics
    assert "srecovery_nodes_drained_by_tool 1.0" in metrics
    assert "srecovery_nodes_excluded 1.0" in metrics
    assert 'srecovery_actions_total{result="ok",step="release"} 1.0' in metrics
    with urllib.request.urlopen(f"{stack.url}/healthz", timeout=5) as resp:
        health = json.loads(resp.read())
    assert health["status"] == "ok" and health["modes"]["default"] == "act"
    assert health["wal_pages"] >= 0  # the checkpointer has run (controller/checkpointer.py)
    print(f"report -> running again: {elapsed:.2f}s; {incident['milestones']}")


# --- (b) monitor mode: the same, Slurm untouched ---------------------------------------------


def test_monitor_mode_records_advice_and_touches_nothing(stacks, submit, scheduler):
    stack = stacks("monitor")
    job_id = submit("-N2", "--wrap=sleep 600")
    first = wait_for(lambda: running(scheduler, job_id))
    bad = first.nodes[0]
    stack.report_xid(bad)

    (incident,) = wait_for(lambda: [i for i in story_or_none(stack, job_id) if i["outcome"]])
    assert incident["outcome"] == (
        f"monitor: would requeue job {job_id} excluding {bad}, drain {bad}"
    )
    assert incident["advice"]["mode"] == "monitor"
    assert incident["actions"] == []
    wait_passes(stack.url, 2)  # and nothing happens later either
    job = scheduler.get_job(job_id)
    assert (job.state, job.restart_count, job.excluded_nodes, job.nodes) == (
        "RUNNING",
        0,
        frozenset(),
        first.nodes,
    )
    assert not scheduler.get_node(bad).drained
    assert stack.actions() == []


# --- (c) an application fault: stopped with a reason, no node blamed --------------------------


def test_an_application_fault_in_a_running_jobs_log_is_advice_only(stacks, submit, scheduler):
    """A log line explains a failure, it does not create one: the running job gets advice
    (application, no node), and nothing in Slurm is touched (issue 16, item 2)."""
    stack = stacks("act")
    job_id = submit("-N2", "--wrap=sleep 600")
    first = wait_for(lambda: running(scheduler, job_id))
    stack.client.post_evidence(
        [
            event_to_json(
                "log_signature",
                time.time(),
                node=first.nodes[0],
                job_id=job_id,
                payload={
                    "signature": "cuda.device_assert",
                    "fault_class": "application",
                    "blame_node": False,
                    "text": "CUDA error: device-side assert triggered",
                },
            )
        ],
        role="operator",
    )
    (incident,) = wait_for(lambda: [i for i in story_or_none(stack, job_id) if i["outcome"]])
    assert incident["advice"]["action"] == "none"
    assert incident["advice"]["rule"] == "app_fault.running"
    assert incident["advice"]["verdict"]["fault_class"] == "application"
    assert incident["advice"]["verdict"]["nodes"] == []
    assert incident["advice"]["exclude"] == [] and incident["advice"]["drain"] == []
    assert incident["outcome"] == "nothing to do"
    assert incident["actions"] == []
    wait_passes(stack.url, 2)  # more passes: still nothing
    job = scheduler.get_job(job_id)
    assert job.state == "RUNNING" and job.restart_count == 0
    assert not any(n.drained for n in scheduler.list_nodes())


def test_a_jobs_own_settings_from_its_job_start_are_honoured(stacks, submit, scheduler):
    """The SPANK options reach the controller in the job_start payload: --recovery=off leaves
    the job alone in act mode; --recovery=monitor records advice without touching Slurm."""
    stack = stacks("act")
    left_alone = submit("-N1", "--wrap=sleep 600")
    watched = submit("-N1", "--wrap=sleep 600")
    jobs = {j: wait_for(lambda j=j: running(scheduler, j)) for j in (left_alone, watched)}
    now = time.time()
    stack.client.post_evidence(
        [
            event_to_json(
                "job_start", now, node=jobs[j].nodes[0], job_id=j,
                payload={"nodes": list(jobs[j].nodes), "restart_count": 0,
                         "recovery": {"mode": mode}},
            )
            for j, mode in ((left_alone, "off"), (watched, "monitor"))
        ]
        + [
            event_to_json(
                "operator_report", now + 0.1, node=jobs[j].nodes[0], job_id=j,
                payload={"reason": "bad GPU"},
            )
            for j in (left_alone, watched)
        ],
        role="operator",
    )  # fmt: skip
    (story,) = wait_for(lambda: [i for i in story_or_none(stack, watched) if i["outcome"]])
    assert story["advice"]["mode"] == "monitor" and story["outcome"].startswith("monitor: ")
    wait_passes(stack.url, 2)  # a few controller passes
    assert story_or_none(stack, left_alone) == []  # --recovery=off: no incident at all
    for j in (left_alone, watched):
        assert scheduler.get_job(j).restart_count == 0  # Slurm untouched for both


# --- (d) killed between hold and release: released exactly once after restart ----------------


@pytest.mark.parametrize("step", ["drain", "mark", "requeue_hold", "exclude", "release"])
def test_controller_killed_after_any_step_resumes_and_does_nothing_twice(
    stacks, submit, scheduler, step
):
    stack = stacks("act", env={"SRECOVERY_FAILPOINT": f"after:{step}"})
    job_id = submit("-N2", "--wrap=sleep 600")
    first = wait_for(lambda: running(scheduler, job_id))
    bad = first.nodes[0]
    stack.report_xid(bad)
    wait_for(lambda: not localcluster.process_alive(stack.pid, "slurm_recovery.controller"))
    if step == "requeue_hold":
        held = wait_for(lambda: (j := scheduler.get_job(job_id)).state == "PENDING" and j)
        assert held.held and held.restart_count == 1
        assert "srecovery:held:" in held.admin_comment

    stack.start()  # a new controller, no failpoint
    again = wait_for(lambda: running(scheduler, job_id, restarts=1), timeout=30)
    assert bad not in again.nodes and bad in again.excluded_nodes
    assert scheduler.get_node(bad).drained
    wait_for(lambda: story(stack, job_id)["incidents"][0]["outcome"])
    ok_steps = [a.step for a in stack.actions() if a.result == "ok"]
    for once in ("drain", "mark", "requeue_hold", "exclude", "release"):
        assert ok_steps.count(once) == 1, (once, ok_steps)
    assert scheduler.get_job(job_id).restart_count == 1
    nodes = {n["name"]: n for n in stack.client.get("/v1/nodes")["nodes"]}
    assert nodes[bad]["drained_by_tool"] and nodes[bad]["drain_reason"].startswith("srecovery:")


# --- (e) controller dead with a held job: the watchdog releases it ----------------------------


def test_watchdog_releases_a_job_the_dead_controller_held(stacks, submit, scheduler):
    stack = stacks("act", hold_deadline="2s", env={"SRECOVERY_FAILPOINT": "after:requeue_hold"})
    job_id = submit("-N2", "--wrap=sleep 600")
    wait_for(lambda: running(scheduler, job_id))
    stack.report_xid(scheduler.get_job(job_id).nodes[0])
    wait_for(lambda: not localcluster.process_alive(stack.pid, "slurm_recovery.controller"))
    wait_for(lambda: (j := scheduler.get_job(job_id)).state == "PENDING" and j.held)
    time.sleep(2.5)  # past the hold deadline
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_recovery.cli",
            "--config",
            str(stack.config),
            "watchdog",
            "--once",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    wait_for(lambda: running(scheduler, job_id, restarts=1), timeout=20)
    # once the controller is back, the release is in its audit trail
    stack.start()
    audit = wait_for(
        lambda: [
            r for r in stack.client.get("/v1/audit")["audit"] if r["kind"] == "watchdog_release"
        ]
    )
    assert audit[0]["payload"]["job_id"] == job_id


# --- (f) bad credentials: rejected, nothing stored ---------------------------------------------


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(
        url + "/v1/evidence",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_forged_replayed_stale_and_wrong_node_credentials_are_rejected(stacks, local_cluster):
    stack = stacks("act")
    sock = str(local_cluster.munge_socket)
    body = json.dumps(
        {"events": [event_to_json("xid", time.time(), node="n3", gpu=0, payload=FALLEN_OFF)]}
    ).encode()

    assert _post(stack.url, body, {}) == 401
    assert _post(stack.url, body, {"Authorization": "MUNGE MUNGE:AAAAforged:"}) == 401
    good = requests.sign("POST", "/v1/evidence", body, role="operator", socket=sock)
    tampered = body.replace(b"n3", b"n4")
    assert _post(stack.url, tampered, good) == 401  # body does not match the credential
    stale = requests.sign("POST", "/v1/evidence", body, role="operator", socket=sock, ttl=1)
    time.sleep(2.1)
    assert _post(stack.url, body, stale) == 401
    wrong_node = requests.sign("POST", "/v1/evidence", body, role="sidecar", node="n2", socket=sock)
    assert _post(stack.url, body, wrong_node) == 403  # n2's sidecar reporting about n3
    claim = requests.claim("POST", "/v1/evidence", body, role="operator")
    nobody = subprocess.run(  # a credential minted by uid nobody (the munge CLI)
        ["munge", "-S", sock], input=claim, capture_output=True, user="nobody"
    )
    assert nobody.returncode == 0, nobody.stderr
    not_operator = {"Authorization": f"MUNGE {nobody.stdout.decode().strip()}"}
    assert _post(stack.url, body, not_operator) == 403  # not an operator
    with Store.open(stack.db, readonly=True) as store:
        assert store.find_evidence() == []
        assert [r.kind for r in store.audit_rows()] == ["controller_started"]

    # (``good`` was spent above: decoding a credential consumes it, whatever happens next)
    genuine = requests.sign("POST", "/v1/evidence", body, role="operator", socket=sock)
    assert _post(stack.url, body, genuine) == 202  # the genuine request, once
    assert _post(stack.url, body, genuine) == 401  # and its replay
    with Store.open(stack.db, readonly=True) as store:
        assert len(store.find_evidence()) == 1
    with pytest.raises(ClientError) as err:
        ControllerClient(stack.url, munge_socket=sock).post_evidence(
            [{"kind": "xid", "observed_at": "yesterday"}], role="operator"
        )
    assert err.value.status == 400 and "observed_at" in err.value.reason


# --- (g) the restart bound: stop, with the reason ----------------------------------------------


def test_restart_limit_stops_the_job_with_the_reason(stacks, submit, scheduler):
    stack = stacks("act", policy_extra="max_restarts = 1\n")
    job_id = submit("-N2", "--wrap=sleep 2; exit 1")
    incidents = wait_for(
        lambda: [
            i
            for i in story_or_none(stack, job_id)
            if i["outcome"] and i["outcome"].startswith("stopped")
        ],
        timeout=60,
    )
    all_incidents = story_or_none(stack, job_id)
    assert [i["restart_count"] for i in all_incidents] == [0, 1]
    assert all_incidents[0]["outcome"].startswith("restarted")
    stop = incidents[0]
    assert stop["advice"]["action"] == "stop"
    assert stop["advice"]["rule"] == "max_restarts"
    assert "restart limit" in stop["advice"]["reason"]
    job = scheduler.get_job(job_id)
    assert job.state == "FAILED" and job.restart_count == 1
    # Slurm refuses to change a finished job: the reason lives in the advice and the audit
    assert "not restarted" not in job.admin_comment
    assert [
        r["payload"]["reason"]
        for r in stack.client.get("/v1/audit")["audit"]
        if r["kind"] == "advice" and r["payload"]["action"] == "stop"
    ] == [stop["advice"]["reason"]]


def story_or_none(stack: Stack, job_id: int) -> list:
    try:
        return story(stack, job_id)["incidents"]
    except ClientError as exc:
        if exc.status == 404:
            return []
        raise


def test_cli_advice_list_and_explain(stacks, submit, scheduler):
    stack = stacks("monitor")
    job_id = submit("-N2", "--wrap=sleep 600")
    bad = wait_for(lambda: running(scheduler, job_id)).nodes[0]
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_recovery.cli",
            "--config",
            str(stack.config),
            "report",
            bad,
            "--xid",
            "79",
            "--gpu",
            "2",
            "--reason",
            "fell off the bus (dmesg)",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert report.returncode == 0, report.stderr
    assert report.stdout.startswith(f"reported xid on {bad}: evidence ")
    wait_for(lambda: [i for i in story_or_none(stack, job_id) if i["outcome"]])

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "slurm_recovery.cli", "--config", str(stack.config), *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    listed = json.loads(cli("advice", "list", "--json", "--job", str(job_id)).stdout)
    (item,) = listed["incidents"]
    assert item["advice"]["verdict"]["nodes"] == [bad]
    explained = json.loads(cli("explain", str(job_id), "--json").stdout)
    (inc,) = explained["incidents"]
    assert inc["evidence"][0]["payload"] == {"xid": 79, "message": "fell off the bus (dmesg)"}
    assert inc["evidence"][0]["gpu"] == 2 and inc["evidence"][0]["source"] == "operator"
    assert all(t.endswith("+00:00") for t in inc["milestones"].values())  # ISO-8601, UTC
    text = cli("explain", str(job_id)).stdout
    assert f"verdict  hardware nodes={bad}" in text and "advice   requeue_exclude" in text
    missing = cli("explain", "999999")
    assert missing.returncode == 1 and "404" in missing.stderr
    down = subprocess.run(
        [sys.executable, "-m", "slurm_recovery.cli", "advice", "list"],
        capture_output=True,
        text=True,
        timeout=30,
        env={
            "PATH": "/usr/bin:/bin",
            "SRECOVERY_URL": "http://127.0.0.1:9",
            "SRECOVERY_CONFIG": str(stack.config),
        },
    )
    assert down.returncode == 3 and "unreachable" in down.stderr


def test_a_no_requeue_job_is_stopped_with_the_reason_and_the_node_drained(
    stacks, submit, scheduler
):
    stack = stacks("act")
    job_id = submit("-N2", "--no-requeue", "--wrap=sleep 600")
    bad = wait_for(lambda: running(scheduler, job_id)).nodes[0]
    stack.report_xid(bad)
    job = wait_for(lambda: (j := scheduler.get_job(job_id)).state == "CANCELLED" and j)
    assert "--no-requeue" in job.admin_comment and job.restart_count == 0
    assert scheduler.get_node(bad).drained
    (incident,) = wait_for(lambda: [i for i in story_or_none(stack, job_id) if i["outcome"]])
    assert incident["advice"]["rule"] == "job.no_requeue"


def test_jobs_that_ended_before_the_first_start_are_history_not_incidents(
    stacks, submit, scheduler
):
    old = submit("-N1", "--wrap=exit 1")
    wait_for(lambda: scheduler.get_job(old).state == "FAILED")
    stack = stacks("act")  # a new deployment: a store of its own
    new = submit("-N1", "--wrap=sleep 1; exit 1")
    wait_for(lambda: story_or_none(stack, new), timeout=30)  # failing after the start: handled
    assert story_or_none(stack, old) == []
    assert scheduler.get_job(old).restart_count == 0
    stack.stop()
    stack.start()  # a restart with the same store keeps the first start as its epoch
    audit = stack.client.get("/v1/audit")["audit"]
    assert [r["kind"] for r in audit].count("controller_started") == 2
    assert story_or_none(stack, old) == []


def test_insecure_mode_is_explicit_and_loud(stacks):
    stack = stacks("monitor", start=False)
    stack.start(args=("--insecure-no-auth",))
    body = json.dumps(
        {"events": [event_to_json("xid", time.time(), node="n1", payload=FALLEN_OFF)]}
    ).encode()
    assert _post(stack.url, body, {}) == 202  # no credential needed: development only
    with urllib.request.urlopen(f"{stack.url}/healthz", timeout=5) as resp:
        assert json.loads(resp.read())["auth"] == "off (development only)"
    log = stack.log()
    assert "AUTHENTICATION IS OFF" in log and "unauthenticated request POST /v1/evidence" in log


def test_a_slurm_whose_output_it_cannot_read_leaves_everything_alone(
    stacks, submit, scheduler, tmp_path
):
    """Slurm's job listing lacks a field the parser needs (as a release it does not know
    would print): the controller stays up in monitor mode, names the field and the release in
    /healthz, `srecovery status`, its log and the audit trail, and touches nothing, even
    with a fatal XID reported on a running job's node."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scontrol", "sinfo", "scancel"):
        (bin_dir / name).symlink_to(shutil.which(name))
    drop = "import json,sys; d=json.load(sys.stdin); [j.pop('exit_code') for j in d['jobs']]"
    squeue = bin_dir / "squeue"
    squeue.write_text(
        f'#!/bin/sh\n{shutil.which("squeue")} "$@" | {sys.executable} -c "{drop}; '
        'json.dump(d, sys.stdout)"\n'
    )
    squeue.chmod(0o755)
    job_id = submit("-N2", "--wrap=sleep 600")
    first = wait_for(lambda: running(scheduler, job_id))
    stack = stacks("act", start=False)
    text = stack.config.read_text()
    stack.config.write_text(
        text.replace(
            'backend = "scontrol"\n', f'backend = "scontrol"\nslurm_bin_dir = "{bin_dir}"\n'
        )
    )
    stack.pid = devstack.start_controller(stack.config, stack.base / "controller.log")

    def health() -> dict | None:
        try:
            urllib.request.urlopen(f"{stack.url}/healthz", timeout=2)
        except urllib.error.HTTPError as exc:  # 503: degraded, with the reason
            body = json.loads(exc.read())
            return body if "monitor only" in body["last_error"] else None
        except OSError:
            return None
        return None

    body = wait_for(health, timeout=30)
    release = scheduler.version()
    assert "exit_code" in body["last_error"] and f"Slurm {release}" in body["last_error"]
    stack.report_xid(first.nodes[1])
    wait_passes(stack.url, 3)  # several passes
    assert running(scheduler, job_id) is not None  # not requeued
    assert not scheduler.get_node(first.nodes[1]).drained
    assert stack.actions() == []
    status = subprocess.run(
        [sys.executable, "-m", "slurm_recovery.cli", "--config", str(stack.config), "status"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "monitor only" in status.stdout and "exit_code" in status.stdout
    assert "CRITICAL" in stack.log() and "cannot read Slurm" in stack.log()
    with Store.open(stack.db, readonly=True) as store:
        kinds = [row.kind for row in store.audit_rows(limit=100)]
    assert kinds.count("slurm_unsupported") == 1
