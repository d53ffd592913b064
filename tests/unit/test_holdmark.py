"""The tool's part of AdminComment (slurm_recovery.holdmark): the site's text is never lost,
the tool's part round-trips, rewriting it is idempotent, and the whole fits Slurm's limit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.holdmark import (
    MAX_TOOL_TEXT,
    SLURM_MAX,
    CommentFull,
    cancelled_by_tool,
    hold_mark,
    parse_hold_mark,
    requeued_by_tool,
    split,
    tool_text,
    with_mark,
    with_note,
    without_tool_text,
)

SITE = "billing=projX;ticket=INC-4711"

#: Site text as sites write it, "srecovery" and brackets included; a text that already ends in
#: the tool's segment (or is a whole comment of the older format) is the tool's by definition.
site_texts = st.one_of(
    st.text(max_size=300),
    st.text(alphabet="srecovy:held[] 0123456789;=", max_size=60),
    st.sampled_from([SITE, "srecovery:held:1:2 ops", "see [srecovery] docs", "x [srecovery:"]),
).filter(lambda site: split(site) == (site, ""))
notes = st.text(max_size=400)
incidents = st.integers(min_value=0, max_value=10**9)
untils = st.integers(min_value=0, max_value=4 * 10**9)


@given(site_texts, incidents, untils)
def test_a_mark_keeps_the_site_text_and_round_trips(site: str, incident: int, until: int):
    marked = with_mark(site, incident, until)
    assert without_tool_text(marked) == site
    assert parse_hold_mark(marked) == (incident, until)
    assert with_mark(marked, incident, until) == marked
    assert len(marked.encode()) <= SLURM_MAX


@given(site_texts, notes, incidents, untils)
def test_a_note_replaces_the_mark_and_keeps_the_site_text(site, note, incident, until):
    noted = with_note(with_mark(site, incident, until), note)
    assert without_tool_text(noted) == site
    assert parse_hold_mark(noted) is None or note.strip().startswith("srecovery:held:")
    assert with_note(noted, note) == noted
    assert len(noted.encode()) <= SLURM_MAX
    assert len(tool_text(noted).encode()) <= MAX_TOOL_TEXT
    assert without_tool_text(with_note(noted, "")) == site


@given(site_texts)
def test_a_site_text_alone_has_no_tool_part(site: str):
    assert parse_hold_mark(site) is None
    assert without_tool_text(site) == site


def test_the_example_from_the_issue():
    marked = with_mark(SITE, 7, 1795960000)
    assert marked == f"{SITE} [srecovery:held:7:1795960000]"
    noted = with_note(marked, "srecovery: requeued after incident 7, excluding n2")
    assert noted == f"{SITE} [srecovery: requeued after incident 7, excluding n2]"
    assert requeued_by_tool(noted) and not cancelled_by_tool(noted)
    assert without_tool_text(noted) == SITE


@pytest.mark.parametrize(
    "old",
    [
        "srecovery:held:7:1795960000",
        "srecovery: requeued after incident 7, excluding n2",
        "slurm-recovery: application fault: CUDA OOM",
        "srecovery: released by the watchdog on head at 2026-11-29T10:00:00Z",
    ],
)
def test_a_whole_comment_of_the_older_format_is_the_tools(old: str):
    """An upgrade in the middle of a hold: the old mark is still found, and replaced."""
    assert without_tool_text(old) == ""
    assert with_note(old, "srecovery: requeued after incident 7") == (
        "[srecovery: requeued after incident 7]"
    )


def test_an_old_mark_is_still_found():
    assert parse_hold_mark("srecovery:held:7:1795960000") == (7, 1795960000)
    assert cancelled_by_tool("slurm-recovery: xid 13: stop")


def test_mark_like_site_text_is_not_a_mark():
    assert parse_hold_mark(f"ops note; {hold_mark(7, 100)}") is None
    assert parse_hold_mark(f"{hold_mark(7, 100)} for INC-4711") is None
    assert not requeued_by_tool(f"ops note; {hold_mark(7, 100)}")


def test_the_note_is_shortened_never_the_site_text():
    site = "x" * (SLURM_MAX - 50)
    noted = with_note(site, "srecovery: " + "long words " * 50)
    assert noted.startswith(site + " [srecovery: long")
    assert SLURM_MAX - 5 <= len(noted) <= SLURM_MAX
    assert with_note("y" * SLURM_MAX, "srecovery: note") == "y" * SLURM_MAX


def test_the_bound_counts_bytes_and_never_splits_a_character():
    site = "é" * ((SLURM_MAX - 30) // 2)
    noted = with_note(site, "srecovery: " + "ü" * 100)
    assert len(noted.encode()) <= SLURM_MAX and without_tool_text(noted) == site


def test_no_room_for_the_mark_refuses():
    with pytest.raises(CommentFull):
        with_mark("z" * (SLURM_MAX - 10), 7, 1795960000)


def test_control_characters_and_brackets_in_a_note_cannot_break_the_segment():
    noted = with_note(SITE, "srecovery: reason [bold]\x1b[2J\nnext]")
    assert noted == f"{SITE} [srecovery: reason (bold) (2J next)]"
    assert without_tool_text(noted) == SITE
