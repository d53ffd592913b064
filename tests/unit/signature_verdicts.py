"""What the log classifier answers for a few lines: the helpers the signature tests share."""

from __future__ import annotations

from slurm_recovery.signals.logs import LogVerdict, classify, scan


def verdict(*lines: str, nodes: list[str] | None = None) -> LogVerdict:
    """The verdict on ``lines`` as a job's log (``nodes``: the job's nodes, as --nodes)."""
    return classify(scan(list(lines)), nodes=nodes)


def answer(*lines: str, nodes: list[str] | None = None) -> tuple[str, list[str]]:
    """The verdict's action and the nodes it blames."""
    v = verdict(*lines, nodes=nodes)
    return v.action, v.blame_nodes
