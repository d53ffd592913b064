"""Heartbeats as UDP datagrams (contract.datagrams) against a real controller and real munged:
answered and signed in the session; refused when replayed, moved to another address, forged,
for another node, or signed as an HTTP heartbeat; never answered longer than they came, nor at
all when they are not heartbeats; a restarted controller's refusal sends the sidecar's client
over HTTP into a new session, and a controller that offers no port keeps it on HTTP."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request

import pytest

from slurm_recovery.contract import datagrams, sessions
from slurm_recovery.contract.client import ControllerClient
from slurm_recovery.contract.status import HEARTBEAT_PATH, heartbeat_body, payload_digest
from tests.integration.test_controller import scheduler, stacks  # noqa: F401
from tests.integration.test_sessions import NODE, body_for

pytestmark = pytest.mark.cluster

QUIET = {"version": "1", "started_at": 1.0, "dropped": 0, "sources": {"kmsg": "ok"}}


def exchange(port: int, data: bytes, source: str = "127.0.0.1", wait: float = 2.0) -> bytes | None:
    """One datagram to the controller's port from ``source``; its answer, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((source, 0))
        sock.settimeout(wait)
        sock.sendto(data, ("127.0.0.1", port))
        try:
            return sock.recv(4096)
        except TimeoutError:
            return None


def metric(url: str, name: str, label: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    found = re.search(rf"{name}\{{{label}\}} ([0-9.]+)", text)
    assert found, text[-3000:]
    return float(found.group(1))


def test_heartbeat_datagrams_are_answered_in_the_session_and_refused_outside_it(
    stacks,  # noqa: F811
    local_cluster,
):
    stack = stacks("monitor")
    sock = str(local_cluster.munge_socket)
    client = ControllerClient(
        stack.url, munge_socket=sock, sessions=True, keep_alive=True, datagrams=True
    )
    digest = payload_digest(QUIET)
    assert client.post_heartbeat(NODE, digest) == {"status": "wanted"}  # holds nothing yet
    session = client._session
    port = int(stack.url.rsplit(":", 1)[1])
    assert session is not None and session.datagram_port == port  # offered on the HTTP port
    event = json.loads(body_for("sidecar_status", **QUIET, queued=3))["events"][0]
    assert len(client.post_evidence([event], role="sidecar", node=NODE)["ids"]) == 1
    for _ in range(3):
        assert client.post_heartbeat(NODE, digest) == {"status": "held"}
    answered = 'outcome="answered"'
    assert metric(stack.url, "srecovery_heartbeat_datagrams_total", answered) == 4
    assert metric(stack.url, "srecovery_heartbeats_total", 'answer="held"') == 3
    shown = client.get(f"/v1/nodes/{NODE}")["sidecar"]
    assert shown["reports_since_change"] == 4 and shown["silent_for"] < 5, shown

    body = heartbeat_body(NODE, digest)

    def signed(method: str = datagrams.METHOD, node_body: bytes = body) -> str:
        session.counter += 1
        return sessions.authorization(
            session.id,
            session.key,
            method,
            HEARTBEAT_PATH,
            node_body,
            now=time.time(),
            counter=session.counter,
        )

    # a datagram signed as the client signs it: answered, and the answer verifies
    authorization = signed()
    data = datagrams.encode(authorization, body)
    reply = exchange(port, data)
    assert reply is not None
    assert datagrams.read_answer(reply, session.key, authorization) == "held"

    def refused(data: bytes, source: str = "127.0.0.1") -> str:
        reply = exchange(port, data, source)
        assert reply is not None, "no answer"
        assert len(reply) <= len(data)  # never longer than what came
        return json.loads(reply)["error"]

    assert "replayed" in refused(data)  # the same datagram again
    assert "used from 127.0.0.2" in refused(datagrams.encode(signed(), body), "127.0.0.2")
    forged = signed()
    forged = forged[:-4] + ("0000" if not forged.endswith("0000") else "1111")
    assert "MAC does not match" in refused(datagrams.encode(forged, body))
    # an HTTP heartbeat's signature does not stand for a datagram's
    assert "MAC does not match" in refused(datagrams.encode(signed("POST"), body))
    other = heartbeat_body("n3", digest)
    assert "speaks only for n2" in refused(datagrams.encode(signed(node_body=other), other))
    # not heartbeats: dropped without an answer
    assert exchange(port, b"hello", wait=0.5) is None
    assert exchange(port, datagrams.MAGIC + b"MUNGE abc\n" + body, wait=0.5) is None
    assert exchange(port, b"x" * 4000, wait=0.5) is None
    assert metric(stack.url, "srecovery_heartbeat_datagrams_total", 'outcome="refused"') == 5
    assert metric(stack.url, "srecovery_heartbeat_datagrams_total", 'outcome="dropped"') == 3

    # a restarted controller forgot the session: the datagram is refused, the client goes
    # over HTTP into a new session, and the next heartbeat is a datagram again
    stack.stop()
    stack.start()
    assert client.post_heartbeat(NODE, digest) == {"status": "held"}
    assert client._session is not None and client._session is not session
    assert metric(stack.url, "srecovery_heartbeats_total", 'answer="held"') == 1  # by HTTP
    assert client.post_heartbeat(NODE, digest) == {"status": "held"}
    assert metric(stack.url, "srecovery_heartbeat_datagrams_total", answered) == 1
    assert client._datagram_misses == 0


def test_a_controller_without_heartbeat_datagrams_keeps_heartbeats_on_http(
    stacks,  # noqa: F811
    local_cluster,
):
    stack = stacks("monitor", start=False)
    text = stack.config.read_text()
    stack.config.write_text(
        text.replace("[controller]\n", "[controller]\nheartbeat_datagrams = false\n", 1)
    )
    stack.start()
    port = int(stack.url.rsplit(":", 1)[1])
    client = ControllerClient(
        stack.url,
        munge_socket=str(local_cluster.munge_socket),
        sessions=True,
        keep_alive=True,
        datagrams=True,
    )
    event = json.loads(body_for("sidecar_status", **QUIET))["events"][0]
    client.post_evidence([event], role="sidecar", node=NODE)
    assert client._session is not None and client._session.datagram_port is None
    started = time.monotonic()
    assert client.post_heartbeat(NODE, payload_digest(QUIET)) == {"status": "held"}
    assert time.monotonic() - started < datagrams.ANSWER_WAIT  # no wait for a datagram
    assert metric(stack.url, "srecovery_heartbeat_datagrams_total", 'outcome="answered"') == 0
    # and nothing listens on the UDP port: a datagram signed in the session, which an open
    # port would answer (held), gets no answer
    session = client._session
    body = heartbeat_body(NODE, payload_digest(QUIET))
    session.counter += 1
    signed = datagrams.sign(session.id, session.key, body, now=time.time(), counter=session.counter)
    assert exchange(port, datagrams.encode(signed, body), wait=0.3) is None
