"""GPU setup lines a healthy node prints for the job's own setup: restarted once, no node blamed.

Each line below comes from the emitter whether the node's driver stack is broken or the job's
image, libraries or request are wrong (docs/signatures.md, "Errors, by what they cost"): NVML's
``Driver/library version mismatch`` (the caller's library may be an image's), CUDA's 803
``unsupported display driver / cuda driver combination`` (a forward-compatibility libcuda the job
brings), the container hook's ``no cuda-capable device is detected`` (a step whose devices are
hidden), NCCL's ``unhandled cuda error`` alone (any CUDA call under NCCL). What only the host's
own software says (the hook's NVML mismatch, Slurm's gpu/nvml plugin) still blames the node.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.signals.logs import LogVerdict, classify, default_catalogue

CATALOGUE = default_catalogue()

#: how a job's output prefixes a line: nothing, a rank, a timestamp, a launcher's tag
PREFIXES = st.sampled_from(
    [
        "",
        "[rank3]: ",
        "0: ",
        "2025-07-01 05:06:30,004 ERROR ",
        "[task 2025-07-01T05:06:30.005+00:00] [train] [nvidia-smi(stdout)] ",
        "(RayWorkerWrapper pid=11305) ",
    ]
)
NODES = st.sampled_from([None, ["n1"], ["gpu12", "gpu13"]])


def verdict(*lines: str, nodes: list[str] | None = None) -> LogVerdict:
    """The explain-log verdict on these lines."""
    matches = list(CATALOGUE.scan_text("\n".join(lines), source="job.out"))
    return classify(matches, nodes=nodes, catalogue=CATALOGUE)


def restarted_unblamed(v: LogVerdict) -> bool:
    """Restarted once, no node named (the cheap error for a setup the line cannot tell)."""
    return v.action == "requeue" and v.blame_nodes == []


@settings(max_examples=60, deadline=None)
@given(
    prefix=PREFIXES,
    nodes=NODES,
    line=st.sampled_from(
        [
            "Failed to initialize NVML: Driver/library version mismatch",
            "pynvml.NVMLError_LibRmVersionMismatch: RM has detected an NVML/RM version mismatch.",
        ]
    ),
    library=st.booleans(),
)
def test_nvml_version_mismatch_in_the_job_s_words_blames_no_node(
    prefix: str, nodes: list[str] | None, line: str, library: bool
) -> None:
    # the caller's libnvidia-ml against the loaded module: the node's upgrade or an image's
    # own libraries; nvidia-smi's "NVML library version: X" after it is the same in both
    lines = [prefix + line] + (["NVML library version: 570.86"] if library else [])
    v = verdict(*lines, nodes=nodes)
    assert restarted_unblamed(v), v
    assert v.fault_domain == "system"


@settings(max_examples=40, deadline=None)
@given(daemon=st.sampled_from(["slurmd", "slurmstepd", "slurmstepd[4242]"]))
def test_slurm_s_own_nvml_mismatch_blames_its_node(daemon: str) -> None:
    # Slurm's gpu/nvml plugin runs on the host with the host's library: the node's own state
    line = f"{daemon}: error: Failed to initialize NVML: Driver/library version mismatch"
    v = verdict(line, nodes=["n1"])
    assert (v.action, v.blame_nodes) == ("requeue_exclude", ["n1"])


def test_the_container_hook_s_nvml_mismatch_still_blames_the_node() -> None:
    # the hook loads the host's libnvidia-ml before the container exists: never the image's
    line = (
        "nvidia-container-cli: initialization error: nvml error: driver/library version "
        "mismatch: unknown."
    )
    assert verdict(line, nodes=["n1"]).blame_nodes == ["n1"]


@settings(max_examples=60, deadline=None)
@given(
    prefix=PREFIXES,
    nodes=NODES,
    line=st.sampled_from(
        [
            "RuntimeError: CUDA error: system has unsupported display driver / cuda driver "
            "combination",
            "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda "
            "functions before calling NumCudaDevices() that might have already set an error? "
            "Error 803: system has unsupported display driver / cuda driver combination",
            "E tensorflow/stream_executor/cuda/cuda_driver.cc:271] failed call to cuInit: "
            "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: system has unsupported display driver / cuda "
            "driver combination",
        ]
    ),
)
def test_cuda_803_is_restarted_with_no_node_blamed(
    prefix: str, nodes: list[str] | None, line: str
) -> None:
    # a forward-compatibility libcuda the job brings (an image's or a conda env's cuda-compat)
    # fails the same way on a healthy node as a node's libcuda upgraded without a reboot
    v = verdict(prefix + line, nodes=nodes)
    assert restarted_unblamed(v), v


@settings(max_examples=30, deadline=None)
@given(nodes=NODES, wrapped=st.booleans())
def test_the_hook_s_no_cuda_device_is_restarted_with_no_node_blamed(
    nodes: list[str] | None, wrapped: bool
) -> None:
    # cuInit in the hook's driver service: a step whose device cgroup or CUDA_VISIBLE_DEVICES
    # hides the GPUs (NVIDIA/pyxis#47) prints it on a healthy node
    core = (
        "nvidia-container-cli: initialization error: cuda error: no cuda-capable device is detected"
    )
    line = f'stderr: {core}\\n"""": unknown.' if wrapped else core
    assert restarted_unblamed(verdict(line, nodes=nodes))


@settings(max_examples=60, deadline=None)
@given(
    prefix=PREFIXES,
    nodes=NODES,
    line=st.sampled_from(
        [
            "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
            "NCCLUtils.hpp:275, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
            "NCCL version 2.18.1",
            "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, "
            "unhandled cuda error, NCCL version 2.7.8",
            "NCCL failure all_reduce.cu:95 'unhandled cuda error'",
            "ncclUnhandledCudaError: Call to CUDA function failed.",
        ]
    ),
)
def test_nccl_s_unhandled_cuda_error_alone_blames_no_node(
    prefix: str, nodes: list[str] | None, line: str
) -> None:
    # any CUDA call under NCCL: a GPU's fault as often as an NCCL built for another CUDA
    v = verdict(prefix + line, nodes=nodes)
    assert restarted_unblamed(v), v


def test_nccl_s_unhandled_cuda_error_still_defers_to_a_node_s_cuda_error() -> None:
    # the CUDA error it wraps, printed beside it, decides: an uncorrectable ECC error is the GPU's
    v = verdict(
        "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        "Last error:",
        "Cuda failure 'uncorrectable ECC error encountered'",
        nodes=["n1"],
    )
    assert (v.action, v.blame_nodes) == ("requeue_exclude", ["n1"])


def test_a_gpu_s_own_failure_beside_a_setup_line_still_blames_the_node() -> None:
    # the setup line is ambiguous; an XID from the driver about the GPU is not
    v = verdict(
        "Failed to initialize NVML: Driver/library version mismatch",
        "Nov 29 13:45:01 n1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
        "GPU has fallen off the bus.",
        nodes=["n1"],
    )
    assert (v.action, v.blame_nodes) == ("requeue_exclude", ["n1"])
