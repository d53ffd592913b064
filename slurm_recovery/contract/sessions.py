"""Sessions: one MUNGE credential opens a session, whose key then signs a sidecar's reports.

Why: a sidecar reports every minute for as long as its node is up, and a credential decoded by
munged for each report costs the controller a munged round trip per report (about a third of
its CPU per report at 10,000 nodes). A session keeps every guarantee of the per-request
credential (who speaks for which node, freshness, no replay, the exact request signed) for
the price of one HMAC.

1. ``POST /v1/session``, signed with MUNGE as any request (role ``sidecar``, its node). The
   controller checks it as it checks that node's evidence, creates a session bound to that
   principal and to the TCP address the request came from, and answers ``{"session": ID,
   "key": CRED, "expires_at": T}``: ``CRED`` is a MUNGE credential the controller encodes with
   the 32-byte key as its payload, restricted to the sidecar's uid, so the key travels
   encrypted and only that uid, on a host of the same MUNGE realm, can read it.
2. Each later request carries ``Authorization: SRSession id=ID,t=TIME,n=COUNTER,mac=HEX`` with
   ``mac = HMAC-SHA256(key, "srsession-v1\\nMETHOD\\nPATH\\nSHA256(body)\\nTIME\\nCOUNTER")``.
   The controller refuses it (401) unless the session is known and unexpired, the request
   comes from the session's address, TIME is within ``max_age`` (and at most ``skew`` ahead),
   COUNTER is above every counter it accepted in the session (no replay, no reordering), and
   the MAC matches (compared in constant time). The principal is the session's.

The binding to the address restores what MUNGE's origin check gives per request: root on
another node, which can decode the key credential as any uid-0 process of the realm can,
still cannot speak for this node without its address. Sessions live in the controller's
memory: a restarted controller answers an old session with 401 and the sidecar opens another.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import threading
from dataclasses import dataclass, field

from slurm_recovery.contract.requests import AuthError, Principal, body_hash

SCHEME = "SRSession"
MAC_CONTEXT = b"srsession-v1"
KEY_BYTES = 32
#: Sessions the controller keeps at most (one per node is the norm: a new one replaces the
#: node's old one); past it, the one closest to expiry goes.
DEFAULT_CAPACITY = 200_000
#: The word every session refusal starts with: the client opens a new session on it.
REFUSAL = "session"

_HEADER = re.compile(
    r"SRSession id=(?P<id>[0-9a-f]{32}),t=(?P<t>[0-9]{1,12}(?:\.[0-9]{1,6})?),"
    r"n=(?P<n>[0-9]{1,18}),mac=(?P<mac>[0-9a-f]{64})"
)


def mac(key: bytes, method: str, path: str, body: bytes, ts: str, counter: int) -> str:
    """The MAC of one request (hex)."""
    text = b"\n".join(
        (
            MAC_CONTEXT,
            method.upper().encode("ascii"),
            path.encode("utf-8", "surrogateescape"),
            body_hash(body).encode("ascii"),
            ts.encode("ascii"),
            str(counter).encode("ascii"),
        )
    )
    return hmac.new(key, text, hashlib.sha256).hexdigest()


def authorization(
    session_id: str, key: bytes, method: str, path: str, body: bytes, *, now: float, counter: int
) -> str:
    """The ``Authorization`` value that signs this request in the session."""
    ts = f"{now:.3f}"
    signature = mac(key, method, path, body, ts, counter)
    return f"{SCHEME} id={session_id},t={ts},n={counter},mac={signature}"


def is_session(header: str | None) -> bool:
    return header is not None and header.lstrip().startswith(SCHEME + " ")


def peer_address(remote: str | None) -> str:
    """The TCP peer as a plain address (an IPv4-mapped IPv6 address as its IPv4 form)."""
    if not remote:
        return ""
    try:
        addr = ipaddress.ip_address(remote)
    except ValueError:
        return remote
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


@dataclass
class Session:
    id: str
    key: bytes = field(repr=False)
    principal: Principal
    peer: str
    expires_at: float
    last_counter: int = -1


class SessionTable:
    """The controller's open sessions (in memory, thread-safe)."""

    def __init__(self, ttl: float, capacity: int = DEFAULT_CAPACITY) -> None:
        if ttl <= 0 or capacity < 1:
            raise ValueError("a session table needs a ttl > 0 and a capacity >= 1")
        self.ttl = ttl
        self.capacity = capacity
        self._by_id: dict[str, Session] = {}
        self._by_speaker: dict[tuple[str, str | None], str] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_id)

    def open(self, principal: Principal, peer: str, now: float) -> Session:
        """A new session for ``principal`` from ``peer``; it replaces the speaker's old one."""
        session = Session(
            id=secrets.token_hex(16),
            key=secrets.token_bytes(KEY_BYTES),
            principal=principal,
            peer=peer_address(peer),
            expires_at=now + self.ttl,
        )
        speaker = (principal.role, principal.node)
        with self._lock:
            old = self._by_speaker.pop(speaker, None)
            if old is not None:
                self._by_id.pop(old, None)
            if len(self._by_id) >= self.capacity:
                self._drop_expired(now)
            while len(self._by_id) >= self.capacity:
                first = min(self._by_id.values(), key=lambda s: s.expires_at)
                self._forget(first)
            self._by_id[session.id] = session
            self._by_speaker[speaker] = session.id
        return session

    def _forget(self, session: Session) -> None:
        self._by_id.pop(session.id, None)
        speaker = (session.principal.role, session.principal.node)
        if self._by_speaker.get(speaker) == session.id:
            del self._by_speaker[speaker]

    def _drop_expired(self, now: float) -> None:
        for session in [s for s in self._by_id.values() if s.expires_at <= now]:
            self._forget(session)

    def verify_session(
        self,
        header: str,
        method: str,
        path: str,
        body: bytes,
        *,
        peer: str | None,
        now: float,
        max_age: float,
        skew: float,
    ) -> Session:
        """The session that signed the request (its principal speaks; its key signs a
        datagram's answer), or AuthError(401) saying why not (always starting with REFUSAL, so
        that the client knows to open a new session)."""
        match = _HEADER.fullmatch(header.strip())
        if match is None:
            raise AuthError(
                401, f"{REFUSAL} authorization malformed (expected 'SRSession id=,t=,n=,mac=')"
            )
        ts, counter = match.group("t"), int(match.group("n"))
        with self._lock:
            session = self._by_id.get(match.group("id"))
            if session is None or session.expires_at <= now:
                if session is not None:
                    self._forget(session)
                raise AuthError(401, f"{REFUSAL} unknown or expired: open a new one")
            expected = mac(session.key, method, path, body, ts, counter)
            if not hmac.compare_digest(expected, match.group("mac")):
                raise AuthError(
                    401,
                    f"{REFUSAL} MAC does not match this request (method, path, body, time, "
                    "counter)",
                )
            if peer != session.peer and peer_address(peer) != session.peer:
                raise AuthError(
                    401,
                    f"{REFUSAL} opened from {session.peer}, used from {peer_address(peer)}",
                )
            age = now - float(ts)
            if age > max_age:
                raise AuthError(401, f"{REFUSAL} request stale: signed {age:.0f}s ago")
            if -age > skew:
                raise AuthError(
                    401,
                    f"{REFUSAL} request from the future: {-age:.0f}s ahead of this host; are "
                    "the clocks in sync (NTP)?",
                )
            if counter <= session.last_counter:
                raise AuthError(
                    401,
                    f"{REFUSAL} request replayed (counter {counter}, already at "
                    f"{session.last_counter})",
                )
            session.last_counter = counter
            return session
