"""Sidecar sessions against a real controller and real munged (issue 29, item 2): one MUNGE
credential opens a session, its key signs the reports; a replayed, forged or moved request is
refused, the key credential is for the sidecar's uid only, a restarted controller's sidecars
open new sessions on their own, and a controller without sessions gets MUNGE per request."""

from __future__ import annotations

import http.client
import json
import pwd
import subprocess
import time
import urllib.request
from urllib.parse import urlsplit

import pytest

from slurm_recovery.contract import requests, sessions
from slurm_recovery.contract.client import ClientError, ControllerClient
from slurm_recovery.contract.status import HEARTBEAT_PATH, heartbeat_body, payload_digest
from slurm_recovery.contract.wire import event_to_json
from slurm_recovery.store import Store
from tests.integration.test_controller import scheduler, stacks  # noqa: F401

pytestmark = pytest.mark.cluster

NODE = "n2"


def body_for(kind: str = "test_event", node: str = NODE, **payload) -> bytes:
    event = event_to_json(kind, time.time(), node=node, payload=payload)
    return json.dumps({"events": [event]}, separators=(",", ":")).encode()


def raw_post(
    url: str, path: str, body: bytes, headers: dict[str, str], source: str = "127.0.0.1"
) -> tuple[int, dict]:
    """One request from ``source`` (another loopback address stands for another host)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(
        parts.hostname, parts.port, timeout=10, source_address=(source, 0)
    )
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json", **headers})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def test_a_sidecar_reports_in_a_session_that_nothing_else_can_use(stacks, local_cluster):  # noqa: F811
    stack = stacks("monitor")
    sock = str(local_cluster.munge_socket)
    client = ControllerClient(stack.url, munge_socket=sock, sessions=True)
    for i in range(3):
        client.post_evidence(json.loads(body_for(seq=i))["events"], role="sidecar", node=NODE)
    session = client._session
    assert session is not None and session.counter == 3  # one session, three reports

    def fresh(body: bytes) -> str:
        """The next request of the session, signed as the client signs it."""
        session.counter += 1
        return sessions.authorization(
            session.id,
            session.key,
            "POST",
            "/v1/evidence",
            body,
            now=time.time(),
            counter=session.counter,
        )

    # the exact request again: replayed
    body = body_for(seq=99)
    header = fresh(body)
    assert raw_post(stack.url, "/v1/evidence", body, {"Authorization": header})[0] == 202
    status, answer = raw_post(stack.url, "/v1/evidence", body, {"Authorization": header})
    assert status == 401 and "replayed" in answer["error"], answer

    # another body under that signature; a flipped MAC
    good = fresh(body_for(seq=100))
    status, answer = raw_post(stack.url, "/v1/evidence", body_for(seq=101), {"Authorization": good})
    assert status == 401 and "MAC" in answer["error"]
    forged = good[:-1] + ("0" if good[-1] != "0" else "1")
    assert (
        raw_post(stack.url, "/v1/evidence", body_for(seq=100), {"Authorization": forged})[0] == 401
    )
    # the same session from another host's address
    moved = body_for(seq=102)
    status, answer = raw_post(
        stack.url, "/v1/evidence", moved, {"Authorization": fresh(moved)}, source="127.0.0.2"
    )
    assert status == 401 and "used from 127.0.0.2" in answer["error"], answer
    # n2's session speaks for n2 only
    about_n3 = body_for(node="n3")
    status, answer = raw_post(
        stack.url, "/v1/evidence", about_n3, {"Authorization": fresh(about_n3)}
    )
    assert status == 403 and "speaks only for n2" in answer["error"], answer

    with Store.open(stack.db, readonly=True) as store:
        stored = sorted(
            r.evidence.payload["seq"] for r in store.find_evidence() if "seq" in r.evidence.payload
        )
    assert stored == [0, 1, 2, 99]


def test_only_a_sidecar_opens_a_session_and_only_its_uid_reads_the_key(stacks, local_cluster):  # noqa: F811
    stack = stacks("monitor")
    sock = str(local_cluster.munge_socket)
    for role, node, code in (("hook", NODE, 403), ("operator", None, 403), ("reader", None, 403)):
        headers = requests.sign("POST", "/v1/session", b"{}", role=role, node=node, socket=sock)
        status, answer = raw_post(stack.url, "/v1/session", b"{}", headers)
        assert status == code, (role, answer)
    headers = requests.sign("POST", "/v1/session", b"{}", role="sidecar", node=NODE, socket=sock)
    status, answer = raw_post(stack.url, "/v1/session", b"{}", headers)
    assert status == 201 and answer["ttl"] == 3600, answer
    nobody = pwd.getpwnam("nobody")
    out = subprocess.run(
        ["unmunge", "-S", sock],
        input=answer["key"],
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert out.returncode != 0 and "Unauthorized" in out.stderr, out
    # the same credential a second time: a replayed MUNGE credential opens nothing
    status, answer = raw_post(stack.url, "/v1/session", b"{}", headers)
    assert status == 401 and "replayed" in answer["error"]
    # a session cannot open a session
    status, _ = raw_post(stack.url, "/v1/session", b"{}", {"Authorization": "SRSession id=0"})
    assert status == 401


def test_a_restarted_controllers_sidecar_opens_a_new_session(stacks, local_cluster):  # noqa: F811
    stack = stacks("monitor")
    client = ControllerClient(
        stack.url, munge_socket=str(local_cluster.munge_socket), sessions=True
    )
    client.post_evidence(json.loads(body_for(seq=1))["events"], role="sidecar", node=NODE)
    first = client._session
    stack.stop()
    stack.start()
    client.post_evidence(json.loads(body_for(seq=2))["events"], role="sidecar", node=NODE)
    assert client._session is not None and client._session.id != first.id
    with Store.open(stack.db, readonly=True) as store:
        assert sum(1 for r in store.find_evidence() if "seq" in r.evidence.payload) == 2


def test_a_controller_without_sessions_gets_munge_per_request(stacks, local_cluster):  # noqa: F811
    stack = stacks("monitor", start=False)
    stack.config.write_text(
        stack.config.read_text().replace("[auth]\n", "[auth]\nsessions = false\n", 1)
    )
    stack.start()
    client = ControllerClient(
        stack.url, munge_socket=str(local_cluster.munge_socket), sessions=True
    )
    client.post_evidence(json.loads(body_for(seq=1))["events"], role="sidecar", node=NODE)
    assert client._session is None and client._no_sessions_until > time.time()
    status, answer = raw_post(
        stack.url, "/v1/evidence", body_for(), {"Authorization": "SRSession id=0"}
    )
    assert status == 401 and "off" in answer["error"]


def test_a_status_that_changes_nothing_is_answered_and_not_stored(stacks, local_cluster):  # noqa: F811
    """Issue 29: a sidecar's status in its session, on its kept connection, as the sidecar
    sends it. Only a change is stored; the node's report is current in ``srecovery nodes``;
    a malformed or misdirected status is refused on that path as on the other; and a
    restarted controller knows the report it held (written at shutdown)."""
    stack = stacks("monitor")
    client = ControllerClient(
        stack.url, munge_socket=str(local_cluster.munge_socket), sessions=True, keep_alive=True
    )

    def status(**payload) -> dict:
        base = {"version": "1", "started_at": 1.0, "dropped": 0, "sources": {"kmsg": "ok"}}
        return json.loads(body_for("sidecar_status", **{**base, **payload}))["events"][0]

    def send(event: dict) -> list[int]:
        return client.post_evidence([event], role="sidecar", node=NODE)["ids"]

    assert len(send(status(queued=0))) == 1  # the node's first report
    for queued in range(1, 6):
        assert send(status(queued=queued)) == []  # readings only: no news
    assert len(send(status(queued=6, dropped=2))) == 1  # the sidecar dropped events
    assert send(status(queued=7, dropped=2)) == []
    node = client.get(f"/v1/nodes/{NODE}")["sidecar"]
    assert node["reports_since_change"] == 2 and node["dropped"] == 2, node

    bad = status()
    bad["payload"]["readings"] = float("nan")
    with pytest.raises(ClientError) as info:
        send(bad)
    assert info.value.status == 400 and "NaN" in info.value.reason
    with pytest.raises(ClientError) as info:
        send({**status(), "node": "n3"})
    assert info.value.status == 403 and "speaks only for n2" in info.value.reason

    stack.stop()
    stack.start()
    assert send(status(queued=8, dropped=2)) == []  # the report survived the restart
    assert client.get(f"/v1/nodes/{NODE}")["sidecar"]["reports_since_change"] == 3
    with Store.open(stack.db, readonly=True) as store:
        stored = [r for r in store.find_evidence() if r.evidence.kind == "sidecar_status"]
    assert [r.evidence.payload["queued"] for r in stored] == [0, 6]


def test_a_heartbeat_stands_for_the_status_the_controller_holds(stacks, local_cluster):  # noqa: F811
    """Issue 29: after one full status, a heartbeat naming its condition's digest is answered
    "held" in the session (nothing stored, the report counts it), a digest of another condition
    or of a node never heard "wanted"; MUNGE-signed heartbeats work too; a heartbeat speaks
    only for the sidecar's own node, never for a hook, is refused malformed, replayed or moved;
    and a restarted controller still holds the report."""
    stack = stacks("monitor")
    sock = str(local_cluster.munge_socket)
    client = ControllerClient(stack.url, munge_socket=sock, sessions=True, keep_alive=True)
    quiet = {"version": "1", "started_at": 1.0, "dropped": 0, "sources": {"kmsg": "ok"}}
    digest = payload_digest(quiet)

    assert client.post_heartbeat(NODE, digest) == {"status": "wanted"}  # holds nothing yet
    event = json.loads(body_for("sidecar_status", **quiet, queued=3))["events"][0]
    assert len(client.post_evidence([event], role="sidecar", node=NODE)["ids"]) == 1
    for _ in range(3):
        assert client.post_heartbeat(NODE, digest) == {"status": "held"}
    shown = client.get(f"/v1/nodes/{NODE}")["sidecar"]
    assert shown["reports_since_change"] == 4 and shown["silent_for"] < 5, shown
    assert client.post_heartbeat(NODE, payload_digest({**quiet, "dropped": 1})) == {
        "status": "wanted"
    }
    # signed with MUNGE instead of a session
    munge_client = ControllerClient(stack.url, munge_socket=sock)
    assert munge_client.post_heartbeat(NODE, digest) == {"status": "held"}

    # refusals: another node, a hook's credential, a malformed body, a replay, another host
    with pytest.raises(ClientError) as info:
        client.post_heartbeat("n3", digest)
    assert info.value.status == 403 and "speaks only for n2" in info.value.reason
    body = heartbeat_body(NODE, digest)
    hook = requests.sign("POST", HEARTBEAT_PATH, body, role="hook", node=NODE, socket=sock)
    status, answer = raw_post(stack.url, HEARTBEAT_PATH, body, hook)
    assert status == 403 and "sidecars only" in answer["error"], answer
    with pytest.raises(ClientError) as info:
        client.request("POST", HEARTBEAT_PATH, b'{"node": "n2"}', role="sidecar", node=NODE)
    assert info.value.status == 400 and "heartbeat" in info.value.reason
    session = client._session
    assert session is not None

    def signed() -> str:
        """The session's next heartbeat, signed as the client signs it."""
        session.counter += 1
        return sessions.authorization(
            session.id,
            session.key,
            "POST",
            HEARTBEAT_PATH,
            body,
            now=time.time(),
            counter=session.counter,
        )

    header = signed()
    assert raw_post(stack.url, HEARTBEAT_PATH, body, {"Authorization": header})[0] == 200
    status, answer = raw_post(stack.url, HEARTBEAT_PATH, body, {"Authorization": header})
    assert status == 401 and "replayed" in answer["error"], answer
    moved = signed()
    status, answer = raw_post(
        stack.url, HEARTBEAT_PATH, body, {"Authorization": moved}, source="127.0.0.2"
    )
    assert status == 401 and "used from 127.0.0.2" in answer["error"], answer

    metrics = urllib.request.urlopen(f"{stack.url}/metrics", timeout=5).read().decode()
    assert 'srecovery_heartbeats_total{answer="held"} 5.0' in metrics, metrics
    assert 'srecovery_heartbeats_total{answer="wanted"} 2.0' in metrics

    stack.stop()
    stack.start()
    assert client.post_heartbeat(NODE, digest) == {"status": "held"}  # a new session, same report
    with Store.open(stack.db, readonly=True) as store:
        stored = [r for r in store.find_evidence() if r.evidence.kind == "sidecar_status"]
    assert [r.evidence.payload["queued"] for r in stored] == [3]
