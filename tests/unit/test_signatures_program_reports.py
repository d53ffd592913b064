"""A program's and a submission's own reports: language runtimes' fatal reports and MPI_Abort,
Slurm refusing a submission's options, and the shell's report of a command killed by a
signal.

Lines in the shape the emitter prints them (format strings from its source; hosts, ports, pids
and numbers made up); where a number in the line decides, hypothesis varies it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.signature_verdicts import answer, verdict

# ------------------------------------------------ Slurm refusing a submission's own options


@pytest.mark.parametrize(
    "line",
    [
        # src/common/slurm_opt.c, proc_args.c, parse_value.c, sbatch/opt.c, srun/opt.c
        "sbatch: error: Invalid --time specification",
        "srun: fatal: --mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive.",
        "sbatch: error: invalid number of nodes (-N 0-0)",
        'sbatch: error: "x2" is not a valid node count',
        "srun: error: --exact and --whole are mutually exclusive.",
        "sbatch: error: Invalid directive found in batch script: --gpu",
        "srun: fatal: --gpus-per-node and --gres=gpu are mutually exclusive.",
        "salloc: error: Cannot specify both --bb and --bbf",
    ],
)
def test_a_submission_s_invalid_options_are_its_own(line: str) -> None:
    v = verdict(line, nodes=["n1"])
    assert (v.action, v.fault_domain, v.blame_nodes) == ("stop", "application", [])


@pytest.mark.parametrize(
    ("line", "action"),
    [
        (
            "sbatch: error: There is a problem talking to the database: Connection refused.  "
            "Only local cluster communication is available, remove --cluster or contact your "
            "admin.",
            "requeue",
        ),
        ("srun: error: getcwd failed: Stale file handle", "requeue"),
        (
            "srun: error: Thread value --threads=64 exceeds recommended limit of 60",
            "none",
        ),
    ],
)
def test_a_submit_host_s_trouble_is_restarted_and_a_warning_is_nothing(
    line: str, action: str
) -> None:
    assert answer(line, nodes=["n1"]) == (action, [])


# ------------------------------------------------ the shell's report of a killed command


@settings(max_examples=40, deadline=None)
@given(
    line_no=st.integers(min_value=1, max_value=9999),
    pid=st.integers(min_value=2, max_value=4194304),
    sig=st.sampled_from(
        [
            ("Killed", "", "requeue"),
            ("Segmentation fault", " (core dumped)", "requeue"),
            ("Bus error", " (core dumped)", "requeue"),
            ("Aborted", " (core dumped)", "requeue"),
            ("Floating point exception", "(core dumped)", "stop"),
            ("Illegal instruction", " (core dumped)", "stop"),
            ("CPU time limit exceeded", " (core dumped)", "stop"),
            ("Bad system call", " (core dumped)", "stop"),
            ("Terminated", "", "none"),
            ("User defined signal 1", "", "none"),
            ("Stopped", "", "none"),
        ]
    ),
)
def test_bash_s_report_of_a_command_killed_by_a_signal(
    line_no: int, pid: int, sig: tuple[str, str, str]
) -> None:
    text, core, action = sig
    script = "/var/spool/slurmd/job42/slurm_script"
    line = f"{script}: line {line_no}: {pid:>5} {text:<24}{core} python x.py"
    assert answer(line, nodes=["n1"]) == (action, [])


def test_a_shell_error_that_is_not_a_signal_is_not_read_as_one() -> None:
    assert answer("./run.sh: line 3: cd: /nonexistent: No such file or directory")[0] != "stop"


def test_every_linux_signal_has_a_member() -> None:
    from slurm_recovery.signals.emitters import load_emitter_tables

    table = load_emitter_tables().tables["signal_desc"]
    assert sorted(m.value for m in table.members if m.value is not None) == [*range(1, 32)]


# ------------------------------------------------ language runtimes' fatal reports, MPI_Abort


@pytest.mark.parametrize(
    ("line", "action"),
    [
        ('Exception in thread "main" java.lang.OutOfMemoryError: Java heap space', "stop"),
        ("java.lang.OutOfMemoryError: GC overhead limit exceeded", "stop"),
        ("# A fatal error has been detected by the Java Runtime Environment:", "requeue"),
        ("panic: runtime error: index out of range [3] with length 3", "stop"),
        ("fatal error: all goroutines are asleep - deadlock!", "stop"),
        ("fatal error: runtime: out of memory", "stop"),
        ("thread 'main' panicked at src/main.rs:10:5:", "stop"),
        ("MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD", "requeue"),
        ("application called MPI_Abort(MPI_COMM_WORLD, 1) - process 0", "requeue"),
    ],
)
def test_runtime_fatal_reports(line: str, action: str) -> None:
    assert answer(line, nodes=["n1"]) == (action, [])


def test_a_kernel_panic_is_not_a_go_panic() -> None:
    line = "[   12.345678] Kernel panic - not syncing: Fatal exception"
    assert answer(line, nodes=["n1"]) == ("requeue_exclude", ["n1"])


def test_an_mpi_abort_after_the_cause_leaves_the_cause_the_root() -> None:
    v = verdict(
        "RuntimeError: CUDA error: device-side assert triggered",
        "MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD",
        nodes=["n1"],
    )
    assert v.action == "stop"
    assert v.signatures[0]["id"] == "cuda.device_assert"


# ------------------------------------------------ a launcher's notice that a child ended


@pytest.mark.parametrize(
    "line",
    [
        # Open MPI's help text (help-orterun.txt, help-prterun.txt), as mpirun prints it
        "Primary job  terminated normally, but 1 process returned",
        "mpirun detected that one or more processes exited with non-zero status, thus causing",
        "mpiexec detected that one or more processes exited with non-zero status, thus causing",
        # torch.multiprocessing.spawn's ProcessExitedException
        "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal "
        "SIGKILL",
        "torch.multiprocessing.spawn.ProcessExitedException: process 3 terminated with exit code 1",
    ],
)
def test_a_launcher_s_notice_that_a_child_ended_is_a_symptom(line: str) -> None:
    # before: Open MPI's notices read as nothing (a job left dead), spawn's as the program's own
    # exception (stop); alone they are a failure of unknown cause, restarted once, no node blamed
    v = verdict(line)
    assert (v.action, v.blame_nodes) == ("requeue", [])
    assert v.signatures[0]["id"] in ("mpi.launcher_lost", "launcher.child_exit")


def test_the_child_s_own_error_beside_a_launcher_s_notice_decides() -> None:
    v = verdict(
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "Primary job  terminated normally, but 1 process returned",
        "a non-zero exit code. Per user-direction, the job has been aborted.",
    )
    assert v.signatures[0]["id"] == "cuda.illegal_memory_access"
