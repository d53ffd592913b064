"""A machine's or a container's setup that shows as a driver error (issue 28, branch i28m):
NVIDIA's container runtime hook read by its own error set (emitters/nvidia_container_cli.toml),
the fabric manager's version mismatch, CUDA's kernel-fault text printed on its own.
docs/signatures.md, "Errors, by what they cost", says why each answer."""

from __future__ import annotations

import pytest

from slurm_recovery.signals.logs import default_catalogue, prefilter_patterns
from tests.unit.signature_verdicts import answer, verdict

EXCLUDE = "requeue_exclude"
HOOK = (
    "docker: Error response from daemon: OCI runtime create failed: container_linux.go:296: "
    'starting container process caused "process_linux.go:398: container init caused '
    '\\"running prestart hook 1 caused \\\\\\"error running hook: exit status 1, stdout: , '
    'stderr: nvidia-container-cli: {error}\\\\\\\\n\\\\\\"\\"": unknown.'
)


@pytest.mark.parametrize(
    ("error", "action", "blamed"),
    [
        # what the hook, on the host with the host's libraries, says of the node's driver
        ("initialization error: nvml error: driver not loaded", "requeue_exclude", True),
        ("initialization error: nvml error: driver/library version mismatch", EXCLUDE, True),
        # what a node's setup, the launch or the request causes as well
        ("initialization error: cuda error: no cuda-capable device is detected", "requeue", False),
        ("initialization error: driver error: timed out", "requeue", False),
        (
            "initialization error: load library failed: libnvidia-ml.so.1: cannot open shared "
            "object file: no such file or directory",
            "requeue",
            False,
        ),
        ("device error: 3: unknown device", "requeue", False),
        ("device error: GPU-5ba2a1f8-7d0c-4b46-2a3e: unknown device", "requeue", False),
        # another NVML or CUDA code, by its own table: a symptom, restarted
        ("initialization error: nvml error: unknown error", "requeue", False),
        ("detection error: nvml error: insufficient permissions", "requeue", False),
        # a form no member names: the entry's own reading
        ("initialization error: process creation failed", "requeue", False),
    ],
)
def test_the_container_hook_s_errors_are_read_by_the_error_it_wraps(
    error: str, action: str, blamed: bool
) -> None:
    for line in (f"nvidia-container-cli: {error}: unknown.", HOOK.format(error=error)):
        assert answer(line, nodes=["n1"]) == (action, ["n1"] if blamed else [])
        v = verdict(line)
        assert v.signatures[0]["id"] == "nvidia_container.init_error"
        assert (v.action, bool(v.blame_nodes)) == (action, blamed)


def test_the_hook_s_timeout_on_a_named_host_blames_no_node() -> None:
    # a persistence daemon not running: the host's setup, not a broken machine
    v = verdict(
        "root@ip-10-206-45-133:/home/ubuntu# nvidia-docker run -it b0390e3560b4 bash",
        HOOK.format(error="initialization error: driver error: timed out"),
    )
    assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue", "system", [])


def test_the_hook_s_table_reads_the_wrapped_nvml_code_the_nvml_table_s_way() -> None:
    catalogue = default_catalogue()
    found = catalogue.emitters.lookup(
        ["nvidia_container_cli", "nvml_return", "cuda_driver"], "nvml error: GPU is lost: unknown."
    )
    assert found is not None and found.table == "nvml_return" and found.blame_node


@pytest.mark.parametrize(
    "line",
    [
        "fabric manager NVIDIA GPU driver interface version 590.48.01 don't match with driver "
        "version 580.126.09.",
        "Nov 29 13:45:01 gpu12 nv-fabricmanager[811]: fabric manager NVIDIA GPU driver interface "
        "version 590.48.01 don't match with driver version 580.126.09.",
    ],
)
def test_the_fabric_manager_s_version_mismatch_is_restarted_with_no_node_blamed(line: str) -> None:
    # two packages out of step is how the node was provisioned, alike on its peers; a reboot
    # does not fix it (NVML's Driver/library version mismatch, an image's libraries as often as
    # the node's, is restarted with no node blamed too, except in Slurm's own plugin's words)
    for nodes in (None, ["n1"], ["gpu12", "gpu13"]):
        v = verdict(line, nodes=nodes)
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue", "system", [])
    assert answer(
        "slurmd: error: Failed to initialize NVML: Driver/library version mismatch", nodes=["n1"]
    ) == (
        "requeue_exclude",
        ["n1"],
    )


def test_cuda_s_kernel_fault_text_on_its_own_is_a_failure_restarted() -> None:
    # a program that prints cudaGetErrorString() alone: before, no keyword found the line and the
    # failed job was left dead
    v = verdict("an illegal memory access was encountered")
    assert (v.action, v.blame_nodes) == ("requeue", [])
    assert v.signatures[0]["id"] == "cuda.illegal_memory_access"
    # a device-side assert beside it still says whose
    v = verdict(
        "../aten/src/ATen/native/cuda/Indexing.cu:1146: indexSelectLargeIndex: block: [0,0,0], "
        "thread: [0,0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
        "RuntimeError: CUDA error: device-side assert triggered",
        "an illegal memory access was encountered",
    )
    assert v.action == "stop"


def test_the_kernel_fault_keyword_costs_the_scan_no_pass() -> None:
    # the prefilter covers the new keyword with a search byte it already looks for
    catalogue = default_catalogue()
    without = [a for a in catalogue.anchors if a != "illegal memory access"]
    assert len(without) == len(catalogue.anchors) - 1
    assert len(catalogue.prefilters) == len(prefilter_patterns(without))
