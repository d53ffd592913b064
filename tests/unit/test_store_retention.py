"""Retention (store.retention): routine evidence older than the window is deleted in batches;
evidence an advice rests on, other kinds, recent rows and the audit chain are kept."""

from __future__ import annotations

from slurm_recovery.store import Evidence, JobAttempt, Store
from slurm_recovery.store.store import ROUTINE_EVIDENCE

NOW = 1_800_000_000.0
DAY = 86400.0


def ev(kind: str, at: float, node: str = "n1") -> Evidence:
    return Evidence("sidecar", kind, at, node=node, payload={"k": kind})


def kinds_left(store: Store) -> list[tuple[str, float]]:
    return sorted((r.evidence.kind, r.evidence.observed_at) for r in store.find_evidence())


def test_old_routine_evidence_goes_and_everything_else_stays(tmp_path):
    store = Store.open(tmp_path / "state.db")
    old, recent = NOW - 40 * DAY, NOW - DAY
    store.add_evidence([ev(kind, old) for kind in ROUTINE_EVIDENCE], received_at=old)
    store.add_evidence([ev("xid", old), ev("gpu_finding", old), ev("job_end", old)])
    store.add_evidence([ev(kind, recent) for kind in ROUTINE_EVIDENCE], received_at=recent)
    [kept_for_advice] = store.add_evidence([ev("progress", old - 1)])
    attempt = store.resolve_attempt(JobAttempt("c1", 7, int(old) - 100, 0), seen_at=old)
    incident = store.open_incident(attempt.id, "hang", opened_at=old)
    store.add_advice(incident.id, decision="requeue", reason="hung", evidence_ids=[kept_for_advice])
    store.append_audit("controller", "note", "x", {"before": True})

    assert store.prune_evidence(NOW - 30 * DAY) == len(ROUTINE_EVIDENCE)
    assert kinds_left(store) == sorted(
        [("progress", old - 1), ("xid", old), ("gpu_finding", old), ("job_end", old)]
        + [(kind, recent) for kind in ROUTINE_EVIDENCE]
    )
    assert store.prune_evidence(NOW - 30 * DAY) == 0  # nothing more to do
    assert store.verify_audit().ok


def test_a_backlog_goes_in_batches(tmp_path):
    store = Store.open(tmp_path / "state.db")
    store.add_evidence([ev("sidecar_status", NOW - 40 * DAY + i) for i in range(25)])
    assert [store.prune_evidence(NOW, batch=10) for _ in range(4)] == [10, 10, 5, 0]
    assert kinds_left(store) == []
