"""`srecovery audit`: export lines, offline verify, the API's audit pages, and the store's
read-only queries behind audit, compare and replay."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.cli import cli
from slurm_recovery.cli.audit_cmds import export_line, row_from_line
from slurm_recovery.cli.common import parse_since
from slurm_recovery.controller.audit_api import audit_page_json, audit_row_json
from slurm_recovery.store import Evidence, JobAttempt, Store
from slurm_recovery.store.audit import verify_chain

payloads = st.dictionaries(
    st.text(max_size=5),
    st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8)),
    max_size=4,
)


@given(st.lists(st.tuples(st.floats(0, 2e9), payloads), min_size=1, max_size=6))
def test_exported_rows_hash_exactly_as_stored(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("audit") / "state.db"
    with Store.open(path) as store:
        for ts, payload in rows:
            store.append_audit("controller", "advice", "job 1", payload, ts=ts)
        stored = store.audit_rows(limit=100)
    lines = [json.loads(json.dumps(export_line(audit_row_json(r)))) for r in stored]
    assert [row_from_line(line) for line in lines] == stored
    assert verify_chain(row_from_line(line) for line in lines).ok
    assert all("details_json" not in line for line in lines)  # details spell the stored text


def test_a_row_whose_text_is_not_canonical_keeps_it(tmp_path):
    path = tmp_path / "state.db"
    with Store.open(path) as store:
        store.append_audit("controller", "advice", "job 1", {"a": 1})
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TRIGGER audit_log_no_update")
        conn.execute("UPDATE audit_log SET payload = '{\"a\": 1}' WHERE seq = 1")
        conn.execute("INSERT INTO audit_log SELECT 2, ts, actor, kind, subject, 'not json', hash, "
                     "hash FROM audit_log WHERE seq = 1")  # fmt: skip
    with Store.open(path, readonly=True) as store:
        page = audit_page_json(store)
    first, second = (export_line(r) for r in page["rows"])
    assert first["details"] == {"a": 1} and first["details_json"] == '{"a": 1}'
    assert second["details"] is None and second["details_json"] == "not json"
    result = verify_chain(row_from_line(line) for line in (first, second))
    assert (result.ok, result.first_bad_seq, result.problem.value) == (False, 1, "modified")


def store_with_rows(path: Path, count: int) -> list[dict]:
    with Store.open(path) as store:
        for n in range(count):
            store.append_audit("controller", "action", f"job {n}", {"n": n}, ts=1000.0 + n)
        page = audit_page_json(store, limit=count)
    with Store.open(path, readonly=True) as store:
        assert audit_page_json(store, last=2)["rows"][0]["seq"] == count - 1
    return [export_line(r) for r in page["rows"]]


def run_verify(path: Path, *extra: str):
    return CliRunner().invoke(cli, ["audit", "verify", "--input", str(path), *extra], obj={})


def test_verify_an_export_offline(tmp_path):
    lines = store_with_rows(tmp_path / "state.db", 6)
    export = tmp_path / "audit.jsonl"
    export.write_text("".join(json.dumps(line) + "\n" for line in lines))
    ok = run_verify(export)
    assert ok.exit_code == 0, ok.output
    assert f"6 rows verified, chain intact, last hash {lines[-1]['hash']}" in ok.output

    lines[2]["details"] = {"n": 99}  # edited
    export.write_text("".join(json.dumps(line) + "\n" for line in lines))
    broken = run_verify(export, "--json")
    assert broken.exit_code == 5
    result = json.loads(broken.output)
    assert (result["first_bad_seq"], result["problem"], result["rows_verified"]) == (
        3,
        "modified",
        2,
    )

    del lines[2]  # a row removed instead (the edited one)
    export.write_text("".join(json.dumps(line) + "\n" for line in lines))
    gone = run_verify(export)
    assert gone.exit_code == 5 and "BROKEN at seq 3: row deleted" in gone.output

    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(json.dumps(line) + "\n" for line in lines[3:]))
    refused = run_verify(partial)
    assert refused.exit_code == 2 and "only a whole export" in refused.output


def test_verify_with_an_anchor_catches_a_cut_tail(tmp_path):
    lines = store_with_rows(tmp_path / "state.db", 5)
    export = tmp_path / "audit.jsonl"
    export.write_text("".join(json.dumps(line) + "\n" for line in lines[:3]))
    assert run_verify(export).exit_code == 0  # the chain alone cannot tell
    anchor = f"{lines[4]['seq']}:{lines[4]['hash']}"
    cut = run_verify(export, "--anchor", anchor)
    assert cut.exit_code == 5 and "BROKEN at seq 4: row deleted" in cut.output
    assert run_verify(export, "--anchor", "nonsense").exit_code == 2


# --- the store's read-only queries ------------------------------------------------------------


def test_audit_pages_and_since(tmp_path):
    with Store.open(tmp_path / "state.db") as store:
        for n in range(5):
            store.append_audit("controller", "action", "x", {"n": n}, ts=float(n))
        assert [r.seq for r in store.audit_page(after_seq=1, limit=2)] == [2, 3]
        assert [r.seq for r in store.audit_page(since=3.0)] == [4, 5]
        assert [r.seq for r in store.audit_last(2)] == [4, 5]
        assert [r.seq for r in store.audit_last(50)] == [1, 2, 3, 4, 5]


def test_incident_queries(tmp_path):
    with Store.open(tmp_path / "state.db") as store:
        attempt = store.resolve_attempt(JobAttempt("c1", 7, 100, 0), seen_at=100.0)
        first = store.open_incident(attempt.id, "crash", opened_at=200.0)
        store.close_incident(first.id, outcome="restarted on n1", closed_at=300.0)
        again = store.resolve_attempt(JobAttempt("c1", 7, 400, 1), seen_at=400.0)
        second = store.open_incident(again.id, "crash", opened_at=500.0)
        assert [i.id for i in store.incidents_opened(since=150.0)] == [second.id, first.id]
        assert [i.id for i in store.incidents_opened(since=150.0, until=250.0)] == [first.id]
        assert [i.id for i in store.incidents_opened(before_id=second.id)] == [first.id]
        assert store.restarts_before(attempt.history_id, 299.0) == 0
        assert store.restarts_before(attempt.history_id, 300.0) == 1

        store.add_evidence(
            [
                Evidence("sidecar", "xid", 450.0, node="n2", payload={"xid": 79}),
                Evidence("sidecar", "progress", 450.0, job_id=7, payload={"step": 1}),
                Evidence("hook", "job_end", 460.0, job_id=7, payload={}),
                Evidence("sidecar", "xid", 450.0, node="n9", payload={"xid": 79}),
                Evidence("sidecar", "xid", 480.0, node="n2", payload={"xid": 48}),
            ],
            received_at=470.0,
        )
        store.add_evidence([Evidence("sidecar", "xid", 455.0, node="n2")], received_at=600.0)
        found = store.evidence_about_job(
            7, ["n1", "n2"], since=400.0, until=600.0, received_by=500.0, skip_kinds=["progress"]
        )
        assert [(e.evidence.kind, e.evidence.observed_at) for e in found] == [
            ("xid", 450.0),
            ("job_end", 460.0),
            ("xid", 480.0),
        ]  # not n9's, not the progress, not what arrived after 500
        assert [e.evidence.node for e in store.evidence_of_kind("xid", until=460.0)] == [
            "n2",
            "n9",
            "n2",
        ]

        store.record_action("drain", "n2", result="ok", started_at=501.0, finished_at=502.0)
        store.record_action(
            "release", "job 7", result="failed", started_at=503.0, finished_at=504.0
        )
        assert [a.step for a in store.actions_between(steps=["drain", "release"])] == ["drain"]
        assert [a.step for a in store.actions_between(result=None)] == ["drain", "release"]
        assert store.actions_between(since=503.0) == []


def test_since_reads_durations_and_dates_to_the_microsecond():
    now = 1_796_185_903.0
    assert parse_since("90s", now=now) == now - 90
    assert parse_since("2d", now=now) == now - 2 * 86400
    # a window that starts mid-second keeps what happened earlier in that second out
    # (cut to the second, `replay --since` took in the incident of the test before)
    at = 1_796_185_902.999520
    assert parse_since(datetime.fromtimestamp(at).isoformat(timespec="microseconds")) == at
    assert parse_since("2026-11-29T03:00+00:00") == 1_795_921_200.0
    with pytest.raises(ValueError, match="neither a duration"):
        parse_since("yesterday-ish")
