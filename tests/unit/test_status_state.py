"""A sidecar's periodic status is state, not an event (issue 29, item 1): each node's latest
status replaces the one before in ``node_reports``, and only a change of its condition is
stored as evidence, so a quiet cluster's store does not grow with nodes x time."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.contract.requests import Principal
from slurm_recovery.controller.reports import LastReports, status_condition
from slurm_recovery.controller.service import Controller
from slurm_recovery.controller.views import sidecar_json
from slurm_recovery.store import Evidence, Store
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


# ---------------------------------------------------------------- the store


def test_only_news_is_stored_and_the_report_is_always_current(tmp_path: Path):
    store = Store.open(tmp_path / "state.db")
    body = payload()
    assert store.note_status(status(T0, body), status_condition(body), T0 + 0.1)
    for i in range(1, 100):
        quiet = payload(queued=i)
        assert not store.note_status(
            status(T0 + 60 * i, quiet), status_condition(quiet), T0 + 60 * i
        )
    report = store.node_reports()["n1"]
    assert report.heard_at == T0 + 60 * 99 and report.observed_at == T0 + 60 * 99
    assert report.changed_at == T0 + 0.1 and report.reports == 100
    assert report.payload["queued"] == 99  # the last status in full

    dropping = payload(dropped=5)
    assert store.note_status(status(T0 + 6000, dropping), status_condition(dropping), T0 + 6000)
    report = store.node_reports(node="n1")["n1"]
    assert report.changed_at == T0 + 6000 and report.reports == 1
    # a backlog's older status, delivered late, neither replaces the report nor is news
    assert not store.note_status(status(T0 + 10, body), status_condition(body), T0 + 6001)
    assert store.node_reports()["n1"].payload["dropped"] == 5
    assert store.node_reports(since=T0 + 7000) == {}


def test_a_restarted_controller_counts_silence_for_nodes_known_by_report(tmp_path: Path):
    store = Store.open(tmp_path / "state.db")
    store.note_status(status(T0, payload(), node="n3"), status_condition(payload()), T0)
    reports = LastReports()
    reports.seed(store, T0 + 600)
    assert reports.snapshot() == {"n3": T0 + 600}


def test_the_ingest_stores_a_quiet_sidecars_status_once(tmp_path: Path):
    """Through the controller's own ingest step, as a sidecar's request reaches it."""
    controller = Controller(config(tmp_path))
    sidecar = Principal(uid=0, gid=0, origin="127.0.0.1", role="sidecar", node="n1")
    store = controller.ingest.store()
    first = controller._store_evidence(store, sidecar, [status(T0, payload())])
    assert len(first) == 1
    for i in range(1, 30):
        quiet = [status(T0 + 10 * i, payload(queued=i))]
        assert controller._store_evidence(store, sidecar, quiet) == []
    xid = Evidence("sidecar", "xid", T0 + 300, node="n1", gpu=0, payload={"xid": 79})
    mixed = controller._store_evidence(store, sidecar, [status(T0 + 310, payload()), xid])
    assert len(mixed) == 1  # the XID; the status is no news
    kinds = [r.evidence.kind for r in store.find_evidence()]
    assert kinds == ["sidecar_status", "xid"]
    assert store.node_reports()["n1"].reports == 31
    # an operator's status (insecure development setups) is evidence as before
    operator = Principal(uid=0, gid=0, origin="127.0.0.1", role="operator", node=None)
    assert len(controller._store_evidence(store, operator, [status(T0 + 320, payload())])) == 1


def test_the_node_view_says_when_the_sidecar_last_reported_and_changed(tmp_path: Path):
    store = Store.open(tmp_path / "state.db")
    body = payload()
    body["sources"] = {**body["sources"], "ib": "mlx5_0 port 1: counters unreadable"}
    store.note_status(status(T0, body), status_condition(body), T0)
    store.note_status(status(T0 + 60, body), status_condition(body), T0 + 60)
    shown = sidecar_json(store.node_reports()["n1"], now=T0 + 75)
    assert shown["silent_for"] == 15.0 and shown["reports_since_change"] == 2
    assert shown["problems"] == {"ib": "mlx5_0 port 1: counters unreadable"}
    assert shown["last_change"].startswith("2023-11-14T22:13:20")


def test_the_node_view_of_an_oddly_shaped_status_is_no_crash(tmp_path: Path):
    """A newer or broken sidecar's status: the condition reads it (above), and so does the
    view that srecovery nodes shows."""
    store = Store.open(tmp_path / "state.db")
    odd = payload(delivery="failing", sources=["kmsg"])
    store.note_status(status(T0, odd), status_condition(odd), T0)
    shown = sidecar_json(store.node_reports()["n1"], now=T0 + 1)
    assert shown["delivery_error"] == "" and shown["problems"] == {}
