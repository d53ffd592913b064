"""What one pass of the loop reads (issue 19: cost that follows change): the evidence window
read incrementally equals a full read, a pass may reuse a node listing under a second old,
and a drain looks at its node as Slurm shows it now, not as a reused listing did."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_recovery.controller.loop import (
    EVIDENCE_HORIZON,
    EvidenceWindow,
    Reconciler,
    core_evidence,
)
from slurm_recovery.controller.service import wakes_the_loop
from slurm_recovery.decide.model import Mode
from slurm_recovery.store import Evidence, Store
from tests.fakeslurm import FakeSlurm
from tests.unit.test_replay import CATALOGUE, NOW, WIDE, job, nodes, xid


class CountingSlurm(FakeSlurm):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.node_listings = 0

    def list_nodes(self):
        self.node_listings += 1
        return super().list_nodes()


def reconciler(store: Store, slurm: FakeSlurm, clock: list[float]) -> Reconciler:
    return Reconciler(
        store=store,
        scheduler=slurm,
        policy=dataclasses.replace(WIDE, mode=Mode.ACT),
        catalogue=CATALOGUE,
        cluster="c1",
        hold_deadline=120.0,
        clock=lambda: clock[0],
    )


# each batch: (seconds the clock moves on, [(observed this long before now, kind)])
batches = st.lists(
    st.tuples(
        st.floats(0, 2 * EVIDENCE_HORIZON),
        st.lists(
            st.tuples(
                st.floats(-60, 2 * EVIDENCE_HORIZON),
                st.sampled_from(["xid", "job_end", "sidecar_status", "progress"]),
            ),
            max_size=6,
        ),
    ),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches)
def test_the_evidence_window_read_incrementally_is_the_full_read(tmp_path_factory, steps):
    """Rows arriving late (observed long before they were stored), rows ageing out, the
    status heartbeats left out: pass after pass, the window holds what one query would."""
    store = Store.open(tmp_path_factory.mktemp("window") / "state.db")
    window, now = EvidenceWindow(), NOW
    for advance, rows in steps:
        now += advance
        if rows:
            store.add_evidence(
                [Evidence("sidecar", kind, now - ago, node="n1") for ago, kind in rows],
                received_at=now,
            )
        full = store.find_evidence(
            since=now - EVIDENCE_HORIZON, limit=1_000_000, skip_kinds=("sidecar_status",)
        )
        assert window.read(store, now) == [core_evidence(r) for r in full]


def test_a_pass_reuses_a_node_listing_under_a_second_old(tmp_path: Path, monkeypatch):
    store = Store.open(tmp_path / "state.db")
    slurm = CountingSlurm([job(nodes=("n1", "n2"))], nodes())
    clock, mono = [NOW], [100.0]
    monkeypatch.setattr("slurm_recovery.controller.loop.time.monotonic", lambda: mono[0])
    loop = reconciler(store, slurm, clock)
    loop.tick(reuse_nodes=True)
    loop.tick()  # a plain tick always reads
    assert (slurm.node_listings, loop.node_reads) == (2, 2)
    mono[0] += 0.5
    loop.tick(reuse_nodes=True)
    assert (slurm.node_listings, loop.node_reads, loop.passes) == (2, 2, 3)
    mono[0] += 0.6  # 1.1 s after the last read
    loop.tick(reuse_nodes=True)
    assert slurm.node_listings == 3


def test_a_drain_reads_its_node_first_and_keeps_an_operators_drain(tmp_path: Path, monkeypatch):
    """The listing a pass reused says n2 is in service; an operator drained it since. The
    tool's drain step reads n2, sees the operator's drain, and leaves its reason alone."""
    store = Store.open(tmp_path / "state.db")
    slurm = CountingSlurm([job(nodes=("n1", "n2"))], nodes())
    clock, mono = [NOW], [100.0]
    monkeypatch.setattr("slurm_recovery.controller.loop.time.monotonic", lambda: mono[0])
    loop = reconciler(store, slurm, clock)
    loop.tick(reuse_nodes=True)  # reads the nodes: all in service
    slurm.nodes["n2"] = dataclasses.replace(
        slurm.nodes["n2"], flags=frozenset({"DRAIN"}), reason="dimm swap (ops)"
    )
    store.add_evidence([xid(79, node="n2", at=NOW - 1)], received_at=NOW)
    mono[0] += 0.2
    loop.tick(reuse_nodes=True)  # the reused listing still shows n2 in service
    assert slurm.node_listings == 1
    assert slurm.nodes["n2"].reason == "dimm swap (ops)"
    (incident,) = store.list_incidents()
    assert store.latest_advice(incident.id).verdict["drain"] == ["n2"]  # from the old listing
    assert [a.step for a in store.actions()] == ["mark", "requeue_hold", "exclude", "begin_now"]
    assert "drain_node" not in [step for step, _ in slurm.steps]


def test_what_wakes_a_pass_at_once():
    """A failed job's end, an XID, a report wake the loop; a clean end, a start, a status
    wait for the next regular pass (at 100 job events a second, each woke a pass: 50 squeue
    calls a second in bench/controller_scale.py)."""

    def end(**codes) -> Evidence:
        return Evidence("hook", "job_end", NOW, node="n1", job_id=7, payload=codes)

    clean = {"exit_code": 0, "signal": 0, "derived_exit_code": 0, "derived_signal": 0}
    assert not wakes_the_loop(end(**clean))
    assert not wakes_the_loop(end(exit_code=0, signal=0))  # 22.05 epilogs: no derived codes
    assert wakes_the_loop(end(**{**clean, "exit_code": 1}))
    assert wakes_the_loop(end(**{**clean, "signal": 9}))
    assert wakes_the_loop(end(**{**clean, "derived_exit_code": 2}))
    assert wakes_the_loop(end(exit_code=None, signal=None))  # codes not known
    assert wakes_the_loop(xid(79))
    for kind in ("job_start", "sidecar_status", "progress"):
        assert not wakes_the_loop(Evidence("sidecar", kind, NOW, node="n1"))
