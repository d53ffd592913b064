"""Users' text never drives an admin's terminal (issue 16, item 9), and ``srecovery report``
refuses bad input (item 10): the pure pieces and the CLI edge."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.cli import cli
from slurm_recovery.cli.common import PrintableStream, printable, table
from slurm_recovery.contract.wire import WireError
from slurm_recovery.controller.service import check_operator_report
from slurm_recovery.decide.model import ClusterView
from slurm_recovery.store import Evidence

HOSTILE = "CUDA error \x1b]0;pwned\x07 \x1b[2J [bold]big[/bold] \x9b31m"
TERMINAL_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@given(st.text())
def test_printable_leaves_no_control_but_layout(text: str):
    shown = printable(text)
    assert not TERMINAL_CONTROLS.search(shown)
    assert shown.count("\n") == text.count("\n") and shown.count("\t") == text.count("\t")


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cf"))))
def test_printable_keeps_plain_text(text: str):
    assert printable(text) == text


def test_escapes_show_visibly():
    assert printable(HOSTILE) == "CUDA error ^[]0;pwned^G ^[[2J [bold]big[/bold] \\x9b31m"


def test_the_stream_filters_every_write(capsys):
    import sys

    stream = PrintableStream(sys.stdout)
    stream.write(HOSTILE + "\n")
    stream.flush()
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "pwned" in out


def test_a_table_shows_markup_and_escapes_as_text(capsys):
    table(["reason"], [[HOSTILE]])
    out = capsys.readouterr().out
    assert "[bold]big[/bold]" in out
    assert not TERMINAL_CONTROLS.search(out.replace("\n", ""))


def test_report_with_a_blank_reason_exits_2_before_asking_anyone():
    result = CliRunner().invoke(cli, ["report", "n1", "--reason", "  \t "])
    assert result.exit_code == 2, result.output
    assert "--reason is blank" in result.output


def report(node: str | None = "n1", job_id: int | None = None, reason: str = "bad") -> Evidence:
    return Evidence(
        kind="operator_report",
        source="operator",
        observed_at=1.0,
        node=node,
        job_id=job_id,
        payload={"reason": reason},
    )


VIEW = ClusterView(now=1.0, jobs={}, nodes={"n1": object(), "n2": object()})  # type: ignore[dict-item]


def test_the_controller_refuses_an_unknown_node_or_job_or_a_blank_reason():
    check_operator_report([report()], VIEW, lambda job: False)
    check_operator_report([report(job_id=5)], VIEW, lambda job: job == 5)
    with pytest.raises(WireError, match="unknown node 'n9'"):
        check_operator_report([report("n9")], VIEW, lambda job: False)
    with pytest.raises(WireError, match="unknown job 99"):
        check_operator_report([report(job_id=99)], VIEW, lambda job: False)
    with pytest.raises(WireError, match="needs a reason"):
        check_operator_report([report(reason=" ")], None, lambda job: False)
    # Before the first pass has read Slurm, nothing to check a name against: accepted.
    check_operator_report([report("n9")], None, lambda job: False)
