"""Authorization rules: who may report evidence about which node, who may operate, who may read."""

from __future__ import annotations

import grp
import pwd

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.auth import (
    AuthError,
    Operators,
    Principal,
    authorize_evidence,
    authorize_operator,
    authorize_read,
    is_operator,
    operators_from_system,
)

SLURM_UID = 64030
OPERATOR_GID = 4242
OPS = Operators(uids=frozenset({0, SLURM_UID}), gids=frozenset({OPERATOR_GID}))
NODES = [f"n{i}" for i in range(1, 9)]
ADDRESSES = {node: frozenset({f"10.0.0.{i}"}) for i, node in enumerate(NODES, start=1)}

nodes = st.sampled_from(NODES)
node_uids = st.sampled_from(sorted(OPS.uids))
# Not root, not the SlurmUser, not in the operator group.
user_uids = st.integers(min_value=1, max_value=2**32 - 2).filter(lambda u: u not in OPS.uids)
user_gids = st.integers(min_value=0, max_value=2**32 - 2).filter(lambda g: g not in OPS.gids)
events = st.lists(st.fixed_dictionaries({"node": nodes, "kind": st.just("xid")}), max_size=6)


def sidecar(node: str, uid: int = 0, origin: str | None = None, role: str = "sidecar"):
    origin = origin if origin is not None else next(iter(ADDRESSES[node]))
    return Principal(uid=uid, gid=0, origin=origin, role=role, node=node)


def refused(call, *args) -> AuthError:
    with pytest.raises(AuthError) as info:
        call(*args)
    assert info.value.status == 403
    return info.value


# --- properties -------------------------------------------------------------------------


@given(
    node=nodes,
    uid=node_uids,
    role=st.sampled_from(["sidecar", "hook"]),
    batch=events,
    other=nodes,
    at=st.integers(min_value=0),
)
def test_any_event_about_another_node_is_refused(node, uid, role, batch, other, at):
    if other == node:
        other = NODES[(NODES.index(node) + 1) % len(NODES)]
    batch = list(batch)
    batch.insert(at % (len(batch) + 1), {"node": other, "kind": "xid"})
    first = next(i for i, event in enumerate(batch) if event["node"] != node)
    err = refused(authorize_evidence, sidecar(node, uid, role=role), batch, ADDRESSES, OPS)
    assert f"event {first}:" in err.reason
    assert repr(batch[first]["node"]) in err.reason


@given(node=nodes, uid=node_uids, count=st.integers(0, 6))
def test_a_node_agent_may_report_about_its_own_node(node, uid, count):
    batch = [{"node": node, "kind": "xid"}] * count
    authorize_evidence(sidecar(node, uid), batch, ADDRESSES, OPS)


@given(
    batch=events,
    who=st.one_of(
        st.builds(lambda u: (u, 12345), node_uids),
        st.builds(lambda u: (u, OPERATOR_GID), user_uids),
    ),
    origin=st.ip_addresses(v=4).map(str),
)
def test_operators_may_report_about_any_node_from_anywhere(batch, who, origin):
    uid, gid = who
    principal = Principal(uid=uid, gid=gid, origin=origin, role="operator", node=None)
    authorize_evidence(principal, batch, ADDRESSES, OPS)
    authorize_operator(principal, OPS)


@given(
    uid=user_uids,
    gid=user_gids,
    role=st.sampled_from(["sidecar", "hook", "operator", "reader"]),
    node=nodes,
    batch=events,
)
def test_non_operators_never_report_evidence(uid, gid, role, node, batch):
    origin = next(iter(ADDRESSES[node]))
    principal = Principal(
        uid=uid,
        gid=gid,
        origin=origin,
        role=role,
        node=node if role in ("sidecar", "hook") else None,
    )
    refused(authorize_evidence, principal, batch, ADDRESSES, OPS)
    refused(authorize_operator, principal, OPS)


@given(
    uid=st.integers(0, 2**32 - 2),
    gid=st.integers(0, 2**32 - 2),
    role=st.sampled_from(["sidecar", "hook", "operator", "reader"]),
)
def test_every_authenticated_principal_may_read(uid, gid, role):
    node = "n1" if role in ("sidecar", "hook") else None
    authorize_read(Principal(uid=uid, gid=gid, origin="10.9.9.9", role=role, node=node))


# --- examples -----------------------------------------------------------------------------


def test_sidecar_from_another_nodes_address_is_refused():
    # The credential says "sidecar of n2" but munged on 10.0.0.3 (n3) stamped it.
    err = refused(
        authorize_evidence,
        sidecar("n2", origin="10.0.0.3"),
        [{"node": "n2", "kind": "xid"}],
        ADDRESSES,
        OPS,
    )
    assert "10.0.0.3" in err.reason and "n2" in err.reason


def test_sidecar_of_an_unknown_node_is_refused():
    principal = Principal(uid=0, gid=0, origin="10.0.0.1", role="sidecar", node="gpu99")
    err = refused(authorize_evidence, principal, [{"node": "gpu99"}], ADDRESSES, OPS)
    assert "gpu99" in err.reason


def test_node_with_several_addresses():
    addresses = {"n1": frozenset({"10.0.0.1", "192.168.1.1"})}
    principal = sidecar("n1", origin="192.168.1.1")
    authorize_evidence(principal, [{"node": "n1"}], addresses, OPS)


def test_event_without_a_node_is_refused_for_a_sidecar():
    err = refused(
        authorize_evidence, sidecar("n1"), [{"node": "n1"}, {"kind": "x"}], ADDRESSES, OPS
    )
    assert "event 1:" in err.reason and "None" in err.reason


def test_sidecar_credential_from_an_ordinary_user_is_refused():
    # A user on n3 runs the sidecar's client by hand: its uid gives it away.
    err = refused(authorize_evidence, sidecar("n3", uid=1000), [{"node": "n3"}], ADDRESSES, OPS)
    assert "uid 1000" in err.reason


def test_operator_group_member_by_primary_gid():
    principal = Principal(uid=1000, gid=OPERATOR_GID, origin="10.1.1.1", role="operator", node=None)
    assert is_operator(principal, OPS)
    authorize_operator(principal, OPS)


def test_mutating_calls_need_an_operator_credential_even_from_root():
    err = refused(authorize_operator, sidecar("n1", uid=0), OPS)
    assert "sign as operator" in err.reason
    reader = Principal(uid=0, gid=0, origin="10.0.0.1", role="reader", node=None)
    refused(authorize_operator, reader, OPS)
    refused(authorize_evidence, reader, [], ADDRESSES, OPS)


def test_operators_from_system():
    ops = operators_from_system("nobody", "")
    assert ops.uids == frozenset({0, pwd.getpwnam("nobody").pw_uid})
    assert ops.gids == frozenset()
    group = grp.getgrgid(0)
    ops = operators_from_system("root", group.gr_name)
    assert ops.gids == frozenset({0})
    assert {pwd.getpwnam(m).pw_uid for m in group.gr_mem} <= ops.uids


def test_operators_from_system_names_what_is_missing():
    with pytest.raises(ValueError, match="SlurmUser 'no-such-user-x'"):
        operators_from_system("no-such-user-x", "")
    with pytest.raises(ValueError, match="operator group 'no-such-group-x'"):
        operators_from_system("root", "no-such-group-x")
