"""The audit chain: how each audit row is hashed, and the walk that finds the first row that
was modified, inserted or deleted (pure functions; the store feeds them rows).

Row hash = sha256 over the compact JSON array
``[seq, ts, actor, kind, subject, payload, prev_hash]`` (``payload`` is the row's canonical JSON
text, ``ts`` a float, ASCII-escaped JSON); ``prev_hash`` is the previous row's hash, or 64 zeros
for row 1. See docs/store.md for what the chain can and cannot prove.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

GENESIS_HASH = "0" * 64


def row_hash(
    seq: object,
    ts: object,
    actor: object,
    kind: object,
    subject: object,
    payload: object,
    prev_hash: object,
) -> str | None:
    """The hash a row with these stored values must carry; ``None`` if a value could not have
    been written by the store (e.g. a BLOB put there by hand), which never matches."""
    try:
        text = json.dumps(
            [seq, ts, actor, kind, subject, payload, prev_hash],
            separators=(",", ":"),
            allow_nan=False,
        )
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode("ascii")).hexdigest()


@dataclass(frozen=True)
class AuditRow:
    """One audit record as stored. ``payload_json`` is the exact hashed text."""

    seq: int
    ts: float
    actor: str
    kind: str
    subject: str
    payload_json: str
    prev_hash: str
    hash: str

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.payload_json)

    def expected_hash(self) -> str | None:
        return row_hash(
            self.seq,
            self.ts,
            self.actor,
            self.kind,
            self.subject,
            self.payload_json,
            self.prev_hash,
        )

    @property
    def anchor(self) -> AuditAnchor:
        return AuditAnchor(self.seq, self.hash)


@dataclass(frozen=True)
class AuditAnchor:
    """A row's (seq, hash) kept outside the database, written ``SEQ:HASH``.

    Rows up to an anchor cannot be removed or rewritten without :func:`verify_chain` noticing,
    even at the tail of the log, where the chain alone cannot tell a truncated log from a short
    one.
    """

    seq: int
    hash: str

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash}"

    @classmethod
    def parse(cls, text: str) -> AuditAnchor:
        seq, sep, digest = text.strip().partition(":")
        if not sep or not seq.isdigit() or int(seq) < 1 or len(digest) != 64:
            raise ValueError(f"audit anchor must look like SEQ:HASH (64 hex digits), got {text!r}")
        try:
            int(digest, 16)
        except ValueError:
            raise ValueError(f"audit anchor hash must be hexadecimal, got {digest!r}") from None
        return cls(int(seq), digest.lower())


class AuditProblem(enum.Enum):
    MODIFIED = "modified"  # a row's content no longer matches its hash
    DELETED = "deleted"  # a row is missing: a gap in seq, or the chain ends before the anchor
    INSERTED = "inserted"  # an extra row that does not belong between its neighbours


@dataclass(frozen=True)
class AuditVerification:
    """Result of walking the chain. ``rows_checked`` counts rows that verified before the first
    problem (all of them when ``ok``); ``head`` is the last of those rows as an anchor."""

    ok: bool
    rows_checked: int
    first_bad_seq: int | None = None
    problem: AuditProblem | None = None
    detail: str = ""
    head: AuditAnchor | None = None

    def __str__(self) -> str:
        if self.ok:
            return f"audit chain ok: {self.rows_checked} rows, head {self.head}"
        assert self.problem is not None
        return (
            f"audit chain broken at seq {self.first_bad_seq} ({self.problem.value}): "
            f"{self.detail}; {self.rows_checked} rows verified before it"
        )


def verify_chain(rows: Iterable[AuditRow], anchor: AuditAnchor | None = None) -> AuditVerification:
    """Walk ``rows`` (in seq order) and name the first modified, inserted or deleted row.

    Decisions, in order, for each row given the last good row before it and the row after it:

    1. the row after it links straight to the last good row: this row was *inserted*;
    2. its seq skips ahead and its ``prev_hash`` is not the last good row's hash: the rows in
       between were *deleted*;
    3. its content does not match its hash: *modified*;
    4. it is self-consistent but does not link to the last good row: that row was *modified*
       and rehashed (its successor or the anchor still vouches for this row); or, for the last
       row of the log, beyond any anchor, this row was *inserted*;
    5. it sits at the anchor's seq with another hash: rows up to here were rewritten (*modified*).

    After the walk, a log that ends before the anchor lost its tail (*deleted*).
    """
    it = iter(rows)
    prev: AuditRow | None = None  # the last row that verified
    before_prev: AuditAnchor | None = None  # the one before it
    checked = 0

    def bad(seq: int, problem: AuditProblem, detail: str) -> AuditVerification:
        if prev is not None and seq == prev.seq:  # the last "good" row turned out rewritten
            return AuditVerification(False, checked - 1, seq, problem, detail, before_prev)
        head = prev.anchor if prev else None
        return AuditVerification(False, checked, seq, problem, detail, head)

    row = next(it, None)
    while row is not None:
        after = next(it, None)
        expected_seq = prev.seq + 1 if prev else 1
        link = prev.hash if prev else GENESIS_HASH
        if row.seq < expected_seq or (after is not None and after.prev_hash == link):
            return bad(row.seq, AuditProblem.INSERTED, "the next row links past it")
        if row.seq > expected_seq:
            if row.prev_hash != link:
                last = row.seq - 1
                span = f"rows {expected_seq}-{last}" if last > expected_seq else f"row {last}"
                return bad(expected_seq, AuditProblem.DELETED, f"{span} missing before {row.seq}")
            return bad(row.seq, AuditProblem.MODIFIED, f"seq changed (expected {expected_seq})")
        if row.expected_hash() != row.hash:
            return bad(row.seq, AuditProblem.MODIFIED, "content does not match its hash")
        if row.prev_hash != link:
            if prev is None:
                return bad(row.seq, AuditProblem.MODIFIED, "first row does not start the chain")
            if after is not None or (anchor is not None and anchor.seq >= row.seq):
                return bad(
                    prev.seq,
                    AuditProblem.MODIFIED,
                    f"rewritten: its hash is not the one row {row.seq} recorded",
                )
            return bad(row.seq, AuditProblem.INSERTED, f"last row does not link to row {prev.seq}")
        if anchor is not None and row.seq == anchor.seq and row.hash != anchor.hash:
            return bad(row.seq, AuditProblem.MODIFIED, "hash differs from the anchor")
        checked += 1
        before_prev = prev.anchor if prev else None
        prev = row
        row = after
    if anchor is not None and (prev is None or prev.seq < anchor.seq):
        missing = prev.seq + 1 if prev else 1
        return bad(missing, AuditProblem.DELETED, f"log ends before the anchor at seq {anchor.seq}")
    return AuditVerification(True, checked, head=prev.anchor if prev else None)
