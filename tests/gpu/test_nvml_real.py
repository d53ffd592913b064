"""The NVML backend against the real driver: run by tests/gpu/run.sh on a host with a GPU.

These check what the recorded fake cannot: that the real NVML's answers have the shapes the
backend expects, that a poll of every GPU fits in the timeout, and that a healthy GPU gives
no fatal finding. Each prints what it saw, so the run's log documents the host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from slurm_recovery.sidecar.base import GPU_CHECKS
from slurm_recovery.sidecar.gpu import GpuBackend, pci_index
from slurm_recovery.sidecar.gpu.nvml import NvmlBackend
from slurm_recovery.sidecar.sources.kmsg import KmsgSource
from slurm_recovery.signals.xid import normalize_pci_bus_id, parse_xid_line

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def backend(pynvml):
    b = NvmlBackend(expected_gpus=0, timeout=TIMEOUT)
    yield b
    b.close()


@pytest.fixture(scope="module")
def polled(backend):
    """Two polls ten seconds apart (counters need a baseline), with their durations."""
    took = []
    findings = []
    for step in range(2):
        if step:
            time.sleep(10)
        started = time.monotonic()
        findings += backend.poll(time.time())
        took.append(time.monotonic() - started)
    print(f"\npoll durations: {', '.join(f'{t * 1000:.1f} ms' for t in took)}")
    for finding in findings:
        print(f"finding: gpu={finding.gpu} {dict(finding.payload)}")
    return findings, took


def test_inventory_is_sane(backend, pynvml):
    assert isinstance(backend, GpuBackend)
    gpus = backend.inventory()
    print(f"\ndriver {pynvml.nvmlSystemGetDriverVersion()}, {len(gpus)} GPU(s)")
    for gpu in gpus:
        print(f"  {gpu}")
    assert len(gpus) > 0
    assert len(gpus) == pynvml.nvmlDeviceGetCount()
    assert [g.index for g in gpus] == list(range(len(gpus)))
    for gpu in gpus:
        assert gpu.uuid.startswith(("GPU-", "MIG-")), gpu.uuid
        assert normalize_pci_bus_id(gpu.pci_bus_id) is not None, gpu.pci_bus_id
        assert gpu.name
    assert len({g.uuid for g in gpus}) == len(gpus)
    assert len(pci_index(gpus)) == len(gpus)


def test_inventory_agrees_with_nvidia_smi(backend):
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not on PATH")
    out = subprocess.run(
        [smi, "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    rows = [[part.strip() for part in line.split(",")] for line in out.splitlines() if line]
    seen = {int(i): (uuid, normalize_pci_bus_id(bus)) for i, uuid, bus in rows}
    mine = {g.index: (g.uuid, normalize_pci_bus_id(g.pci_bus_id)) for g in backend.inventory()}
    assert mine == seen


def test_the_first_poll_sends_the_inventory(polled, backend):
    findings, _ = polled
    (inventory,) = [f for f in findings if f.kind == "gpu_inventory"]
    assert len(inventory.payload["gpus"]) == len(backend.inventory())
    assert inventory.payload["expected"] == len(backend.inventory())


def test_a_poll_returns_within_the_timeout(polled):
    _, took = polled
    assert max(took) < TIMEOUT


def test_a_healthy_gpu_has_no_fatal_finding(polled, backend):
    findings, _ = polled
    for finding in findings:
        if finding.kind != "gpu_finding":
            continue
        assert finding.payload["check"] in GPU_CHECKS
        assert finding.payload["severity"] != "fatal", finding
        assert finding.payload["check"] != "nvml_error", finding  # every call answered
    assert not backend.degraded and backend.status() == "ok"


def test_telemetry_values_are_in_range(polled, backend):
    readings = backend.telemetry()
    assert sorted(readings) == [g.index for g in backend.inventory()]
    for index, reading in readings.items():
        print(f"\nGPU {index}: {reading}")
        assert "lost" not in reading
        if "temperature_c" in reading:
            assert 0 <= reading["temperature_c"] <= 120
        if "power_w" in reading:
            assert 0 <= reading["power_w"] <= 2000
        for key in ("utilization_gpu", "utilization_memory"):
            if key in reading:
                assert 0 <= reading[key] <= 100
        if "memory_total_bytes" in reading:
            assert reading["memory_total_bytes"] > 1 << 30
            assert 0 <= reading["memory_used_bytes"] <= reading["memory_total_bytes"]
        pcie = reading.get("pcie", {})
        if "gen" in pcie:
            assert 1 <= pcie["gen"] <= pcie.get("max_gen", 7) <= 7
        if "width" in pcie:
            assert pcie["width"] in (1, 2, 4, 8, 16, 32)
        ecc = reading.get("ecc", {})
        assert all(value >= 0 for value in ecc.values())
        nvlink = reading.get("nvlink")
        if nvlink:
            assert set(nvlink["active"]) <= set(range(nvlink["links"]))
        assert int(reading.get("clock_event_reasons", "0x0"), 16) >= 0


def test_kernel_log_xids_name_these_gpus(backend):
    """A driver XID line, written the way the driver spells each GPU's bus id, maps to it."""
    table = pci_index(backend.inventory())
    for gpu in backend.inventory():
        domain, bus, device = normalize_pci_bus_id(gpu.pci_bus_id).split(":")
        line = f"4,1,1,-;NVRM: Xid (PCI:{domain}:{bus}:{device}): 79, GPU has fallen off the bus."
        assert parse_xid_line(line, table).gpu == gpu.index


def test_the_real_kernel_log_can_be_read(tmp_path, backend):
    if os.geteuid() != 0 or not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("reading /dev/kmsg needs root")
    source = KmsgSource(tmp_path, gpus=pci_index(backend.inventory()))
    try:
        time.sleep(1.0)  # the ring buffer replays on open
        found = source.poll(time.time())
        print(f"\n{len(found)} XID(s) in this boot's kernel log")
        for finding in found:
            print(f"  gpu={finding.gpu} {dict(finding.payload)}")
            assert finding.kind == "xid" and finding.observed_at <= time.time()
        assert source.status() == "ok"
    finally:
        source.close()
    assert (tmp_path / "kmsg-cursor.json").exists()  # the ring always holds records
