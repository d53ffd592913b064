"""Delivery: the durable bounded outbox (drops counted, crash-safe: a kill at any instant loses
nothing it acknowledged), the sender's retry rules, and the sidecar loop against a fake
controller. The real controller and MUNGE are in tests/integration/test_sidecar.py."""

from __future__ import annotations

import email.message
import json
import logging
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
from pathlib import Path

import pytest

from slurm_recovery.contract.client import ClientError
from slurm_recovery.contract.spool import HookSpool
from slurm_recovery.contract.wire import event_to_json
from slurm_recovery.sidecar.base import Finding
from slurm_recovery.sidecar.daemon import HEALTH_FILE, Sidecar
from slurm_recovery.sidecar.outbox import (
    EMPTY,
    RETRY,
    Outbox,
    OutboxError,
    Sender,
    retry_after,
)
from slurm_recovery.sidecar.registry import Registry
from slurm_recovery.sidecar.sim import SimBackend, SimXidSource, inject
from slurm_recovery.sidecar.spool import SpoolSource
from tests.conftest import wait_for

NOW = 1_800_000_000.0
ROOT = Path(__file__).resolve().parents[2]


def ev(i: int, kind: str = "xid", node: str = "n2") -> dict:
    return event_to_json(kind, NOW + i, node=node, gpu=0, payload={"seq": i})


def seqs(entries) -> list[int]:
    return [e.event["payload"]["seq"] for e in entries]


# --- the outbox ------------------------------------------------------------------------------


def test_fifo_that_survives_reopening(tmp_path):
    with Outbox(tmp_path, 100) as box:
        box.append([("sidecar", ev(i)) for i in range(5)])
        assert len(box) == 5
        first = box.peek(2)
        assert seqs(first) == [0, 1]
        assert box.ack([e.id for e in first]) == 2
        assert box.ack([e.id for e in first]) == 0  # acknowledging twice is harmless
    with Outbox(tmp_path, 100) as box:
        assert len(box) == 3 and seqs(box.peek()) == [2, 3, 4]


def test_bound_drops_the_oldest_and_counts_them_persistently(tmp_path, caplog):
    with Outbox(tmp_path, 5) as box:
        assert box.append([("sidecar", ev(i)) for i in range(3)]) == 0
        assert box.append([("sidecar", ev(i)) for i in range(3, 8)]) == 3
        assert seqs(box.peek()) == [3, 4, 5, 6, 7]
        assert box.dropped == 3 and len(box) == 5
        assert "dropped the 3 oldest" in caplog.text
    with Outbox(tmp_path, 5) as box:
        box.append([("sidecar", ev(8))])
        assert box.dropped == 4 and seqs(box.peek()) == [4, 5, 6, 7, 8]


def test_peek_keeps_one_role_and_a_size_limit_per_batch(tmp_path):
    with Outbox(tmp_path, 100) as box:
        box.append([("sidecar", ev(0)), ("sidecar", ev(1)), ("hook", ev(2)), ("sidecar", ev(3))])
        assert [(e.role, e.event["payload"]["seq"]) for e in box.peek()] == [
            ("sidecar", 0),
            ("sidecar", 1),
        ]
        assert seqs(box.peek(max_bytes=10)) == [0]  # smaller than one event: one, never none
        two = sum(e.size for e in box.peek(2))
        assert seqs(box.peek(max_bytes=two - 1)) == [0]


def test_one_outbox_per_directory(tmp_path):
    with Outbox(tmp_path, 10), pytest.raises(OutboxError, match="another process"):
        Outbox(tmp_path, 10)
    Outbox(tmp_path, 10).close()  # free again once closed


def test_dead_letter_file_keeps_refused_events(tmp_path):
    with Outbox(tmp_path, 10) as box:
        box.append([("hook", ev(0)), ("hook", ev(1))])
        (bad,) = box.peek(1)
        box.dead_letter([bad], 400, "events[0].payload: too deep")
        assert box.dead_lettered == 1 and seqs(box.peek()) == [1]
        (line,) = box.dead_letter_path.read_text().splitlines()
        record = json.loads(line)
        assert record["status"] == 400 and record["role"] == "hook"
        assert record["event"] == ev(0) and "too deep" in record["reason"]


_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    sys.path.insert(0, {root!r})
    from slurm_recovery.sidecar.outbox import Outbox
    box = Outbox({folder!r}, 1_000_000)
    mode = sys.argv[1]
    if mode == "send-then-die":
        for i in range(50):
            box.append([("sidecar", {{"kind": "xid", "observed_at": 1.8e9, "node": "n2",
                                       "payload": {{"seq": i}}}})])
        batch = box.peek()
        print(len(batch), flush=True)  # "posted": the controller got them...
        os.kill(os.getpid(), signal.SIGKILL)  # ...and we die before the acknowledgement
    i = 0
    while True:  # append forever; each printed number is an append that returned
        box.append([("sidecar", {{"kind": "xid", "observed_at": 1.8e9, "node": "n2",
                                   "payload": {{"seq": i}}}})])
        print(i, flush=True)
        i += 1
    """
)


def _child(tmp_path: Path, mode: str) -> subprocess.Popen:
    script = _CHILD.format(root=str(ROOT), folder=str(tmp_path / "box"))
    return subprocess.Popen([sys.executable, "-c", script, mode], stdout=subprocess.PIPE, text=True)


def test_killed_between_send_and_acknowledge_sends_again(tmp_path):
    child = _child(tmp_path, "send-then-die")
    assert child.stdout.readline().strip() == "50"
    assert child.wait(30) == -signal.SIGKILL
    with Outbox(tmp_path / "box", 100) as box:
        assert len(box) == 50 and seqs(box.peek()) == list(range(50))  # at-least-once


def test_killed_while_appending_loses_nothing_it_acknowledged(tmp_path):
    child = _child(tmp_path, "append")
    last = -1
    for line in child.stdout:
        last = int(line)
        if last >= 150:
            break
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    with Outbox(tmp_path / "box", 1_000_000) as box:
        stored = seqs(box.peek(100_000, max_bytes=1 << 30))
    assert stored[: last + 1] == list(range(last + 1))  # every acknowledged append is there
    assert stored == list(range(len(stored)))  # and nothing torn or out of order


# --- the sender --------------------------------------------------------------------------------


def http_error(status: int, reason: str, retry: str | None = None) -> ClientError:
    headers = email.message.Message()
    if retry is not None:
        headers["Retry-After"] = retry
    cause = urllib.error.HTTPError("http://c/v1/evidence", status, reason, headers, None)
    try:
        raise ClientError(status, reason) from cause
    except ClientError as exc:
        return exc


class FakeController:
    """Answers ``post_evidence`` from a script of exceptions, then accepts; refuses (400) any
    batch holding an event for which ``poison`` is true."""

    def __init__(self, script=(), poison=lambda event: False) -> None:
        self.script = list(script)
        self.poison = poison
        self.calls: list[tuple[str, str | None, list[dict]]] = []
        self.accepted: list[dict] = []

    def post_evidence(self, events, *, role, node=None):
        self.calls.append((role, node, list(events)))
        if self.script:
            raise self.script.pop(0)
        if any(self.poison(e) for e in events):
            raise ClientError(400, "events[0].payload: bad")
        self.accepted.extend(events)
        return {"accepted": len(events)}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sender_for(box: Outbox, controller: FakeController, clock: Clock | None = None, **kw):
    return Sender(box, controller, "n2", clock=clock or Clock(), rng=random.Random(4), **kw)


def test_delivers_in_order_then_removes(tmp_path):
    with Outbox(tmp_path, 100) as box:
        box.append([("sidecar", ev(i)) for i in range(3)])
        controller = FakeController()
        sender = sender_for(box, controller)
        assert sender.send_available() == EMPTY
        assert [e["payload"]["seq"] for e in controller.accepted] == [0, 1, 2]
        assert controller.calls[0][:2] == ("sidecar", "n2")
        assert len(box) == 0 and sender.delivered == 3


def test_batches_follow_roles_and_the_batch_size(tmp_path):
    with Outbox(tmp_path, 10_000) as box:
        box.append([("sidecar", ev(i)) for i in range(1200)])
        box.append([("hook", ev(1200)), ("sidecar", ev(1201))])
        controller = FakeController()
        sender_for(box, controller, batch_max=500).send_available()
        assert [(role, len(events)) for role, _, events in controller.calls] == [
            ("sidecar", 500),
            ("sidecar", 500),
            ("sidecar", 200),
            ("hook", 1),
            ("sidecar", 1),
        ]
        assert [e["payload"]["seq"] for e in controller.accepted] == list(range(1202))


def test_unreachable_keeps_everything_and_backs_off_with_jitter_up_to_30s(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    with Outbox(tmp_path, 100) as box:
        box.append([("sidecar", ev(0))])
        clock = Clock()
        down = [ClientError(0, "controller unreachable") for _ in range(12)]
        sender = sender_for(box, FakeController(down), clock)
        delays = []
        for _ in range(12):
            assert sender.send_available() == RETRY
            delays.append(sender.next_attempt - clock.now)
        assert len(box) == 1 and sender.failures == 12
        for n, delay in enumerate(delays, start=1):
            base = min(30.0, 0.5 * 2 ** (n - 1))
            assert base / 2 <= delay <= base, (n, delay)
        assert max(delays) <= 30.0 and delays[-1] >= 15.0
        assert caplog.text.count("cannot deliver to the controller") == 1  # once per outage
        assert sender.send_available() == EMPTY and len(box) == 0
        assert sender.failures == 0 and sender.next_attempt == 0.0
        assert "reachable again" in caplog.text


def test_retry_after_is_honoured_for_5xx_and_429(tmp_path):
    assert retry_after(http_error(503, "not stored", "5")) == 5.0
    assert retry_after(http_error(503, "x", "a date, not seconds")) is None
    assert retry_after(http_error(429, "x", "99999")) == 300.0
    assert retry_after(ClientError(0, "down")) is None
    with Outbox(tmp_path, 100) as box:
        box.append([("sidecar", ev(0))])
        clock = Clock()
        sender = sender_for(box, FakeController([http_error(503, "store busy", "7")]), clock)
        assert sender.send_available() == RETRY
        assert sender.next_attempt - clock.now == pytest.approx(7.0)
        assert len(box) == 1


def test_a_poison_event_is_isolated_and_dead_lettered(tmp_path, caplog):
    with Outbox(tmp_path, 100) as box:
        box.append([("sidecar", ev(i)) for i in range(8)])
        controller = FakeController(poison=lambda e: e["payload"]["seq"] == 5)
        sender = sender_for(box, controller)
        assert sender.send_available() == EMPTY
        assert sorted(e["payload"]["seq"] for e in controller.accepted) == [0, 1, 2, 3, 4, 6, 7]
        assert len(box) == 0 and box.dead_lettered == 1
        (line,) = box.dead_letter_path.read_text().splitlines()
        assert json.loads(line)["event"]["payload"]["seq"] == 5
        assert len(controller.calls) <= 8  # found by halving, not one by one
        assert "refused an event for good" in caplog.text


def test_too_large_is_split_like_a_poison_batch(tmp_path):
    with Outbox(tmp_path, 100) as box:
        box.append([("sidecar", ev(i)) for i in range(4)])
        controller = FakeController([http_error(413, "request body too large")])
        assert sender_for(box, controller).send_available() == EMPTY
        assert [len(events) for _, _, events in controller.calls] == [4, 2, 2]
        assert box.dead_lettered == 0 and len(controller.accepted) == 4


@pytest.mark.parametrize("status", [401, 403, 404])
def test_refusals_keep_the_events_and_shout(tmp_path, caplog, status):
    with Outbox(tmp_path, 100) as box:
        box.append([("sidecar", ev(0))])
        sender = sender_for(box, FakeController([http_error(status, "not allowed")]))
        assert sender.send_available() == RETRY
        assert len(box) == 1 and box.dead_lettered == 0
        assert "REFUSED" in caplog.text and "munged" in caplog.text
        assert sender.send_available() == EMPTY


def test_the_sender_thread_sends_on_wake_and_stops(tmp_path):
    with Outbox(tmp_path, 100) as box:
        controller = FakeController()
        sender = Sender(box, controller, "n2")
        thread = threading.Thread(target=sender.run, daemon=True)
        thread.start()
        box.append([("sidecar", ev(0))])
        sender.wake()
        wait_for(lambda: len(box) == 0, timeout=5, interval=0.01)
        assert len(controller.accepted) == 1
        sender.stop()
        thread.join(5)
        assert not thread.is_alive()


def test_urgent_wake_cuts_a_backoff_short(tmp_path):
    with Outbox(tmp_path, 100) as box:
        controller = FakeController()
        sender = Sender(box, controller, "n2")
        sender.failures, sender.next_attempt = 9, time.monotonic() + 3600
        thread = threading.Thread(target=sender.run, daemon=True)
        thread.start()
        box.append([("sidecar", ev(0))])
        sender.wake()  # not urgent: waits for the backoff
        # the thread took the wake (cleared it) and waits again: no send without another wake
        wait_for(lambda: not sender._wake.is_set(), timeout=5, interval=0.01)
        assert controller.calls == []
        sender.wake(urgent=True)
        wait_for(lambda: controller.accepted, timeout=5, interval=0.01)
        assert len(controller.accepted) == 1
        sender.stop()
        thread.join(5)


# --- the sidecar loop, with a fake controller -------------------------------------------------


class Broken:
    name = "broken"
    fast = True

    def poll(self, now):
        raise OSError("device vanished")

    def close(self):
        pass


def make_sidecar(tmp_path: Path, controller: FakeController, *extra, max_events=1000):
    spool_dir = tmp_path / "spool"
    backend = SimBackend("n2", tmp_path / "sim", 8)
    registry = Registry(gpu=backend)
    for source in (SimXidSource(backend), SpoolSource(HookSpool(spool_dir), "n2"), backend, *extra):
        registry.add(source)
    box = Outbox(spool_dir / "outbox", max_events)
    sender = Sender(box, controller, "n2")
    sidecar = Sidecar("n2", registry, box, sender, spool_dir, fast_interval=0.05, poll_interval=0.2)
    return sidecar, box


def test_once_delivers_status_inventory_xids_and_hook_events(tmp_path):
    controller = FakeController()
    sidecar, box = make_sidecar(tmp_path, controller)
    inject(tmp_path / "sim", "n2", gpu=1, xid=79)
    HookSpool(tmp_path / "spool").put(
        event_to_json("job_end", NOW, node="n2", job_id=9, payload={"exit_code": 1})
    )
    assert sidecar.run_once(flush_timeout=5)
    by_role = {}
    for role, node, events in controller.calls:
        assert node == "n2"
        by_role.setdefault(role, []).extend(e["kind"] for e in events)
    assert by_role == {"sidecar": ["sidecar_status", "gpu_inventory", "xid"], "hook": ["job_end"]}
    status = controller.accepted[0]["payload"]
    assert status["sources"] == {"sim_xid": "ok", "hook_spool": "ok", "sim": "ok"}
    assert status["dropped"] == 0 and set(status["gpus"]) == {str(i) for i in range(8)}
    health = json.loads((tmp_path / "spool" / HEALTH_FILE).read_text())
    assert health["fatal"] == []  # no catalogue given: XIDs are not assessed here
    assert HookSpool(tmp_path / "spool").pending() == []
    box.close()


def test_a_failing_source_is_reported_and_the_others_go_on(tmp_path, caplog):
    controller = FakeController()
    sidecar, box = make_sidecar(tmp_path, controller, Broken())
    inject(tmp_path / "sim", "n2", gpu=0, xid=48)
    for _ in range(3):
        sidecar.tick_fast(NOW)
    assert sidecar.failing == {"broken": "OSError: device vanished"}
    assert caplog.text.count("source broken failed") == 1  # logged once, not every tick
    status = sidecar.status(NOW).payload
    assert status["sources"]["broken"] == "OSError: device vanished"
    assert status["sources"]["sim_xid"] == "ok"
    assert [e.event["kind"] for e in box.peek()] == ["xid"]
    box.close()


def test_drops_are_reported_in_the_next_status(tmp_path):
    controller = FakeController([ClientError(0, "down")] * 100)
    sidecar, box = make_sidecar(tmp_path, controller, max_events=3)
    for i in range(6):
        inject(tmp_path / "sim", "n2", gpu=0, xid=13 + i)
    sidecar.tick_fast(NOW)
    assert len(box) == 3 and box.dropped == 3
    sidecar.emit_status(NOW)
    newest = box.peek(10)[-1].event
    assert newest["kind"] == "sidecar_status" and newest["payload"]["dropped"] == 3
    assert box.dropped == 4  # the status itself pushed one more out: the next status says so
    box.close()


def test_an_invalid_finding_is_dead_lettered_not_queued(tmp_path, caplog):
    sidecar, box = make_sidecar(tmp_path, FakeController())
    sidecar.queue([Finding("Not A Kind", NOW), Finding("xid", NOW, payload={"xid": 13})])
    assert [e.event["kind"] for e in box.peek()] == ["xid"]
    assert box.dead_lettered == 1 and "invalid event" in caplog.text
    box.close()


def test_run_stops_on_request_and_delivers_what_it_found(tmp_path):
    controller = FakeController()
    sidecar, box = make_sidecar(tmp_path, controller)
    stop = threading.Event()
    thread = threading.Thread(target=sidecar.run, args=(stop,), daemon=True)
    thread.start()
    started = time.monotonic()
    inject(tmp_path / "sim", "n2", gpu=3, xid=79)
    while not any(e["kind"] == "xid" for e in controller.accepted):
        assert time.monotonic() - started < 5
        time.sleep(0.01)
    latency = time.monotonic() - started
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
    assert latency < 1.0, latency
    kinds = [e["kind"] for e in controller.accepted]
    assert kinds[0] == "sidecar_status" and "gpu_inventory" in kinds
    box.close()
