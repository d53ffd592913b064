"""The audit chain: any run of appends verifies, and one tamper done through raw SQLite (the
triggers dropped first, as an attacker would) is named at exactly the row it touched."""

from __future__ import annotations

import hashlib
import itertools
import json
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.store import (
    GENESIS_HASH,
    AuditAnchor,
    AuditProblem,
    AuditVerification,
    Store,
    verify_chain,
)
from slurm_recovery.store.audit import row_hash

TRIGGERS = ("audit_log_no_update", "audit_log_no_delete", "audit_log_extends_chain")

json_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
entries = st.lists(
    st.tuples(
        st.sampled_from(["controller", "srecovery:alice", "watchdog"]),
        st.sampled_from(["advice", "action", "drain", "note"]),
        st.text(max_size=16),
        st.dictionaries(st.text(max_size=6), json_values, max_size=3),
        st.floats(min_value=0, max_value=4e9, allow_nan=False),
    ),
    min_size=1,
    max_size=10,
)


@contextmanager
def filled_store(items: list[tuple]) -> Iterator[tuple[Store, Path]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.db"
        with Store.open(path) as store:
            for actor, kind, subject, payload, ts in items:
                store.append_audit(actor, kind, subject, payload, ts=ts)
            yield store, path


@contextmanager
def attacker(path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(path, isolation_level=None)
    for trigger in TRIGGERS:
        conn.execute(f"DROP TRIGGER {trigger}")
    try:
        yield conn
    finally:
        conn.close()


def _row(conn: sqlite3.Connection, seq: int) -> tuple:
    return conn.execute(
        "SELECT ts, actor, kind, subject, payload, prev_hash FROM audit_log WHERE seq = ?", (seq,)
    ).fetchone()


def _hash_of(conn: sqlite3.Connection, seq: int) -> str:
    if seq == 0:
        return GENESIS_HASH
    return conn.execute("SELECT hash FROM audit_log WHERE seq = ?", (seq,)).fetchone()[0]


MODIFY_FIELDS = ("ts", "actor", "kind", "subject", "payload", "prev_hash", "hash")


def modify(conn: sqlite3.Connection, seq: int, field: str) -> None:
    """Change one stored value, leaving the hashes as they were."""
    changes = {
        "ts": "ts = ts + 1.5",
        "actor": "actor = actor || 'x'",
        "kind": "kind = 'forged'",
        "subject": "subject = subject || ' (edited)'",
        "payload": """payload = '{"forged":true}'""",
        "prev_hash": "prev_hash = 'e' || substr(prev_hash, 2)",
        "hash": "hash = 'e' || substr(hash, 2)",
    }
    before = (*_row(conn, seq), _hash_of(conn, seq))
    conn.execute(f"UPDATE audit_log SET {changes[field]} WHERE seq = ?", (seq,))
    if (*_row(conn, seq), _hash_of(conn, seq)) == before:  # value already looked forged
        conn.execute(f"UPDATE audit_log SET {field} = {field} || '0' WHERE seq = ?", (seq,))


def modify_and_rehash(conn: sqlite3.Connection, seq: int) -> None:
    """Rewrite a row's subject and give it a correct hash of its own."""
    ts, actor, kind, subject, payload, prev_hash = _row(conn, seq)
    subject += " (edited)"
    conn.execute(
        "UPDATE audit_log SET subject = ?, hash = ? WHERE seq = ?",
        (subject, row_hash(seq, ts, actor, kind, subject, payload, prev_hash), seq),
    )


def delete(conn: sqlite3.Connection, seq: int) -> None:
    conn.execute("DELETE FROM audit_log WHERE seq = ?", (seq,))


def insert(conn: sqlite3.Connection, seq: int, *, linked: bool) -> None:
    """Slip a forged, correctly hashed row in at ``seq``, moving later rows up one."""
    conn.execute("UPDATE audit_log SET seq = -seq WHERE seq >= ?", (seq,))
    conn.execute("UPDATE audit_log SET seq = 1 - seq WHERE seq < 0")
    prev_hash = _hash_of(conn, seq - 1) if linked else "f" * 64
    values = (seq, 1.0, "controller", "action", "job 1", '{"forged":true}', prev_hash)
    conn.execute(
        "INSERT INTO audit_log (seq, ts, actor, kind, subject, payload, prev_hash, hash) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (*values, row_hash(*values)),
    )


def _expect(result: AuditVerification, problem: AuditProblem, seq: int) -> None:
    assert not result.ok, result
    assert (result.problem, result.first_bad_seq) == (problem, seq), result
    assert result.rows_checked == seq - 1
    assert result.head == (None if seq == 1 else AuditAnchor(seq - 1, result.head.hash))
    assert str(result).startswith(f"audit chain broken at seq {seq} ({problem.value})")


# ------------------------------------------------------------------------ properties


@settings(max_examples=60, deadline=None)
@given(items=entries)
def test_any_sequence_of_appends_verifies(items: list[tuple]) -> None:
    with filled_store(items) as (store, _):
        result = store.verify_audit()
        rows = store.audit_rows()
        assert result.ok and result.rows_checked == len(items)
        assert result.head == rows[-1].anchor == store.audit_head()
        assert store.verify_audit(store.audit_head()).ok
        assert [r.seq for r in rows] == list(range(1, len(items) + 1))
        assert [r.payload for r in rows] == [json.loads(json.dumps(p)) for *_, p, _ in items]
        assert rows[0].prev_hash == GENESIS_HASH
        assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(rows))


tampers = st.sampled_from(["modify", "modify_rehash", "delete", "insert", "insert_unlinked"])


@settings(max_examples=150, deadline=None)
@given(items=entries, tamper=tampers, data=st.data())
def test_single_tamper_is_named_at_its_row_given_an_anchor(
    items: list[tuple], tamper: str, data: st.DataObject
) -> None:
    n = len(items)
    last = n + 1 if tamper == "insert_unlinked" else n
    seq = data.draw(st.integers(min_value=1, max_value=last), label="seq")
    with filled_store(items) as (store, path):
        anchor = store.audit_head()
        expected = _tamper(path, tamper, seq, data)
        _expect(store.verify_audit(anchor), expected, seq)


@settings(max_examples=150, deadline=None)
@given(items=entries, tamper=tampers, data=st.data())
def test_single_tamper_without_anchor(items: list[tuple], tamper: str, data: st.DataObject) -> None:
    """Without an anchor, only the log's tail is out of reach: a deleted last row, and a
    rewritten (rehashed) last row or second-last row, which looks like an appended forgery."""
    n = len(items)
    last = n + 1 if tamper == "insert_unlinked" else n
    seq = data.draw(st.integers(min_value=1, max_value=last), label="seq")
    with filled_store(items) as (store, path):
        expected = _tamper(path, tamper, seq, data)
        result = store.verify_audit()
        if (tamper, seq) in (("delete", n), ("modify_rehash", n)):
            assert result.ok and result.rows_checked == (n - 1 if tamper == "delete" else n)
        elif (tamper, seq) == ("modify_rehash", n - 1):
            _expect(result, AuditProblem.INSERTED, n)
        else:
            _expect(result, expected, seq)


def _tamper(path: Path, tamper: str, seq: int, data: st.DataObject) -> AuditProblem:
    with attacker(path) as conn:
        if tamper == "modify":
            modify(conn, seq, data.draw(st.sampled_from(MODIFY_FIELDS), label="field"))
            return AuditProblem.MODIFIED
        if tamper == "modify_rehash":
            modify_and_rehash(conn, seq)
            return AuditProblem.MODIFIED
        if tamper == "delete":
            delete(conn, seq)
            return AuditProblem.DELETED
        insert(conn, seq, linked=tamper == "insert")
        return AuditProblem.INSERTED


# ----------------------------------------------------------------------- examples


ITEMS = [("controller", "note", f"row {i}", {"i": i}, float(i)) for i in range(1, 6)]


def test_triggers_refuse_update_delete_and_out_of_chain_insert(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with Store.open(path) as store:
        for item in ITEMS:
            store.append_audit(*item[:4], ts=item[4])
    conn = sqlite3.connect(path, isolation_level=None)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("UPDATE audit_log SET actor = 'x' WHERE seq = 2")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        conn.execute("DELETE FROM audit_log WHERE seq = 5")
    with pytest.raises(sqlite3.IntegrityError, match="extend the chain"):
        conn.execute(
            "INSERT INTO audit_log VALUES (9, 1.0, 'a', 'note', '', '{}', ?, 'h')",
            (GENESIS_HASH,),
        )
    head = conn.execute("SELECT hash FROM audit_log WHERE seq = 5").fetchone()[0]
    with pytest.raises(sqlite3.IntegrityError, match="extend the chain"):
        conn.execute("INSERT INTO audit_log VALUES (6, 1.0, 'a', 'note', '', '{}', 'x', 'h')")
    conn.execute("INSERT INTO audit_log VALUES (6, 1.0, 'a', 'note', '', '{}', ?, 'h')", (head,))
    conn.close()
    with Store.open(path) as store:  # the trigger cannot check the hash; verify does
        _expect(store.verify_audit(), AuditProblem.MODIFIED, 6)


def test_hash_recipe_is_the_documented_one(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db") as store:
        row = store.append_audit("controller", "drain", "node n1", {"reason": "xid 79"}, ts=7)
    text = json.dumps(
        [1, 7.0, "controller", "drain", "node n1", '{"reason":"xid 79"}', "0" * 64],
        separators=(",", ":"),
    )
    assert row.hash == hashlib.sha256(text.encode()).hexdigest()
    assert row.ts == 7.0 and row.payload_json == '{"reason":"xid 79"}'


@pytest.mark.parametrize("ts", [0, -0.0, 1, 1.7e9, 0.1 + 0.2, 4e9])
def test_timestamps_survive_storage_exactly(tmp_path: Path, ts: float) -> None:
    with Store.open(tmp_path / "s.db") as store:
        store.append_audit("controller", "note", "", ts=ts)
        assert store.verify_audit().ok


def test_bad_audit_input(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db") as store:
        with pytest.raises(ValueError, match="actor"):
            store.append_audit("", "note", "x", ts=1.0)
        with pytest.raises(ValueError, match="kind"):
            store.append_audit("controller", "Not A Name", "x", ts=1.0)
        with pytest.raises(ValueError, match="payload"):
            store.append_audit("controller", "note", "x", {"v": float("nan")}, ts=1.0)
        with pytest.raises(ValueError, match="ts"):
            store.append_audit("controller", "note", "x", ts=-5)
        assert store.audit_head() is None


def test_verify_empty_log_and_anchor_past_the_end() -> None:
    empty = verify_chain([])
    assert empty.ok and empty.rows_checked == 0 and empty.head is None
    _expect(verify_chain([], AuditAnchor(3, "a" * 64)), AuditProblem.DELETED, 1)


def test_anchor_catches_tail_truncation_and_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store.open(path) as store:
        for item in ITEMS:
            store.append_audit(*item[:4], ts=item[4])
        anchor = store.audit_head()
        assert anchor is not None and anchor.seq == 5
        store.append_audit("controller", "note", "later", ts=9.0)  # rows after an anchor: fine
        assert store.verify_audit(anchor).ok
        with attacker(path) as conn:
            delete(conn, 6)
            delete(conn, 5)
        assert store.verify_audit().ok  # truncation is invisible to the chain alone
        _expect(store.verify_audit(anchor), AuditProblem.DELETED, 5)


def test_iter_audit_pages_through_everything(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db") as store:
        for i in range(25):
            store.append_audit("controller", "note", str(i), ts=float(i))
        assert [r.subject for r in store.iter_audit(page=4)] == [str(i) for i in range(25)]
        assert [r.seq for r in store.audit_rows(after_seq=20, limit=3)] == [21, 22, 23]


@pytest.mark.parametrize(
    "text", ["", "5", "0:" + "a" * 64, "x:" + "a" * 64, "5:" + "a" * 63, "5:" + "g" * 64]
)
def test_anchor_parse_rejects_bad_text(text: str) -> None:
    with pytest.raises(ValueError, match="anchor"):
        AuditAnchor.parse(text)


def test_anchor_round_trips_as_text() -> None:
    anchor = AuditAnchor(12, "AB" * 32)
    parsed = AuditAnchor.parse(str(anchor))
    assert parsed == AuditAnchor(12, "ab" * 32) and str(parsed) == "12:" + "ab" * 32


def test_command_line_head_and_verify(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store.open(path) as store:
        for item in ITEMS:
            store.append_audit(*item[:4], ts=item[4])

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "slurm_recovery.store", *args, "--db", str(path)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    head = run("head")
    assert head.returncode == 0
    anchor = AuditAnchor.parse(head.stdout)
    assert anchor.seq == 5
    ok = run("verify", "--anchor", str(anchor))
    assert ok.returncode == 0 and "audit chain ok: 5 rows" in ok.stdout
    with attacker(path) as conn:
        modify(conn, 3, "payload")
    broken = run("verify")
    assert broken.returncode == 1 and "seq 3 (modified)" in broken.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "slurm_recovery.store", "verify", "--db", str(tmp_path / "no")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "no such file" in missing.stderr
