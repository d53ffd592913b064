"""A GPU logging thousands of identical XIDs a second (docs/reliability.md, "XID storm"): the
kernel-log source sends one per GPU and code per REPEAT_WINDOW and counts the rest."""

from __future__ import annotations

import time

from slurm_recovery.sidecar.sources.kmsg import REPEAT_WINDOW
from tests.conftest import wait_for
from tests.unit import test_kmsg
from tests.unit.test_kmsg import BOOT_TIME, collect, make

boot = test_kmsg.boot  # the fixture

XID_13 = (
    "NVRM: Xid (PCI:0000:86:00): 13, pid=4242, name=python, Graphics SM Warp Exception on "
    "(GPC 1, TPC 0, SM 0): Out Of Range Address"
)
PER_SECOND = 5000


def flood(path, first_seq: int, start_us: int, count: int, line: str = XID_13) -> None:
    """``count`` identical records, PER_SECOND a second of kernel time from ``start_us``."""
    step = 1_000_000 // PER_SECOND
    with path.open("a") as out:
        for i in range(count):
            out.write(f"4,{first_seq + i},{start_us + i * step},-;{line}\n")


def test_thousands_of_identical_xids_a_second_become_one_per_window(tmp_path, boot):
    device = tmp_path / "kmsg"
    device.touch()
    flood(device, 1, 1_000_000, 2 * PER_SECOND)  # 2 s of kernel time: 10,000 records
    # another code on the same GPU in the middle of it is not a repeat
    with device.open("a") as out:
        out.write("4,20001,1500000,-;NVRM: Xid (PCI:0000:86:00): 48, DBE\n")
    source = make(tmp_path, boot, device)
    try:
        started = time.monotonic()
        found = collect(source, 2, now=BOOT_TIME + 3600)
        found += collect(source, 1_000_000, now=BOOT_TIME + 3600, wait=1.0)
        seconds = time.monotonic() - started
        assert [(f.payload["xid"], f.gpu) for f in found] == [(13, 1), (48, 1)]
        assert "repeats" not in found[0].payload
        assert "9999 repeated XIDs not sent" in source.status()

        # past the window: the next one goes, carrying how many were not sent
        later_us = 1_000_000 + int(REPEAT_WINDOW * 1e6) + 1_000_000
        flood(device, 30001, later_us, PER_SECOND)
        more = collect(source, 1, now=BOOT_TIME + 3600)
        more += collect(source, 1_000_000, now=BOOT_TIME + 3600, wait=1.0)
        assert [(f.payload["xid"], f.payload.get("repeats")) for f in more] == [(13, 9999)]
        assert f"{9999 + PER_SECOND - 1} repeated XIDs not sent" in source.status()
        print(
            f"{2 * PER_SECOND + 1 + PER_SECOND} records ({PER_SECOND}/s of kernel time) -> "
            f"{len(found) + len(more)} findings; read in {seconds:.2f}s"
        )
    finally:
        source.close()


def test_a_storm_of_one_code_never_pushes_another_xid_out_of_the_queue(tmp_path, boot):
    device = tmp_path / "kmsg"
    device.touch()
    flood(device, 1, 1_000_000, 3000)  # far more than the queue holds ...
    with device.open("a") as out:  # ... with the XID that matters at the end
        out.write("4,5001,1700000,-;NVRM: Xid (PCI:0000:86:00): 79, GPU has fallen off the bus.\n")
    source = make(tmp_path, boot, device, max_pending=5)
    try:
        # the reader takes everything before the first poll
        wait_for(lambda: source._highest == 5001, timeout=10, interval=0.01)
        found = collect(source, 2, now=BOOT_TIME + 3600)
        assert [f.payload["xid"] for f in found] == [13, 79]
        assert "dropped" not in source.status()
    finally:
        source.close()
