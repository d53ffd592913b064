"""A sidecar's status: what it is judged on for change, and the heartbeat that says "unchanged".

Both ends compute a status's *condition* (:func:`status_condition`) with this one function: the
controller to decide whether a full status changes its node's report, the sidecar to decide
whether it need send one. Most minutes nothing changed, and the sidecar sends a heartbeat
instead (issue 29; docs/performance.md, "Heartbeats")::

    POST /v1/heartbeat   {"node": "n1", "condition": "<64 hex digits>"}

signed as any sidecar request (its session's HMAC, or MUNGE). ``condition`` is
:func:`condition_digest` of the condition of the last full status the controller accepted from
this sidecar. The controller answers ``200 {"status": "held"}`` when that is the condition of
the report it holds for the node (the node is heard, nothing is parsed or stored), else
``200 {"status": "wanted"}`` (it holds no report, holds another, or is storing a change): the
sidecar then sends its full status through its queue as before. A heartbeat is never queued
and never retried: a newer one, or the full status, replaces it.

The digest names the condition's version (:data:`CONDITION_VERSION`), so a sidecar and a
controller that judge a status differently (a rolling upgrade that changed this module) never
agree on a digest: the controller asks for full statuses, which it judges itself.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from slurm_recovery.contract.wire import WireError, node_name_ok

#: The event kind of a full status.
STATUS_KIND = "sidecar_status"
#: Where heartbeats go.
HEARTBEAT_PATH = "/v1/heartbeat"
#: The controller's answers: the condition is the one it holds; or send the full status.
HELD, WANTED = "held", "wanted"
#: Bumped whenever :func:`status_condition` judges a status differently.
CONDITION_VERSION = 1
#: The largest heartbeat body accepted (a node name of 128 and the digest fit in 256).
MAX_HEARTBEAT_BYTES = 512
#: Per-GPU readings that say what a GPU is, not how busy or warm it is this minute.
GPU_CONDITION_KEYS = ("lost", "conditions")

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_DIGEST = re.compile(r"[0-9a-f]{64}")


def source_condition(text: object) -> str:
    """A source's status line as a condition: "ok" for any line that starts so (its counts,
    "ok, following 3 job(s)", are readings), else the problem with its numbers blanked
    ("degraded: nvmlDeviceGetCount has not returned for N s")."""
    line = str(text)
    if line == "ok" or line.startswith("ok,"):
        return "ok"
    return _NUMBER.sub("N", line)


def status_condition(payload: Mapping[str, Any]) -> dict[str, Any]:
    """What a ``sidecar_status`` is judged on for change: which sidecar (version, start), its
    losses (drops, dead letters, bad spool files), each source ok or what is wrong, the open
    fatal conditions, whether delivery fails, and which GPUs it sees (lost or with open
    conditions). Not the readings that move every minute: queue length, delivered counts,
    temperatures, power, utilization, memory. ``payload`` as it travels (JSON types)."""
    delivery = payload.get("delivery")
    last_error = delivery.get("last_error") if isinstance(delivery, Mapping) else ""
    sources = payload.get("sources")
    gpus = payload.get("gpus")
    condition: dict[str, Any] = {
        key: payload.get(key)
        for key in ("version", "started_at", "dropped", "dead_lettered", "spool_bad", "fatal")
    }
    condition["sources"] = (
        {str(name): source_condition(text) for name, text in sources.items()}
        if isinstance(sources, Mapping)
        else None
    )
    condition["delivery_failing"] = bool(last_error)
    if isinstance(gpus, Mapping):
        condition["gpus"] = {
            str(index): {k: readings[k] for k in GPU_CONDITION_KEYS if k in readings}
            if isinstance(readings, Mapping)
            else None
            for index, readings in gpus.items()
        }
    return condition


def condition_digest(condition: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the condition's canonical JSON, prefixed by its version: equal digests,
    equal conditions as the same code judges them."""
    text = json.dumps(condition, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"srecovery-condition-v{CONDITION_VERSION}\n{text}".encode()).hexdigest()


def payload_digest(payload: Mapping[str, Any]) -> str:
    """The digest of a status payload's condition, the payload taken as it will travel (a
    tuple becomes a list, an int key a string), so the sidecar computes what the controller
    will."""
    wire = json.loads(json.dumps(payload, separators=(",", ":"), default=str))
    return condition_digest(status_condition(wire))


def heartbeat_body(node: str, digest: str) -> bytes:
    return json.dumps({"node": node, "condition": digest}, separators=(",", ":")).encode()


def parse_heartbeat(body: bytes) -> tuple[str, str]:
    """A heartbeat's body -> (node, digest); WireError says what is wrong."""
    if len(body) > MAX_HEARTBEAT_BYTES:
        raise WireError(f"a heartbeat is at most {MAX_HEARTBEAT_BYTES} bytes")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"heartbeat body is not JSON: {exc}") from exc
    if not isinstance(data, dict) or set(data) != {"node", "condition"}:
        raise WireError('heartbeat body must be {"node": NAME, "condition": DIGEST}')
    node, digest = data["node"], data["condition"]
    if not isinstance(node, str) or not node_name_ok(node):
        raise WireError("heartbeat node: must be a Slurm node name")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise WireError("heartbeat condition: must be 64 lower-case hex digits (SHA-256)")
    return node, digest
