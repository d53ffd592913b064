"""Load beyond what the controller can store (docs/reliability.md#load): a real controller
process flooded with signed evidence by many clients while real sidecar senders (outbox on
disk) deliver their own events. The controller answers 429 with a Retry-After instead of
queueing without bound (by count, ``controller.max_queued_requests``, or by bytes,
``controller.max_queued_bytes``), /healthz keeps answering, the senders back off, and once the flood
ends every sender event is stored exactly once.

``SRECOVERY_LOAD_SECONDS`` (default 15; 60 for the documented run) sets the flood's length."""

from __future__ import annotations

import http.client
import json
import os
import re
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path

import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract import requests
from slurm_recovery.contract.client import ControllerClient
from slurm_recovery.contract.wire import event_to_json
from slurm_recovery.sidecar.outbox import EMPTY, Outbox, Sender
from tests.conftest import _free_port_block

pytestmark = pytest.mark.cluster

SECONDS = float(os.environ.get("SRECOVERY_LOAD_SECONDS", "15"))
FLOODERS = 24
SENDERS = ("n1", "n2", "n3", "n4")
PER_SENDER = 300


def post(port: int, body: bytes, headers: dict[str, str]) -> tuple[int, str | None, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v1/evidence", body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Retry-After"), resp.read()
    finally:
        conn.close()


@pytest.mark.timeout(SECONDS * 6 + 240)
@pytest.mark.parametrize(
    ("limit", "pad", "why"),
    [
        ("max_queued_requests = 10", 0, r"busy: \d+ requests waiting to be stored; "),
        # batches of about 200 KB: 24 of them are past 1 MiB long before 20,000 requests
        ("max_queued_bytes = 1048576", 2000, r"busy: \d+ bytes of requests waiting to be stored; "),
    ],
    ids=["by-count", "by-bytes"],
)
def test_a_flood_gets_429s_health_answers_and_no_sender_event_is_lost(
    local_cluster, tmp_path, limit, pad, why
):
    base = Path(tempfile.mkdtemp(prefix="srecovery-load-"))
    base.chmod(0o755)
    port = _free_port_block(1, start=local_cluster.port_base + 900)
    devstack.write_policy(base / "policy.toml", "monitor", "")
    config = devstack.write_config(base, local_cluster, port)
    text = config.read_text()
    config.write_text(text.replace("[controller]\n", f"[controller]\n{limit}\n", 1))
    pid = devstack.start_controller(config, base / "controller.log")
    url = f"http://127.0.0.1:{port}"
    socket = str(local_cluster.munge_socket)
    try:
        devstack.wait_healthy(url, pid=pid)
        stop = threading.Event()
        statuses: dict[int, int] = {}
        retry_after: set[str] = set()
        reasons: set[str] = set()
        lock = threading.Lock()

        def flood(i: int) -> None:
            events = [
                event_to_json("progress", time.time(), node="n1", job_id=900_000 + i,
                              payload={"step": s, "flood": True, "pad": "x" * pad})
                for s in range(100)
            ]  # fmt: skip
            body = json.dumps({"events": events}).encode()
            while not stop.is_set():
                headers = requests.sign(
                    "POST", "/v1/evidence", body, role="operator", socket=socket
                )
                try:
                    status, after, answer = post(port, body, headers)
                except OSError:
                    status, after, answer = 0, None, b""
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1
                    if after:
                        retry_after.add(after)
                    if status == 429:
                        reasons.add(json.loads(answer)["error"])

        health_ms: list[float] = []

        def probe() -> None:
            while not stop.is_set():
                started = time.monotonic()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                try:
                    conn.request("GET", "/healthz")
                    assert conn.getresponse().status in (200, 503)
                finally:
                    conn.close()
                health_ms.append(1000 * (time.monotonic() - started))
                time.sleep(0.25)

        outboxes = {}
        for node in SENDERS:
            box = Outbox(tmp_path / node, max_events=10_000)
            box.append(
                ("sidecar", event_to_json("gpu_activity", time.time(), node=node,
                                          payload={"seq": n, "marker": "load-test"}))
                for n in range(PER_SENDER)
            )  # fmt: skip
            outboxes[node] = box
        senders = {
            node: Sender(
                box, ControllerClient(url, munge_socket=socket, timeout=30), node, batch_max=20
            )
            for node, box in outboxes.items()
        }
        refused_senders: dict[str, int] = dict.fromkeys(SENDERS, 0)

        def deliver(node: str) -> None:
            sender = senders[node]
            deadline = time.monotonic() + SECONDS + 120
            while time.monotonic() < deadline:
                wait = sender.next_attempt - sender.clock()
                if wait > 0:
                    time.sleep(min(wait, 0.5))
                    continue
                if sender.send_available() == EMPTY:
                    return
                if sender.last_error is not None and sender.last_error.status == 429:
                    refused_senders[node] += 1

        workers = [threading.Thread(target=flood, args=(i,)) for i in range(FLOODERS)]
        workers.append(threading.Thread(target=probe))
        for worker in workers:
            worker.start()
        time.sleep(2)  # the flood is on before the senders start
        delivering = [threading.Thread(target=deliver, args=(n,)) for n in SENDERS]
        for thread in delivering:
            thread.start()
        time.sleep(SECONDS)
        stop.set()
        for worker in workers:
            worker.join(60)
        for thread in delivering:
            thread.join(SECONDS + 150)

        sent = sum(statuses.values())
        print(
            f"\nflood: {sent} requests of 100 events in {SECONDS:g} s ({sent / SECONDS:.0f}/s) by "
            f"{FLOODERS} clients: {statuses}; Retry-After seen {sorted(retry_after)}; "
            f"senders refused {refused_senders}; /healthz p50 "
            f"{statistics.median(health_ms):.0f} ms, max {max(health_ms):.0f} ms "
            f"({len(health_ms)} probes)"
        )
        assert statuses.get(429, 0) > 0 and retry_after <= {"1", "2", "3", "4", "5"}
        assert reasons and all(re.match(why, r) for r in reasons), reasons
        assert set(statuses) <= {202, 429}, statuses  # never a 5xx, never a dropped connection
        assert max(health_ms) < 5000, health_ms
        assert all(len(box) == 0 for box in outboxes.values())  # every sender drained
        with sqlite3.connect(f"file:{base / 'state.db'}?mode=ro", uri=True) as db:
            rows = db.execute(
                "SELECT node, json_extract(payload, '$.seq') FROM evidence "
                "WHERE kind = 'gpu_activity' AND json_extract(payload, '$.marker') = 'load-test'"
            ).fetchall()
        assert sorted(rows) == sorted((n, s) for n in SENDERS for s in range(PER_SENDER))
        assert localcluster.process_alive(pid, "slurm_recovery.controller")
    finally:
        localcluster.stop_process(pid, "slurm_recovery.controller")
