"""Bad input against a real controller process (docs/reliability.md#bad-input): random bytes,
random JSON, mutated events, oversized and deeply nested bodies, hostile strings, each sent
over HTTP signed with real MUNGE credentials so it reaches the parsers. Never a 5xx, never a
crash; a 4xx says what was wrong; nothing is stored from a rejected request; hostile text
reaches Slurm only as one argv item and one sanitised line."""

from __future__ import annotations

import http.client
import json
import os
import socket
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract import datagrams, requests
from slurm_recovery.contract.status import HEARTBEAT_PATH, heartbeat_body
from slurm_recovery.contract.wire import EVENT_FIELDS, MAX_EVENTS, event_to_json
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from tests.conftest import _free_port_block

pytestmark = pytest.mark.cluster

#: Examples per fuzz test: 150 in CI; a longer run: SRECOVERY_FUZZ_EXAMPLES=5000 pytest ...
FUZZ = settings(
    max_examples=int(os.environ.get("SRECOVERY_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@dataclass
class Api:
    port: int
    db: Path
    munge_socket: str
    pid: int

    def send(
        self, method: str, path: str, body: bytes = b"", role: str = "sidecar", node: str = "n1"
    ) -> tuple[int, dict]:
        """``body`` signed as ``role`` (for ``node``), sent as is; (status, JSON answer)."""
        headers = requests.sign(
            method, path, body, role=role, node=node if role == "sidecar" else None,
            socket=self.munge_socket,
        )  # fmt: skip
        headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body if method == "POST" else None, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {"raw": raw[:200].decode(errors="replace")}
        return resp.status, answer

    def stored(self) -> tuple[int, int, int]:
        """What a request could have written: evidence rows, mode overrides, actions."""
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True) as conn:
            return tuple(  # type: ignore[return-value]
                conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("evidence", "mode_overrides", "actions")
            )

    def alive(self) -> bool:
        return localcluster.process_alive(self.pid, "slurm_recovery.controller")


@pytest.fixture(scope="module")
def api(local_cluster) -> Iterator[Api]:
    base = Path(tempfile.mkdtemp(prefix="srecovery-fuzz-"))
    base.chmod(0o755)
    port = _free_port_block(1, start=local_cluster.port_base + 800)
    devstack.write_policy(base / "policy.toml", "monitor", "")
    config = devstack.write_config(base, local_cluster, port)
    pid = devstack.start_controller(config, base / "controller.log")
    devstack.wait_healthy(f"http://127.0.0.1:{port}", pid=pid)
    yield Api(port, base / "state.db", str(local_cluster.munge_socket), pid)
    localcluster.stop_process(pid, "slurm_recovery.controller")
    log = (base / "controller.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]  # no handler blew up, even when answered


def refused_cleanly(api: Api, status: int, answer: dict, before: tuple[int, int, int]) -> None:
    assert 400 <= status < 500, (status, answer)
    assert isinstance(answer.get("error"), str) and answer["error"], answer
    assert api.stored() == before


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
hostile_text = st.sampled_from(
    [
        "",
        "\x00",
        "n1\nn2",
        "n1; rm -rf /",
        "$(reboot)",
        "`id`",
        "-n1",
        "--help",
        "n1 n2",
        "n" * 10_000,
        "\u202eevil",
        "\ud800",
        "💥",
        "../../etc/passwd",
        "n[1-100000000]",
    ]
) | st.text(max_size=40)


@FUZZ
@given(
    body=st.binary(max_size=700)
    | st.builds(
        lambda node, condition: json.dumps({"node": node, "condition": condition}).encode(),
        hostile_text | json_values,
        hostile_text | json_values,
    )
)
def test_random_heartbeats_are_refused_cleanly(api, body):
    """A heartbeat's body is two fields or nothing: random bytes and hostile values are a 400
    (413 past its size), nothing is stored, the node is not counted as reporting."""
    before = api.stored()
    status, answer = api.send("POST", HEARTBEAT_PATH, body)
    refused_cleanly(api, status, answer, before)
    assert api.alive()


session_headers = st.builds(
    lambda sid, t, n, mac: f"SRSession id={sid},t={t},n={n},mac={mac}",
    st.text("0123456789abcdef", min_size=32, max_size=32),
    st.floats(min_value=0, max_value=4e9).map(lambda t: f"{t:.3f}"),
    st.integers(min_value=0, max_value=10**17),
    st.text("0123456789abcdef", min_size=64, max_size=64),
)
heartbeat_bodies = (
    st.binary(max_size=600)
    | st.builds(
        heartbeat_body,
        st.sampled_from(["n1", "n2", "nosuch"]),
        st.text("0123456789abcdef", min_size=64, max_size=64),
    )
    | st.builds(
        lambda node, condition: json.dumps({"node": node, "condition": condition}).encode(),
        hostile_text | json_values,
        hostile_text | json_values,
    )
)


@FUZZ
@given(
    data=st.binary(max_size=1500)
    | st.builds(lambda rest: datagrams.MAGIC + rest, st.binary(max_size=900))
    | st.builds(
        lambda header, body: datagrams.MAGIC + header.encode("utf-8", "replace") + b"\n" + body,
        session_headers | hostile_text,
        heartbeat_bodies,
    )
    | st.builds(  # well formed but in no session: refused
        lambda header, node: datagrams.encode(header, heartbeat_body(node, "0" * 64)),
        session_headers,
        st.sampled_from(["n1", "n2"]),
    )
)
def test_random_heartbeat_datagrams_are_dropped_or_refused_cleanly(api, data):
    """The heartbeat port (UDP, listen's port number) takes nothing but a session-signed
    heartbeat: anything else is dropped unanswered or refused (no session matches) in an
    answer never longer than the datagram; nothing stored, the controller alive."""
    before = api.stored()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(0.1)  # an answer comes in about a millisecond
        sock.sendto(data, ("127.0.0.1", api.port))
        try:
            answer = sock.recv(65536)
        except TimeoutError:
            answer = None
    if answer is not None:
        assert len(answer) <= len(data), (data, answer)
        assert json.loads(answer)["error"].startswith("session"), answer
    assert api.stored() == before
    assert api.alive()


@FUZZ
@given(body=st.binary(max_size=2000))
def test_random_bytes_to_ingest_are_refused_cleanly(api, body):
    before = api.stored()
    status, answer = api.send("POST", "/v1/evidence", body)
    if status == 202:  # random bytes that happen to be a valid batch: impossible in practice
        return
    refused_cleanly(api, status, answer, before)


@FUZZ
@given(data=json_values)
def test_random_json_to_ingest_is_refused_cleanly(api, data):
    body = json.dumps({"events": data} if isinstance(data, list) else data).encode()
    before = api.stored()
    status, answer = api.send("POST", "/v1/evidence", body)
    if status == 202:  # only an empty list is impossible; a valid event cannot come out of this
        pytest.fail(f"accepted {body[:200]!r}")
    refused_cleanly(api, status, answer, before)


@FUZZ
@given(
    field=st.sampled_from(sorted(EVENT_FIELDS | {"extra", ""})),
    value=json_values | hostile_text,
    position=st.integers(0, 2),
)
def test_one_bad_field_refuses_the_whole_batch_and_a_good_one_is_stored_whole(
    api, field, value, position
):
    good = [
        event_to_json("progress", time.time(), node="n1", job_id=999_999, payload={"step": i})
        for i in range(3)
    ]
    batch = [dict(event) for event in good]
    batch[position][field] = value
    body = json.dumps({"events": batch}).encode()
    before = api.stored()
    status, answer = api.send("POST", "/v1/evidence", body)
    if status == 202:
        assert answer["accepted"] == 3
        assert api.stored()[0] == before[0] + 3
    else:
        refused_cleanly(api, status, answer, before)
        error = answer["error"]  # names the event at fault
        assert f"events[{position}]" in error or f"event {position}:" in error, error


def test_oversized_deep_huge_and_odd_bodies(api):
    before = api.stored()
    cases = {
        "2 MiB": b'{"events":[' + b" " * (2 << 20) + b"]}",
        "nested 100k": b'{"events":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "too many events": json.dumps(
            {"events": [event_to_json("progress", time.time(), node="n1")] * (MAX_EVENTS + 1)}
        ).encode(),
        "NUL in a string": b'{"events":[{"kind":"xid","node":"n1\\u0000","observed_at":1.7e9}]}',
        "raw NUL": b'{"events":[{"kind":"xid\x00","observed_at":1.7e9}]}',
        "lone surrogate": json.dumps(
            {"events": [event_to_json("xid", time.time(), node="n1", payload={"m": "\ud800"})]}
        ).encode(),
        "NaN time": b'{"events":[{"kind":"xid","node":"n1","observed_at":NaN}]}',
        "NaN payload": b'{"events":[{"kind":"xid","node":"n1","observed_at":1.7e9,'
        b'"payload":{"x":Infinity}}]}',
        "ms not s": json.dumps({"events": [{"kind": "xid", "observed_at": time.time() * 1000}]}),
        "empty": b"",
        "not utf-8": b'{"events":[{"kind":"\xff"}]}',
    }
    for name, body in cases.items():
        body = body if isinstance(body, bytes) else body.encode()
        status, answer = api.send("POST", "/v1/evidence", body)
        assert 400 <= status < 500, (name, status, answer)
        assert status == 413 if name == "2 MiB" else status == 400, (name, status)
        assert api.stored() == before, name
    assert api.alive()


def test_a_full_batch_of_valid_events_is_stored_whole(api):
    before = api.stored()
    batch = [
        event_to_json("progress", time.time(), node="n1", job_id=999_998, payload={"step": i})
        for i in range(MAX_EVENTS)
    ]
    status, answer = api.send("POST", "/v1/evidence", json.dumps({"events": batch}).encode())
    assert status == 202 and answer["accepted"] == MAX_EVENTS
    assert api.stored()[0] == before[0] + MAX_EVENTS


@FUZZ
@given(
    body=st.dictionaries(
        st.sampled_from(["mode", "partition", "reason", "clear", "dry_run", "nodes", "force"])
        | st.text(max_size=6),
        json_values | hostile_text,
        max_size=4,
    ),
    path=st.sampled_from(["/v1/mode", "/v1/drain", "/v1/undrain"]),
)
def test_operator_requests_with_bad_bodies_change_nothing(api, local_cluster, body, path):
    switches = body.get("mode") in ("act", "monitor") or body.get("clear") is True
    if path == "/v1/mode" and switches:
        body["partition"] = 12  # never let a random body switch the live mode: make it invalid
    if path != "/v1/mode" and isinstance(body.get("nodes"), str | list):
        body["nodes"] = ["not-a-node-" + str(len(str(body["nodes"])))]
    before = api.stored()
    status, answer = api.send("POST", path, json.dumps(body).encode(), role="operator")
    refused_cleanly(api, status, answer, before)


def test_hostile_reasons_reach_slurm_as_one_sanitised_line(api, local_cluster):
    scheduler = ScontrolScheduler(timeout=10, slurm_conf=str(local_cluster.slurm_conf))
    reason = "disk\nfull; $(reboot) `id` \x1b[31mred\x1b[0m\t" + "x" * 500 + " \u202eevil"
    status, answer = api.send(
        "POST", "/v1/drain", json.dumps({"nodes": ["n4"], "reason": reason}).encode(), "operator"
    )
    try:
        assert status == 200, answer
        shown = scheduler.get_node("n4").reason
        assert shown.startswith("srecovery-op:") and "disk full; $(reboot) `id`" in shown
        assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in shown)
        assert len(shown) <= 200
    finally:
        status, answer = api.send(
            "POST", "/v1/undrain", json.dumps({"nodes": ["n4"]}).encode(), "operator"
        )
        assert status == 200, answer
    status, answer = api.send(
        "POST", "/v1/drain", json.dumps({"nodes": ["n4"], "reason": "\ud800"}).encode(), "operator"
    )
    assert 400 <= status < 500 or status == 200, answer
    if status == 200:
        api.send("POST", "/v1/undrain", json.dumps({"nodes": ["n4"]}).encode(), "operator")


@FUZZ
@given(
    path=st.sampled_from(
        [
            *("/v1/incidents", "/v1/incidents/", "/v1/jobs/", "/v1/nodes/", "/v1/audit"),
            *("/v1/status", "/v1/audit/rows", "/v1/history/incidents", "/v1/history/slurm"),
        ]
    ),
    tail=st.text(alphabet="0123456789abcxyz-_.%~", max_size=12),
    query=st.dictionaries(
        st.sampled_from(["since", "until", "job", "node", "class", "state", "kind", "limit"])
        | st.sampled_from(["after", "evidence", "seq", "x"]),
        st.text(alphabet="0123456789abcxyz-_.:%+ ", max_size=12),
        max_size=3,
    ),
)
def test_read_endpoints_never_fail_on_odd_paths_and_queries(api, path, tail, query):
    from urllib.parse import urlencode

    full = path + (tail if path.endswith("/") else "") + ("?" + urlencode(query) if query else "")
    status, answer = api.send("GET", full, role="reader")
    assert status < 500, (full, status, answer)
    if status >= 400:
        assert answer.get("error"), (full, answer)
