"""What a node's kernel, tools and GPU driver stack say: the kernel's BUG() assertion, btrfs, NIC
transmit hangs and RAID controllers, DCGM's API return codes, a node's own directories gone
read-only, NVML's recovery action in nvidia-smi's CSV, the NVIDIA driver not loading
(deviceQuery) and libnvidia-container's error contexts.

Lines in the shape the emitter prints them (format strings from its source; hosts, ports, pids
and numbers made up); where a number in the line decides, hypothesis varies it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.signature_verdicts import answer, verdict

# ------------------------------------------------------------ the kernel's BUG() assertion


@pytest.mark.parametrize(
    "where", ["mm/slub.c:4321", "fs/ext4/inode.c:2710", "drivers/gpu/drm/ttm/ttm_bo.c:187"]
)
def test_kernel_bug_assertion_alone_blames_the_node(where: str) -> None:
    # lib/bug.c report_bug(): "kernel BUG at %s:%u!", even without the die banner after it
    assert answer(f"[12345.678901] kernel BUG at {where}!", nodes=["n1"]) == (
        "requeue_exclude",
        ["n1"],
    )


# ------------------------------------------------ DCGM's API return codes (dcgmReturn_t)


@pytest.mark.parametrize(
    ("line", "action", "blamed"),
    [
        # dcgmi's 'Error: ... Return: ' + errorString() (dcgmlib/src/dcgm_errors.c)
        ("Error: Unable to get GPU info. Return: GPU is lost", "requeue_exclude", True),
        ("Error: Unable to update fields. Return: GPU requires reset", "requeue_exclude", True),
        (
            "dcgm_structs.DCGMError_NvvsIsolateError: The diagnostic returned an error that "
            "indicates the need to drain the GPU",
            "requeue_exclude",
            True,
        ),
        (
            "Error: Unable to start an embedded host engine. Host engine connection "
            "invalid/disconnected.",
            "requeue",
            False,
        ),
        (
            "Error: dcgmGetAllSupportedDevices() returned DCGM_ST_NVML_NOT_LOADED",
            "requeue",
            False,
        ),
        ("Error: Unable to get GPU info. Return: Timeout", "requeue", False),
        ("Error: Unable to update fields. Return: Success", "none", False),
        ("Error: Unable to retrieve job statistics. Return: No data is available.", "none", False),
        ("Error: Unable to get GPU info. Return: Field is not being watched", "none", False),
    ],
)
def test_dcgm_return_codes_read_by_their_table(line: str, action: str, blamed: bool) -> None:
    got, blame = answer(line, nodes=["n1"])
    assert got == action
    assert blame == (["n1"] if blamed else [])


def test_dcgm_s_own_finding_about_its_host_engine_stays_a_warning() -> None:
    # DCGM_FR_HOSTENGINE_CONN (severity MONITOR) quotes the return code's text: gpu_tool.dcgm's
    line = (
        "| Warning: GPU0             | Could not connect to the host engine: 'Host engine "
        "connection invalid/disconnected' |"
    )
    assert answer(line, nodes=["n1"]) == ("none", [])


def test_every_dcgm_return_code_is_listed_with_its_text() -> None:
    from slurm_recovery.signals.emitters import load_emitter_tables

    table = load_emitter_tables().tables["dcgm_return"]
    values = sorted(m.value for m in table.members if m.value is not None)
    # DCGM_ST_OK = 0 and -1 .. -67 (-2 is not used)
    assert values == sorted([0, -1, *range(-67, -2)])
    assert all(m.message for m in table.members)


# ------------------------------------------------ a node's own directories gone read-only


@settings(max_examples=40, deadline=None)
@given(
    top=st.sampled_from(
        ["/tmp", "/var/tmp", "/var/lib", "/var/log", "/var/spool", "/var/cache", "/run", "/dev/shm"]
    ),
    leaf=st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True),
    form=st.sampled_from(
        [
            "touch: cannot touch '{p}': Read-only file system",
            "mkdir: cannot create directory '{p}': Read-only file system",
            "open {p}: read-only file system",
            "OSError: [Errno 30] Read-only file system: '{p}'",
            "mktemp: failed to create file via template '{p}': Read-only file system",
        ]
    ),
)
def test_a_node_s_own_directory_read_only_blames_the_node(top: str, leaf: str, form: str) -> None:
    line = form.format(p=f"{top}/{leaf}")
    assert answer(line, nodes=["n1"]) == ("requeue_exclude", ["n1"])
    assert answer(line, nodes=["n1", "n2"]) == ("requeue", [])  # which node: not said


@pytest.mark.parametrize(
    "line",
    [
        "touch: cannot touch '/home/user/run/x.txt': Read-only file system",
        "OSError: [Errno 30] Read-only file system: '/opt/conda/lib/python3.10/site-packages/x'",
        "cp: cannot create regular file '/usr/local/bin/tool': Read-only file system",
        "open /scratch/job42/out.bin: read-only file system",
    ],
)
def test_a_read_only_image_or_share_stays_a_restart(line: str) -> None:
    assert answer(line, nodes=["n1"]) == ("requeue", [])


def test_bash_here_document_on_a_read_only_node() -> None:
    line = (
        "Nov 28 08:00:43 gpu-a07 job.sh[1051774]: /var/spool/slurmd/job42/slurm_script: line 12: "
        "cannot create temp file for here-document: Read-only file system"
    )
    assert answer(line) == ("requeue_exclude", ["gpu-a07"])


# ------------------------------------------------ NVML's recovery action in nvidia-smi's CSV


@pytest.mark.parametrize("first", ["0", "3", "00000000:4E:00.0"])
@pytest.mark.parametrize("word", ["Drain P2P", "Drain and Reset", "Reset", "Reboot"])
def test_a_csv_row_naming_a_recovery_action_blames_the_node(first: str, word: str) -> None:
    # nvidia-smi --query-gpu=index|pci.bus_id,gpu_recovery_action --format=csv,noheader
    assert answer(f"{first}, {word}", nodes=["n1"]) == ("requeue_exclude", ["n1"])


def test_a_csv_row_with_no_recovery_action_is_nothing() -> None:
    assert answer("0, NVIDIA H100 80GB HBM3, None", nodes=["n1"]) == ("none", [])


# ------------------------------------------------ btrfs, NIC transmit hangs, RAID controllers


@pytest.mark.parametrize(
    ("line", "action", "blamed"),
    [
        (
            "[12345.678901] BTRFS error (device sda1): bdev /dev/sda1 errs: wr 3, rd 1, flush 0, "
            "corrupt 0, gen 0",
            "requeue_exclude",
            True,
        ),
        (
            "[   12.345678] BTRFS info (device sda1): bdev /dev/sda1 errs: wr 0, rd 12, flush 0, "
            "corrupt 0, gen 0",
            "none",
            False,
        ),
        (
            "[76469.312326] BTRFS error (device dm-0): parent transid verify failed on logical "
            "2070681747456 mirror 1 wanted 6080 found 6062",
            "requeue_exclude",
            True,
        ),
        (
            "[12345.678901] BTRFS: error (device sda1) in btrfs_run_delayed_refs:2150: errno=-5 IO "
            "failure",
            "requeue_exclude",
            True,
        ),
        ("[12345.678901] ixgbe 0000:01:00.0 eth0: Detected Tx Unit Hang", "requeue", False),
        (
            "[12345.678901] bnxt_en 0000:04:00.0 eth0: TX timeout detected, starting reset task!",
            "requeue",
            False,
        ),
        (
            "[12345.678901] i40e 0000:3b:00.0: TX driver issue detected, PF reset issued",
            "requeue",
            False,
        ),
        (
            "[12345.678901] megaraid_sas 0000:02:00.0: FW in FAULT state Fault code:0x10000 "
            "subcode:0x0 func:megasas_transition_to_ready",
            "requeue_exclude",
            True,
        ),
        (
            "[12345.678901] hpsa 0000:03:00.0: Controller lockup detected: 0x00130000",
            "requeue_exclude",
            True,
        ),
    ],
)
def test_kernel_disk_nic_and_controller_messages(line: str, action: str, blamed: bool) -> None:
    assert answer(line, nodes=["n1"]) == (action, ["n1"] if blamed else [])


# ------------------------------------------------ libnvidia-container's other error contexts


@pytest.mark.parametrize(
    ("line", "action", "blamed"),
    [
        (
            "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, please "
            "update your driver to a newer version, or use an earlier cuda container: unknown.",
            "requeue",
            False,
        ),
        (
            "nvidia-container-cli: mount error: file creation failed: /var/lib/docker/overlay2/"
            "abc/merged/usr/bin/nvidia-smi: file exists: unknown.",
            "stop",
            False,
        ),
        (
            "nvidia-container-cli: ldcache error: process /sbin/ldconfig.real failed with error "
            "code: 1: unknown",
            "requeue",
            False,
        ),
        (
            "nvidia-container-cli: permission error: capability change failed: operation not "
            "permitted: unknown",
            "requeue",
            False,
        ),
        # the driver itself not usable stays the weak node blame
        (
            "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown.",
            "requeue_exclude",
            True,
        ),
    ],
)
def test_nvidia_container_cli_contexts(line: str, action: str, blamed: bool) -> None:
    assert answer(line, nodes=["n1"]) == (action, ["n1"] if blamed else [])


# ------------------------------------------------ the NVIDIA driver not loading, deviceQuery


@pytest.mark.parametrize(
    "line",
    [
        "modprobe: FATAL: could not insert 'nvidia_uvm': Unknown symbol in module, or unknown "
        "parameter (see dmesg)",
        "modprobe: ERROR: could not insert 'nvidia': Required key not available",
        "[  812.441023] NVRM: API mismatch: the client has the version 535.104.05, but",
    ],
)
def test_the_node_s_driver_not_loading_blames_the_node(line: str) -> None:
    assert answer(line, nodes=["n1"]) == ("requeue_exclude", ["n1"])


@pytest.mark.parametrize(("value", "action"), [(100, "requeue"), (35, "requeue"), (3, "requeue")])
def test_device_query_s_device_count_error_is_read_by_its_value(value: int, action: str) -> None:
    # CUDA samples' deviceQuery: "cudaGetDeviceCount returned %d\n-> %s"
    v = verdict(f"cudaGetDeviceCount returned {value}", nodes=["n1"])
    assert v.action == action
    assert v.signatures[0]["id"] == "cuda.error"


def test_modprobe_s_no_such_device_is_left_to_the_lines_beside_it() -> None:
    # a VM without its GPU passed through prints it as often as a node whose GPU is gone
    line = "modprobe: ERROR: could not insert 'nvidia': No such device"
    assert answer(line, nodes=["n1"])[1] == []


def test_a_signal_description_longer_than_bash_s_column_is_read_too() -> None:
    line = (
        "/var/spool/slurmd/job42/slurm_script: line 12: 31337 Profiling timer expired python x.py"
    )
    assert answer(line, nodes=["n1"]) == ("requeue", [])
