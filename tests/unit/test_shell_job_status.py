"""The shell's own notice of a killed command (``shell.job_status``): bash prints the signal's
text alone for a foreground command (``Killed``) and ``[1]+  Killed  python train.py`` for a
job. Read as the signal (emitters/signal_desc.toml) only when the line is the text alone: a line
that merely begins with a signal's text is not the shell's notice (``whole_text``)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.signals.emitters import load_emitter_tables
from slurm_recovery.signals.logs import (
    SignatureError,
    classify,
    default_catalogue,
    signatures_from_toml,
)
from tests.unit.test_signatures import _entry

CATALOGUE = default_catalogue()
SIGNALS = load_emitter_tables().tables["signal_desc"]
#: the signals whose report asks something: the entry's keywords
ASKING = [m for m in SIGNALS.members if m.action != "none" and "%" not in m.message]
#: read by entries before this one, as their own (both agree with the table's action)
EARLIER = {
    "SIGSEGV": "process.segfault",
    "SIGBUS": "process.segfault",
    "SIGILL": "process.illegal_instruction",
}


def read(text: str):
    """The verdict on ``text``'s lines, as explain-log gives it."""
    return classify(CATALOGUE.scan(text.splitlines()))


def test_its_keywords_are_every_asking_signals_text() -> None:
    signature = CATALOGUE.get("shell.job_status")
    assert signature is not None and signature.whole_text
    assert set(signature.keywords) == {m.message for m in ASKING}


@given(
    st.sampled_from(ASKING),
    st.sampled_from(["", "[1]+  ", "[12]- ", "[3]   "]),
    st.sampled_from(["", " (core dumped)"]),
    st.sampled_from(["", "  python train.py", "                 ./a.out --steps 10"]),
)
def test_the_text_alone_gets_its_signals_action(member, job: str, core: str, command: str):
    line = f"{job}{member.message}{core}{command}"
    verdict = read(line)
    assert verdict.action == member.action, (line, verdict)
    assert verdict.signatures[0]["id"] in ("shell.job_status", EARLIER.get(member.name))
    assert bool(verdict.blame_nodes) == member.blame_node  # SIGPWR: the log's own node


@pytest.mark.parametrize(
    "line",
    [
        "Floating point exception handling enabled",  # begins with SIGFPE's text
        "Killed process 1234 (python) total-vm:100kB",
        "Hangup detected on controlling terminal, restarting",
        "Quit after 3 retries",
        "Terminated",  # SIGTERM: how Slurm ends a job it cancels; asks nothing
        "[1]+  Stopped                 python train.py",  # job control
        "User defined signal 1",
    ],
)
def test_a_line_that_is_not_the_notice_of_an_asking_signal_is_not_one(line: str) -> None:
    assert all(s["id"] != "shell.job_status" for s in read(line).signatures)


def test_whole_text_names_only_a_members_message() -> None:
    tables = load_emitter_tables()
    assert tables.lookup_text(["signal_desc"], " killed ").name == "SIGKILL"
    assert tables.lookup_text(["signal_desc"], "Killed by a user") is None
    assert tables.lookup(["signal_desc"], "Floating point exception handling") is not None
    assert tables.lookup_text(["signal_desc"], "Floating point exception handling") is None
    assert tables.lookup_text(["signal_desc"], "SIGKILL") is None  # a name is not its text


def test_whole_text_without_tables_is_refused() -> None:
    entry = _entry("x.alone", "whole_text = true\n")
    with pytest.raises(SignatureError, match="whole_text: only with tables"):
        signatures_from_toml(entry, "test.toml")


@pytest.mark.skipif(shutil.which("dash") is None, reason="dash is Debian's /bin/sh; not here")
def test_debians_sh_running_a_batch_script_prints_the_notice_it_is_read_from(tmp_path):
    """The emitter itself: dash, Debian's and Ubuntu's /bin/sh, running a ``#!/bin/sh`` batch
    script whose step the kernel kills prints the signal's text alone on its stderr (as bash
    does only interactively); that output, as the job's log holds it, is read as the kill."""
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\n"
        "echo step 10\n"
        "python3 -c 'import os, signal; os.kill(os.getpid(), signal.SIGKILL)'\n"
        "exit 137\n"
    )
    ran = subprocess.run(["dash", str(script)], capture_output=True, text=True, timeout=30)
    assert ran.returncode == 137 and "Killed" in ran.stderr.splitlines(), ran.stderr
    verdict = read(ran.stdout + ran.stderr)
    assert verdict.action == "requeue" and verdict.signatures[0]["id"] == "shell.job_status"
