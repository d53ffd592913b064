"""What one pass of the loop reads (issue 19: cost that follows change): the evidence window
read incrementally equals a full read, the node listing comes from its own thread and is never
used stale, a drain looks at its node as Slurm shows it now, and what wakes a pass."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_recovery.controller.loop import (
    EVIDENCE_HORIZON,
    EvidenceWindow,
    core_evidence,
)
from slurm_recovery.controller.nodelisting import NodeListing
from slurm_recovery.controller.service import wakes_the_loop
from slurm_recovery.scheduler.base import Unreachable
from slurm_recovery.store import Evidence, Store
from tests.conftest import wait_for
from tests.fakeslurm import FakeSlurm
from tests.unit.test_loop_faults import reconciler
from tests.unit.test_replay import NOW, job, nodes, xid


class CountingSlurm(FakeSlurm):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.node_listings = 0
        self.down: Unreachable | None = None  # raised by every read while set

    def list_nodes(self):
        self.node_listings += 1
        if self.down:
            raise self.down
        return super().list_nodes()

    def list_jobs(self):
        if self.down:
            raise self.down
        return super().list_jobs()


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


def test_the_node_listing_is_read_by_its_thread_and_never_used_stale(tmp_path: Path):
    slurm = CountingSlurm([job(nodes=("n1", "n2"))], nodes())
    mono = [100.0]
    listing = NodeListing(slurm.list_nodes, every=1.0, max_age=5.0, clock=lambda: mono[0])
    assert sorted(listing.nodes()) == [f"n{i}" for i in range(1, 9)]  # the first read: now
    assert (slurm.node_listings, listing.reads) == (1, 1)
    loop = reconciler(Store.open(tmp_path / "state.db"), slurm, [NOW], listing=listing)
    loop.tick()
    loop.tick()
    assert slurm.node_listings == 1 and loop.passes == 2  # the passes took the listing
    slurm.down = Unreachable("slurmctld down")
    mono[0] += 4.0
    listing.refresh()  # fails: the listing read 4 s ago is still used
    assert listing.nodes() and listing.reads == 1
    mono[0] += 2.0  # 6 s old: not used; the pass gets Slurm's error and acts on nothing
    with pytest.raises(Unreachable, match="slurmctld down"):
        listing.nodes()
    slurm.down = None  # the jobs read again, the nodes not: the pass still acts on nothing
    loop.tick()
    assert "slurmctld down" in loop.last_error
    listing.refresh()
    assert listing.nodes() and listing.reads == 2


def test_a_node_read_afresh_is_not_undone_by_a_listing_that_began_before():
    """The tool drains n2 and reads it back while a listing (begun before the drain) is on
    its way: that listing must not show n2 in service again; the next one shows Slurm."""
    slurm = CountingSlurm([], nodes())
    mono = [100.0]
    listing = NodeListing(slurm.list_nodes, clock=lambda: mono[0])
    listing.refresh()
    drained = dataclasses.replace(slurm.nodes["n2"], flags=frozenset({"DRAIN"}), reason="x")
    old_read = slurm.list_nodes  # a listing that began before the drain...

    def slow_read():
        result = old_read()
        mono[0] += 0.5
        slurm.nodes["n2"] = drained  # ...the drain happens while it is read
        listing.update(drained)
        return result

    listing._read = slow_read
    mono[0] += 1.0
    listing.refresh()
    assert listing.nodes()["n2"] is drained
    listing._read = slurm.list_nodes
    mono[0] += 1.0
    listing.refresh()  # began after the update: Slurm's word again, whatever it is
    slurm.nodes["n2"] = dataclasses.replace(drained, flags=frozenset(), reason="")
    mono[0] += 1.0
    listing.refresh()
    assert not listing.nodes()["n2"].drained


def test_the_tools_drain_shows_in_the_next_pass_with_a_listing_a_second_old(tmp_path: Path):
    """The blast radius and the tool's own drains read the listing: one read before the
    drain must not make the drain look undone (or let a second node be drained past the
    cap)."""
    store = Store.open(tmp_path / "state.db")
    slurm = CountingSlurm([job(nodes=("n1", "n2"))], nodes())
    listing = NodeListing(slurm.list_nodes)
    loop = reconciler(store, slurm, [NOW], listing=listing)
    loop.tick()
    store.add_evidence([xid(79, node="n2", at=NOW - 1)], received_at=NOW)
    loop.tick()  # drains n2 (read fresh before and after), requeues the job
    assert slurm.nodes["n2"].drained and slurm.node_listings == 1
    loop.tick()  # the listing was read before the drain
    state = store.get_node("n2")
    assert state is not None and state.drained_by_tool
    assert loop.last_view is not None and loop.last_view.drained_by_tool.keys() == {"n2"}
    assert not [r for r in store.audit_rows(limit=100) if r.kind == "slurm_change"]


def test_the_listing_thread_reads_every_interval():
    slurm = CountingSlurm([], nodes())
    listing = NodeListing(slurm.list_nodes, every=0.05)
    listing.start()
    try:
        wait_for(lambda: listing.reads >= 3, timeout=10, interval=0.01)
    finally:
        listing.stop()
    reads = listing.reads
    time.sleep(0.2)
    assert listing.reads == reads  # stopped


def test_a_drain_reads_its_node_first_and_keeps_an_operators_drain(tmp_path: Path):
    """The listing (a second old) says n2 is in service; an operator drained it since. The
    tool's drain step reads n2, sees the operator's drain, and leaves its reason alone."""
    store = Store.open(tmp_path / "state.db")
    slurm = CountingSlurm([job(nodes=("n1", "n2"))], nodes())
    listing = NodeListing(slurm.list_nodes)
    loop = reconciler(store, slurm, [NOW], listing=listing)
    loop.tick()  # the listing: all in service
    slurm.nodes["n2"] = dataclasses.replace(
        slurm.nodes["n2"], flags=frozenset({"DRAIN"}), reason="dimm swap (ops)"
    )
    store.add_evidence([xid(79, node="n2", at=NOW - 1)], received_at=NOW)
    loop.tick()  # the listing still shows n2 in service
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


@pytest.mark.parametrize("stale", [{"n8": "maintenance"}, {}])
def test_a_job_too_big_for_a_stale_listing_is_judged_on_a_fresh_one(tmp_path: Path, stale):
    """The listing a pass takes may be a loop interval old. A job spanning seven of the eight
    nodes loses n2 to an XID: whether the rest can take it turns on n8, which an operator
    resumed after the listing was read. With unplaceable = "stop", that stale listing would
    cancel a job that can run: the loop reads the listing afresh before it advises so.
    (``stale = {}``: n8 was in service all along; the fresh read changes nothing.)"""
    slurm = CountingSlurm([job(nodes=tuple(f"n{i}" for i in range(1, 8)))], nodes(stale))
    mono = [100.0]
    listing = NodeListing(slurm.list_nodes, every=1.0, max_age=5.0, clock=lambda: mono[0])
    listing.refresh()
    slurm.nodes["n8"] = dataclasses.replace(slurm.nodes["n8"], flags=frozenset(), reason="")
    mono[0] += 0.5  # the operator's resume, half a second after the listing was read
    store = Store.open(tmp_path / "state.db")
    store.add_evidence([xid(79, node="n2", at=NOW - 20)], received_at=NOW - 19)
    loop = reconciler(store, slurm, [NOW], listing=listing)
    loop.base_policy = loop.policy = dataclasses.replace(loop.policy, unplaceable="stop")
    loop.tick()
    (incident,) = store.list_incidents()
    advice = store.latest_advice(incident.id)
    assert advice is not None
    assert advice.decision == "requeue_exclude", advice.reason
    assert "n8" not in advice.reason and "usable" not in advice.reason
    assert listing.reads == (2 if stale else 1)  # read afresh only when it said "unplaceable"
