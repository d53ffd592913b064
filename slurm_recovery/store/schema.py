"""The database schema as an ordered list of migrations, and the code that applies them.

The schema version is SQLite's ``PRAGMA user_version``. Each migration runs in one transaction
together with the version bump, so a failed upgrade leaves the previous version intact.
Released migrations are never edited: a change is a new migration appended to the list.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from .audit import GENESIS_HASH
from .errors import NotAStoreError, SchemaVersionError

#: ``PRAGMA application_id`` of a slurm-recovery store ("SREC").
APPLICATION_ID = 0x53524543


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    steps: tuple[str, ...]


_V1 = Migration(
    1,
    "job attempts, evidence, incidents, advice, milestones, actions, audit log",
    (
        # One submission of a job and its requeues. A reused job id starts a new history.
        """CREATE TABLE job_histories (
            id                INTEGER PRIMARY KEY,
            cluster           TEXT    NOT NULL,
            job_id            INTEGER NOT NULL,
            first_submit_time INTEGER NOT NULL,
            first_seen_at     REAL    NOT NULL
        )""",
        "CREATE INDEX job_histories_by_job ON job_histories (cluster, job_id)",
        """CREATE TABLE job_attempts (
            id            INTEGER PRIMARY KEY,
            history_id    INTEGER NOT NULL REFERENCES job_histories (id),
            cluster       TEXT    NOT NULL CHECK (cluster <> ''),
            job_id        INTEGER NOT NULL CHECK (job_id > 0),
            submit_time   INTEGER NOT NULL CHECK (submit_time >= 0),
            restart_count INTEGER NOT NULL CHECK (restart_count >= 0),
            first_seen_at REAL    NOT NULL,
            UNIQUE (cluster, job_id, submit_time, restart_count)
        )""",
        "CREATE INDEX job_attempts_by_history ON job_attempts (history_id, restart_count)",
        """CREATE TABLE evidence (
            id          INTEGER PRIMARY KEY,
            received_at REAL    NOT NULL,
            observed_at REAL    NOT NULL,
            source      TEXT    NOT NULL,
            kind        TEXT    NOT NULL,
            node        TEXT,
            gpu         INTEGER,
            attempt_id  INTEGER REFERENCES job_attempts (id),
            payload     TEXT    NOT NULL
        )""",
        """CREATE TABLE incidents (
            id         INTEGER PRIMARY KEY,
            attempt_id INTEGER NOT NULL REFERENCES job_attempts (id),
            kind       TEXT    NOT NULL,
            opened_at  REAL    NOT NULL,
            summary    TEXT    NOT NULL DEFAULT '',
            closed_at  REAL,
            outcome    TEXT,
            CHECK ((closed_at IS NULL) = (outcome IS NULL))
        )""",
        # At most one open incident per job attempt.
        """CREATE UNIQUE INDEX incidents_open_per_attempt ON incidents (attempt_id)
           WHERE closed_at IS NULL""",
        """CREATE TABLE advice (
            id          INTEGER PRIMARY KEY,
            incident_id INTEGER NOT NULL REFERENCES incidents (id),
            generation  INTEGER NOT NULL CHECK (generation >= 1),
            created_at  REAL    NOT NULL,
            decision    TEXT    NOT NULL,
            reason      TEXT    NOT NULL,
            verdict     TEXT    NOT NULL,
            UNIQUE (incident_id, generation)
        )""",
        """CREATE TABLE advice_evidence (
            advice_id   INTEGER NOT NULL REFERENCES advice (id),
            evidence_id INTEGER NOT NULL REFERENCES evidence (id),
            PRIMARY KEY (advice_id, evidence_id)
        ) WITHOUT ROWID""",
        """CREATE TABLE milestones (
            incident_id INTEGER NOT NULL REFERENCES incidents (id),
            name        TEXT    NOT NULL,
            at          REAL    NOT NULL,
            PRIMARY KEY (incident_id, name)
        ) WITHOUT ROWID""",
        """CREATE TABLE actions (
            id          INTEGER PRIMARY KEY,
            advice_id   INTEGER REFERENCES advice (id),
            step        TEXT    NOT NULL,
            target      TEXT    NOT NULL,
            params      TEXT    NOT NULL,
            result      TEXT    NOT NULL CHECK (result IN ('ok', 'failed', 'skipped')),
            message     TEXT    NOT NULL DEFAULT '',
            started_at  REAL    NOT NULL,
            finished_at REAL    NOT NULL CHECK (finished_at >= started_at)
        )""",
        "CREATE INDEX actions_by_advice ON actions (advice_id)",
        """CREATE TABLE audit_log (
            seq       INTEGER PRIMARY KEY,
            ts        REAL    NOT NULL,
            actor     TEXT    NOT NULL,
            kind      TEXT    NOT NULL,
            subject   TEXT    NOT NULL,
            payload   TEXT    NOT NULL,
            prev_hash TEXT    NOT NULL,
            hash      TEXT    NOT NULL
        )""",
        """CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
           BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END""",
        """CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
           BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END""",
        # New rows must extend the chain: next seq, linked to the current last row.
        f"""CREATE TRIGGER audit_log_extends_chain BEFORE INSERT ON audit_log
           WHEN NEW.seq IS NOT (SELECT COALESCE(MAX(seq), 0) + 1 FROM audit_log)
             OR NEW.prev_hash IS NOT COALESCE(
                  (SELECT hash FROM audit_log ORDER BY seq DESC LIMIT 1), '{GENESIS_HASH}')
           BEGIN SELECT RAISE(ABORT, 'audit_log rows must extend the chain'); END""",
    ),
)

_V2 = Migration(
    2,
    "per-node state (drains by the tool, lemon counters); evidence lookup indexes",
    (
        """CREATE TABLE nodes (
            name               TEXT    PRIMARY KEY,
            drained_by_tool    INTEGER NOT NULL DEFAULT 0 CHECK (drained_by_tool IN (0, 1)),
            drain_reason       TEXT    NOT NULL DEFAULT '',
            drained_at         REAL,
            implicated_count   INTEGER NOT NULL DEFAULT 0 CHECK (implicated_count >= 0),
            last_implicated_at REAL,
            updated_at         REAL    NOT NULL
        ) WITHOUT ROWID""",
        # Attribution looks at one node's evidence in a window around a failure, and at one
        # attempt's evidence.
        "CREATE INDEX evidence_by_node ON evidence (node, observed_at) WHERE node IS NOT NULL",
        """CREATE INDEX evidence_by_attempt ON evidence (attempt_id, observed_at)
           WHERE attempt_id IS NOT NULL""",
    ),
)

_V3 = Migration(
    3,
    "evidence names the Slurm job it is about (known at ingest, before the attempt is)",
    (
        "ALTER TABLE evidence ADD COLUMN job_id INTEGER CHECK (job_id IS NULL OR job_id > 0)",
        "CREATE INDEX evidence_by_time ON evidence (observed_at)",
        "CREATE INDEX evidence_by_job ON evidence (job_id, observed_at) WHERE job_id IS NOT NULL",
    ),
)

_V4 = Migration(
    4,
    "operators' mode overrides (srecovery mode): per partition, or the default ('')",
    (
        # The policy file stays the admin's data: an override sits on top of it until cleared.
        """CREATE TABLE mode_overrides (
            partition  TEXT    PRIMARY KEY,
            mode       TEXT    NOT NULL CHECK (mode IN ('monitor', 'act')),
            set_by     TEXT    NOT NULL CHECK (set_by <> ''),
            set_by_uid INTEGER CHECK (set_by_uid IS NULL OR set_by_uid >= 0),
            set_at     REAL    NOT NULL,
            reason     TEXT    NOT NULL DEFAULT ''
        ) WITHOUT ROWID""",
    ),
)

_V5 = Migration(
    5,
    "evidence by kind and node: a node's open GPU/IB findings (srecovery nodes)",
    (
        """CREATE INDEX evidence_by_kind_node ON evidence (kind, node, observed_at)
           WHERE node IS NOT NULL""",
    ),
)

_V6 = Migration(
    6,
    "each node's latest sidecar status, kept as state (a status is an event only when it changes)",
    (
        # One row per node, replaced in place by every report: a quiet cluster's store does
        # not grow with nodes x time. ``condition`` is what a change is judged on
        # (controller.reports.status_condition); ``payload`` is the last status in full.
        """CREATE TABLE node_reports (
            node        TEXT    PRIMARY KEY,
            heard_at    REAL    NOT NULL,
            observed_at REAL    NOT NULL,
            changed_at  REAL    NOT NULL,
            reports     INTEGER NOT NULL CHECK (reports >= 1),
            condition   TEXT    NOT NULL,
            payload     TEXT    NOT NULL
        ) WITHOUT ROWID""",
    ),
)

MIGRATIONS: tuple[Migration, ...] = (_V1, _V2, _V3, _V4, _V5, _V6)
LATEST_VERSION = MIGRATIONS[-1].version


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def check_compatible(conn: sqlite3.Connection, where: str, latest: int = LATEST_VERSION) -> int:
    """The database's schema version, after checking it is ours and not newer than ``latest``."""
    version = schema_version(conn)
    app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
    if app_id not in (0, APPLICATION_ID):
        raise NotAStoreError(f"{where}: application_id {app_id:#x} belongs to another program")
    if version == 0:
        tables = conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
        ).fetchone()[0]
        if tables:
            raise NotAStoreError(f"{where}: an SQLite database with other tables, not a store")
    elif app_id != APPLICATION_ID:
        raise NotAStoreError(f"{where}: SQLite database of another program (no application_id)")
    if version > latest:
        raise SchemaVersionError(
            f"{where}: schema version {version} is newer than this slurm-recovery knows "
            f"({latest}); upgrade slurm-recovery, or restore a backup made by this version"
        )
    return version


def migrate(
    conn: sqlite3.Connection,
    *,
    where: str = "store",
    target: int | None = None,
    migrations: Sequence[Migration] = MIGRATIONS,
) -> int:
    """Bring the database up to ``target`` (default: the latest) and return its version.

    ``conn`` must be in autocommit mode (``isolation_level=None``). Each migration runs in its
    own ``BEGIN IMMEDIATE`` transaction that re-reads the version, so two processes opening the
    same new database do not apply a step twice. ``sqlite3`` errors propagate unchanged.
    """
    if [m.version for m in migrations] != list(range(1, len(migrations) + 1)):
        raise ValueError("migrations must be numbered 1, 2, 3 ... in order")
    latest = migrations[-1].version if migrations else 0
    target = latest if target is None else target
    if not 0 <= target <= latest:
        raise ValueError(f"target must be between 0 and {latest}, got {target}")
    version = check_compatible(conn, where, latest)
    for migration in migrations:
        if migration.version <= version or migration.version > target:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = check_compatible(conn, where, latest)
            if migration.version > version:
                for step in migration.steps:
                    conn.execute(step)
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version = {migration.version}")
                version = migration.version
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return version
