"""A small synchronous client of the controller's API, signing each request with MUNGE.

Used by ``srecovery`` (and, later, the sidecars and hooks). Standard library HTTP: one
request at a time is all a CLI needs.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from slurm_recovery.contract import munge, requests


class ClientError(Exception):
    """The controller refused the request or could not be reached; ``status`` 0 = no answer."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}" if status else reason)
        self.status = status
        self.reason = reason


class ControllerClient:
    def __init__(
        self,
        url: str,
        *,
        munge_socket: str | None = None,
        insecure: bool = False,
        timeout: float = 10.0,
        ca_file: str | None = None,
    ) -> None:
        """``insecure``: send no MUNGE credential (a controller started with
        --insecure-no-auth). ``ca_file``: the CAs trusted for an https:// ``url`` (None: the
        system's); the certificate and the host name are always verified."""
        self.url = url.rstrip("/")
        self.munge_socket = munge_socket or None
        self.insecure = insecure
        self.timeout = timeout
        self.ca_file = ca_file or None
        self._tls: ssl.SSLContext | None = None

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
        if self.insecure:
            headers = {"X-SRecovery-Role": role}
        else:
            try:
                headers = requests.sign(
                    method, path, body, role=role, node=node, socket=self.munge_socket
                )
            except munge.MungeError as exc:
                raise ClientError(0, f"cannot sign the request with MUNGE: {exc}") from exc
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
