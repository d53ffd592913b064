"""decide/silence.py and controller/reports.py: a node whose sidecar stops reporting while the
node runs a job becomes one weak finding about the node, and nothing more."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.controller.reports import LastReports, record_silences
from slurm_recovery.decide.attribute import SIDECAR_SILENT, attribute
from slurm_recovery.decide.model import ClusterView, Evidence, FaultClass, Incident, IncidentKind
from slurm_recovery.decide.policy import Policy
from slurm_recovery.decide.silence import KIND, Silence, jobs_by_node, new_silences
from slurm_recovery.scheduler.base import Job
from slurm_recovery.signals.xid import load_xid_catalogue
from slurm_recovery.store import Evidence as StoredEvidence
from slurm_recovery.store import Store
from tests.unit.test_decide_attribute import job as attribute_job
from tests.unit.test_decide_attribute import log

GRACE = 30.0


def job(job_id: int, nodes: tuple[str, ...], state: str = "RUNNING", **kw) -> Job:
    return attribute_job(state, nodes, job_id=job_id, **kw)


def test_only_nodes_running_a_job_and_quiet_past_the_grace_are_silent() -> None:
    running = jobs_by_node([job(5, ("n1", "n2")), job(6, ("n2",)), job(7, ("n3",), "PENDING")])
    assert running == {"n1": (5,), "n2": (5, 6)}
    heard = {"n1": 100.0, "n2": 171.0, "n3": 0.0, "n4": 0.0}
    assert new_silences(heard, running, {}, now=200.0, grace=GRACE) == [
        Silence("n1", 100.0, 100.0, (5,))
    ]
    # n2 quiet exactly the grace: not yet; just past it: silent. n3 (pending) and n4 run nothing
    assert [s.node for s in new_silences(heard, running, {}, now=201.0, grace=GRACE)] == ["n1"]
    assert new_silences(heard, running, {}, now=201.5, grace=GRACE) == [
        Silence("n1", 100.0, 101.5, (5,)),
        Silence("n2", 171.0, 30.5, (5, 6)),
    ]


def test_a_silence_is_recorded_once_and_a_new_one_after_the_node_is_heard_again() -> None:
    running = {"n1": (5,)}
    first = new_silences({"n1": 100.0}, running, {}, now=200.0, grace=GRACE)
    assert [s.node for s in first] == ["n1"]
    recorded = {"n1": 100.0}
    assert new_silences({"n1": 100.0}, running, recorded, now=300.0, grace=GRACE) == []
    again = new_silences({"n1": 250.0}, running, recorded, now=300.0, grace=GRACE)
    assert [(s.node, s.last_report) for s in again] == [("n1", 250.0)]


def test_a_node_never_heard_from_is_not_judged_and_grace_zero_is_off() -> None:
    running = {"n1": (5,), "n2": (5,)}
    assert [s.node for s in new_silences({"n2": 0.0}, running, {}, 100.0, GRACE)] == ["n2"]
    assert new_silences({"n1": 0.0, "n2": 0.0}, running, {}, 100.0, 0.0) == []


@given(
    heard=st.dictionaries(st.sampled_from(["n1", "n2", "n3", "n4"]), st.floats(0, 1000)),
    running=st.dictionaries(
        st.sampled_from(["n1", "n2", "n3", "n5"]), st.tuples(st.integers(1, 9)), max_size=4
    ),
    now=st.floats(0, 2000),
    grace=st.floats(0.1, 500),
)
def test_every_silence_runs_a_job_past_the_grace_and_is_sorted(heard, running, now, grace) -> None:
    found = new_silences(heard, running, {}, now, grace)
    assert [s.node for s in found] == sorted(s.node for s in found)
    for s in found:
        assert s.node in running and s.jobs == running[s.node]
        assert s.last_report == heard[s.node] and s.silent_for > grace
    quiet = {n for n in running if n in heard and now - heard[n] > grace}
    assert {s.node for s in found} == quiet


def test_a_silence_is_weak_system_evidence_against_its_node_and_never_drains() -> None:
    """The job crashed; the only evidence is n2's silence: system, not decisive, 0.5, n2
    implicated (excluded from the restart), below any drain threshold. An application line in
    the job's log wins over it."""
    crashed = job(42, ("n1", "n2"), "FAILED", end_time=10_000)
    incident = Incident(42, 0, 100, IncidentKind.CRASH, 10_000.0)
    silent = Evidence(
        7,
        "controller",
        KIND,
        9_900.0,
        node="n2",
        payload={"last_report": 9_700.0, "silent_for": 200.0, "grace": 180.0, "jobs": [42]},
    )
    policy = Policy()
    verdict = attribute(incident, crashed, [silent], load_xid_catalogue(), policy)
    assert verdict.fault_class is FaultClass.SYSTEM
    assert verdict.nodes == frozenset({"n2"}) and verdict.evidence_ids == (7,)
    assert verdict.confidence == SIDECAR_SILENT
    assert policy.for_class(FaultClass.SYSTEM).drain_min_confidence > SIDECAR_SILENT
    assert "n2's sidecar sent nothing for 200s" in verdict.cause
    app = log(8, "application", node="n1", at=9_990.0)
    verdict = attribute(incident, crashed, [silent, app], load_xid_catalogue(), policy)
    assert verdict.fault_class is FaultClass.APPLICATION and not verdict.nodes
    # another node's silence is not this job's evidence
    elsewhere = Evidence(9, "controller", KIND, 9_900.0, node="n9", payload={"silent_for": 1})
    verdict = attribute(incident, crashed, [elsewhere], load_xid_catalogue(), policy)
    assert verdict.fault_class is FaultClass.UNKNOWN


def view(now: float, jobs: list[Job]) -> ClusterView:
    return ClusterView(now=now, jobs={j.job_id: j for j in jobs}, nodes={})


def test_the_loop_stores_one_finding_per_silence_and_a_restart_starts_from_the_store(
    tmp_path,
) -> None:
    store = Store.open(tmp_path / "s.db")
    store.add_evidence(
        [
            StoredEvidence("sidecar", "sidecar_status", 1_000.0, node="n1"),
            StoredEvidence("sidecar", "sidecar_status", 1_010.0, node="n1"),
            StoredEvidence("sidecar", "sidecar_status", 1_005.0, node="n2"),
            StoredEvidence("sidecar", "xid", 1_050.0, node="n2", payload={"xid": 79}),
        ],
        received_at=1_060.0,
    )
    reports = LastReports()
    # a start long after the last statuses (an outage): heard as of the start, not flagged
    reports.seed(store, now=1_080.0)
    assert reports.snapshot() == {"n1": 1_080.0, "n2": 1_080.0}
    recorded: dict[str, float] = {}
    running = [job(5, ("n1", "n2"))]
    assert record_silences(store, view(1_081.0, running), reports, recorded, GRACE) == []
    reports.heard("n2", 1_100.0)
    reports.heard("n2", 1_090.0)  # late: never moves the time back
    stored = record_silences(store, view(1_120.0, running), reports, recorded, GRACE)
    assert [(e.node, e.kind, e.source) for e in stored] == [("n1", KIND, "controller")]
    assert stored[0].payload["jobs"] == [5] and stored[0].payload["last_report"] == 1_080.0
    assert record_silences(store, view(1_200.0, running), reports, recorded, GRACE) != []
    assert [
        e.node for e in record_silences(store, view(1_201.0, running), reports, recorded, GRACE)
    ] == []
    found = store.evidence_by_kinds((KIND,), any_node=True)
    assert [r.evidence.node for r in found] == ["n1", "n2"]


def test_reports_from_many_threads_keep_the_latest_time() -> None:
    reports = LastReports()

    def note(base: float) -> None:
        for i in range(2_000):
            reports.heard(f"n{i % 10}", base + i)

    threads = [threading.Thread(target=note, args=(b,)) for b in (0.0, 5_000.0, 2_500.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert reports.snapshot() == {f"n{k}": 5_000.0 + 1_990 + k for k in range(10)}
