"""Durations as admins write them in our TOML files: ``90`` (seconds), ``"90s"``, ``"5m"``,
``"1h30m"``, ``"500ms"``. One parser for every reader (the config, the policy, the hooks)."""

from __future__ import annotations

import math
import re

#: Units a duration string may use, in milliseconds: whole numbers, so that durations add up
#: exactly without the decimal module (the hooks parse durations and pay for every import).
UNIT_MS: dict[str, int] = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"  # ASCII digits only
_UNIT = "|".join(sorted(UNIT_MS, key=len, reverse=True))  # "ms" before "m"
_PLAIN_SECONDS = re.compile(rf"\s*({_NUMBER})\s*")
_DURATION = re.compile(rf"(?:\s*{_NUMBER}\s*(?:{_UNIT}))+\s*")
_DURATION_PART = re.compile(rf"({_NUMBER})\s*({_UNIT})")
DURATION_HINT = (
    'write a number of seconds (90) or a string with a unit ("90s", "5m", "1h30m"; '
    "units: " + ", ".join(UNIT_MS) + ")"
)


def parse_duration(value: object) -> float:
    """Seconds in ``value``: a number of seconds, or a string like ``"90s"``, ``"5m"``, ``"1h30m"``.

    Raises :class:`ValueError` saying how to write a duration for anything else (negative,
    infinite, not a number, unknown unit).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"must be a duration, not {type(value).__name__}; {DURATION_HINT}")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond float range
            seconds = math.inf if value > 0 else -math.inf
        if math.isnan(seconds):
            raise ValueError(f"must be a number of seconds, not nan; {DURATION_HINT}")
    else:
        plain = _PLAIN_SECONDS.fullmatch(value)
        if plain:
            parts = [(plain.group(1), "s")]
        elif _DURATION.fullmatch(value):
            parts = _DURATION_PART.findall(value)
        else:
            raise ValueError(f"not a duration; {DURATION_HINT}")
        seconds = _exact_seconds(parts)
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative; {DURATION_HINT}")
    if math.isinf(seconds):
        raise ValueError(f"a duration must be finite; {DURATION_HINT}")
    return seconds


def _exact_seconds(parts: list[tuple[str, str]]) -> float:
    """``[("1.5", "h"), ("30", "s")]`` -> 5430.0: summed as whole numbers over one
    denominator, then divided once (Python rounds an int division correctly); inf when the
    sum is beyond a float."""
    scale = max(len(number.partition(".")[2]) for number, _ in parts)
    total = 0
    for number, unit in parts:
        whole, _, fraction = number.partition(".")
        digits = int((whole or "0") + fraction.ljust(scale, "0"))
        total += digits * UNIT_MS[unit]
    try:
        return total / (10**scale * 1000)
    except OverflowError:
        return math.inf


def format_duration(seconds: float) -> str:
    """The shortest usual spelling of ``seconds`` (``5400`` -> ``"1h30m"``, ``1.5`` -> ``"1.5s"``).

    ``parse_duration(format_duration(x)) == x`` for every finite ``x >= 0``.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"not a number of seconds: {seconds!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"not a finite, non-negative number of seconds: {seconds!r}")
    if seconds == int(seconds) and seconds < 2**53:
        rest = int(seconds)
        parts = []
        for unit in ("d", "h", "m", "s"):
            count, rest = divmod(rest, UNIT_MS[unit] // 1000)
            if count:
                parts.append(f"{count}{unit}")
        return "".join(parts) or "0s"
    from decimal import Decimal  # only here: the hooks never format a duration

    # repr() is the shortest decimal that reads back as the same float; "f" avoids exponents.
    return f"{Decimal(repr(float(seconds))):f}s"
