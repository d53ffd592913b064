"""Slurm host lists (``gpu[001-008],n7``) as node names, and back.

Slurm's usual forms (one prefix, ascending ranges of one zero-padding) are expanded here with the
standard library, in ClusterShell's order (a hypothesis test holds the two equal), because the
hooks expand ``SLURM_JOB_NODELIST`` on every job start and ClusterShell's import costs them
~15 ms. Everything else goes to ClusterShell, imported on first use: host lists are never split
by hand beyond the usual forms.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


class HostlistError(ValueError):
    """A host list expression Slurm would not accept."""


_PLAIN_HOST = re.compile(r"[A-Za-z0-9._-]+")
_ONE_RANGE_SET = re.compile(
    r"([A-Za-z._-][A-Za-z0-9._-]*?)\[([0-9,-]+)\]([A-Za-z._-][A-Za-z0-9._-]*)?"
)
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
#: Longest host list the fast path expands (beyond: ClusterShell).
_FAST_MAX_NODES = 100_000


def _expand_fast(expr: str) -> list[str] | None:
    """``n7`` and ``gpu[001-004,9]`` expanded in ClusterShell's order; None for other forms."""
    if _PLAIN_HOST.fullmatch(expr):
        return [expr]
    found = _ONE_RANGE_SET.fullmatch(expr)
    if not found:
        return None
    prefix, ranges, suffix = found.group(1), found.group(2), found.group(3) or ""
    width = None
    indexes: set[int] = set()
    for part in ranges.split(","):
        bounds = _RANGE.fullmatch(part)
        if not bounds:
            return None
        low_text, high_text = bounds.group(1), bounds.group(2) or bounds.group(1)
        padded = len(low_text) > 1 and low_text.startswith("0")
        if padded and len(high_text) != len(low_text):
            return None
        part_width = len(low_text) if padded else 0
        if (width is not None and part_width != width) or (
            not padded and len(high_text) > 1 and high_text.startswith("0")
        ):
            return None
        width = part_width
        low, high = int(low_text), int(high_text)
        if high < low or len(indexes) + high - low >= _FAST_MAX_NODES:
            return None
        indexes.update(range(low, high + 1))
    if width and any(len(str(i)) > width for i in indexes):
        return None
    return [f"{prefix}{i:0{width or 1}d}{suffix}" for i in sorted(indexes)]


def expand(expr: str | None) -> list[str]:
    """``"n[1-3],m1"`` -> ``["m1", "n1", "n2", "n3"]`` (ClusterShell order); empty for None/"".

    Raises :class:`HostlistError` for an expression Slurm would not accept.
    """
    if not expr or expr in ("(null)", "None"):
        return []
    fast = _expand_fast(expr)
    if fast is not None:
        return fast
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

    try:  # Slurm has no node groups: '@' is never ClusterShell's group syntax here, so no
        # group source of this host's ClusterShell configuration is asked (nor its commands run)
        return list(NodeSet(expr, resolver=RESOLVER_NOGROUP))
    except NodeSetException as exc:
        raise HostlistError(f"invalid host list {expr!r}: {exc}") from exc


def compress(names: Iterable[str]) -> str:
    """``["n1", "n2", "n4"]`` -> ``"n[1-2,4]"``; ``""`` for no names."""
    names = [n for n in names if n]
    if not names:
        return ""
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet

    return str(NodeSet.fromlist(names, resolver=RESOLVER_NOGROUP))
