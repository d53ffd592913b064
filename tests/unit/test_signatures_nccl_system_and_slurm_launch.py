"""NCCL's ncclSystemError, a batch job requeued held after its launch failed, and a user
environment Slurm could not read: read from the emitters' sources (NCCL's ncclResult_t text,
Slurm's slurmd and slurmctld).

Lines in the shape the emitter prints them; job ids, node counts, users and hosts made up, and
varied by hypothesis where they vary.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.signature_verdicts import answer, verdict

# ------------------------------------------------------- NCCL's ncclSystemError: no node blamed


@pytest.mark.parametrize(
    "line",
    [
        # getNcclErrorDetailStr's text (PyTorch's NCCLUtils), as it prints it
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
        "device error. ",
        # a reporter's own words around the enum name (github.com/NVIDIA/nccl/issues/697)
        "ncclSystemError: System call (socket, malloc, munmap, etc) failed when training on two "
        "remote nodes",
    ],
)
def test_ncclsystemerror_is_restarted_without_a_node(line: str) -> None:
    # the corpus's development cases behind this enum are launches on the wrong interface and
    # containers that could not reach each other: restarted once, nobody blamed
    assert answer(line) == ("requeue", [])
    assert answer(line, nodes=["n1"]) == ("requeue", [])
    assert verdict(line).cause.startswith("nccl.system_error")


def test_ncclsystemerror_beside_an_xid_leaves_the_xid_to_decide() -> None:
    v = verdict(
        "[ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.",
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
        "device error. ",
        nodes=["n1"],
    )
    assert (v.action, v.blame_nodes) == ("requeue_exclude", ["n1"])


# ------------------------------------ Slurm: a batch job requeued held after its launch failed

JOB_IDS = st.integers(min_value=1, max_value=99_999_999)
NODE_COUNTS = st.integers(min_value=1, max_value=512)
USERS = st.sampled_from(["abc", "jdoe", "mingzeya", "u1234"])


@settings(max_examples=30, deadline=None)
@given(job=JOB_IDS, count=NODE_COUNTS, user=USERS)
def test_a_job_held_after_a_failed_launch_excludes_its_node(
    job: int, count: int, user: str
) -> None:
    # squeue's NODELIST(REASON) column: job_mgr.c sets the job's state_desc to this string when
    # slurmd's _launch_job_fail reports JOB_LAUNCH_FAILED (a Prolog failure, a slurmstepd that
    # could not be started)
    line = (
        f"{job:>18}     batch   job2  {user} PD       0:00 {count:>6} (launch failed requeued held)"
    )
    assert answer(line, nodes=["n1"]) == ("requeue_exclude", ["n1"])
    assert verdict(line).cause.startswith("slurm.launch_failed_held")


def test_the_bare_reason_and_the_repeated_launch_limit_read_the_same() -> None:
    assert answer("(launch failed requeued held)", nodes=["n1"]) == ("requeue_exclude", ["n1"])
    # _handle_requeue_limit(): the job's launches failed more often than MaxBatchRequeue allows
    assert answer("(launch failure limit exceeded requeued held)", nodes=["n1"]) == (
        "requeue_exclude",
        ["n1"],
    )


def test_a_user_environment_that_could_not_be_read_is_not_the_node() -> None:
    # JOB_GETENV_FAILED: --get-user-env timed out or failed; the user's login environment as
    # often as the node, so no node is blamed
    action, blamed = answer("(user env retrieval failed requeued held)", nodes=["n1"])
    assert blamed == []
    assert action != "requeue_exclude"
