"""Sessions (contract/sessions.py): what the controller checks on a request signed in a
session. The MUNGE half (opening a session, the key credential) runs against real munged in
tests/integration/test_sessions.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.contract import sessions
from slurm_recovery.contract.requests import AuthError, Principal

NOW = 1_700_000_000.0
SIDECAR = Principal(uid=0, gid=0, origin="10.0.0.2", role="sidecar", node="n2")
BODY = b'{"events":[{"kind":"xid","node":"n2","observed_at":1700000000,"payload":{"xid":79}}]}'


def opened(
    table: sessions.SessionTable | None = None,
) -> tuple[sessions.SessionTable, sessions.Session]:
    table = sessions.SessionTable(ttl=3600) if table is None else table
    return table, table.open(SIDECAR, "10.0.0.2", NOW)


def signed(
    session: sessions.Session,
    counter: int = 1,
    *,
    at: float = NOW,
    body: bytes = BODY,
    method: str = "POST",
    path: str = "/v1/evidence",
) -> str:
    return sessions.authorization(
        session.id, session.key, method, path, body, now=at, counter=counter
    )


def check(
    table: sessions.SessionTable,
    header: str,
    *,
    body: bytes = BODY,
    peer: str = "10.0.0.2",
    now: float = NOW,
    path: str = "/v1/evidence",
    method: str = "POST",
) -> Principal:
    session = table.verify_session(
        header, method, path, body, peer=peer, now=now, max_age=60, skew=5
    )
    return session.principal


def refused(table: sessions.SessionTable, header: str, **kw) -> str:
    with pytest.raises(AuthError) as info:
        check(table, header, **kw)
    assert info.value.status == 401
    assert info.value.reason.startswith(sessions.REFUSAL)  # the client opens a new session
    return info.value.reason


def test_a_request_signed_in_the_session_is_the_sessions_principal():
    table, session = opened()
    assert check(table, signed(session, 1)) == SIDECAR
    assert check(table, signed(session, 2, at=NOW + 30), now=NOW + 31) == SIDECAR


def test_a_replayed_or_reordered_request_is_refused():
    table, session = opened()
    first, second = signed(session, 1), signed(session, 2)
    check(table, second)
    assert "replayed" in refused(table, second)
    assert "replayed" in refused(table, first)  # an older counter, never seen: still refused


@pytest.mark.parametrize(
    "change",
    [
        {"body": BODY.replace(b"79", b"13")},
        {"path": "/v1/operator/drain"},
        {"method": "PUT"},
    ],
)
def test_anything_but_the_signed_request_is_refused(change):
    table, session = opened()
    assert "MAC" in refused(table, signed(session), **change)


def test_a_forged_mac_or_time_is_refused():
    table, session = opened()
    header = signed(session)
    flipped = header[:-1] + ("0" if header[-1] != "0" else "1")
    assert "MAC" in refused(table, flipped)
    later = header.replace(f"t={NOW:.3f}", f"t={NOW + 50:.3f}")
    assert "MAC" in refused(table, later)  # the time is signed too


def test_another_sessions_key_does_not_sign_for_this_one():
    table, mine = opened()
    other = table.open(Principal(0, 0, "10.0.0.3", "sidecar", "n3"), "10.0.0.3", NOW)
    forged = sessions.authorization(
        mine.id, other.key, "POST", "/v1/evidence", BODY, now=NOW, counter=1
    )
    assert "MAC" in refused(table, forged)


def test_a_session_is_bound_to_the_address_it_was_opened_from():
    table, session = opened()
    assert "used from 10.0.0.9" in refused(table, signed(session), peer="10.0.0.9")
    assert check(table, signed(session, 2), peer="::ffff:10.0.0.2") == SIDECAR  # IPv4-mapped


def test_stale_and_future_requests_are_refused():
    table, session = opened()
    assert "stale" in refused(table, signed(session, 1, at=NOW - 61))
    assert "future" in refused(table, signed(session, 2, at=NOW + 6))
    assert check(table, signed(session, 3, at=NOW + 4)) == SIDECAR  # within the skew


def test_an_expired_unknown_or_replaced_session_is_refused():
    table, session = opened(sessions.SessionTable(ttl=10))
    assert "unknown or expired" in refused(table, signed(session, at=NOW + 11), now=NOW + 11)
    table, session = opened()
    newer = table.open(SIDECAR, "10.0.0.2", NOW + 1)  # the sidecar restarted: one per node
    assert "unknown" in refused(table, signed(session))
    assert check(table, signed(newer)) == SIDECAR
    assert len(table) == 1


def test_the_table_is_bounded():
    table = sessions.SessionTable(ttl=3600, capacity=3)
    for i in range(10):
        table.open(Principal(0, 0, "10.0.0.1", "sidecar", f"n{i}"), "10.0.0.1", NOW + i)
    assert len(table) == 3


@given(st.text(max_size=300))
def test_any_header_is_refused_with_a_401(header: str):
    table, _ = opened()
    with pytest.raises(AuthError) as info:
        check(table, header)
    assert info.value.status == 401


def test_a_client_whose_new_session_is_refused_too_reports_with_munge(monkeypatch):
    """Fail open: a sidecar behind something that changes its address between connections
    gets its sessions refused; after one new session it signs with MUNGE, and keeps doing so
    for a while, instead of never delivering."""
    from slurm_recovery.contract import client as client_module
    from slurm_recovery.contract.client import ClientError, ControllerClient
    from slurm_recovery.contract.munge import Decoded

    client = ControllerClient("http://controller:6820", sessions=True)
    sent: list[tuple[str, str]] = []

    def send(method, path, body, headers):
        scheme = headers["Authorization"].split()[0]
        sent.append((path, scheme))
        if path == "/v1/session":
            return {"session": "a" * 32, "key": "MUNGE:xyz:", "ttl": 3600, "expires_at": 0}
        if scheme == sessions.SCHEME:
            raise ClientError(401, "session opened from 10.0.0.1, used from 10.0.0.9")
        return {"accepted": 1, "ids": [1]}

    monkeypatch.setattr(client, "_send", send)
    monkeypatch.setattr(client, "_munge_headers", lambda *args: {"Authorization": "MUNGE x"})
    monkeypatch.setattr(
        client_module.munge,
        "decode",
        lambda cred, socket=None: Decoded(b"k" * 32, 0, 0, 0, 300, ""),
    )
    event = {"kind": "sidecar_status", "observed_at": NOW, "node": "n2"}
    assert client.post_evidence([event], role="sidecar", node="n2") == {"accepted": 1, "ids": [1]}
    assert sent == [
        ("/v1/session", "MUNGE"),
        ("/v1/evidence", sessions.SCHEME),
        ("/v1/session", "MUNGE"),
        ("/v1/evidence", sessions.SCHEME),
        ("/v1/evidence", "MUNGE"),
    ]
    client.post_evidence([event], role="sidecar", node="n2")
    assert sent[5:] == [("/v1/evidence", "MUNGE")]  # no session asked for again yet
