"""Heartbeat datagrams (contract.datagrams): the wire format, the answer's binding to its
request, and the client's side against a UDP socket playing the controller: it takes only a
verified answer to its own request, and goes over HTTP on silence, refusal or no port."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.contract import client as client_module
from slurm_recovery.contract import datagrams, sessions
from slurm_recovery.contract.client import ControllerClient, _Session
from slurm_recovery.contract.status import HEARTBEAT_PATH, heartbeat_body
from slurm_recovery.contract.wire import WireError

KEY = bytes(range(32))
SESSION_ID = "ab" * 16
BODY = heartbeat_body("n1", "0" * 64)


def signed(counter: int = 1, body: bytes = BODY) -> str:
    return datagrams.sign(SESSION_ID, KEY, body, now=1_700_000_000.0, counter=counter)


def test_a_datagram_carries_the_session_signature_and_the_body():
    authorization = signed()
    assert datagrams.decode(datagrams.encode(authorization, BODY)) == (authorization, BODY)
    # the signature covers DATAGRAM, not POST: an HTTP heartbeat's does not stand for it
    ts = "1700000000.000"
    assert authorization.endswith(sessions.mac(KEY, "DATAGRAM", HEARTBEAT_PATH, BODY, ts, 1))
    assert authorization != sessions.authorization(
        SESSION_ID, KEY, "POST", HEARTBEAT_PATH, BODY, now=1_700_000_000.0, counter=1
    )


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "not a heartbeat datagram"),
        (b"GET / HTTP/1.1\r\n\r\n", "not a heartbeat datagram"),
        (datagrams.MAGIC + b"SRSession id=1", "an Authorization line"),
        (datagrams.MAGIC + b"MUNGE:cred\n{}", "only a session's signature"),
        (datagrams.MAGIC + "SRSession \u00e9\n{}".encode(), "not ASCII"),
        (datagrams.MAGIC + b"SRSession " + b"x" * 300 + b"\n{}", "an Authorization line"),
        (b"x" * (datagrams.MAX_DATAGRAM_BYTES + 1), "at most"),
    ],
)
def test_what_is_not_a_heartbeat_datagram_says_why(data, why):
    with pytest.raises(WireError, match=why):
        datagrams.decode(data)


@given(st.binary(max_size=1200))
def test_any_bytes_decode_or_say_why(data):
    try:
        authorization, _ = datagrams.decode(data)
    except WireError:
        return
    assert sessions.is_session(authorization) and len(data) <= datagrams.MAX_DATAGRAM_BYTES


@given(st.text(max_size=300), st.integers(min_value=17, max_value=1200))
def test_a_refusal_is_json_and_never_longer_than_the_datagram(reason, limit):
    """17 bytes: the shortest datagram that decodes (the magic, "SRSession ", a newline)."""
    text = datagrams.refusal(reason, limit)
    assert len(text) <= limit
    assert set(json.loads(text)) == {"error"}
    with pytest.raises(datagrams.DatagramRefused):
        datagrams.read_answer(text, KEY, signed())


def test_an_answer_is_taken_only_for_its_request_and_from_the_key_holder():
    authorization = signed(5)
    answer = datagrams.answer(KEY, authorization, "held")
    assert datagrams.read_answer(answer, KEY, authorization) == "held"
    assert datagrams.read_answer(datagrams.answer(KEY, authorization, "wanted"), KEY, authorization)
    with pytest.raises(WireError, match="MAC"):  # an answer to an earlier heartbeat
        datagrams.read_answer(answer, KEY, signed(6))
    with pytest.raises(WireError, match="MAC"):  # made without the session's key
        datagrams.read_answer(
            datagrams.answer(b"k" * 32, authorization, "held"), KEY, authorization
        )
    forged = json.loads(answer)
    forged["status"] = "wanted"
    with pytest.raises(WireError, match="MAC"):
        datagrams.read_answer(json.dumps(forged).encode(), KEY, authorization)
    for bad in (b"\xff", b"[]", b'{"status": "held"}', b'{"status": 1, "mac": "x"}'):
        with pytest.raises(WireError):
            datagrams.read_answer(bad, KEY, authorization)


# --- the client against a socket playing the controller ------------------------------------

Reply = Callable[[bytes], list[bytes]]


@pytest.fixture
def controller_port() -> Iterator[Callable[[Reply], int]]:
    """A UDP socket on loopback that answers each datagram with what ``reply`` returns."""
    socks: list[socket.socket] = []

    def start(reply: Reply) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        socks.append(sock)

        def serve() -> None:
            while True:
                try:
                    data, addr = sock.recvfrom(4096)
                except OSError:
                    return
                for answer in reply(data):
                    sock.sendto(answer, addr)

        threading.Thread(target=serve, daemon=True).start()
        return sock.getsockname()[1]

    yield start
    for sock in socks:
        sock.close()


def client_in_session(port: int | None) -> ControllerClient:
    """A sidecar's client with an open session (its controller's HTTP port answers nothing)."""
    client = ControllerClient("http://127.0.0.1:9", sessions=True, datagrams=True, timeout=1)
    client._session = _Session(SESSION_ID, KEY, time.time() + 3600, 0, port)
    return client


def answer_as(status: str) -> Reply:
    def reply(data: bytes) -> list[bytes]:
        authorization, _ = datagrams.decode(data)
        return [datagrams.answer(KEY, authorization, status)]

    return reply


def test_the_client_takes_the_controllers_signed_answer(controller_port):
    client = client_in_session(controller_port(answer_as("held")))
    assert client.post_heartbeat("n1", "0" * 64) == {"status": "held"}
    assert client._session is not None and client._session.counter == 1


def test_the_client_passes_over_stale_and_forged_answers_to_its_own(controller_port):
    def reply(data: bytes) -> list[bytes]:
        authorization, _ = datagrams.decode(data)
        return [
            datagrams.answer(KEY, signed(999), "held"),  # to another request
            datagrams.answer(b"x" * 32, authorization, "held"),  # not the key holder
            b"noise",
            datagrams.answer(KEY, authorization, "wanted"),
        ]

    client = client_in_session(controller_port(reply))
    assert client.post_heartbeat("n1", "0" * 64) == {"status": "wanted"}
    assert client._datagram_misses == 0


def test_silence_sends_over_http_and_three_in_a_row_turn_datagrams_off(
    controller_port, monkeypatch
):
    monkeypatch.setattr(datagrams, "ANSWER_WAIT", 0.05)
    seen: list[bytes] = []
    client = client_in_session(controller_port(lambda data: seen.append(data) or []))
    for misses in (1, 2):
        assert client._heartbeat_datagram("n1", BODY) is None
        assert client._datagram_misses == misses
    assert client._heartbeat_datagram("n1", BODY) is None
    assert client._datagram_misses == 0
    assert client._datagrams_off_until > time.monotonic() + client_module.DATAGRAMS_OFF - 5
    # off: post_heartbeat goes straight to HTTP (here: nobody on port 9), no fourth datagram
    with pytest.raises(client_module.ClientError, match="unreachable"):
        client.post_heartbeat("n1", "0" * 64)
    time.sleep(0.05)
    assert len(seen) == 3


def test_a_session_refusal_forgets_the_session_for_http_to_open_another(controller_port):
    def reply(data: bytes) -> list[bytes]:
        return [datagrams.refusal("session unknown or expired: open a new one", len(data))]

    client = client_in_session(controller_port(reply))
    assert client._heartbeat_datagram("n1", BODY) is None
    assert client._session is None and client._datagram_misses == 1


def test_no_port_offered_means_no_datagram():
    client = client_in_session(None)
    started = time.monotonic()
    assert client._heartbeat_datagram("n1", BODY) is None
    assert time.monotonic() - started < 0.05  # no wait for an answer
    assert client._session is not None and client._session.counter == 0  # nothing signed
    assert client._udp is None  # no socket opened
