"""A small synchronous client of the controller's API, signing each request with MUNGE.

Used by ``srecovery``, the hooks and the sidecars. Standard library HTTP: one request at a
time is all a CLI needs. A sidecar's client (``sessions=True``) opens a session with one MUNGE
credential and signs its reports with the session's key (``contract.sessions``); it opens a
new one when the controller forgets it, and signs each request with MUNGE again when the
controller offers no sessions. It also keeps its connection open (``keep_alive=True``)
between reports less than :data:`KEEP_ALIVE_IDLE` apart: a new TCP connection per report
costs the controller about as much as the report itself (docs/performance.md).
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from typing import Any

from slurm_recovery.contract import datagrams, munge, requests, sessions, status
from slurm_recovery.contract.wire import WireError

log = logging.getLogger(__name__)

#: After the controller said it offers no sessions (404), ask again this much later.
NO_SESSIONS_RETRY = 600.0
#: A session is renewed this long before the controller's expiry.
RENEW_MARGIN = 60.0
#: A kept-alive connection idle this long is closed before the next request, and a new one
#: opened. Longer than the sidecar's default full-status interval (5 min) and one status
#: period (heartbeats go as datagrams between full statuses, so those are what use the
#: connection), so a sidecar's statuses and the findings between them all go on one
#: connection: when every node of a fabric reports at once, 10,000 requests on open
#: connections are answered in about 1.2 s (p99), on 10,000 new ones in 2.4-2.9 s
#: (docs/performance.md, "The burst on kept connections"). Well inside the controller's own
#: idle limit (controller.KEEPALIVE_TIMEOUT), so a request never meets a connection the
#: controller is closing.
KEEP_ALIVE_IDLE = 420.0
#: TCP keepalive on a kept connection (seconds idle, between probes, probes): a firewall or
#: NAT between node and controller keeps the connection's state while it is idle, and a
#: controller host gone without a word is found before the next report waits on it.
TCP_KEEPALIVE = (30, 10, 3)
#: Heartbeat datagrams unanswered (or refused) in a row after which heartbeats go over HTTP
#: for :data:`DATAGRAMS_OFF` seconds (a firewall that drops UDP, a NAT that changes address).
DATAGRAM_MISSES = 3
DATAGRAMS_OFF = 3600.0


def keep_tcp_alive(sock: socket.socket) -> None:
    """Turn on TCP keepalive probes (:data:`TCP_KEEPALIVE`) where the platform has them."""
    idle, interval, count = TCP_KEEPALIVE
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", interval),
        ("TCP_KEEPCNT", count),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


class ClientError(Exception):
    """The controller refused the request or could not be reached; ``status`` 0 = no answer."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}" if status else reason)
        self.status = status
        self.reason = reason


@dataclass
class _Session:
    id: str
    key: bytes
    expires_at: float  # by this host's clock
    counter: int = 0
    datagram_port: int | None = None  # where the controller takes heartbeat datagrams


class ControllerClient:
    def __init__(
        self,
        url: str,
        *,
        munge_socket: str | None = None,
        insecure: bool = False,
        timeout: float = 10.0,
        ca_file: str | None = None,
        sessions: bool = False,
        keep_alive: bool = False,
        datagrams: bool = False,
    ) -> None:
        """``insecure``: send no MUNGE credential (a controller started with
        --insecure-no-auth). ``ca_file``: the CAs trusted for an https:// ``url`` (None: the
        system's); the certificate and the host name are always verified. ``sessions``: sign a
        sidecar's requests in a session (one MUNGE credential per session, not per request).
        ``keep_alive``: one connection for requests less than KEEP_ALIVE_IDLE apart.
        ``datagrams``: send heartbeats as UDP datagrams in the session when the controller
        offers a port for them (contract.datagrams), over HTTP when it does not answer."""
        self.url = url.rstrip("/")
        self.keep_alive = keep_alive
        self._conn: HTTPConnection | None = None
        self._conn_used = 0.0  # time.monotonic() of its last answer
        self._conn_lock = threading.Lock()
        self.munge_socket = munge_socket or None
        self.insecure = insecure
        self.timeout = timeout
        self.ca_file = ca_file or None
        self.sessions = sessions and not insecure
        self._tls: ssl.SSLContext | None = None
        self._session: _Session | None = None
        self._no_sessions_until = 0.0
        self._session_lock = threading.Lock()
        self.datagrams = datagrams and self.sessions
        self._udp: tuple[tuple[str, int], socket.socket] | None = None
        self._datagram_misses = 0
        self._datagrams_off_until = 0.0  # time.monotonic()

    def tls_context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https://"):
            return None
        if self._tls is None:
            try:
                self._tls = ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ClientError(
                    0, f"cannot load client.ca_file {self.ca_file}: {exc}; it must be a PEM file"
                ) from exc
        return self._tls

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        role: str = "reader",
        node: str | None = None,
    ) -> Any:
        if self.sessions and role == "sidecar" and node:
            for attempt in (1, 2):  # in the open session, then once in a new one
                session = self._session_for(node)
                if session is None:
                    break
                try:
                    return self._send(
                        method, path, body, self._signed_in(session, method, path, body)
                    )
                except ClientError as exc:
                    if exc.status != 401 or not exc.reason.startswith(sessions.REFUSAL):
                        raise
                    self._forget(session)
                    if attempt == 1:
                        log.info("controller refused the session (%s): opening another", exc.reason)
                        continue
                    # a new session refused at once (a proxy that changes addresses): never
                    # a reason to stop reporting; each request signed with MUNGE for a while
                    log.warning(
                        "controller refused a new session (%s): each request signed with MUNGE",
                        exc.reason,
                    )
                    self._no_sessions_until = time.time() + NO_SESSIONS_RETRY
        return self._send(method, path, body, self._munge_headers(method, path, body, role, node))

    def _munge_headers(
        self, method: str, path: str, body: bytes, role: str, node: str | None
    ) -> dict[str, str]:
        if self.insecure:
            return {"X-SRecovery-Role": role}
        try:
            return requests.sign(method, path, body, role=role, node=node, socket=self.munge_socket)
        except munge.MungeError as exc:
            raise ClientError(0, f"cannot sign the request with MUNGE: {exc}") from exc

    def _signed_in(self, session: _Session, method: str, path: str, body: bytes) -> dict[str, str]:
        value = sessions.authorization(
            session.id,
            session.key,
            method,
            path,
            body,
            now=time.time(),
            counter=self._next_counter(session),
        )
        return {"Authorization": value}

    def _next_counter(self, session: _Session) -> int:
        """The counter of the session's next request, HTTP or datagram (one sequence)."""
        with self._session_lock:
            session.counter += 1
            return session.counter

    def _forget(self, session: _Session) -> None:
        with self._session_lock:
            if self._session is session:
                self._session = None

    def _session_for(self, node: str) -> _Session | None:
        """The open session, or a new one; None when the controller offers none (then each
        request is signed with MUNGE, and sessions are asked for again later)."""
        now = time.time()
        with self._session_lock:
            current = self._session
        if current is not None and current.expires_at - RENEW_MARGIN > now:
            return current
        if now < self._no_sessions_until:
            return None
        body = b"{}"
        try:
            answer = self._send(
                "POST",
                "/v1/session",
                body,
                self._munge_headers("POST", "/v1/session", body, "sidecar", node),
            )
        except ClientError as exc:
            if exc.status in (404, 405):
                log.info(
                    "the controller offers no sessions (%s): each request signed with MUNGE",
                    exc.reason,
                )
                self._no_sessions_until = now + NO_SESSIONS_RETRY
                return None
            raise
        try:
            session_id = str(answer["session"])
            decoded = munge.decode(str(answer["key"]), socket=self.munge_socket)
            lifetime = float(answer["ttl"])
            port = answer.get("datagram_port")
            datagram_port = port if type(port) is int and 0 < port < 65536 else None
            if len(decoded.payload) != sessions.KEY_BYTES:
                raise ValueError(f"a key of {len(decoded.payload)} bytes")
        except (KeyError, TypeError, ValueError, munge.MungeError) as exc:
            # never a reason to stop reporting: sign each request with MUNGE for a while
            log.warning(
                "cannot use the controller's session (%s): each request signed with MUNGE", exc
            )
            self._no_sessions_until = now + NO_SESSIONS_RETRY
            return None
        session = _Session(session_id, decoded.payload, now + lifetime, 0, datagram_port)
        with self._session_lock:
            self._session = session
        return session

    def _send(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Any:
        headers["Content-Type"] = "application/json"
        if not self.keep_alive:
            headers["Connection"] = "close"
        with self._conn_lock:
            try:
                status, answer = self._exchange(method, path, body, headers)
            except ssl.SSLCertVerificationError as exc:
                raise ClientError(
                    0,
                    f"controller at {self.url}: its TLS certificate does not verify "
                    f"({exc.verify_message}); set client.ca_file to the CA that issued it",
                ) from exc
            except ssl.SSLError as exc:
                raise ClientError(
                    0,
                    f"controller at {self.url}: TLS failed ({exc}); does it serve TLS "
                    "(controller.tls_cert), and does client.url say https:// only then?",
                ) from exc
            except (OSError, HTTPException) as exc:
                raise ClientError(0, f"controller at {self.url} unreachable: {exc}") from exc
        if status >= 400:
            try:
                reason = str(json.loads(answer).get("error"))
            except (ValueError, AttributeError):
                reason = answer.decode("utf-8", "replace")[:200] or f"HTTP {status}"
            raise ClientError(status, reason)
        return json.loads(answer or b"null")

    def _exchange(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """One request and its whole answer, on the kept connection when there is one. A
        kept connection that fails before an answer (the controller closed it meanwhile:
        restarted, or idle past its limit) is replaced and the request sent once more; the
        controller answers every request it read, so it has not seen this one."""
        reused = self._connection()
        try:
            return self._round_trip(method, path, body, headers)
        except (BrokenPipeError, ConnectionResetError):  # RemoteDisconnected: closed, no answer
            if not reused:
                raise
        self._connection()
        return self._round_trip(method, path, body, headers)

    def _round_trip(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        conn = self._conn
        assert conn is not None
        try:
            conn.request(
                method,
                urllib.parse.urlsplit(self.url).path + path,
                body=body if method != "GET" else None,
                headers=headers,
            )
            resp = conn.getresponse()
            answer = resp.read()
        except BaseException:
            self._close()
            raise
        if resp.will_close or not self.keep_alive:
            self._close()
        else:
            self._conn_used = time.monotonic()
        return resp.status, answer

    def _connection(self) -> bool:
        """Ensure a connection; True when it is a kept one (used before)."""
        if self._conn is not None and time.monotonic() - self._conn_used < KEEP_ALIVE_IDLE:
            return True
        self._close()
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ClientError(0, f"controller url {self.url!r}: expected http(s)://HOST:PORT")
        tls = self.tls_context()
        if tls is not None:
            self._conn = HTTPSConnection(
                parts.hostname or "", parts.port, timeout=self.timeout, context=tls
            )
        else:
            self._conn = HTTPConnection(parts.hostname or "", parts.port, timeout=self.timeout)
        if self.keep_alive:
            try:
                self._conn.connect()
                keep_tcp_alive(self._conn.sock)
            except BaseException:
                self._close()
                raise
        return False

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Close the kept connection (a new request opens another) and the datagram socket."""
        with self._conn_lock:
            self._close()
            if self._udp is not None:
                self._udp[1].close()
                self._udp = None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post_evidence(
        self, events: Sequence[dict[str, Any]], *, role: str, node: str | None = None
    ) -> Any:
        body = json.dumps({"events": list(events)}, separators=(",", ":")).encode()
        return self.request("POST", "/v1/evidence", body, role=role, node=node)

    def post_heartbeat(self, node: str, digest: str) -> Any:
        """A sidecar's "nothing changed since the status you hold" (contract.status): the
        controller's answer, ``{"status": "held"}`` or ``{"status": "wanted"}``."""
        body = status.heartbeat_body(node, digest)
        if self.datagrams and time.monotonic() >= self._datagrams_off_until:
            answered = self._heartbeat_datagram(node, body)
            if answered is not None:
                return {"status": answered}
        return self.request("POST", status.HEARTBEAT_PATH, body, role="sidecar", node=node)

    def _heartbeat_datagram(self, node: str, body: bytes) -> str | None:
        """The controller's answer to the heartbeat ``body`` sent as a datagram in the session
        (contract.datagrams); None: send it over HTTP (no session, no port offered, no answer
        within ANSWER_WAIT, a refusal, or datagrams off after DATAGRAM_MISSES misses)."""
        try:
            session = self._session_for(node)
        except ClientError:
            return None  # the HTTP request says why
        host = urllib.parse.urlsplit(self.url).hostname
        if session is None or session.datagram_port is None or not host:
            return None
        authorization = datagrams.sign(
            session.id, session.key, body, now=time.time(), counter=self._next_counter(session)
        )
        try:
            sock = self._datagram_socket(host, session.datagram_port)
            sock.send(datagrams.encode(authorization, body))
            deadline = time.monotonic() + datagrams.ANSWER_WAIT
            while True:
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                data = sock.recv(4096)
                try:
                    answered = datagrams.read_answer(data, session.key, authorization)
                except WireError:  # a late answer to an earlier datagram, or not the controller
                    if time.monotonic() >= deadline:
                        raise TimeoutError from None
                    continue
                self._datagram_misses = 0
                return answered
        except datagrams.DatagramRefused as exc:
            if str(exc).startswith(sessions.REFUSAL):
                self._forget(session)  # the HTTP request opens another
            self._datagram_missed(f"refused: {exc}")
        except OSError as exc:  # TimeoutError included: no answer
            self._datagram_missed(str(exc) or type(exc).__name__)
        return None

    def _datagram_socket(self, host: str, port: int) -> socket.socket:
        """The UDP socket connected to the controller's heartbeat port (only its datagrams
        come back through it)."""
        if self._udp is not None and self._udp[0] == (host, port):
            return self._udp[1]
        if self._udp is not None:
            self._udp[1].close()
            self._udp = None
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            raise
        self._udp = ((host, port), sock)
        return sock

    def _datagram_missed(self, why: str) -> None:
        self._datagram_misses += 1
        log.info("heartbeat datagram not answered (%s): sent over HTTP", why)
        if self._datagram_misses >= DATAGRAM_MISSES:
            self._datagram_misses = 0
            self._datagrams_off_until = time.monotonic() + DATAGRAMS_OFF
            log.warning(
                "%d heartbeat datagrams in a row not answered (last: %s): heartbeats over HTTP "
                "for %.0f s (is UDP to the controller's port open?)",
                DATAGRAM_MISSES,
                why,
                DATAGRAMS_OFF,
            )
