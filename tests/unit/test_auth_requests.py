"""Request claims, header parsing, the replay cache and libmunge errors that need no munged.

What needs a running munged (round trips, forgeries, replays, staleness, other uids, origin
addresses) is in tests/integration/test_auth_munge.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time

import pytest

from slurm_recovery.auth import AuthError, ReplayCache
from slurm_recovery.contract import munge, requests
from slurm_recovery.contract.requests import claim, verify

NO_MUNGED = "/nonexistent/munge.socket"


def refused(headers, *, status=401, cache=None, **kw) -> str:
    with pytest.raises(AuthError) as info:
        verify(
            headers,
            "POST",
            "/v1/evidence",
            b"{}",
            socket=NO_MUNGED,
            max_age=30,
            now=time.time(),
            seen=cache or ReplayCache(),
            **kw,
        )
    assert info.value.status == status, info.value.reason
    return info.value.reason


# --- the claim ----------------------------------------------------------------------------


def test_claim_is_compact_json_in_a_fixed_order():
    body = b'{"events":[]}'
    got = claim("post", "/v1/evidence?batch=1", body, role="sidecar", node="n1")
    digest = hashlib.sha256(body).hexdigest()
    assert got == (
        b'{"v":1,"m":"POST","p":"/v1/evidence?batch=1","h":"'
        + digest.encode()
        + b'","r":"sidecar","n":"n1"}'
    )
    assert json.loads(claim("GET", "/v1/advice", b"", role="reader"))["n"] == ""


@pytest.mark.parametrize(
    ("role", "node", "match"),
    [
        ("admin", None, "role must be one of"),
        ("sidecar", None, "speaks for one node"),
        ("hook", "", "speaks for one node"),
        ("operator", "n1", "node= is for sidecar and hook"),
    ],
)
def test_claim_refuses_inconsistent_roles(role, node, match):
    with pytest.raises(ValueError, match=match):
        claim("POST", "/", b"", role=role, node=node)


# --- the header, before munged is asked ---------------------------------------------------


def test_missing_header():
    assert "missing Authorization" in refused({})
    assert "missing Authorization" in refused({"Content-Type": "application/json"})


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("Bearer abc", "scheme must be MUNGE"),
        ("MUNGE", "malformed"),
        ("MUNGE garbage", "malformed"),
        ("MUNGE MUNGE:not base64!:", "malformed"),
        ("MUNGE MUNGE:abcde:", "bad base64"),
        ("MUNGE MUNGE:" + "A" * 5000 + ":", "longer than"),
        ("MUNGE MUNGE:QUJD:\x00", "malformed"),
    ],
)
def test_garbage_header_is_refused_without_asking_munged(value, match):
    assert match in refused({"Authorization": value})


def test_header_name_is_case_insensitive_and_a_down_munged_is_503():
    cred = "MUNGE:" + base64.b64encode(b"x" * 60).decode() + ":"
    reason = refused({"authorization": f"munge {cred}"}, status=503)
    assert "cannot check credentials" in reason and NO_MUNGED in reason


def test_a_credential_in_the_replay_cache_is_refused_before_munged():
    raw = b"y" * 60
    cache = ReplayCache()
    now = time.time()
    cache.add(hashlib.sha256(raw).digest()[:16], now + 60, now)
    cred = "MUNGE:" + base64.b64encode(raw).decode() + ":"
    assert "replayed" in refused({"Authorization": f"MUNGE {cred}"}, cache=cache)


# --- the replay cache ---------------------------------------------------------------------


def test_replay_cache_forgets_at_expiry():
    cache = ReplayCache()
    cache.add(b"a", expires=110.0, now=100.0)
    assert cache.seen(b"a", 109.9)
    assert not cache.seen(b"a", 110.0)
    assert len(cache) == 0


def test_replay_cache_ignores_what_has_already_expired():
    cache = ReplayCache()
    cache.add(b"a", expires=100.0, now=100.0)
    assert len(cache) == 0


def test_replay_cache_is_bounded_and_drops_the_soonest_to_expire():
    cache = ReplayCache(capacity=3)
    for i, digest in enumerate([b"a", b"b", b"c", b"d"]):
        cache.add(digest, expires=200.0 - i, now=100.0)  # a expires last, d first
    assert len(cache) == 3
    assert cache.evicted == 1
    assert cache.seen(b"a", 100.0) and cache.seen(b"b", 100.0) and cache.seen(b"d", 100.0)
    assert not cache.seen(b"c", 100.0)


def test_replay_cache_adding_twice_keeps_one_entry():
    cache = ReplayCache()
    cache.add(b"a", expires=150.0, now=100.0)
    cache.add(b"a", expires=190.0, now=100.0)
    assert len(cache) == 1


def test_replay_cache_capacity_must_be_positive():
    with pytest.raises(ValueError):
        ReplayCache(capacity=0)


# --- libmunge without munged ---------------------------------------------------------------


def test_libmunge_loads():
    assert munge.available()


def test_encode_with_munged_unreachable_is_a_socket_error():
    with pytest.raises(munge.MungeSocketError) as info:
        munge.encode(b"x", socket=NO_MUNGED)
    assert info.value.code == munge.EMUNGE_SOCKET
    assert NO_MUNGED in info.value.message


def test_sign_with_munged_unreachable_raises():
    with pytest.raises(munge.MungeSocketError):
        requests.sign("POST", "/v1/evidence", b"{}", role="operator", socket=NO_MUNGED)


@pytest.mark.parametrize("cred", ["MUNGE:é:", "MUNGE:AA\x00AA:"])
def test_decode_refuses_what_cannot_be_a_credential(cred):
    with pytest.raises(munge.MungeInvalid) as info:
        munge.decode(cred, socket=NO_MUNGED)
    assert info.value.code == munge.EMUNGE_BAD_CRED


def test_error_classes_tell_causes_apart():
    assert issubclass(munge.MungeReplayed, munge.MungeCredentialError)
    assert issubclass(munge.MungeExpired, munge.MungeCredentialError)
    assert issubclass(munge.MungeRewound, munge.MungeCredentialError)
    assert issubclass(munge.MungeInvalid, munge.MungeCredentialError)
    assert not issubclass(munge.MungeSocketError, munge.MungeCredentialError)
    err = munge.MungeReplayed(munge.EMUNGE_CRED_REPLAYED, "Replayed credential")
    assert (err.code, err.message) == (17, "Replayed credential")
