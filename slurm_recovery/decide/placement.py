"""Placement: can a job run again without the nodes it is to be kept off? Pure.

A requeue that excludes nodes can leave a job with fewer usable nodes than it needs (a job
spanning its whole partition, a partition thinned by drains). Slurm then keeps it PENDING for
ever, with a reason few read ("Nodes required for job are DOWN, DRAINED or reserved ..."). This
module counts, from the node listing the loop already reads, the job's partition's nodes that
could take it: not down, drained or failing, not excluded, and matching its ``--constraint``
when that is a plain list of features (``a``, ``a&b``, ``a,b``, ``a|b``). A node in a passing
state counts as usable: one that is not responding (for a moment, or until Slurm marks it DOWN
after ``SlurmdTimeout``), asleep under power saving (Slurm powers it up for a job), rebooting,
or not yet registered (UNKNOWN): none of them needs an operator to take a job, and a job must
not be stopped, or flagged as needing one, on a snapshot taken during a ping that timed out.

What it does not know: a node's free CPUs, memory or GPUs (busy nodes count as usable: they
free up), reservations, licences, and constraints with counts, brackets or parentheses (then
features are not checked). Each gap can only make it count too many nodes, so it may miss a job
that cannot run (as before), never stop or flag one that can.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from slurm_recovery.contract.hostlist import compress
from slurm_recovery.scheduler.base import Job, Node

#: Base states of a node that takes no job until someone acts (or, FUTURE, until it is added).
UNUSABLE_STATES = frozenset({"DOWN", "FAIL", "FUTURE"})
#: Flags of a node that takes no job until someone acts (DRAIN: draining or drained; FAIL:
#: failing, by an operator's ``state=fail``). Passing ones (NOT_RESPONDING, POWERED_DOWN,
#: POWERING_DOWN, REBOOT_ISSUED, COMPLETING) do not count: see the module's docstring.
UNUSABLE_FLAGS = frozenset({"DRAIN", "FAIL"})
_PLAIN = re.compile(r"^[\w.-]+(?:[&,|][\w.-]+)*$")


@dataclass(frozen=True)
class Shortfall:
    """The job needs ``need`` nodes; ``usable`` could take it once ``excluded`` are left out."""

    need: int
    usable: frozenset[str]
    excluded: frozenset[str]

    def words(self) -> str:
        """``job needs 4 nodes, 3 are usable after excluding n2``."""
        count = len(self.usable)
        verb = "is" if count == 1 else "are"
        text = f"job needs {self.need} node{'s' if self.need != 1 else ''}, {count} {verb} usable"
        if self.excluded:
            text += f" after excluding {compress(self.excluded)}"
        return text


def usable(node: Node) -> bool:
    """Whether ``node`` can take a job without anyone acting (it may be busy: busy nodes free
    up; it may be asleep, rebooting or missing a ping: those pass)."""
    return node.state not in UNUSABLE_STATES and not (node.flags & UNUSABLE_FLAGS)


def matches(constraint: str, features: frozenset[str] | None) -> bool:
    """Whether a node with ``features`` satisfies ``constraint`` (True when either is not
    known or the constraint is not a plain list of features: never a reason to refuse)."""
    text = constraint.strip()
    if not text or features is None or not _PLAIN.match(text):
        return True
    if "|" in text and ("&" in text or "," in text):
        return True  # mixed AND/OR: precedence is Slurm's business
    if "|" in text:
        return any(name in features for name in text.split("|"))
    return all(name in features for name in re.split(r"[&,]", text))


def shortfall(
    job: Job,
    nodes: Mapping[str, Node],
    excluded: Iterable[str],
) -> Shortfall | None:
    """Why ``job`` cannot run with ``excluded`` (its own exclusions and the new ones) left
    out, or None when it can, or when it cannot be told (its partition has no node in the
    listing, or the job's node count is not known)."""
    partitions = {p for p in job.partition.split(",") if p}
    if job.num_nodes <= 0 or not partitions:
        return None
    members = [n for n in nodes.values() if partitions & set(n.partitions)]
    if not members:
        return None
    left_out = frozenset(excluded)
    fit = frozenset(
        n.name
        for n in members
        if n.name not in left_out and usable(n) and matches(job.features, n.features)
    )
    need = max(job.num_nodes, len(job.required_nodes))
    if len(fit) >= need and job.required_nodes <= fit | (job.required_nodes - set(nodes)):
        return None
    return Shortfall(need=need, usable=fit, excluded=left_out & {n.name for n in members})
