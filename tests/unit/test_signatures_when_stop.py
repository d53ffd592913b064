"""``stop`` earned, by design (docs/signatures.md, "When the answer is stop").

A line that a bad node prints as well as a buggy program, where the log alone cannot tell them
apart, is restarted once (``requeue``, no node blamed; ``stop_on_same_failure`` stops the
repeat) unless a program-side line beside it says whose. Lines in the shape their emitters print
them (CUDA's ``cudaGetErrorString`` texts and enum names, cuDNN's status names, PyTorch's
DataLoader and caching-allocator texts); where a number or a path varies, hypothesis varies it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.decide.ended_job import decide_ended_job
from slurm_recovery.decide.policy import Policy
from slurm_recovery.scheduler.base import ExitCode
from slurm_recovery.signals.logs import (
    GPU_KERNEL_FAULT_MEMBERS,
    LogVerdict,
    default_catalogue,
    oom_held_elsewhere,
)
from tests.unit.signature_verdicts import verdict

CATALOGUE = default_catalogue()


def restarted_once(v: LogVerdict) -> bool:
    return v.action == "requeue" and v.fault_domain == "unknown" and v.blame_nodes == []


def controller(*lines: str, state: str = "FAILED", code: str = "1") -> str:
    """What the controller does for a one-node job Slurm ended so with these lines."""
    returncode, _, signal = code.partition(":")
    decision = decide_ended_job(
        list(CATALOGUE.scan_text("\n".join(lines))),
        state=state,
        exit_code=ExitCode(int(returncode), int(signal or 0)),
        nodes=["n1"],
        catalogue=CATALOGUE,
        policy=Policy(),
    )
    return decision.action


# --------------------------------------------------------------- a GPU kernel's own fault

#: cudaGetErrorString()'s texts of the family (CUDA 12.9): 700, 714-718
KERNEL_FAULTS = [
    (
        "cudaErrorIllegalAddress",
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "an illegal memory access was encountered",
    ),
    ("cudaErrorHardwareStackError", "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"),
    (
        "cudaErrorIllegalInstruction",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "an illegal instruction was encountered",
    ),
    ("cudaErrorMisalignedAddress", "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"),
    (
        "cudaErrorInvalidAddressSpace",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "operation not supported on global/shared address space",
    ),
    ("cudaErrorInvalidPc", "CUDA_ERROR_INVALID_PC", "invalid program counter"),
]


def test_the_family_is_the_emitter_tables_members_and_every_one_is_restarted_once() -> None:
    names = {n for runtime, driver, _ in KERNEL_FAULTS for n in (runtime, driver)}
    assert names == GPU_KERNEL_FAULT_MEMBERS
    for table in ("cuda_runtime", "cuda_driver"):
        members = {m.name: m for m in CATALOGUE.emitters.tables[table].members}
        for name in names & set(members):
            m = members[name]
            assert (m.fault_class, m.action, m.blame_node) == ("unknown", "requeue", False), name


@settings(max_examples=60, deadline=None)
@given(
    fault=st.sampled_from(KERNEL_FAULTS),
    form=st.integers(0, 3),
    rank=st.integers(0, 4095),
    line=st.integers(1, 99_999),
    one_node=st.booleans(),
)
def test_a_gpu_kernel_s_fault_alone_is_restarted_once_without_a_node(
    fault: tuple[str, str, str], form: int, rank: int, line: int, one_node: bool
) -> None:
    runtime, driver, message = fault
    text = [
        f"[rank{rank}]: RuntimeError: CUDA error: {message}",
        f"GPUassert: {message} /tmp/build/src/kernels.cu {line}",
        "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: Could not synchronize CUDA stream: "
        f"{driver}: {message}",
        f"cupy_backends.cuda.api.runtime.CUDARuntimeError: {runtime}: {message}",
    ][form]
    v = verdict(text, nodes=["n1"] if one_node else None)
    assert restarted_once(v), v.cause


def test_the_controller_restarts_it_too() -> None:
    line = "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert controller(line) == "requeue"
    # before i28k both answered stop; a device-side assert still does
    assert controller("RuntimeError: CUDA error: device-side assert triggered") == "stop"


@settings(max_examples=30, deadline=None)
@given(
    program=st.sampled_from(
        [
            "RuntimeError: CUDA error: device-side assert triggered",
            "IndexError: index 50257 is out of bounds for dimension 0 with size 50257",
            "ValueError: Expected input batch_size (16) to match target batch_size (8).",
        ]
    ),
    first=st.booleans(),
)
def test_a_program_side_line_beside_it_makes_it_the_program_s(program: str, first: bool) -> None:
    fault = "RuntimeError: CUDA error: an illegal memory access was encountered"
    lines = [program, fault] if first else [fault, program]
    v = verdict(*lines, nodes=["n1"])
    assert (v.action, v.fault_domain, v.blame_nodes) == ("stop", "application", [])


def test_a_node_side_line_beside_it_blames_the_node() -> None:
    fault = "RuntimeError: CUDA error: an illegal memory access was encountered"
    ecc = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
    for other in (ecc, xid):
        v = verdict(fault, other, nodes=["n1"])
        assert (v.action, v.blame_nodes) == ("requeue_exclude", ["n1"]), v.cause


@settings(max_examples=20, deadline=None)
@given(after=st.booleans(), version=st.sampled_from(["2.18.1", "2.21.5", "2.27.3"]))
def test_nccl_s_unhandled_cuda_error_around_it_blames_no_node(after: bool, version: str) -> None:
    wrapper = (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL "
        f"version {version}"
    )
    wrapped = "Cuda failure 'an illegal memory access was encountered'"
    lines = [wrapper, "Last error:", wrapped] if after else [wrapped, wrapper]
    v = verdict(*lines, nodes=["n1"])
    assert restarted_once(v), v.cause
    assert v.signatures[0]["id"] != "nccl.unhandled_cuda_error"


# ------------------------------------------------------------------------------- cuDNN


@given(status=st.sampled_from(["EXECUTION_FAILED", "MAPPING_ERROR"]))
def test_cudnn_s_failed_execution_is_restarted_once(status: str) -> None:
    v = verdict(f"RuntimeError: cuDNN error: CUDNN_STATUS_{status}", nodes=["n1"])
    assert restarted_once(v) and v.signatures[0]["id"] == "cudnn.execution_failed"


@given(status=st.sampled_from(["NOT_SUPPORTED", "BAD_PARAM", "ARCH_MISMATCH", "INTERNAL_ERROR"]))
def test_cudnn_s_refusals_stay_the_program_s(status: str) -> None:
    v = verdict(f"RuntimeError: cuDNN error: CUDNN_STATUS_{status}", nodes=["n1"])
    assert (v.action, v.fault_domain) == ("stop", "application")


# ------------------------------------------------------------------ DataLoader's SIGBUS


@settings(max_examples=40, deadline=None)
@given(pid=st.integers(1, 4_194_304), worker=st.booleans())
def test_a_dataloader_bus_error_is_a_bus_error(pid: int, worker: bool) -> None:
    line = (
        "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient "
        "shared memory (shm)."
        if worker
        else f"RuntimeError: DataLoader worker (pid {pid}) is killed by signal: Bus error. It is "
        "possible that dataloader's workers are out of shared memory. Please try to raise your "
        "shared memory limit."
    )
    v = verdict(line, nodes=["n1"])
    assert restarted_once(v) and v.signatures[0]["id"] == "torch.dataloader_bus_error"
    assert controller(line) == "requeue"


@given(size=st.integers(1, 1 << 34))
def test_nccl_s_shared_memory_that_could_not_be_made_stays_the_job_s_setup(size: int) -> None:
    line = (
        "include/shm.h:48 NCCL WARN Error while creating shared memory segment "
        f"nccl-shm-recv-250a7cc850ba9298-0-1-3 (size {size})"
    )
    v = verdict(line, nodes=["n1"])
    assert (v.action, v.fault_domain, v.signatures[0]["id"]) == (
        "stop",
        "application",
        "nccl.shm_error",
    )


# ------------------------------------------------------------ a CUDA driver that will not start


@given(
    line=st.sampled_from(
        [
            "RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu.",
            "ImportError: libcuda.so.1: cannot open shared object file: No such file or directory",
            "./train: error while loading shared libraries: libcuda.so.1: cannot open shared "
            "object file: No such file or directory",
            "OSError: libnvidia-ml.so.1: cannot open shared object file: No such file or directory",
        ]
    )
)
def test_a_cuda_driver_that_will_not_start_is_restarted_once(line: str) -> None:
    v = verdict(line, nodes=["n1"])
    assert restarted_once(v) and v.signatures[0]["id"] == "cuda.driver_unusable"


def test_a_toolkit_library_the_program_brings_stays_the_program_s() -> None:
    v = verdict(
        "OSError: libcudart.so.11.0: cannot open shared object file: No such file or directory"
    )
    assert v.action == "stop"


@given(rank=st.integers(0, 4095))
def test_a_communicator_the_watchdog_aborted_is_a_symptom(rank: int) -> None:
    v = verdict(f"RuntimeError: NCCL communicator was aborted on rank {rank}.", nodes=["n1"])
    assert restarted_once(v) and v.signatures[0]["id"] == "torch.distributed_error"


# --------------------------------------------- an out-of-memory the program did not cause


def gib(n: float) -> str:
    return f"{n:.2f} GiB"


@settings(max_examples=80, deadline=None)
@given(
    capacity=st.sampled_from([10.73, 15.78, 39.59, 79.15, 93.0, 139.8]),
    own_share=st.floats(0.0, 0.3),
    text=st.integers(0, 2),
)
def test_an_out_of_memory_whose_sizes_say_another_process_held_the_gpu_is_restarted_once(
    capacity: float, own_share: float, text: int
) -> None:
    own = capacity * own_share
    free = "5.56 MiB"
    line = [
        f"CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; {gib(capacity)} total capacity; "
        f"{gib(own)} already allocated; {free} free; {gib(own)} cached)",
        f"torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; "
        f"{gib(capacity)} total capacity; {gib(own)} already allocated; {free} free; "
        f"{gib(own)} reserved in total by PyTorch)",
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
        f"total capacity of {gib(capacity)} of which {free} is free. Process 4242 has "
        f"{gib(capacity - own)} memory in use. Including non-PyTorch memory, this process has "
        f"{gib(own)} memory in use. Of the allocated memory {gib(own * 0.9)} is allocated by "
        f"PyTorch, and 10.00 MiB is reserved by PyTorch but unallocated.",
    ][text]
    assert oom_held_elsewhere(line) is not None
    v = verdict(line, nodes=["n1"])
    assert restarted_once(v), v.cause
    assert "held by another process" in v.cause


@settings(max_examples=80, deadline=None)
@given(
    capacity=st.sampled_from([4.0, 10.73, 14.76, 39.59, 79.15]),
    own_share=st.floats(0.6, 0.999),
    text=st.integers(0, 2),
)
def test_an_out_of_memory_of_the_program_s_own_memory_stops(
    capacity: float, own_share: float, text: int
) -> None:
    own = capacity * own_share
    free = "19.75 MiB"
    line = [
        f"CUDA out of memory. Tried to allocate 4.00 GiB (GPU 0; {gib(capacity)} total capacity; "
        f"{gib(own)} already allocated; {free} free; 0 bytes cached)",
        f"RuntimeError: CUDA out of memory. Tried to allocate 2.87 GiB (GPU 0; {gib(capacity)} "
        f"total capacity; {gib(own * 0.8)} already allocated; {free} free; {gib(own)} reserved "
        "in total by PyTorch)",
        f"[rank2]: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 336.00 MiB. "
        f"GPU  has a total capacity of {gib(capacity)} of which {free} is free. Process 2109115 "
        f"has {gib(own)} memory in use. Of the allocated memory {gib(own * 0.97)} is allocated "
        f"by PyTorch, and {gib(own * 0.03)} is reserved by PyTorch but unallocated.",
    ][text]
    assert oom_held_elsewhere(line) is None
    v = verdict(line, nodes=["n1"])
    assert (v.action, v.fault_domain, v.blame_nodes) == ("stop", "application", [])
    assert controller(line) == "stop"


def test_an_out_of_memory_without_sizes_stays_the_program_s() -> None:
    for line in ("RuntimeError: CUDA error: out of memory", "RuntimeError: CUDA out of memory."):
        assert oom_held_elsewhere(line) is None
        assert verdict(line, nodes=["n1"]).action == "stop"


# ------------------------------------------------- XIDs 13 and 31: the driver's report of it


@settings(max_examples=40, deadline=None)
@given(
    code=st.sampled_from([13, 31]),
    bus=st.integers(0, 255),
    pid=st.integers(1, 4_194_304),
    one_node=st.booleans(),
)
def test_the_driver_s_xid_13_and_31_are_restarted_once(
    code: int, bus: int, pid: int, one_node: bool
) -> None:
    detail = {
        13: "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
        31: "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
        "0x7f12_34560000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    }[code]
    line = f"NVRM: Xid (PCI:0000:{bus:02x}:00): {code}, pid={pid}, name=python, {detail}"
    v = verdict(line, nodes=["n1"] if one_node else None)
    assert restarted_once(v), v.cause
    # beside the job's own CUDA error, still one restart: neither says whose
    both = verdict(line, "RuntimeError: CUDA error: an illegal memory access was encountered")
    assert restarted_once(both), both.cause
    assert controller(line) == "requeue"


def test_the_other_application_xids_stay_the_program_s() -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 69, pid=1, name=python, Class Error: ChId 0010"
    assert verdict(line, nodes=["n1"]).action == "stop"
