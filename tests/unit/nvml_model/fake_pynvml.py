"""A recorded model of nvidia-ml-py's ``pynvml`` module, standing in for NVML in unit tests.

Recorded from nvidia-ml-py 13.615.71 (``pynvml.py`` as installed by pip; it imports without
a GPU, and ``nvmlInit`` raises ``NVMLError_LibraryNotFound`` where libnvidia-ml.so.1 is
missing). Only what the NVML backend touches is modelled, with the exact names, constant
values, argument orders and value shapes of that release:

- errors: ``NVMLError(value)`` returns the subclass for the code (``NVMLError_NotSupported``
  for 3, ``NVMLError_GPUIsLost`` for 15, ... built like ``_extractNVMLErrorsAsClasses``),
  with ``.value`` and ``str()`` as pynvml's ``_errcode_to_string``;
- ``nvmlInit``, ``nvmlShutdown``, ``nvmlDeviceGetCount``, ``nvmlDeviceGetHandleByIndex``;
  ``nvmlDeviceGetUUID``/``GetName``/``GetSerial`` return ``str`` (``@convertStrBytes``);
  ``nvmlDeviceGetPciInfo`` returns an ``nvmlPciInfo_t``-shaped value whose ``busId`` is a
  ``str`` such as ``"00000000:3B:00.0"`` (``_PrintableStructure`` decodes bytes);
- ``nvmlDeviceGetTotalEccErrors(handle, errorType, counterType)``,
  ``nvmlDeviceGetRetiredPages(device, sourceFilter)`` (a list of addresses),
  ``nvmlDeviceGetRetiredPagesPendingStatus`` (int), ``nvmlDeviceGetRemappedRows`` (a tuple
  corr, unc, pending, failure), ``nvmlDeviceGetCurrentClocksEventReasons`` and the older
  ``nvmlDeviceGetCurrentClocksThrottleReasons`` (bit masks), ``nvmlDeviceGetTemperature
  (handle, sensor)``, ``nvmlDeviceGetPowerUsage`` (mW), ``nvmlDeviceGetUtilizationRates``
  (``.gpu``, ``.memory``), ``nvmlDeviceGetMemoryInfo`` (``.total``, ``.free``, ``.used``),
  ``nvmlDeviceGetPcieReplayCounter``, ``nvmlDeviceGet{Curr,Max}PcieLink{Generation,Width}``,
  ``nvmlDeviceGetNvLinkState(device, link)`` (1 active, 0 not),
  ``nvmlDeviceGetNvLinkErrorCounter(device, link, counter)``,
  ``nvmlDeviceGetFieldValues(handle, fieldIds)`` (``c_nvmlFieldValue_t``-shaped values:
  ``fieldId``, ``scopeId``, ``valueType``, ``nvmlReturn``, ``value.ullVal``...).

``build(world)`` returns a fresh ``pynvml`` module over a :class:`World`; every call is
recorded in ``world.calls``. A :class:`FakeGpu` scripts one GPU: ``unsupported`` names
functions that raise NotSupported for it, ``fail`` maps a function to an error code, and
``world.hang`` maps a function to an ``Event`` the call waits on (an NVML hang).
"""

from __future__ import annotations

import string
import threading
import types
from dataclasses import dataclass, field
from typing import Any, ClassVar

VERSION = "13.615.71"

# Constants, with nvidia-ml-py 13.615.71's values.
CONSTANTS: dict[str, int] = {
    "NVML_SUCCESS": 0,
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
    "NVML_ERROR_NO_DATA": 21,
    "NVML_ERROR_UNKNOWN": 999,
    "NVML_FEATURE_DISABLED": 0,
    "NVML_FEATURE_ENABLED": 1,
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_NVLINK_MAX_LINKS": 36,
    "NVML_NVLINK_ERROR_DL_REPLAY": 0,
    "NVML_NVLINK_ERROR_DL_RECOVERY": 1,
    "NVML_NVLINK_ERROR_DL_CRC_FLIT": 2,
    "NVML_NVLINK_ERROR_DL_CRC_DATA": 3,
    "NVML_NVLINK_ERROR_DL_ECC_DATA": 4,
    "NVML_VOLATILE_ECC": 0,
    "NVML_AGGREGATE_ECC": 1,
    "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS": 0,
    "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR": 1,
    "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 38,
    "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 45,
    "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 52,
    "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 59,
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": 3,
    "nvmlClocksEventReasonGpuIdle": 0x1,
    "nvmlClocksEventReasonSwPowerCap": 0x4,
    "nvmlClocksEventReasonHwSlowdown": 0x8,
    "nvmlClocksEventReasonSwThermalSlowdown": 0x20,
    "nvmlClocksEventReasonHwThermalSlowdown": 0x40,
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": 0x80,
    "nvmlClocksThrottleReasonHwSlowdown": 0x8,
    "nvmlClocksThrottleReasonSwThermalSlowdown": 0x20,
    "nvmlClocksThrottleReasonHwThermalSlowdown": 0x40,
    "nvmlClocksThrottleReasonHwPowerBrakeSlowdown": 0x80,
}

# pynvml's NVMLError._errcode_to_string (the codes modelled here).
ERROR_TEXT = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    6: "Not Found",
    9: "Driver Not Loaded",
    10: "Timeout",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    15: "GPU is lost",
    18: "RM has detected an NVML/RM version mismatch.",
    21: "No data",
    999: "Unknown Error",
}

#: Functions the model provides (each exists in nvidia-ml-py 13.615.71).
FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetFieldValues",
)


@dataclass
class FakeGpu:
    """One scripted GPU; tests change its fields between polls."""

    uuid: str = "GPU-00000000-1111-2222-3333-444444444444"
    pci_bus_id: str = "00000000:3B:00.0"
    name: str = "NVIDIA H100 80GB HBM3"
    serial: str = "1650923000001"
    volatile_dbe: int = 0
    volatile_sbe: int = 0
    aggregate_dbe: int = 0
    aggregate_sbe: int = 0
    retired_pending: int = 0
    retired_sbe: list[int] = field(default_factory=list)
    retired_dbe: list[int] = field(default_factory=list)
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    clock_reasons: int = 0
    temperature: int = 41
    power_mw: int = 118_000
    utilization: tuple[int, int] = (0, 0)
    memory: tuple[int, int] = (85_899_345_920, 1_073_741_824)  # total, used
    pcie_replay: int = 0
    pcie: tuple[int, int, int, int] = (5, 5, 16, 16)  # gen, max gen, width, max width
    nvlink_states: list[int] = field(default_factory=lambda: [1] * 18)
    nvlink_counters: dict[tuple[int, int], int] = field(default_factory=dict)
    nvlink_totals: dict[int, int] = field(default_factory=lambda: {38: 0, 45: 0, 52: 0, 59: 0})
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    fail: dict[str, int] = field(default_factory=dict)


@dataclass
class World:
    """What the driver shows: its GPUs (``visible`` of them enumerate), and call records."""

    gpus: list[FakeGpu] = field(default_factory=list)
    visible: int | None = None
    init_error: int | None = None
    hang: dict[str, threading.Event] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    missing: set[str] = field(default_factory=set)  # functions this pynvml lacks

    def count(self, name: str) -> int:
        return sum(1 for call in self.calls if call == name)


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class _Struct:
    """A ctypes-structure-shaped value: attributes only."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


def build(world: World) -> types.ModuleType:
    """A fresh ``pynvml`` module over ``world``."""
    module = types.ModuleType("pynvml")
    module.__dict__.update(CONSTANTS)

    class NVMLError(Exception):
        _valClassMapping: ClassVar[dict[int, type]] = {}

        def __new__(cls, value: int) -> NVMLError:
            if cls is NVMLError:
                cls = NVMLError._valClassMapping.get(value, cls)
            obj = Exception.__new__(cls)
            obj.value = value
            return obj

        def __init__(self, value: int) -> None:
            super().__init__(value)

        def __str__(self) -> str:
            return ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")

        def __eq__(self, other: object) -> bool:
            return self.value == getattr(other, "value", None)

        __hash__ = Exception.__hash__

    module.NVMLError = NVMLError
    for const, value in CONSTANTS.items():
        if not const.startswith("NVML_ERROR_"):
            continue
        words = string.capwords(const.replace("NVML_ERROR_", ""), "_").replace("_", "")
        subclass = type(f"NVMLError_{words}", (NVMLError,), {})
        subclass.__module__ = "pynvml"
        NVMLError._valClassMapping[value] = subclass
        setattr(module, subclass.__name__, subclass)

    state = {"init": 0}

    def enter(name: str, handle: _Handle | None = None) -> FakeGpu | None:
        world.calls.append(name)
        event = world.hang.get(name)
        if event is not None:
            event.wait()
        if name != "nvmlInit" and state["init"] <= 0:
            raise NVMLError(CONSTANTS["NVML_ERROR_UNINITIALIZED"])
        if handle is None:
            return None
        gpu = world.gpus[handle.index]
        if gpu.lost:
            raise NVMLError(CONSTANTS["NVML_ERROR_GPU_IS_LOST"])
        if name in gpu.unsupported:
            raise NVMLError(CONSTANTS["NVML_ERROR_NOT_SUPPORTED"])
        if name in gpu.fail:
            raise NVMLError(gpu.fail[name])
        return gpu

    def nvmlInit() -> None:
        enter("nvmlInit")
        if world.init_error is not None:
            raise NVMLError(world.init_error)
        state["init"] += 1

    def nvmlShutdown() -> None:
        enter("nvmlShutdown")
        state["init"] -= 1

    def nvmlDeviceGetCount() -> int:
        enter("nvmlDeviceGetCount")
        return len(world.gpus) if world.visible is None else world.visible

    def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
        enter("nvmlDeviceGetHandleByIndex")
        visible = len(world.gpus) if world.visible is None else world.visible
        if not 0 <= index < visible:
            raise NVMLError(CONSTANTS["NVML_ERROR_INVALID_ARGUMENT"])
        return _Handle(index)

    def nvmlDeviceGetUUID(handle: _Handle) -> str:
        return enter("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(handle: _Handle) -> str:
        return enter("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetSerial(handle: _Handle) -> str:
        return enter("nvmlDeviceGetSerial", handle).serial

    def nvmlDeviceGetPciInfo(handle: _Handle) -> _Struct:
        gpu = enter("nvmlDeviceGetPciInfo", handle)
        domain, bus, rest = gpu.pci_bus_id.split(":")
        device = rest.split(".")[0]
        return _Struct(
            busIdLegacy=f"{int(domain, 16):04X}:{bus}:{rest}",
            domain=int(domain, 16),
            bus=int(bus, 16),
            device=int(device, 16),
            pciDeviceId=0x233010DE,
            pciSubSystemId=0x16C110DE,
            busId=gpu.pci_bus_id,
        )

    def nvmlDeviceGetTotalEccErrors(handle: _Handle, errorType: int, counterType: int) -> int:
        gpu = enter("nvmlDeviceGetTotalEccErrors", handle)
        volatile = counterType == CONSTANTS["NVML_VOLATILE_ECC"]
        if errorType == CONSTANTS["NVML_MEMORY_ERROR_TYPE_UNCORRECTED"]:
            return gpu.volatile_dbe if volatile else gpu.aggregate_dbe
        return gpu.volatile_sbe if volatile else gpu.aggregate_sbe

    def nvmlDeviceGetRetiredPages(device: _Handle, sourceFilter: int) -> list[int]:
        gpu = enter("nvmlDeviceGetRetiredPages", device)
        double = CONSTANTS["NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"]
        return list(gpu.retired_dbe if sourceFilter == double else gpu.retired_sbe)

    def nvmlDeviceGetRetiredPagesPendingStatus(device: _Handle) -> int:
        return enter("nvmlDeviceGetRetiredPagesPendingStatus", device).retired_pending

    def nvmlDeviceGetRemappedRows(device: _Handle) -> tuple[int, int, int, int]:
        return tuple(enter("nvmlDeviceGetRemappedRows", device).remapped_rows)

    def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
        return enter("nvmlDeviceGetCurrentClocksEventReasons", handle).clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(handle: _Handle) -> int:
        return enter("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_reasons

    def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
        return enter("nvmlDeviceGetTemperature", handle).temperature

    def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
        return enter("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetUtilizationRates(handle: _Handle) -> _Struct:
        gpu = enter("nvmlDeviceGetUtilizationRates", handle)
        return _Struct(gpu=gpu.utilization[0], memory=gpu.utilization[1])

    def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> _Struct:
        gpu = enter("nvmlDeviceGetMemoryInfo", handle)
        total, used = gpu.memory
        return _Struct(total=total, free=total - used, used=used)

    def nvmlDeviceGetPcieReplayCounter(handle: _Handle) -> int:
        return enter("nvmlDeviceGetPcieReplayCounter", handle).pcie_replay

    def nvmlDeviceGetCurrPcieLinkGeneration(handle: _Handle) -> int:
        return enter("nvmlDeviceGetCurrPcieLinkGeneration", handle).pcie[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(handle: _Handle) -> int:
        return enter("nvmlDeviceGetMaxPcieLinkGeneration", handle).pcie[1]

    def nvmlDeviceGetCurrPcieLinkWidth(handle: _Handle) -> int:
        return enter("nvmlDeviceGetCurrPcieLinkWidth", handle).pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(handle: _Handle) -> int:
        return enter("nvmlDeviceGetMaxPcieLinkWidth", handle).pcie[3]

    def nvmlDeviceGetNvLinkState(device: _Handle, link: int) -> int:
        gpu = enter("nvmlDeviceGetNvLinkState", device)
        if not gpu.nvlink_states:
            raise NVMLError(CONSTANTS["NVML_ERROR_NOT_SUPPORTED"])
        if not 0 <= link < len(gpu.nvlink_states):
            raise NVMLError(CONSTANTS["NVML_ERROR_INVALID_ARGUMENT"])
        return gpu.nvlink_states[link]

    def nvmlDeviceGetNvLinkErrorCounter(device: _Handle, link: int, counter: int) -> int:
        gpu = enter("nvmlDeviceGetNvLinkErrorCounter", device)
        if not 0 <= link < len(gpu.nvlink_states):
            raise NVMLError(CONSTANTS["NVML_ERROR_INVALID_ARGUMENT"])
        return gpu.nvlink_counters.get((link, counter), 0)

    def nvmlDeviceGetFieldValues(handle: _Handle, fieldIds: list[Any]) -> list[_Struct]:
        gpu = enter("nvmlDeviceGetFieldValues", handle)
        values = []
        for requested in fieldIds:
            field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
            known = field_id in gpu.nvlink_totals
            values.append(
                _Struct(
                    fieldId=field_id,
                    scopeId=scope,
                    timestamp=0,
                    latencyUsec=0,
                    valueType=CONSTANTS["NVML_VALUE_TYPE_UNSIGNED_LONG_LONG"],
                    nvmlReturn=0 if known else CONSTANTS["NVML_ERROR_NOT_SUPPORTED"],
                    value=_Struct(ullVal=gpu.nvlink_totals.get(field_id, 0)),
                )
            )
        return values

    for name, fn in list(locals().items()):
        if name in FUNCTIONS and name not in world.missing:
            setattr(module, name, fn)
    return module
