"""What every signal source gives the sidecar: findings, as evidence events for the controller.

One module per source (NVML, simulated GPUs, kernel-log XIDs, InfiniBand, hook spool), each
behind :class:`Source`; ``registry`` wires them; nothing else knows their insides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

#: Evidence kinds the sidecar and hooks send (the controller's wire format, docs/controller.md):
#: - ``xid``          {xid, message, pci?, pid?, process?, origin: "kmsg"|"nvml"|"sim",
#:                    repeats? (kmsg: identical XIDs not sent since the last one)}
#: - ``gpu_finding``  {check, severity, detail, ...} (see GPU_CHECKS)
#: - ``ib_finding``   {port, check, severity, detail}
#: - ``gpu_inventory``{gpus: [{index, uuid, pci_bus_id, name, serial}], expected}
#: - ``job_start``    {nodes, gpus?, stdout?, stderr?, restart_count, context}
#: - ``job_end``      {exit_code, signal, derived_exit_code?, restart_count, nodes, context}
#: - ``sidecar_status`` {dropped, queued, sources: {name: "ok"|error text}}
#: - ``progress``     {step, ts, rank?, origin: "log"} (job-log follower, per job), or
#:                    {step, ts, origin: "file", rank?, tokens?, samples?, step_time?, loss?,
#:                    restart_count?} (progress-file follower; loss "nan"/"inf"/"-inf")
#: - ``flight_recorder`` {rank, backend, version, groups: [...], restart_count?} (ditto: one
#:                    PyTorch flight-recorder dump, signals/flight_recorder.py)
#: - ``gpu_activity`` {busy, utilization, gpus} (per job, when its GPUs turn busy or idle)
#: - ``log_signature``{signature, fault_class, blame_node, text, knock_on, ...} (ditto)
KINDS = (
    "xid",
    "gpu_finding",
    "ib_finding",
    "gpu_inventory",
    "job_start",
    "job_end",
    "sidecar_status",
)

#: Severity of a finding: ``fatal`` means the node cannot run GPU work correctly now (the
#: controller treats it like a fatal XID); ``warning`` is evidence, not a verdict; ``info``
#: is context (inventory, healed flaps). A finding with ``cleared: true`` and severity ``info``
#: ends the condition of the same ``check`` and GPU (the health file drops it).
SEVERITIES = ("fatal", "warning", "info")

#: GPU checks and their usual severity (a backend may raise or lower it with a reason).
GPU_CHECKS: Mapping[str, str] = {
    "gpu_lost": "fatal",  # fewer GPUs than expected, or one stopped answering
    "ecc_dbe": "fatal",  # volatile double-bit (uncorrectable) ECC errors went up
    "remap_failure": "fatal",  # row remapping failed: the GPU needs repair
    "retired_pages_pending": "warning",  # a page retirement waits for a GPU reset
    "remap_pending": "warning",  # a row remap waits for a GPU reset
    "ecc_sbe_storm": "warning",  # corrected errors rising fast
    "throttle_hw_slowdown": "warning",
    "throttle_thermal": "warning",
    "throttle_power_brake": "warning",
    "pcie_link_downgrade": "warning",  # current gen/width below the maximum
    "pcie_replay_rising": "warning",
    "nvlink_down": "fatal",  # a link that should be up is down
    "nvlink_errors_rising": "warning",
    "nvml_error": "warning",  # NVML itself failed or timed out: reported, never fatal
    # the sidecar's own nvmlInit got NVML_ERROR_LIB_RM_VERSION_MISMATCH: the host's NVML
    # library and the loaded kernel module differ (a driver upgraded without a reboot), so no
    # new GPU process starts here until a reboot; of the node, never of a GPU (gpu None)
    "driver_version_mismatch": "fatal",
    "gpu_reset": "info",  # the GPU was reset (or a simulated fault cleared): ends its conditions
}


@dataclass(frozen=True)
class Finding:
    """One fact a source observed on this node: becomes one evidence event."""

    kind: str
    observed_at: float
    gpu: int | None = None
    job_id: int | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)

    def to_event(self, node: str) -> dict[str, Any]:
        event: dict[str, Any] = {
            "kind": self.kind,
            "observed_at": self.observed_at,
            "node": node,
            "payload": dict(self.payload),
        }
        if self.gpu is not None:
            event["gpu"] = self.gpu
        if self.job_id is not None:
            event["job_id"] = self.job_id
        return event


class Source(Protocol):
    """A signal source. ``poll`` is called by the sidecar loop: every ``fast`` source on each
    short tick (~0.2 s, for XIDs and hook events), the others every ``sidecar.poll_interval``.
    It returns what is new since the last call and never raises for trouble in what it reads
    (it returns a finding about it instead); ``close`` releases files and threads."""

    name: str
    fast: bool

    def poll(self, now: float) -> list[Finding]: ...

    def close(self) -> None: ...


#: Optional methods a source may also have, used by the daemon when present:
#: ``commit()`` — called only once the outbox holds what ``poll`` returned (persist "delivered
#: up to" here, so a crash or a full disk between the two never loses a finding);
#: ``status() -> str`` — "ok" or what is wrong, for the ``sidecar_status`` event;
#: ``set_gpus(inventory)`` — the GPU inventory, for sources that map PCI ids to GPU indexes;
#: ``role`` — the sender role for its events ("sidecar", or "hook" for the hook spool);
#: ``see(findings)`` — every finding the sidecar queued (the job-log follower learns of jobs).
OPTIONAL_SOURCE_METHODS = ("commit", "status", "set_gpus", "role", "see")
