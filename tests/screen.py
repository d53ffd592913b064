"""Reading a terminal frame of ``srecovery console`` the way a person does: by panel title,
then row by row, cell by cell (cells are two or more spaces apart)."""

from __future__ import annotations

import re


def panel(lines: list[str], title: str) -> list[str]:
    """The inner lines (right-stripped) of the box whose top border starts with ``title``;
    AssertionError, with the screen, when there is none."""
    for row, line in enumerate(lines):
        at = line.find(f"─ {title}")
        if at < 0:
            continue
        left = line.rfind("╭", 0, at)
        right = line.find("╮", at)
        assert left >= 0 and right > at, f"panel {title!r}: top border broken: {line!r}"
        inner = []
        for below in lines[row + 1 :]:
            if len(below) > left and below[left] == "╰":
                return inner
            assert below[left] == "│" and below[right] == "│", (
                f"panel {title!r}: side border broken: {below!r}"
            )
            inner.append(below[left + 1 : right].rstrip())
        raise AssertionError(f"panel {title!r} has no bottom border:\n" + "\n".join(lines))
    raise AssertionError(f"no panel {title!r} on screen:\n" + "\n".join(lines))


def cells(line: str) -> list[str]:
    return [c for c in re.split(r"\s{2,}", line.strip()) if c]


def row(lines: list[str], *first: str) -> list[str]:
    """The cells of the first line in ``lines`` whose leading cells are ``first``."""
    for line in lines:
        found = cells(line)
        if found[: len(first)] == list(first):
            return found
    raise AssertionError(f"no row starting {first!r} in:\n" + "\n".join(lines))


def title(lines: list[str], start: str) -> str:
    """The whole title of the panel whose title starts with ``start``."""
    for line in lines:
        match = re.search(r"─ (" + re.escape(start) + r"[^─]*?) ─", line)
        if match:
            return match.group(1)
    raise AssertionError(f"no panel titled {start!r}")
