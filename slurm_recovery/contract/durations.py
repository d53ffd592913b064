"""Durations as admins write them in our TOML files: ``90`` (seconds), ``"90s"``, ``"5m"``,
``"1h30m"``, ``"500ms"``. One parser for every reader (the config, the policy, the hooks)."""

from __future__ import annotations

import math
import re
from decimal import Decimal

#: Units a duration string may use, in seconds.
DURATION_UNITS: dict[str, Decimal] = {
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
    "d": Decimal(86400),
}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"  # ASCII digits only
_UNIT = "|".join(sorted(DURATION_UNITS, key=len, reverse=True))  # "ms" before "m"
_PLAIN_SECONDS = re.compile(rf"\s*({_NUMBER})\s*")
_DURATION = re.compile(rf"(?:\s*{_NUMBER}\s*(?:{_UNIT}))+\s*")
_DURATION_PART = re.compile(rf"({_NUMBER})\s*({_UNIT})")
DURATION_HINT = (
    'write a number of seconds (90) or a string with a unit ("90s", "5m", "1h30m"; '
    "units: " + ", ".join(DURATION_UNITS) + ")"
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
            total = Decimal(plain.group(1))
        elif _DURATION.fullmatch(value):
            total = sum(
                (Decimal(n) * DURATION_UNITS[u] for n, u in _DURATION_PART.findall(value)),
                Decimal(0),
            )
        else:
            raise ValueError(f"not a duration; {DURATION_HINT}")
        seconds = float(total)  # inf when beyond float range
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative; {DURATION_HINT}")
    if math.isinf(seconds):
        raise ValueError(f"a duration must be finite; {DURATION_HINT}")
    return seconds


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
            count, rest = divmod(rest, int(DURATION_UNITS[unit]))
            if count:
                parts.append(f"{count}{unit}")
        return "".join(parts) or "0s"
    # repr() is the shortest decimal that reads back as the same float; "f" avoids exponents.
    return f"{Decimal(repr(float(seconds))):f}s"
