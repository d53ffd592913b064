"""Who may do what: pure rules over an authenticated Principal (no I/O but the one helper).

- Evidence: an operator may report about any node. A sidecar or hook (running as root or the
  SlurmUser) may report only about the node it speaks for, and only from that node's address.
  Anyone else may report nothing.
- Mutating operator calls: operators only, with an operator credential.
- Reads: anyone MUNGE authenticates.
Every refusal is AuthError(403, reason); the reason names what was refused and why.
"""

from __future__ import annotations

import grp
import pwd
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm_recovery.contract.requests import NODE_ROLES, AuthError, Principal


@dataclass(frozen=True)
class Operators:
    """Operator identities: ``uids`` (root, the SlurmUser, named members of the operator group)
    and ``gids`` (the operator group: matches a credential's gid, the sender's primary group).

    Sidecar and hook credentials must come from a uid in ``uids``.
    """

    uids: frozenset[int]
    gids: frozenset[int] = frozenset()


def operators_from_system(slurm_user: str, operator_group: str) -> Operators:
    """Operators as this host's passwd/group databases define them: uid 0, ``slurm_user``,
    and ``operator_group`` (its gid, plus the uids of its listed members, since a MUNGE
    credential carries only the sender's primary gid). ``operator_group`` "" means none."""
    try:
        uids = {0, pwd.getpwnam(slurm_user).pw_uid}
    except KeyError:
        raise ValueError(f"SlurmUser {slurm_user!r} is not a user on this host") from None
    gids: set[int] = set()
    if operator_group:
        try:
            group = grp.getgrnam(operator_group)
        except KeyError:
            raise ValueError(
                f"operator group {operator_group!r} is not a group on this host"
            ) from None
        gids.add(group.gr_gid)
        for member in group.gr_mem:
            try:
                uids.add(pwd.getpwnam(member).pw_uid)
            except KeyError:
                continue  # a stale name in /etc/group grants nothing
    return Operators(uids=frozenset(uids), gids=frozenset(gids))


def is_operator(principal: Principal, operators: Operators) -> bool:
    return principal.uid in operators.uids or principal.gid in operators.gids


def authorize_evidence(
    principal: Principal,
    events: Sequence[Mapping],
    node_addresses: Mapping[str, frozenset[str]],
    operators: Operators,
) -> None:
    """Raise AuthError(403) unless ``principal`` may report every one of ``events``.

    ``node_addresses``: node name -> the IPv4 addresses its munged may stamp (from Slurm's
    NodeAddr/NodeHostname, resolved by the caller).
    """
    if principal.role == "operator":
        if is_operator(principal, operators):
            return
        raise AuthError(
            403,
            f"uid {principal.uid} gid {principal.gid} is not an operator "
            "(root, the SlurmUser or the operator group): it may not report evidence",
        )
    if principal.role not in NODE_ROLES:
        raise AuthError(403, f"a {principal.role} credential may not report evidence")
    node = principal.node
    if principal.uid not in operators.uids:
        raise AuthError(
            403,
            f"{principal.role} credential for {node} from uid {principal.uid}: sidecars and "
            "hooks run as root or the SlurmUser",
        )
    if not node:
        raise AuthError(403, f"{principal.role} credential names no node")
    addresses = node_addresses.get(node)
    if addresses is None:
        raise AuthError(403, f"{principal.role} speaks for {node!r}, which is not a known node")
    if principal.origin not in addresses:
        raise AuthError(
            403,
            f"{principal.role} for {node} sent from {principal.origin}, which is not an "
            f"address of {node} ({', '.join(sorted(addresses)) or 'none known'})",
        )
    for index, event in enumerate(events):
        named = event.get("node")
        if named != node:
            raise AuthError(
                403,
                f"event {index}: about node {named!r}, but this {principal.role} speaks "
                f"only for {node}",
            )


def authorize_operator(principal: Principal, operators: Operators) -> None:
    """Raise AuthError(403) unless an operator, with an operator credential, is calling."""
    if principal.role != "operator":
        raise AuthError(403, f"a {principal.role} credential may not do this: sign as operator")
    if not is_operator(principal, operators):
        raise AuthError(
            403,
            f"uid {principal.uid} gid {principal.gid} is not an operator "
            "(root, the SlurmUser or the operator group)",
        )


def authorize_read(principal: Principal) -> None:
    """Every authenticated principal may read (incidents, advice, audit, nodes): what the
    tool knows is what ``squeue``/``sinfo`` already show every user, plus the evidence."""
