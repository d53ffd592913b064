"""Heartbeats (issue 29): a sidecar whose status condition is the one the controller holds says
so in a heartbeat that names the condition's digest, instead of sending the status in full.
The wire format and the digest (contract.status), the controller's side (LastReports.beat),
and the sender's (when it sends one, what it does with each answer)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.contract.client import ClientError
from slurm_recovery.contract.status import (
    HELD,
    WANTED,
    condition_digest,
    heartbeat_body,
    parse_heartbeat,
    payload_digest,
    status_condition,
)
from slurm_recovery.contract.wire import WireError, parse_batch
from slurm_recovery.controller.reports import LastReports
from slurm_recovery.sidecar.base import Finding
from slurm_recovery.sidecar.outbox import EMPTY, HEARTBEATS_OFF, RETRY, Outbox, Sender
from slurm_recovery.store import Evidence
from tests.unit.test_outbox import Clock, FakeController, make_sidecar
from tests.unit.test_status_state import T0, payload, readings

# ---------------------------------------------------------------- the wire and the digest


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", fullmatch=True))
def test_a_heartbeat_reads_back_as_it_was_written(node: str):
    digest = payload_digest(payload())
    assert parse_heartbeat(heartbeat_body(node, digest)) == (node, digest)


@given(st.binary(max_size=600))
def test_any_other_body_is_a_wire_error(body: bytes):
    try:
        node, digest = parse_heartbeat(body)
    except WireError:
        return
    assert json.loads(body) == {"node": node, "condition": digest}


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b'{"node": "n1"}',
        b'{"node": "n1", "condition": "abc"}',
        b'{"node": "n1", "condition": "' + b"A" * 64 + b'"}',  # upper case: not the digest
        b'{"node": "n 1", "condition": "' + b"a" * 64 + b'"}',
        b'{"node": "n1", "condition": "' + b"a" * 64 + b'", "more": 1}',
        b'{"node": "' + b"n" * 600 + b'", "condition": "' + b"a" * 64 + b'"}',  # too large
    ],
)
def test_malformed_heartbeats_say_what_is_wrong(body: bytes):
    with pytest.raises(WireError) as info:
        parse_heartbeat(body)
    assert "heartbeat" in str(info.value)


@given(readings)
def test_readings_do_not_move_the_digest(r: dict[str, Any]):
    moved = copy.deepcopy(payload())
    moved["queued"] = r["queued"]
    moved["gpus"]["0"]["temperature_c"] = r["temperature"]
    moved["gpus"]["1"]["power_w"] = r["power"]
    assert payload_digest(moved) == payload_digest(payload())


def test_a_change_of_condition_moves_the_digest():
    assert payload_digest(payload(dropped=1)) != payload_digest(payload())
    assert payload_digest(payload(fatal=1)) != payload_digest(payload())
    lost = payload()
    lost["gpus"]["1"] = {"lost": True}
    assert payload_digest(lost) != payload_digest(payload())


@given(readings)
def test_the_sidecars_digest_is_the_controllers(r: dict[str, Any]):
    """The sidecar digests its payload as Python objects (int GPU keys, tuples); the controller
    holds the condition of the payload it parsed off the wire: the same digest."""
    sent = payload()
    sent["gpus"] = {0: {"temperature_c": r["temperature"], "conditions": ()}}
    sent["sources"]["host"] = f"ok, sidecar rss {r['rss']} MiB"
    event = Finding("sidecar_status", T0, payload=sent).to_event("n1")
    body = json.dumps({"events": [event]}).encode()
    (parsed,) = parse_batch(body)
    assert payload_digest(sent) == condition_digest(status_condition(parsed.payload))


# ---------------------------------------------------------------- the controller's side


def status(at: float, body: dict[str, Any], node: str = "n1") -> Evidence:
    return Evidence("sidecar", "sidecar_status", at, node=node, payload=body)


def holding(body: dict[str, Any], node: str = "n1") -> LastReports:
    """LastReports holding ``body`` as ``node``'s report (judged and committed)."""
    reports = LastReports()
    changes: dict = {}
    assert reports.judge(status(T0, body, node), status_condition(body), T0, changes)
    reports.settle(changes.values(), committed=True)
    reports.heard(node, T0)  # as the ingest notes every batch it stored
    return reports


def test_a_heartbeat_of_the_held_condition_is_heard_and_counted():
    reports = holding(payload())
    assert reports.beat("n1", payload_digest(payload()), T0 + 60)
    report = reports.reports()["n1"]
    assert report.heard_at == T0 + 60 and report.reports == 2
    assert report.observed_at == T0  # the readings are the full status's
    assert reports.snapshot()["n1"] == T0 + 60


def test_a_heartbeat_of_another_condition_or_an_unknown_node_wants_the_status():
    reports = holding(payload())
    assert not reports.beat("n1", payload_digest(payload(dropped=2)), T0 + 60)
    assert reports.reports()["n1"].reports == 1  # not counted as a report
    assert reports.snapshot()["n1"] == T0 + 60  # but the sidecar is alive: heard
    assert not reports.beat("n9", payload_digest(payload()), T0 + 60)
    assert reports.snapshot()["n9"] == T0 + 60 and "n9" not in reports.reports()


def test_after_a_change_only_the_new_condition_is_held():
    reports = holding(payload())
    assert reports.beat("n1", payload_digest(payload()), T0 + 10)
    changed = payload(dropped=4)
    changes: dict = {}
    assert reports.judge(status(T0 + 20, changed), status_condition(changed), T0 + 20, changes)
    # being stored: neither digest is held until it commits
    assert not reports.beat("n1", payload_digest(changed), T0 + 21)
    assert not reports.beat("n1", payload_digest(payload()), T0 + 21)
    reports.settle(changes.values(), committed=True)
    assert reports.beat("n1", payload_digest(changed), T0 + 30)
    assert not reports.beat("n1", payload_digest(payload()), T0 + 40)


def test_a_heartbeat_never_moves_heard_back():
    reports = holding(payload())
    assert reports.beat("n1", payload_digest(payload()), T0 - 100)
    assert reports.reports()["n1"].heard_at == T0 and reports.snapshot()["n1"] == T0


# ---------------------------------------------------------------- the sender's side


class BeatingController(FakeController):
    """Accepts evidence; answers heartbeats from ``answers`` (a dict, or an exception to
    raise), then "held"."""

    def __init__(self, answers=()) -> None:
        super().__init__()
        self.answers = list(answers)
        self.beats: list[tuple[str, str]] = []

    def post_heartbeat(self, node: str, digest: str) -> Any:
        self.beats.append((node, digest))
        if self.answers:
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer
        return {"status": HELD}


def status_event(body: dict[str, Any]) -> dict[str, Any]:
    return Finding("sidecar_status", T0, payload=body).to_event("n2")


def delivered(tmp_path, controller: BeatingController, clock: Clock) -> Sender:
    """A sender that has delivered one full status (``payload()``)."""
    box = Outbox(tmp_path, 100)
    sender = Sender(box, controller, "n2", clock=clock)
    box.append([("sidecar", status_event(payload()))])
    assert sender.send_available() == EMPTY
    return sender


def test_no_heartbeat_before_the_controller_holds_a_full_status(tmp_path):
    sender = Sender(Outbox(tmp_path, 100), BeatingController(), "n2", clock=Clock())
    assert not sender.heartbeat(payload_digest(payload()), 300)


def test_a_heartbeat_stands_for_an_unchanged_status_until_a_full_one_is_due(tmp_path):
    clock, controller = Clock(), BeatingController()
    sender = delivered(tmp_path, controller, clock)
    digest = payload_digest(payload())
    assert sender.held == (digest, clock.now)
    clock.now += 60
    assert sender.heartbeat(digest, 300)
    assert sender.send_available() == EMPTY
    assert controller.beats == [("n2", digest)]
    assert sender.send_available() == EMPTY and len(controller.beats) == 1  # sent once
    assert not sender.heartbeat(payload_digest(payload(dropped=1)), 300)  # a change: in full
    clock.now += 240
    assert not sender.heartbeat(digest, 300)  # the readings are due
    assert not sender.heartbeat(digest, 0)  # heartbeats off (full_status_interval = 0)


def test_wanted_asks_the_sidecar_for_the_full_status(tmp_path):
    clock = Clock()
    controller = BeatingController([{"status": WANTED}])
    sender = delivered(tmp_path, controller, clock)
    digest = payload_digest(payload())
    assert sender.heartbeat(digest, 300)
    sender.send_available()
    assert sender.status_wanted and sender.held is None
    assert not sender.heartbeat(digest, 300)


def test_a_controller_that_keeps_wanting_the_status_gets_full_ones_for_an_hour(tmp_path, caplog):
    clock = Clock()
    controller = BeatingController([{"status": WANTED}] * 3)
    sender = delivered(tmp_path, controller, clock)
    for _ in range(3):
        assert sender.heartbeat(payload_digest(payload()), 300)
        sender.send_available()
        sender.status_wanted = False
        sender.outbox.append([("sidecar", status_event(payload()))])  # the full status
        sender.send_available()
    assert not sender.heartbeat(payload_digest(payload()), 300)
    assert sender.heartbeats_off_until == clock.now + HEARTBEATS_OFF
    assert "3 times in a row" in caplog.text
    clock.now += HEARTBEATS_OFF
    assert sender.heartbeat(payload_digest(payload()), HEARTBEATS_OFF + 300)


@pytest.mark.parametrize("status", [404, 405, 403, 400])
def test_a_controller_that_takes_no_heartbeats_gets_full_statuses(tmp_path, status, caplog):
    clock = Clock()
    controller = BeatingController([ClientError(status, "not found")])
    sender = delivered(tmp_path, controller, clock)
    assert sender.heartbeat(payload_digest(payload()), 300)
    assert sender.send_available() == EMPTY
    assert sender.status_wanted and sender.failures == 0
    assert not sender.heartbeat(payload_digest(payload()), 300)
    assert "every status goes in full" in caplog.text


def test_an_unreachable_controller_keeps_the_heartbeat_for_the_retry(tmp_path):
    clock = Clock()
    controller = BeatingController([ClientError(0, "controller unreachable")])
    sender = delivered(tmp_path, controller, clock)
    assert sender.heartbeat(payload_digest(payload()), 300)
    assert sender.send_available() == RETRY and sender.failures == 1
    assert sender.send_available() == EMPTY and sender.failures == 0
    assert len(controller.beats) == 2 and not sender.status_wanted


def test_a_status_delivered_after_a_heartbeat_was_made_supersedes_it(tmp_path):
    """The controller was down; the heartbeat waited; meanwhile the condition changed and
    the full status was queued: it goes, and the stale heartbeat does not."""
    clock = Clock()
    controller = BeatingController([ClientError(0, "controller unreachable")])
    sender = delivered(tmp_path, controller, clock)
    assert sender.heartbeat(payload_digest(payload()), 300)
    assert sender.send_available() == RETRY
    sender.outbox.append([("sidecar", status_event(payload(dropped=5)))])
    assert sender.send_available() == EMPTY
    assert len(controller.beats) == 1  # only the refused one
    assert sender.held is not None and sender.held[0] == payload_digest(payload(dropped=5))


# ---------------------------------------------------------------- the sidecar


def test_the_sidecar_sends_a_full_status_then_heartbeats_then_full_when_wanted(tmp_path):
    controller = BeatingController([{"status": WANTED}])
    sidecar, box = make_sidecar(tmp_path, controller)
    sidecar.sender.clock = Clock()
    statuses = lambda: [e for e in controller.accepted if e["kind"] == "sidecar_status"]  # noqa: E731

    sidecar.emit_status(T0)
    assert sidecar.sender.send_available() == EMPTY
    assert len(statuses()) == 1 and controller.beats == []
    sidecar.emit_status(T0 + 60)  # unchanged: a heartbeat, answered "wanted"
    assert sidecar.sender.send_available() == EMPTY
    assert len(controller.beats) == 1 and sidecar.sender.status_wanted
    sidecar.emit_status(T0 + 61)  # wanted: in full, even though unchanged
    sidecar.sender.send_available()
    assert len(statuses()) == 2 and not sidecar.sender.status_wanted
    sidecar.emit_status(T0 + 120)
    sidecar.sender.send_available()
    assert len(statuses()) == 2 and len(controller.beats) == 2  # held: a heartbeat again
    box.close()
