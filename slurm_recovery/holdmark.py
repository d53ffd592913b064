"""The mark on a job the tool holds: ``srecovery:held:<incident>:<until>`` in its AdminComment.

Written before ``requeue_hold`` and replaced on release, so the watchdog can find jobs held by
the tool (and only those) without the controller or its database, and release any held past
``until`` (epoch seconds).
"""

from __future__ import annotations

import re

_MARK = re.compile(r"srecovery:held:(\d+):(\d+)")


def hold_mark(incident_id: int, until: float) -> str:
    return f"srecovery:held:{int(incident_id)}:{int(until)}"


def parse_hold_mark(comment: str) -> tuple[int, int] | None:
    """``(incident_id, until)`` when ``comment`` carries the mark, else None."""
    match = _MARK.search(comment or "")
    return (int(match[1]), int(match[2])) if match else None
