"""The :class:`Store`: the controller's SQLite database of job attempts, evidence, incidents,
advice, milestones, actions, node state and the hash-chained audit log.

One writer process (the controller) and any number of readers (``srecovery``, other
processes): WAL mode, a busy timeout, and one transaction per call, so a failed write leaves
nothing behind. Timestamps are float epoch seconds given by the caller; only a missing one is
read from the clock.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .attempts import AttemptRelation, JobAttempt, relate
from .audit import (
    GENESIS_HASH,
    AuditAnchor,
    AuditRow,
    AuditVerification,
    row_hash,
    verify_chain,
)
from .errors import (
    ConflictError,
    SchemaVersionError,
    StoreError,
    StoreOpenError,
    UnknownRecordError,
    wrap_sqlite_error,
)
from .records import (
    ACTION_RESULTS,
    Action,
    Advice,
    AttemptRecord,
    Evidence,
    EvidenceRecord,
    Incident,
    ModeOverride,
    NodeReport,
    NodeState,
)
from .schema import LATEST_VERSION, check_compatible, migrate, schema_version
from .values import (
    check_id,
    check_int,
    check_name,
    check_payload,
    check_text,
    check_time,
)

#: Where the controller keeps its store unless configured otherwise.
DEFAULT_PATH = Path("/var/lib/slurm-recovery/state.db")
#: The size the write-ahead log file is cut back to when SQLite starts writing it from the
#: beginning again (after a complete checkpoint). Without it the file keeps its high-water
#: mark for good: 172 MB at 10,000 nodes, whose reports are written 47 MB of WAL at a time
#: (docs/store.md, "Checkpoints").
WAL_SIZE_LIMIT = 16 * 1024 * 1024

_ATTEMPT_COLS = "id, history_id, cluster, job_id, submit_time, restart_count, first_seen_at"
_EVIDENCE_COLS = (
    "id, received_at, source, kind, observed_at, node, gpu, attempt_id, payload, job_id"
)
_INCIDENT_COLS = "id, attempt_id, kind, opened_at, summary, closed_at, outcome"
_ADVICE_COLS = "id, incident_id, generation, created_at, decision, reason, verdict"
_ACTION_COLS = "id, advice_id, step, target, result, started_at, finished_at, params, message"
_NODE_COLS = (
    "name, updated_at, drained_by_tool, drain_reason, drained_at, implicated_count, "
    "last_implicated_at"
)
_AUDIT_COLS = "seq, ts, actor, kind, subject, payload, prev_hash, hash"
_OVERRIDE_COLS = "partition, mode, set_by, set_by_uid, set_at, reason"


def _now(value: float | None, field: str) -> float:
    return check_time(time.time() if value is None else value, field)


#: The order a recovery passes its milestones in (ties in time are broken by it).
MILESTONE_ORDER = (
    "failure",
    "detected",
    "attributed",
    "advised",
    "held",
    "excluded",
    "released",
    "running_again",
    "stopped",
)


#: Evidence kinds that matter only while fresh (heartbeats, telemetry, progress): what
#: retention removes once older than ``store.retention``, unless an advice rests on a row.
ROUTINE_EVIDENCE = ("sidecar_status", "gpu_activity", "gpu_inventory", "progress")


@dataclass(frozen=True)
class WalCheckpoint:
    """One checkpoint: pages in the WAL, how many of them are now in the database file, and
    whether another checkpoint was running (then nothing was copied)."""

    busy: bool
    wal_pages: int
    copied: int


class Store:
    """Open with :meth:`Store.open`; use as a context manager or call :meth:`close`.

    A ``Store`` belongs to the thread that opened it; other threads and processes open their
    own. Writes made inside ``with store.transaction():`` commit together or not at all.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path, *, readonly: bool) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._path = path
        self._readonly = readonly
        self._depth = 0

    # ----------------------------------------------------------------- lifecycle

    @classmethod
    def open(
        cls,
        path: str | Path = DEFAULT_PATH,
        *,
        readonly: bool = False,
        busy_timeout_s: float = 5.0,
        auto_checkpoint: bool = True,
    ) -> Store:
        """Open (creating and upgrading if needed) the store at ``path``.

        ``readonly=True`` opens an existing store for reading only (``srecovery`` does this
        while the controller writes); it never creates or upgrades the schema.

        ``auto_checkpoint=False``: this connection's commits never copy the WAL back into the
        database file. SQLite otherwise makes the commit that fills the WAL past 1,000 pages
        do it, with an fsync of the database, and every request waiting on that commit waits
        for it (11 to 15 ms on an idle disk here, longer under load). Whoever opens a store so
        runs :meth:`checkpoint` from another thread (the controller:
        ``controller/checkpointer.py``).
        """
        path = Path(path)
        where = f"store {path}"
        if busy_timeout_s < 0:
            raise ValueError(f"busy_timeout_s must be >= 0, got {busy_timeout_s}")
        if readonly and not path.is_file():
            raise StoreOpenError(f"{where}: no such file")
        if not readonly and not path.parent.is_dir():
            raise StoreOpenError(f"{where}: directory {path.parent} does not exist")
        target = f"{path.absolute().as_uri()}?mode=ro" if readonly else str(path)
        try:
            conn = sqlite3.connect(
                target, uri=readonly, isolation_level=None, timeout=busy_timeout_s
            )
        except sqlite3.Error as exc:
            raise wrap_sqlite_error(exc, path) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            if readonly:
                version = check_compatible(conn, where)
                if version < LATEST_VERSION:
                    raise SchemaVersionError(
                        f"{where}: schema version {version} is older than {LATEST_VERSION}; "
                        "open it read-write once (the controller does on start) to upgrade"
                    )
            else:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise StoreOpenError(
                        f"{where}: SQLite cannot use WAL mode here (got {mode!r}); put the store "
                        "on a local filesystem"
                    )
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
                if not auto_checkpoint:
                    conn.execute("PRAGMA wal_autocheckpoint = 0")
                migrate(conn, where=where)
        except sqlite3.Error as exc:
            conn.close()
            raise wrap_sqlite_error(exc, path) from exc
        except BaseException:
            conn.close()
            raise
        return cls(conn, path, readonly=readonly)

    def close(self) -> None:
        """Close the connection (idempotent). The last one closed checkpoints the WAL."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._conn is None else ("read-only" if self._readonly else "open")
        return f"Store({str(self._path)!r}, {state})"

    @property
    def path(self) -> Path:
        return self._path

    @property
    def readonly(self) -> bool:
        return self._readonly

    @property
    def schema_version(self) -> int:
        with self._tx(write=False) as conn:
            return schema_version(conn)

    def checkpoint(self) -> WalCheckpoint:
        """Copy what the WAL holds into the database file, as far as readers allow, without
        waiting for any reader or writer (SQLite's PASSIVE checkpoint)."""
        conn = self._conn
        if conn is None:
            raise StoreError(f"store {self._path}: closed")
        try:
            busy, pages, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            raise wrap_sqlite_error(exc, self._path) from exc
        return WalCheckpoint(busy=bool(busy), wal_pages=max(0, pages), copied=max(0, copied))

    # -------------------------------------------------------------- transactions

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group several writes: all of them commit together (durably), or none does."""
        with self._tx(write=True):
            yield

    @contextmanager
    def _tx(self, *, write: bool, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction (a savepoint when nested); ``sqlite3`` errors become StoreErrors.

        Durable writes commit with ``synchronous=FULL`` (on disk when the call returns); others
        with ``NORMAL``, which on power loss may lose the last commits but never corrupts, and
        which any later durable commit makes durable too (the WAL is written in order).
        """
        conn = self._conn
        if conn is None:
            raise StoreError(f"store {self._path}: closed")
        nested = self._depth > 0
        if nested and not conn.in_transaction:
            raise StoreError(
                f"store {self._path}: the enclosing transaction was rolled back after an error"
            )
        savepoint = f"sp{self._depth}"
        try:
            if nested:
                conn.execute(f"SAVEPOINT {savepoint}")
            elif write:
                conn.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
                conn.execute("BEGIN IMMEDIATE")
            else:
                conn.execute("BEGIN")
        except sqlite3.Error as exc:
            raise wrap_sqlite_error(exc, self._path) from exc
        self._depth += 1
        try:
            yield conn
        except BaseException as exc:
            self._depth -= 1
            self._undo(conn, nested, savepoint)
            if isinstance(exc, sqlite3.Error):
                raise wrap_sqlite_error(exc, self._path) from exc
            raise
        self._depth -= 1
        try:
            if nested:
                conn.execute(f"RELEASE {savepoint}")
            elif not conn.in_transaction:
                raise StoreError(
                    f"store {self._path}: SQLite rolled the transaction back after an error; "
                    "nothing was written"
                )
            else:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._undo(conn, nested, savepoint)
            raise wrap_sqlite_error(exc, self._path) from exc

    @staticmethod
    def _undo(conn: sqlite3.Connection, nested: bool, savepoint: str) -> None:
        if not conn.in_transaction:  # SQLite already rolled back (e.g. disk full)
            return
        with suppress(sqlite3.Error):
            if nested:
                conn.execute(f"ROLLBACK TO {savepoint}")
                conn.execute(f"RELEASE {savepoint}")
            else:
                conn.execute("ROLLBACK")

    def _require(
        self, conn: sqlite3.Connection, table: str, ids: Iterable[int], field: str
    ) -> None:
        wanted = sorted(set(ids))
        found: set[int] = set()
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            marks = ",".join("?" * len(chunk))
            found.update(
                row[0]
                for row in conn.execute(f"SELECT id FROM {table} WHERE id IN ({marks})", chunk)
            )
        missing = [i for i in wanted if i not in found]
        if missing:
            raise UnknownRecordError(
                f"{field}: no {table} row with id {', '.join(map(str, missing))}"
            )

    # -------------------------------------------------------------- job attempts

    def resolve_attempt(
        self, attempt: JobAttempt, *, seen_at: float | None = None
    ) -> AttemptRecord:
        """The stored attempt ``attempt`` belongs to, recording it if new (see :func:`relate`).

        A requeue (same job, higher restart count) joins the job's history; a reused job id
        starts a new history, so it never sees the old job's incidents or advice.
        """
        if not isinstance(attempt, JobAttempt):
            raise TypeError(f"attempt must be a JobAttempt, got {type(attempt).__name__}")
        seen = _now(seen_at, "seen_at")
        key = (attempt.cluster, attempt.job_id, attempt.submit_time, attempt.restart_count)
        with self._tx(write=True, durable=False) as conn:
            row = conn.execute(
                f"SELECT {_ATTEMPT_COLS} FROM job_attempts WHERE cluster = ? AND job_id = ? "
                "AND submit_time = ? AND restart_count = ?",
                key,
            ).fetchone()
            if row:
                return _attempt(row)
            histories = conn.execute(
                "SELECT id FROM job_histories WHERE cluster = ? AND job_id = ? ORDER BY id DESC",
                key[:2],
            ).fetchall()
            for (history_id,) in histories:
                latest = self._latest_in_history(conn, history_id)
                relation = relate(latest.attempt, attempt)
                if relation is AttemptRelation.SAME_ATTEMPT:
                    return latest
                if relation is AttemptRelation.EARLIER_ATTEMPT:
                    row = conn.execute(
                        f"SELECT {_ATTEMPT_COLS} FROM job_attempts WHERE history_id = ? "
                        "AND restart_count = ? ORDER BY id LIMIT 1",
                        (history_id, attempt.restart_count),
                    ).fetchone()
                    if row:
                        return _attempt(row)
                if relation.same_job:
                    return self._insert_attempt(conn, history_id, attempt, seen)
            history_id = conn.execute(
                "INSERT INTO job_histories (cluster, job_id, first_submit_time, first_seen_at) "
                "VALUES (?, ?, ?, ?)",
                (*key[:3], seen),
            ).lastrowid
            assert history_id is not None
            return self._insert_attempt(conn, history_id, attempt, seen)

    @staticmethod
    def _latest_in_history(conn: sqlite3.Connection, history_id: int) -> AttemptRecord:
        row = conn.execute(
            f"SELECT {_ATTEMPT_COLS} FROM job_attempts WHERE history_id = ? "
            "ORDER BY restart_count DESC, id DESC LIMIT 1",
            (history_id,),
        ).fetchone()
        return _attempt(row)

    @staticmethod
    def _insert_attempt(
        conn: sqlite3.Connection, history_id: int, attempt: JobAttempt, seen: float
    ) -> AttemptRecord:
        attempt_id = conn.execute(
            "INSERT INTO job_attempts (history_id, cluster, job_id, submit_time, restart_count, "
            "first_seen_at) VALUES (?, ?, ?, ?, ?, ?)",
            (
                history_id,
                attempt.cluster,
                attempt.job_id,
                attempt.submit_time,
                attempt.restart_count,
                seen,
            ),
        ).lastrowid
        assert attempt_id is not None
        return AttemptRecord(attempt_id, history_id, attempt, seen)

    def get_attempt(self, attempt_id: int) -> AttemptRecord | None:
        with self._tx(write=False) as conn:
            row = conn.execute(
                f"SELECT {_ATTEMPT_COLS} FROM job_attempts WHERE id = ?", (attempt_id,)
            ).fetchone()
        return _attempt(row) if row else None

    def latest_attempt(self, cluster: str, job_id: int) -> AttemptRecord | None:
        """The newest attempt of the newest history of this job id, or ``None``."""
        with self._tx(write=False) as conn:
            row = conn.execute(
                "SELECT id FROM job_histories WHERE cluster = ? AND job_id = ? "
                "ORDER BY id DESC LIMIT 1",
                (cluster, job_id),
            ).fetchone()
            return self._latest_in_history(conn, row[0]) if row else None

    def history(self, history_id: int) -> list[AttemptRecord]:
        """All attempts of one job history, first to latest."""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_ATTEMPT_COLS} FROM job_attempts WHERE history_id = ? "
                "ORDER BY restart_count, id",
                (history_id,),
            ).fetchall()
        return [_attempt(row) for row in rows]

    # ------------------------------------------------------------------ evidence

    def add_evidence(
        self, batch: Iterable[Evidence], *, received_at: float | None = None
    ) -> list[int]:
        """Store a batch of evidence in one transaction; returns the new ids in batch order."""
        items = list(batch)
        for index, item in enumerate(items):
            if not isinstance(item, Evidence):
                raise TypeError(f"batch[{index}] must be Evidence, got {type(item).__name__}")
        received = _now(received_at, "received_at")
        with self._tx(write=True, durable=False) as conn:
            self._require(
                conn,
                "job_attempts",
                (e.attempt_id for e in items if e.attempt_id is not None),
                "Evidence.attempt_id",
            )
            ids = []
            for item in items:
                cursor = conn.execute(
                    "INSERT INTO evidence (received_at, observed_at, source, kind, node, gpu, "
                    "attempt_id, payload, job_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        received,
                        item.observed_at,
                        item.source,
                        item.kind,
                        item.node,
                        item.gpu,
                        item.attempt_id,
                        item.payload_json,
                        item.job_id,
                    ),
                )
                assert cursor.lastrowid is not None
                ids.append(cursor.lastrowid)
        return ids

    def evidence_by_id(self, ids: Iterable[int]) -> list[EvidenceRecord]:
        """The evidence with these ids that exists, in id order."""
        wanted = sorted(set(ids))
        out: list[EvidenceRecord] = []
        with self._tx(write=False) as conn:
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    f"SELECT {_EVIDENCE_COLS} FROM evidence WHERE id IN ({marks}) ORDER BY id",
                    chunk,
                ).fetchall()
                out.extend(_evidence(row) for row in rows)
        return out

    def prune_evidence(
        self, before: float, kinds: Iterable[str] = ROUTINE_EVIDENCE, batch: int = 10_000
    ) -> int:
        """Delete up to ``batch`` rows of evidence of ``kinds`` observed before ``before`` that
        no advice rests on; returns how many. Retention (``store.retention``): routine evidence
        only matters while fresh, and is most rows of a large cluster. A small batch keeps the
        write lock short; call again while it returns ``batch``."""
        names = sorted({check_text(k, "kinds[]") for k in kinds})
        check_int(batch, "batch", minimum=1)
        if not names:
            return 0
        with self._tx(write=True) as conn:
            cursor = conn.execute(
                f"""DELETE FROM evidence WHERE id IN (
                    SELECT id FROM evidence
                    WHERE kind IN ({",".join("?" * len(names))}) AND observed_at < ?
                      AND id NOT IN (SELECT evidence_id FROM advice_evidence)
                    LIMIT ?)""",
                (*names, before, batch),
            )
            return cursor.rowcount

    def find_evidence(
        self,
        *,
        node: str | None = None,
        attempt_id: int | None = None,
        job_id: int | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 10_000,
        skip_kinds: Iterable[str] = (),
        after_id: int | None = None,
    ) -> list[EvidenceRecord]:
        """Evidence observed in ``[since, until]`` for a node, attempt and/or job, oldest first,
        except ``skip_kinds`` (e.g. ``sidecar_status``: the bulk of the evidence of a large
        cluster, which no decision reads); ``after_id``: only rows stored after that one (rows
        are only ever added, one writer at a time, so ids are committed in order)."""
        clauses, args = [], []
        if after_id is not None:
            clauses.append("id > ?")
            args.append(check_int(after_id, "after_id", minimum=0))
        for column, value in (("node", node), ("attempt_id", attempt_id), ("job_id", job_id)):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        _time_range("observed_at", since, until, clauses, args)
        skip = sorted({check_text(k, "skip_kinds[]") for k in skip_kinds})
        if skip:
            clauses.append(f"kind NOT IN ({','.join('?' * len(skip))})")
            args.extend(skip)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        check_int(limit, "limit", minimum=1)
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_EVIDENCE_COLS} FROM evidence {where} ORDER BY observed_at, id LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [_evidence(row) for row in rows]

    # ----------------------------------------------------------------- incidents

    def open_incident(
        self,
        attempt_id: int,
        kind: str,
        *,
        opened_at: float | None = None,
        summary: str = "",
    ) -> Incident:
        """Open an incident for a job attempt. Raises ConflictError if one is already open
        (look it up with :meth:`find_open_incident`)."""
        check_id(attempt_id, "attempt_id")
        check_name(kind, "kind")
        check_text(summary, "summary", allow_empty=True)
        opened = _now(opened_at, "opened_at")
        with self._tx(write=True) as conn:
            self._require(conn, "job_attempts", [attempt_id], "attempt_id")
            existing = conn.execute(
                "SELECT id FROM incidents WHERE attempt_id = ? AND closed_at IS NULL",
                (attempt_id,),
            ).fetchone()
            if existing:
                raise ConflictError(f"attempt {attempt_id} already has open incident {existing[0]}")
            incident_id = conn.execute(
                "INSERT INTO incidents (attempt_id, kind, opened_at, summary) VALUES (?, ?, ?, ?)",
                (attempt_id, kind, opened, summary),
            ).lastrowid
        assert incident_id is not None
        return Incident(incident_id, attempt_id, kind, opened, summary)

    def find_open_incident(self, attempt_id: int) -> Incident | None:
        with self._tx(write=False) as conn:
            row = conn.execute(
                f"SELECT {_INCIDENT_COLS} FROM incidents WHERE attempt_id = ? "
                "AND closed_at IS NULL",
                (attempt_id,),
            ).fetchone()
        return _incident(row) if row else None

    def get_incident(self, incident_id: int) -> Incident | None:
        with self._tx(write=False) as conn:
            row = conn.execute(
                f"SELECT {_INCIDENT_COLS} FROM incidents WHERE id = ?", (incident_id,)
            ).fetchone()
        return _incident(row) if row else None

    def close_incident(
        self, incident_id: int, *, outcome: str, closed_at: float | None = None
    ) -> Incident:
        """Close an open incident with an outcome ("running_again", "stopped: ...")."""
        check_id(incident_id, "incident_id")
        check_text(outcome, "outcome")
        closed = _now(closed_at, "closed_at")
        with self._tx(write=True) as conn:
            incident = self._open_incident_row(conn, incident_id)
            if closed < incident.opened_at:
                raise ValueError(
                    f"closed_at {closed} is before incident {incident_id} opened "
                    f"({incident.opened_at})"
                )
            conn.execute(
                "UPDATE incidents SET closed_at = ?, outcome = ? WHERE id = ?",
                (closed, outcome, incident_id),
            )
        return Incident(
            incident.id,
            incident.attempt_id,
            incident.kind,
            incident.opened_at,
            incident.summary,
            closed,
            outcome,
        )

    @staticmethod
    def _open_incident_row(conn: sqlite3.Connection, incident_id: int) -> Incident:
        row = conn.execute(
            f"SELECT {_INCIDENT_COLS} FROM incidents WHERE id = ?", (incident_id,)
        ).fetchone()
        if row is None:
            raise UnknownRecordError(f"incident_id: no incident with id {incident_id}")
        incident = _incident(row)
        if not incident.is_open:
            raise ConflictError(f"incident {incident_id} is closed ({incident.outcome})")
        return incident

    def list_incidents(
        self,
        *,
        open_only: bool = False,
        history_id: int | None = None,
        limit: int = 1000,
    ) -> list[Incident]:
        """Incidents, newest first; only open ones, or only those of one job history."""
        clauses, args = [], []
        if open_only:
            clauses.append("i.closed_at IS NULL")
        if history_id is not None:
            clauses.append("a.history_id = ?")
            args.append(history_id)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        check_int(limit, "limit", minimum=1)
        cols = ", ".join(f"i.{c.strip()}" for c in _INCIDENT_COLS.split(","))
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {cols} FROM incidents i JOIN job_attempts a ON a.id = i.attempt_id "
                f"{where} ORDER BY i.id DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [_incident(row) for row in rows]

    # ------------------------ read-only queries: srecovery incidents, explain, nodes

    #: The latest advice of incident ``i`` (joined as ``ad``): the one in force.
    _LATEST_ADVICE = (
        "LEFT JOIN advice ad ON ad.incident_id = i.id AND ad.generation = "
        "(SELECT MAX(generation) FROM advice WHERE incident_id = i.id)"
    )

    def find_incidents(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        job_id: int | None = None,
        node: str | None = None,
        fault_class: str | None = None,
        state: str | None = None,
        kinds: Iterable[str] = (),
        limit: int = 100,
        oldest_first: bool = False,
    ) -> list[Incident]:
        """Incidents matching every filter given, newest first (``oldest_first``: oldest
        first), filtered in SQL so that only the ones returned are ever read in full.

        ``since``/``until`` bound the opening time; ``node``: the latest advice implicated it
        (its verdict's nodes) or the job ran on it (the job snapshot kept with the advice);
        ``fault_class``: the latest advice's verdict class (``unknown`` without advice);
        ``state``: ``open`` or ``closed``; ``kinds``: any of these incident kinds."""
        clauses: list[str] = []
        args: list[Any] = []
        _time_range("i.opened_at", since, until, clauses, args)
        if job_id is not None:
            clauses.append("a.job_id = ?")
            args.append(check_id(job_id, "job_id"))
        if state is not None:
            if state not in ("open", "closed"):
                raise ValueError(f"state must be open or closed, got {state!r}")
            clauses.append(f"i.closed_at IS {'' if state == 'open' else 'NOT '}NULL")
        wanted = sorted({check_name(k, "kinds[]") for k in kinds})
        if wanted:
            clauses.append(f"i.kind IN ({','.join('?' * len(wanted))})")
            args.extend(wanted)
        if fault_class is not None:
            clauses.append(
                "COALESCE(json_extract(ad.verdict, '$.verdict.fault_class'), 'unknown') = ?"
            )
            args.append(check_text(fault_class, "fault_class"))
        if node is not None:
            clauses.append(
                "(EXISTS (SELECT 1 FROM json_each(ad.verdict, '$.verdict.nodes') WHERE value = ?)"
                " OR EXISTS (SELECT 1 FROM json_each(ad.verdict, '$.job.nodes') WHERE value = ?))"
            )
            args.extend([check_text(node, "node")] * 2)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        check_int(limit, "limit", minimum=1)
        cols = ", ".join(f"i.{c.strip()}" for c in _INCIDENT_COLS.split(","))
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {cols} FROM incidents i JOIN job_attempts a ON a.id = i.attempt_id "
                f"{self._LATEST_ADVICE} {where} "
                f"ORDER BY i.id {'ASC' if oldest_first else 'DESC'} LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [_incident(row) for row in rows]

    def implicated_since(self, since: float) -> list[tuple[str, int, float, float]]:
        """(node, incident id, opened at, confidence) for every node the latest advice of an
        incident opened since ``since`` implicated (the lemon score's main input)."""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                "SELECT n.value, i.id, i.opened_at, "
                "COALESCE(json_extract(ad.verdict, '$.verdict.confidence'), 0) "
                f"FROM incidents i {self._LATEST_ADVICE}, "
                "json_each(ad.verdict, '$.verdict.nodes') n "
                "WHERE i.opened_at >= ? ORDER BY i.id",
                (check_time(since, "since"),),
            ).fetchall()
        return [(str(n), int(i), float(at), float(c)) for n, i, at, c in rows]

    def node_drains(
        self, *, node: str | None = None, since: float | None = None, limit: int = 10_000
    ) -> list[tuple[Action, int | None, str]]:
        """The tool's ``drain`` steps that succeeded (on ``node``, finished since ``since``),
        each with the incident whose advice asked for it and the reason it gave Slurm
        (``srecovery:<incident>:<cause>``, as the loop writes it), oldest first."""
        clauses, args = ["ac.step = 'drain'", "ac.result = 'ok'"], []
        if node is not None:
            clauses.append("ac.target = ?")
            args.append(check_text(node, "node"))
        if since is not None:
            clauses.append("ac.finished_at >= ?")
            args.append(check_time(since, "since"))
        check_int(limit, "limit", minimum=1)
        cols = ", ".join(f"ac.{c.strip()}" for c in _ACTION_COLS.split(","))
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {cols}, ad.incident_id, COALESCE(NULLIF(json_extract(ad.verdict, "
                "'$.verdict.cause'), ''), json_extract(ad.verdict, '$.verdict.fault_class'), "
                "'unknown') FROM actions ac "
                "LEFT JOIN advice ad ON ad.id = ac.advice_id "
                f"WHERE {' AND '.join(clauses)} ORDER BY ac.id LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [
            (
                Action(*row[:7], _loads(row[7]), row[8]),
                row[9],
                f"srecovery:{row[9]}:{row[10]}" if row[9] is not None else "",
            )
            for row in rows
        ]

    # ------------------------------------------------------------ sidecar status as state

    def save_node_reports(self, reports: Iterable[NodeReport]) -> int:
        """Write each node's report (``node_reports``: one row per node, replaced), as the
        controller's in-memory table (controller.reports) has them; one statement for all.
        Not durable on its own: the change it records is durable as evidence, and a later
        checkpoint or commit makes the rest durable (``_tx``). Returns the rows written."""
        rows = [
            (
                check_text(r.node, "NodeReport.node"),
                check_time(r.heard_at, "NodeReport.heard_at"),
                check_time(r.observed_at, "NodeReport.observed_at"),
                check_time(r.changed_at, "NodeReport.changed_at"),
                check_int(r.reports, "NodeReport.reports", minimum=1),
                check_payload(r.condition, "NodeReport.condition"),
                check_text(r.payload_json, "NodeReport.payload_json"),
            )
            for r in reports
        ]
        if not rows:
            return 0
        with self._tx(write=True, durable=False) as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO node_reports (node, heard_at, observed_at, changed_at, "
                "reports, condition, payload) VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        return len(rows)

    def node_reports(
        self, *, node: str | None = None, since: float | None = None
    ) -> dict[str, NodeReport]:
        """node -> its sidecar's latest report (``since``: heard then or later)."""
        clauses: list[str] = []
        args: list[Any] = []
        if node is not None:
            clauses.append("node = ?")
            args.append(check_text(node, "node"))
        _time_range("heard_at", since, None, clauses, args)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                "SELECT node, heard_at, observed_at, changed_at, reports, condition, payload "
                f"FROM node_reports {where} ORDER BY node",
                args,
            ).fetchall()
        return {row[0]: NodeReport(*row[:5], _loads(row[5]), row[6]) for row in rows}

    def latest_by_node(self, kind: str, *, since: float | None = None) -> dict[str, float]:
        """node -> when its latest evidence of ``kind`` was observed (``since``: only evidence
        observed then or later). One pass over an index (``evidence_by_kind_node``)."""
        clauses, args = ["kind = ?", "node IS NOT NULL"], [check_text(kind, "kind")]
        _time_range("observed_at", since, None, clauses, args)
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT node, MAX(observed_at) FROM evidence WHERE {' AND '.join(clauses)} "
                "GROUP BY node",
                args,
            ).fetchall()
        return {node: float(when) for node, when in rows}

    def evidence_by_kinds(
        self,
        kinds: Iterable[str],
        *,
        node: str | None = None,
        any_node: bool = False,
        job_id: int | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 10_000,
        newest_first: bool = False,
    ) -> list[EvidenceRecord]:
        """Evidence of these kinds about ``node`` (or, ``any_node``, about some node) and/or
        ``job_id``, observed in ``[since, until]``, oldest first (``newest_first``: the latest
        ``limit``, newest first)."""
        wanted = sorted({check_text(k, "kinds[]") for k in kinds})
        if not wanted:
            return []
        clauses = [f"kind IN ({','.join('?' * len(wanted))})"]
        args: list[Any] = list(wanted)
        if node is not None:
            clauses.append("node = ?")
            args.append(check_text(node, "node"))
        elif any_node:
            clauses.append("node IS NOT NULL")
        if job_id is not None:
            clauses.append("job_id = ?")
            args.append(check_id(job_id, "job_id"))
        _time_range("observed_at", since, until, clauses, args)
        check_int(limit, "limit", minimum=1)
        order = " DESC" if newest_first else ""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_EVIDENCE_COLS} FROM evidence WHERE {' AND '.join(clauses)} "
                f"ORDER BY observed_at{order}, id{order} LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [_evidence(row) for row in rows]

    def latest_findings(self, *, node: str | None = None) -> list[EvidenceRecord]:
        """The latest ``gpu_finding``/``ib_finding`` per node, kind, check, GPU and port (of
        ``node``, or of every node), oldest first: what each condition last reported (a GPU
        reset is its own check, ``gpu_reset``). Findings are sent when a condition changes, not
        again while it lasts, so this looks at the whole history."""
        clauses = ["kind IN ('gpu_finding', 'ib_finding')"]
        args: list[Any] = []
        if node is None:
            clauses.append("node IS NOT NULL")
        else:
            clauses.append("node = ?")
            args.append(check_text(node, "node"))
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_EVIDENCE_COLS} FROM (SELECT {_EVIDENCE_COLS}, ROW_NUMBER() OVER ("
                "PARTITION BY node, kind, json_extract(payload, '$.check'), gpu, "
                "json_extract(payload, '$.port') ORDER BY observed_at DESC, id DESC) AS rn "
                f"FROM evidence WHERE {' AND '.join(clauses)}) WHERE rn = 1 "
                "ORDER BY observed_at, id",
                args,
            ).fetchall()
        return [_evidence(row) for row in rows]

    def audit_about(
        self,
        *,
        incidents: Iterable[int] = (),
        evidence: Iterable[int] = (),
        since: float | None = None,
        limit: int = 10_000,
    ) -> list[AuditRow]:
        """Audit rows whose payload names one of these incidents (``incident``) or pieces of
        evidence (``evidence``: an operator's report), in seq order. ``since``: rows are looked
        for from about that time on (found by seq, which the audit log orders by time)."""
        incident_ids = sorted({check_id(i, "incidents[]") for i in incidents})
        evidence_ids = sorted({check_id(i, "evidence[]") for i in evidence})
        if not incident_ids and not evidence_ids:
            return []
        who, args = [], []
        if incident_ids:
            who.append(
                f"json_extract(payload, '$.incident') IN ({','.join('?' * len(incident_ids))})"
            )
            args.extend(incident_ids)
        if evidence_ids:
            who.append(
                f"json_extract(payload, '$.evidence') IN ({','.join('?' * len(evidence_ids))})"
            )
            args.extend(evidence_ids)
        check_int(limit, "limit", minimum=1)
        with self._tx(write=False) as conn:
            first = self._first_seq_at(conn, since) if since is not None else 1
            rows = conn.execute(
                f"SELECT {_AUDIT_COLS} FROM audit_log WHERE seq >= ? AND ({' OR '.join(who)}) "
                "ORDER BY seq LIMIT ?",
                (first, *args, limit),
            ).fetchall()
        return [AuditRow(*row) for row in rows]

    @staticmethod
    def _first_seq_at(conn: sqlite3.Connection, ts: float) -> int:
        """About the first audit seq with a time at or after ``ts``: a binary search over seq
        (the primary key), as rows are appended in time order. Rows imported late (the
        watchdog's releases) may carry an older time; callers pass a time with slack."""
        last = conn.execute("SELECT MAX(seq) FROM audit_log").fetchone()[0]
        if last is None:
            return 1
        lo, hi = 1, last + 1
        while lo < hi:
            mid = (lo + hi) // 2
            row = conn.execute("SELECT ts FROM audit_log WHERE seq = ?", (mid,)).fetchone()
            if row is not None and row[0] < ts:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # -------------------------------------------------------------------- advice

    def add_advice(
        self,
        incident_id: int,
        *,
        decision: str,
        reason: str,
        verdict: Mapping[str, Any] | None = None,
        evidence_ids: Sequence[int] = (),
        created_at: float | None = None,
    ) -> Advice:
        """Record the next generation of advice for an open incident (1 for the first)."""
        check_id(incident_id, "incident_id")
        check_name(decision, "decision")
        check_text(reason, "reason")
        verdict_json = check_payload(verdict, "verdict")
        if isinstance(evidence_ids, str | bytes):
            raise ValueError("evidence_ids must be a sequence of evidence ids")
        ids = tuple(sorted({check_id(i, "evidence_ids[]") for i in evidence_ids}))
        created = _now(created_at, "created_at")
        with self._tx(write=True) as conn:
            self._open_incident_row(conn, incident_id)
            self._require(conn, "evidence", ids, "evidence_ids")
            generation = conn.execute(
                "SELECT COALESCE(MAX(generation), 0) + 1 FROM advice WHERE incident_id = ?",
                (incident_id,),
            ).fetchone()[0]
            advice_id = conn.execute(
                "INSERT INTO advice (incident_id, generation, created_at, decision, reason, "
                "verdict) VALUES (?, ?, ?, ?, ?, ?)",
                (incident_id, generation, created, decision, reason, verdict_json),
            ).lastrowid
            assert advice_id is not None
            conn.executemany(
                "INSERT INTO advice_evidence (advice_id, evidence_id) VALUES (?, ?)",
                [(advice_id, evidence_id) for evidence_id in ids],
            )
        return Advice(
            advice_id,
            incident_id,
            generation,
            created,
            decision,
            reason,
            _loads(verdict_json),
            ids,
        )

    def get_advice(self, advice_id: int) -> Advice | None:
        with self._tx(write=False) as conn:
            rows = self._advice_rows(conn, "id = ?", (advice_id,))
        return rows[0] if rows else None

    def latest_advice(self, incident_id: int) -> Advice | None:
        """The advice in force for an incident: its highest generation."""
        with self._tx(write=False) as conn:
            rows = self._advice_rows(
                conn, "incident_id = ? ORDER BY generation DESC LIMIT 1", (incident_id,)
            )
        return rows[0] if rows else None

    def advice_history(self, incident_id: int) -> list[Advice]:
        """Every generation of advice for an incident, first to latest."""
        with self._tx(write=False) as conn:
            return self._advice_rows(conn, "incident_id = ? ORDER BY generation", (incident_id,))

    @staticmethod
    def _advice_rows(conn: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> list[Advice]:
        out = []
        for row in conn.execute(f"SELECT {_ADVICE_COLS} FROM advice WHERE {where}", args):
            ids = tuple(
                r[0]
                for r in conn.execute(
                    "SELECT evidence_id FROM advice_evidence WHERE advice_id = ? "
                    "ORDER BY evidence_id",
                    (row[0],),
                )
            )
            out.append(Advice(*row[:6], _loads(row[6]), ids))
        return out

    # ---------------------------------------------------------------- milestones

    def add_milestone(self, incident_id: int, name: str, *, at: float | None = None) -> float:
        """Record when milestone ``name`` (see ``MILESTONES``) was reached; the first record
        wins, so repeating it is harmless. Returns the time on record."""
        check_id(incident_id, "incident_id")
        check_name(name, "name")
        when = _now(at, "at")
        with self._tx(write=True) as conn:
            self._require(conn, "incidents", [incident_id], "incident_id")
            conn.execute(
                "INSERT OR IGNORE INTO milestones (incident_id, name, at) VALUES (?, ?, ?)",
                (incident_id, name, when),
            )
            return conn.execute(
                "SELECT at FROM milestones WHERE incident_id = ? AND name = ?",
                (incident_id, name),
            ).fetchone()[0]

    def milestones(self, incident_id: int) -> dict[str, float]:
        """Milestone name -> time, in time order; milestones recorded at the same instant in
        the order the recovery passes them (:data:`MILESTONE_ORDER`), then by name."""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                "SELECT name, at FROM milestones WHERE incident_id = ?", (incident_id,)
            ).fetchall()
        rank = {name: i for i, name in enumerate(MILESTONE_ORDER)}
        rows.sort(key=lambda row: (row[1], rank.get(row[0], len(rank)), row[0]))
        return dict(rows)

    # ------------------------------------------------------------------- actions

    def record_action(
        self,
        step: str,
        target: str,
        *,
        result: str,
        started_at: float,
        finished_at: float | None = None,
        advice_id: int | None = None,
        params: Mapping[str, Any] | None = None,
        message: str = "",
    ) -> Action:
        """Record a scheduler step (``requeue_hold``, ``release``, ``drain`` ...) on ``target``
        (a job or node) with its result: ``ok``, ``failed`` or ``skipped`` (already done)."""
        check_name(step, "step")
        check_text(target, "target")
        if result not in ACTION_RESULTS:
            raise ValueError(f"result must be one of {', '.join(ACTION_RESULTS)}, got {result!r}")
        started = check_time(started_at, "started_at")
        finished = _now(finished_at, "finished_at")
        if finished < started:
            raise ValueError(f"finished_at {finished} is before started_at {started}")
        if advice_id is not None:
            check_id(advice_id, "advice_id")
        params_json = check_payload(params, "params")
        check_text(message, "message", allow_empty=True)
        with self._tx(write=True) as conn:
            if advice_id is not None:
                self._require(conn, "advice", [advice_id], "advice_id")
            action_id = conn.execute(
                "INSERT INTO actions (advice_id, step, target, params, result, message, "
                "started_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (advice_id, step, target, params_json, result, message, started, finished),
            ).lastrowid
        assert action_id is not None
        return Action(
            action_id,
            advice_id,
            step,
            target,
            result,
            started,
            finished,
            _loads(params_json),
            message,
        )

    def actions(
        self,
        *,
        advice_id: int | None = None,
        incident_id: int | None = None,
        limit: int = 1000,
    ) -> list[Action]:
        """Actions in the order taken, for one advice or one incident (all generations)."""
        clauses, args = [], []
        if advice_id is not None:
            clauses.append("advice_id = ?")
            args.append(advice_id)
        if incident_id is not None:
            clauses.append("advice_id IN (SELECT id FROM advice WHERE incident_id = ?)")
            args.append(incident_id)
        return self._select_actions(clauses, args, limit)

    def _select_actions(self, clauses: list[str], args: list[Any], limit: int) -> list[Action]:
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        check_int(limit, "limit", minimum=1)
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_ACTION_COLS} FROM actions {where} ORDER BY id LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [Action(*row[:7], _loads(row[7]), row[8]) for row in rows]

    # --------------------------------------------------------------------- nodes

    def upsert_node(self, state: NodeState) -> None:
        """Store the tool's state for a node, replacing what was there."""
        if not isinstance(state, NodeState):
            raise TypeError(f"state must be a NodeState, got {type(state).__name__}")
        with self._tx(write=True) as conn:
            conn.execute(
                f"INSERT OR REPLACE INTO nodes ({_NODE_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    state.name,
                    state.updated_at,
                    int(state.drained_by_tool),
                    state.drain_reason,
                    state.drained_at,
                    state.implicated_count,
                    state.last_implicated_at,
                ),
            )

    def get_node(self, name: str) -> NodeState | None:
        with self._tx(write=False) as conn:
            row = conn.execute(f"SELECT {_NODE_COLS} FROM nodes WHERE name = ?", (name,)).fetchone()
        return _node(row) if row else None

    def list_nodes(self, *, drained_by_tool: bool | None = None) -> list[NodeState]:
        """Nodes the tool keeps state for, by name; optionally only those it drained (or not)."""
        where, args = "", ()
        if drained_by_tool is not None:
            where, args = "WHERE drained_by_tool = ?", (int(drained_by_tool),)
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_NODE_COLS} FROM nodes {where} ORDER BY name", args
            ).fetchall()
        return [_node(row) for row in rows]

    # ------------------------------------------------------------ mode overrides

    def set_mode_override(self, override: ModeOverride) -> ModeOverride | None:
        """Store an operator's mode for a partition (or the default, partition ``None``),
        replacing the one there; returns the override it replaced, if any."""
        if not isinstance(override, ModeOverride):
            raise TypeError(f"override must be a ModeOverride, got {type(override).__name__}")
        with self._tx(write=True) as conn:
            previous = self._override_row(conn, override.partition)
            conn.execute(
                f"INSERT OR REPLACE INTO mode_overrides ({_OVERRIDE_COLS}) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    override.partition or "",
                    override.mode,
                    override.set_by,
                    override.set_by_uid,
                    override.set_at,
                    override.reason,
                ),
            )
        return previous

    def clear_mode_override(self, partition: str | None) -> ModeOverride | None:
        """Remove the override of ``partition`` (``None``: the default); returns it, or None
        when there was none."""
        with self._tx(write=True) as conn:
            previous = self._override_row(conn, partition)
            conn.execute("DELETE FROM mode_overrides WHERE partition = ?", (partition or "",))
        return previous

    def get_mode_override(self, partition: str | None) -> ModeOverride | None:
        with self._tx(write=False) as conn:
            return self._override_row(conn, partition)

    def mode_overrides(self) -> list[ModeOverride]:
        """Every override in force: the default's first, then the partitions' by name."""
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_OVERRIDE_COLS} FROM mode_overrides ORDER BY partition"
            ).fetchall()
        return [_override(row) for row in rows]

    @staticmethod
    def _override_row(conn: sqlite3.Connection, partition: str | None) -> ModeOverride | None:
        if partition is not None:
            check_text(partition, "partition")
        row = conn.execute(
            f"SELECT {_OVERRIDE_COLS} FROM mode_overrides WHERE partition = ?",
            (partition or "",),
        ).fetchone()
        return _override(row) if row else None

    # --------------------------------------------------------------------- audit

    def append_audit(
        self,
        actor: str,
        kind: str,
        subject: str,
        payload: Mapping[str, Any] | None = None,
        *,
        ts: float | None = None,
    ) -> AuditRow:
        """Append a row to the audit chain (durable when this returns, or when the enclosing
        :meth:`transaction` commits). ``actor``: who (``controller``, ``srecovery:alice``);
        ``kind``: what (``advice``, ``action`` ...); ``subject``: on what (``job 42``)."""
        check_text(actor, "actor")
        check_name(kind, "kind")
        check_text(subject, "subject", allow_empty=True)
        payload_json = check_payload(payload, "payload")
        when = _now(ts, "ts")
        with self._tx(write=True) as conn:
            last = conn.execute(
                "SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1"
            ).fetchone()
            seq, prev_hash = (last[0] + 1, last[1]) if last else (1, GENESIS_HASH)
            digest = row_hash(seq, when, actor, kind, subject, payload_json, prev_hash)
            assert digest is not None
            row = AuditRow(seq, when, actor, kind, subject, payload_json, prev_hash, digest)
            conn.execute(
                f"INSERT INTO audit_log ({_AUDIT_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (seq, when, actor, kind, subject, payload_json, prev_hash, digest),
            )
        return row

    def audit_rows(self, *, after_seq: int = 0, limit: int = 1000) -> list[AuditRow]:
        """Up to ``limit`` audit rows with seq > ``after_seq``, in order."""
        check_int(after_seq, "after_seq")
        check_int(limit, "limit", minimum=1)
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_AUDIT_COLS} FROM audit_log WHERE seq > ? ORDER BY seq LIMIT ?",
                (after_seq, limit),
            ).fetchall()
        return [AuditRow(*row) for row in rows]

    def iter_audit(self, *, after_seq: int = 0, page: int = 1000) -> Iterator[AuditRow]:
        """Every audit row after ``after_seq``, read a page at a time."""
        while rows := self.audit_rows(after_seq=after_seq, limit=page):
            yield from rows
            after_seq = rows[-1].seq

    def audit_head(self) -> AuditAnchor | None:
        """The last row's (seq, hash): keep it outside the database to pin the log's tail."""
        with self._tx(write=False) as conn:
            row = conn.execute(
                "SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1"
            ).fetchone()
        return AuditAnchor(*row) if row else None

    def verify_audit(self, anchor: AuditAnchor | None = None) -> AuditVerification:
        """Walk the whole chain in one snapshot; see :func:`~.audit.verify_chain`."""
        with self._tx(write=False) as conn:
            cursor = conn.execute(f"SELECT {_AUDIT_COLS} FROM audit_log ORDER BY seq")
            return verify_chain((AuditRow(*row) for row in cursor), anchor)

    # ------------------------------------- read-only queries: audit pages, compare, replay

    def audit_page(
        self, *, after_seq: int = 0, limit: int = 1000, since: float | None = None
    ) -> list[AuditRow]:
        """Up to ``limit`` audit rows with seq > ``after_seq`` (and ``ts >= since``), in seq
        order: one page of ``srecovery audit export``. Rows are returned exactly as stored, so
        a reader can recompute their hashes."""
        check_int(after_seq, "after_seq")
        check_int(limit, "limit", minimum=1)
        where, args = "seq > ?", [after_seq]
        if since is not None:
            where += " AND ts >= ?"
            args.append(check_time(since, "since"))
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_AUDIT_COLS} FROM audit_log WHERE {where} ORDER BY seq LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [AuditRow(*row) for row in rows]

    def audit_last(self, count: int) -> list[AuditRow]:
        """The last ``count`` audit rows, oldest first (``srecovery audit tail``)."""
        check_int(count, "count", minimum=1)
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_AUDIT_COLS} FROM audit_log ORDER BY seq DESC LIMIT ?", (count,)
            ).fetchall()
        return [AuditRow(*row) for row in reversed(rows)]

    def incidents_opened(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        before_id: int | None = None,
        limit: int = 1000,
    ) -> list[Incident]:
        """Incidents opened in ``[since, until]`` with id < ``before_id``, newest first."""
        clauses: list[str] = []
        args: list[Any] = []
        _time_range("opened_at", since, until, clauses, args)
        if before_id is not None:
            clauses.append("id < ?")
            args.append(check_int(before_id, "before_id"))
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        check_int(limit, "limit", minimum=1)
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_INCIDENT_COLS} FROM incidents {where} ORDER BY id DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [_incident(row) for row in rows]

    def restarts_before(self, history_id: int, at: float) -> int:
        """Restarts the tool had made for a job history by ``at``: its incidents closed
        ``restarted ...`` by then (what the controller counted when it advised at ``at``)."""
        check_id(history_id, "history_id")
        with self._tx(write=False) as conn:
            return conn.execute(
                "SELECT COUNT(*) FROM incidents i JOIN job_attempts a ON a.id = i.attempt_id "
                "WHERE a.history_id = ? AND i.outcome LIKE 'restarted%' AND i.closed_at <= ?",
                (history_id, check_time(at, "at")),
            ).fetchone()[0]

    def evidence_of_kind(
        self,
        kind: str,
        *,
        since: float | None = None,
        until: float | None = None,
        limit: int = 10_000,
    ) -> list[EvidenceRecord]:
        """Evidence of one kind observed in ``[since, until]``, oldest first."""
        clauses, args = ["kind = ?"], [check_text(kind, "kind")]
        _time_range("observed_at", since, until, clauses, args)
        check_int(limit, "limit", minimum=1)
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_EVIDENCE_COLS} FROM evidence WHERE {' AND '.join(clauses)} "
                "ORDER BY observed_at, id LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [_evidence(row) for row in rows]

    def evidence_about_job(
        self,
        job_id: int,
        nodes: Iterable[str],
        *,
        since: float,
        until: float,
        received_by: float,
        skip_kinds: Iterable[str] = (),
        limit: int = 5000,
    ) -> list[EvidenceRecord]:
        """Evidence naming ``job_id`` or about one of ``nodes``, observed in ``[since, until]``
        and received by ``received_by`` (what the controller could have seen then), except
        ``skip_kinds``; oldest first. What ``srecovery replay`` decides again on."""
        check_id(job_id, "job_id")
        names = sorted({check_text(n, "nodes[]") for n in nodes})
        skip = sorted(set(skip_kinds))
        args: list[Any] = [check_time(since, "since"), check_time(until, "until")]
        args.append(check_time(received_by, "received_by"))
        who = "job_id = ?"
        args.append(job_id)
        if names:
            who += f" OR node IN ({','.join('?' * len(names))})"
            args.extend(names)
        where = f"observed_at >= ? AND observed_at <= ? AND received_at <= ? AND ({who})"
        if skip:
            where += f" AND kind NOT IN ({','.join('?' * len(skip))})"
            args.extend(skip)
        check_int(limit, "limit", minimum=1)
        with self._tx(write=False) as conn:
            rows = conn.execute(
                f"SELECT {_EVIDENCE_COLS} FROM evidence WHERE {where} "
                "ORDER BY observed_at, id LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [_evidence(row) for row in rows]

    def actions_between(
        self,
        *,
        steps: Iterable[str] = (),
        since: float | None = None,
        until: float | None = None,
        result: str | None = "ok",
        limit: int = 10_000,
    ) -> list[Action]:
        """Scheduler steps (``steps``; all when empty) finished in ``[since, until]`` with
        ``result``, in the order taken."""
        clauses: list[str] = []
        args: list[Any] = []
        wanted = sorted(set(steps))
        if wanted:
            clauses.append(f"step IN ({','.join('?' * len(wanted))})")
            args.extend(wanted)
        _time_range("finished_at", since, until, clauses, args)
        if result is not None:
            clauses.append("result = ?")
            args.append(result)
        return self._select_actions(clauses, args, limit)


# ----------------------------------------------------------------- row -> record


def _time_range(
    column: str, since: float | None, until: float | None, clauses: list[str], args: list[Any]
) -> None:
    """Add ``column`` between ``since`` and ``until`` (either may be None) to a WHERE."""
    if since is not None:
        clauses.append(f"{column} >= ?")
        args.append(check_time(since, "since"))
    if until is not None:
        clauses.append(f"{column} <= ?")
        args.append(check_time(until, "until"))


def _loads(text: str) -> dict[str, Any]:
    return json.loads(text)


def _attempt(row: Sequence[Any]) -> AttemptRecord:
    attempt_id, history_id, cluster, job_id, submit_time, restart_count, seen = row
    return AttemptRecord(
        attempt_id, history_id, JobAttempt(cluster, job_id, submit_time, restart_count), seen
    )


def _evidence(row: Sequence[Any]) -> EvidenceRecord:
    evidence_id, received_at, source, kind, observed_at, node, gpu, attempt_id, payload, job = row
    evidence = Evidence.stored(source, kind, observed_at, node, gpu, attempt_id, payload, job)
    return EvidenceRecord(evidence_id, received_at, evidence)


def _incident(row: Sequence[Any]) -> Incident:
    return Incident(*row)


def _node(row: Sequence[Any]) -> NodeState:
    name, updated_at, drained, reason, drained_at, count, last = row
    return NodeState(name, updated_at, bool(drained), reason, drained_at, count, last)


def _override(row: Sequence[Any]) -> ModeOverride:
    partition, mode, set_by, set_by_uid, set_at, reason = row
    return ModeOverride(partition or None, mode, set_by, set_at, reason, set_by_uid)


__all__ = ["DEFAULT_PATH", "Store"]
