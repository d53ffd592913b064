"""The watchdog's rule (which held jobs it releases), its spool records, and its error flow.

Slurm itself is exercised in tests/integration/test_watchdog.py; here the shared fake Slurm
(tests/fakeslurm.py) holds the jobs, applies the steps by Slurm's rules and records them.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.holdmark import hold_mark, with_mark
from slurm_recovery.scheduler import InvalidRequest, Job, UnknownJob, Unreachable
from slurm_recovery.watchdog import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    RELEASES_FILE,
    Overdue,
    Release,
    append_release,
    overdue,
    read_releases,
    released_note,
    sweep,
    sweep_result,
    watchdog_command,
)
from tests.fakeslurm import FakeSlurm

NOW = 1_800_000_000.0
PAST = int(NOW) - 30
FUTURE = int(NOW) + 30


def job(job_id: int, *, state="PENDING", held=True, comment="") -> Job:
    return Job(
        job_id=job_id,
        name="train",
        state=state,
        reason="JobHeldUser" if held else "None",
        user="alice",
        partition="gpu",
        nodes=(),
        num_nodes=2,
        submit_time=int(NOW) - 3600,
        restart_count=1,
        held=held,
        admin_comment=comment,
    )


def asked(slurm: FakeSlurm) -> list[tuple[str, int]]:
    """The steps asked of ``slurm``, each with its job id."""
    return [(step, args[0]) for step, args in slurm.steps]  # type: ignore[misc]


class Unanswered(FakeSlurm):
    """slurmctld does not answer the job listing."""

    def list_jobs(self) -> list[Job]:
        raise Unreachable("squeue did not finish within 5s")


# --------------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("case", "the_job", "selected"),
    [
        ("held by us, past deadline", job(1, comment=hold_mark(7, PAST)), True),
        ("mark after the site's text", job(1, comment=with_mark("ops note", 7, PAST)), True),
        ("mark-like site text", job(1, comment=f"ops note; {hold_mark(7, PAST)}"), False),
        ("held by us, before deadline", job(1, comment=hold_mark(7, FUTURE)), False),
        ("deadline is now: not yet past", job(1, comment=hold_mark(7, int(NOW))), False),
        ("held by someone else", job(1, comment=""), False),
        ("someone else's comment", job(1, comment="held for maintenance"), False),
        ("malformed mark", job(1, comment="srecovery:held:7:soon"), False),
        ("marked, not held", job(1, held=False, comment=hold_mark(7, PAST)), False),
        ("marked, running", job(1, state="RUNNING", held=False, comment=hold_mark(7, PAST)), False),
        (
            "marked, held, still completing",
            job(1, state="COMPLETING", comment=hold_mark(7, PAST)),
            False,
        ),
        ("marked, held, cancelled", job(1, state="CANCELLED", comment=hold_mark(7, PAST)), False),
    ],
)
def test_which_jobs_are_overdue(case: str, the_job: Job, selected: bool):
    expected = [Overdue(1, 7, PAST)] if selected else []
    assert overdue([the_job], NOW) == expected, case


def test_a_mark_the_watchdog_released_before_is_not_released_again():
    jobs = [job(1, comment=hold_mark(7, PAST)), job(2, comment=hold_mark(8, PAST))]
    assert overdue(jobs, NOW, released={Overdue(1, 7, PAST)}) == [Overdue(2, 8, PAST)]
    # The same job held again by the tool for a new incident (a new mark) is ours again.
    assert overdue(jobs, NOW, released={Overdue(1, 6, PAST)}) == [
        Overdue(1, 7, PAST),
        Overdue(2, 8, PAST),
    ]


@given(
    st.lists(
        st.builds(
            job,
            st.integers(1, 10**6),
            state=st.sampled_from(["PENDING", "RUNNING", "COMPLETING", "COMPLETED"]),
            held=st.booleans(),
            comment=st.text(max_size=40).filter(lambda c: "srecovery:held:" not in c),
        ),
        max_size=10,
    )
)
def test_a_job_without_the_mark_is_never_released(jobs: list[Job]):
    assert overdue(jobs, NOW) == []


@given(st.integers(0, 2**40), st.integers(0, 2**40), st.floats(0, 2**41))
def test_released_exactly_when_the_deadline_has_passed(incident: int, until: int, now: float):
    found = overdue([job(5, comment=hold_mark(incident, until))], now)
    assert found == ([Overdue(5, incident, until)] if until < now else [])


# --------------------------------------------------------------------------------- the spool


def test_record_format_is_one_json_object_per_line(tmp_path: Path):
    record = Release(ts=NOW + 0.25, job_id=42, incident_id=7, held_until=PAST, watchdog_host="h1")
    append_release(tmp_path / "spool", record)
    append_release(tmp_path / "spool", replace(record, job_id=43))
    lines = (tmp_path / "spool" / RELEASES_FILE).read_text().splitlines()
    assert json.loads(lines[0]) == {
        "ts": NOW + 0.25,
        "job_id": 42,
        "incident_id": 7,
        "held_until": PAST,
        "action": "released",
        "watchdog_host": "h1",
    }
    assert list(json.loads(lines[0])) == [
        "ts",
        "job_id",
        "incident_id",
        "held_until",
        "action",
        "watchdog_host",
    ]
    assert read_releases(tmp_path / "spool") == [record, replace(record, job_id=43)]
    assert read_releases(tmp_path / "nothing yet") == []


def test_a_line_cut_short_by_a_crash_is_skipped_and_not_glued_to(tmp_path: Path, caplog):
    record = Release(ts=NOW, job_id=42, incident_id=7, held_until=PAST, watchdog_host="h1")
    (tmp_path / RELEASES_FILE).write_text(record.to_json()[:25])
    append_release(tmp_path, record)
    assert read_releases(tmp_path) == [record]
    assert f"{RELEASES_FILE}:1: skipped" in caplog.text


@pytest.mark.parametrize(
    "line",
    [
        "[]",
        '{"ts": 1, "job_id": "42", "incident_id": 7, "held_until": 1, "action": "released", '
        '"watchdog_host": "h"}',
        '{"ts": 1, "job_id": 42, "incident_id": 7, "held_until": 1, "action": "held", '
        '"watchdog_host": "h"}',
        '{"ts": "x", "job_id": 42, "incident_id": 7, "held_until": 1, "action": "released", '
        '"watchdog_host": "h"}',
    ],
)
def test_lines_that_are_not_records_are_refused(line: str):
    with pytest.raises(ValueError):
        Release.from_json(line)


# --------------------------------------------------------------------------------- the flow


def test_sweep_sets_begin_now_releases_and_records(tmp_path: Path):
    slurm = FakeSlurm(
        [
            job(1, comment=hold_mark(7, PAST)),
            job(2, comment=hold_mark(8, FUTURE)),
            job(3, comment=""),
        ]
    )
    released = sweep(slurm, now=NOW, spool=tmp_path)
    assert asked(slurm) == [("set_begin_now", 1), ("release", 1), ("set_admin_comment", 1)]
    assert [(r.job_id, r.incident_id, r.held_until) for r in released] == [(1, 7, PAST)]
    assert read_releases(tmp_path) == released
    assert slurm.jobs[1].admin_comment == f"[{released_note(released[0])}]"  # the mark replaced
    assert "srecovery: released by the watchdog on" in released_note(released[0])
    # Level-triggered: the released job is no longer held, so a second sweep does nothing.
    assert sweep(slurm, now=NOW + 10, spool=tmp_path) == []
    assert len(slurm.steps) == 3


def test_the_mark_is_replaced_only_after_the_release(tmp_path: Path):
    slurm = FakeSlurm(
        [job(1, comment=hold_mark(7, PAST)), job(2, comment=hold_mark(8, PAST))],
        refuse={
            ("release", 1): InvalidRequest("refused"),
            ("set_admin_comment", 2): InvalidRequest("no"),
        },
    )
    result = sweep_result(slurm, now=NOW, spool=tmp_path)
    # A job still held keeps its mark, so the next sweep finds it again.
    assert ("set_admin_comment", 1) not in asked(slurm)
    assert slurm.jobs[1].admin_comment == hold_mark(7, PAST)
    # A mark left on a released job (the comment refused) is not a failure: the spool
    # remembers the release, so it is never released twice.
    assert [r.job_id for r in result.released] == [2]
    assert result.problems == ["job 1: release refused: refused"]
    slurm.jobs[2] = replace(slurm.jobs[2], held=True)  # someone else holds it later
    assert sweep(slurm, now=NOW + 10, spool=tmp_path) == []
    assert asked(slurm).count(("release", 2)) == 1


def test_a_refusal_on_one_job_does_not_stop_the_others(tmp_path: Path):
    slurm = FakeSlurm(
        [
            job(1, comment=hold_mark(7, PAST)),
            job(2, comment=hold_mark(8, PAST)),
            job(3, comment=hold_mark(9, PAST)),
        ],
        refuse={
            ("release", 1): InvalidRequest("refused"),
            ("set_begin_now", 2): InvalidRequest("not pending"),
            ("set_begin_now", 3): UnknownJob("gone"),
        },
    )
    result = sweep_result(slurm, now=NOW, spool=tmp_path, host="h1")
    assert [r.job_id for r in result.released] == [2]  # released even without begin time now
    assert ("release", 3) not in asked(slurm)  # a job that is gone needs nothing
    assert result.problems == ["job 1: release refused: refused"]
    assert result.exit_code == EXIT_FAILED


def test_slurm_unreachable_ends_the_sweep_without_raising(tmp_path: Path):
    slurm = Unanswered([job(1, comment=hold_mark(7, PAST))])
    result = sweep_result(slurm, now=NOW, spool=tmp_path)
    assert (result.released, result.unreachable, result.exit_code) == ([], True, EXIT_UNREACHABLE)

    slurm = FakeSlurm(
        [job(1, comment=hold_mark(7, PAST)), job(2, comment=hold_mark(8, PAST))],
        refuse={("set_begin_now", 2): Unreachable("gone away")},
    )
    result = sweep_result(slurm, now=NOW, spool=tmp_path)
    assert [r.job_id for r in result.released] == [1]
    assert result.unreachable
    assert ("release", 2) not in asked(slurm)


def test_a_record_that_cannot_be_written_is_logged_whole(tmp_path: Path, caplog):
    (tmp_path / "file").write_text("")
    slurm = FakeSlurm([job(1, comment=hold_mark(7, PAST))])
    result = sweep_result(slurm, now=NOW, spool=tmp_path / "file" / "spool", host="h1")
    assert [r.job_id for r in result.released] == [1]  # released all the same: fail open
    assert result.exit_code == EXIT_FAILED
    assert '"job_id": 1, "incident_id": 7' in caplog.text


def test_nothing_overdue_is_exit_ok(tmp_path: Path):
    result = sweep_result(FakeSlurm([job(1, comment="")]), now=NOW, spool=tmp_path)
    assert (result.released, result.exit_code) == ([], EXIT_OK)
    assert not (tmp_path / RELEASES_FILE).exists()


# --------------------------------------------------------------------------------- the command


@pytest.mark.parametrize("interval", ["0", "-1", "soon", "5 parsecs"])
def test_a_bad_interval_is_a_usage_error(interval: str):
    result = CliRunner().invoke(watchdog_command, ["--once", "--interval", interval])
    assert result.exit_code == EXIT_USAGE
    assert "--interval" in result.output


def test_an_invalid_config_is_exit_2_naming_the_key(tmp_path: Path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('[watchdog]\ninterval = "often"\n')
    result = CliRunner().invoke(watchdog_command, ["--once"], obj={"config_path": str(cfg)})
    assert result.exit_code == EXIT_USAGE
    assert "watchdog.interval" in result.output
