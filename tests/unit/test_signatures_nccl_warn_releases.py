"""NCCL's WARN lines as every release printed them (2.3.5-2.30.7, emitters/nccl_warn.toml's
``forms``), read as their family; and NCCL's NVML failures read by the NVML error they quote."""

from __future__ import annotations

import pytest

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
    ("Could not open XML topology file /opt/topo.xml : No such file or directory", "stop"),
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
