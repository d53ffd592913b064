"""Heartbeats as UDP datagrams: the same signed heartbeat, without an HTTP request around it.

Why: on a quiet cluster nearly every report is a heartbeat (contract.status), and over HTTP
most of what one costs the controller is the HTTP server itself (aiohttp, the event loop's
transports, the socket calls: about 0.2 ms of CPU a request here), not the HMAC and the
dictionary look-up that answer it. One datagram and its answer cost about a quarter of that
floor alone, and a report at 10,000 nodes every 10 s about half its CPU over HTTP (0.15-0.18
ms against 0.25-0.32: docs/performance.md, "Heartbeats by datagram").

A sidecar in a session (contract.sessions) whose controller offered a datagram port (the
session's ``datagram_port``) sends each heartbeat to that UDP port as::

    srhb1 SRSession id=ID,t=TIME,n=COUNTER,mac=HEX\\n{"node": "n1", "condition": "<digest>"}

signed exactly as the HTTP heartbeat is, with :data:`METHOD` in place of ``POST`` (so neither
can stand for the other), and checked exactly as it: the session known and unexpired, the
datagram from the session's address, the time fresh, the counter above every counter the
session accepted, the MAC. The controller answers, to the address it came from::

    {"status": "held" | "wanted", "mac": HEX}     mac = HMAC-SHA256(key, ANSWER_CONTEXT \\n
                                                        the request's Authorization \\n status)

so that the answer is bound to that one request and only the controller could have made it; or
``{"error": "session ..."}`` (unsigned: the controller could not find the key) for a refused
one, and nothing at all for a datagram that is not a heartbeat. No answer is ever longer than
the datagram it answers, so the port cannot amplify a flood aimed at a forged source address.

The sidecar waits :data:`ANSWER_WAIT` seconds for the answer; without one, or with a refusal or
an answer it cannot verify, it sends that heartbeat over HTTP as before: a datagram lost or
refused never costs a report. MUNGE-signed heartbeats stay on HTTP (a credential per datagram
is the munged round trip sessions avoid).
"""

from __future__ import annotations

import hashlib
import hmac
import json

from slurm_recovery.contract import sessions
from slurm_recovery.contract.status import HEARTBEAT_PATH, MAX_HEARTBEAT_BYTES
from slurm_recovery.contract.wire import WireError

#: What a heartbeat datagram starts with (and its version).
MAGIC = b"srhb1 "
#: The method the MAC covers (the HTTP heartbeat's is POST: neither replays as the other).
METHOD = "DATAGRAM"
#: What the answer's MAC covers before the request's Authorization and the status.
ANSWER_CONTEXT = b"srhb-answer-v1"
#: The longest Authorization value (sessions' header: 32 + 19 + 18 + 64 and the names).
MAX_AUTHORIZATION_BYTES = 200
#: The largest datagram the controller reads.
MAX_DATAGRAM_BYTES = len(MAGIC) + MAX_AUTHORIZATION_BYTES + 1 + MAX_HEARTBEAT_BYTES
#: Seconds the sidecar waits for the answer before it sends the heartbeat over HTTP.
ANSWER_WAIT = 1.0


class DatagramRefused(Exception):
    """The controller refused the heartbeat (its reason); the sidecar sends it over HTTP."""


def encode(authorization: str, body: bytes) -> bytes:
    """A heartbeat datagram: the session's Authorization value and the heartbeat's body."""
    return MAGIC + authorization.encode("ascii") + b"\n" + body


def decode(data: bytes) -> tuple[str, bytes]:
    """A datagram -> (Authorization value, body); WireError when it is not a heartbeat."""
    if len(data) > MAX_DATAGRAM_BYTES:
        raise WireError(f"a heartbeat datagram is at most {MAX_DATAGRAM_BYTES} bytes")
    if not data.startswith(MAGIC):
        raise WireError(f"not a heartbeat datagram (expected it to start {MAGIC!r})")
    head, newline, body = data[len(MAGIC) :].partition(b"\n")
    if not newline or len(head) > MAX_AUTHORIZATION_BYTES:
        raise WireError("heartbeat datagram: an Authorization line, then the body")
    try:
        authorization = head.decode("ascii")
    except UnicodeDecodeError as exc:
        raise WireError("heartbeat datagram: its Authorization is not ASCII") from exc
    if not sessions.is_session(authorization):
        raise WireError("heartbeat datagram: only a session's signature (SRSession) is taken")
    return authorization, body


def sign(session_id: str, key: bytes, body: bytes, *, now: float, counter: int) -> str:
    """The Authorization value of a heartbeat datagram in this session."""
    return sessions.authorization(
        session_id, key, METHOD, HEARTBEAT_PATH, body, now=now, counter=counter
    )


def answer_mac(key: bytes, authorization: str, status: str) -> str:
    text = b"\n".join((ANSWER_CONTEXT, authorization.encode("ascii"), status.encode("ascii")))
    return hmac.new(key, text, hashlib.sha256).hexdigest()


def answer(key: bytes, authorization: str, status: str) -> bytes:
    """The controller's answer to the heartbeat signed with ``authorization``."""
    mac = answer_mac(key, authorization, status)
    return json.dumps({"status": status, "mac": mac}, separators=(",", ":")).encode()


def refusal(reason: str, limit: int) -> bytes:
    """A refusal of at most ``limit`` bytes (the refused datagram's length: never amplify);
    the reason cut to fit, in plain ASCII so that its JSON is as long as it."""
    plain = "".join(c if " " <= c <= "~" and c not in '"\\' else "'" for c in reason)
    room = max(0, limit - len(b'{"error":""}'))
    return json.dumps({"error": plain[:room]}, separators=(",", ":")).encode()


def read_answer(data: bytes, key: bytes, authorization: str) -> str:
    """The status (``held`` or ``wanted``) that the controller answered to the heartbeat signed
    with ``authorization``. DatagramRefused for a refusal; WireError for an answer that is not
    one, or not to this request, or not by the session's controller (its MAC)."""
    try:
        message = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"heartbeat answer is not JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise WireError("heartbeat answer is not an object")
    if "error" in message:
        raise DatagramRefused(str(message["error"]))
    status, mac = message.get("status"), message.get("mac")
    if not isinstance(status, str) or not isinstance(mac, str) or not status.isascii():
        raise WireError('heartbeat answer must be {"status": ..., "mac": ...}')
    if not hmac.compare_digest(answer_mac(key, authorization, status), mac):
        raise WireError("heartbeat answer's MAC does not match (not to this request)")
    return status
