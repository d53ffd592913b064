"""The client's connection (contract/client.py): a sidecar keeps one open between reports, a
CLI closes it, and a kept connection the controller closed meanwhile costs no report. Against
a real HTTP/1.1 server on this host (http.server, in a thread), counting connections."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slurm_recovery.contract import client as client_module
from slurm_recovery.contract.client import ClientError, ControllerClient
from slurm_recovery.controller import KEEPALIVE_TIMEOUT
from slurm_recovery.sidecar.daemon import FULL_STATUS_INTERVAL, STATUS_INTERVAL


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.connections = 0
        self.requests: list[tuple[str, str, bytes, str]] = []  # method, path, body, Connection
        self.close_after_answer = False  # the controller's idle limit, or a restart
        self.delay = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(body)

    def do_GET(self) -> None:
        self._answer(b"")

    def _answer(self, body: bytes) -> None:
        # Read when the request arrives: the test flips it as soon as the answer is back, which
        # can be before this thread, having written the answer, would look at it.
        close = self.server.close_after_answer
        self.server.requests.append(
            (self.command, self.path, body, self.headers.get("Connection", ""))
        )
        time.sleep(self.server.delay)
        if self.path.endswith("/refused"):
            status, answer = 403, {"error": "sidecar for n2 sent from 10.0.0.9"}
        else:
            status, answer = 202, {"accepted": 1, "ids": []}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if close:
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def post(client: ControllerClient, path: str = "/v1/evidence") -> object:
    return client.request("POST", path, b'{"events":[]}', role="sidecar", node="n1")


def test_a_sidecar_reports_on_one_connection(server: Server):
    client = ControllerClient(server.url, insecure=True, keep_alive=True)
    for _ in range(5):
        assert post(client) == {"accepted": 1, "ids": []}
    assert server.connections == 1 and len(server.requests) == 5
    assert {r[3] for r in server.requests} == {""}  # HTTP/1.1's default: kept alive


def test_a_cli_opens_one_connection_a_request_and_says_so(server: Server):
    client = ControllerClient(server.url, insecure=True)
    for _ in range(3):
        post(client)
    assert server.connections == 3
    assert {r[3] for r in server.requests} == {"close"}


def test_a_connection_the_controller_closed_costs_no_report(server: Server):
    """The controller restarted, or closed the connection as idle: the next report goes on a
    new connection, once (the controller never read it on the old one)."""
    client = ControllerClient(server.url, insecure=True, keep_alive=True)
    post(client)
    server.close_after_answer = True
    post(client)  # answered, then closed by the server
    server.close_after_answer = False
    time.sleep(0.1)
    assert post(client) == {"accepted": 1, "ids": []}  # sent on the closed one, then again
    assert len(server.requests) == 3 and server.connections == 2


def test_an_idle_connection_is_not_reused(server: Server, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(client_module, "KEEP_ALIVE_IDLE", 0.05)
    client = ControllerClient(server.url, insecure=True, keep_alive=True)
    post(client)
    post(client)
    time.sleep(0.1)
    post(client)
    assert server.connections == 2


def test_a_request_that_timed_out_is_not_sent_again(server: Server):
    """The controller read it and may have stored it: the caller (the sidecar's outbox)
    decides, on a clear error, not the connection."""
    client = ControllerClient(server.url, insecure=True, keep_alive=True, timeout=0.2)
    post(client)
    server.delay = 0.5
    with pytest.raises(ClientError) as info:
        post(client)
    assert info.value.status == 0 and "unreachable" in info.value.reason
    time.sleep(0.5)
    assert len(server.requests) == 2


def test_refusals_and_no_controller_are_client_errors(server: Server):
    client = ControllerClient(server.url + "/", insecure=True, keep_alive=True)
    with pytest.raises(ClientError) as info:
        post(client, "/refused")
    assert info.value.status == 403 and info.value.reason == "sidecar for n2 sent from 10.0.0.9"
    assert post(client) == {"accepted": 1, "ids": []}  # the connection survives a refusal
    assert server.connections == 1
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    gone = ControllerClient(f"http://127.0.0.1:{port}", insecure=True, keep_alive=True)
    with pytest.raises(ClientError) as info:
        post(gone)
    assert info.value.status == 0 and "unreachable" in info.value.reason
    with pytest.raises(ClientError, match="expected http"):
        post(ControllerClient("ftp://controller", insecure=True))


def test_a_kept_connection_sends_tcp_keepalive_probes(server: Server):
    """A firewall between node and controller keeps an idle connection's state, and a
    controller host gone silent is noticed: the kept socket probes after 30 s idle."""
    client = ControllerClient(server.url, insecure=True, keep_alive=True)
    post(client)
    sock = client._conn.sock  # type: ignore[union-attr]
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    idle, interval, count = client_module.TCP_KEEPALIVE
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == idle
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == interval
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == count


def test_a_cli_connection_is_not_kept_and_not_probed(server: Server):
    client = ControllerClient(server.url, insecure=True)
    post(client)
    assert client._conn is None


def test_a_connection_outlives_the_full_status_interval_and_the_controller_outlives_it():
    """With heartbeats as datagrams, the sidecar's connection carries a full status every
    five minutes (and the findings between): it must still be open at the next one, a status
    period late included (the client's idle limit is longer), and the controller must not be
    the side that closes it (its idle limit is longer still), so no report meets a closing
    connection, and a fabric-wide burst of findings goes on open connections."""
    longest_quiet = FULL_STATUS_INTERVAL + STATUS_INTERVAL
    assert longest_quiet < client_module.KEEP_ALIVE_IDLE < KEEPALIVE_TIMEOUT
    assert client_module.TCP_KEEPALIVE[0] < client_module.KEEP_ALIVE_IDLE


def test_a_refused_connection_leaves_nothing_to_reuse():
    """The controller is down: the error is the client's usual one, and the next request
    opens a new connection rather than reusing the one that never connected."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again before the request: nothing listens
    client = ControllerClient(f"http://127.0.0.1:{port}", insecure=True, keep_alive=True)
    with pytest.raises(ClientError, match="unreachable"):
        post(client)
    assert client._conn is None
