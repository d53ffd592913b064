"""Nodes from ``scontrol --oneliner show nodes``: the node read the loop makes every pass.

Why text and not JSON: at 10,000 nodes ``scontrol show nodes --json`` (24.11) costs 2.2 s of
CPU for 23 MB whose ``json.loads`` holds the GIL for 270 ms, and 22.05's ``sinfo --json`` 0.5 s
for 12 MB (81 ms); the one-line text costs 50-70 ms of scontrol's CPU on both and is read a
line at a time, so the controller's request handlers are never held up for long. A line equal
to one of the last read is not parsed again (:class:`NodeLines`): the controller's own work
follows what changed, not the cluster's size (docs/performance.md, "Controller scale").

Only lines that say exactly one thing are read from the text. Slurm prints a node's free-text
fields (Reason, then Comment, Extra, ...) at the end of its line, unquoted, so a line whose
reason is not followed by its ``[user@time]`` mark at the very end (a multi-line reason, a
comment or extra text after it, a reason without a time) could be split in two ways; those
nodes are read again from the JSON that ``scheduler.slurmjson`` reads
(:meth:`~slurm_recovery.scheduler.scontrol.ScontrolScheduler.list_nodes`). The times are
printed as epoch seconds (``SLURM_TIME_FORMAT=%s`` in the command's environment).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from slurm_recovery.scheduler.base import Node
from slurm_recovery.scheduler.slurmjson import gpu_count

#: The command, and the environment it needs (times as epoch seconds in the reason's mark).
COMMAND = ("scontrol", "--oneliner", "show", "nodes")
ENV = {"SLURM_TIME_FORMAT": "%s"}

_FIELD = {
    key: re.compile(rf" {key}=(\S*)")
    for key in ("State", "Partitions", "NodeAddr", "NodeHostName", "Gres", "ActiveFeatures")
}
#: Where a line's free text starts: Slurm prints these after every fixed field (22.05-25.11).
_FREE_TEXT = re.compile(
    r" (Reason|Comment|Extra|InstanceId|InstanceType|ReservationName|Topology|Parameters)="
)
_MARK = re.compile(r" \[([^\s\[\]@]*)@(\d+)\]$")


def line_name(line: str) -> str:
    """The node a ``NodeName=...`` line is about."""
    return line[len("NodeName=") :].partition(" ")[0]


def node_from_line(line: str) -> Node | None:
    """One ``scontrol -o show nodes`` line as a :class:`Node`; None when the line cannot be
    read with certainty (its free text could end in more than one place: read the JSON)."""
    if not line.startswith("NodeName="):
        return None
    name = line_name(line)
    free = _FREE_TEXT.search(line)
    head = line[: free.start()] if free else line
    values = {}
    for key, pattern in _FIELD.items():
        found = pattern.search(head)
        values[key] = found.group(1) if found else ""
    if not name or not values["State"]:
        return None
    reason, set_by, changed_at = "", "", 0
    if free and free.group(1) == "Reason":
        reason = line[free.end() :]
        mark = _MARK.search(reason)
        if mark is None or _FREE_TEXT.search(reason):
            return None  # no time mark at the very end, or more free text: ambiguous
        set_by, changed_at = mark.group(1), int(mark.group(2))
        reason = reason[: mark.start()]
    base, *flags = values["State"].split("+")
    return Node(
        name=name,
        state=base.upper(),
        flags=frozenset(f.upper() for f in flags),
        reason=reason,
        partitions=tuple(p for p in values["Partitions"].split(",") if p),
        address=values["NodeAddr"],
        hostname=values["NodeHostName"],
        reason_set_by=set_by,
        reason_changed_at=changed_at,
        gpus=gpu_count(values["Gres"]),  # "(null)" counts none, as the JSON's ""
        features=_features(values["ActiveFeatures"]) if " ActiveFeatures=" in head else None,
    )


def _features(text: str) -> frozenset[str]:
    """``ActiveFeatures=a100,ib`` -> its names; ``(null)`` is none."""
    return frozenset(f for f in text.split(",") if f and f != "(null)")


class NodeLines:
    """The nodes of the last read, by their line: a line read before is not parsed again.

    ``read(text, from_json)`` returns every node in ``text``; the nodes whose lines cannot be
    read with certainty come from ``from_json(names)`` (one call per read, for all of them).
    ``parsed`` counts the lines parsed by the last read (what changed since the one before).
    """

    def __init__(self) -> None:
        self._nodes: dict[str, Node] = {}
        self._last: tuple[str, list[Node]] = ("", [])
        self.parsed = 0

    def read(self, text: str, from_json: Callable[[Iterable[str]], dict[str, Node]]) -> list[Node]:
        if text and text == self._last[0]:  # nothing changed: not even split (5 MB, 10 ms)
            self.parsed = 0
            return list(self._last[1])
        known, fresh = self._nodes, {}
        lines = [line for line in text.splitlines() if line.startswith("NodeName=")]
        unread: dict[str, str] = {}  # name -> line, for the JSON read
        parsed = 0
        for line in lines:
            node = known.get(line)
            if node is None:
                parsed += 1
                node = node_from_line(line)
            if node is None:
                unread[line_name(line)] = line
            else:
                fresh[line] = node
        if unread:
            found = from_json(unread)
            fresh.update((line, found[name]) for name, line in unread.items() if name in found)
        self._nodes, self.parsed = fresh, parsed
        nodes = [fresh[line] for line in lines if line in fresh]
        # kept whole only when every line gave its node (else the JSON is asked again next time)
        self._last = (text, nodes) if len(nodes) == len(lines) else ("", [])
        return list(nodes)
