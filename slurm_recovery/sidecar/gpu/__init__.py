"""GPU backends: where the sidecar's GPU inventory, health findings and telemetry come from.

A backend is a :class:`~slurm_recovery.sidecar.base.Source` (``poll``/``close``) that also
knows the node's GPUs (:meth:`GpuBackend.inventory`) and their latest plain readings
(:meth:`GpuBackend.telemetry`, for the status event, never findings). ``nvml`` reads the
NVIDIA driver; the simulated backend stands in for it on GPU-less machines.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from slurm_recovery.sidecar.base import GPU_CHECKS, SEVERITIES, Finding
from slurm_recovery.signals.xid import normalize_pci_bus_id

__all__ = [
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
