"""Issue 28: Slurm's own messages, GPU tools' outputs and PyTorch's rendezvous timeouts, held to
what their emitters mean (format strings from each emitter's source; hosts and numbers made up).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.signals.emitters import load_emitter_tables
from slurm_recovery.signals.logs import LogVerdict
from tests.unit.signature_verdicts import verdict


def outcome(v: LogVerdict) -> tuple[str, str, list[str]]:
    return (v.action, v.fault_domain, v.blame_nodes)


# ---------------------------------------------------------------- the tables' lookup


def test_a_libc_error_text_is_not_the_first_words_of_a_longer_slurm_message() -> None:
    # Slurm prints strerror() for a libc errno (%m): "Operation not permitted" (EPERM) is not
    # ESLURM_NOT_WHOLE_HET_JOB's "Operation not permitted on individual component of
    # heterogeneous job"; a message cut short by a capture's limit still names its member
    tables = load_emitter_tables()
    slurm = ["slurm_errno", "slurm_daemons"]
    found = tables.lookup(slurm, "setrlimit failed: Operation not permitted")
    assert found is None or found.name != "ESLURM_NOT_WHOLE_HET_JOB"
    cut = tables.lookup(slurm, "srun: error: Unable to allocate resources: Requested node config")
    assert cut is not None and cut.name == "ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE"
    hinted = tables.lookup(["nccl_result"], "NCCL error: unhandled cuda error")
    assert hinted is not None and hinted.name == "ncclUnhandledCudaError"


# ---------------------------------------------------------------- Slurm


@settings(max_examples=30, deadline=None)
@given(
    limit=st.sampled_from(["RLIMIT_NOFILE", "RLIMIT_MEMLOCK", "RLIMIT_STACK", "RLIMIT_CORE"]),
    value=st.one_of(st.integers(1, 2**40).map(str), st.just("'unlimited'")),
)
def test_slurm_s_warnings_in_job_output_are_no_failure(limit: str, value: str) -> None:
    # slurmstepd/ulimits.c: the limit is not applied and the tasks start; acct_gather_energy: one
    # sample missed; slurmstepd/task.c: TMPDIR falls back to /tmp
    for line in (
        f"slurmstepd: error: Can't propagate {limit} of {value} from submit host: "
        "Operation not permitted",
        "slurmstepd: error: _get_joules_task: can't get info from slurmd",
        "slurmstepd: error: TMPDIR [/local/scratch] is not writeable",
    ):
        assert outcome(verdict(line)) == ("none", "unknown", [])


def test_a_submission_slurm_refuses_is_stopped() -> None:
    for lines in (
        ("sbatch: error: Batch script contains DOS line breaks (\\r\\n)",),
        (
            "sbatch: error: This does not look like a batch script.  The first",
            "sbatch: error: line must start with #! followed by the path to an interpreter.",
        ),
        ("srun: error: CPU binding outside of job step allocation, allocated CPUs are: 0x3.",),
        ("srun: error: Requested nodelist gpu[01-04] overlaps with excluded gpu03.",),
    ):
        assert outcome(verdict(*lines)) == ("stop", "application", [])


@pytest.mark.parametrize(
    "line",
    [
        "slurmstepd: error: cgroup namespace 'freezer' not mounted. aborting",
        "slurmstepd: error: Unable to destroy container 4242 in pgid plugin, giving up after "
        "128 sec",
        "slurmd: error: MIG mode is enabled, but no MIG devices were found. Please either create "
        "MIG instances, disable MIG mode, remove AutoDetect=nvml, or remove GPUs from the "
        "configuration completely.",
    ],
)
def test_a_node_s_own_setup_or_stuck_processes_blame_that_node(line: str) -> None:
    assert outcome(verdict(line, nodes=["gpu07"])) == ("requeue_exclude", "system", ["gpu07"])


def test_a_node_slurm_cannot_address_is_restarted_without_blame() -> None:
    v = verdict("srun: error: fwd_tree_thread: can't find address for host gpu07, check slurm.conf")
    assert outcome(v) == ("requeue", "system", [])


# ---------------------------------------------------------------- GPU tools


@pytest.mark.parametrize(
    ("row", "blamed"),
    [
        ("1, Reset", True),
        ("3, 00000000:41:00.0, Reboot", True),
        ("0, Drain and Reset", True),
        ("0, None", False),
    ],
)
def test_nvidia_smi_s_csv_recovery_action_of_a_gpu(row: str, blamed: bool) -> None:
    # nvidia-smi --query-gpu=index,[pci.bus_id,]gpu_recovery_action --format=csv,noheader
    v = verdict("0, None", row, nodes=["gpu07"])
    if blamed:
        assert outcome(v) == ("requeue_exclude", "hardware", ["gpu07"])
    else:
        assert v.action == "none"


def test_nvidia_smi_without_its_nvml_library_is_restarted() -> None:
    v = verdict(
        "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that "
        "the NVIDIA Display Driver is properly installed and present in your system."
    )
    assert outcome(v) == ("requeue", "system", [])


# ---------------------------------------------------------------- PyTorch rendezvous and store


@settings(max_examples=30, deadline=None)
@given(rank=st.integers(0, 63), world=st.integers(2, 64), seconds=st.integers(1, 7200))
def test_pytorch_s_store_and_connect_timeouts_are_restarted_not_stopped(
    rank: int, world: int, seconds: int
) -> None:
    # distributed_c10d.py _store_based_barrier (1.8-1.13), c10d/socket.cpp, TCPStore
    for line in (
        "RuntimeError: Timed out initializing process group in store based barrier on rank: "
        f"{rank}, for key: store_based_barrier_key:1 (world_size={world}, worker_count=1, "
        "timeout=0:30:00)",
        f"[E socket.cpp:957] [c10d] The client socket has timed out after {seconds}s while "
        "trying to connect to (gpu07, 29500).",
        "RuntimeError: Socket Timeout",
        f"RuntimeError: [{rank}] is setting up NCCL communicator and retrieving ncclUniqueId "
        "from [0] via c10d key-value store by key '0', but store->get('0') got error: Socket "
        "Timeout",
    ):
        v = verdict(line)
        assert v.action == "requeue" and v.blame_nodes == [], line


def test_ranks_that_never_joined_are_the_program_s_in_a_one_node_job_only() -> None:
    # the store-based barrier and the store's server time out waiting for ranks that did not
    # arrive: a symptom, restarted once; on one node no network stands between ranks and store
    for line in (
        "RuntimeError: Timed out initializing process group in store based barrier on rank: 0, "
        "for key: store_based_barrier_key:1 (world_size=2, worker_count=1, timeout=0:30:00)",
        "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. "
        "1/2 clients joined.",
    ):
        assert outcome(verdict(line)) == ("requeue", "unknown", [])
        assert outcome(verdict(line, nodes=["gpu07"])) == ("stop", "application", [])
        assert outcome(verdict(line, nodes=["gpu07", "gpu08"])) == ("requeue", "unknown", [])
