"""Which node evidence the node itself has since ended: one rule for detection, attribution,
replay and ``srecovery nodes`` ("Findings: none open"), so that they never disagree.

A GPU or fabric finding is ended by a later finding of the same check (and GPU, and port): the
latest says how it is now, and a ``cleared: true`` one says the condition went away (a healthy
NVML read). An XID or a GPU finding is ended by a later ``gpu_reset`` of its GPU, or of
the whole node (the sidecar's ``gpu_finding`` with check ``gpu_reset``; ``srecovery sim inject
--clear`` sends one). A reset or a cleared record is itself never a fault. And the evidence
a drain by the tool answered dooms no later job once an operator resumed the node
(:func:`repaired_ids`): the resume says it was repaired. Pure.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from slurm_recovery.decide.model import Evidence

#: Evidence kinds about a node's health that the node can later clear.
CLEARABLE_KINDS = frozenset({"xid", "gpu_finding", "ib_finding"})


def is_gpu_reset(ev: Evidence) -> bool:
    return ev.kind == "gpu_finding" and ev.payload.get("check") == "gpu_reset"


def finding_key(ev: Evidence) -> tuple[Hashable, ...]:
    """What one finding is about: a later finding with the same key replaces it."""
    return (ev.node, ev.kind, ev.payload.get("check"), ev.gpu, ev.payload.get("port"))


def cleared_ids(evidence: Iterable[Evidence], until: float | None = None) -> frozenset[int]:
    """The ids of node evidence (:data:`CLEARABLE_KINDS`) that the node ended by ``until``
    (by now when None); resets and replacements observed after ``until`` do not count, so a
    fault that explains a failure is not unsaid by a repair made after it."""
    seen = sorted(
        (
            ev
            for ev in evidence
            if ev.node is not None
            and ev.kind in CLEARABLE_KINDS
            and (until is None or ev.observed_at <= until)
        ),
        key=lambda ev: (ev.observed_at, ev.id),
    )
    ended: set[int] = set()
    latest: dict[tuple[Hashable, ...], Evidence] = {}
    resets: dict[str, list[Evidence]] = {}
    for ev in seen:
        if ev.kind == "xid":
            continue
        key = finding_key(ev)
        if key in latest:
            ended.add(latest[key].id)
        latest[key] = ev
        if ev.payload.get("cleared") is True or is_gpu_reset(ev):
            ended.add(ev.id)
        if is_gpu_reset(ev):
            resets.setdefault(str(ev.node), []).append(ev)
    for ev in seen:
        if ev.kind not in ("xid", "gpu_finding") or is_gpu_reset(ev):
            continue
        if any(
            (reset.gpu is None or reset.gpu == ev.gpu) and reset.observed_at >= ev.observed_at
            for reset in resets.get(str(ev.node), ())
        ):
            ended.add(ev.id)
    return frozenset(ended)


def still_open(evidence: Iterable[Evidence], until: float | None = None) -> list[Evidence]:
    """``evidence`` less what :func:`cleared_ids` says the nodes ended by ``until``."""
    items = list(evidence)
    ended = cleared_ids(items, until)
    return [ev for ev in items if ev.id not in ended]


def repaired_ids(evidence: Iterable[Evidence]) -> frozenset[int]:
    """The ids of the evidence a drain by the tool answered, once an operator resumed that
    node: the controller's ``slurm_change`` record of the resume names them (``evidence``).
    The ids, not a time: the record is written when the controller notices the resume, so a
    new fault reported just after the resume but before the record still counts."""
    return frozenset(
        int(i)
        for ev in evidence
        if ev.kind == "slurm_change" and ev.payload.get("change") == "resumed"
        for i in ev.payload.get("evidence") or ()
        if type(i) is int
    )
