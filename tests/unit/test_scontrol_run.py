"""How the scontrol backend runs a Slurm command: real processes (a stand-in ``scontrol`` in
``bin_dir``), output read whole from memory, decoded as ``text=True`` decodes it."""

from __future__ import annotations

import io
import locale
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.scheduler import SchedulerError
from slurm_recovery.scheduler.scontrol import ScontrolScheduler, _text


def stand_in(tmp_path: Path, script: str) -> ScontrolScheduler:
    path = tmp_path / "scontrol"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return ScontrolScheduler(timeout=10, bin_dir=str(tmp_path))


@given(st.binary(max_size=200) | st.text(alphabet="ab\r\n\u00e9", max_size=50).map(str.encode))
def test_output_is_decoded_as_text_mode_decodes_it(output: bytes) -> None:
    wrapper = io.TextIOWrapper(
        io.BytesIO(output), encoding=locale.getpreferredencoding(False), errors="replace"
    )
    assert _text(output) == wrapper.read()


def test_a_large_output_arrives_whole(tmp_path: Path) -> None:
    lines = [f"NodeName=n{i} State=IDLE Reason=x" for i in range(40_000)]  # about 1.4 MB
    (tmp_path / "out.txt").write_bytes("\r\n".join(lines).encode() + b"\r")
    sched = stand_in(tmp_path, f"cat {tmp_path / 'out.txt'}\n")
    assert sched._run(["scontrol", "show", "nodes"]) == "\n".join(lines) + "\n"


def test_a_refusal_says_what_slurm_said(tmp_path: Path) -> None:
    sched = stand_in(
        tmp_path, "echo 'slurm_load_node error: Invalid node name specified' >&2\nexit 1\n"
    )
    with pytest.raises(SchedulerError) as caught:
        sched._run(["scontrol", "show", "node", "nope"])
    assert "Invalid node name specified" in str(caught.value)


def test_a_command_that_hangs_is_unreachable(tmp_path: Path) -> None:
    from slurm_recovery.scheduler import Unreachable

    sched = stand_in(tmp_path, "sleep 30\n")
    sched.timeout = 0.5
    with pytest.raises(Unreachable, match=r"did not finish within 0\.5s"):
        sched._run(["scontrol", "ping"])
