"""A sidecar's periodic status is state, not an event (issue 29, item 1): each node's latest
status replaces the one before in ``node_reports``, and only a change of its condition is
stored as evidence, so a quiet cluster's store does not grow with nodes x time."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.contract.requests import Principal
from slurm_recovery.contract.status import status_condition
from slurm_recovery.controller.reports import LastReports
from slurm_recovery.controller.service import Controller
from slurm_recovery.controller.views import sidecar_json
from slurm_recovery.store import Evidence, NodeReport, Store, StoreError
from tests.unit.test_controller_seams import config

T0 = 1_700_000_000.0


def payload(**changes: Any) -> dict[str, Any]:
    """A real sidecar's status as it sends it (two GPUs)."""
    base: dict[str, Any] = {
        "version": "0.9.0",
        "started_at": T0 - 3600,
        "queued": 0,
        "dropped": 0,
        "dead_lettered": 0,
        "spool_bad": 0,
        "sources": {
            "kmsg": "ok",
            "host": "ok, sidecar rss 41 MiB, cpu 0.3%",
            "joblog": "ok, following 1 job(s)",
            "nvml": "ok",
        },
        "delivery": {"delivered": 120, "failures": 0, "last_error": ""},
        "fatal": 0,
        "gpus": {
            "0": {"temperature_c": 34, "power_w": 71.5, "utilization_gpu": 97, "conditions": []},
            "1": {"temperature_c": 35, "power_w": 70.0, "utilization_gpu": 96, "conditions": []},
        },
    }
    for key, value in changes.items():
        base[key] = value
    return base


def status(at: float, body: dict[str, Any], node: str = "n1") -> Evidence:
    return Evidence("sidecar", "sidecar_status", at, node=node, payload=body)


# ---------------------------------------------------------------- what a change is


readings = st.fixed_dictionaries(
    {
        "queued": st.integers(0, 10_000),
        "delivered": st.integers(0, 10**9),
        "failures": st.integers(0, 10**6),
        "rss": st.integers(1, 500),
        "cpu": st.floats(0, 100, allow_nan=False),
        "jobs": st.integers(0, 64),
        "temperature": st.integers(20, 95),
        "power": st.floats(0, 700, allow_nan=False),
        "utilization": st.integers(0, 100),
    }
)


@given(readings)
def test_readings_that_move_every_minute_are_no_change(r: dict[str, Any]):
    body = payload()
    moved = copy.deepcopy(body)
    moved["queued"] = r["queued"]
    moved["delivery"].update(delivered=r["delivered"], failures=r["failures"])
    moved["sources"]["host"] = f"ok, sidecar rss {r['rss']} MiB, cpu {r['cpu']:.1f}%"
    moved["sources"]["joblog"] = f"ok, following {r['jobs']} job(s)"
    moved["gpus"]["1"].update(
        temperature_c=r["temperature"], power_w=r["power"], utilization_gpu=r["utilization"]
    )
    assert status_condition(moved) == status_condition(body)


def test_what_a_node_is_changes_the_condition():
    base = status_condition(payload())
    failing = payload()
    failing["sources"] = {
        **failing["sources"],
        "nvml": "degraded: nvmlInit has not returned for 31 s",
    }
    later = payload()
    later["sources"] = {**later["sources"], "nvml": "degraded: nvmlInit has not returned for 91 s"}
    lost = payload()
    lost["gpus"] = {**lost["gpus"], "1": {"lost": True}}
    for changed in (
        payload(version="0.9.1"),
        payload(started_at=T0),  # restarted
        payload(dropped=3),
        payload(dead_lettered=1),
        payload(spool_bad=2),
        payload(fatal=1),
        payload(delivery={"delivered": 1, "failures": 1, "last_error": "connection refused"}),
        failing,
        lost,
        payload(gpus={"0": payload()["gpus"]["0"]}),  # a GPU gone from the readings
    ):
        assert status_condition(changed) != base, changed
    # a source still failing the same way, its numbers aside, is no change
    assert status_condition(failing) == status_condition(later)


@given(
    st.dictionaries(
        st.text(max_size=8),
        st.recursive(
            st.none() | st.integers() | st.text(max_size=8),
            lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
            max_leaves=8,
        ),
        max_size=8,
    )
)
def test_any_payload_has_a_condition(body: dict[str, Any]):
    """A newer or broken sidecar's status never fails the ingest."""
    assert isinstance(status_condition(body), dict)


# ---------------------------------------------------------------- the reports


def note(reports: LastReports, at: float, body: dict[str, Any], heard: float) -> NodeReport | None:
    """One status through the ingest thread's path, its transaction committed."""
    changes: dict[str, NodeReport] = {}
    report = reports.judge(status(at, body), status_condition(body), heard, changes)
    reports.settle(changes.values(), committed=True)
    return report


def test_only_news_is_a_change_and_the_report_is_always_current(tmp_path: Path):
    reports = LastReports()
    body = payload()
    assert note(reports, T0, body, T0 + 0.1) is not None  # the first report
    for i in range(1, 100):
        quiet = payload(queued=i)
        if i % 2:  # the HTTP thread's fast path and the ingest thread's agree
            assert reports.note_unchanged(
                status(T0 + 60 * i, quiet), status_condition(quiet), T0 + 60 * i
            )
        else:
            assert note(reports, T0 + 60 * i, quiet, T0 + 60 * i) is None
    report = reports.reports()["n1"]
    assert report.heard_at == T0 + 60 * 99 and report.observed_at == T0 + 60 * 99
    assert report.changed_at == T0 + 0.1 and report.reports == 100
    assert report.payload["queued"] == 99  # the last status in full

    dropping = payload(dropped=5)
    assert not reports.note_unchanged(
        status(T0 + 6000, dropping), status_condition(dropping), T0 + 6000
    )
    assert note(reports, T0 + 6000, dropping, T0 + 6000) is not None
    report = reports.reports("n1")["n1"]
    assert report.changed_at == T0 + 6000 and report.reports == 1
    # a backlog's older status, delivered late, neither replaces the report nor is news
    assert note(reports, T0 + 10, body, T0 + 6001) is None
    assert reports.note_unchanged(status(T0 + 11, body), status_condition(body), T0 + 6001)
    assert reports.reports()["n1"].payload["dropped"] == 5

    store = Store.open(tmp_path / "state.db")
    assert reports.flush(store) == 1
    assert store.node_reports()["n1"] == reports.reports()["n1"]
    assert reports.flush(store) == 0  # nothing new since
    assert store.node_reports(since=T0 + 7000) == {}


def test_a_change_in_flight_is_judged_on_the_ingest_thread_alone():
    """While a change waits for its transaction, the fast path answers nothing about its node
    (it would judge against the report about to be replaced); a change rolled back leaves
    the report as it was, so the sender's retry is a change again and is stored."""
    reports = LastReports()
    body = payload()
    note(reports, T0, body, T0)
    failing = payload(dropped=1)
    changes: dict[str, NodeReport] = {}
    assert reports.judge(status(T0 + 10, failing), status_condition(failing), T0 + 10, changes)
    assert not reports.note_unchanged(status(T0 + 11, body), status_condition(body), T0 + 11)
    # a second status of the node in the same transaction is judged against the first
    assert (
        reports.judge(status(T0 + 12, failing), status_condition(failing), T0 + 12, changes) is None
    )
    assert changes["n1"].reports == 2
    reports.settle(changes.values(), committed=False)
    assert reports.reports()["n1"].condition == status_condition(body)
    assert not reports.note_unchanged(status(T0 + 20, failing), status_condition(failing), T0 + 20)
    assert note(reports, T0 + 20, failing, T0 + 20) is not None
    assert reports.note_unchanged(status(T0 + 30, failing), status_condition(failing), T0 + 30)


def test_a_report_not_written_is_written_by_the_next_flush(tmp_path: Path):
    reports = LastReports()
    note(reports, T0, payload(), T0)
    store = Store.open(tmp_path / "state.db")
    store.close()
    with pytest.raises(StoreError):
        reports.flush(store)
    store = Store.open(tmp_path / "state.db")
    assert reports.flush(store) == 1 and "n1" in store.node_reports()


def test_a_flush_in_chunks_writes_each_report_once_and_a_failed_chunk_again(tmp_path: Path):
    """The controller writes 10,000 reports a chunk at a time (requests queued for the ingest
    thread go between chunks): every report is written, none twice, and a chunk the store
    refused is written by a later one."""
    reports = LastReports()
    for i in range(25):
        changes: dict[str, NodeReport] = {}
        reports.judge(status(T0, payload(), node=f"n{i}"), status_condition(payload()), T0, changes)
        reports.settle(changes.values(), committed=True)
    closed = Store.open(tmp_path / "state.db")
    closed.close()
    with pytest.raises(StoreError):
        reports.flush(closed, 10)
    store = Store.open(tmp_path / "state.db")
    assert [reports.flush(store, 10) for _ in range(4)] == [10, 10, 5, 0]
    assert sorted(store.node_reports()) == sorted(f"n{i}" for i in range(25))
    assert store.node_reports() == reports.reports()


def test_a_restarted_controller_knows_the_reports_and_counts_silence_from_its_start(
    tmp_path: Path,
):
    store = Store.open(tmp_path / "state.db")
    before = LastReports()
    note(before, T0, payload(), T0)
    before.flush(store)
    reports = LastReports()
    reports.seed(store, T0 + 600)
    assert reports.snapshot() == {"n1": T0 + 600}
    # the condition it held is the one a quiet status is judged against: no news
    assert reports.note_unchanged(
        status(T0 + 610, payload()), status_condition(payload()), T0 + 610
    )
    # a report older than a day says nothing of a sidecar now: known, but not as heard
    reports = LastReports()
    reports.seed(store, T0 + 2 * 86400)
    assert reports.snapshot() == {} and "n1" in reports.reports()


def ingest(controller: Controller, principal: Principal, evidence: list[Evidence]) -> Any:
    """Through the controller's ingest step, as a checked request reaches it."""
    (result,) = controller._ingest_many([(None, b"", (principal, evidence))])  # type: ignore[list-item]
    if isinstance(result, Exception):
        raise result
    return result[0]


def test_the_ingest_stores_a_quiet_sidecars_status_once(tmp_path: Path):
    controller = Controller(config(tmp_path))
    sidecar = Principal(uid=0, gid=0, origin="127.0.0.1", role="sidecar", node="n1")
    store = controller.ingest.store()
    assert len(ingest(controller, sidecar, [status(T0, payload())])) == 1
    for i in range(1, 30):
        quiet = [status(T0 + 10 * i, payload(queued=i))]
        assert ingest(controller, sidecar, quiet) == []
    xid = Evidence("sidecar", "xid", T0 + 300, node="n1", gpu=0, payload={"xid": 79})
    mixed = ingest(controller, sidecar, [status(T0 + 310, payload()), xid])
    assert len(mixed) == 1  # the XID; the status is no news
    kinds = [r.evidence.kind for r in store.find_evidence()]
    assert kinds == ["sidecar_status", "xid"]
    assert controller.reports.reports()["n1"].reports == 31
    assert store.node_reports()["n1"].reports == 1  # written with its change; the rest later
    # an operator's status (insecure development setups) is evidence as before
    operator = Principal(uid=0, gid=0, origin="127.0.0.1", role="operator", node=None)
    assert len(ingest(controller, operator, [status(T0 + 320, payload())])) == 1


def test_a_change_whose_evidence_is_not_stored_is_a_change_again(tmp_path: Path, monkeypatch):
    """The store refuses the status that changed the condition (a full disk): the sender is
    told so (it keeps the status and sends it again), and the retry is stored, not taken
    for a status that changes nothing."""
    controller = Controller(config(tmp_path))
    sidecar = Principal(uid=0, gid=0, origin="127.0.0.1", role="sidecar", node="n1")
    store = controller.ingest.store()
    ingest(controller, sidecar, [status(T0, payload())])
    real = store.add_evidence

    def full(*args: Any, **kwargs: Any) -> Any:
        raise StoreError("database or disk is full")

    monkeypatch.setattr(store, "add_evidence", full)
    with pytest.raises(StoreError):
        ingest(controller, sidecar, [status(T0 + 10, payload(dropped=2))])
    assert store.node_reports()["n1"].condition == status_condition(payload())
    monkeypatch.setattr(store, "add_evidence", real)
    assert len(ingest(controller, sidecar, [status(T0 + 20, payload(dropped=2))])) == 1
    assert store.node_reports()["n1"].condition == status_condition(payload(dropped=2))


def report_of(body: dict[str, Any], heard: float, changed: float, reports: int) -> NodeReport:
    return NodeReport(
        "n1", heard, heard, changed, reports, status_condition(body), json.dumps(body)
    )


def test_the_node_view_says_when_the_sidecar_last_reported_and_changed():
    body = payload()
    body["sources"] = {**body["sources"], "ib": "mlx5_0 port 1: counters unreadable"}
    shown = sidecar_json(report_of(body, T0 + 60, T0, 2), now=T0 + 75)
    assert shown["silent_for"] == 15.0 and shown["reports_since_change"] == 2
    assert shown["problems"] == {"ib": "mlx5_0 port 1: counters unreadable"}
    assert shown["last_change"].startswith("2023-11-14T22:13:20")


def test_the_node_view_of_an_oddly_shaped_status_is_no_crash():
    """A newer or broken sidecar's status: the condition reads it (above), and so does the
    view that srecovery nodes shows."""
    odd = payload(delivery="failing", sources=["kmsg"])
    shown = sidecar_json(report_of(odd, T0, T0, 1), now=T0 + 1)
    assert shown["delivery_error"] == "" and shown["problems"] == {}
