"""An error reads the same whichever release printed it: NCCL's WARN lines as every release
printed them (2.3.5-2.30.7, emitters/nccl_warn.toml's ``forms``), NCCL's NVML failures by the NVML
error they quote, and every cudaError_t and ncclResult_t member in each of PyTorch's words."""

from __future__ import annotations

import pytest

from slurm_recovery.signals.emitters import load_emitter_tables
from tests.unit.signature_verdicts import answer, verdict

PREFIX = "gpu07:4411:4470 [2] init.cc:901 NCCL WARN "

#: (an older release's words, what they ask for): before, each read as a warning, nothing failed
OLDER_WORDS = [
    (
        "NCCL library is too old. This application was compiled with NCCL version 2.18.1, but "
        "is running with NCCL library version 2.14.3.",
        "stop",
    ),
    ("NET/Socket : no interface found", "stop"),
    ("Could not open XML graph file /opt/graph.xml : No such file or directory", "stop"),
    (
        "Mismatched collective detected, please check your collective calls at and around rank "
        "3. You can use NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=COLL to see the collective logs",
        "stop",
    ),
    ("failed to open CUDA IPC handle : 201 invalid device context", "requeue"),
    (
        "Your program may be hanging, this may be caused by a collective mismatch around rank 3. "
        "Please check your collective calls at and around this rank. You can use "
        "NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=COLL to see the collective logs",
        "requeue",
    ),
]


@pytest.mark.parametrize(("words", "action"), OLDER_WORDS)
def test_an_older_release_s_words_read_as_their_family(words: str, action: str) -> None:
    v = verdict(PREFIX + words)
    assert (v.action, v.blame_nodes) == (action, [])
    assert v.signatures[0]["id"] == "nccl.warn"


def test_a_setting_nccl_corrected_and_carried_on_with_is_nothing() -> None:
    line = "NCCL_WORK_FIFO_DEPTH=1000 is being ignored because it is not a power of 2."
    assert answer(PREFIX + line) == ("none", [])


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        # the driver's library and module differ: restarted, no node blamed (a job's image can
        # bring its own driver libraries; nvml.version_mismatch reads NVML's own line so too)
        ("nvmlInit_v2() failed: Driver/library version mismatch", ("requeue", [])),
        ("nvmlDeviceSetCpuAffinity() failed: Insufficient Permissions", ("requeue", [])),
        ("nvmlDeviceGetHandleByIndex(3) failed: Unknown Error", ("requeue", [])),
        ("nvmlDeviceGetHandleByIndex(3) failed: GPU is lost", ("requeue_exclude", ["gpu07"])),
        (
            "nvmlDeviceGetP2PStatus(0,1,NVML_P2P_CAPS_INDEX_READ) failed: Not Supported",
            ("none", []),
        ),
        ("NVML failure 'Unknown Error'", ("requeue", [])),
    ],
)
def test_an_nvml_failure_inside_nccl_is_read_by_the_error_it_quotes(
    error: str, expected: tuple[str, list[str]]
) -> None:
    # before: every nvmlInit failure blamed the node, 'Insufficient Permissions' included, and
    # every other NVML call's failure read as nothing
    assert answer(PREFIX + error) == expected


CUDA_ERRORS = [m for m in load_emitter_tables().tables["cuda_runtime"].members if m.message]
NCCL_RESULTS = [m for m in load_emitter_tables().tables["nccl_result"].members if m.message]


@pytest.mark.parametrize("member", CUDA_ERRORS, ids=lambda m: m.name)
def test_a_cuda_error_reads_the_same_in_every_pytorch_release_s_words(member) -> None:
    # PyTorch 2.x, 1.x's THC exception and THCudaCheck's warning; the THC forms print the number
    # of the CUDA release the program was built with (CUDA 10.1 renumbered the enum: 48 was "no
    # kernel image", now 209), so the text decides, not the number
    forms = [
        f"RuntimeError: CUDA error: {member.message}",
        f"RuntimeError: cuda runtime error ({member.value}) : {member.message} at "
        "/pytorch/aten/src/THC/THCGeneral.cpp:50",
        f"THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=50 "
        f"error={member.value} : {member.message}",
    ]
    readings = [answer(line) for line in forms]
    assert all(r == readings[0] for r in readings), list(zip(forms, readings, strict=True))


def test_an_old_cuda_number_beside_its_text_is_read_by_the_text() -> None:
    # CUDA <= 10.0's numbers: 48 no kernel image (now 209), 38 no device (now 100)
    line = (
        "RuntimeError: cuda runtime error (48) : no kernel image is available for execution on "
        "the device at /pytorch/aten/src/THC/THCGeneral.cpp:50"
    )
    assert "cudaErrorNoKernelImageForDevice" in verdict(line).cause
    line = (
        "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=51 error=38 : "
        "no CUDA-capable device is detected"
    )
    assert "cudaErrorNoDevice" in verdict(line).cause


@pytest.mark.parametrize("member", NCCL_RESULTS, ids=lambda m: m.name)
def test_an_nccl_result_reads_the_same_in_every_pytorch_release_s_words(member) -> None:
    # torch.cuda.nccl's "NCCL Error N: text" (DataParallel, torch.cuda.comm: every release),
    # c10d's "NCCL error in: file:line, text, NCCL version" (1.x) and its DistBackendError (2.x)
    forms = [
        f"RuntimeError: NCCL Error {member.value}: {member.message}",
        "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:784, "
        f"{member.message}, NCCL version 2.7.8",
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        f"NCCLUtils.hpp:275, {member.message}, NCCL version 2.20.5",
    ]
    readings = [answer(line) for line in forms]
    assert all(r == readings[0] for r in readings), list(zip(forms, readings, strict=True))


ABORTED = "RuntimeError: NCCL communicator was aborted"
UNIQUE_ID = (
    "[2] is setting up NCCL communicator and {} ncclUniqueId from [0] via c10d key-value store "
    "by key '0', but store->get('0') got error: Connection reset by peer"
)


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        (f"{ABORTED}.", f"{ABORTED} on rank 0."),
        (
            "RuntimeError: " + UNIQUE_ID.format("retreiving"),
            "torch.distributed.DistBackendError: " + UNIQUE_ID.format("retrieving"),
        ),
    ],
)
def test_older_pytorch_distributed_words_read_as_the_newer_ones(older: str, newer: str) -> None:
    # before: the older words read as the program's own exception (stop)
    assert answer(older) == answer(newer) == ("requeue", [])


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        # the memory cgroup's OOM killer before 4.19 ("Kill process ... or sacrifice child")
        (
            "Memory cgroup out of memory: Kill process 1234 (python) score 1000 or sacrifice child",
            "Memory cgroup out of memory: Killed process 1234 (python) total-vm:123456kB, "
            "anon-rss:1234kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:1234kB "
            "oom_score_adj:0",
        ),
        (
            "Out of memory: Kill process 1234 (python) score 900 or sacrifice child",
            "Out of memory: Killed process 1234 (python) total-vm:123456kB, anon-rss:1234kB, "
            "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:1234kB oom_score_adj:0",
        ),
        # the block layer's request error before the op and flags were printed
        (
            "blk_update_request: critical medium error, dev sda, sector 1234",
            "critical medium error, dev sda, sector 1234 op 0x0:(READ) flags 0x80700 phys_seg 1 "
            "prio class 2",
        ),
        (
            "blk_update_request: critical target error, dev sdb, sector 99",
            "critical target error, dev sdb, sector 99 op 0x1:(WRITE) flags 0x0 phys_seg 1 prio "
            "class 0",
        ),
    ],
)
def test_an_older_kernel_s_words_read_as_the_newer_ones(older: str, newer: str) -> None:
    # before: the cgroup's older OOM line and the older medium/target errors read as nothing
    # or as an unexplained error line
    assert answer(older) == answer(newer)
    assert verdict(older).signatures[0]["id"] != "generic.error_line"


def test_a_warning_nccl_carries_on_after_is_nothing() -> None:
    for words in (
        "Failed to open libibverbs.so[.1]",
        "CollNet currently only supports up to 8 GPUs per node, disabling CollNet",
        "Failed to set CPU affinity",
        # NCCL returns success after it: a topology file is optional (a graph file is not)
        "Could not open XML topology file /opt/topo.xml : No such file or directory",
        # a value out of range is clamped to the range
        "Invalid NCCL_NSOCKS_PERTHREAD 12 (maximum 8).",
    ):
        assert answer(PREFIX + words) == ("none", []), words


def test_a_warning_on_the_way_to_a_failure_does_not_take_the_root_from_the_program_s_error() -> (
    None
):
    # a library NCCL could not load, then the program's own out-of-memory: the program's error
    # decides (before this step a family read this way was a root of its own, and the restart it
    # asked for hid the stop)
    v = verdict(
        PREFIX + "Failed to open libnvidia-ml.so.1: cannot open shared object file",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    )
    assert (v.action, v.signatures[0]["id"]) == ("stop", "cuda.out_of_memory")
