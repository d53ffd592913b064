"""A small synchronous client of the controller's API, signing each request with MUNGE.

Used by ``srecovery``, the hooks and the sidecars. Standard library HTTP: one request at a
time is all a CLI needs. A sidecar's client (``sessions=True``) opens a session with one MUNGE
credential and signs its reports with the session's key (``contract.sessions``); it opens a
new one when the controller forgets it, and signs each request with MUNGE again when the
controller offers no sessions.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slurm_recovery.contract import munge, requests, sessions

log = logging.getLogger(__name__)

#: After the controller said it offers no sessions (404), ask again this much later.
NO_SESSIONS_RETRY = 600.0
#: A session is renewed this long before the controller's expiry.
RENEW_MARGIN = 60.0


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
    ) -> None:
        """``insecure``: send no MUNGE credential (a controller started with
        --insecure-no-auth). ``ca_file``: the CAs trusted for an https:// ``url`` (None: the
        system's); the certificate and the host name are always verified. ``sessions``: sign a
        sidecar's requests in a session (one MUNGE credential per session, not per request)."""
        self.url = url.rstrip("/")
        self.munge_socket = munge_socket or None
        self.insecure = insecure
        self.timeout = timeout
        self.ca_file = ca_file or None
        self.sessions = sessions and not insecure
        self._tls: ssl.SSLContext | None = None
        self._session: _Session | None = None
        self._no_sessions_until = 0.0
        self._session_lock = threading.Lock()

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
        with self._session_lock:
            session.counter += 1
            counter = session.counter
        value = sessions.authorization(
            session.id, session.key, method, path, body, now=time.time(), counter=counter
        )
        return {"Authorization": value}

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
            if len(decoded.payload) != sessions.KEY_BYTES:
                raise ValueError(f"a key of {len(decoded.payload)} bytes")
        except (KeyError, TypeError, ValueError, munge.MungeError) as exc:
            # never a reason to stop reporting: sign each request with MUNGE for a while
            log.warning(
                "cannot use the controller's session (%s): each request signed with MUNGE", exc
            )
            self._no_sessions_until = now + NO_SESSIONS_RETRY
            return None
        session = _Session(session_id, decoded.payload, now + lifetime)
        with self._session_lock:
            self._session = session
        return session

    def _send(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Any:
        headers["Content-Type"] = "application/json"
        req = urllib.request.Request(
            self.url + path,
            data=body if method != "GET" else None,
            method=method,
            headers=headers,
        )
        tls = self.tls_context()
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=tls) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                reason = json.loads(exc.read()).get("error", exc.reason)
            except (ValueError, AttributeError):
                reason = str(exc.reason)
            raise ClientError(exc.code, reason) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise ClientError(
                    0,
                    f"controller at {self.url}: its TLS certificate does not verify "
                    f"({reason.verify_message}); set client.ca_file to the CA that issued it",
                ) from exc
            if isinstance(reason, ssl.SSLError):
                raise ClientError(
                    0,
                    f"controller at {self.url}: TLS failed ({reason}); does it serve TLS "
                    "(controller.tls_cert), and does client.url say https:// only then?",
                ) from exc
            raise ClientError(0, f"controller at {self.url} unreachable: {exc}") from exc

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post_evidence(
        self, events: Sequence[dict[str, Any]], *, role: str, node: str | None = None
    ) -> Any:
        body = json.dumps({"events": list(events)}, separators=(",", ":")).encode()
        return self.request("POST", "/v1/evidence", body, role=role, node=node)
