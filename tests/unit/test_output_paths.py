"""Slurm output file patterns -> the batch step's stdout path."""

from __future__ import annotations

from pathlib import PurePosixPath

from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.contract.outputs import expand_output_path, normal_path


def test_patterns_of_sbatch_man_page():
    common = dict(job_id=4242, name="train", user="alice", workdir="/home/alice", batch_host="n7")
    assert expand_output_path("out-%j.log", **common) == "/home/alice/out-4242.log"
    assert expand_output_path("/scratch/%u/%x-%j.out", **common) == (
        "/scratch/alice/train-4242.out"
    )
    assert expand_output_path("%N-%n-%t-%s-%%.out", **common) == "/home/alice/n7-0-0-batch-%.out"
    assert expand_output_path("%8j.out", **common) == "/home/alice/00004242.out"
    assert expand_output_path("", **common) == "/home/alice/slurm-4242.out"
    assert expand_output_path("lit\\%j.out", **common) == "/home/alice/lit%j.out"


def test_array_jobs():
    kw = dict(job_id=101, workdir="/w", array_job_id=100, array_task_id=7)
    assert expand_output_path("", **kw) == "/w/slurm-100_7.out"
    assert expand_output_path("%A-%a-%b-%j.out", **kw) == "/w/100-7-7-101.out"


def test_relative_path_without_workdir_is_unknown():
    assert expand_output_path("out.log", job_id=1) is None
    assert expand_output_path("/abs/out.log", job_id=1) == "/abs/out.log"


_SAFE = st.text(st.characters(codec="ascii", exclude_characters="%\\\x00/"), max_size=20)


@given(prefix=_SAFE, suffix=_SAFE, job_id=st.integers(1, 2**31))
def test_job_id_lands_where_the_pattern_says(prefix, suffix, job_id):
    path = expand_output_path(f"/o/{prefix}%j{suffix}", job_id=job_id)
    assert path is not None
    assert path.startswith("/o/")
    assert f"{prefix}{job_id}{suffix}" in path


_VALUES = {
    "%j": "77",
    "%J": "77",
    "%x": "name",
    "%u": "user",
    "%N": "n3",
    "%n": "0",
    "%t": "0",
    "%s": "batch",
    "%%": "%",
    "%A": "77",
}


@given(st.lists(st.one_of(_SAFE, st.sampled_from(sorted(_VALUES))), max_size=8))
def test_pattern_pieces_expand_one_by_one(pieces):
    """Any mix of literal text and codes expands to the pieces' values, in order."""
    pattern = "/o/" + "".join(pieces)
    expected = "/o/" + "".join(_VALUES.get(p, p) for p in pieces)
    got = expand_output_path(pattern, job_id=77, name="name", user="user", batch_host="n3")
    # pathlib normalises repeated and trailing slashes, as the kernel would
    assert got == str(PurePosixPath(expected))


@given(st.text(st.sampled_from("/.ab"), max_size=12))
def test_paths_are_written_as_pathlib_writes_them(path):
    assert normal_path(path) == str(PurePosixPath(path))
