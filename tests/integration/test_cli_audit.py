"""`srecovery audit tail|export|verify`, `compare` and `replay` against the real local cluster and
a live controller (one dev stack, monitor mode, for the module). Incidents are real: an
operator's report on a running job's node; operators' actions are real Slurm commands."""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ControllerClient
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.store import Store
from tests.conftest import _free_port_block, wait_for, wait_passes

pytestmark = pytest.mark.cluster

EXPORT_KEYS = {"seq", "ts", "actor", "action", "target", "details", "hash", "prev_hash"}


@pytest.fixture(scope="module")
def stack(local_cluster):
    base = Path(tempfile.mkdtemp(prefix="srecovery-audit-"))
    base.chmod(0o755)
    port = _free_port_block(7, start=local_cluster.port_base + 1300)
    # A report implicates a node for the evidence window around a failure (10 minutes before
    # by default): a narrow one keeps one test's reports out of the next test's verdicts.
    narrow = '[fatal_evidence_window]\nwindow_before = "1s"\nwindow_after = "1s"\n'
    stack = devstack.up(
        base, nodes=4, mode="monitor", port_base=port, api_port=port + 6, policy_extra=narrow
    )
    try:
        yield stack
    finally:
        devstack.down(base)


@pytest.fixture
def slurm(stack):
    """The stack's Slurm, and a cleanup: the test's jobs cancelled, its drains resumed."""
    sched = ScontrolScheduler(timeout=10, slurm_conf=str(stack.cluster.slurm_conf))
    env = localcluster.slurm_env(stack.cluster)
    jobs: list[int] = []

    class Slurm:
        scheduler = sched

        @staticmethod
        def run(*argv: str) -> str:
            out = subprocess.run(argv, env=env, capture_output=True, text=True, cwd="/tmp")
            assert out.returncode == 0, f"{argv}: {out.stderr}"
            return out.stdout

        def submit(self, *args: str) -> int:
            job_id = int(self.run("sbatch", "--parsable", *args).split(";")[0])
            jobs.append(job_id)
            return job_id

        def running(self, job_id: int):
            return wait_for(lambda: (j := sched.get_job(job_id)).state == "RUNNING" and j)

        def drain(self, node: str, reason: str) -> None:
            self.run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")

    yield Slurm()
    if jobs:
        subprocess.run(["scancel", *map(str, jobs)], env=env, capture_output=True)
    for node in sched.list_nodes():
        if node.drained:
            sched.resume_node(node.name)


def srecovery(stack, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slurm_recovery.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **stack.exports()},
        cwd="/tmp",
    )


def client(stack) -> ControllerClient:
    return ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))


def incident_of(stack, job_id: int, since: float) -> dict:
    """The incident the controller opened for ``job_id`` (waits for it)."""

    def found():
        page = client(stack).get(f"/v1/history/incidents?since={since}")
        return next((i for i in page["incidents"] if i["job_id"] == job_id), None)

    return wait_for(found, timeout=20)


def since_arg(at: float) -> str:
    """``--since`` as a local ISO time (the CLI reads dates as local time), to the microsecond:
    cut to the second, the window took in the incident the test before opened a second or two
    earlier (``replayed`` 2, not 1, in CI)."""
    return datetime.fromtimestamp(at).isoformat(timespec="microseconds")


def doomed_job(stack, slurm, reason: str) -> tuple[int, str, dict]:
    """A running 2-node job, an operator's report on its second node, the incident it opens.
    (Off n4, which the audit tests report on.)"""
    since = time.time() - 1
    job_id = slurm.submit("-N2", "--exclude=n4", "--wrap=sleep 600")
    bad = slurm.running(job_id).nodes[1]
    out = srecovery(stack, "report", bad, "--reason", reason, "--job", str(job_id))
    assert out.returncode == 0, out.stderr
    return job_id, bad, incident_of(stack, job_id, since)


# --- audit tail, export, verify ----------------------------------------------------------


def settled_reports(stack, count: int) -> list[dict]:
    """The last ``count`` operator reports, once the loop has advised on each (n4 runs no
    job, so each report gets a ``report_drain`` row: "would drain n4" in monitor mode)."""

    def rows():
        out = srecovery(stack, "audit", "tail", "-n", str(4 * count), "--json").stdout
        found = [json.loads(line) for line in out.splitlines()]
        reports = [r for r in found if r["action"] == "operator_report"][-count:]
        advised = {r["details"]["evidence"] for r in found if r["action"] == "report_drain"}
        settled = len(reports) == count and all(
            r["details"]["evidence"] in advised for r in reports
        )
        return reports if settled else None

    return wait_for(rows, timeout=20, interval=0.2)


def test_tail_export_and_verify_an_intact_chain(stack, tmp_path):
    for words in ("tail me", "and me"):
        out = srecovery(stack, "report", "n4", "--reason", words)
        assert out.returncode == 0, out.stderr
    settled_reports(stack, 2)
    tail = srecovery(stack, "audit", "tail", "-n", "4")
    assert tail.returncode == 0, tail.stderr
    header, *rows = tail.stdout.strip().splitlines()
    assert header.split()[:4] == ["SEQ", "TIME", "ACTOR", "ACTION"] and len(rows) == 4
    rows = [r for r in rows if "operator_report" in r]
    assert len(rows) == 2 and all("node n4" in r for r in rows)
    assert "tail me" in rows[0] and "and me" in rows[1]

    # enough rows that export and verify must page (1000 rows a request)
    with Store.open(stack.base / "state.db") as store, store.transaction():
        for n in range(2100):
            store.append_audit("test", "filler", f"row {n}", {"n": n})
    export = tmp_path / "audit.jsonl"
    out = srecovery(stack, "audit", "export", "--output", str(export))
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    assert len(lines) > 2100 and f"exported {len(lines)} audit rows" in out.stderr
    assert [r["seq"] for r in lines] == list(range(1, len(lines) + 1))
    assert all(set(r) >= EXPORT_KEYS for r in lines)
    assert lines[0]["prev_hash"] == "0" * 64
    assert all(b["prev_hash"] == a["hash"] for a, b in itertools.pairwise(lines))
    datetime.fromisoformat(lines[0]["ts"])

    verify = srecovery(stack, "audit", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "rows verified, chain intact, last hash" in verify.stdout
    offline = srecovery(stack, "audit", "verify", "--input", str(export), "--json")
    assert offline.returncode == 0, offline.stderr
    result = json.loads(offline.stdout)
    assert result["ok"] and result["rows_verified"] == len(lines)
    assert result["last"] == {"seq": lines[-1]["seq"], "hash": lines[-1]["hash"]}

    recent = srecovery(stack, "audit", "export", "--since", "10m")
    assert recent.returncode == 0 and len(recent.stdout.splitlines()) >= 2100

    follow = subprocess.Popen(
        [sys.executable, "-m", "slurm_recovery.cli", "audit", "tail", "-n", "1", "-f", "--json"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **stack.exports()},
    )
    try:
        first = json.loads(follow.stdout.readline())
        assert srecovery(stack, "report", "n4", "--reason", "follow me").returncode == 0
        new = json.loads(follow.stdout.readline())
        assert new["seq"] > first["seq"] and new["details"]["reason"] == "follow me"
    finally:
        follow.terminate()
        follow.wait(timeout=10)


# --- compare ------------------------------------------------------------------------------


def test_compare_scores_agreement_and_disagreement(stack, slurm):
    since = time.time()
    # agreement: the tool would take node A out; an operator drains it and requeues the job
    job_a, bad_a, _ = doomed_job(stack, slurm, "xid storm")
    slurm.drain(bad_a, "gpu dead (ticket 17)")
    slurm.run("scontrol", "requeue", str(job_a))
    # disagreement: the tool would take node B out; operators cancel the job, keep the node
    job_b = slurm.submit("-N1", "--exclude=n4", "--wrap=sleep 600")
    bad_b = slurm.running(job_b).nodes[0]
    assert (
        srecovery(stack, "report", bad_b, "--reason", "flaky", "--job", str(job_b)).returncode == 0
    )
    incident_of(stack, job_b, since)
    slurm.run("scancel", str(job_b))
    # an operator drains a node the tool never implicated
    other = next(n for n in ("n1", "n2", "n3", "n4") if n not in (bad_a, bad_b))
    slurm.drain(other, "fan noise")
    wait_passes(stack.url, 2)  # the controller observes it at its next pass

    out = srecovery(stack, "compare", "--since", since_arg(since), "--json")
    assert out.returncode == 0, out.stderr
    card = json.loads(out.stdout)
    agreement = card["agreement"]
    assert agreement["tool_implications"] == 2 and agreement["operator_drains"] == 2
    assert agreement["precision"] == 0.5 and agreement["recall"] == 0.5
    assert agreement["job_actions"] == {"agree": 1, "differ": 1, "no operator action": 0}
    assert "absent" in card["sources"]["accounting"] and card["accounting"] is False

    by_job = {a["job_id"]: a for a in card["advice"]}
    (node_a,) = by_job[job_a]["nodes"]
    assert node_a["node"] == bad_a and node_a["agrees"]
    (drain,) = node_a["operator_drains"]
    assert drain["user"] == "root" and drain["reason"] == "gpu dead (ticket 17)"
    assert set(drain["sources"]) == {"slurm", "observed"}
    assert [c["change"] for c in by_job[job_a]["operator_job_actions"]] == ["requeued"]
    (node_b,) = by_job[job_b]["nodes"]
    assert node_b["node"] == bad_b and not node_b["agrees"]
    assert by_job[job_b]["job_agreement"] == "differ"
    assert [c["change"] for c in by_job[job_b]["operator_job_actions"]] == ["cancelled"]

    differences = card["differences"]
    assert len(differences) == 2
    tool_only = next(d for d in differences if d["job_id"] == job_b)
    assert f"{bad_b} not drained by an operator" in tool_only["why"]
    assert "cancelled" in tool_only["operators_did"]
    operator_only = next(d for d in differences if d["incident"] is None)
    assert operator_only["tool_said"] == f"never implicated {other}"
    assert "fan noise" in operator_only["operators_did"]

    text = srecovery(stack, "compare", "--since", since_arg(since))
    assert text.returncode == 0, text.stderr
    assert "precision 0.50" in text.stdout and "recall    0.50" in text.stdout
    assert f"never implicated {other}" in text.stdout
    assert "accounting: absent" in text.stdout

    narrow = json.loads(
        srecovery(stack, "compare", "--since", since_arg(since), "--window", "0s", "--json").stdout
    )
    assert narrow["agreement"]["precision"] == 0.0  # the drain came seconds after the advice


def test_compare_needs_since(stack):
    out = srecovery(stack, "compare")
    assert out.returncode == 2 and "--since" in out.stderr


# --- replay -------------------------------------------------------------------------------


def test_replay_shows_what_another_policy_would_change(stack, slurm, tmp_path):
    since = time.time()
    job_id, bad, incident = doomed_job(stack, slurm, "ecc storm")
    assert incident["advice"]["action"] == "requeue_exclude"
    slurm.drain(bad, "operator drain after the advice")  # replay winds this back
    wait_passes(stack.url, 2)  # observed
    window = ["--since", since_arg(since), "--json"]

    same = srecovery(stack, "replay", "--policy", str(stack.base / "policy.toml"), *window)
    assert same.returncode == 0, same.stderr
    result = json.loads(same.stdout)
    assert (result["replayed"], result["changed"], result["unchanged"]) == (1, [], 1)
    assert result["approximate"] == 0

    policy = (stack.base / "policy.toml").read_text()
    stop = tmp_path / "stop.toml"
    stop.write_text(policy + '\n[classes.hardware]\naction = "stop"\n')
    out = srecovery(stack, "replay", "--policy", str(stop), *window)
    assert out.returncode == 0, out.stderr
    (changed,) = json.loads(out.stdout)["changed"]
    assert (changed["incident"], changed["job_id"]) == (incident["id"], job_id)
    assert changed["old"]["action"] == "requeue_exclude" and changed["new"]["action"] == "stop"
    assert changed["new"]["rule"] == "classes.hardware.action"
    assert bad in changed["new"]["drain"] and changed["effect_changed"]
    assert changed["new"]["drain"] == incident["advice"]["drain"] == changed["old"]["drain"]
    text = srecovery(stack, "replay", "--policy", str(stop), "--since", since_arg(since))
    assert "would change: 1" in text.stdout and "classes.hardware.action" in text.stdout

    act = tmp_path / "act.toml"
    act.write_text(policy.replace('mode = "monitor"', 'mode = "act"'))
    (changed,) = json.loads(srecovery(stack, "replay", "--policy", str(act), *window).stdout)[
        "changed"
    ]
    assert changed["changed"] == ["mode"] and changed["new"]["mode"] == "act"

    # read-only: nothing was stored
    with Store.open(stack.base / "state.db", readonly=True) as store:
        assert store.latest_advice(incident["id"]).decision == "requeue_exclude"
        assert len(store.advice_history(incident["id"])) == 1


def test_replay_names_the_policy_problems(stack, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('mode = "akt"\n[blast_radius]\nmax_node = 3\n')
    out = srecovery(stack, "replay", "--policy", str(bad))
    assert out.returncode == 2
    assert "not a usable policy (2 problems)" in out.stderr
    assert "mode = 'akt'" in out.stderr and "(did you mean 'blast_radius.max_nodes'?)" in out.stderr
    missing = srecovery(stack, "replay", "--policy", str(tmp_path / "none.toml"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


# --- tampering (last: it edits the live database) ---------------------------------------------


def sql(db: Path, *statements: str) -> str:
    out = subprocess.run(
        ["sqlite3", str(db), ".timeout 5000", *statements], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_verify_catches_an_edited_row_and_a_deleted_row(stack):
    db = stack.base / "state.db"
    for words in ("a first report", "the original words"):
        assert srecovery(stack, "report", "n4", "--reason", words).returncode == 0
    first, row = settled_reports(stack, 2)
    seq = row["seq"]
    assert row["details"]["reason"] == "the original words"
    original = sql(db, f"SELECT payload FROM audit_log WHERE seq = {seq};").strip()
    with sqlite3.connect(db, timeout=5) as conn:
        triggers = [
            r[0] + ";" for r in conn.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger'")
        ]
    assert len(triggers) == 3  # no update, no delete, extends the chain

    # someone with write access drops the guard and rewrites what was reported
    edited = original.replace("the original words", "nothing to see")
    sql(
        db,
        "DROP TRIGGER audit_log_no_update;",
        f"UPDATE audit_log SET payload = '{edited}' WHERE seq = {seq};",
    )
    assert srecovery(stack, "report", "n4", "--reason", "after the edit").returncode == 0
    out = srecovery(stack, "audit", "verify")
    assert out.returncode == 5, out.stdout + out.stderr
    assert f"BROKEN at seq {seq}: row modified" in out.stdout
    result = json.loads(srecovery(stack, "audit", "verify", "--json").stdout)
    assert (result["ok"], result["first_bad_seq"], result["problem"]) == (False, seq, "modified")
    assert result["rows_verified"] == seq - 1

    # put it back: intact again
    sql(db, f"UPDATE audit_log SET payload = '{original}' WHERE seq = {seq};")
    assert srecovery(stack, "audit", "verify").returncode == 0

    # a middle row deleted: the first report
    victim = first["seq"]
    with sqlite3.connect(db, timeout=5) as conn:
        saved = conn.execute("SELECT * FROM audit_log WHERE seq = ?", (victim,)).fetchone()
    assert "a first report" in saved[5]
    sql(db, "DROP TRIGGER audit_log_no_delete;", f"DELETE FROM audit_log WHERE seq = {victim};")
    out = srecovery(stack, "audit", "verify")
    assert out.returncode == 5, out.stdout + out.stderr
    assert f"BROKEN at seq {victim}: row deleted" in out.stdout
    result = json.loads(srecovery(stack, "audit", "verify", "--json").stdout)
    assert (result["first_bad_seq"], result["problem"]) == (victim, "deleted")

    # restore the row and the guards, so the stack is as it was
    with sqlite3.connect(db, timeout=5) as conn:
        conn.execute("DROP TRIGGER audit_log_extends_chain")
        conn.execute("INSERT INTO audit_log VALUES (?, ?, ?, ?, ?, ?, ?, ?)", saved)
        for statement in triggers:
            conn.execute(statement)
    assert srecovery(stack, "audit", "verify").returncode == 0
    with sqlite3.connect(db, timeout=5) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")}
    assert names == {"audit_log_no_update", "audit_log_no_delete", "audit_log_extends_chain"}
