"""The value types our catalogues (XIDs, log signatures) and the decision core share.

The catalogues are data files admins read and edit (signals/data/*.toml); the sidecar puts
their values into events (a log signature's class), the controller decides on them and the
CLI prints them. One definition for all of them.
"""

from __future__ import annotations

from enum import StrEnum


class FaultClass(StrEnum):
    """Who is at fault: decides exclusion/drain (node) versus stop (application)."""

    HARDWARE = "hardware"
    SYSTEM = "system"
    APPLICATION = "application"
    UNKNOWN = "unknown"
