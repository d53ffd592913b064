"""Store API: records in and out, bad input, atomic writes, and failures wrapped as StoreErrors."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from slurm_recovery.store import (
    LATEST_VERSION,
    ConflictError,
    Evidence,
    JobAttempt,
    NodeState,
    NotAStoreError,
    SchemaVersionError,
    Store,
    StoreBusyError,
    StoreCorruptError,
    StoreError,
    StoreFullError,
    StoreOpenError,
    StoreReadOnlyError,
    UnknownRecordError,
)
from slurm_recovery.store.errors import wrap_sqlite_error


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
def store(db: Path):
    with Store.open(db) as s:
        yield s


def _count(store_path: Path, table: str) -> int:
    conn = sqlite3.connect(store_path)
    try:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


def _incident(store: Store, job_id: int = 7, at: float = 100.0):
    attempt = store.resolve_attempt(JobAttempt("c1", job_id, 1000, 0), seen_at=at)
    return store.open_incident(attempt.id, "crash", opened_at=at, summary="exit 1")


# ------------------------------------------------------------------------- open / close


def test_open_creates_wal_database_at_latest_version(db: Path) -> None:
    with Store.open(db) as store:
        assert store.schema_version == LATEST_VERSION
        assert store.path == db and not store.readonly
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    with Store.open(db) as store:  # reopening an existing store
        assert store.schema_version == LATEST_VERSION


def test_closed_store_refuses_calls(db: Path) -> None:
    store = Store.open(db)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.audit_head()
    assert "closed" in repr(store)


def test_open_in_missing_directory_names_it(tmp_path: Path) -> None:
    with pytest.raises(StoreOpenError, match="does not exist"):
        Store.open(tmp_path / "nope" / "state.db")


def test_open_non_sqlite_file_is_not_a_store(db: Path) -> None:
    db.write_text("not a database at all " * 100)
    with pytest.raises(NotAStoreError):
        Store.open(db)


def test_open_other_programs_database_is_refused(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE theirs (x)")
    conn.commit()
    conn.close()
    with pytest.raises(NotAStoreError, match="other tables"):
        Store.open(db)
    assert _count(db, "theirs") == 0  # untouched


def test_open_newer_schema_is_a_clear_error(db: Path) -> None:
    Store.open(db).close()
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {LATEST_VERSION + 5}")
    conn.close()
    with pytest.raises(SchemaVersionError, match=rf"{LATEST_VERSION + 5} is newer"):
        Store.open(db)
    with pytest.raises(SchemaVersionError):
        Store.open(db, readonly=True)


def test_readonly_store_reads_but_refuses_writes(db: Path) -> None:
    with Store.open(db) as writer:
        writer.append_audit("controller", "note", "x", ts=1.0)
    with Store.open(db, readonly=True) as reader:
        assert reader.readonly
        assert [r.seq for r in reader.audit_rows()] == [1]
        with pytest.raises(StoreReadOnlyError, match="read-only"):
            reader.append_audit("controller", "note", "y", ts=2.0)
        assert reader.verify_audit().ok  # still usable after the refusal


def test_readonly_open_of_missing_file(db: Path) -> None:
    with pytest.raises(StoreOpenError, match="no such file"):
        Store.open(db, readonly=True)
    assert not db.exists()


def test_negative_busy_timeout_rejected(db: Path) -> None:
    with pytest.raises(ValueError, match="busy_timeout_s"):
        Store.open(db, busy_timeout_s=-1)


# ----------------------------------------------------------------------------- evidence


def test_evidence_round_trip_in_batch_order(store: Store) -> None:
    attempt = store.resolve_attempt(JobAttempt("c1", 42, 1000, 0), seen_at=5.0)
    batch = [
        Evidence("nvml", "xid", 10.5, node="n1", gpu=3, payload={"xid": 79, "msg": "fell off"}),
        Evidence("epilog", "job_exit", 11.0, node="n2", attempt_id=attempt.id, payload={"rc": 1}),
        Evidence("kmsg", "ib_link_down", 9.0),
    ]
    ids = store.add_evidence(batch, received_at=12.0)
    assert ids == sorted(ids) and len(ids) == 3
    records = store.evidence_by_id(reversed(ids))
    assert [r.id for r in records] == ids
    assert [r.evidence for r in records] == batch
    assert {r.received_at for r in records} == {12.0}
    assert store.evidence_by_id([]) == []


def test_find_evidence_by_node_attempt_and_window(store: Store) -> None:
    attempt = store.resolve_attempt(JobAttempt("c1", 42, 1000, 0), seen_at=5.0)
    store.add_evidence(
        [
            Evidence("nvml", "xid", 100.0, node="n1"),
            Evidence("nvml", "xid", 200.0, node="n1", attempt_id=attempt.id),
            Evidence("nvml", "xid", 300.0, node="n1"),
            Evidence("nvml", "xid", 200.0, node="n2"),
        ],
        received_at=400.0,
    )
    window = store.find_evidence(node="n1", since=150.0, until=300.0)
    assert [r.evidence.observed_at for r in window] == [200.0, 300.0]
    by_attempt = store.find_evidence(attempt_id=attempt.id)
    assert [r.evidence.node for r in by_attempt] == ["n1"]
    assert len(store.find_evidence()) == 4
    assert len(store.find_evidence(limit=2)) == 2


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"source": ""}, "Evidence.source"),
        ({"kind": 3}, "Evidence.kind"),
        ({"observed_at": float("nan")}, "Evidence.observed_at"),
        ({"observed_at": -1}, "Evidence.observed_at"),
        ({"observed_at": True}, "Evidence.observed_at"),
        ({"gpu": -1}, "Evidence.gpu"),
        ({"attempt_id": 0}, "Evidence.attempt_id"),
        ({"node": ""}, "Evidence.node"),
        ({"payload": {"x": object()}}, "Evidence.payload"),
        ({"payload": {"x": float("inf")}}, "Evidence.payload"),
        ({"payload": [1, 2]}, "Evidence.payload"),
        ({"payload": {1: "a"}}, "Evidence.payload"),
    ],
)
def test_bad_evidence_names_the_field(kwargs: dict, field: str) -> None:
    fields = {"source": "nvml", "kind": "xid", "observed_at": 1.0} | kwargs
    with pytest.raises(ValueError, match=field):
        Evidence(**fields)


def test_evidence_batch_is_all_or_nothing(store: Store, db: Path) -> None:
    good = Evidence("nvml", "xid", 1.0)
    with pytest.raises(TypeError, match=r"batch\[1\]"):
        store.add_evidence([good, {"source": "nvml"}])  # type: ignore[list-item]
    with pytest.raises(UnknownRecordError, match=r"Evidence.attempt_id: .* 99"):
        store.add_evidence([good, Evidence("nvml", "xid", 2.0, attempt_id=99)])
    assert _count(db, "evidence") == 0
    with pytest.raises(ValueError, match="received_at"):
        store.add_evidence([good], received_at=float("inf"))


# ---------------------------------------------------------------------------- incidents


def test_incident_lifecycle(store: Store) -> None:
    incident = _incident(store)
    assert incident.is_open and incident.kind == "crash" and incident.summary == "exit 1"
    assert store.get_incident(incident.id) == incident
    assert store.find_open_incident(incident.attempt_id) == incident
    with pytest.raises(ConflictError, match=f"open incident {incident.id}"):
        store.open_incident(incident.attempt_id, "hang", opened_at=101.0)
    closed = store.close_incident(incident.id, outcome="running_again", closed_at=150.0)
    assert not closed.is_open and closed.outcome == "running_again"
    assert store.get_incident(incident.id) == closed
    assert store.find_open_incident(incident.attempt_id) is None
    with pytest.raises(ConflictError, match="closed"):
        store.close_incident(incident.id, outcome="again", closed_at=160.0)
    reopened = store.open_incident(incident.attempt_id, "hang", opened_at=170.0)
    assert reopened.id != incident.id
    assert store.get_incident(9999) is None


def test_incident_bad_input(store: Store) -> None:
    attempt = store.resolve_attempt(JobAttempt("c1", 1, 1, 0), seen_at=1.0)
    with pytest.raises(ValueError, match="kind"):
        store.open_incident(attempt.id, "Crash!", opened_at=1.0)
    with pytest.raises(UnknownRecordError, match="attempt_id"):
        store.open_incident(999, "crash", opened_at=1.0)
    incident = store.open_incident(attempt.id, "crash", opened_at=10.0)
    with pytest.raises(ValueError, match="before incident"):
        store.close_incident(incident.id, outcome="x", closed_at=5.0)
    with pytest.raises(ValueError, match="outcome"):
        store.close_incident(incident.id, outcome="", closed_at=50.0)
    with pytest.raises(UnknownRecordError):
        store.close_incident(999, outcome="x", closed_at=50.0)


def test_list_incidents(store: Store) -> None:
    first = _incident(store, job_id=1)
    second = _incident(store, job_id=2)
    store.close_incident(first.id, outcome="stopped", closed_at=200.0)
    assert [i.id for i in store.list_incidents()] == [second.id, first.id]
    assert [i.id for i in store.list_incidents(open_only=True)] == [second.id]
    history = store.get_attempt(first.attempt_id).history_id
    assert [i.id for i in store.list_incidents(history_id=history)] == [first.id]


# ------------------------------------------------------------------------------- advice


def test_advice_generations_and_evidence(store: Store) -> None:
    incident = _incident(store)
    ev = store.add_evidence([Evidence("nvml", "xid", 99.0, node="n1")], received_at=99.5)
    first = store.add_advice(
        incident.id,
        decision="requeue",
        reason="XID 79 on n1",
        verdict={"class": "hardware", "nodes": ["n1"], "confidence": 0.9},
        evidence_ids=ev,
        created_at=101.0,
    )
    second = store.add_advice(
        incident.id, decision="stop", reason="crashed again", created_at=102.0
    )
    assert (first.generation, second.generation) == (1, 2)
    assert first.evidence_ids == tuple(ev) and second.evidence_ids == ()
    assert first.verdict["nodes"] == ["n1"]
    assert store.latest_advice(incident.id) == second
    assert store.advice_history(incident.id) == [first, second]
    assert store.get_advice(first.id) == first
    assert store.get_advice(999) is None
    assert store.latest_advice(999) is None
    other = _incident(store, job_id=8)
    assert store.add_advice(other.id, decision="wait", reason="r", created_at=1.0).generation == 1


def test_advice_is_all_or_nothing_and_validated(store: Store, db: Path) -> None:
    incident = _incident(store)
    with pytest.raises(UnknownRecordError, match="evidence_ids"):
        store.add_advice(incident.id, decision="requeue", reason="r", evidence_ids=[12345])
    assert _count(db, "advice") == 0
    with pytest.raises(ValueError, match="decision"):
        store.add_advice(incident.id, decision="", reason="r")
    with pytest.raises(ValueError, match="reason"):
        store.add_advice(incident.id, decision="stop", reason=" ")
    with pytest.raises(ValueError, match="verdict"):
        store.add_advice(incident.id, decision="stop", reason="r", verdict={"x": {1, 2}})
    with pytest.raises(ValueError, match="evidence_ids"):
        store.add_advice(incident.id, decision="stop", reason="r", evidence_ids="12")
    with pytest.raises(UnknownRecordError, match="incident"):
        store.add_advice(999, decision="stop", reason="r")
    store.close_incident(incident.id, outcome="done", closed_at=200.0)
    with pytest.raises(ConflictError, match="closed"):
        store.add_advice(incident.id, decision="stop", reason="r")
    assert store.add_advice(_incident(store, 9).id, decision="stop", reason="r").generation == 1


# --------------------------------------------------------------------------- milestones


def test_milestones_first_record_wins(store: Store) -> None:
    incident = _incident(store)
    assert store.add_milestone(incident.id, "failure", at=99.2) == 99.2
    assert store.add_milestone(incident.id, "detected", at=99.6) == 99.6
    assert store.add_milestone(incident.id, "detected", at=120.0) == 99.6  # repeat: kept
    store.add_milestone(incident.id, "running_again", at=103.0)
    store.add_milestone(incident.id, "custom_step", at=101.0)
    assert list(store.milestones(incident.id).items()) == [
        ("failure", 99.2),
        ("detected", 99.6),
        ("custom_step", 101.0),
        ("running_again", 103.0),
    ]
    assert store.milestones(999) == {}
    with pytest.raises(ValueError, match="name"):
        store.add_milestone(incident.id, "Running Again", at=1.0)
    with pytest.raises(UnknownRecordError):
        store.add_milestone(999, "failure", at=1.0)


# ------------------------------------------------------------------------------ actions


def test_actions_recorded_per_advice_and_incident(store: Store) -> None:
    incident = _incident(store)
    first = store.add_advice(incident.id, decision="requeue", reason="r", created_at=101.0)
    second = store.add_advice(incident.id, decision="requeue", reason="r2", created_at=105.0)
    a1 = store.record_action(
        "requeue_hold",
        "job 7",
        result="ok",
        started_at=101.1,
        finished_at=101.2,
        advice_id=first.id,
        params={"exclude": ["n1"]},
    )
    a2 = store.record_action(
        "release",
        "job 7",
        result="failed",
        started_at=106.0,
        finished_at=106.5,
        advice_id=second.id,
        message="Invalid job id specified",
    )
    a3 = store.record_action("drain", "n1", result="skipped", started_at=107.0, finished_at=107.0)
    assert a1.params == {"exclude": ["n1"]} and a2.message == "Invalid job id specified"
    assert store.actions(advice_id=first.id) == [a1]
    assert store.actions(incident_id=incident.id) == [a1, a2]
    assert store.actions() == [a1, a2, a3]


def test_action_bad_input(store: Store) -> None:
    with pytest.raises(ValueError, match="result must be one of"):
        store.record_action("drain", "n1", result="done", started_at=1.0, finished_at=2.0)
    with pytest.raises(ValueError, match="before started_at"):
        store.record_action("drain", "n1", result="ok", started_at=5.0, finished_at=2.0)
    with pytest.raises(ValueError, match="target"):
        store.record_action("drain", "", result="ok", started_at=1.0, finished_at=2.0)
    with pytest.raises(UnknownRecordError, match="advice_id"):
        store.record_action(
            "drain", "n1", result="ok", started_at=1.0, finished_at=2.0, advice_id=77
        )
    assert store.actions() == []


# -------------------------------------------------------------------------------- nodes


def test_nodes_upsert_get_list(store: Store) -> None:
    n1 = NodeState("n1", updated_at=10.0, implicated_count=1, last_implicated_at=9.0)
    store.upsert_node(n1)
    assert store.get_node("n1") == n1
    drained = NodeState(
        "n1",
        updated_at=20.0,
        drained_by_tool=True,
        drain_reason="srecovery: XID 79 (incident 3)",
        drained_at=20.0,
        implicated_count=2,
        last_implicated_at=19.0,
    )
    store.upsert_node(drained)
    store.upsert_node(NodeState("n0", updated_at=5.0))
    assert store.get_node("n1") == drained
    assert store.get_node("nx") is None
    assert [n.name for n in store.list_nodes()] == ["n0", "n1"]
    assert store.list_nodes(drained_by_tool=True) == [drained]
    assert [n.name for n in store.list_nodes(drained_by_tool=False)] == ["n0"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": ""}, "NodeState.name"),
        ({"updated_at": "now"}, "NodeState.updated_at"),
        ({"drained_by_tool": 1}, "NodeState.drained_by_tool"),
        ({"drained_by_tool": True}, "NodeState.drain_reason"),
        ({"implicated_count": -1}, "NodeState.implicated_count"),
        ({"last_implicated_at": float("nan")}, "NodeState.last_implicated_at"),
    ],
)
def test_bad_node_state_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        NodeState(**({"name": "n1", "updated_at": 1.0} | kwargs))


def test_upsert_node_type_checked(store: Store) -> None:
    with pytest.raises(TypeError, match="NodeState"):
        store.upsert_node({"name": "n1"})  # type: ignore[arg-type]


# ------------------------------------------------------------------------- transactions


def test_transaction_commits_together_or_not_at_all(store: Store, db: Path) -> None:
    incident = _incident(store)
    with pytest.raises(RuntimeError, match="boom"), store.transaction():
        store.add_advice(incident.id, decision="requeue", reason="r", created_at=101.0)
        store.append_audit("controller", "advice", "job 7", {"generation": 1}, ts=101.0)
        raise RuntimeError("boom")
    assert _count(db, "advice") == 0 and _count(db, "audit_log") == 0
    with store.transaction():
        advice = store.add_advice(incident.id, decision="requeue", reason="r", created_at=101.0)
        store.append_audit("controller", "advice", "job 7", {"advice": advice.id}, ts=101.0)
    assert _count(db, "advice") == 1 and _count(db, "audit_log") == 1
    assert store.verify_audit().ok


def test_failed_call_inside_transaction_undoes_only_itself(store: Store, db: Path) -> None:
    incident = _incident(store)
    with store.transaction():
        store.append_audit("controller", "note", "before", ts=1.0)
        with pytest.raises(UnknownRecordError):
            store.add_advice(incident.id, decision="stop", reason="r", evidence_ids=[404])
        store.append_audit("controller", "note", "after", ts=2.0)
    assert [r.subject for r in store.audit_rows()] == ["before", "after"]
    assert store.latest_advice(incident.id) is None


def test_full_disk_is_a_store_error_and_writes_nothing(store: Store, db: Path) -> None:
    store.append_audit("controller", "note", "fits", ts=1.0)
    conn = store._conn  # the store's own connection: cap the file at its current size
    assert conn is not None
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    big = [Evidence("nvml", "xid", 1.0, payload={"blob": "x" * 4000}) for _ in range(50)]
    with pytest.raises(StoreFullError, match="full"):
        store.add_evidence(big, received_at=2.0)
    with pytest.raises(StoreFullError), store.transaction():
        store.append_audit("controller", "note", "x" * 50_000, ts=2.0)
    assert _count(db, "evidence") == 0
    conn.execute("PRAGMA max_page_count = 1073741823")
    assert store.add_evidence(big[:1], received_at=3.0) == [1]
    assert [r.seq for r in store.audit_rows()] == [1] and store.verify_audit().ok


def test_write_lock_held_elsewhere_is_busy_error(db: Path) -> None:
    with Store.open(db, busy_timeout_s=0.1) as store:
        store.append_audit("controller", "note", "one", ts=1.0)
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(StoreBusyError, match="locked"):
            store.append_audit("controller", "note", "two", ts=2.0)
        assert time.monotonic() - started < 5
        assert [r.seq for r in store.audit_rows()] == [1]  # WAL: reads go on meanwhile
        other.execute("ROLLBACK")
        other.close()
        assert store.append_audit("controller", "note", "two", ts=2.0).seq == 2


def test_missing_timestamps_default_to_now(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: 1234.5)
    attempt = store.resolve_attempt(JobAttempt("c1", 3, 1, 0))
    incident = store.open_incident(attempt.id, "hang")
    assert attempt.first_seen_at == 1234.5 and incident.opened_at == 1234.5
    assert store.append_audit("controller", "note", "x").ts == 1234.5
    assert store.add_milestone(incident.id, "detected") == 1234.5


@pytest.mark.parametrize(
    ("errorname", "expected"),
    [
        ("SQLITE_FULL", StoreFullError),
        ("SQLITE_READONLY", StoreReadOnlyError),
        ("SQLITE_READONLY_DBMOVED", StoreReadOnlyError),
        ("SQLITE_BUSY", StoreBusyError),
        ("SQLITE_LOCKED", StoreBusyError),
        ("SQLITE_NOTADB", NotAStoreError),
        ("SQLITE_CORRUPT", StoreCorruptError),
        ("SQLITE_CANTOPEN", StoreOpenError),
        ("SQLITE_IOERR_WRITE", StoreError),
    ],
)
def test_sqlite_errors_map_to_store_errors(errorname: str, expected: type) -> None:
    exc = sqlite3.OperationalError("low-level message")
    exc.sqlite_errorname = errorname
    wrapped = wrap_sqlite_error(exc, "/var/lib/slurm-recovery/state.db")
    assert type(wrapped) is expected
    assert "/var/lib/slurm-recovery/state.db" in str(wrapped)
    assert "low-level message" in str(wrapped)


def test_evidence_names_its_job_before_the_attempt_is_known(store: Store) -> None:
    """Ingest knows the Slurm job id an event is about, not yet its attempt (migration 3)."""
    ids = store.add_evidence(
        [
            Evidence("hook", "job_end", 10.0, node="n1", job_id=42, payload={"exit_code": 3}),
            Evidence("sidecar", "xid", 11.0, node="n1", payload={"xid": 79}),
            Evidence("hook", "job_start", 12.0, node="n2", job_id=43),
        ]
    )
    found = store.find_evidence(job_id=42)
    assert [r.id for r in found] == [ids[0]]
    assert found[0].evidence.job_id == 42 and found[0].evidence.payload == {"exit_code": 3}
    assert [r.evidence.job_id for r in store.evidence_by_id(ids)] == [42, None, 43]
    with pytest.raises(ValueError, match=r"Evidence\.job_id"):
        Evidence("hook", "job_end", 1.0, job_id=0)
