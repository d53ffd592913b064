"""`srecovery incidents|advice list|explain|nodes` against a live controller on a real local
cluster (`srecovery dev up --mode act`: cluster with the hooks, controller, watchdog, a sidecar
per node with simulated GPUs), with incidents really caused: a job that exits non-zero, a job
that prints a CUDA error, a training job that stops stepping, an operator's report on a running
job's node, and a simulated XID on a node that was drained and put back (the same node twice,
so its lemon score rises)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ClientError, ControllerClient
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from tests.conftest import _free_port_block, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

#: A job stepping every 0.5 s is hung a few seconds after it stops (tests/integration/
#: test_hang_end_to_end.py); jobs that report no progress are never judged hung.
HANG_POLICY = """
[hang]
floor = "3s"
ceiling = "20s"
interval_multiple = 3.0
startup_grace = "1m"
"""
TRAINING = """#!/bin/bash
for i in $(seq 1 10); do
  echo " iteration $i/ 1000 | consumed samples: $((i * 8)) | lm loss: 2.5E+00 |"
  sleep 0.5
done
echo "waiting for a peer that never comes"; sleep 600
"""
# an application error that stays the program's (an illegal memory access is restarted once
# since i28k: a bad GPU prints it too)
CUDA_ERROR = "RuntimeError: CUDA error: device-side assert triggered"


@dataclass
class World:
    stack: devstack.DevStack
    sched: ScontrolScheduler
    env: dict[str, str]
    client: ControllerClient
    jobs: dict[str, int] = field(default_factory=dict)
    bad: str = ""  # the node implicated twice
    lemon_after_first: dict[str, Any] = field(default_factory=dict)

    def srecovery(self, *args: str, env: dict[str, str] | None = None):
        return subprocess.run(
            [sys.executable, "-m", "slurm_recovery.cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **self.stack.exports(), **(env or {})},
        )

    def json(self, *args: str) -> Any:
        out = self.srecovery(*args, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def sbatch(self, *args: str) -> int:
        out = subprocess.run(
            ["sbatch", "--parsable", *args],
            env=self.env,
            cwd="/tmp",
            capture_output=True,
            text=True,
            check=True,
        )
        return int(out.stdout.split(";")[0])

    def stories(self, job_id: int) -> list[dict[str, Any]]:
        try:
            return self.client.get(f"/v1/jobs/{job_id}")["incidents"]
        except ClientError as exc:
            if exc.status == 404:
                return []
            raise

    def closed(self, job_id: int, count: int = 1) -> list[dict[str, Any]]:
        found = self.stories(job_id)
        return found if len(found) >= count and all(s["closed_at"] for s in found) else []

    def running(self, job_id: int, restarts: int = 0):
        job = self.sched.get_job(job_id)
        return job if job.state == "RUNNING" and job.restart_count == restarts else None


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[World]:
    if os.geteuid() != 0:
        pytest.fail("the integration tests start slurmd and munged: run them as root")
    base = Path(tempfile.mkdtemp(prefix="srecovery-cliread-"))
    base.chmod(0o755)
    port = _free_port_block(7)
    stack = devstack.up(
        base, nodes=4, mode="act", port_base=port, api_port=port + 6, policy_extra=HANG_POLICY
    )
    w = World(
        stack=stack,
        sched=ScontrolScheduler(timeout=10, slurm_conf=str(stack.cluster.slurm_conf)),
        env=localcluster.slurm_env(stack.cluster),
        client=ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket)),
    )
    work = tmp_path_factory.mktemp("cliread")
    work.chmod(0o755)
    try:
        _cause_incidents(w, work)
        yield w
    finally:
        if w.jobs:
            subprocess.run(["scancel", *map(str, w.jobs.values())], env=w.env)
        devstack.down(base)


def _cause_incidents(w: World, work: Path) -> None:
    # 1. three one-node jobs side by side: a crash (exit 3, --no-requeue: stopped), an
    #    application fault (a CUDA error in its output, still running: advice only, never
    #    cancelled for a log line alone), a hang (progress, then none)
    w.jobs["crash"] = w.sbatch("-N1", "--no-requeue", "--wrap=sleep 1; exit 3")
    w.jobs["app_fault"] = w.sbatch(
        "-N1", "-o", str(work / "app-%j.out"), f"--wrap=sleep 1; echo '{CUDA_ERROR}'; sleep 600"
    )
    script = work / "train.sh"
    script.write_text(TRAINING)
    w.jobs["hang"] = w.sbatch("-N1", "--no-requeue", "-o", str(work / "train-%j.out"), str(script))
    for name in ("crash", "app_fault", "hang"):
        wait_for(lambda n=name: w.closed(w.jobs[n]), timeout=90, interval=0.5)
    # the app-fault job got advice only and runs on: end it, its node is needed below
    subprocess.run(["scancel", str(w.jobs["app_fault"])], env=w.env, check=True)

    # 2. an operator's report on a node of a running 2-node job: restarted off it, drained
    w.jobs["report"] = w.sbatch("-N2", "--wrap=sleep 600")
    first = wait_for(lambda: w.running(w.jobs["report"]), timeout=30)
    w.bad = first.nodes[1]
    out = w.srecovery(
        "report", w.bad, "--reason", "fails the NCCL all-reduce test", "--job",
        str(w.jobs["report"]),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    wait_for(lambda: w.running(w.jobs["report"], restarts=1), timeout=30)
    wait_for(lambda: w.closed(w.jobs["report"]), timeout=30)
    w.lemon_after_first = w.json("nodes", w.bad)["lemon"]

    # 3. the node is put back; an exclusive job lands on it (an exclusive filler holds the
    #    only other idle node, the restarted job the other two; nodes are shared otherwise);
    #    a simulated XID 79 there: implicated again. Once
    #    the job waits to run elsewhere, the filler goes and it runs on the freed node.
    subprocess.run(
        ["scontrol", "update", f"nodename={w.bad}", "state=resume"], env=w.env, check=True
    )
    busy = set(w.sched.get_job(w.jobs["report"]).nodes)
    (free,) = {n.name for n in w.sched.list_nodes()} - busy - {w.bad}
    w.jobs["filler"] = w.sbatch("-N1", "--exclusive", "-w", free, "--wrap=sleep 600")
    wait_for(lambda: w.running(w.jobs["filler"]), timeout=30)
    w.jobs["xid"] = w.sbatch("-N1", "--exclusive", "--wrap=sleep 600")
    landed = wait_for(lambda: w.running(w.jobs["xid"]), timeout=30)
    assert list(landed.nodes) == [w.bad], landed
    out = w.srecovery("sim", "inject", "--node", w.bad, "--gpu", "1", "--xid", "79")
    assert out.returncode == 0, out.stderr
    wait_for(
        lambda: (j := w.sched.get_job(w.jobs["xid"])).restart_count == 1 and j.state == "PENDING",
        timeout=30,
    )
    subprocess.run(["scancel", str(w.jobs.pop("filler"))], env=w.env, check=True)
    wait_for(lambda: w.running(w.jobs["xid"], restarts=1), timeout=30)
    wait_for(lambda: w.closed(w.jobs["xid"]), timeout=30)


# ----------------------------------------------------------------------------- incidents


def test_incidents_are_listed_newest_first_and_filtered_by_the_controller(world):
    listed = world.json("incidents", "--since", "1h")
    by_job = {i["job_id"]: i for i in listed["incidents"]}
    assert set(world.jobs.values()) <= set(by_job)
    ids = [i["id"] for i in listed["incidents"]]
    assert ids == sorted(ids, reverse=True)
    assert listed["more"] is False and listed["count"] == len(ids)

    def jobs(*args: str) -> set[int]:
        return {i["job_id"] for i in world.json("incidents", *args)["incidents"]}

    j = world.jobs
    assert jobs("--job", str(j["crash"])) == {j["crash"]}
    assert jobs("--kind", "crash") == {j["crash"]}
    assert jobs("--kind", "hang", "--kind", "app_fault") == {j["hang"], j["app_fault"]}
    assert jobs("--class", "application") == {j["app_fault"]}
    assert jobs("--class", "hardware") == {j["report"], j["xid"]}
    assert jobs("--kind", "doomed", "--node", world.bad) == {j["report"], j["xid"]}
    assert jobs("--state", "open") == set()
    assert jobs("--state", "closed") >= set(j.values())
    assert jobs("--since", "2099-01-01") == set()
    one = world.json("incidents", "--limit", "1")
    assert one["count"] == 1 and one["more"] is True
    older = world.json("advice", "list", "--since", "1h")  # the older name: the same listing
    assert older["incidents"] == listed["incidents"]

    implicated = by_job[j["xid"]]
    assert implicated["nodes"] == [world.bad] and implicated["fault_class"] == "hardware"
    assert implicated["kind"] == "doomed" and implicated["state"] == "closed"

    table = world.srecovery("incidents")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "ID", "OPENED", "JOB", "KIND", "CLASS", "NODES", "ACTION", "MODE", "STATE/OUTCOME",
        "REASON",
    ]  # fmt: skip
    crash_row = next(x for x in lines if x.split()[2:4] == [str(j["crash"]), "crash"])
    assert "unknown" in crash_row and "stop" in crash_row and "--no-requeue" in crash_row


def test_the_api_refuses_bad_filters_with_a_clear_message(world):
    for query, words in [
        ("class=hardwar", "class='hardwar': must be one of hardware, system, application"),
        ("kind=crash,oops", "kind='crash,oops'"),
        ("limit=0", "limit=0: must be between 1 and 10000"),
        ("since=yesterday", "not a time"),
        ("state=gone", "must be open or closed"),
        ("nodes=n1", "unknown parameter nodes"),
    ]:
        with pytest.raises(ClientError) as err:
            world.client.get(f"/v1/incidents?{query}")
        assert err.value.status == 400 and words in err.value.reason, (query, err.value.reason)
    with pytest.raises(ClientError) as err:
        world.client.get("/v1/incidents/abc")
    assert err.value.status == 400
    with pytest.raises(ClientError) as err:
        world.client.get("/v1/incidents/999999")
    assert err.value.status == 404 and "no incident 999999" in err.value.reason


# ------------------------------------------------------------------------------- explain

RESTART_MILESTONES = [
    "failure",
    "detected",
    "attributed",
    "advised",
    "held",
    "excluded",
    "released",
    "running_again",
]


def _milestones(story: dict[str, Any]) -> list[str]:
    return [e["name"] for e in story["timeline"] if e["type"] == "milestone"]


def test_explain_tells_a_report_restart_with_evidence_rule_timeline_and_audit(world):
    job_id = world.jobs["report"]
    (story,) = world.json("explain", str(job_id))["incidents"]
    assert (story["kind"], story["job_id"], story["restart_count"]) == ("doomed", job_id, 0)
    assert story["outcome"].startswith("restarted on")
    (decisive,) = story["decisive_evidence"]
    assert (decisive["kind"], decisive["node"], decisive["source"]) == (
        "operator_report",
        world.bad,
        "operator",
    )
    assert decisive["basis"] == "verdict"
    assert "fails the NCCL all-reduce test" in decisive["description"]
    assert decisive["audit_seq"] is not None  # the operator's report is audited
    advice = story["advice"]
    assert advice["rule"] == "classes.hardware.action" and advice["action"] == "requeue_exclude"
    assert advice["verdict"]["nodes"] == [world.bad]

    # the timeline: in time order, the milestones in their order, offsets from the failure
    timeline = story["timeline"]
    assert [e["offset"] for e in timeline] == sorted(e["offset"] for e in timeline)
    assert _milestones(story) == RESTART_MILESTONES
    failure = next(e for e in timeline if e["name"] == "failure")
    assert failure["offset"] == 0.0
    assert timeline[-1]["type"] == "closed" and timeline[-1]["offset"] > 0
    steps = [e["name"] for e in timeline if e["type"] == "action"]
    assert steps == ["drain", "mark", "requeue_hold", "exclude", "begin_now", "release", "unmark"]
    assert any(e["type"] == "evidence" and e["name"] == "job_start" for e in timeline)

    # every advice and action links its audit row; those rows name this incident
    linked = [e["audit_seq"] for e in timeline if e["type"] in ("action", "closed")]
    linked.append(next(e["audit_seq"] for e in timeline if e["name"] == "advised"))
    assert None not in linked
    audit = {r["seq"]: r for r in world.client.get("/v1/audit?limit=10000")["audit"]}
    for seq in linked:
        assert audit[seq]["payload"]["incident"] == story["id"], audit[seq]
    assert set(linked) <= {r["seq"] for r in story["audit"]}

    text = world.srecovery("explain", str(job_id))
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert out.startswith(f"incident {story['id']}: job {job_id} attempt 0 (doomed), restarted")
    assert f"verdict  hardware nodes={world.bad} confidence=1.0" in out
    assert "advice   requeue_exclude (act mode, rule classes.hardware.action)" in out
    assert f"operator report on {world.bad}: fails the NCCL all-reduce test" in out
    assert "timeline (seconds after the failure at" in out and "+0.000s" in out
    assert f"action drain {world.bad}: ok" in out and "running again" in out
    assert f"[audit {linked[0]}]" in out
    # evidence before the story's interpretation; the timeline after the verdict
    assert out.index("evidence (what the verdict rests on)") < out.index("verdict  ")
    assert out.index("verdict  ") < out.index("timeline (")

    # the same incident by its id: i<N> or --incident N
    for args in (("explain", f"i{story['id']}"), ("explain", "--incident", str(story["id"]))):
        again = world.json(*args)
        assert again["job_id"] == job_id and [s["id"] for s in again["incidents"]] == [story["id"]]
        assert again["incidents"][0]["timeline"] == story["timeline"]


def test_explain_a_simulated_xid_names_the_gpu(world):
    (story,) = world.json("explain", str(world.jobs["xid"]))["incidents"]
    # the XID, and the node's earlier report (in the evidence window): both blame the node
    decisive = story["decisive_evidence"]
    assert {e["kind"] for e in decisive} <= {"xid", "operator_report"}, decisive
    (decisive,) = [e for e in decisive if e["kind"] == "xid"]
    assert (decisive["kind"], decisive["node"], decisive["gpu"], decisive["source"]) == (
        "xid",
        world.bad,
        1,
        "sidecar",
    )
    assert decisive["description"].startswith(f"XID 79 on {world.bad} GPU 1")
    assert "xid 79" in story["advice"]["verdict"]["cause"]
    assert _milestones(story) == RESTART_MILESTONES


def test_explain_a_crash_with_no_evidence_shows_what_opened_it_and_the_stop(world):
    job_id = world.jobs["crash"]
    (story,) = world.json("explain", str(job_id))["incidents"]
    assert story["kind"] == "crash" and story["advice"]["rule"] == "job.no_requeue"
    assert story["advice"]["verdict"]["fault_class"] == "unknown"
    assert {e["basis"] for e in story["decisive_evidence"]} == {"trigger"}
    assert {e["kind"] for e in story["decisive_evidence"]} == {"job_end"}
    assert _milestones(story) == ["failure", "detected", "attributed", "advised", "stopped"]
    out = world.srecovery("explain", str(job_id)).stdout
    assert "evidence (what opened the incident)" in out
    assert "advice   stop (act mode, rule job.no_requeue)" in out


def test_explain_an_application_fault_shows_the_log_line_and_no_step(world):
    (story,) = world.json("explain", str(world.jobs["app_fault"]))["incidents"]
    assert story["kind"] == "app_fault"
    (decisive,) = story["decisive_evidence"]
    assert decisive["kind"] == "log_signature"
    assert decisive["payload"]["signature"] == "cuda.device_assert"
    assert CUDA_ERROR in decisive["payload"]["text"]
    assert "log cuda.device_assert" in decisive["description"]
    assert [e["name"] for e in story["timeline"] if e["type"] == "action"] == []
    out = world.srecovery("explain", str(world.jobs["app_fault"])).stdout
    assert "verdict  application nodes=-" in out and "advice   none" in out
    assert CUDA_ERROR in out


def test_explain_a_hang_says_where_progress_stopped(world):
    (story,) = world.json("explain", str(world.jobs["hang"]))["incidents"]
    assert story["kind"] == "hang"
    assert "no progress for" in story["summary"] and "last step 10" in story["summary"]
    kinds = {e["kind"] for e in story["decisive_evidence"]}
    assert "progress" in kinds
    failure = next(e for e in story["timeline"] if e["name"] == "failure")
    assert "progress deadline passed" in failure["text"]
    out = world.srecovery("explain", str(world.jobs["hang"])).stdout
    assert "(hang)" in out and "reached step 10" in out


# --------------------------------------------------------------------------------- nodes


def test_nodes_join_slurm_with_drains_exclusions_and_a_rising_lemon_score(world):
    listed = world.json("nodes")
    nodes = {n["name"]: n for n in listed["nodes"]}
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    assert all(n["slurm"] is not None for n in nodes.values())
    bad = nodes[world.bad]
    assert bad["slurm"]["drained"] and bad["slurm"]["reason"].startswith("srecovery:")
    assert bad["drained_by_tool"] and bad["drain_reason"].startswith("srecovery:")  # as before
    incidents = {
        s["id"] for key in ("report", "xid") for s in world.stories(world.jobs[key])
    }  # fmt: skip
    assert bad["drain"]["in_force"] and bad["drain"]["incident"] in incidents
    assert {d["incident"] for d in bad["drains"]} == incidents
    assert set(bad["excluded_by"]) == {world.jobs["report"], world.jobs["xid"]}
    assert bad["incidents"]["count"] == 2 and set(bad["incidents"]["recent_ids"]) == incidents

    first, now = world.lemon_after_first, bad["lemon"]
    assert first["lemon"] is False and first["inputs"]["incidents"]["count"] == 1
    assert now["score"] > first["score"] and now["lemon"] is True
    assert now["inputs"]["incidents"]["count"] == 2
    assert now["inputs"]["drains"]["count"] == 2
    assert now["inputs"]["fatal_findings"]["count"] >= 2  # the report and the XID
    assert now["score"] >= now["threshold"] and listed["lemon"]["threshold"] == now["threshold"]
    for name, node in nodes.items():
        if name != world.bad:
            assert not node["lemon"]["lemon"] and node["drain"] is None

    table = world.srecovery("nodes")
    assert table.returncode == 0, table.stderr
    row = next(x for x in table.stdout.splitlines() if x.startswith(world.bad + " "))
    assert "DRAIN" in row and "LEMON" in row and "srecovery:" in row

    detail = world.srecovery("nodes", world.bad)
    assert detail.returncode == 0, detail.stderr
    text = detail.stdout
    assert text.startswith(f"* {world.bad} - ")
    assert "drained by slurm-recovery" in text and "LEMON" in text
    assert "Lemon score:" in text and "2 implicated incident(s)" in text
    assert "Recent incidents" in text and "Recent evidence" in text
    assert "fails the NCCL all-reduce test" in text and "XID 79" in text
    one = world.json("nodes", world.bad)
    assert one["name"] == world.bad and one["lemon"] == now
    assert {i["job_id"] for i in one["recent_incidents"]} >= {
        world.jobs["report"],
        world.jobs["xid"],
    }
    assert [e["observed_at"] for e in one["recent_evidence"]] == sorted(
        (e["observed_at"] for e in one["recent_evidence"]), reverse=True
    )


def test_an_open_gpu_finding_shows_until_the_gpu_is_reset(world):
    node = world.bad  # drained: nothing runs there for the fatal finding to doom
    out = world.srecovery("sim", "inject", "--node", node, "--gpu", "3", "--ecc-dbe")
    assert out.returncode == 0, out.stderr

    def findings() -> list[dict[str, Any]]:
        return world.json("nodes", node)["findings"]

    (found,) = wait_for(findings, timeout=30, interval=0.5)  # the sidecar's slow poll
    assert (found["check"], found["gpu"], found["severity"]) == ("ecc_dbe", 3, "fatal")
    row = next(x for x in world.srecovery("nodes").stdout.splitlines() if x.startswith(node + " "))
    assert "ecc_dbe gpu3 (fatal)" in row
    out = world.srecovery("sim", "inject", "--node", node, "--gpu", "3", "--clear")
    assert out.returncode == 0, out.stderr
    wait_for(lambda: not findings(), timeout=20, interval=0.5)


# ---------------------------------------------------------------------------- exit codes


def test_exit_codes_and_messages(world):
    missing = world.srecovery("explain", "999999")
    assert missing.returncode == 1
    assert "job 999999: no incidents on record" in missing.stderr and "404" in missing.stderr
    gone = world.srecovery("explain", "i999999")
    assert gone.returncode == 1 and "no incident 999999" in gone.stderr
    unknown = world.srecovery("nodes", "nosuchnode")
    assert unknown.returncode == 1 and "node nosuchnode" in unknown.stderr
    for args in (("incidents", "--class", "bogus"), ("explain", "x12"), ("explain",)):
        usage = world.srecovery(*args)
        assert usage.returncode == 2, (args, usage.stderr)
    down = {"SRECOVERY_URL": "http://127.0.0.1:9"}
    for args in (("incidents",), ("advice", "list"), ("explain", "1"), ("nodes",)):
        out = world.srecovery(*args, env=down)
        assert out.returncode == 3, (args, out.stderr)
        assert "did not answer" in out.stderr and "unreachable" in out.stderr
