"""The NVML GPU backend: inventory, health findings and telemetry from the NVIDIA driver.

Every NVML call goes through :meth:`NvmlBackend._call`, which runs it on one worker thread
and waits at most ``timeout`` seconds: a call that hangs (NVML can) becomes an
``nvml_error`` finding, the backend marks itself degraded and stops calling NVML until the
hung call returns -- the sidecar itself is never blocked. Any ``NVMLError`` is reported,
never raised; ``NotSupported`` for a metric on a GPU skips that metric quietly.

One failure of NVML is the node's, not the sidecar's: ``nvmlInit`` answering
``NVML_ERROR_LIB_RM_VERSION_MISMATCH`` (18). The kernel module itself compares the version of
the library that called it with its own, so the host's libnvidia-ml (the one this process
loads) and the loaded module differ: a driver upgraded without a reboot, and no new GPU
process starts on this node until it is rebooted. It is a fatal ``driver_version_mismatch``
finding of the node (no GPU), repeated every ``repeat_after`` while it holds (the condition is
permanent, a job's failure hours later still has one in its evidence window) and ``cleared``
by the first ``nvmlInit`` that succeeds (retried every poll). Nothing else becomes it: a hung
``nvmlInit``, pynvml missing, ``NVML_ERROR_DRIVER_NOT_LOADED`` (9: this process sees no
module, which the unit's sandbox, a module not loaded yet at boot, or a driver being
reinstalled also give) and every other code stay ``nvml_error`` warnings. The finding is made
by :class:`~slurm_recovery.sidecar.gpu.DriverMismatch`, which the simulated backend shares
(``srecovery sim inject --driver-mismatch``): the path beyond this module runs on any host.

A sidecar already running when the driver package is upgraded keeps the libnvidia-ml it
loaded, which still matches the old loaded module: its NVML keeps answering and it would never
see the mismatch while every new job on the node fails. So every poll also compares, without
NVML, the loaded module's version (``/proc/driver/nvidia/version``'s first line) with the
version of the library a new process would load (the file ``libnvidia-ml.so.1`` resolves to,
in the directory this process loaded it from, else the distributions' library directories):
:mod:`~slurm_recovery.sidecar.gpu.driver`, two small reads and a realpath, no process spawned.
Differing: the same fatal finding (``call: "driver_files"``, both versions and paths in its
detail), again every ``repeat_after``; agreeing again (the module reloaded, the node
rebooted): ``cleared``. Either unreadable or unparseable (no driver, a container without
``/proc/driver/nvidia``, no library found, Tegra's ``TempVersion``): nothing, a debug log
(fail open). A mismatch ``nvmlInit`` reported is ended only by an ``nvmlInit`` that succeeds,
and one the files reported only by the files agreeing.

This path runs for real only on a host with an NVIDIA GPU and driver, never in CI (no GPU):
the version mismatch above too, both ways of seeing it, which need a driver upgraded under a
loaded module. Here it is covered by ``tests/unit/test_driver_versions.py`` (the files, in a
temp directory) and by
``tests/unit/test_nvml_backend.py`` against a recorded fake of nvidia-ml-py
(``tests/unit/nvml_model/fake_pynvml.py``: the names and value shapes of nvidia-ml-py
13.615.71); ``tests/gpu/run.sh`` runs ``tests/gpu/`` against the real NVML on any GPU host.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slurm_recovery.sidecar.base import Finding
from slurm_recovery.sidecar.gpu import DriverMismatch, GpuInfo, gpu_finding, inventory_finding
from slurm_recovery.sidecar.gpu.driver import DriverFiles

__all__ = ["NvmlBackend"]

log = logging.getLogger(__name__)

# nvidia-ml-py's constants, with their values as fallbacks for older releases.
_ERR_NOT_SUPPORTED = 3
_ERR_INVALID_ARGUMENT = 2
_ERR_NOT_FOUND = 6
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_GPU_IS_LOST = 15
_ERR_LIB_RM_VERSION_MISMATCH = 18
_ERR_NO_DATA = 21

_REASON_HW_SLOWDOWN = 0x08
_REASON_SW_THERMAL = 0x20
_REASON_HW_THERMAL = 0x40
_REASON_HW_POWER_BRAKE = 0x80

#: NVLink error totals read per GPU in one nvmlDeviceGetFieldValues call.
_NVLINK_TOTALS = (
    ("crc_flit", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 38),
    ("crc_data", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 45),
    ("replay", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 52),
    ("recovery", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 59),
)
#: Per-link counters (nvmlDeviceGetNvLinkErrorCounter) read to name the link(s) at fault.
_NVLINK_COUNTERS = (
    ("replay", "NVML_NVLINK_ERROR_DL_REPLAY", 0),
    ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY", 1),
    ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT", 2),
    ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA", 3),
)


class _Skip:
    """A metric with no value this poll (not supported, or its call failed: reported)."""


_SKIP = _Skip()


class _Hung(Exception):
    """An NVML call did not return within the timeout; NVML is not called until it does."""


class _GpuLost(Exception):
    """NVML said GPU_IS_LOST for this GPU."""


@dataclass
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    name: str
    started: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class _Worker:
    """One daemon thread that runs NVML calls, so that a hung one can be left behind."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, job: _Job) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="srecovery-nvml", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._jobs.put(None)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job.result = job.fn(*job.args)
            except BaseException as exc:  # handed to the caller, who reports it
                job.error = exc
            finally:
                job.done.set()


@dataclass
class _Condition:
    """One (GPU, check) condition: polls it has held, and what was last reported of it."""

    polls: int = 0
    reported: bool = False
    level: int = 0
    detail: str = ""


@dataclass
class _Gpu:
    info: GpuInfo
    handle: Any
    lost: bool = False
    links: int | None = None  # NVLink links that answer; None = not discovered yet


class NvmlBackend:
    """GPU health through NVML (nvidia-ml-py's ``pynvml``).

    ``expected_gpus``: GPUs the node should have (0: the count of the first inventory);
    fewer is a fatal ``gpu_lost``. ``timeout``: the longest one NVML call may take.
    Thresholds are per poll interval. Findings are edge-triggered: a condition is reported
    when it starts (after ``debounce`` consecutive polls for throttling, NVLink down and
    PCIe downgrade) and again only after it cleared; :meth:`telemetry` shows what holds now.
    ``nvml``: the module to use instead of ``import pynvml`` (tests). ``driver_files``: where
    the driver's versions are read every poll (tests; the host's files by default).
    """

    name = "nvml"
    fast = False

    def __init__(
        self,
        expected_gpus: int = 0,
        timeout: float = 5.0,
        *,
        nvml: Any = None,
        sbe_storm_threshold: int = 100,
        pcie_replay_threshold: int = 10,
        nvlink_error_threshold: int = 10,
        busy_utilization: int = 10,
        debounce: int = 2,
        repeat_after: float = 300.0,
        driver_files: DriverFiles | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be more than 0 seconds")
        self._expected = max(0, expected_gpus)
        self._timeout = timeout
        self._sbe_threshold = max(1, sbe_storm_threshold)
        self._replay_threshold = max(1, pcie_replay_threshold)
        self._nvlink_threshold = max(1, nvlink_error_threshold)
        self._busy = busy_utilization
        self._debounce = max(1, debounce)
        self._repeat_after = repeat_after
        self._lock = threading.RLock()
        self._worker = _Worker()
        self._nvml = nvml
        self._import_error: str | None = None
        if nvml is None:
            try:
                import pynvml  # nvidia-ml-py

                self._nvml = pynvml
            except ImportError as exc:
                self._import_error = f"nvidia-ml-py is not installed ({exc})"
        self._initialized = False
        self._hung: _Job | None = None
        self._hung_reported_at = 0.0
        self._gpus: dict[int, _Gpu] = {}
        self._inventory_sent: list[GpuInfo] | None = None
        self._first_uuids: dict[str, int] = {}
        self._unsupported: set[tuple[int | None, str]] = set()
        self._errors: dict[tuple[int | None, str], str] = {}
        self._conditions: dict[tuple[int | None, str], _Condition] = {}
        self._counters: dict[tuple[int, str], int] = {}
        self._last_report: dict[tuple[int | None, str], float] = {}
        self._nvlink_seen_up: dict[int, set[int]] = {}
        self._nvlink_states: dict[int, dict[int, bool]] = {}
        self._telemetry: dict[int, dict[str, Any]] = {}
        self._problem: str | None = None
        self._out: list[Finding] = []
        #: findings made outside ``poll`` (by ``inventory``), returned by the next poll
        self._backlog: list[Finding] = []
        self._now = 0.0
        #: by "nvmlInit" only a successful nvmlInit ends it, by "driver_files" only the
        #: versions agreeing again (DriverMismatch.by)
        self._mismatch = DriverMismatch(repeat_after)
        self._driver_files = driver_files if driver_files is not None else DriverFiles()
        self._driver_files_unknown: str | None = None

    # ------------------------------------------------------------------ GpuBackend

    @property
    def degraded(self) -> bool:
        """True while NVML cannot be used: not loaded, not initialized, or a call hangs."""
        with self._lock:
            return self._hung is not None or not self._initialized

    def status(self) -> str:
        """``"ok"``, or why NVML is degraded (for the sidecar's status event)."""
        with self._lock:
            if self._hung is not None:
                waited = time.monotonic() - self._hung.started
                return f"degraded: {self._hung.name} has not returned for {waited:.0f} s"
            if not self._initialized:
                return f"degraded: {self._problem or 'NVML not initialized yet'}"
            return "ok"

    def inventory(self) -> list[GpuInfo]:
        """The GPUs NVML enumerates (initializing NVML if needed); [] while it cannot."""
        with self._lock:
            if not self._initialized and self._hung is None:
                self._out = self._backlog
                self._now = time.time()
                with contextlib.suppress(_Hung):  # reported as an nvml_error finding
                    self._start(self._now)
            return [g.info for g in sorted(self._gpus.values(), key=lambda g: g.info.index)]

    def telemetry(self) -> dict[int, dict[str, Any]]:
        """The last readings per GPU index: temperature, power, utilization, memory, ECC,
        PCIe, NVLink, clock event reasons and the conditions open now."""
        with self._lock:
            return {index: dict(values) for index, values in sorted(self._telemetry.items())}

    def poll(self, now: float) -> list[Finding]:
        with self._lock:
            self._out, self._backlog = self._backlog, []
            self._now = now
            with contextlib.suppress(_Hung):  # reported as an nvml_error finding
                self._poll_nvml(now)
            self._driver_files_check(now)
            return self._out

    def _poll_nvml(self, now: float) -> None:
        if self._blocked(now):
            return
        if not self._initialized:
            self._start(now)
            if not self._initialized:
                return
        else:
            self._check_count(now)
        for gpu in sorted(self._gpus.values(), key=lambda g: g.info.index):
            if gpu.lost:
                continue
            try:
                self._poll_gpu(gpu, now)
            except _GpuLost as lost:
                self._lose(gpu, now, f"NVML reports GPU {gpu.info.index} is lost ({lost})")
        self._nvlink_verdicts(now)

    def close(self) -> None:
        """Shut NVML down (unless a call hangs) and stop the worker thread."""
        with self._lock:
            if self._initialized and self._hung is None:
                with contextlib.suppress(Exception):  # closing: nothing left to report to
                    self._call("nvmlShutdown")
            self._initialized = False
            self._worker.stop()

    # ------------------------------------------------------------------ calling NVML

    def _call(self, name: str, *args: Any, gpu: int | None = None) -> Any:
        """Run one NVML function on the worker thread, waiting at most ``timeout``; ``gpu``
        is the GPU the call is about (named in the finding if it hangs)."""
        if self._hung is not None:
            raise _Hung(self._hung.name)
        fn = getattr(self._nvml, name, None)
        if fn is None:
            raise _function_not_found(self._nvml, name)
        job = _Job(fn, args, name)
        self._worker.submit(job)
        if not job.done.wait(self._timeout):
            self._hung = job
            self._hung_reported_at = time.monotonic()
            self._out.append(
                gpu_finding(
                    "nvml_error",
                    self._now,
                    gpu,
                    f"{name} did not return within {self._timeout:g} s; NVML is not called "
                    "again until it does (the backend is degraded)",
                    call=name,
                )
            )
            raise _Hung(name)
        if job.error is not None:
            raise job.error
        return job.result

    def _blocked(self, now: float) -> bool:
        """While a hung call has not returned: remind every ``repeat_after`` and skip."""
        job = self._hung
        if job is None:
            return False
        if not job.done.is_set():
            if time.monotonic() - self._hung_reported_at >= self._repeat_after:
                self._hung_reported_at = time.monotonic()
                waited = time.monotonic() - job.started
                self._out.append(
                    gpu_finding(
                        "nvml_error",
                        now,
                        None,
                        f"{job.name} still has not returned after {waited:.0f} s",
                        call=job.name,
                    )
                )
            return True
        self._hung = None
        if job.name == "nvmlInit" and job.error is None:
            self._initialized = True
            self._problem = None
        self._out.append(
            gpu_finding(
                "nvml_error",
                now,
                None,
                f"{job.name} returned after {time.monotonic() - job.started:.0f} s; "
                "NVML answers again",
                severity="info",
                cleared=True,
                call=job.name,
            )
        )
        return False

    def _code(self, exc: BaseException) -> int | None:
        base = getattr(self._nvml, "NVMLError", None)
        if base is not None and isinstance(exc, base):
            value = getattr(exc, "value", None)
            return value if isinstance(value, int) else None
        return None

    def _const(self, name: str, default: int) -> int:
        value = getattr(self._nvml, name, default)
        return value if isinstance(value, int) else default

    def _get(self, gpu: int | None, metric: str, name: str, *args: Any) -> Any:
        """``_call`` for one metric: NotSupported -> skipped from now on; GPU_IS_LOST ->
        :class:`_GpuLost`; any other failure -> one ``nvml_error`` finding (again only if
        the error changes, cleared by a success), and the metric is skipped this poll."""
        if (gpu, metric) in self._unsupported:
            return _SKIP
        try:
            value = self._call(name, *args, gpu=gpu)
        except _Hung:
            raise
        except Exception as exc:
            code = self._code(exc)
            if code in (
                self._const("NVML_ERROR_NOT_SUPPORTED", _ERR_NOT_SUPPORTED),
                self._const("NVML_ERROR_FUNCTION_NOT_FOUND", _ERR_FUNCTION_NOT_FOUND),
            ):
                self._unsupported.add((gpu, metric))
                return _SKIP
            if code == self._const("NVML_ERROR_GPU_IS_LOST", _ERR_GPU_IS_LOST) and gpu is not None:
                raise _GpuLost(name) from None
            if code == self._const("NVML_ERROR_NO_DATA", _ERR_NO_DATA):
                return _SKIP
            text = f"{name} failed: {_describe(exc)}"
            if self._errors.get((gpu, metric)) != text:
                self._errors[(gpu, metric)] = text
                self._out.append(gpu_finding("nvml_error", self._now, gpu, text, call=name))
            return _SKIP
        self._error_cleared(gpu, metric, name)
        return value

    def _error_cleared(self, gpu: int | None, metric: str, name: str) -> None:
        text = self._errors.pop((gpu, metric), None)
        if text is not None:
            self._out.append(
                gpu_finding(
                    "nvml_error",
                    self._now,
                    gpu,
                    f"cleared: {text}",
                    severity="info",
                    cleared=True,
                    call=name,
                )
            )

    # ------------------------------------------------------------------ inventory

    def _start(self, now: float) -> None:
        if self._import_error is not None:
            self._fail_start(now, self._import_error)
            return
        try:
            self._call("nvmlInit")
        except _Hung:
            self._problem = "nvmlInit hangs"
            raise
        except Exception as exc:
            mismatch = self._const(
                "NVML_ERROR_LIB_RM_VERSION_MISMATCH", _ERR_LIB_RM_VERSION_MISMATCH
            )
            if self._code(exc) == mismatch:
                self._version_mismatch(now, f"nvmlInit failed: {_describe(exc)}")
            else:
                self._fail_start(now, f"nvmlInit failed: {_describe(exc)}")
            return
        self._initialized = True
        self._problem = None
        self._error_cleared(None, "init", "nvmlInit")
        # this process's library matches the module: not the files' word on a new process's
        cleared = self._mismatch.ended(now, reported_by="nvmlInit")
        if cleared is not None:
            self._out.append(cleared)
        self._enumerate(now)

    def _fail_start(self, now: float, text: str) -> None:
        self._problem = text
        if self._errors.get((None, "init")) != text:
            self._errors[(None, "init")] = text
            self._out.append(gpu_finding("nvml_error", now, None, text, call="nvmlInit"))

    def _version_mismatch(self, now: float, text: str) -> None:
        """The host's NVML library and the loaded kernel module differ (nvmlInit's
        LIB_RM_VERSION_MISMATCH): a fatal finding of the node, again every ``repeat_after``
        while it holds, so that every failure on the node has one in its evidence window."""
        self._problem = text
        found = self._mismatch.holds(now, text, call="nvmlInit")
        if found is not None:
            self._out.append(found)

    def _driver_files_check(self, now: float) -> None:
        """The loaded kernel module's version against the libnvidia-ml a new process would
        load (:mod:`~slurm_recovery.sidecar.gpu.driver`), every poll, without NVML: a sidecar
        started before the driver package was upgraded keeps the old library, which still
        matches the old module, and its own ``nvmlInit`` never says so. Differing: the same
        fatal finding as ``nvmlInit``'s, again every ``repeat_after``; agreeing again: its
        ``cleared``; either unknown: nothing (a debug log). A mismatch ``nvmlInit`` reported
        is left to ``nvmlInit`` (retried every poll until it succeeds)."""
        if self._mismatch.by == "nvmlInit":
            return
        try:
            versions = self._driver_files.read()
        except Exception as exc:  # read() never raises; a poll never does either
            versions = None
            reason = f"reading the driver's versions failed: {exc!r}"
        else:
            reason = versions.unknown() if versions.differ is None else None
        if versions is None or versions.differ is None:
            if reason != self._driver_files_unknown:
                self._driver_files_unknown = reason
                log.debug("driver version check skipped: %s", reason)
            return
        self._driver_files_unknown = None
        if versions.differ:
            found = self._mismatch.holds(
                now,
                versions.cause(),
                call="driver_files",
                module_version=versions.module,
                library_version=versions.library,
                library_path=versions.library_path,
            )
            if found is not None:
                self._out.append(found)
        else:
            cleared = self._mismatch.ended(now, reported_by="driver_files", call="driver_files")
            if cleared is not None:
                self._out.append(cleared)

    def _enumerate(self, now: float) -> None:
        count = self._get(None, "count", "nvmlDeviceGetCount")
        if isinstance(count, _Skip):
            return
        gpus: dict[int, _Gpu] = {}
        for index in range(int(count)):
            gpu = self._identify(index, now)
            if gpu is not None:
                gpus[index] = gpu
        self._gpus = gpus
        if not self._first_uuids:
            self._first_uuids = {g.info.uuid: i for i, g in gpus.items() if g.info.uuid}
        if self._expected == 0:
            self._expected = len(gpus)
        infos = [g.info for g in gpus.values()]
        if infos != self._inventory_sent:
            self._inventory_sent = infos
            self._out.append(inventory_finding(infos, self._expected, now))
        self._check_missing(int(count), now)

    def _identify(self, index: int, now: float) -> _Gpu | None:
        try:
            handle = self._get(index, "handle", "nvmlDeviceGetHandleByIndex", index)
            if isinstance(handle, _Skip):
                return None
            uuid = self._get(index, "uuid", "nvmlDeviceGetUUID", handle)
            pci = self._get(index, "pci", "nvmlDeviceGetPciInfo", handle)
            name = self._get(index, "name", "nvmlDeviceGetName", handle)
            serial = self._get(index, "serial", "nvmlDeviceGetSerial", handle)
        except _GpuLost:
            self._condition(index, "gpu_lost", True, now, f"NVML reports GPU {index} is lost")
            self._telemetry[index] = {"lost": True}
            known = self._gpus.get(index)
            if known is None:
                return None
            known.lost = True  # keep its identity: its kernel-log XIDs still name it
            return known
        self._condition(index, "gpu_lost", False, now, "")
        bus_id = "" if isinstance(pci, _Skip) else _text(getattr(pci, "busId", ""))
        info = GpuInfo(
            index=index,
            uuid="" if isinstance(uuid, _Skip) else _text(uuid),
            pci_bus_id=bus_id,
            name="" if isinstance(name, _Skip) else _text(name),
            serial="" if isinstance(serial, _Skip) else _text(serial),
        )
        known = self._gpus.get(index)
        if known is not None and known.info == info:  # the same GPU: keep what we learnt
            known.handle, known.lost = handle, False
            return known
        return _Gpu(info=info, handle=handle)

    def _check_count(self, now: float) -> None:
        count = self._get(None, "count", "nvmlDeviceGetCount")
        if isinstance(count, _Skip):
            return
        if int(count) != len(self._gpus) or any(g.lost for g in self._gpus.values()):
            self._enumerate(now)  # a GPU came, went or was lost: look again
            return
        self._check_missing(int(count), now)

    def _check_missing(self, count: int, now: float) -> None:
        missing = self._expected - count
        present = {g.info.uuid for g in self._gpus.values()}
        gone = sorted(i for uuid, i in self._first_uuids.items() if uuid not in present)
        which = f" (gone: GPU {', '.join(map(str, gone))})" if gone else ""
        self._condition(
            None,
            "gpu_lost",
            missing > 0,
            now,
            f"NVML sees {count} GPUs, the node should have {self._expected}{which}",
            level=missing,
            count=count,
            expected=self._expected,
            gone=gone,
        )

    def _lose(self, gpu: _Gpu, now: float, detail: str) -> None:
        gpu.lost = True
        index = gpu.info.index
        self._telemetry[index] = {"lost": True}
        self._condition(index, "gpu_lost", True, now, detail)

    # ------------------------------------------------------------------ one GPU

    def _poll_gpu(self, gpu: _Gpu, now: float) -> None:
        index, h = gpu.info.index, gpu.handle
        seen: dict[str, Any] = {}
        self._ecc(index, h, now, seen)
        self._pages_and_rows(index, h, now, seen)
        self._clock_events(index, h, now, seen)
        self._readings(index, h, seen)
        self._pcie(index, h, now, seen)
        self._nvlink(gpu, now, seen)
        seen["conditions"] = sorted(
            check
            for (where, check), condition in self._conditions.items()
            if where == index and condition.reported
        )
        self._telemetry[index] = seen

    def _ecc(self, index: int, h: Any, now: float, seen: dict[str, Any]) -> None:
        unc = self._const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        cor = self._const("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
        vol = self._const("NVML_VOLATILE_ECC", 0)
        agg = self._const("NVML_AGGREGATE_ECC", 1)
        fn = "nvmlDeviceGetTotalEccErrors"
        values = {
            "volatile_dbe": self._get(index, "ecc_volatile_dbe", fn, h, unc, vol),
            "volatile_sbe": self._get(index, "ecc_volatile_sbe", fn, h, cor, vol),
            "aggregate_dbe": self._get(index, "ecc_aggregate_dbe", fn, h, unc, agg),
            "aggregate_sbe": self._get(index, "ecc_aggregate_sbe", fn, h, cor, agg),
        }
        ecc = {k: int(v) for k, v in values.items() if not isinstance(v, _Skip)}
        if ecc:
            seen["ecc"] = ecc
        dbe = ecc.get("volatile_dbe")
        if dbe is not None:
            # volatile counters start at 0 when the driver loads and at each GPU reset: any
            # count is an uncorrectable error the GPU has not been reset since
            before = self._conditions.get((index, "ecc_dbe"), _Condition()).level
            self._condition(
                index,
                "ecc_dbe",
                dbe > 0,
                now,
                f"volatile uncorrectable ECC errors {before} -> {dbe} "
                f"(aggregate {ecc.get('aggregate_dbe', '?')})",
                level=dbe,
                count=dbe,
            )
        sbe = ecc.get("volatile_sbe")
        if sbe is not None:
            before = self._counters.get((index, "volatile_sbe"))
            self._counters[(index, "volatile_sbe")] = sbe
            if before is not None and sbe - before >= self._sbe_threshold:
                self._rising(
                    index,
                    "ecc_sbe_storm",
                    now,
                    f"corrected ECC errors +{sbe - before} since the last poll (now {sbe})",
                )

    def _pages_and_rows(self, index: int, h: Any, now: float, seen: dict[str, Any]) -> None:
        pending = self._get(index, "retired_pending", "nvmlDeviceGetRetiredPagesPendingStatus", h)
        if not isinstance(pending, _Skip):
            retired: dict[str, Any] = {"pending": bool(pending)}
            for label, const, default in (
                ("sbe", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
                ("dbe", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1),
            ):
                pages = self._get(
                    index,
                    f"retired_{label}",
                    "nvmlDeviceGetRetiredPages",
                    h,
                    self._const(const, default),
                )
                if not isinstance(pages, _Skip):
                    retired[label] = len(pages)
            seen["retired_pages"] = retired
            self._condition(
                index,
                "retired_pages_pending",
                bool(pending),
                now,
                "a page retirement waits for a GPU reset",
            )
        rows = self._get(index, "remapped_rows", "nvmlDeviceGetRemappedRows", h)
        if not isinstance(rows, _Skip):
            corr, unc, row_pending, failure = (int(v) for v in rows)
            seen["remapped_rows"] = {
                "correctable": corr,
                "uncorrectable": unc,
                "pending": bool(row_pending),
                "failure": bool(failure),
            }
            self._condition(
                index,
                "remap_pending",
                bool(row_pending),
                now,
                f"a row remap waits for a GPU reset ({corr} correctable, {unc} uncorrectable "
                "rows remapped)",
            )
            self._condition(
                index,
                "remap_failure",
                bool(failure),
                now,
                "row remapping failed: the GPU's memory cannot be repaired in the field",
            )

    def _clock_events(self, index: int, h: Any, now: float, seen: dict[str, Any]) -> None:
        reasons = self._get(index, "clock_events", "nvmlDeviceGetCurrentClocksEventReasons", h)
        if isinstance(reasons, _Skip) and (index, "clock_events") in self._unsupported:
            reasons = self._get(
                index, "throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons", h
            )
        if isinstance(reasons, _Skip):
            return
        bits = int(reasons)
        hw = self._const("nvmlClocksEventReasonHwSlowdown", _REASON_HW_SLOWDOWN)
        thermal = self._const(
            "nvmlClocksEventReasonHwThermalSlowdown", _REASON_HW_THERMAL
        ) | self._const("nvmlClocksEventReasonSwThermalSlowdown", _REASON_SW_THERMAL)
        brake = self._const("nvmlClocksEventReasonHwPowerBrakeSlowdown", _REASON_HW_POWER_BRAKE)
        seen["clock_event_reasons"] = f"0x{bits:x}"
        for check, mask, what in (
            ("throttle_hw_slowdown", hw, "hardware slowdown"),
            ("throttle_thermal", thermal, "thermal slowdown"),
            ("throttle_power_brake", brake, "power brake slowdown"),
        ):
            self._condition(
                index,
                check,
                bool(bits & mask),
                now,
                f"{what} engaged (clock event reasons 0x{bits:x})",
                debounce=self._debounce,
            )

    def _readings(self, index: int, h: Any, seen: dict[str, Any]) -> None:
        temp = self._get(
            index,
            "temperature",
            "nvmlDeviceGetTemperature",
            h,
            self._const("NVML_TEMPERATURE_GPU", 0),
        )
        if not isinstance(temp, _Skip):
            seen["temperature_c"] = int(temp)
        power = self._get(index, "power", "nvmlDeviceGetPowerUsage", h)
        if not isinstance(power, _Skip):
            seen["power_w"] = round(int(power) / 1000.0, 1)
        util = self._get(index, "utilization", "nvmlDeviceGetUtilizationRates", h)
        if not isinstance(util, _Skip):
            seen["utilization_gpu"] = int(util.gpu)
            seen["utilization_memory"] = int(util.memory)
        memory = self._get(index, "memory", "nvmlDeviceGetMemoryInfo", h)
        if not isinstance(memory, _Skip):
            seen["memory_total_bytes"] = int(memory.total)
            seen["memory_used_bytes"] = int(memory.used)

    def _pcie(self, index: int, h: Any, now: float, seen: dict[str, Any]) -> None:
        replay = self._get(index, "pcie_replay", "nvmlDeviceGetPcieReplayCounter", h)
        pcie: dict[str, Any] = {}
        if not isinstance(replay, _Skip):
            replays = int(replay)
            pcie["replay_counter"] = replays
            before = self._counters.get((index, "pcie_replay"))
            self._counters[(index, "pcie_replay")] = replays
            if before is not None and replays - before >= self._replay_threshold:
                self._rising(
                    index,
                    "pcie_replay_rising",
                    now,
                    f"PCIe replays +{replays - before} since the last poll (now {replays})",
                )
        link = {
            "gen": self._get(index, "pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", h),
            "max_gen": self._get(index, "pcie_max_gen", "nvmlDeviceGetMaxPcieLinkGeneration", h),
            "width": self._get(index, "pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", h),
            "max_width": self._get(index, "pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth", h),
        }
        pcie.update({k: int(v) for k, v in link.items() if not isinstance(v, _Skip)})
        if pcie:
            seen["pcie"] = pcie
        narrow = "width" in pcie and "max_width" in pcie and pcie["width"] < pcie["max_width"]
        # GPUs lower their PCIe generation when idle: a slow link counts only under load
        busy = seen.get("utilization_gpu", 0) >= self._busy
        slow = busy and "gen" in pcie and "max_gen" in pcie and pcie["gen"] < pcie["max_gen"]
        detail = (
            f"PCIe link at Gen{pcie.get('gen', '?')} x{pcie.get('width', '?')}, "
            f"maximum Gen{pcie.get('max_gen', '?')} x{pcie.get('max_width', '?')}"
        )
        self._condition(
            index, "pcie_link_downgrade", narrow or slow, now, detail, debounce=self._debounce
        )

    # ------------------------------------------------------------------ NVLink

    def _nvlink(self, gpu: _Gpu, now: float, seen: dict[str, Any]) -> None:
        index, h = gpu.info.index, gpu.handle
        if gpu.links is None:
            gpu.links = self._discover_links(index, h)
        if not gpu.links:
            return
        states: dict[int, bool] = {}
        for link in range(gpu.links):
            state = self._get(index, f"nvlink_state_{link}", "nvmlDeviceGetNvLinkState", h, link)
            if not isinstance(state, _Skip):
                states[link] = int(state) == self._const("NVML_FEATURE_ENABLED", 1)
        self._nvlink_states[index] = states
        up = self._nvlink_seen_up.setdefault(index, set())
        up.update(link for link, active in states.items() if active)
        nvlink: dict[str, Any] = {
            "links": gpu.links,
            "active": sorted(link for link, active in states.items() if active),
        }
        totals = self._nvlink_totals(index, h)
        if totals:
            nvlink["errors"] = totals
            self._nvlink_errors(gpu, totals, states, now)
        seen["nvlink"] = nvlink

    def _discover_links(self, index: int, h: Any) -> int:
        """How many NVLink links this GPU has: the first link index NVML refuses ends it."""
        links = 0
        for link in range(self._const("NVML_NVLINK_MAX_LINKS", 18)):
            try:
                self._call("nvmlDeviceGetNvLinkState", h, link, gpu=index)
            except _Hung:
                raise
            except Exception as exc:
                code = self._code(exc)
                if code == self._const("NVML_ERROR_GPU_IS_LOST", _ERR_GPU_IS_LOST):
                    raise _GpuLost("nvmlDeviceGetNvLinkState") from None
                known = (
                    _ERR_NOT_SUPPORTED,
                    _ERR_INVALID_ARGUMENT,
                    _ERR_NOT_FOUND,
                    _ERR_FUNCTION_NOT_FOUND,
                )
                if code not in known:
                    text = f"nvmlDeviceGetNvLinkState failed: {_describe(exc)}"
                    self._out.append(
                        gpu_finding(
                            "nvml_error",
                            self._now,
                            index,
                            text,
                            call="nvmlDeviceGetNvLinkState",
                        )
                    )
                break
            links += 1
        return links

    def _nvlink_totals(self, index: int, h: Any) -> dict[str, int]:
        """NVLink error totals (all links) in one call; {} when not supported."""
        ids = [self._const(const, default) for _, const, default in _NVLINK_TOTALS]
        values = self._get(index, "nvlink_totals", "nvmlDeviceGetFieldValues", h, ids)
        if isinstance(values, _Skip):
            return {}
        totals: dict[str, int] = {}
        for (label, _, _), value in zip(_NVLINK_TOTALS, values, strict=False):
            if int(getattr(value, "nvmlReturn", 0)) != 0:
                continue
            number = _field_value(value)
            if number is not None:
                totals[label] = number
        return totals

    def _nvlink_errors(
        self, gpu: _Gpu, totals: dict[str, int], states: dict[int, bool], now: float
    ) -> None:
        index = gpu.info.index
        deltas: dict[str, int] = {}
        for label, value in totals.items():
            before = self._counters.get((index, f"nvlink_{label}"))
            self._counters[(index, f"nvlink_{label}")] = value
            if before is not None and value > before:
                deltas[label] = value - before
        recovery = deltas.get("recovery", 0)
        other = sum(v for k, v in deltas.items() if k != "recovery")
        if recovery < 1 and other < self._nvlink_threshold:
            return
        links = self._links_at_fault(gpu, states)
        where = f" on link {', '.join(map(str, links))}" if links else ""
        counts = ", ".join(f"{k} +{v}" for k, v in sorted(deltas.items()))
        self._rising(
            index,
            "nvlink_errors_rising",
            now,
            f"NVLink errors since the last poll: {counts}{where}",
            links=links,
        )

    def _links_at_fault(self, gpu: _Gpu, states: dict[int, bool]) -> list[int]:
        """Which active links' counters rose since they were last read (names the link)."""
        index, h = gpu.info.index, gpu.handle
        rising: list[int] = []
        for link, active in sorted(states.items()):
            if not active:
                continue
            grew = False
            for label, const, default in _NVLINK_COUNTERS:
                value = self._get(
                    index,
                    f"nvlink_{label}_{link}",
                    "nvmlDeviceGetNvLinkErrorCounter",
                    h,
                    link,
                    self._const(const, default),
                )
                if isinstance(value, _Skip):
                    continue
                key = (index, f"nvlink_{label}_{link}")
                before = self._counters.get(key)
                self._counters[key] = int(value)
                if before is not None and int(value) > before:
                    grew = True
            if grew:
                rising.append(link)
        return rising

    def _nvlink_verdicts(self, now: float) -> None:
        """A link is down when it should be up: it was up before on this GPU, or it is up
        on most other GPUs of the same model (which also covers a sidecar restarted after
        the link went down)."""
        by_name: dict[str, list[int]] = {}
        for index, gpu in self._gpus.items():
            if not gpu.lost and index in self._nvlink_states:
                by_name.setdefault(gpu.info.name, []).append(index)
        for index, states in self._nvlink_states.items():
            gpu = self._gpus.get(index)
            if gpu is None or gpu.lost:
                continue
            peers = [p for p in by_name.get(gpu.info.name, []) if p != index]
            down: list[int] = []
            for link, active in sorted(states.items()):
                if active:
                    continue
                seen_up = link in self._nvlink_seen_up.get(index, set())
                peers_up = sum(1 for p in peers if self._nvlink_states[p].get(link))
                if seen_up or (peers and peers_up * 2 > len(peers)):
                    down.append(link)
            self._condition(
                index,
                "nvlink_down",
                bool(down),
                now,
                f"NVLink link {', '.join(map(str, down))} down",
                debounce=self._debounce,
                level=len(down),
                links=down,
            )

    # ------------------------------------------------------------------ findings

    def _condition(
        self,
        gpu: int | None,
        check: str,
        active: bool,
        now: float,
        detail: str,
        *,
        debounce: int = 1,
        level: int = 1,
        **extra: Any,
    ) -> None:
        """A condition of ``gpu`` (None: the node): reported when it has held for
        ``debounce`` polls, again when it worsens (``level`` above the one reported), and
        ``cleared`` (severity info) when it goes away -- as the simulated backend does, so
        the sidecar's health file can open and close it."""
        state = self._conditions.setdefault((gpu, check), _Condition())
        if not active:
            if state.reported:
                self._out.append(
                    gpu_finding(
                        check,
                        now,
                        gpu,
                        f"cleared: {state.detail}",
                        severity="info",
                        cleared=True,
                    )
                )
            self._conditions[(gpu, check)] = _Condition()
            return
        state.polls += 1
        if state.polls < debounce or (state.reported and level <= state.level):
            return
        state.reported, state.level, state.detail = True, level, detail
        self._out.append(gpu_finding(check, now, gpu, detail, **extra))

    def _rising(self, gpu: int, check: str, now: float, detail: str, **extra: Any) -> None:
        """A counter check: reported at most once per ``repeat_after`` per GPU and check."""
        last = self._last_report.get((gpu, check))
        if last is not None and now - last < self._repeat_after:
            return
        self._last_report[(gpu, check)] = now
        self._out.append(gpu_finding(check, now, gpu, detail, **extra))


def _function_not_found(nvml: Any, name: str) -> BaseException:
    """What NVML raises for a function the driver lacks, for one pynvml does not define."""
    error = getattr(nvml, "NVMLError", None)
    if isinstance(error, type) and issubclass(error, Exception):
        try:
            return error(getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", _ERR_FUNCTION_NOT_FOUND))
        except Exception:
            pass
    return AttributeError(f"pynvml has no {name}")


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # pynvml's __str__ itself calls NVML
        text = ""
    kind = type(exc).__name__
    return f"{kind}: {text}" if text and text != kind else kind


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace").strip("\x00").strip()
    return str(value).strip()


def _field_value(value: Any) -> int | None:
    """The number in a ``c_nvmlFieldValue_t`` by its ``valueType``."""
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
    inner = getattr(value, "value", None)
    name = member.get(int(getattr(value, "valueType", 3)))
    if inner is None or name is None:
        return None
    number = getattr(inner, name, None)
    return int(number) if isinstance(number, int | float) else None
