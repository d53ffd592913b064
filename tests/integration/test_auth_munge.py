"""MUNGE authentication against real munged daemons: the local cluster's, and a second one
that stamps another origin address (as munged on another node would), sharing the same key."""

from __future__ import annotations

import base64
import ipaddress
import os
import pwd
import random
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_recovery import localcluster
from slurm_recovery.auth import (
    AuthError,
    Operators,
    Principal,
    ReplayCache,
    authorize_evidence,
    authorize_operator,
    sign,
    verify,
)
from slurm_recovery.contract import munge
from slurm_recovery.contract.requests import claim

pytestmark = pytest.mark.cluster

PATH = "/v1/evidence"
BODY = b'{"events":[{"node":"n2","kind":"xid","xid":79,"gpu":0}]}'
OPS = Operators(uids=frozenset({0}), gids=frozenset())
OTHER_ORIGIN = "127.0.0.2"


@pytest.fixture(scope="module")
def sock(local_cluster: localcluster.ClusterSpec) -> str:
    return str(local_cluster.munge_socket)


@pytest.fixture(scope="module")
def other_munged(local_cluster: localcluster.ClusterSpec) -> Iterator[str]:
    """A second munged, same key, ``--origin=127.0.0.2``: the munged of "another node"."""
    user = pwd.getpwnam("munge")
    base = Path(tempfile.mkdtemp(prefix="srecovery-munged2-"))
    base.chmod(0o755)
    os.chown(base, user.pw_uid, user.pw_gid)
    socket = base / "munge.socket"
    log = base / "munged.log"
    with open(base / "munged.out", "wb") as out:
        proc = subprocess.Popen(
            [
                "munged",
                "--foreground",
                f"--socket={socket}",
                f"--pid-file={base / 'munged.pid'}",
                f"--seed-file={base / 'munged.seed'}",
                f"--log-file={log}",
                f"--key-file={localcluster.MUNGE_KEY}",
                f"--origin={OTHER_ORIGIN}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            user="munge",
            group="munge",
            extra_groups=[],
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                munge.encode(b"", socket=str(socket))
                break
            except munge.MungeSocketError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    out_text = (base / "munged.out").read_text(errors="replace")
                    pytest.fail(f"second munged did not start: {out_text}")
                time.sleep(0.05)
        yield str(socket)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)


def check(headers, *, sock, method="POST", path=PATH, body=BODY, max_age=30.0, now=None, **kw):
    return verify(
        headers,
        method,
        path,
        body,
        socket=sock,
        max_age=max_age,
        now=time.time() if now is None else now,
        **kw,
    )


def refused(headers, **kw) -> str:
    with pytest.raises(AuthError) as info:
        check(headers, **kw)
    assert info.value.status == 401, info.value.reason
    return info.value.reason


def credential(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("MUNGE ")


# --- libmunge through ctypes ----------------------------------------------------------


def test_encode_decode_round_trip(sock):
    payload = bytes(range(256)) * 4
    decoded = munge.decode(munge.encode(payload, socket=sock, ttl=42), socket=sock)
    assert decoded.payload == payload
    assert (decoded.uid, decoded.gid) == (os.getuid(), os.getgid())
    assert decoded.ttl == 42
    assert abs(decoded.encode_time - time.time()) < 5
    ipaddress.IPv4Address(decoded.origin)


def test_empty_payload(sock):
    assert munge.decode(munge.encode(b"", socket=sock), socket=sock).payload == b""


def test_munged_rejects_a_replay(sock):
    cred = munge.encode(b"once", socket=sock)
    munge.decode(cred, socket=sock)
    with pytest.raises(munge.MungeReplayed) as info:
        munge.decode(cred, socket=sock)
    assert info.value.code == munge.EMUNGE_CRED_REPLAYED


def test_munged_rejects_an_expired_credential(sock):
    cred = munge.encode(b"short", socket=sock, ttl=1)
    time.sleep(2.1)
    with pytest.raises(munge.MungeExpired):
        munge.decode(cred, socket=sock)


def test_concurrent_use_from_threads(sock):
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(200):
                payload = f"{n}:{i}".encode()
                assert munge.decode(munge.encode(payload, socket=sock), socket=sock).payload == (
                    payload
                )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# --- signed requests ----------------------------------------------------------------------


def test_sign_verify_round_trip(sock):
    headers = sign("post", PATH, BODY, role="sidecar", node="n2", socket=sock)
    principal = check(headers, sock=sock)
    assert principal.uid == 0 and principal.gid == 0
    assert (principal.role, principal.node) == ("sidecar", "n2")
    ipaddress.IPv4Address(principal.origin)


def test_operator_round_trip_and_authorization(sock):
    headers = sign("POST", "/v1/report", b"{}", role="operator", socket=sock)
    principal = check(headers, sock=sock, path="/v1/report", body=b"{}")
    assert (principal.role, principal.node) == ("operator", None)
    authorize_operator(principal, OPS)
    authorize_evidence(principal, [{"node": "n4"}], {}, OPS)


def test_random_bytes_are_refused(sock):
    rng = random.Random(7)
    forged = "MUNGE:" + base64.b64encode(rng.randbytes(120)).decode() + ":"
    assert "credential invalid" in refused({"Authorization": f"MUNGE {forged}"}, sock=sock)


def test_one_changed_character_is_refused(sock):
    for position in range(10, 300, 29):
        cred = credential(sign("POST", PATH, BODY, role="operator", socket=sock))
        middle = cred[len("MUNGE:") : -1]
        position %= len(middle) - 4  # away from the padding
        swapped = "B" if middle[position] == "A" else "A"
        forged = "MUNGE:" + middle[:position] + swapped + middle[position + 1 :] + ":"
        reason = refused({"Authorization": f"MUNGE {forged}"}, sock=sock, seen=ReplayCache())
        assert "credential invalid" in reason


def test_a_replayed_request_is_refused_by_munged(sock):
    headers = sign("POST", PATH, BODY, role="sidecar", node="n2", socket=sock)
    check(headers, sock=sock, seen=ReplayCache())
    # A fresh replay cache: as if the controller had restarted. munged still remembers.
    reason = refused(headers, sock=sock, seen=ReplayCache())
    assert "replayed" in reason and "munged" in reason


def test_a_replayed_request_is_refused_by_the_replay_cache(sock):
    cache = ReplayCache()
    headers = sign("POST", PATH, BODY, role="sidecar", node="n2", socket=sock)
    check(headers, sock=sock, seen=cache)
    assert "replayed (already used with this controller)" in refused(headers, sock=sock, seen=cache)


def test_a_replay_through_another_munged_is_caught_by_the_replay_cache(sock, other_munged):
    # munged's replay memory is per daemon: a second verifier (another munged) accepts the
    # same credential once more. The controller's own cache is what stops it.
    cache = ReplayCache()
    headers = sign("POST", PATH, BODY, role="operator", socket=sock)
    check(headers, sock=sock, seen=cache)
    assert check(headers, sock=other_munged, seen=ReplayCache()).uid == 0  # munged #2: fine
    headers = sign("POST", PATH, BODY, role="operator", socket=sock)
    check(headers, sock=sock, seen=cache)
    assert "already used with this controller" in refused(headers, sock=other_munged, seen=cache)


def test_an_expired_credential_is_refused(sock):
    headers = sign("POST", PATH, BODY, role="operator", socket=sock, ttl=1)
    time.sleep(2.1)
    assert "expired" in refused(headers, sock=sock)


def test_a_fresh_credential_aged_past_max_age_is_refused(sock):
    headers = sign("POST", PATH, BODY, role="operator", socket=sock)
    time.sleep(2.1)
    assert "stale" in refused(headers, sock=sock, max_age=1.0)


def test_a_credential_from_the_future_is_refused(sock):
    headers = sign("POST", PATH, BODY, role="operator", socket=sock)
    # This host's clock 60 s behind the sender's: past the allowed skew.
    assert "from the future" in refused(headers, sock=sock, now=time.time() - 60)


def test_a_credential_within_the_skew_is_accepted(sock):
    headers = sign("POST", PATH, BODY, role="operator", socket=sock)
    check(headers, sock=sock, now=time.time() - 3, skew=5.0)


def test_a_body_changed_after_signing_is_refused(sock):
    headers = sign("POST", PATH, BODY, role="sidecar", node="n2", socket=sock)
    tampered = BODY.replace(b'"n2"', b'"n3"')
    assert "body does not match" in refused(headers, sock=sock, body=tampered)


def test_another_path_is_refused(sock):
    headers = sign("POST", PATH, BODY, role="operator", socket=sock)
    assert "signed for path" in refused(headers, sock=sock, path="/v1/drain")


def test_another_method_is_refused(sock):
    headers = sign("POST", PATH, BODY, role="operator", socket=sock)
    assert "signed for method POST, not PUT" in refused(headers, sock=sock, method="put")


def test_a_foreign_payload_is_refused(sock):
    cred = munge.encode(b"not a claim", socket=sock)
    assert "not a slurm-recovery request claim" in refused(
        {"Authorization": f"MUNGE {cred}"}, sock=sock
    )


def test_verify_with_munged_unreachable_is_503(tmp_path):
    headers = {"Authorization": "MUNGE MUNGE:" + base64.b64encode(b"z" * 90).decode() + ":"}
    with pytest.raises(AuthError) as info:
        check(headers, sock=str(tmp_path / "none.socket"))
    assert info.value.status == 503


def test_a_credential_from_another_user(sock):
    """A user (here ``nobody``) signs with the plain munge CLI: munged vouches for its uid,
    whatever role it claims, and it may report nothing."""
    nobody = pwd.getpwnam("nobody")
    payload = claim("POST", PATH, BODY, role="sidecar", node="n2")
    cred = subprocess.run(
        ["munge", "-S", sock, "-s", payload.decode()],
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout.strip()
    principal = check({"Authorization": f"MUNGE {cred}"}, sock=sock)
    assert (principal.uid, principal.gid) == (nobody.pw_uid, nobody.pw_gid)
    assert principal.role == "sidecar" and principal.node == "n2"
    addresses = {"n2": frozenset({principal.origin})}
    with pytest.raises(AuthError) as info:
        authorize_evidence(principal, [{"node": "n2"}], addresses, OPS)
    assert info.value.status == 403 and f"uid {nobody.pw_uid}" in info.value.reason
    as_operator = Principal(**{**principal.__dict__, "role": "operator", "node": None})
    with pytest.raises(AuthError):
        authorize_operator(as_operator, OPS)


# --- origin addresses: a sidecar on n2 (munged --origin=127.0.0.2) ------------------------

NODE_ADDRESSES = {"n2": frozenset({"127.0.0.2"}), "n3": frozenset({"127.0.0.3"})}


def test_another_munged_stamps_its_origin_and_ours_decodes_it(sock, other_munged):
    decoded = munge.decode(munge.encode(b"hi", socket=other_munged), socket=sock)
    assert decoded.origin == OTHER_ORIGIN
    assert decoded.payload == b"hi"


def test_sidecar_on_n2_may_report_about_n2(sock, other_munged):
    headers = sign("POST", PATH, BODY, role="sidecar", node="n2", socket=other_munged)
    principal = check(headers, sock=sock)
    assert principal.origin == OTHER_ORIGIN
    authorize_evidence(principal, [{"node": "n2", "kind": "xid"}], NODE_ADDRESSES, OPS)


def test_sidecar_on_n2_may_not_report_about_n3(sock, other_munged):
    headers = sign("POST", PATH, BODY, role="sidecar", node="n2", socket=other_munged)
    principal = check(headers, sock=sock)
    with pytest.raises(AuthError) as info:
        authorize_evidence(
            principal,
            [{"node": "n2", "kind": "xid"}, {"node": "n3", "kind": "xid"}],
            NODE_ADDRESSES,
            OPS,
        )
    assert info.value.status == 403
    assert "event 1:" in info.value.reason and "'n3'" in info.value.reason


def test_sidecar_on_n2_claiming_to_be_n3_is_refused_by_its_origin(sock, other_munged):
    headers = sign("POST", PATH, BODY, role="sidecar", node="n3", socket=other_munged)
    principal = check(headers, sock=sock)
    with pytest.raises(AuthError) as info:
        authorize_evidence(principal, [{"node": "n3", "kind": "xid"}], NODE_ADDRESSES, OPS)
    assert info.value.status == 403
    assert "127.0.0.2" in info.value.reason and "not an address of n3" in info.value.reason
