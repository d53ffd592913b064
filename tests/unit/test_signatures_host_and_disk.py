"""The kernel's disk and host messages, memory testers, a Lustre
client's console lines and the GCC driver's crash retry, read by what each emitter means.

Lines in the shape the emitter prints them (format strings from its source; hosts, pids and
numbers made up); where a number in the line decides, hypothesis varies it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.signature_verdicts import verdict


def answer(*lines: str) -> tuple[str, list[str]]:
    v = verdict(*lines, nodes=["n1"])
    return v.action, v.blame_nodes


@pytest.mark.parametrize(
    ("line", "action", "blamed"),
    [
        # libata: the error handler's report is a symptom; giving up on the disk blames it
        ("ata3.00: exception Emask 0x0 SAct 0x80000 SErr 0x0 action 0x6 frozen", "requeue", False),
        ("ata3.00: failed command: READ FPDMA QUEUED", "requeue", False),
        ("ata3: reset failed, giving up", "requeue_exclude", True),
        ("ata3.00: disabled", "requeue_exclude", True),
        ("ata5: SATA link down (SStatus 0 SControl 300)", "none", False),
        ("ata3: EH complete", "none", False),
        # SCSI: the sense key decides
        ("sd 2:0:0:0: [sdb] tag#29 Sense Key : Hardware Error [current]", "requeue_exclude", True),
        ("sd 2:0:0:0: [sdb] tag#29 Sense Key : Illegal Request [current]", "none", False),
        ("sd 2:0:0:0: [sdb] tag#29 Sense Key : Unit Attention [current]", "none", False),
        ("sd 2:0:0:0: rejecting I/O to offline device", "requeue_exclude", True),
        # NVMe's nvme_log_error: the status text decides
        (
            "nvme0n1: Read(0x2) @ LBA 1953520, 8 blocks, Unrecovered Read Error "
            "(sct 0x2 / sc 0x81)",
            "requeue_exclude",
            True,
        ),
        (
            "nvme0n1: I/O Cmd(0x2) @ LBA 1336320, 32 blocks, I/O Error (sct 0x3 / sc 0x71)",
            "requeue",
            False,
        ),
        # the kernel's ext4 write-back failure is the node's disk; CPER's corrected note nothing
        (
            "EXT4-fs warning (device sda2): ext4_end_bio:343: I/O error 10 writing to inode "
            "3932211 starting block 15763042)",
            "requeue_exclude",
            True,
        ),
        (
            "{1}[Hardware Error]: It has been corrected by h/w and requires no further action",
            "none",
            False,
        ),
        # Lustre: the file system's, restarted, and never a Python exception
        (
            "LustreError: 167-0: scratch-OST0003-osc-ffff8c2a1b6e2000: This client was evicted by "
            "scratch-OST0003; in progress operations using this service will fail.",
            "requeue",
            False,
        ),
        ("LustreError: Skipped 3 previous similar messages", "none", False),
        # smartctl / ssacli verdicts on a drive; smartd's usage attribute is age, a symptom
        (
            "SMART Health Status: HARDWARE IMPENDING FAILURE TOO MANY BLOCK REASSIGNS ",
            "requeue_exclude",
            True,
        ),
        (
            "physicaldrive 1I:1:8 (port 1I:box 1:bay 8, SAS HDD, 2 TB, Predictive Failure)",
            "requeue_exclude",
            True,
        ),
        (
            "Device: /dev/sda [SAT], Failed SMART usage Attribute: 9 Power_On_Hours.",
            "requeue",
            False,
        ),
        # a file system's failure in the C library's (or Go's) words: restarted, no node
        ("touch: cannot touch '/scratch/x': Read-only file system", "requeue", False),
        # a node's own directory read-only blames the node (i28i: fs.node_dir_read_only)
        (
            "open /var/lib/kubelet/x: read-only file system, which is unexpected",
            "requeue_exclude",
            True,
        ),
        ("open /srv/share/x: read-only file system, which is unexpected", "requeue", False),
    ],
)
def test_host_messages_read_by_their_emitter(line: str, action: str, blamed: bool) -> None:
    got, blame = answer(line)
    assert got == action
    assert bool(blame) == blamed


@settings(max_examples=30, deadline=None)
@given(a=st.integers(0, 2**32 - 1), b=st.integers(0, 2**32 - 1), off=st.integers(0, 2**31))
def test_a_memory_tester_s_mismatch_blames_the_node(a: int, b: int, off: int) -> None:
    # memtester tests.c compare_regions: "FAILURE: 0x%08lx != 0x%08lx at offset 0x%08lx."
    line = f"FAILURE: 0x{a:08x} != 0x{b:08x} at offset 0x{off:08x}."
    assert answer(line) == ("requeue_exclude", ["n1"])
    assert answer(
        f"stress-ng: fail:  [2345] vm: detected {a + 1} bit errors while stressing memory"
    ) == (
        "requeue_exclude",
        ["n1"],
    )
    assert answer("  Stuck Address       : ok")[0] == "none"


def test_gcc_s_retry_that_passed_blames_the_node_unless_the_compiler_was_killed() -> None:
    # gcc.cc try_generate_repro: the driver re-ran the crashed compiler and it passed
    retry = "The bug is not reproducible, so it is likely a hardware or OS problem."
    crash = "foo.c:12:1: internal compiler error: Segmentation fault"
    assert answer(crash, "Please submit a full bug report,", retry) == ("requeue_exclude", ["n1"])
    # a crash alone: a bug as often as bad memory, restarted once
    assert answer(crash) == ("requeue", [])
    # SIGKILL from the out-of-memory killer: the retry passed because memory was free again
    killed = "c++: internal compiler error: Killed (program cc1plus)"
    assert answer(retry, killed) == ("stop", [])
    assert answer("c++: fatal error: Killed signal terminated program cc1plus") == ("stop", [])
