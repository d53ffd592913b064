"""The tool's part of a job's AdminComment: its hold mark or its note, beside the site's text.

Sites keep their own text in AdminComment (``billing=projX;ticket=INC-4711``), so the tool
never replaces the whole comment: it appends one tagged segment, ``[srecovery:...]``, at the end
and only ever rewrites or removes that segment. Two kinds of tool text go there:

- the **hold mark** ``srecovery:held:<incident>:<until>``, written before ``requeue_hold``, so
  the watchdog can find the jobs the tool holds (and only those) without the controller or its
  database, and release any held past ``until`` (epoch seconds);
- a **note** for admins (``srecovery: requeued after incident 7, excluding n2``), which replaces
  the mark once the job is released or cancelled.

Only the segment at the very end counts, so a site comment that merely mentions ``srecovery``
is never read as a mark. Before this format the tool wrote its text as the whole comment; such a
comment (``srecovery:held:N:T`` alone, or a whole comment starting ``srecovery: `` or
``slurm-recovery: ``) is still read as the tool's, so an upgrade in the middle of a hold works.

The whole comment stays within what Slurm stores (:data:`SLURM_MAX`): the site's text is kept
intact and the note is shortened instead. Pure: no I/O.
"""

from __future__ import annotations

import re

#: Longest AdminComment (UTF-8 bytes) the tool lets the whole reach: slurmctld takes any length
#: on update (100,000 characters kept on 22.05 and 24.11), but slurmdbd stores it in a MySQL
#: ``text`` column (65,535 bytes), so a longer one would be cut in accounting.
SLURM_MAX = 65535
#: Longest tool text (mark or note) the tool writes, before the site's text makes it shorter.
MAX_TOOL_TEXT = 200
#: How the tool's notes on a job it cancelled start (``scheduler.base.admin_comment_for``).
CANCEL_NOTE = "srecovery: cancelled: "

_OPEN, _CLOSE = "[", "]"
_MARK = re.compile(r"srecovery:held:(\d+):(\d+)")
_REQUEUED = re.compile(r"srecovery: requeued after incident (\d+)\b")
#: The tool's segment: at the very end, after the site's text and one space (or alone).
_SEGMENT = re.compile(r"(?:^| )\[(srecovery:[^\[\]]*)\]\Z")
#: Whole comments written by releases before the segment: the tool's text alone.
_LEGACY = re.compile(r"srecovery:held:\d+:\d+|srecovery: .*|slurm-recovery: .*", re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


class CommentFull(ValueError):
    """The site's text leaves no room for the hold mark within Slurm's limit."""


def hold_mark(incident_id: int, until: float) -> str:
    return f"srecovery:held:{int(incident_id)}:{int(until)}"


def split(comment: str) -> tuple[str, str]:
    """``(site_text, tool_text)`` of an AdminComment; either may be empty."""
    comment = comment or ""
    found = _SEGMENT.search(comment)
    if found:
        return comment[: found.start()], found[1]
    if _LEGACY.fullmatch(comment):
        return "", comment
    return comment, ""


def tool_text(comment: str) -> str:
    """The tool's mark or note in ``comment`` ("" when it has none)."""
    return split(comment)[1]


def without_tool_text(comment: str) -> str:
    """Only the site's text, as the site wrote it."""
    return split(comment)[0]


def _clean(text: str) -> str:
    """One line, without the brackets that delimit the segment, starting with the tag."""
    text = " ".join(_CONTROL.sub(" ", text).split())
    text = text.replace(_OPEN, "(").replace(_CLOSE, ")")
    return text if text.startswith("srecovery:") else f"srecovery: {text}"


def _combine(site: str, tool: str) -> str:
    return f"{site} {_OPEN}{tool}{_CLOSE}" if site else f"{_OPEN}{tool}{_CLOSE}"


def _room(site: str) -> int:
    """Bytes left for the tool text once the site's text, a space and brackets are in."""
    return max(0, min(MAX_TOOL_TEXT, SLURM_MAX - len(site.encode()) - (3 if site else 2)))


def _shortened(text: str, size: int) -> str:
    """``text`` cut to at most ``size`` UTF-8 bytes, never inside a character."""
    return text.encode()[:size].decode(errors="ignore").rstrip()


def with_note(comment: str, note: str) -> str:
    """The site's text kept, the tool's part replaced by ``note`` (shortened to fit Slurm's
    limit; the site's text alone when nothing of it fits)."""
    site = without_tool_text(comment)
    text = _shortened(_clean(note), _room(site))
    if len(text) <= len("srecovery:"):
        return site
    return _combine(site, text)


def with_mark(comment: str, incident_id: int, until: float) -> str:
    """The site's text kept, any previous tool part replaced by the hold mark. Raises
    :class:`CommentFull` when the mark does not fit: holding a job the watchdog cannot find
    would be worse than not holding it."""
    site = without_tool_text(comment)
    mark = hold_mark(incident_id, until)
    if len(mark) > _room(site):
        raise CommentFull(
            f"the job's AdminComment ({len(site.encode())} bytes) leaves no room for the hold "
            f"mark within the {SLURM_MAX} bytes Slurm stores"
        )
    return _combine(site, mark)


def parse_hold_mark(comment: str) -> tuple[int, int] | None:
    """``(incident_id, until)`` when the tool's part of ``comment`` is the hold mark, else None
    (a mark-like text in the site's part is not the tool's)."""
    match = _MARK.fullmatch(tool_text(comment))
    return (int(match[1]), int(match[2])) if match else None


def requeued_by_tool(comment: str) -> bool:
    """The tool holds the job (its mark) or requeued it (its ``requeued`` note)."""
    text = tool_text(comment)
    return parse_hold_mark(comment) is not None or text.startswith("srecovery: requeued")


def requeue_incident(comment: str) -> int | None:
    """The incident whose restart the job is in (its hold mark or its ``requeued`` note)."""
    mark = parse_hold_mark(comment)
    if mark is not None:
        return mark[0]
    found = _REQUEUED.match(tool_text(comment))
    return int(found.group(1)) if found else None


def cancelled_by_tool(comment: str) -> bool:
    """The tool's note says it cancelled the job (or the older ``slurm-recovery:`` note)."""
    text = tool_text(comment)
    return text.startswith(CANCEL_NOTE) or text.startswith("slurm-recovery: ")
