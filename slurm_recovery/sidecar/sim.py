"""The simulated GPU backend: N fake GPUs per node and fault injection, for GPU-less hosts.

State lives in ``<sim_dir>/<node>.json`` (see :func:`new_state`): the inventory (stable fake
UUIDs, PCI bus ids and serials), each GPU's telemetry (present, ECC double-bit counts,
throttle reasons, PCIe link), and the injected events, each with an id. ``srecovery sim
inject`` (:func:`inject`) and the sidecar change it under an fcntl lock on ``<node>.lock``,
writing a temporary file and renaming it over the old one, so readers never see half a file.

Injected XIDs and GPU resets (``--clear``) take the sidecar's fast path
(:meth:`SimBackend.poll_xids`, every ``sidecar.fast_interval``) and are delivered once: the id
of the last one the outbox holds is saved in the state file (``xid_delivered``), so a
restarted sidecar never re-sends one.
Telemetry faults show on the slow poll (:meth:`SimBackend.poll`) as ``gpu_finding`` evidence,
the way NVML reports them: a condition is reported when it appears or worsens and reported
``cleared`` when it goes away; a restarted sidecar reports the conditions present.

One condition is the node's, not a GPU's: ``driver_mismatch`` (``srecovery sim inject
--driver-mismatch``), the node's NVIDIA libraries and loaded kernel module at different
versions (a driver upgraded without a reboot). While it holds the backend answers as the NVML
backend does after its own ``nvmlInit`` failed with LIB_RM_VERSION_MISMATCH: the fatal
``driver_version_mismatch`` finding of the node (:class:`~slurm_recovery.sidecar.gpu.
DriverMismatch`, shared with NVML), again every ``repeat_after``, and no GPUs (no inventory,
no telemetry, no GPU findings); injected XIDs still come (the kernel log does not need NVML).
``--clear`` of every GPU ends it, as the reboot that fixes it would: ``cleared``, then the
inventory again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from slurm_recovery.sidecar.base import Finding
from slurm_recovery.sidecar.gpu import DriverMismatch, GpuInfo, gpu_finding, inventory_finding

log = logging.getLogger(__name__)

FORMAT = 1
GPU_NAME = "NVIDIA H100 80GB HBM3 (simulated)"
#: What the simulated ``nvmlInit`` says while the driver's versions differ (pynvml's words).
MISMATCH_CAUSE = (
    "nvmlInit failed: NVMLError_LibRmVersionMismatch: RM has detected an NVML/RM version "
    "mismatch. (simulated)"
)
#: PCI buses of the eight GPUs of a typical HGX board; more GPUs continue past them.
_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_UUID_NAMESPACE = uuid.UUID("6f1d3a52-8f0e-4c59-9a57-2d1c7e0b4a11")
PCIE_GEN_MAX, PCIE_WIDTH_MAX = 5, 16
THROTTLE_REASONS = ("thermal", "hw_slowdown", "power_brake")
#: Injected events kept in the state file once delivered (the newest; older ones are trimmed).
KEEP_EVENTS = 1000
#: The state file is read again after this many seconds even if it looks unchanged.
RELOAD_SECONDS = 5.0
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")

#: Messages the driver logs for common XIDs (used when ``inject`` is given none).
XID_MESSAGES: Mapping[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f2a_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    43: "Ch 00000008",
    45: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU.",
    63: "Row Remapping: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapping: Failed to remap row.",
    74: "NVLink: fatal error detected on link 3",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
}


class SimError(ValueError):
    """A bad injection (unknown GPU, bad node name) or an unreadable state file."""


# --------------------------------------------------------------------------------- state


def check_node(node: str) -> str:
    if not isinstance(node, str) or not _NODE.fullmatch(node):
        raise SimError(f"{node!r} is not a Slurm node name")
    return node


def state_path(sim_dir: str | os.PathLike[str], node: str) -> Path:
    return Path(sim_dir) / f"{check_node(node)}.json"


def _gpu(node: str, index: int) -> dict[str, Any]:
    bus = _PCI_BUSES[index] if index < len(_PCI_BUSES) else 0xDC + index - len(_PCI_BUSES)
    digest = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return {
        "index": index,
        "uuid": f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}",
        "pci_bus_id": f"{(bus >> 8):08X}:{bus & 0xFF:02X}:00.0",
        "name": GPU_NAME,
        "serial": f"16{int(digest[:12], 16) % 10**11:011d}",
        "present": True,
        "ecc_dbe_volatile": 0,
        "ecc_dbe_aggregate": 0,
        "throttle": [],
        "pcie_gen": PCIE_GEN_MAX,
        "pcie_gen_max": PCIE_GEN_MAX,
        "pcie_width": PCIE_WIDTH_MAX,
        "pcie_width_max": PCIE_WIDTH_MAX,
        "utilization": 0,
    }


def new_state(node: str, gpus: int) -> dict[str, Any]:
    """A healthy node with ``gpus`` GPUs and no injected events."""
    return {
        "format": FORMAT,
        "node": check_node(node),
        "gpus": [_gpu(node, i) for i in range(gpus)],
        "events": [],
        "next_id": 1,
        "xid_delivered": 0,
    }


def load_state(sim_dir: str | os.PathLike[str], node: str) -> dict[str, Any] | None:
    """The node's state, or None when nothing was simulated for it yet."""
    path = state_path(sim_dir, node)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        state = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SimError(f"{path}: not valid JSON ({exc}); delete it to start over") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise SimError(f"{path}: not a simulated-GPU state file (format {FORMAT})")
    return state


def _write_state(sim_dir: Path, node: str, state: Mapping[str, Any]) -> None:
    path = state_path(sim_dir, node)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(state, fh, indent=1)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(sim_dir: str | os.PathLike[str], node: str) -> Iterator[Path]:
    folder = Path(sim_dir)
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd = os.open(folder / f"{check_node(node)}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield folder
    finally:
        os.close(fd)


def _resize(state: dict[str, Any], node: str, gpus: int) -> None:
    have = state["gpus"]
    if len(have) > gpus:
        del have[gpus:]
    have.extend(_gpu(node, i) for i in range(len(have), gpus))


def inject(
    sim_dir: str | os.PathLike[str],
    node: str,
    *,
    gpu: int | None = None,
    xid: int | None = None,
    message: str | None = None,
    ecc_dbe: int = 0,
    throttle: str | None = None,
    lose_gpu: bool = False,
    link_downgrade: bool = False,
    utilization: int | None = None,
    driver_mismatch: bool = False,
    clear: bool = False,
    gpus_if_new: int = 8,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """Record faults on ``node`` (one event each, in this order: clear, driver_mismatch, xid,
    ecc_dbe, throttle, lose_gpu, link_downgrade, utilization) and return the events. ``clear``
    resets every GPU (or only ``gpu``) to healthy, as a GPU reset would; a clear of every GPU
    also ends the node's ``driver_mismatch`` (its libraries and kernel module differ until a
    reboot: no GPU reset ends it). ``utilization`` (percent) sets how busy the GPU (or every
    GPU) looks, so a simulated job can look busy, then idle. The state is created with
    ``gpus_if_new`` GPUs if the node has none yet."""
    faults = xid is not None or ecc_dbe > 0 or throttle or lose_gpu or link_downgrade
    if not faults and not clear and utilization is None and not driver_mismatch:
        raise SimError(
            "nothing to inject: give --xid, --ecc-dbe, --throttle, --lose-gpu, "
            "--link-downgrade, --utilization, --driver-mismatch or --clear"
        )
    if faults and gpu is None:
        raise SimError("which GPU? give --gpu INDEX")
    if driver_mismatch and gpu is not None:
        raise SimError("the driver mismatch is the node's, not a GPU's: leave out --gpu")
    if utilization is not None and not 0 <= utilization <= 100:
        raise SimError("utilization is a percentage, 0 to 100")
    if throttle is not None and throttle not in THROTTLE_REASONS:
        raise SimError(f"throttle reason must be one of {', '.join(THROTTLE_REASONS)}")
    at = time.time() if now is None else now
    with _locked(sim_dir, node) as folder:
        state = load_state(folder, node) or new_state(node, gpus_if_new)
        gpus = state["gpus"]
        if gpu is not None and not 0 <= gpu < len(gpus):
            raise SimError(f"{node} has GPUs 0..{len(gpus) - 1}; there is no GPU {gpu}")
        recorded: list[dict[str, Any]] = []

        def record(kind: str, target: int | None, **extra: Any) -> None:
            event = {"id": state["next_id"], "at": at, "type": kind, "gpu": target, **extra}
            state["next_id"] += 1
            state["events"].append(event)
            recorded.append(event)

        if clear:
            for g in gpus if gpu is None else [gpus[gpu]]:
                fresh = _gpu(node, g["index"])
                fresh["ecc_dbe_aggregate"] = g["ecc_dbe_aggregate"]  # survives a reset
                g.update(fresh)
            if gpu is None:
                state.pop("driver_mismatch", None)  # as a reboot would
            record("clear", gpu)
        if driver_mismatch:
            state["driver_mismatch"] = True
            record("driver_mismatch", None)
        if gpu is not None and faults:
            g = gpus[gpu]
            if xid is not None:
                text = message or XID_MESSAGES.get(xid, f"simulated XID {xid}")
                record("xid", gpu, xid=xid, message=text)
            if ecc_dbe > 0:
                g["ecc_dbe_volatile"] += ecc_dbe
                g["ecc_dbe_aggregate"] += ecc_dbe
                record("ecc_dbe", gpu, count=ecc_dbe)
            if throttle:
                if throttle not in g["throttle"]:
                    g["throttle"].append(throttle)
                record("throttle", gpu, reason=throttle)
            if lose_gpu:
                g["present"] = False
                record("lose_gpu", gpu)
            if link_downgrade:
                g["pcie_gen"] = max(1, g["pcie_gen_max"] - 2)
                g["pcie_width"] = max(1, g["pcie_width_max"] // 2)
                record("link_downgrade", gpu)
        if utilization is not None:
            for g in gpus if gpu is None else [gpus[gpu]]:
                g["utilization"] = utilization
            record("utilization", gpu, percent=utilization)
        _trim(state)
        _write_state(folder, node, state)
    return recorded


def _trim(state: dict[str, Any]) -> None:
    events = state["events"]
    excess = len(events) - KEEP_EVENTS
    if excess > 0:
        delivered = state["xid_delivered"]
        drop = 0
        while drop < excess and events[drop]["id"] <= delivered:
            drop += 1
        del events[:drop]


# --------------------------------------------------------------------------------- backend


class SimBackend:
    """A :class:`~slurm_recovery.sidecar.gpu.GpuBackend` over ``<sim_dir>/<node>.json`` with
    ``gpus`` GPUs (the file is created, or resized to ``gpus``, on open). ``expected_gpus``
    0 means ``gpus``. ``repeat_after``: how often an injected driver mismatch is sent again
    while it holds (as NVML's)."""

    name = "sim"
    fast = False

    def __init__(
        self,
        node: str,
        sim_dir: str | os.PathLike[str],
        gpus: int,
        expected_gpus: int = 0,
        *,
        repeat_after: float = 300.0,
    ) -> None:
        if gpus < 0:
            raise SimError("the number of simulated GPUs cannot be negative")
        self.node = check_node(node)
        self.sim_dir = Path(sim_dir)
        self.gpus = gpus
        self.expected = expected_gpus or gpus
        self.path = state_path(self.sim_dir, node)
        with _locked(self.sim_dir, node) as folder:
            state = load_state(folder, node)
            if state is None or len(state["gpus"]) != gpus:
                if state is not None:
                    log.info("%s: resizing the simulated node to %d GPUs", self.path, gpus)
                state = state or new_state(node, gpus)
                _resize(state, node, gpus)
                _write_state(folder, node, state)
        self._state = state
        self._stamp: tuple[int, int, int] | None = None
        self._scanned: tuple[int, int, int] | None = None  # the file poll_xids last read
        self._loaded_at = 0.0
        self._delivered = int(state["xid_delivered"])
        self._pending = self._delivered
        #: (check, gpu) -> what was reported, to report changes only
        self._reported: dict[tuple[str, int | None], Mapping[str, Any]] = {}
        self._inventory_reported: list[GpuInfo] | None = None
        self._mismatch = DriverMismatch(repeat_after)

    # --- reading the file (cheaply: only when it changed) ------------------------------------

    def _current(self) -> dict[str, Any]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self._state
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        # a file rewritten within the clock's granularity, at the same size, on a reused
        # inode looks unchanged: read it again every few seconds anyway
        if stamp != self._stamp or time.monotonic() - self._loaded_at > RELOAD_SECONDS:
            state = load_state(self.sim_dir, self.node)
            if state is not None:
                self._state = state
            self._stamp = stamp
            self._loaded_at = time.monotonic()
            self._scanned = None
        return self._state

    # --- the GPU backend ---------------------------------------------------------------------

    @staticmethod
    def _mismatched(state: Mapping[str, Any]) -> bool:
        return bool(state.get("driver_mismatch"))

    def status(self) -> str:
        """``"ok"``, or why the simulated NVML is degraded (for the sidecar's status event)."""
        return f"degraded: {MISMATCH_CAUSE}" if self._mismatched(self._current()) else "ok"

    def inventory(self) -> list[GpuInfo]:
        """The GPUs the (simulated) driver enumerates now (none while its versions differ)."""
        state = self._current()
        if self._mismatched(state):
            return []
        return [
            GpuInfo(g["index"], g["uuid"], g["pci_bus_id"], g["name"], g["serial"])
            for g in state["gpus"]
            if g["present"]
        ]

    def telemetry(self) -> dict[int, dict[str, Any]]:
        """Plain readings per present GPU (steady, plausible values for an idle GPU); none
        while the driver's versions differ."""
        state = self._current()
        if self._mismatched(state):
            return {}
        return {
            g["index"]: {
                "temperature_c": 34 + g["index"] % 4,
                "power_w": 71.5,
                "utilization_gpu": g.get("utilization", 0),
                "memory_used_mib": 0,
                "ecc_dbe_volatile": g["ecc_dbe_volatile"],
                "throttle": list(g["throttle"]),
                "pcie_gen": g["pcie_gen"],
                "pcie_width": g["pcie_width"],
            }
            for g in state["gpus"]
            if g["present"]
        }

    def poll(self, now: float) -> list[Finding]:
        """The slow poll: ``gpu_inventory`` when the GPUs the driver sees changed (and on the
        first poll), ``gpu_finding`` for each condition that appeared or changed since the
        last poll, and a ``cleared`` one (severity info) for each that went away. While the
        driver's versions differ: only the node's ``driver_version_mismatch`` (again every
        ``repeat_after``), as NVML after a failed ``nvmlInit``; the GPU conditions and the
        inventory are taken up again when it ends (the inventory sent again)."""
        state = self._current()
        if self._mismatched(state):
            self._inventory_reported = None  # NVML enumerates afresh after a good nvmlInit
            found = self._mismatch.holds(now, MISMATCH_CAUSE, call="nvmlInit", origin="sim")
            return [] if found is None else [found]
        findings = []
        cleared = self._mismatch.ended(now, origin="sim")
        if cleared is not None:
            findings.append(cleared)
        inventory = self.inventory()
        if inventory != self._inventory_reported:
            findings.append(inventory_finding(inventory, self.expected, now))
            self._inventory_reported = inventory
        conditions = self._conditions(state)
        for key, payload in conditions.items():
            if self._reported.get(key) != payload:
                findings.append(Finding("gpu_finding", now, gpu=key[1], payload=payload))
        for key, old in self._reported.items():
            if key not in conditions:
                findings.append(
                    gpu_finding(
                        key[0],
                        now,
                        key[1],
                        f"cleared: {old['detail']}",
                        severity="info",
                        cleared=True,
                        origin="sim",
                    )
                )
        self._reported = conditions
        return findings

    def _conditions(self, state: Mapping[str, Any]) -> dict[tuple[str, int | None], dict]:
        found: dict[tuple[str, int | None], dict] = {}

        def add(check: str, gpu: dict | None, detail: str, **extra: Any) -> None:
            if gpu is not None:
                extra.update(uuid=gpu["uuid"], pci_bus_id=gpu["pci_bus_id"])
            index = None if gpu is None else gpu["index"]
            finding = gpu_finding(check, 0.0, index, detail, **extra, origin="sim")
            found[(check, index)] = dict(finding.payload)

        gpus = state["gpus"]
        for g in gpus:
            where = f"GPU {g['index']} ({g['pci_bus_id']})"
            if not g["present"]:
                add("gpu_lost", g, f"{where} is not visible to the driver")
                continue
            if g["ecc_dbe_volatile"] > 0:
                add(
                    "ecc_dbe",
                    g,
                    f"{where}: {g['ecc_dbe_volatile']} uncorrectable (double-bit) ECC errors "
                    "since the last GPU reset",
                    volatile=g["ecc_dbe_volatile"],
                    aggregate=g["ecc_dbe_aggregate"],
                )
            for reason in g["throttle"]:
                add(f"throttle_{reason}", g, f"{where}: clocks throttled ({reason})")
            if g["pcie_gen"] < g["pcie_gen_max"] or g["pcie_width"] < g["pcie_width_max"]:
                add(
                    "pcie_link_downgrade",
                    g,
                    f"{where}: PCIe link at gen{g['pcie_gen']} x{g['pcie_width']}, below "
                    f"gen{g['pcie_gen_max']} x{g['pcie_width_max']}",
                    current_gen=g["pcie_gen"],
                    max_gen=g["pcie_gen_max"],
                    current_width=g["pcie_width"],
                    max_width=g["pcie_width_max"],
                )
        if len(gpus) < self.expected:
            add(
                "gpu_lost",
                None,
                f"{len(gpus)} GPUs on {self.node}, {self.expected} expected",
                count=len(gpus),
                expected=self.expected,
            )
        return found

    # --- the fast path: injected XIDs ---------------------------------------------------------

    def poll_xids(self, now: float) -> list[Finding]:
        """Injected XIDs and GPU resets (``--clear``) not yet delivered, oldest first: ``xid``
        evidence, and a ``gpu_finding`` of check ``gpu_reset`` per reset, each observed when
        it was injected. Call :meth:`commit_xids` once the outbox holds them."""
        state = self._current()
        if self._stamp == self._scanned and self._pending == self._delivered:
            return []  # the file did not change and everything found is committed
        self._scanned = self._stamp
        findings: list[Finding] = []
        gpus = {g["index"]: g for g in state["gpus"]}
        pending = self._delivered
        for event in state["events"]:
            if event["id"] <= self._delivered:
                continue
            kind, gpu = event["type"], event["gpu"]
            if kind == "xid":
                payload = {
                    "xid": event["xid"],
                    "message": event["message"],
                    "origin": "sim",
                    "injection": event["id"],
                }
                if gpu in gpus:
                    payload["pci"] = gpus[gpu]["pci_bus_id"]
                findings.append(Finding("xid", event["at"], gpu=gpu, payload=payload))
            elif kind == "clear":
                which = "every GPU" if gpu is None else f"GPU {gpu}"
                payload = {
                    "check": "gpu_reset",
                    "severity": "info",
                    "cleared": True,
                    "detail": f"{which} reset (srecovery sim inject --clear): faults cleared",
                    "origin": "sim",
                    "injection": event["id"],
                }
                findings.append(Finding("gpu_finding", event["at"], gpu=gpu, payload=payload))
            pending = max(pending, event["id"])
        self._pending = pending
        return findings

    def commit_xids(self) -> None:
        """Persist that everything :meth:`poll_xids` last returned is in the outbox."""
        if self._pending <= self._delivered:
            return
        with _locked(self.sim_dir, self.node) as folder:
            state = load_state(folder, self.node) or self._state
            state["xid_delivered"] = max(int(state["xid_delivered"]), self._pending)
            _trim(state)
            _write_state(folder, self.node, state)
        self._delivered = self._pending

    def close(self) -> None:
        self._reported.clear()
        self._inventory_reported = None
        self._mismatch = DriverMismatch(self._mismatch.repeat_after)


class SimXidSource:
    """Injected XIDs as a fast source (the simulated counterpart of the kernel log)."""

    name = "sim_xid"
    fast = True

    def __init__(self, backend: SimBackend) -> None:
        self.backend = backend

    def poll(self, now: float) -> list[Finding]:
        return self.backend.poll_xids(now)

    def commit(self) -> None:
        self.backend.commit_xids()

    def close(self) -> None:
        """The backend is closed by its owner (the GPU source)."""
