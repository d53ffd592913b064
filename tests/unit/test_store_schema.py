"""Schema migrations: upgrade from version 1, all-or-nothing steps, version checks."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from slurm_recovery.store import (
    LATEST_VERSION,
    MIGRATIONS,
    JobAttempt,
    Migration,
    NodeState,
    Store,
    migrate,
)
from slurm_recovery.store.audit import GENESIS_HASH, row_hash
from slurm_recovery.store.schema import APPLICATION_ID


def _raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def test_migrations_are_numbered_in_order() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, LATEST_VERSION + 1))
    assert all(m.description and m.steps for m in MIGRATIONS)


def test_upgrade_from_version_1_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    conn = _raw(path)
    assert migrate(conn, target=1) == 1
    conn.execute(
        "INSERT INTO job_histories (cluster, job_id, first_submit_time, first_seen_at) "
        "VALUES ('c1', 42, 1000, 5.0)"
    )
    conn.execute(
        "INSERT INTO job_attempts (history_id, cluster, job_id, submit_time, restart_count, "
        "first_seen_at) VALUES (1, 'c1', 42, 1000, 0, 5.0)"
    )
    conn.execute("INSERT INTO incidents (attempt_id, kind, opened_at) VALUES (1, 'crash', 6.0)")
    values = (1, 7.0, "controller", "note", "job 42", "{}", GENESIS_HASH)
    conn.execute(
        "INSERT INTO audit_log VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (*values, row_hash(*values))
    )
    assert (
        conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'nodes'").fetchone()[0] == 0
    )
    conn.close()

    with Store.open(path) as store:
        assert store.schema_version == LATEST_VERSION
        attempt = store.resolve_attempt(JobAttempt("c1", 42, 1000, 0), seen_at=50.0)
        assert attempt.id == 1 and attempt.first_seen_at == 5.0
        assert store.find_open_incident(1).kind == "crash"
        assert store.verify_audit().ok and store.verify_audit().rows_checked == 1
        store.upsert_node(NodeState("n1", updated_at=8.0))  # added by version 2
        assert store.get_node("n1") == NodeState("n1", updated_at=8.0)
    conn = _raw(path)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_failed_migration_leaves_previous_version_intact(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    broken = (
        MIGRATIONS[0],
        Migration(2, "half-good", ("CREATE TABLE new_things (x)", "CREATE TABLE oops (")),
    )
    conn = _raw(path)
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, migrations=broken)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "audit_log" in names and "new_things" not in names
    assert not conn.in_transaction
    conn.close()
    with Store.open(path) as store:  # the real list still upgrades it
        assert store.schema_version == LATEST_VERSION


def test_migrate_is_idempotent_and_checks_arguments(tmp_path: Path) -> None:
    conn = _raw(tmp_path / "state.db")
    assert migrate(conn) == LATEST_VERSION
    assert migrate(conn) == LATEST_VERSION
    with pytest.raises(ValueError, match="target"):
        migrate(conn, target=LATEST_VERSION + 1)
    with pytest.raises(ValueError, match="numbered"):
        migrate(conn, migrations=(MIGRATIONS[1],))
    conn.close()


def test_readonly_open_of_old_schema_asks_for_upgrade(tmp_path: Path) -> None:
    from slurm_recovery.store import SchemaVersionError

    path = tmp_path / "state.db"
    conn = _raw(path)
    migrate(conn, target=1)
    conn.close()
    with pytest.raises(SchemaVersionError, match="open it read-write once"):
        Store.open(path, readonly=True)
