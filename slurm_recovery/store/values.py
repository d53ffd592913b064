"""Argument checks and canonical JSON shared by the store's records and its audit chain.

Every check raises ``ValueError`` (or ``TypeError``) naming the field, so bad input is caught
before any write starts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def canonical_json(value: Any, field: str) -> str:
    """``value`` as compact JSON with sorted keys (the one spelling the store writes and hashes)."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field} must be JSON-serialisable: {exc}") from exc


def check_payload(value: Mapping[str, Any] | None, field: str) -> str:
    """A JSON object (``None`` means ``{}``) as canonical JSON text."""
    if value is None:
        return "{}"
    if not isinstance(value, Mapping):
        raise ValueError(f"{field} must be a mapping (JSON object), got {type(value).__name__}")
    if not all(isinstance(key, str) for key in value):
        raise ValueError(f"{field} keys must be strings")
    return canonical_json(dict(value), field)


def check_time(value: object, field: str) -> float:
    """Seconds since the epoch: a finite number >= 0, returned as a float (``-0.0`` -> ``0.0``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field} must be seconds since the epoch (a number), got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{field} must be a finite number of seconds >= 0, got {value!r}")
    return seconds + 0.0


def check_optional_time(value: object, field: str) -> float | None:
    return None if value is None else check_time(value, field)


def check_text(value: object, field: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise ValueError(f"{field} must not be empty")
    return value


def check_name(value: object, field: str) -> str:
    """A lower-case identifier (``running_again``), for things later code looks up by name."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise ValueError(
            f"{field} must be a lower-case name like 'running_again' "
            f"([a-z][a-z0-9_]*, at most 64 characters), got {value!r}"
        )
    return value


def check_int(value: object, field: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{field} must be >= {minimum}, got {value}")
    return value


def check_optional_int(value: object, field: str, *, minimum: int = 0) -> int | None:
    return None if value is None else check_int(value, field, minimum=minimum)


def check_id(value: object, field: str) -> int:
    """A row id (an integer >= 1)."""
    return check_int(value, field, minimum=1)
