"""One writer, concurrent readers in other processes (WAL), and the durability settings."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from slurm_recovery.store import Evidence, Store

READER = textwrap.dedent(
    """
    import json, sys, time
    from slurm_recovery.store import Store

    path, seconds = sys.argv[1], float(sys.argv[2])
    stats = {"reads": 0, "errors": [], "seen": [], "evidence_seen": 0}
    with Store.open(path, readonly=True) as store:
        print("ready", flush=True)
        deadline = time.monotonic() + seconds
        last = 0
        while time.monotonic() < deadline:
            try:
                result = store.verify_audit()
                if not result.ok:
                    stats["errors"].append(str(result))
                if result.rows_checked < last:
                    stats["errors"].append(f"went back from {last} to {result.rows_checked}")
                last = result.rows_checked
                stats["seen"].append(last)
                stats["evidence_seen"] = max(
                    stats["evidence_seen"], len(store.find_evidence(limit=100000))
                )
                stats["reads"] += 1
            except Exception as exc:
                stats["errors"].append(repr(exc))
            if last >= 400:
                break
    print(json.dumps(stats), flush=True)
    """
)


def test_reader_process_sees_consistent_growing_log_while_writer_writes(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with Store.open(path) as store:
        store.append_audit("controller", "note", "start", ts=0.0)
        reader = subprocess.Popen(
            [sys.executable, "-c", READER, str(path), "20"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert reader.stdout is not None
            assert reader.stdout.readline().strip() == "ready"
            for i in range(1, 400):
                store.append_audit("controller", "note", f"row {i}", {"i": i}, ts=float(i))
                time.sleep(0.001)  # spread the writes so the reader runs in between
                if i % 20 == 0:
                    store.add_evidence([Evidence("nvml", "xid", float(i))], received_at=float(i))
            out, err = reader.communicate(timeout=60)
        finally:
            if reader.poll() is None:
                reader.kill()
    assert reader.returncode == 0, err
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["errors"] == []
    assert stats["reads"] > 1
    assert stats["seen"] == sorted(stats["seen"])
    assert stats["seen"][-1] == 400  # it saw the writer's last commit
    assert len(set(stats["seen"])) > 1  # and states in between
    assert stats["evidence_seen"] == 19


def test_open_read_snapshot_does_not_block_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with Store.open(path, busy_timeout_s=0.2) as writer, Store.open(path, readonly=True) as reader:
        writer.append_audit("controller", "note", "one", ts=1.0)
        rows = reader.iter_audit(page=1)
        assert next(rows).seq == 1  # a reader part-way through a walk
        writer.append_audit("controller", "note", "two", ts=2.0)  # not blocked
        assert [r.seq for r in rows] == [2]
        assert reader.verify_audit().rows_checked == 2


def test_durability_settings(tmp_path: Path) -> None:
    """Evidence and attempts commit with synchronous=NORMAL; everything else with FULL."""
    with Store.open(tmp_path / "state.db") as store:
        conn = store._conn
        assert conn is not None

        def level() -> int:
            return conn.execute("PRAGMA synchronous").fetchone()[0]

        store.add_evidence([Evidence("nvml", "xid", 1.0)], received_at=1.0)
        assert level() == 1  # NORMAL
        store.append_audit("controller", "note", "x", ts=1.0)
        assert level() == 2  # FULL
        with store.transaction():
            store.add_evidence([Evidence("nvml", "xid", 2.0)], received_at=2.0)
            assert level() == 2  # inside a transaction: the transaction's (durable) setting
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000


def test_the_write_ahead_log_file_is_cut_back_once_checkpointed(tmp_path: Path) -> None:
    """A burst of writes grows state.db-wal past WAL_SIZE_LIMIT; once a checkpoint has copied
    it all, the next commit writes the log from its start and cuts the file back to the limit
    (without journal_size_limit it would stay at its high-water mark)."""
    from slurm_recovery.store.store import WAL_SIZE_LIMIT

    path = tmp_path / "state.db"
    wal = tmp_path / "state.db-wal"
    with Store.open(path, auto_checkpoint=False) as store, Store.open(path) as checkpointer:
        filler = "x" * 12_000  # a payload under the wire's 16 KiB: one overflow chain each
        for batch in range(30):
            store.add_evidence(
                [Evidence("nvml", "note", 1.0 + i, payload={"f": filler}) for i in range(100)],
                received_at=1.0 + batch,
            )
        grown = wal.stat().st_size
        assert grown > WAL_SIZE_LIMIT * 1.5, grown
        result = checkpointer.checkpoint()
        assert not result.busy and result.copied == result.wal_pages
        store.add_evidence([Evidence("nvml", "xid", 99.0)], received_at=99.0)
        assert wal.stat().st_size <= WAL_SIZE_LIMIT, (grown, wal.stat().st_size)
