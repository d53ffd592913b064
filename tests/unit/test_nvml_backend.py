"""The NVML backend's translation of NVML readings into findings, against a recorded fake.

The fake is tests/unit/nvml_model/fake_pynvml.py (nvidia-ml-py 13.615.71's names and value
shapes), monkeypatched in as ``pynvml``. The real NVML runs in tests/gpu (tests/gpu/run.sh).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from pathlib import Path

import pytest

from slurm_recovery.sidecar.base import GPU_CHECKS, Finding
from slurm_recovery.sidecar.gpu import GpuBackend, GpuInfo, pci_index
from slurm_recovery.sidecar.gpu.driver import DriverFiles
from slurm_recovery.sidecar.gpu.nvml import NvmlBackend


def _load_model():
    path = Path(__file__).parent / "nvml_model" / "fake_pynvml.py"
    spec = importlib.util.spec_from_file_location("fake_pynvml", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_pynvml"] = module
    spec.loader.exec_module(module)
    return module


model = _load_model()


def two_gpus() -> list:
    return [
        model.FakeGpu(
            uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000", pci_bus_id="00000000:3B:00.0"
        ),
        model.FakeGpu(
            uuid="GPU-bbbbbbbb-0000-0000-0000-000000000001", pci_bus_id="00000000:86:00.0"
        ),
    ]


@pytest.fixture(autouse=True)
def no_host_driver_files(monkeypatch, tmp_path):
    """Backends made without ``driver_files`` read none of this host's driver files."""
    from slurm_recovery.sidecar.gpu import nvml as nvml_module

    absent = str(tmp_path / "no-driver")
    monkeypatch.setattr(
        nvml_module,
        "DriverFiles",
        lambda: DriverFiles(proc_version=absent, library_dirs=(), maps=None),
    )


@pytest.fixture
def world(monkeypatch):
    w = model.World(gpus=two_gpus())
    monkeypatch.setitem(sys.modules, "pynvml", model.build(w))
    return w


@pytest.fixture
def backend(world):
    b = NvmlBackend(expected_gpus=2, timeout=0.5)
    yield b
    for event in world.hang.values():
        event.set()
    b.close()


def checks(findings: list[Finding]) -> list[tuple[str, int | None, str]]:
    return [
        (f.payload["check"], f.gpu, f.payload["severity"])
        for f in findings
        if f.kind == "gpu_finding"
    ]


def settle(backend: NvmlBackend, start: float = 1000.0) -> float:
    """First poll (inventory and baselines); returns the next poll time."""
    first = backend.poll(start)
    assert [f.kind for f in first] == ["gpu_inventory"], first
    return start + 10


# ------------------------------------------------------------------ the model itself


def test_the_fake_matches_the_installed_nvidia_ml_py():
    real = pytest.importorskip("pynvml")
    fake = model.build(model.World())
    for name in model.FUNCTIONS:
        assert callable(getattr(real, name, None)), f"pynvml has no {name}"
    for name, value in model.CONSTANTS.items():
        assert getattr(real, name) == value, name
    for code in (3, 9, 13, 15, 18, 999):
        assert type(real.NVMLError(code)).__name__ == type(fake.NVMLError(code)).__name__
        assert str(fake.NVMLError(code)) == real.NVMLError._errcode_to_string.get(code, "?")


# ------------------------------------------------------------------ inventory


def test_inventory_and_first_poll(backend, world):
    assert isinstance(backend, GpuBackend)
    assert backend.name == "nvml" and backend.fast is False
    gpus = backend.inventory()
    assert gpus == [
        GpuInfo(
            0, world.gpus[0].uuid, "00000000:3B:00.0", "NVIDIA H100 80GB HBM3", "1650923000001"
        ),
        GpuInfo(
            1, world.gpus[1].uuid, "00000000:86:00.0", "NVIDIA H100 80GB HBM3", "1650923000001"
        ),
    ]
    assert pci_index(gpus) == {"0000:3b:00": 0, "0000:86:00": 1}
    (inventory,) = backend.poll(1000.0)  # the inventory made by inventory() comes now
    assert inventory.kind == "gpu_inventory"
    assert inventory.payload["expected"] == 2
    assert [g["uuid"] for g in inventory.payload["gpus"]] == [g.uuid for g in world.gpus]
    assert backend.poll(1010.0) == []  # a healthy node: nothing to say
    assert backend.status() == "ok" and not backend.degraded


def test_expected_zero_takes_the_first_inventory(world):
    b = NvmlBackend(expected_gpus=0, timeout=0.5)
    try:
        (inventory,) = b.poll(1.0)
        assert inventory.payload["expected"] == 2
    finally:
        b.close()


def test_telemetry_is_kept_out_of_findings(backend, world):
    world.gpus[0].utilization = (97, 40)
    world.gpus[0].temperature = 77
    settle(backend)
    reading = backend.telemetry()[0]
    assert reading["temperature_c"] == 77
    assert reading["power_w"] == 118.0
    assert reading["utilization_gpu"] == 97 and reading["utilization_memory"] == 40
    assert reading["memory_used_bytes"] <= reading["memory_total_bytes"]
    assert reading["pcie"] == {
        "replay_counter": 0,
        "gen": 5,
        "max_gen": 5,
        "width": 16,
        "max_width": 16,
    }
    assert reading["ecc"]["volatile_dbe"] == 0
    assert reading["nvlink"]["links"] == 18 and len(reading["nvlink"]["active"]) == 18
    assert reading["remapped_rows"]["failure"] is False
    assert reading["conditions"] == []


# ------------------------------------------------------------------ ECC, pages, rows


def test_a_double_bit_error_increase_is_fatal(backend, world):
    now = settle(backend)
    world.gpus[1].volatile_dbe = 2
    world.gpus[1].aggregate_dbe = 5
    found = backend.poll(now)
    assert checks(found) == [("ecc_dbe", 1, "fatal")]
    assert "0 -> 2" in found[0].payload["detail"] and found[0].payload["count"] == 2
    assert backend.poll(now + 10) == []  # no new errors: no new finding
    world.gpus[1].volatile_dbe = 3
    found = backend.poll(now + 20)
    assert checks(found) == [("ecc_dbe", 1, "fatal")]  # worse: said again
    assert "2 -> 3" in found[0].payload["detail"]
    world.gpus[1].volatile_dbe = 0  # a GPU reset clears the volatile counters
    found = backend.poll(now + 30)
    assert checks(found) == [("ecc_dbe", 1, "info")] and found[0].payload["cleared"] is True


def test_double_bit_errors_since_driver_load_count_at_start(world):
    world.gpus[0].volatile_dbe = 1
    b = NvmlBackend(expected_gpus=2, timeout=0.5)
    try:
        assert checks(b.poll(1.0)) == [("ecc_dbe", 0, "fatal")]
    finally:
        b.close()


def test_aggregate_history_alone_is_not_a_finding(world):
    world.gpus[0].aggregate_dbe = 7  # an old, repaired error: volatile is 0
    b = NvmlBackend(expected_gpus=2, timeout=0.5)
    try:
        assert checks(b.poll(1.0)) == []
    finally:
        b.close()


def test_a_corrected_error_storm_is_a_warning(backend, world):
    now = settle(backend)
    world.gpus[0].volatile_sbe = 50
    assert checks(backend.poll(now)) == []
    world.gpus[0].volatile_sbe = 500
    assert checks(backend.poll(now + 10)) == [("ecc_sbe_storm", 0, "warning")]


def test_pending_retirement_and_remaps(backend, world):
    now = settle(backend)
    world.gpus[0].retired_pending = 1
    world.gpus[0].retired_dbe = [0x1000]
    world.gpus[1].remapped_rows = (0, 1, 1, 0)
    assert sorted(checks(backend.poll(now))) == [
        ("remap_pending", 1, "warning"),
        ("retired_pages_pending", 0, "warning"),
    ]
    assert backend.telemetry()[0]["retired_pages"] == {"pending": True, "sbe": 0, "dbe": 1}
    world.gpus[1].remapped_rows = (0, 1, 1, 1)
    assert checks(backend.poll(now + 10)) == [("remap_failure", 1, "fatal")]
    assert backend.telemetry()[1]["conditions"] == ["remap_failure", "remap_pending"]


# ------------------------------------------------------------------ lost GPUs


def test_a_gpu_missing_from_the_count_is_lost(backend, world):
    now = settle(backend)
    world.visible = 1  # GPU 1 no longer enumerates
    found = backend.poll(now)
    lost = [f for f in found if f.kind == "gpu_finding"]
    assert checks(lost) == [("gpu_lost", None, "fatal")]  # a condition of the node
    assert "NVML sees 1 GPUs, the node should have 2 (gone: GPU 1)" in lost[0].payload["detail"]
    assert lost[0].payload["gone"] == [1]
    assert [f.kind for f in found if f.kind != "gpu_finding"] == ["gpu_inventory"]
    assert checks(backend.poll(now + 10)) == []  # reported once, not every poll
    world.visible = 2
    found = backend.poll(now + 20)
    assert checks(found) == [("gpu_lost", None, "info")]
    cleared = next(f for f in found if f.kind == "gpu_finding")
    assert cleared.payload["cleared"] is True


def test_a_gpu_that_says_lost_is_lost(backend, world):
    now = settle(backend)
    world.gpus[0].lost = True
    assert checks(backend.poll(now)) == [("gpu_lost", 0, "fatal")]
    assert backend.poll(now + 10) == []  # said once; the inventory keeps the lost GPU
    assert [g.index for g in backend.inventory()] == [0, 1]  # its XIDs still name it
    assert backend.telemetry()[0] == {"lost": True}
    assert backend.telemetry()[1]["temperature_c"] == 41  # the other GPU is still polled
    world.gpus[0].lost = False  # back (after a reset): cleared; it can be lost again later
    assert checks(backend.poll(now + 20)) == [("gpu_lost", 0, "info")]
    world.gpus[0].lost = True
    assert checks(backend.poll(now + 30)) == [("gpu_lost", 0, "fatal")]


def test_fewer_gpus_than_expected_at_start(world):
    b = NvmlBackend(expected_gpus=8, timeout=0.5)
    try:
        assert checks(b.poll(1.0)) == [("gpu_lost", None, "fatal")]
    finally:
        b.close()


# ------------------------------------------------------------------ throttling, PCIe


def test_thermal_throttling_is_debounced_and_edge_triggered(backend, world):
    now = settle(backend)
    world.gpus[0].clock_reasons = 0x40  # HW thermal slowdown
    assert checks(backend.poll(now)) == []  # one poll could be a transient
    assert checks(backend.poll(now + 10)) == [("throttle_thermal", 0, "warning")]
    assert checks(backend.poll(now + 20)) == []  # still throttling: already said
    world.gpus[0].clock_reasons = 0
    found = backend.poll(now + 30)
    assert checks(found) == [("throttle_thermal", 0, "info")]
    assert found[0].payload["cleared"] is True
    assert found[0].payload["detail"].startswith("cleared: thermal slowdown engaged")
    world.gpus[0].clock_reasons = 0x80 | 0x8  # power brake (with the HW slowdown bit)
    backend.poll(now + 40)
    assert sorted(checks(backend.poll(now + 50))) == [
        ("throttle_hw_slowdown", 0, "warning"),
        ("throttle_power_brake", 0, "warning"),
    ]


def test_clock_event_reasons_fall_back_to_throttle_reasons(world, monkeypatch):
    world.missing = {"nvmlDeviceGetCurrentClocksEventReasons"}  # an older nvidia-ml-py
    monkeypatch.setitem(sys.modules, "pynvml", model.build(world))
    b = NvmlBackend(expected_gpus=2, timeout=0.5, debounce=1)
    try:
        b.poll(1.0)
        world.gpus[1].clock_reasons = 0x20
        assert checks(b.poll(2.0)) == [("throttle_thermal", 1, "warning")]
        assert world.count("nvmlDeviceGetCurrentClocksThrottleReasons") >= 2
    finally:
        b.close()


def test_a_narrower_pcie_link_is_a_downgrade(backend, world):
    now = settle(backend)
    world.gpus[0].pcie = (5, 5, 8, 16)
    backend.poll(now)
    found = backend.poll(now + 10)
    assert checks(found) == [("pcie_link_downgrade", 0, "warning")]
    assert "Gen5 x8, maximum Gen5 x16" in found[0].payload["detail"]


def test_a_slower_pcie_generation_counts_only_when_busy(backend, world):
    now = settle(backend)
    world.gpus[1].pcie = (1, 5, 16, 16)  # idle GPUs drop to Gen1 to save power
    backend.poll(now)
    assert checks(backend.poll(now + 10)) == []
    world.gpus[1].utilization = (95, 60)
    backend.poll(now + 20)
    assert checks(backend.poll(now + 30)) == [("pcie_link_downgrade", 1, "warning")]


def test_pcie_replays_rising(backend, world):
    now = settle(backend)
    world.gpus[0].pcie_replay = 3
    assert checks(backend.poll(now)) == []
    world.gpus[0].pcie_replay = 40
    assert checks(backend.poll(now + 10)) == [("pcie_replay_rising", 0, "warning")]
    world.gpus[0].pcie_replay = 80  # rising again within repeat_after: not repeated
    assert checks(backend.poll(now + 20)) == []


# ------------------------------------------------------------------ NVLink


def test_a_link_that_was_up_and_went_down(backend, world):
    now = settle(backend)
    world.gpus[0].nvlink_states[5] = 0
    assert checks(backend.poll(now)) == []
    found = backend.poll(now + 10)
    assert checks(found) == [("nvlink_down", 0, "fatal")]
    assert found[0].payload["links"] == [5]
    world.gpus[0].nvlink_states[6] = 0  # worse: reported again at once (it already held)
    found = backend.poll(now + 30)
    assert checks(found) == [("nvlink_down", 0, "fatal")] and found[0].payload["links"] == [5, 6]
    world.gpus[0].nvlink_states[5] = world.gpus[0].nvlink_states[6] = 1
    assert checks(backend.poll(now + 40)) == [("nvlink_down", 0, "info")]


def test_a_link_down_at_start_while_its_peers_are_up(world):
    world.gpus[1].nvlink_states[3] = 0
    b = NvmlBackend(expected_gpus=2, timeout=0.5, debounce=1)
    try:
        assert checks(b.poll(1.0)) == [("nvlink_down", 1, "fatal")]
    finally:
        b.close()


def test_gpus_without_nvlink_say_nothing_about_it(world):
    for gpu in world.gpus:
        gpu.nvlink_states = []
        gpu.unsupported.add("nvmlDeviceGetFieldValues")
    b = NvmlBackend(expected_gpus=2, timeout=0.5)
    try:
        b.poll(1.0)
        assert checks(b.poll(11.0)) == []
        assert "nvlink" not in b.telemetry()[0]
    finally:
        b.close()


def test_nvlink_errors_rising_name_the_link(backend, world):
    now = settle(backend)
    gpu = world.gpus[1]
    gpu.nvlink_totals[38] = 500  # CRC flit errors, all links
    gpu.nvlink_counters[(7, 2)] = 500  # ... on link 7
    found = backend.poll(now)
    assert checks(found) == [("nvlink_errors_rising", 1, "warning")]
    assert "crc_flit +500" in found[0].payload["detail"]
    gpu.nvlink_totals[59] = 1  # one recovery: a retrained link
    gpu.nvlink_counters[(7, 1)] = 1
    assert checks(backend.poll(now + 10)) == []  # within repeat_after
    assert checks(backend.poll(now + 400)) == []  # nothing new since the last poll


def test_nvlink_recovery_is_reported_at_once(backend, world):
    now = settle(backend)
    backend.poll(now)  # per-link counters get their baseline when a total first rises
    world.gpus[0].nvlink_totals[59] = 1
    world.gpus[0].nvlink_counters[(2, 1)] = 1
    found = backend.poll(now + 10)
    assert checks(found) == [("nvlink_errors_rising", 0, "warning")]
    assert "recovery +1" in found[0].payload["detail"]


# ------------------------------------------------------------------ NVML's own trouble


def test_not_supported_metrics_are_skipped_quietly(world, monkeypatch):
    for gpu in world.gpus:  # e.g. a GeForce card: no ECC, no remapping, no serial
        gpu.unsupported |= {
            "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetRemappedRows",
            "nvmlDeviceGetRetiredPagesPendingStatus",
            "nvmlDeviceGetSerial",
        }
    b = NvmlBackend(expected_gpus=2, timeout=0.5)
    try:
        first = b.poll(1.0)
        assert [f.kind for f in first] == ["gpu_inventory"]
        assert first[0].payload["gpus"][0]["serial"] == ""
        assert b.poll(11.0) == []
        assert "ecc" not in b.telemetry()[0]
        # asked once per GPU, then remembered as not supported
        assert world.count("nvmlDeviceGetRemappedRows") == 2
    finally:
        b.close()


def test_another_nvml_error_is_reported_once_and_never_raised(backend, world):
    now = settle(backend)
    world.gpus[0].fail["nvmlDeviceGetPowerUsage"] = 999
    found = backend.poll(now)
    assert checks(found) == [("nvml_error", 0, "warning")]
    assert (
        "nvmlDeviceGetPowerUsage failed: NVMLError_Unknown: Unknown Error"
        in (found[0].payload["detail"])
    )
    assert backend.poll(now + 10) == []  # same error: said already
    del world.gpus[0].fail["nvmlDeviceGetPowerUsage"]
    assert checks(backend.poll(now + 20)) == [("nvml_error", 0, "info")]  # cleared
    world.gpus[0].fail["nvmlDeviceGetPowerUsage"] = 999
    assert checks(backend.poll(now + 30)) == [("nvml_error", 0, "warning")]


def test_nvml_missing_is_reported_not_raised(world):
    world.init_error = 12  # NVML_ERROR_LIBRARY_NOT_FOUND
    b = NvmlBackend(expected_gpus=2, timeout=0.5)
    try:
        assert b.inventory() == []
        found = b.poll(1.0)
        assert checks(found) == [("nvml_error", None, "warning")]
        assert "NVML Shared Library Not Found" in found[0].payload["detail"]
        assert b.poll(11.0) == []  # the same failure is not repeated
        assert b.degraded and "degraded" in b.status()
        world.init_error = None  # the driver got loaded: NVML comes up by itself
        found = b.poll(21.0)
        assert [f.kind for f in found] == ["gpu_finding", "gpu_inventory"]
        assert checks(found) == [("nvml_error", None, "info")]  # the failure is cleared
        assert not b.degraded
    finally:
        b.close()


def test_a_hung_call_becomes_a_finding_within_the_timeout(backend, world):
    now = settle(backend)
    release = threading.Event()
    world.hang["nvmlDeviceGetPowerUsage"] = release
    started = time.monotonic()
    found = backend.poll(now)
    took = time.monotonic() - started
    assert took < 0.5 + 0.4, took  # one timeout, not one per GPU or per call
    assert checks(found) == [("nvml_error", 0, "warning")]  # names the GPU it asked about
    assert "nvmlDeviceGetPowerUsage did not return within 0.5 s" in found[0].payload["detail"]
    assert backend.degraded and "has not returned" in backend.status()
    calls = len(world.calls)
    started = time.monotonic()
    assert backend.poll(now + 10) == []  # degraded: NVML is left alone
    assert time.monotonic() - started < 0.1
    assert len(world.calls) == calls
    assert backend.inventory()  # the last inventory, without calling NVML
    del world.hang["nvmlDeviceGetPowerUsage"]
    release.set()
    deadline = time.monotonic() + 2
    while backend.degraded and time.monotonic() < deadline:
        found = backend.poll(now + 20)
        if found:
            break
        time.sleep(0.01)
    assert checks(found) == [("nvml_error", None, "info")]
    assert "answers again" in found[0].payload["detail"]
    assert not backend.degraded
    assert backend.poll(now + 30) == []


def test_a_hung_nvml_init_does_not_block(world):
    release = threading.Event()
    world.hang["nvmlInit"] = release
    b = NvmlBackend(expected_gpus=2, timeout=0.3)
    try:
        started = time.monotonic()
        found = b.poll(1.0)
        assert time.monotonic() - started < 0.8
        assert checks(found) == [("nvml_error", None, "warning")]
        assert b.degraded
    finally:
        release.set()
        b.close()


def test_every_finding_is_a_known_gpu_check(backend, world):
    now = settle(backend)
    world.gpus[0].volatile_dbe = 1
    world.gpus[0].clock_reasons = 0xFF
    world.gpus[1].lost = True
    found = backend.poll(now) + backend.poll(now + 10)
    for finding in found:
        assert finding.kind == "gpu_finding"
        assert finding.payload["check"] in GPU_CHECKS
        assert finding.payload["detail"]
        event = finding.to_event("n1")
        assert event["node"] == "n1" and event["payload"]["severity"] in ("fatal", "warning")


def test_close_shuts_nvml_down(world):
    b = NvmlBackend(expected_gpus=2, timeout=0.5)
    b.poll(1.0)
    b.close()
    assert world.count("nvmlShutdown") == 1


def test_without_nvidia_ml_py_the_backend_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    b = NvmlBackend(expected_gpus=1, timeout=0.5)
    try:
        found = b.poll(1.0)
        assert checks(found) == [("nvml_error", None, "warning")]
        assert "nvidia-ml-py is not installed" in found[0].payload["detail"]
    finally:
        b.close()


# ------------------------------------------------------------------ the driver's version mismatch


def _real_pynvml():
    """The installed nvidia-ml-py (it imports without a GPU): its own exception classes."""
    return pytest.importorskip("pynvml")


def test_the_installed_nvidia_ml_py_names_the_mismatch_as_the_backend_reads_it():
    real = _real_pynvml()
    assert real.NVML_ERROR_LIB_RM_VERSION_MISMATCH == 18
    assert real.NVML_ERROR_DRIVER_NOT_LOADED == 9
    error = real.NVMLError(real.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    assert type(error) is real.NVMLError_LibRmVersionMismatch and error.value == 18
    assert isinstance(error, real.NVMLError)


class _RealInitError:
    """A pynvml whose ``nvmlInit`` raises the installed nvidia-ml-py's own exception for
    ``code`` (``NVMLError(code)``: the subclass, with ``.value``), as the real one does on a
    host whose libnvidia-ml and kernel module differ; constants are the installed ones."""

    def __init__(self, code):
        self._real = _real_pynvml()
        self.NVMLError = self._real.NVMLError
        self.code = code
        self.calls = 0

    def __getattr__(self, name):
        if name.startswith("NVML"):
            return getattr(self._real, name)
        raise AttributeError(name)

    def nvmlInit(self):
        self.calls += 1
        raise self._real.NVMLError(self.code)


def test_the_real_mismatch_exception_at_init_is_a_fatal_finding_of_the_node():
    nvml = _RealInitError(_real_pynvml().NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    b = NvmlBackend(expected_gpus=2, timeout=0.5, nvml=nvml, repeat_after=300.0)
    try:
        found = b.poll(1000.0)
        assert checks(found) == [("driver_version_mismatch", None, "fatal")]
        detail = found[0].payload["detail"]
        assert "NVMLError_LibRmVersionMismatch" in detail and "rebooted" in detail
        assert found[0].payload["call"] == "nvmlInit"
        assert b.degraded and "LibRmVersionMismatch" in b.status()
        assert b.poll(1010.0) == [] and nvml.calls == 2  # retried every poll, said once
        # lasting: again every repeat_after, so a later failure has it in its window
        assert checks(b.poll(1300.0)) == [("driver_version_mismatch", None, "fatal")]
        assert b.poll(1310.0) == []
    finally:
        b.close()


def test_the_mismatch_clears_when_a_later_init_succeeds(world):
    world.init_error = 18  # the model's NVMLError_LibRmVersionMismatch (checked above)
    b = NvmlBackend(expected_gpus=2, timeout=0.5)
    try:
        assert checks(b.poll(1000.0)) == [("driver_version_mismatch", None, "fatal")]
        assert b.poll(1010.0) == []
        world.init_error = None  # rebooted (or the module reloaded): the next init succeeds
        found = b.poll(1020.0)
        assert [f.kind for f in found] == ["gpu_finding", "gpu_inventory"]
        assert checks(found) == [("driver_version_mismatch", None, "info")]
        assert found[0].payload["cleared"] is True
        assert not b.degraded
        assert b.poll(1030.0) == []
        world.init_error = 18  # initialized: NVML is not initialized again, nothing to say
        assert b.poll(1040.0) == []
    finally:
        b.close()


def test_the_mismatch_is_kept_in_the_health_file_until_nvml_answers(tmp_path, world):
    from slurm_recovery.sidecar.daemon import Health

    assert GPU_CHECKS["driver_version_mismatch"] == "fatal"
    health = Health(tmp_path / "health.json", "n1", boot_id="boot-1")
    world.init_error = 18
    b = NvmlBackend(expected_gpus=2, timeout=0.5)
    try:
        assert health.observe(b.poll(1.0))
        assert list(health.open) == [("driver_version_mismatch", None)]
        health.write(2.0)
    finally:
        b.close()
    # a sidecar restarted in the same boot after the module was reloaded: its first
    # successful init sends an inventory, which ends its predecessor's mismatch
    again = Health(tmp_path / "health.json", "n1", boot_id="boot-1")
    assert list(again.open) == [("driver_version_mismatch", None)]
    world.init_error = None
    fresh = NvmlBackend(expected_gpus=2, timeout=0.5)
    try:
        found = fresh.poll(3.0)
        assert checks(found) == []  # this process never saw the mismatch
        assert again.observe(found) and again.open == {}
    finally:
        fresh.close()
    # a reboot forgets it too (another boot id)
    assert Health(tmp_path / "health.json", "n1", boot_id="boot-2").open == {}


@pytest.mark.parametrize(
    "code",
    [9, 4, 12, 999],  # DRIVER_NOT_LOADED, NO_PERMISSION, LIBRARY_NOT_FOUND, UNKNOWN
)
def test_other_init_failures_stay_nvml_errors(code):
    b = NvmlBackend(expected_gpus=2, timeout=0.5, nvml=_RealInitError(code))
    try:
        assert checks(b.poll(1.0)) == [("nvml_error", None, "warning")]
    finally:
        b.close()


def test_a_hung_init_or_a_missing_pynvml_is_never_the_mismatch(world, monkeypatch):
    release = threading.Event()
    world.hang["nvmlInit"] = release
    world.init_error = 18  # what the init would say once it returns: not yet known
    b = NvmlBackend(expected_gpus=2, timeout=0.3)
    try:
        found = b.poll(1.0) + b.poll(11.0) + b.poll(400.0)
        assert {c for c, _, _ in checks(found)} == {"nvml_error"}
        assert all(f.payload["severity"] != "fatal" for f in found)
    finally:
        release.set()
        b.close()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    b = NvmlBackend(expected_gpus=2, timeout=0.5)
    try:
        assert checks(b.poll(1.0)) == [("nvml_error", None, "warning")]
    finally:
        b.close()


# ------------------------------------------------------------------ the versions in the files


MODULE_LINE = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {}  Release Build  (b@h)\n"


class _Host:
    """The node's driver files: the loaded module's version line and the libnvidia-ml.so.1
    link a new process would follow, changed as a driver upgrade and a reboot change them."""

    def __init__(self, root: Path, module: str | None, library: str | None) -> None:
        self.proc = root / "version"
        self.lib = root / "lib"
        self.lib.mkdir()
        self.files = DriverFiles(
            proc_version=str(self.proc), library_dirs=(str(self.lib),), maps=None
        )
        self.set(module, library)

    def set(self, module: str | None, library: str | None) -> None:
        if module is None:
            self.proc.unlink(missing_ok=True)
        else:
            self.proc.write_text(MODULE_LINE.format(module) + "GCC version:  gcc 12.3.0\n")
        link = self.lib / "libnvidia-ml.so.1"
        link.unlink(missing_ok=True)
        if library is not None:
            (self.lib / f"libnvidia-ml.so.{library}").write_bytes(b"\x7fELF")
            link.symlink_to(f"libnvidia-ml.so.{library}")


def mismatch_findings(found: list[Finding]) -> list[tuple[str, bool]]:
    return [
        (f.payload["severity"], bool(f.payload.get("cleared")))
        for f in found
        if f.kind == "gpu_finding" and f.payload["check"] == "driver_version_mismatch"
    ]


def test_a_running_backend_sees_the_upgrade_in_the_files_reports_repeats_and_clears(
    tmp_path, world
):
    host = _Host(tmp_path, "550.54.15", "550.54.15")
    b = NvmlBackend(expected_gpus=2, timeout=0.5, repeat_after=300.0, driver_files=host.files)
    try:
        now = settle(b)  # agreeing versions: the inventory only
        assert b.poll(now) == []
        # the package upgraded under the running sidecar: NVML itself still answers
        host.set("550.54.15", "555.42.02")
        found = b.poll(now + 10)
        assert checks(found) == [("driver_version_mismatch", None, "fatal")]
        payload = found[0].payload
        assert payload["call"] == "driver_files"
        assert (payload["module_version"], payload["library_version"]) == (
            "550.54.15",
            "555.42.02",
        )
        detail = payload["detail"]
        for part in ("550.54.15", "555.42.02", str(host.proc), str(host.lib), "rebooted"):
            assert part in detail
        assert not b.degraded and b.status() == "ok"  # NVML works: only new processes fail
        assert b.poll(now + 20) == [] and b.poll(now + 300) == []  # once per repeat_after
        assert checks(b.poll(now + 310)) == [("driver_version_mismatch", None, "fatal")]
        # GPU findings go on meanwhile
        world.gpus[0].volatile_dbe = 1
        assert checks(b.poll(now + 320)) == [("ecc_dbe", 0, "fatal")]
        world.gpus[0].volatile_dbe = 0
        assert checks(b.poll(now + 330)) == [("ecc_dbe", 0, "info")]
        # the module reloaded (or the node rebooted into the new one): cleared, once
        host.set("555.42.02", "555.42.02")
        found = b.poll(now + 340)
        assert mismatch_findings(found) == [("info", True)]
        assert found[-1].payload["call"] == "driver_files"
        assert mismatch_findings(b.poll(now + 350)) == []
        assert mismatch_findings(b.poll(now + 1000)) == []
    finally:
        b.close()


def test_unreadable_files_are_never_the_mismatch_nor_its_end(tmp_path, world):
    host = _Host(tmp_path, "550.54.15", "550.54.15")
    b = NvmlBackend(expected_gpus=2, timeout=0.5, repeat_after=300.0, driver_files=host.files)
    try:
        now = settle(b)
        for module, library in (
            (None, "555.42.02"),  # no /proc/driver/nvidia (a container, no driver)
            ("550.54.15", None),  # no library found
            ("TempVersion", "555.42.02"),  # a line with no number
        ):
            host.set(module, library)
            assert mismatch_findings(b.poll(now)) == [], (module, library)
            now += 10
        host.set("550.54.15", "555.42.02")
        assert mismatch_findings(b.poll(now)) == [("fatal", False)]
        host.set(None, None)  # unknown while it holds: neither repeated nor cleared
        assert mismatch_findings(b.poll(now + 10) + b.poll(now + 400)) == []
        host.set("550.54.15", "555.42.02")
        assert mismatch_findings(b.poll(now + 410)) == [("fatal", False)]
    finally:
        b.close()


def test_the_files_are_read_while_nvml_is_missing_or_hangs(tmp_path, world, monkeypatch):
    host = _Host(tmp_path, "550.54.15", "555.42.02")
    release = threading.Event()
    world.hang["nvmlInit"] = release
    b = NvmlBackend(expected_gpus=2, timeout=0.3, driver_files=host.files)
    try:
        found = b.poll(1.0)
        assert ("nvml_error", None, "warning") in checks(found)
        assert mismatch_findings(found) == [("fatal", False)]
    finally:
        release.set()
        b.close()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    b = NvmlBackend(expected_gpus=2, timeout=0.5, driver_files=host.files)
    try:
        assert checks(b.poll(1.0)) == [
            ("nvml_error", None, "warning"),
            ("driver_version_mismatch", None, "fatal"),
        ]
    finally:
        b.close()


def test_nvmlInits_own_mismatch_is_said_once_and_only_its_success_ends_it(tmp_path, world):
    # a sidecar started after the upgrade: its nvmlInit fails, and the files say the same
    host = _Host(tmp_path, "550.54.15", "555.42.02")
    world.init_error = 18
    b = NvmlBackend(expected_gpus=2, timeout=0.5, driver_files=host.files)
    try:
        found = b.poll(1000.0)
        assert mismatch_findings(found) == [("fatal", False)]
        assert found[0].payload["call"] == "nvmlInit"  # NVML's own word first
        assert b.poll(1010.0) == []
        host.set("555.42.02", "555.42.02")  # the files agree, nvmlInit still fails: held
        assert b.poll(1020.0) == []
        world.init_error = None  # the module reloaded: nvmlInit succeeds and ends it
        found = b.poll(1030.0)
        assert mismatch_findings(found) == [("info", True)]
        assert b.poll(1040.0) == []
    finally:
        b.close()
