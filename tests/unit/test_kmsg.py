"""XIDs from the kernel log: the parser on real driver lines, and the /dev/kmsg source.

Every line in REAL_LINES was printed by an NVIDIA driver and published in a bug report,
pull request or project; the comment above each names where. The source is tested with
real files: a regular file and a FIFO of kmsg records stand in for /dev/kmsg.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.sidecar.sources.kmsg import KmsgSource
from slurm_recovery.signals.xid import KMSG_RECORD, XidLine, normalize_pci_bus_id, parse_xid_line
from tests.conftest import wait_for

DATA = Path(__file__).parent / "data" / "kmsg"

# (line, xid, pci, pid, process, message)
REAL_LINES = [
    # leptonai/gpud, components/accelerator/nvidia/error/xid/README.md (PR #46): `dmesg --ctime`
    (
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', "
        "name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal "
        "Instruction Parameter",
        13,
        "0000:cb:00",
        None,
        None,
        "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
    ),
    (
        "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, "
        "name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
        109,
        "0000:cb:00",
        1797828,
        "pt_main_thread",
        "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
    ),
    # NVIDIA/NVSentinel issue #155 (comment): the XID 79 line, no pid/name
    (
        "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus",
        79,
        "0000:44:00",
        None,
        None,
        "GPU has fallen off the bus",
    ),
    # congphase/my-t450s troubleshoot_log.md (an nvidia-bug-report excerpt): journal format
    (
        "Mar 21 20:18:56 pc kernel: [   65.315783] NVRM: Xid (PCI:0000:01:00): 79, "
        "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        79,
        "0000:01:00",
        None,
        None,
        "GPU has fallen off the bus.",
    ),
    # leptonai/gpud, the dmesg XID regex's examples: an older driver, no "PCI:" prefix
    (
        "[...] NVRM: Xid (0000:03:00): 14, Channel 00000001",
        14,
        "0000:03:00",
        None,
        None,
        "Channel 00000001",
    ),
    # leptonai/gpud PR #1174 ("kmsg input"): contained ECC error, GB200 PCI domains
    (
        "NVRM: Xid (PCI:0000:9b:00): 94, pid=1234, name=python3, Contained ECC error",
        94,
        "0000:9b:00",
        1234,
        "python3",
        "Contained ECC error",
    ),
    # NVIDIA/NVSentinel e2e tests (syslog health monitor): a GSP timeout as journald shows it
    (
        "kernel: [16450076.435595] NVRM: Xid (PCI:0002:00:00): 119, pid=1582259, "
        "name=nvc:[driver], Timeout after 6s of waiting for RPC response from GPU1 GSP! "
        "Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
        119,
        "0002:00:00",
        1582259,
        "nvc:[driver]",
        "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 "
        "(GSP_RM_CONTROL) (0x20802a02 0x8).",
    ),
    # NVIDIA/NVSentinel syslog-health-monitor XID parser tests
    (
        "NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to "
        "0x1 (GPU Reset Required)",
        154,
        "0008:01:00",
        None,
        None,
        "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
    ),
]

# leptonai/gpud PR #1174 ("kmsg input"): the NVLink5 extended form (XIDs 144-150)
NVLINK_LINES = [
    (
        "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 "
        "0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
        145,
        "0018:01:00",
        {
            "unit": "RLW_RXPIPE",
            "fatal": False,
            "link": 13,
            "intr_info": "0x0409a0c2",
            "error_status": "0x00000008",
        },
    ),
    (
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 "
        "0x00000000 0x00000000 0x00000000 0x00000000)",
        149,
        "0019:01:00",
        {
            "unit": "NETIR",
            "fatal": True,
            "link": -1,
            "intr_info": "0x000fe406",
            "error_status": "0x00000000",
        },
    ),
    (
        "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 "
        "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        149,
        "0000:00:00",
        {
            "unit": "NETIR_LINK_EVT",
            "fatal": True,
            "link": 0,
            "intr_info": "0x025001c6",
            "error_status": "0x00000000",
        },
    ),
    # leptonai/gpud NVLink XID tests (the four-word form of R570 drivers)
    (
        "NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 "
        "0x00000001 0x00000000 0x00000000)",
        145,
        "0000:04:00",
        {
            "unit": "RLW_REMAP",
            "fatal": False,
            "link": 0,
            "intr_info": "0x00000004",
            "error_status": "0x00000001",
        },
    ),
    (
        "NVRM: Xid (PCI:0000:04:00): 146, TLW_RX/TLW_RX_PIPE0 Fatal XC0 i0 Link 00 "
        "(0x0000000a 0x00000004 0x00000000 0x00000000)",
        146,
        "0000:04:00",
        {
            "unit": "TLW_RX/TLW_RX_PIPE0",
            "fatal": True,
            "link": 0,
            "intr_info": "0x0000000a",
            "error_status": "0x00000004",
        },
    ),
]

# "Fallen off the bus" with no Xid number: reported as XID 79, inferred
FALLEN_LINES = [
    # congphase/my-t450s troubleshoot_log.md: the line after the XID 79
    (
        "Mar 21 20:18:56 pc kernel: [   65.315792] NVRM: GPU 0000:01:00.0: GPU has fallen off "
        "the bus.",
        "0000:01:00",
    ),
    # NVIDIA/NVSentinel issue #155: dmesg's rendering of one multi-line record ...
    (
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n               NVRM: (PCI ID: "
        "10de:26b5) installed in this system has\n               NVRM: fallen off the bus and "
        "is not responding to commands.",
        "0000:b3:00",
    ),
    # ... and the same record in /dev/kmsg, where the kernel escapes the newlines as \x0a
    # (the driver prints it with one printk: "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x\n
    # NVRM: (PCI ID: %04x:%04x) installed in this system has\nNVRM: fallen off the bus ...")
    (
        "3,812,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) "
        "installed in this system has\\x0aNVRM: fallen off the bus and is not responding to "
        "commands.",
        "0000:b3:00",
    ),
    # a dmesg reader that splits the record into lines sees the last line alone: no PCI id
    ("               NVRM: fallen off the bus and is not responding to commands.", None),
]

NOT_XIDS = [
    # leptonai/gpud kmsg tests: an NVSwitch SXid is not a GPU XID
    "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted "
    "PRIV error (First)",
    # leptonai/gpud pkg/kmsg/testdata/kmsg.1.log
    "6,3964,206764307,-;nvidia-nvswitch2: open (major=510)",
    # NVIDIA/NVSentinel issue #155: driver chatter around a fallen GPU
    "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).",
    "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build",
    "NVRM: Xid (PCI:0000:66:00): abc, pid=2280636",
    "",
]


@pytest.mark.parametrize(("line", "xid", "pci", "pid", "process", "message"), REAL_LINES)
def test_real_xid_lines(line, xid, pci, pid, process, message):
    found = parse_xid_line(line)
    assert found == XidLine(xid=xid, message=message, pci=pci, pid=pid, process=process)


@pytest.mark.parametrize(("line", "xid", "pci", "pid", "process", "message"), REAL_LINES)
def test_real_xid_lines_as_kmsg_records(line, xid, pci, pid, process, message):
    bare = line[line.index("NVRM") :]
    found = parse_xid_line(f"4,1234,5678901,-;{bare}".encode())
    assert (found.xid, found.pci, found.pid, found.process) == (xid, pci, pid, process)
    assert found.seq == 1234 and found.timestamp_us == 5678901
    assert found.message == message


@pytest.mark.parametrize(("line", "xid", "pci", "nvlink"), NVLINK_LINES)
def test_nvlink5_extended_form(line, xid, pci, nvlink):
    found = parse_xid_line(line)
    assert (found.xid, found.pci) == (xid, pci)
    assert {k: found.nvlink[k] for k in nvlink} == nvlink
    assert found.message == line.split(f"{xid}, ", 1)[1]
    assert found.to_payload()["nvlink"]["unit"] == nvlink["unit"]


@pytest.mark.parametrize(("line", "pci"), FALLEN_LINES)
def test_fallen_off_the_bus_without_an_xid_is_an_inferred_79(line, pci):
    found = parse_xid_line(line)
    assert found.xid == 79 and found.inferred and found.pci == pci
    assert "fallen off the bus" in found.message and "\n" not in found.message
    assert found.to_payload()["inferred"] is True


def test_the_multi_line_record_reads_as_one_sentence():
    found = parse_xid_line(FALLEN_LINES[2][0])
    assert found.message == (
        "The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has "
        "fallen off the bus and is not responding to commands."
    )
    assert found.seq == 812


@pytest.mark.parametrize("line", NOT_XIDS)
def test_lines_that_are_not_xids(line):
    assert parse_xid_line(line) is None


def test_the_minimal_kmsg_record_of_the_brief():
    found = parse_xid_line(
        "6,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
        "GPU has fallen off the bus."
    )
    assert found == XidLine(
        xid=79,
        message="GPU has fallen off the bus.",
        pci="0000:3b:00",
        pid=1234,
        process="python",
        seq=1234,
        timestamp_us=5678901,
    )
    assert found.to_payload() == {
        "xid": 79,
        "message": "GPU has fallen off the bus.",
        "origin": "kmsg",
        "pci": "0000:3b:00",
        "pid": 1234,
        "process": "python",
        "seq": 1234,
    }


def test_the_pci_bus_id_names_the_gpu():
    gpus = {"00000000:3B:00.0": 0, "00000000:86:00.0": 1}  # as NVML spells them
    assert parse_xid_line("NVRM: Xid (PCI:0000:86:00): 48, Ch 00000008", gpus).gpu == 1
    assert parse_xid_line("NVRM: Xid (0000:3b:00): 48, x", gpus).gpu == 0
    assert parse_xid_line("NVRM: Xid (PCI:0000:af:00): 48, x", gpus).gpu is None
    assert parse_xid_line("NVRM: Xid (PCI:0000:af:00): 48, x").gpu is None


@pytest.mark.parametrize(
    ("line", "severity", "domain"),
    [
        # 13: a GPU kernel's fault, the program's, the driver's or the GPU's (i28k): evidence,
        # never a node's blame on its own
        (REAL_LINES[0][0], "warning", "unknown"),
        (REAL_LINES[3][0], "fatal", "hardware"),  # 79
        (REAL_LINES[6][0], "fatal", "driver"),  # 119: GSP firmware
        (FALLEN_LINES[2][0], "fatal", "hardware"),  # inferred 79
        (REAL_LINES[7][0], "fatal", "hardware"),  # 154: a reset is required
        (
            "NVRM: Xid (PCI:0000:0d:00): 154, GPU recovery action changed from 0x1 (GPU Reset "
            "Required) to 0x0 (None)",
            "warning",
            "unknown",  # nothing left to do: NVIDIA's IGNORE
        ),
        (NVLINK_LINES[0][0], "warning", "hardware"),  # 145: NVLink5, node-side though not fatal
    ],
)
def test_what_the_catalogue_makes_of_kernel_log_xids(line, severity, domain):
    from slurm_recovery.signals.xid import load_xid_catalogue

    found = parse_xid_line(line)
    info = load_xid_catalogue().assess(found.xid, found.message)
    assert (info.severity, info.fault_domain) == (severity, domain)


@pytest.mark.parametrize(
    ("given", "normal"),
    [
        ("00000000:3B:00.0", "0000:3b:00"),
        ("PCI:0000:3b:00", "0000:3b:00"),
        ("0000:3b:00.0", "0000:3b:00"),
        ("0019:01:00", "0019:01:00"),
        ("3b:00", None),
        ("not a bus id", None),
    ],
)
def test_normalize_pci_bus_id(given, normal):
    assert normalize_pci_bus_id(given) == normal


# ------------------------------------------------------------------ properties

TOKENS = st.sampled_from(
    [
        "NVRM",
        ": ",
        "Xid",
        " (",
        "PCI:",
        "0000:3b:00",
        ")",
        ": ",
        "79",
        ", ",
        "pid=",
        "name=",
        "'<unknown>'",
        "fallen off the bus",
        "GPU",
        "\\x0a",
        "\n",
        "6,12,34,-;",
        "Fatal",
        "Link",
        "0x1",
        "SXid",
        "é",
        "\x00",
    ]
)


def _allowed(text: str) -> bool:
    return ("NVRM" in text and "Xid" in text) or "fallen off the bus" in text


def _check(found: XidLine | None, text: str) -> None:
    if found is None:
        return
    assert _allowed(text), text
    assert isinstance(found.xid, int) and found.xid >= 0
    assert "\n" not in found.message
    assert found.pci is None or normalize_pci_bus_id(found.pci) == found.pci


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_never_raise_and_never_invent_an_xid(raw):
    _check(parse_xid_line(raw), raw.decode("utf-8", "replace"))


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=300))
def test_any_text_never_raises_and_never_invents_an_xid(text):
    _check(parse_xid_line(text), text)


@settings(max_examples=1000, deadline=None)
@given(st.lists(TOKENS, max_size=30).map("".join))
def test_near_misses_never_invent_an_xid(text):
    _check(parse_xid_line(text), text)


# ------------------------------------------------------------------ the source

GPUS = {"00000000:3B:00.0": 0, "00000000:86:00.0": 1}
BOOT_TIME = 1_700_000_000.0
NOW = 1_800_000_000.0


@pytest.fixture
def boot(tmp_path):
    path = tmp_path / "boot_id"
    path.write_text("5d3f6c9e-0a4b-4c1e-9d7e-1f2a3b4c5d6e\n")
    return path


def make(tmp_path, boot, device, **kwargs) -> KmsgSource:
    kwargs.setdefault("gpus", GPUS)
    return KmsgSource(
        tmp_path / "state", device=device, boot_id_path=boot, boot_time=BOOT_TIME, **kwargs
    )


def collect(source: KmsgSource, count: int, now: float = NOW, wait: float = 5.0) -> list:
    """Poll and commit, as the sidecar does, until ``count`` findings came (or ``wait``)."""
    found: list = []
    deadline = time.monotonic() + wait
    while len(found) < count and time.monotonic() < deadline:
        batch = source.poll(now)
        if batch:
            source.commit()
        found += batch
        time.sleep(0.02)
    return found


def quiet(source: KmsgSource, device: Path, now: float = NOW) -> list:
    """What the source reports once its reader has taken the device's last record (expected:
    nothing): a wait on the reader's progress, not a fixed time that nothing happened in."""
    records = [KMSG_RECORD.match(line) for line in device.read_text().splitlines()]
    last = max(int(r["seq"]) for r in records if r)
    wait_for(lambda: source._highest >= last, timeout=5, interval=0.01)
    return source.poll(now)


def ring(tmp_path) -> Path:
    device = tmp_path / "kmsg"
    device.write_bytes((DATA / "ring.kmsg").read_bytes())
    return device


def test_the_source_reads_a_ring_of_records(tmp_path, boot):
    device = ring(tmp_path)
    source = make(tmp_path, boot, device)
    try:
        found = collect(source, 5)
        assert source.name == "kmsg" and source.fast is True
        assert [(f.payload["xid"], f.gpu) for f in found] == [
            (13, None),
            (109, None),
            (79, 0),
            (154, 0),
            (79, 1),  # the multi-line record: inferred; the repeat for 3b:00 is dropped
        ]
        assert all(f.kind == "xid" and f.payload["origin"] == "kmsg" for f in found)
        assert [f.payload["seq"] for f in found] == [3990, 3991, 3993, 3995, 3996]
        assert found[2].observed_at == pytest.approx(BOOT_TIME + 258.429679)
        assert found[2].payload["pid"] == 1234 and found[2].payload["process"] == "python"
        assert found[4].payload["inferred"] is True
        assert found[4].to_event("n2")["gpu"] == 1
        assert quiet(source, device) == []
        assert source.status() == "ok"
    finally:
        source.close()


def test_a_restart_skips_what_was_reported(tmp_path, boot):
    device = ring(tmp_path)
    first = make(tmp_path, boot, device)
    assert len(collect(first, 5)) == 5
    first.close()
    cursor = json.loads((tmp_path / "state" / "kmsg-cursor.json").read_text())
    assert cursor == {"boot_id": boot.read_text().strip(), "seq": 3997}
    with device.open("a") as kmsg:  # the kernel logs more while no sidecar runs
        kmsg.write("4,3998,300000000,-;NVRM: Xid (PCI:0000:86:00): 48, pid=77, name=x, DBE\n")
    second = make(tmp_path, boot, device)  # reopening replays the whole ring
    try:
        found = collect(second, 1)
        assert [(f.payload["xid"], f.payload["seq"], f.gpu) for f in found] == [(48, 3998, 1)]
        assert quiet(second, device) == []
    finally:
        second.close()


def test_a_crash_before_the_batch_was_taken_replays_it(tmp_path, boot):
    device = ring(tmp_path)
    crashed = make(tmp_path, boot, device)
    try:
        found = collect_uncommitted(crashed, 5)
        assert crashed.poll(NOW) == found  # not committed: offered again, in order
        assert not (tmp_path / "state" / "kmsg-cursor.json").exists()
        again = make(tmp_path, boot, device)  # the sidecar died before its outbox had them
        assert len(collect(again, 5, now=NOW)) == 5  # at least once: nothing is lost
        again.close()
        third = make(tmp_path, boot, device)
        assert quiet(third, device) == []
        third.close()
    finally:
        crashed.close()


def collect_uncommitted(source: KmsgSource, count: int, wait: float = 5.0) -> list:
    found: list = []
    deadline = time.monotonic() + wait
    while len(found) < count and time.monotonic() < deadline:
        found = source.poll(NOW)
        time.sleep(0.02)
    return found


def test_after_a_reboot_the_old_cursor_means_nothing(tmp_path, boot):
    device = ring(tmp_path)
    first = make(tmp_path, boot, device)
    collect(first, 5)
    first.close()
    boot.write_text("0e2c7f51-77aa-4b43-8a11-9c0b5e6d7f80\n")  # a new boot: seqs restart
    second = make(tmp_path, boot, device)
    try:
        assert len(collect(second, 5)) == 5
    finally:
        second.close()


def test_a_damaged_cursor_file_means_reading_from_the_start(tmp_path, boot):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "kmsg-cursor.json").write_text("{not json")
    source = make(tmp_path, boot, ring(tmp_path))
    try:
        assert "unreadable" in source.status()
        assert len(collect(source, 5)) == 5  # and its commit saves a good cursor again
        assert source.status() == "ok"
    finally:
        source.close()


def test_a_fifo_delivers_records_as_they_are_written(tmp_path, boot):
    device = tmp_path / "kmsg.fifo"
    os.mkfifo(device)
    source = make(tmp_path, boot, device)
    writer = os.open(device, os.O_RDWR)  # never blocks, whether or not the reader is there
    try:
        os.write(writer, b"6,10,1000000,-;usb 1-1: new high-speed USB device\n")
        os.write(writer, b"4,11,2000000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fal")
        time.sleep(0.2)  # half a record: nothing yet
        os.write(writer, b"len off the bus.\n")
        found = collect(source, 1)
        assert [(f.payload["xid"], f.payload["seq"], f.gpu) for f in found] == [(79, 11, 0)]
        assert found[0].observed_at == pytest.approx(BOOT_TIME + 2.0)
        os.write(writer, b"4,12,3000000,-;NVRM: Xid (PCI:0000:86:00): 94, Contained ECC\n")
        assert [f.payload["xid"] for f in collect(source, 1)] == [94]
    finally:
        os.close(writer)
        source.close()


def test_observed_at_never_lies_in_the_future(tmp_path, boot):
    device = tmp_path / "kmsg"
    device.write_text("4,1,5000000,-;NVRM: Xid (PCI:0000:3b:00): 48, DBE\n")
    source = make(tmp_path, boot, device)
    try:
        (found,) = collect(source, 1, now=BOOT_TIME + 1.0)  # the record says +5 s
        assert found.observed_at == BOOT_TIME + 1.0
    finally:
        source.close()


def test_a_missing_device_is_reported_not_raised(tmp_path, boot):
    source = make(tmp_path, boot, tmp_path / "absent", reopen_interval=0.05)
    try:
        deadline = time.monotonic() + 2
        while source.status() == "ok" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "cannot open" in source.status()
        assert source.poll(NOW) == []
        (tmp_path / "absent").write_text("4,1,1,-;NVRM: Xid (PCI:0000:3b:00): 31, fault\n")
        assert [f.payload["xid"] for f in collect(source, 1)] == [31]  # it keeps trying
        assert source.status() == "ok"
    finally:
        source.close()


def test_the_gpu_map_can_come_later(tmp_path, boot):
    calls = {"n": 0}

    def inventory():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("NVML not up yet")
        return GPUS

    device = tmp_path / "kmsg"
    device.write_text("4,1,1,-;NVRM: Xid (PCI:0000:86:00): 48, DBE\n")
    source = make(tmp_path, boot, device, gpus=inventory)
    try:
        found = collect(source, 1)
        assert found[0].gpu is None and "GPU inventory unavailable" in source.status()
        source.set_gpus(GPUS)
        with device.open("a") as kmsg:
            kmsg.write("4,2,20000002,-;NVRM: Xid (PCI:0000:86:00): 48, DBE\n")  # 20 s on
        assert [f.gpu for f in collect(source, 1)] == [1]
    finally:
        source.close()


def test_an_inferred_79_alone_is_reported(tmp_path, boot):
    device = tmp_path / "kmsg"
    device.write_text("4,1,1,-;NVRM: GPU 0000:86:00.0: GPU has fallen off the bus.\n")
    source = make(tmp_path, boot, device)
    try:
        (found,) = collect(source, 1)
        assert found.payload["xid"] == 79 and found.payload["inferred"] and found.gpu == 1
    finally:
        source.close()


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="reading /dev/kmsg needs root")
def test_the_real_dev_kmsg(tmp_path):
    """The kernel's own ring buffer: records frame, the cursor saves, a restart skips."""
    first = KmsgSource(tmp_path)
    try:
        time.sleep(1.0)  # opening replays the ring
        found = first.poll(time.time())
        first.commit()
        assert all(f.kind == "xid" and f.observed_at <= time.time() for f in found)
        assert first.status() == "ok"
    finally:
        first.close()
    cursor = json.loads((tmp_path / "kmsg-cursor.json").read_text())
    assert cursor["seq"] > 0
    assert cursor["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    second = KmsgSource(tmp_path)
    try:
        time.sleep(1.0)
        replayed = [f for f in second.poll(time.time()) if f.payload["seq"] <= cursor["seq"]]
        assert replayed == []  # what the first one handed over is not reported again
    finally:
        second.close()
