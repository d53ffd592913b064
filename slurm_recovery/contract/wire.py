"""The evidence wire format: what sidecars, hooks and operators send the controller.

``POST /v1/evidence`` with ``{"events": [EVENT, ...]}``, each EVENT::

    {"kind": "xid", "node": "n2", "gpu": 1, "job_id": 42,
     "observed_at": 1795960000.25, "payload": {"xid": 79, "message": "..."}}

``source`` is not taken from the body: it is the authenticated role of the sender, added by the
controller when it stores the event (:meth:`slurm_recovery.store.Evidence.from_wire`). Any
problem rejects the whole batch with a message naming the event and the field, so nothing
from a bad batch is stored. The sidecar checks its own events and the hook spool's with the
same :func:`parse_event` before it sends them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_EVENTS = 1000
MAX_PAYLOAD_BYTES = 16 * 1024
MAX_DEPTH = 8
EVENT_FIELDS = frozenset({"kind", "node", "gpu", "job_id", "observed_at", "payload"})
_KIND = re.compile(r"[a-z][a-z0-9_]{0,63}")
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: Earliest and latest believable observation times (2020 .. 2100): catches ms-vs-s mix-ups.
_EARLIEST, _LATEST = 1_577_836_800.0, 4_102_444_800.0


#: The kinds senders use today, and who sends them. Any lower-case name is accepted (a newer
#: sidecar may send a kind this controller does not know: it is stored, and decides nothing).
EVENT_KINDS: Mapping[str, str] = {
    "job_start": "prolog (node spool): a job attempt began on the node",
    "job_end": "epilog (node spool) and EpilogSlurmctld (controller): the attempt ended",
    "xid": "sidecar kmsg source, operators: an NVIDIA XID from the kernel log",
    "gpu_finding": "sidecar GPU source: an NVML fault (ECC, retired pages, lost GPU...)",
    "gpu_inventory": "sidecar GPU source: the GPUs the node shows",
    "gpu_activity": "sidecar GPU source: per-GPU utilisation and memory activity",
    "ib_finding": "sidecar InfiniBand source: a port down, degraded or erroring",
    "sidecar_status": "sidecar: its heartbeat, queue and sources",
    "progress": "sidecar progress source: a training step from the job's progress file",
    "log_signature": "sidecar job-log source: a catalogued failure line in the job's output",
    "flight_recorder": "sidecar: a summary of PyTorch's NCCL flight recorder dumps",
    "operator_report": "operators (srecovery report): a node or job reported bad, in words",
    "host_memory": "sidecar host source: the node's available memory fell low, or recovered",
    "sidecar_silent": "controller: a node's sidecar sent nothing past the grace while it ran a job",
}


def node_name_ok(name: str) -> bool:
    """Whether ``name`` is a node name the wire accepts (Slurm's characters, 1-128 long)."""
    return _NODE.fullmatch(name) is not None


class WireError(ValueError):
    """The request body is not a valid evidence batch; the message says where and why."""


@dataclass(frozen=True)
class WireEvent:
    """One checked event, as sent (the controller adds the sender's role when it stores it)."""

    kind: str
    observed_at: float
    node: str | None = None
    gpu: int | None = None
    job_id: int | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    #: the payload as the store writes it (canonical JSON: sorted keys, compact, ASCII),
    #: computed once by :func:`parse_event` so nothing downstream encodes it again ("" when
    #: the event was built some other way: then it is encoded where it is needed)
    payload_json: str = ""


def _deeper_than(payload: dict[str, Any], limit: int) -> bool:
    """Whether ``payload`` nests objects and lists more than ``limit`` levels deep (itself is
    level 1). Level by level, looking only at containers: a status with a hundred readings
    costs a few microseconds, not a call per value."""
    level, containers = 1, [payload]
    while containers:
        if level > limit:
            return True
        inner: list[Any] = []
        for container in containers:
            values = container.values() if type(container) is dict else container
            inner += [v for v in values if type(v) is dict or type(v) is list]
        level, containers = level + 1, inner
    return False


def parse_event(raw: Any, where: str) -> WireEvent:
    """One event, checked; raises WireError naming ``where`` and the field."""
    if not isinstance(raw, dict):
        raise WireError(f"{where}: must be an object")
    unknown = set(raw) - EVENT_FIELDS
    if unknown:
        raise WireError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    kind = raw.get("kind")
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        raise WireError(f"{where}.kind: must be a lower-case name like 'xid'")
    node = raw.get("node")
    if node is not None and (not isinstance(node, str) or not node_name_ok(node)):
        raise WireError(f"{where}.node: must be a Slurm node name")
    gpu = raw.get("gpu")
    if gpu is not None and (type(gpu) is not int or not 0 <= gpu < 1024):
        raise WireError(f"{where}.gpu: must be a GPU index 0..1023")
    job_id = raw.get("job_id")
    if job_id is not None and (type(job_id) is not int or not 0 < job_id < 2**63):
        raise WireError(f"{where}.job_id: must be a positive integer")
    observed = raw.get("observed_at")
    if (
        type(observed) not in (int, float)
        or not math.isfinite(observed)
        or not _EARLIEST <= observed <= _LATEST
    ):
        raise WireError(f"{where}.observed_at: must be seconds since the epoch (UTC)")
    payload = raw.get("payload", {})
    if not isinstance(payload, dict):
        raise WireError(f"{where}.payload: must be an object")
    if _deeper_than(payload, MAX_DEPTH):
        raise WireError(f"{where}.payload: nested deeper than {MAX_DEPTH} levels")
    try:  # what the store will write: UTF-8 JSON, so no lone surrogates and no NaN
        text = json.dumps(
            payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise WireError(f"{where}.payload: a string holds a lone surrogate (not Unicode)") from None
    except ValueError:
        raise WireError(f"{where}.payload: NaN and Infinity are not JSON numbers") from None
    if size > MAX_PAYLOAD_BYTES:
        raise WireError(f"{where}.payload: larger than {MAX_PAYLOAD_BYTES} bytes")
    if not text.isascii():  # the store's spelling escapes non-ASCII (store.values)
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return WireEvent(kind, float(observed), node, gpu, job_id, payload, text)


def parse_batch(body: bytes) -> list[WireEvent]:
    """The whole request body -> events, all or nothing."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise WireError(f"body is not JSON: {exc}") from exc
    if not isinstance(data, dict) or set(data) != {"events"}:
        raise WireError('body must be {"events": [...]}')
    events = data["events"]
    if not isinstance(events, list) or not 1 <= len(events) <= MAX_EVENTS:
        raise WireError(f"events must be a list of 1 to {MAX_EVENTS} events")
    return [parse_event(e, f"events[{i}]") for i, e in enumerate(events)]


def event_to_json(
    kind: str,
    observed_at: float,
    *,
    node: str | None = None,
    gpu: int | None = None,
    job_id: int | None = None,
    payload: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build one event for a batch (what senders use; ``parse_event`` is its inverse)."""
    event: dict[str, Any] = {"kind": kind, "observed_at": observed_at}
    for key, value in (("node", node), ("gpu", gpu), ("job_id", job_id)):
        if value is not None:
            event[key] = value
    if payload:
        event["payload"] = dict(payload)
    return event


def health_check_failure_line(output: Any) -> str:
    """The line of a failed site health check's output (``job_start``'s
    ``health_gate.nhc.output``, its first lines) that says why: the first with ``ERROR`` in it
    (LBNL NHC writes ``ERROR:  nhc:  Health check failed: ...``), else the last (a banner comes
    first); "" when there is none or it is not a list of strings."""
    if not isinstance(output, list):
        return ""
    lines = [line for line in output if isinstance(line, str) and line]
    return next((line for line in lines if "ERROR" in line.upper()), lines[-1] if lines else "")
