"""Signed HTTP requests: a MUNGE credential that binds method, path, body hash, role and node.

The client puts ``Authorization: MUNGE <credential>`` on each request; the credential's payload
is the compact JSON claim ``{"v":1,"m":METHOD,"p":PATH,"h":SHA256_HEX,"r":ROLE,"n":NODE}``.
The controller checks the credential with its own munged, then that the claim matches the
request it came with, and that it is fresh. ``verify`` answers who sent the request
(``Principal``); what that principal may do is ``authorize``'s business.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import heapq
import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_recovery.contract import munge

#: Roles a client may claim. sidecar and hook speak for one node; operator for the cluster;
#: reader only reads.
ROLES = ("sidecar", "hook", "operator", "reader")
NODE_ROLES = frozenset({"sidecar", "hook"})

SCHEME = "MUNGE"
CLAIM_VERSION = 1
#: Credentials carrying our claim are a few hundred characters; anything much longer is not
#: ours and is refused before munged spends time on it.
MAX_CREDENTIAL_CHARS = 4096
#: How far in the future (seconds, by this host's clock) a credential's encode time may be.
DEFAULT_SKEW = 5.0
#: Credentials remembered by the default in-process replay cache (about 180 bytes each).
DEFAULT_REPLAY_CAPACITY = 100_000

INSECURE_NO_AUTH_WARNING = (
    "AUTHENTICATION IS OFF (--insecure-no-auth): any local or remote user can report evidence "
    "and trigger drains and requeues. Development only: never run a production controller so."
)

_CRED_RE = re.compile(r"MUNGE:([A-Za-z0-9+/]+={0,2}):")
_CLAIM_KEYS = frozenset({"v", "m", "p", "h", "r", "n"})


@dataclass(frozen=True)
class Principal:
    """Who sent a request, as munged vouches for it, and what the credential claims to be."""

    uid: int
    gid: int
    origin: str  # IPv4 address stamped by the encoding host's munged
    role: str  # one of ROLES
    node: str | None  # the node a sidecar or hook speaks for; None for operator and reader

    def describe(self) -> str:
        who = f"{self.role} of {self.node}" if self.node else self.role
        return f"uid {self.uid} gid {self.gid} ({who}) from {self.origin}"


class AuthError(Exception):
    """A request refused: ``status`` is the HTTP status to answer, ``reason`` says why.

    401: the request is not authenticated (no, bad, stale or replayed credential, or one that
    does not match the request). 403: authenticated, but not allowed. 503: this host cannot
    check credentials (its munged is down); the client should retry later.
    """

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


class ReplayCache:
    """Digests of accepted credentials, each kept until the credential can no longer pass.

    Defence in depth behind munged's own replay check, which lives in one munged process's
    memory: it is lost when munged restarts, and not shared when more than one munged (or
    controller) verifies. Bounded: past ``capacity`` the entry closest to expiry is dropped
    (``evicted`` counts them), which only weakens this second line, never the first.
    """

    def __init__(self, capacity: int = DEFAULT_REPLAY_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("ReplayCache capacity must be at least 1")
        self.capacity = capacity
        self.evicted = 0
        self._expiry: dict[bytes, float] = {}
        self._heap: list[tuple[float, bytes]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._expiry)

    def _prune(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, digest = heapq.heappop(heap)
            del self._expiry[digest]

    def seen(self, digest: bytes, now: float) -> bool:
        with self._lock:
            self._prune(now)
            return digest in self._expiry

    def add(self, digest: bytes, expires: float, now: float) -> None:
        with self._lock:
            self._prune(now)
            if digest in self._expiry or expires <= now:
                return
            while len(self._expiry) >= self.capacity:
                _, old = heapq.heappop(self._heap)
                del self._expiry[old]
                self.evicted += 1
            self._expiry[digest] = expires
            heapq.heappush(self._heap, (expires, digest))


_default_cache = ReplayCache()


def body_hash(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def claim(method: str, path: str, body: bytes, *, role: str, node: str | None = None) -> bytes:
    """The exact payload ``sign`` puts in the credential (compact JSON, fixed key order)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if role in NODE_ROLES and not node:
        raise ValueError(f"a {role} speaks for one node: pass node=")
    if role not in NODE_ROLES and node:
        raise ValueError(f"a {role} speaks for no single node: node= is for sidecar and hook")
    doc = {
        "v": CLAIM_VERSION,
        "m": method.upper(),
        "p": path,
        "h": body_hash(body),
        "r": role,
        "n": node or "",
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def sign(
    method: str,
    path: str,
    body: bytes,
    *,
    role: str,
    node: str | None = None,
    socket: str | None = None,
    ttl: int | None = None,
) -> dict[str, str]:
    """Headers that authenticate this exact request (``path``: the request target as sent,
    query string included). Raises munge.MungeError when the local munged cannot encode."""
    cred = munge.encode(claim(method, path, body, role=role, node=node), socket=socket, ttl=ttl)
    return {"Authorization": f"{SCHEME} {cred}"}


def _authorization(headers: Mapping[str, str]) -> str | None:
    value = headers.get("Authorization")
    if value is not None:
        return value
    for key, val in headers.items():
        if key.lower() == "authorization":
            return val
    return None


def _credential(headers: Mapping[str, str]) -> tuple[str, bytes]:
    """The credential from the header and a digest of its decoded bytes (for the cache)."""
    header = _authorization(headers)
    if header is None:
        raise AuthError(401, "missing Authorization header (expected 'MUNGE <credential>')")
    scheme, _, cred = header.strip().partition(" ")
    if scheme.upper() != SCHEME:
        raise AuthError(401, f"Authorization scheme must be {SCHEME}")
    cred = cred.strip()
    if len(cred) > MAX_CREDENTIAL_CHARS:
        raise AuthError(401, f"credential malformed: longer than {MAX_CREDENTIAL_CHARS} chars")
    match = _CRED_RE.fullmatch(cred)
    if match is None:
        raise AuthError(401, "credential malformed: not 'MUNGE:<base64>:'")
    try:
        raw = base64.b64decode(match.group(1), validate=True)
    except (binascii.Error, ValueError):
        raise AuthError(401, "credential malformed: bad base64") from None
    # Digest of the decoded bytes: two spellings of one credential are one credential.
    return cred, hashlib.sha256(raw).digest()[:16]


def _parse_claim(payload: bytes) -> dict:
    try:
        doc = json.loads(payload)
    except (UnicodeDecodeError, ValueError):
        doc = None
    if not isinstance(doc, dict) or doc.keys() != _CLAIM_KEYS:
        raise AuthError(401, "credential payload is not a slurm-recovery request claim")
    if doc["v"] != CLAIM_VERSION:
        raise AuthError(401, f"claim version {doc['v']!r} is not {CLAIM_VERSION}")
    if not all(isinstance(doc[k], str) for k in ("m", "p", "h", "r", "n")):
        raise AuthError(401, "credential payload is not a slurm-recovery request claim")
    if doc["r"] not in ROLES:
        raise AuthError(401, f"claimed role {doc['r']!r} is not one of {', '.join(ROLES)}")
    if (doc["r"] in NODE_ROLES) != bool(doc["n"]):
        raise AuthError(401, f"claimed role {doc['r']} with node {doc['n']!r}: inconsistent")
    return doc


def verify(
    headers: Mapping[str, str],
    method: str,
    path: str,
    body: bytes,
    *,
    socket: str | None = None,
    max_age: float,
    now: float,
    skew: float = DEFAULT_SKEW,
    seen: ReplayCache | None = None,
) -> Principal:
    """Who sent this request; raises AuthError(401) unless the credential is valid, fresh,
    used for the first time and signed for exactly this method, path and body.

    ``now``: this host's clock (``time.time()``); ``max_age``: seconds a credential may be old;
    ``skew``: seconds a credential's encode time may be ahead of ``now``; ``seen``: the replay
    cache (default: one per process). A credential munged decoded is used up, even when the
    request is then refused, exactly as munged itself treats it.
    """
    cache = _default_cache if seen is None else seen
    cred, digest = _credential(headers)
    if cache.seen(digest, now):
        raise AuthError(401, "credential replayed (already used with this controller)")
    try:
        decoded = munge.decode(cred, socket=socket)
    except munge.MungeReplayed:
        raise AuthError(401, "credential replayed (munged has already decoded it)") from None
    except munge.MungeExpired:
        raise AuthError(
            401,
            "credential expired (older than its time-to-live): the sender's clock is behind "
            "this host's, or the request took that long; are the clocks in sync (NTP)?",
        ) from None
    except munge.MungeRewound:
        raise AuthError(
            401,
            "credential rewound: encoded in the future (the sender's clock is ahead of this "
            "host's; are the clocks in sync (NTP)?)",
        ) from None
    except munge.MungeCredentialError as exc:
        raise AuthError(401, f"credential invalid: {exc.message}") from None
    except munge.MungeError as exc:
        raise AuthError(503, f"cannot check credentials: {exc.message}") from None

    cache.add(digest, decoded.encode_time + min(decoded.ttl, max_age) + skew + 1, now)

    age = now - decoded.encode_time
    if age > max_age:
        raise AuthError(
            401,
            f"credential stale: encoded {age:.0f}s ago (max_age {max_age:g}s): the sender's "
            "clock is behind this host's, or the request took that long; are the clocks in sync "
            "(NTP)?",
        )
    if -age > skew:
        raise AuthError(
            401,
            f"credential from the future: {-age:.0f}s ahead of this host (skew {skew:g}s): the "
            "sender's clock is ahead; are the clocks in sync (NTP)?",
        )

    doc = _parse_claim(decoded.payload)
    if doc["m"] != method.upper():
        raise AuthError(401, f"credential signed for method {doc['m']}, not {method.upper()}")
    if doc["p"] != path:
        raise AuthError(401, f"credential signed for path {doc['p']!r}, not {path!r}")
    if doc["h"] != body_hash(body):
        raise AuthError(401, "request body does not match the signed sha256")
    return Principal(
        uid=decoded.uid,
        gid=decoded.gid,
        origin=decoded.origin,
        role=doc["r"],
        node=doc["n"] or None,
    )
