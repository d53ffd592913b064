"""Issue 28: message families read from their emitters' sources, by what each member means.

Each test holds one family to its meaning (the verdict's action, class and blame), with lines
in the shape the emitter prints them (format strings from its source; hosts and numbers are
made up). Where a family is parsed (a number in the line decides), hypothesis varies it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.signals.logs import LogVerdict, classify, scan


def verdict(*lines: str, nodes: list[str] | None = None) -> LogVerdict:
    return classify(scan(list(lines)), nodes=nodes)


def ids(v: LogVerdict) -> list[str]:
    return [s["id"] for s in v.signatures]


# ---------------------------------------------------------------- NCCL


@settings(max_examples=40, deadline=None)
@given(local=st.integers(1, 2**31 - 1), remote=st.integers(1, 2**31 - 1))
def test_nccl_ib_collective_mismatch_is_the_program_s_mistake(local: int, remote: int) -> None:
    # NCCL 2.3.5-2.19 net_ib.cc: "Sanity checks to catch user collective call count/size
    # mismatches"; the receiver's buffer is smaller than what the sender sends
    line = (
        "gpu07:1307367:1307586 [0] transport/net_ib.cc:1038 NCCL WARN NET/IB : req 0/1 tag 0 "
        f"peer 10.0.0.6<58683> collective mismatch error, local size {local} remote size {remote}"
    )
    v = verdict(line, "gpu07:1307367:1307586 [0] NCCL INFO proxy.cc:520 -> 5")
    assert (v.action, v.fault_domain, v.blame_nodes) == ("stop", "application", [])


# ---------------------------------------------------------------- disks: smartd, md, RAID


@settings(max_examples=40, deadline=None)
@given(
    device=st.sampled_from(["/dev/sda [SAT]", "/dev/sg1 [cciss_disk_02] [SCSI]", "/dev/nvme0"]),
    count=st.integers(1, 100_000),
)
def test_smartd_failing_disk_blames_the_node_and_an_error_count_is_only_restarted(
    device: str, count: int
) -> None:
    # smartd.cpp: check_pending()'s "Device: %s, %" PRId64 " %s", MailWarning type 1 and 4
    for line in (
        f"Device: {device}, {count} Currently unreadable (pending) sectors",
        f"Device: {device}, {count} Offline uncorrectable sectors",
        f"Device: {device}, FAILED SMART self-check. BACK UP DATA NOW!",
    ):
        v = verdict(f"Nov 29 13:45:01 gpu12 smartd[811]: {line}")
        assert (v.action, v.fault_domain, v.blame_nodes) == (
            "requeue_exclude",
            "hardware",
            ["gpu12"],
        ), line
    # an error-log count that grew: ambiguous, the cheap error either way (no blame)
    for line in (
        f"Device: {device}, ATA error count increased from {count} to {count + 1}",
        f"Device: {device}, Self-Test Log error count increased from {count} to {count + 1}",
    ):
        v = verdict(f"Nov 29 13:45:01 gpu12 smartd[811]: {line}")
        assert (v.action, v.blame_nodes) == ("requeue", []), line


def test_a_smartd_attribute_trend_is_no_failure() -> None:
    v = verdict(
        "Device: /dev/sda [SAT], SMART Prefailure Attribute: 5 Reallocated_Sector_Ct "
        "changed from 100 to 99"
    )
    assert v.action == "none"


def test_md_member_failure_and_a_raid_controller_s_bad_drive_blame_the_node() -> None:
    # drivers/md/raid1.c / raid5.c pr_crit; MegaCLI / StorCLI physical drive states
    for line in (
        "Nov 29 13:45:01 gpu12 kernel: md/raid1:md0: Disk failure on sdb1, disabling device.",
        "Nov 29 13:45:01 gpu12 kernel: md/raid:md127: Disk failure on nvme1n1, disabling device.",
    ):
        v = verdict(line)
        assert (v.action, v.blame_nodes) == ("requeue_exclude", ["gpu12"]), line
    for line in ("Firmware state: Failed", "Firmware state: Unconfigured(bad)"):
        v = verdict(line, nodes=["n1"])
        assert (v.action, v.fault_domain, v.blame_nodes) == ("requeue_exclude", "hardware", ["n1"])
    # a healthy drive's state is no failure
    assert verdict("Firmware state: Online, Spun Up").action == "none"
