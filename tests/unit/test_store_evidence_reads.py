"""Reading evidence back is cheap (no second validation or re-encoding of payloads) and can
leave out kinds no decision reads; what comes back equals what went in."""

from __future__ import annotations

from pathlib import Path

from slurm_recovery.store import Evidence, Store


def test_stored_evidence_equals_what_was_written_and_keeps_its_json(tmp_path: Path) -> None:
    written = [
        Evidence("sidecar", "sidecar_status", 100.5, "n1", None, None, {"b": [1, 2], "a": 1}),
        Evidence("hook", "job_start", 101.0, "n2", 3, None, {"nodes": ("n2",)}, job_id=7),
    ]
    with Store.open(tmp_path / "s.db") as store:
        store.add_evidence(written, received_at=102.0)
        read = [r.evidence for r in store.find_evidence()]
    assert read == written
    assert [e.payload_json for e in read] == [e.payload_json for e in written]
    assert read[0].payload_json == '{"a":1,"b":[1,2]}'
    assert read[1].payload == {"nodes": ["n2"]}


def test_find_evidence_can_skip_kinds(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.db") as store:
        store.add_evidence(
            [
                Evidence("sidecar", "sidecar_status", 100.0, "n1"),
                Evidence("sidecar", "xid", 101.0, "n1", 0, None, {"xid": 79}),
                Evidence("hook", "job_end", 102.0, "n1", job_id=9),
            ]
        )
        kinds = [r.evidence.kind for r in store.find_evidence(skip_kinds=["sidecar_status"])]
        assert kinds == ["xid", "job_end"]
        assert len(store.find_evidence(since=100.5, skip_kinds=("job_end",))) == 1
