"""``srecovery explain-log --state/--exit-code`` answers as the controller does, on every case of
the attribution corpus (tests/corpus).

Two paths, as in production: the controller's is the batch node's job-log follower reading the
case's log from a real file (``JobLogSource``: its caps on how many lines it reports included),
its findings stored as evidence in a real SQLite store, and one pass of the Reconciler over a fake
Slurm that shows the job ended; explain-log's is the CLI on the same file. The action, the
exclusions, the fault class, the implicated nodes and the cause must be the same."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.attribution import Case, load_corpus
from slurm_recovery.cli import cli
from slurm_recovery.contract.hostlist import compress
from slurm_recovery.decide.model import Mode
from slurm_recovery.decide.policy import Policy
from slurm_recovery.scheduler.base import ExitCode, Node
from slurm_recovery.sidecar.base import Finding
from slurm_recovery.sidecar.sources.joblog import JobLogSource
from slurm_recovery.signals.logs import default_catalogue
from slurm_recovery.store import Evidence
from tests.fakeslurm import FakeSlurm
from tests.unit.test_replay import NOW, job, record

CASES = load_corpus()
#: (state, exit code): a failure, a job killed by a signal, Slurm's OOM kill, a node lost,
#: and two ends that are no failure
ENDS = [("FAILED", "1"), ("FAILED", "0:9"), ("OUT_OF_MEMORY", "0:125"), ("NODE_FAIL", "0:0")]
NOT_FAILURES = [("TIMEOUT", "0:0"), ("CANCELLED", "0:15")]


def job_nodes(case: Case) -> tuple[str, ...]:
    """One node for a single-node case; else the hosts the log names (the hosts a blame names
    first), filled up to two."""
    if case.single_node:
        return ("n1",)
    catalogue = default_catalogue()
    named = [b.split(".", 1)[0] for b in case.blame]
    for match in catalogue.scan_text(case.log):
        if match.host:
            named.append(match.host.split(".", 1)[0])
    hosts = list(dict.fromkeys(named))
    for filler in ("n1", "n2"):
        if len(hosts) >= 2:
            break
        if filler not in hosts:
            hosts.append(filler)
    return tuple(hosts)


def followed(log: Path, nodes: tuple[str, ...]) -> list[Evidence]:
    """What the batch node's sidecar sends for the job's output: the follower's findings."""
    source = JobLogSource(nodes[0])
    start = {"nodes": list(nodes), "stdout": str(log), "stdout_offset": 0}
    source.see([Finding("job_start", NOW - 400, job_id=7, payload=start)])
    findings = source.poll(NOW - 30)
    source.see([Finding("job_end", NOW - 2, job_id=7, payload={})])
    findings += source.poll(NOW - 2)
    return [
        Evidence("sidecar", f.kind, f.observed_at, node=nodes[0], job_id=7, payload=f.payload)
        for f in findings
        if f.kind == "log_signature"
    ]


def controller_answer(tmp: Path, log: Path, nodes: tuple[str, ...], state: str, code) -> dict:
    ended = job(state, nodes=nodes, exit_code=code)
    spare = [f"spare{i}" for i in range(8)]
    listed = [Node(n, "IDLE", partitions=("gpu",)) for n in (*nodes, *spare)]
    policy = dataclasses.replace(Policy(), mode=Mode.MONITOR)
    tmp.mkdir()
    store, _ = record(
        tmp / "state.db", policy, ended, followed(log, nodes), FakeSlurm([ended], listed)
    )
    incidents = store.list_incidents()
    if not incidents:
        return {"action": "none"}
    (incident,) = incidents
    advice = store.latest_advice(incident.id)
    verdict = advice.verdict["verdict"]
    return {
        "action": advice.decision,
        "exclude": sorted(advice.verdict["exclude"]),
        "fault_domain": verdict["fault_class"],
        "blame_nodes": sorted(verdict["nodes"]),
        "cause": verdict["cause"],
    }


def explain_answer(log: Path, nodes: tuple[str, ...], state: str, code: str) -> dict:
    args = ["explain-log", str(log), "--state", state, "--exit-code", code, "--json"]
    result = CliRunner().invoke(cli, [*args, "--nodes", compress(list(nodes))], obj={})
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    if not out["controller"]["incident"]:
        return {"action": out["action"]}
    return {
        "action": out["action"],
        "exclude": out["controller"]["exclude"],
        "fault_domain": out["fault_domain"],
        "blame_nodes": out["blame_nodes"],
        "cause": out["controller"]["cause"],
    }


def exit_code(text: str) -> ExitCode:
    rc, _, sig = text.partition(":")
    return ExitCode(int(rc), int(sig or 0))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_explain_log_with_the_job_s_end_agrees_with_the_controller(case: Case, tmp_path: Path):
    log = tmp_path / "slurm-7.out"
    log.write_text(case.log, encoding="utf-8")
    nodes = job_nodes(case)
    for state, code in ENDS:
        want = controller_answer(tmp_path / f"{state}-{code}", log, nodes, state, exit_code(code))
        got = explain_answer(log, nodes, state, code)
        assert got == want, (state, code)
        assert want["action"] != "none" or state not in ("FAILED", "NODE_FAIL")


@pytest.mark.parametrize("state,code", NOT_FAILURES)
def test_an_end_that_is_no_failure_is_none_on_both_paths(state: str, code: str, tmp_path: Path):
    log = tmp_path / "slurm-7.out"
    log.write_text("RuntimeError: CUDA error: an illegal memory access was encountered\n")
    want = controller_answer(tmp_path / "store", log, ("n1",), state, exit_code(code))
    assert want == {"action": "none"} == explain_answer(log, ("n1",), state, code)
