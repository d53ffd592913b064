"""The records the store keeps, as frozen dataclasses: Evidence in; incidents, advice,
actions, milestones, node state and job attempts out. Payloads are JSON objects."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from slurm_recovery.contract.wire import WireError, WireEvent

from .attempts import JobAttempt
from .values import (
    check_int,
    check_optional_int,
    check_optional_time,
    check_payload,
    check_text,
    check_time,
)

#: Milestones of an incident in the order they normally happen. Any other lower-case name is
#: accepted too, so later code can add its own without a schema change.
MILESTONES = ("failure", "detected", "decided", "action", "running_again")

#: How a scheduler step ended: done, refused or failed, or not needed (already in place).
ACTION_RESULTS = ("ok", "failed", "skipped")


@dataclass(frozen=True)
class Evidence:
    """A fact from a source (sidecar, hook, scheduler), timestamped, attributed where known to a
    node, a GPU and a job attempt (an :class:`AttemptRecord` id). ``payload`` is kept as JSON:
    it must be JSON-serialisable, and tuples in it come back as lists."""

    source: str
    kind: str
    observed_at: float
    node: str | None = None
    gpu: int | None = None
    attempt_id: int | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    job_id: int | None = None

    def __post_init__(self) -> None:
        check_text(self.source, "Evidence.source")
        check_text(self.kind, "Evidence.kind")
        object.__setattr__(
            self, "observed_at", check_time(self.observed_at, "Evidence.observed_at")
        )
        if self.node is not None:
            check_text(self.node, "Evidence.node")
        check_optional_int(self.gpu, "Evidence.gpu")
        check_optional_int(self.attempt_id, "Evidence.attempt_id", minimum=1)
        check_optional_int(self.job_id, "Evidence.job_id", minimum=1)
        payload_json = check_payload(self.payload, "Evidence.payload")
        object.__setattr__(self, "payload", json.loads(payload_json))
        object.__setattr__(self, "_payload_json", payload_json)

    @classmethod
    def from_wire(cls, event: WireEvent, source: str) -> Evidence:
        """An event as a sender sent it, from ``source`` (the sender's authenticated role).
        An event :func:`~slurm_recovery.contract.wire.parse_event` checked (its fields are
        stricter than these, its payload came from JSON and is already encoded) is taken as
        it is: the ingest does this for every report, and checking twice cost a third of it."""
        if not event.payload_json:
            try:
                return cls(
                    source=source,
                    kind=event.kind,
                    observed_at=event.observed_at,
                    node=event.node,
                    gpu=event.gpu,
                    payload=event.payload,
                    job_id=event.job_id,
                )
            except (TypeError, ValueError) as exc:
                raise WireError(str(exc)) from exc
        check_text(source, "Evidence.source")
        return cls._trusted(
            source,
            event.kind,
            event.observed_at,
            event.node,
            event.gpu,
            None,
            event.payload,
            event.payload_json,
            event.job_id,
        )

    @classmethod
    def stored(
        cls,
        source: str,
        kind: str,
        observed_at: float,
        node: str | None,
        gpu: int | None,
        attempt_id: int | None,
        payload_json: str,
        job_id: int | None,
    ) -> Evidence:
        """Evidence read back from the store: checked when it was written, so not checked
        (nor its payload re-encoded) again; reading a window of evidence stays cheap."""
        return cls._trusted(
            source,
            kind,
            observed_at,
            node,
            gpu,
            attempt_id,
            json.loads(payload_json),
            payload_json,
            job_id,
        )

    @classmethod
    def _trusted(
        cls,
        source: str,
        kind: str,
        observed_at: float,
        node: str | None,
        gpu: int | None,
        attempt_id: int | None,
        payload: Mapping[str, Any],
        payload_json: str,
        job_id: int | None,
    ) -> Evidence:
        evidence = object.__new__(cls)
        for name, value in (
            ("source", source),
            ("kind", kind),
            ("observed_at", observed_at),
            ("node", node),
            ("gpu", gpu),
            ("attempt_id", attempt_id),
            ("payload", payload),
            ("job_id", job_id),
            ("_payload_json", payload_json),
        ):
            object.__setattr__(evidence, name, value)
        return evidence

    @property
    def payload_json(self) -> str:
        """The payload as the store writes it (canonical JSON), computed once."""
        return self._payload_json  # type: ignore[attr-defined]


@dataclass(frozen=True)
class EvidenceRecord:
    """Stored evidence: its id, when the store received it, and the evidence itself."""

    id: int
    received_at: float
    evidence: Evidence


@dataclass(frozen=True)
class AttemptRecord:
    """A job attempt the store knows. Attempts of one submission and its requeues share a
    ``history_id``; a reused job id gets a new one."""

    id: int
    history_id: int
    attempt: JobAttempt
    first_seen_at: float


@dataclass(frozen=True)
class Incident:
    """A job attempt in trouble (``kind``: crash, hang, straggler ...), open until closed with
    an ``outcome``."""

    id: int
    attempt_id: int
    kind: str
    opened_at: float
    summary: str = ""
    closed_at: float | None = None
    outcome: str | None = None

    @property
    def is_open(self) -> bool:
        return self.closed_at is None


@dataclass(frozen=True)
class Advice:
    """What should happen for an incident and why; generation 1, 2, ... per incident, each new
    generation superseding the previous one. ``verdict`` is the attribution (class, implicated
    nodes, confidence ...); ``evidence_ids`` the evidence it rests on."""

    id: int
    incident_id: int
    generation: int
    created_at: float
    decision: str
    reason: str
    verdict: dict[str, Any] = field(default_factory=dict)
    evidence_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Action:
    """A scheduler step taken (or found already done) on behalf of an advice, with its result."""

    id: int
    advice_id: int | None
    step: str
    target: str
    result: str
    started_at: float
    finished_at: float
    params: dict[str, Any] = field(default_factory=dict)
    message: str = ""


@dataclass(frozen=True)
class NodeState:
    """What the tool itself keeps about a node: whether it drained it and why, and how often the
    node was implicated in incidents (the lemon counters)."""

    name: str
    updated_at: float
    drained_by_tool: bool = False
    drain_reason: str = ""
    drained_at: float | None = None
    implicated_count: int = 0
    last_implicated_at: float | None = None

    def __post_init__(self) -> None:
        check_text(self.name, "NodeState.name")
        object.__setattr__(self, "updated_at", check_time(self.updated_at, "NodeState.updated_at"))
        if not isinstance(self.drained_by_tool, bool):
            raise ValueError(
                f"NodeState.drained_by_tool must be True or False, got {self.drained_by_tool!r}"
            )
        check_text(self.drain_reason, "NodeState.drain_reason", allow_empty=True)
        if self.drained_by_tool and not self.drain_reason.strip():
            raise ValueError("NodeState.drain_reason must say why when drained_by_tool is True")
        object.__setattr__(
            self, "drained_at", check_optional_time(self.drained_at, "NodeState.drained_at")
        )
        check_int(self.implicated_count, "NodeState.implicated_count")
        object.__setattr__(
            self,
            "last_implicated_at",
            check_optional_time(self.last_implicated_at, "NodeState.last_implicated_at"),
        )


@dataclass(frozen=True)
class NodeReport:
    """A node's sidecar as last heard: when (the controller's clock), the status it sent (the
    sidecar's clock: ``observed_at``), how many reports since its condition last changed, and
    when that was. The state behind ``sidecar_status``: only a change is stored as evidence."""

    node: str
    heard_at: float
    observed_at: float
    changed_at: float
    reports: int
    condition: dict[str, Any]
    #: the last status's payload as the store writes it (canonical JSON): a controller holds
    #: every node's report in memory, and a string is a tenth of the size of its objects
    payload_json: str

    @cached_property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.payload_json)  # type: ignore[no-any-return]


#: The modes an override may set (the policy's ``mode`` values).
OVERRIDE_MODES = ("monitor", "act")


@dataclass(frozen=True)
class ModeOverride:
    """An operator's mode for one partition (``partition``) or for the default (``None``),
    set with ``srecovery mode``: it sits on top of the policy file until cleared."""

    partition: str | None
    mode: str
    set_by: str
    set_at: float
    reason: str = ""
    set_by_uid: int | None = None

    def __post_init__(self) -> None:
        if self.partition is not None:
            check_text(self.partition, "ModeOverride.partition")
            if self.partition != self.partition.strip() or "," in self.partition:
                raise ValueError(
                    f"ModeOverride.partition must be one partition name, got {self.partition!r}"
                )
        if self.mode not in OVERRIDE_MODES:
            raise ValueError(
                f"ModeOverride.mode must be one of {', '.join(OVERRIDE_MODES)}, got {self.mode!r}"
            )
        check_text(self.set_by, "ModeOverride.set_by")
        object.__setattr__(self, "set_at", check_time(self.set_at, "ModeOverride.set_at"))
        check_text(self.reason, "ModeOverride.reason", allow_empty=True)
        check_optional_int(self.set_by_uid, "ModeOverride.set_by_uid")


__all__ = [
    "ACTION_RESULTS",
    "MILESTONES",
    "OVERRIDE_MODES",
    "Action",
    "Advice",
    "AttemptRecord",
    "Evidence",
    "EvidenceRecord",
    "Incident",
    "ModeOverride",
    "NodeReport",
    "NodeState",
]
