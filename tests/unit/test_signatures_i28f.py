"""Issue 28 (i28f): message families read from their emitters' sources, by what each means.

Lines in the shape the emitter prints them (format strings from its source; hosts, pids and
numbers made up); where a number in the line decides, hypothesis varies it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.signals.logs import LogVerdict, classify, scan


def verdict(*lines: str, nodes: list[str] | None = None) -> LogVerdict:
    return classify(scan(list(lines)), nodes=nodes)


def ids(v: LogVerdict) -> list[str]:
    return [s["id"] for s in v.signatures]


@settings(max_examples=30, deadline=None)
@given(pid=st.integers(1, 4_194_304))
def test_a_dataloader_worker_killed_by_sigbus_is_its_shared_memory(pid: int) -> None:
    # torch/csrc/DataLoader.cpp: a worker killed by SIGBUS gets PyTorch's own hint that the
    # workers ran out of shared memory: the job's /dev/shm or its workers' use, not a node
    line = (
        f"RuntimeError: DataLoader worker (pid {pid}) is killed by signal: Bus error. It is "
        "possible that dataloader's workers are out of shared memory. Please try to raise "
        "your shared memory limit."
    )
    v = verdict(line, nodes=["n1"])
    assert (v.action, v.fault_domain, v.blame_nodes) == ("stop", "application", [])
    # a plain bus error says nothing of shared memory: restarted once, as before
    plain = verdict("srun: error: gpu07: task 3: Bus error", nodes=["n1"])
    assert plain.action == "requeue" and plain.blame_nodes == []


@settings(max_examples=30, deadline=None)
@given(
    program=st.sampled_from(["srun", "sbatch", "salloc", "slurmstepd", "slurmd"]),
    words=st.text(alphabet="abcdefghijklmnopqrstuvwxyz -/", min_size=3, max_size=60).filter(
        lambda w: w.strip() and "warn" not in w and "retrying" not in w and "no error" not in w
    ),
)
def test_a_slurm_program_s_fatal_line_is_a_failure_of_unknown_cause(
    program: str, words: str
) -> None:
    # src/common/log.c: fatal() logs "<program>: fatal: ..." and exits the program; a form
    # Slurm's tables do not list is a failure all the same (restarted once), never "none"
    v = verdict(f"{program}: fatal: {words.strip()}", nodes=["n1"])
    assert (v.action, v.blame_nodes) == ("requeue", [])
    daemon = verdict(f"[2026-12-01T10:00:00.123] fatal: {words.strip()}", nodes=["n1"])
    assert (daemon.action, daemon.blame_nodes) == ("requeue", [])
    # Slurm ending the job on purpose still needs nothing
    ended = verdict(
        "slurmstepd: error: *** JOB 12 ON gpu07 CANCELLED AT 2026-12-01T10:00:00 "
        "DUE TO TIME LIMIT ***",
        f"{program}: fatal: {words.strip()}",
        nodes=["n1"],
    )
    assert ended.action == "none"
