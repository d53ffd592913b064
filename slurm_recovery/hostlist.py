"""Slurm host lists (``n[1-4,7]``) as sets, via ClusterShell; never split by hand."""

from __future__ import annotations

from collections.abc import Iterable

from ClusterShell.NodeSet import NodeSet, NodeSetParseError


class HostlistError(ValueError):
    """A host list expression Slurm would not accept."""


def expand(expr: str | None) -> list[str]:
    """``"n[1-3],m1"`` -> ``["m1", "n1", "n2", "n3"]`` (ClusterShell order); empty for None/""."""
    if not expr or expr in ("(null)", "None"):
        return []
    try:
        return list(NodeSet(expr))
    except NodeSetParseError as exc:
        raise HostlistError(f"invalid host list {expr!r}: {exc}") from exc


def compress(names: Iterable[str]) -> str:
    """``["n1", "n2", "n4"]`` -> ``"n[1-2,4]"``; ``""`` for no names."""
    names = [n for n in names if n]
    if not names:
        return ""
    return str(NodeSet.fromlist(names))
