"""GPU backends: where the sidecar's GPU inventory, health findings and telemetry come from.

A backend is a :class:`~slurm_recovery.sidecar.base.Source` (``poll``/``close``) that also
knows the node's GPUs (:meth:`GpuBackend.inventory`) and their latest plain readings
(:meth:`GpuBackend.telemetry`, for the status event, never findings). ``nvml`` reads the
NVIDIA driver; the simulated backend stands in for it on GPU-less machines.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from slurm_recovery.sidecar.base import GPU_CHECKS, SEVERITIES, Finding
from slurm_recovery.signals.xid import normalize_pci_bus_id

__all__ = [
    "DRIVER_MISMATCH",
    "DriverMismatch",
    "GpuBackend",
    "GpuInfo",
    "gpu_finding",
    "inventory_finding",
    "pci_index",
]


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the driver enumerates it. ``pci_bus_id`` is as the backend reports it
    (NVML: ``00000000:3B:00.0``); :func:`normalize_pci_bus_id` makes it comparable."""

    index: int
    uuid: str
    pci_bus_id: str
    name: str
    serial: str = ""

    def to_payload(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "name": self.name,
            "serial": self.serial,
        }


@runtime_checkable
class GpuBackend(Protocol):
    """The GPUs of this node. ``poll`` returns findings (``gpu_finding``, ``gpu_inventory``)
    for what changed since the last call and never raises; ``telemetry`` returns the last
    plain readings per GPU index (temperature, power, utilization, ...), JSON-ready."""

    name: str
    fast: bool

    def inventory(self) -> list[GpuInfo]: ...

    def poll(self, now: float) -> list[Finding]: ...

    def telemetry(self) -> dict[int, dict[str, Any]]: ...

    def close(self) -> None: ...


def pci_index(gpus: Iterable[GpuInfo]) -> dict[str, int]:
    """Normalized PCI bus id -> GPU index, for naming the GPU of a kernel-log XID."""
    table: dict[str, int] = {}
    for gpu in gpus:
        key = normalize_pci_bus_id(gpu.pci_bus_id)
        if key is not None:
            table[key] = gpu.index
    return table


def gpu_finding(
    check: str,
    now: float,
    gpu: int | None,
    detail: str,
    *,
    severity: str | None = None,
    **extra: Any,
) -> Finding:
    """A ``gpu_finding`` for one of :data:`~slurm_recovery.sidecar.base.GPU_CHECKS`, with the
    check's usual severity unless ``severity`` says otherwise."""
    if check not in GPU_CHECKS:
        raise ValueError(f"unknown GPU check {check!r}; known: {', '.join(GPU_CHECKS)}")
    level = severity or GPU_CHECKS[check]
    if level not in SEVERITIES:
        raise ValueError(f"unknown severity {level!r}; known: {', '.join(SEVERITIES)}")
    payload = {"check": check, "severity": level, "detail": detail, **extra}
    return Finding(kind="gpu_finding", observed_at=now, gpu=gpu, payload=payload)


def inventory_finding(gpus: Iterable[GpuInfo], expected: int, now: float) -> Finding:
    """The ``gpu_inventory`` evidence: what the driver enumerates and what the node expects."""
    listed = [g.to_payload() for g in sorted(gpus, key=lambda g: g.index)]
    return Finding(
        kind="gpu_inventory", observed_at=now, payload={"gpus": listed, "expected": expected}
    )


#: The node's check when the host's NVIDIA libraries and the loaded kernel module differ.
DRIVER_MISMATCH = "driver_version_mismatch"


@dataclass
class DriverMismatch:
    """The node's ``driver_version_mismatch`` condition as every backend reports it (NVML when
    its own ``nvmlInit`` answers LIB_RM_VERSION_MISMATCH or the driver's files show the loaded
    module and the library a new process would load at different versions,
    :mod:`~slurm_recovery.sidecar.gpu.driver`; the simulated backend when it is injected): the
    one place that knows the check, its severity (fatal, of
    :data:`~slurm_recovery.sidecar.base.GPU_CHECKS`), its words and its rhythm.

    :meth:`holds` while the condition holds returns the fatal finding of the node (no GPU) the
    first time and again every ``repeat_after`` seconds (the condition lasts until a reboot:
    a job failing hours later still has one in its evidence window), None in between;
    :meth:`ended` returns the ``cleared`` finding (severity info) once, if one was reported.
    :attr:`by` is the ``call`` that last said it holds (``nvmlInit``, ``driver_files``), so a
    backend with two ways of seeing it ends it only by the way that reported it.
    """

    repeat_after: float = 300.0
    detail: str = ""
    by: str | None = None
    _last: float | None = field(default=None, repr=False)

    @property
    def reported(self) -> bool:
        return self._last is not None

    def holds(self, now: float, cause: str, **extra: Any) -> Finding | None:
        """``cause``: what failed and how (``nvmlInit failed: NVMLError_LibRmVersionMismatch:
        ...``); ``extra`` goes into the payload (``call``, ``origin``)."""
        self.by = extra.get("call")
        if self._last is not None and 0 <= now - self._last < self.repeat_after:
            return None
        self._last = now
        self.detail = (
            f"{cause}: this node's NVIDIA driver libraries and its loaded kernel module are "
            "different versions (a driver upgraded without a reboot); no new GPU process can "
            "start here until the node is rebooted"
        )
        return gpu_finding(DRIVER_MISMATCH, now, None, self.detail, **extra)

    def ended(self, now: float, *, reported_by: str | None = None, **extra: Any) -> Finding | None:
        """The condition is gone (``nvmlInit`` succeeded, the versions agree): ``cleared``, if
        it was reported (and, given ``reported_by``, if that call is what reported it)."""
        if self._last is None or (reported_by is not None and self.by != reported_by):
            return None
        self._last = None
        self.by = None
        return gpu_finding(
            DRIVER_MISMATCH,
            now,
            None,
            f"cleared: {self.detail}",
            severity="info",
            cleared=True,
            **extra,
        )
