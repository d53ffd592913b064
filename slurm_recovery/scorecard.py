"""The monitor-mode scorecard (``srecovery compare``): the tool's advice against what operators
did in Slurm in the same window. Pure: the inputs are built by the CLI from the controller's
API and from Slurm (``slurm_recovery.slurmfacts``); nothing here reads a clock or a file.

Agreement is measured on nodes. A *tool implication* is one node that one advice would exclude
or drain. It *agrees* when an operator drained that node within ``tolerance`` seconds of the
advice (either side: operators sometimes drain before the job has crashed). Then

- precision = implications that agree / all implications ("when the tool would take a node
  out, did operators take it out too?");
- recall = operator drains that some implication agrees with / all operator drains ("of the
  nodes operators took out, how many would the tool have taken out?").

Either is ``None`` when its denominator is zero. What operators did with the advised job
(requeued it, cancelled it, nothing) is reported next to each advice, and compared with the
advice's action; it does not enter precision or recall.

A drain by the site's health check (its reason starts with one of
``controller.health_check_drain_prefixes``, "NHC:" by default) is neither the tool's nor an
operator's: it is listed on its own and next to the implications of its node, and enters
neither precision nor recall (the tool reads such drains as evidence, so counting them as
agreement would be the tool agreeing with itself).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from slurm_recovery.scheduler.base import ACTIVE_JOB_STATES

#: The controller's own drain reasons: ``srecovery:<incident>:<cause>`` (controller/loop.py).
TOOL_DRAIN = re.compile(r"srecovery:\d+:")
#: An operator's drain through ``srecovery drain``: ``srecovery-op:<user>: <reason>``.
OPERATOR_DRAIN_PREFIX = "srecovery-op:"

#: Default agreement window: an operator drain within this many seconds of the advice agrees.
DEFAULT_TOLERANCE = 3600.0
#: Two reports of one operator step (from different sources) lie at most this far apart.
MERGE_WITHIN = 300.0

#: What operators did that matches each advised action (a stop of a job that had already
#: ended matches doing nothing).
EXPECTED_JOB_CHANGE = {
    "requeue_exclude": "requeued",
    "requeue": "requeued",
    "stop": "cancelled",
    "none": None,
}


@dataclass(frozen=True)
class Advised:
    """One incident's advice in force."""

    incident: int
    job_id: int
    at: float
    action: str
    mode: str
    reason: str
    exclude: frozenset[str] = frozenset()
    drain: frozenset[str] = frozenset()
    fault_class: str = "unknown"
    #: the job was still in Slurm's active states when advised (a stop then means a cancel)
    job_active: bool = True

    @property
    def nodes(self) -> frozenset[str]:
        return self.exclude | self.drain

    def says(self) -> str:
        """``requeue job 7 excluding n2, drain n2`` — what the advice asks, in words."""
        words = {
            "requeue_exclude": f"requeue job {self.job_id}",
            "requeue": f"requeue job {self.job_id}",
            "stop": f"stop job {self.job_id}",
            "none": f"leave job {self.job_id}",
        }.get(self.action, f"{self.action} job {self.job_id}")
        if self.exclude:
            words += f" excluding {','.join(sorted(self.exclude))}"
        if self.drain:
            words += f", drain {','.join(sorted(self.drain))}"
        return words


@dataclass(frozen=True)
class Drain:
    """An operator's drain of a node (not the tool's). ``sources``: where it was seen —
    ``slurm`` (the node's reason now, with its user and time), ``observed`` (the controller saw
    it happen, within one pass), ``accounting`` (slurmdbd's node events)."""

    node: str
    at: float
    reason: str = ""
    user: str | None = None
    sources: tuple[str, ...] = ()
    #: by the site's health check (its reason's prefix), not by an operator
    health_check: bool = False

    def words(self) -> str:
        who = " by the health check" if self.health_check else ""
        who += f" ({self.user})" if self.user and self.health_check else ""
        who = who or (f" by {self.user}" if self.user else "")
        why = f" ({self.reason})" if self.reason else ""
        return f"drained {self.node}{who} at {clock(self.at)}{why}"


@dataclass(frozen=True)
class JobChange:
    """An operator's requeue or cancel of a job (not the tool's)."""

    job_id: int
    at: float
    change: str  # "requeued" or "cancelled"
    user: str | None = None
    sources: tuple[str, ...] = ()

    def words(self) -> str:
        who = f" by {self.user}" if self.user else ""
        return f"{self.change} job {self.job_id}{who} at {clock(self.at)}"


@dataclass(frozen=True)
class Implication:
    """One node one advice would take out, and the operator drains that agree with it."""

    advised: Advised
    node: str
    how: str  # "drain" or "exclude"
    drains: tuple[Drain, ...] = ()
    #: the site's health check drained the node near the advice (shown; not agreement)
    health_checks: tuple[Drain, ...] = ()

    @property
    def agrees(self) -> bool:
        return bool(self.drains)


@dataclass(frozen=True)
class AdviceRow:
    """One advice with what operators did about its nodes and its job."""

    advised: Advised
    implications: tuple[Implication, ...]
    job_changes: tuple[JobChange, ...]
    #: "agree", "differ" (operators did the other thing), "no operator action"
    job_agreement: str

    @property
    def differs(self) -> bool:
        return self.job_agreement != "agree" or any(not i.agrees for i in self.implications)


@dataclass(frozen=True)
class Scorecard:
    tolerance: float
    rows: tuple[AdviceRow, ...]
    drains: tuple[Drain, ...]
    job_changes: tuple[JobChange, ...]
    #: operator drains no implication agrees with
    unmatched_drains: tuple[Drain, ...] = ()
    #: drains by the site's health check in the window (in neither precision nor recall)
    health_check_drains: tuple[Drain, ...] = ()

    @property
    def implications(self) -> list[Implication]:
        return [i for row in self.rows for i in row.implications]

    @property
    def precision(self) -> float | None:
        found = self.implications
        return sum(i.agrees for i in found) / len(found) if found else None

    @property
    def recall(self) -> float | None:
        if not self.drains:
            return None
        return (len(self.drains) - len(self.unmatched_drains)) / len(self.drains)

    def job_agreement(self) -> dict[str, int]:
        counts = {"agree": 0, "differ": 0, "no operator action": 0}
        for row in self.rows:
            counts[row.job_agreement] = counts.get(row.job_agreement, 0) + 1
        return counts

    def differences(self) -> list[dict[str, Any]]:
        """The cases that differ: an advice operators did not follow (in part), or an operator
        drain of a node the tool never implicated; oldest first."""
        out: list[tuple[float, dict[str, Any]]] = []
        for row in self.rows:
            if not row.differs:
                continue
            a = row.advised
            did = [d.words() for i in row.implications for d in i.drains]
            did += [c.words() for c in row.job_changes]
            why = [
                f"{i.node} not drained by an operator within ±{span(self.tolerance)}"
                + (" (drained by the health check)" if i.health_checks else "")
                for i in row.implications
                if not i.agrees
            ]
            if row.job_agreement == "differ":
                why.append(f"the tool said {a.action}, operators {_changes(row.job_changes)}")
            elif row.job_agreement == "no operator action":
                why.append(f"the tool said {a.action}, operators did nothing with the job")
            out.append(
                (
                    a.at,
                    {
                        "incident": a.incident,
                        "job_id": a.job_id,
                        "at": a.at,
                        "tool_said": a.says(),
                        "operators_did": "; ".join(did) or "nothing",
                        "why": "; ".join(why),
                    },
                )
            )
        for d in self.unmatched_drains:
            out.append(
                (
                    d.at,
                    {
                        "incident": None,
                        "job_id": None,
                        "at": d.at,
                        "tool_said": f"never implicated {d.node}",
                        "operators_did": d.words(),
                        "why": f"operators drained {d.node}; no advice within "
                        f"±{span(self.tolerance)} names it",
                    },
                )
            )
        return [item for _, item in sorted(out, key=lambda pair: pair[0])]

    def to_json(self) -> dict[str, Any]:
        found = self.implications
        agreeing = sum(i.agrees for i in found)
        return {
            "tolerance_s": self.tolerance,
            "agreement": {
                "precision": self.precision,
                "recall": self.recall,
                "tool_implications": len(found),
                "implications_agreeing": agreeing,
                "operator_drains": len(self.drains),
                "operator_drains_matched": len(self.drains) - len(self.unmatched_drains),
                "health_check_drains": len(self.health_check_drains),
                "job_actions": self.job_agreement(),
            },
            "advice": [
                {
                    "incident": r.advised.incident,
                    "job_id": r.advised.job_id,
                    "at": r.advised.at,
                    "action": r.advised.action,
                    "mode": r.advised.mode,
                    "fault_class": r.advised.fault_class,
                    "reason": r.advised.reason,
                    "tool_said": r.advised.says(),
                    "nodes": [
                        {
                            "node": i.node,
                            "how": i.how,
                            "agrees": i.agrees,
                            "operator_drains": [drain_json(d) for d in i.drains],
                            "health_check_drains": [drain_json(d) for d in i.health_checks],
                        }
                        for i in r.implications
                    ],
                    "operator_job_actions": [job_change_json(c) for c in r.job_changes],
                    "job_agreement": r.job_agreement,
                }
                for r in self.rows
            ],
            "operator_actions": {
                "drains": [drain_json(d) for d in self.drains],
                "requeues": [
                    job_change_json(c) for c in self.job_changes if c.change == "requeued"
                ],
                "cancels": [
                    job_change_json(c) for c in self.job_changes if c.change == "cancelled"
                ],
            },
            "health_check_drains": [drain_json(d) for d in self.health_check_drains],
            "differences": self.differences(),
        }


def is_tool_drain(reason: str) -> bool:
    """The drain reason is the controller's own (not an operator's, even through the tool)."""
    return TOOL_DRAIN.match(reason) is not None


def is_health_check_drain(reason: object, prefixes: Iterable[str]) -> bool:
    """The drain reason is the site health check's: it starts with one of ``prefixes``
    (``controller.health_check_drain_prefixes``; leading blanks aside, case counts) and is not
    the tool's own. Anything but a string is no health check's (fail open: a reason that cannot
    be read changes nothing)."""
    if (
        not isinstance(reason, str)
        or is_tool_drain(reason)
        or reason.startswith(OPERATOR_DRAIN_PREFIX)
    ):
        return False
    text = reason.lstrip()
    return any(prefix.strip() and text.startswith(prefix) for prefix in prefixes)


def mark_health_checks(drains: Iterable[Drain], prefixes: Iterable[str]) -> list[Drain]:
    """``drains`` with those whose reason is a health check's marked ``health_check``."""
    chosen = tuple(prefixes)
    return [
        replace(d, health_check=True) if is_health_check_drain(d.reason, chosen) else d
        for d in drains
    ]


def drain_user(reason: str, user: str | None = None) -> str | None:
    """Who drained: the user named in a ``srecovery drain`` reason (Slurm records the
    controller's user for those), else ``user``."""
    if reason.startswith(OPERATOR_DRAIN_PREFIX):
        named = reason[len(OPERATOR_DRAIN_PREFIX) :].split(":", 1)[0].strip()
        return named or user
    return user


def drain_json(d: Drain) -> dict[str, Any]:
    return {
        "node": d.node,
        "at": d.at,
        "reason": d.reason,
        "user": d.user,
        "sources": list(d.sources),
        "by": "health_check" if d.health_check else "operator",
    }


def job_change_json(c: JobChange) -> dict[str, Any]:
    return {
        "job_id": c.job_id,
        "at": c.at,
        "change": c.change,
        "user": c.user,
        "sources": list(c.sources),
    }


def score(
    advised: Iterable[Advised],
    drains: Iterable[Drain],
    job_changes: Iterable[JobChange] = (),
    tolerance: float = DEFAULT_TOLERANCE,
    since: float | None = None,
) -> Scorecard:
    """Match every implication of every advice with the operator drains of its node within
    ``tolerance``, and every advice with the operators' job changes of its job.

    Drains and job changes before ``since`` (the window's start) may agree with an advice near
    the start, but are not the window's own: they are not counted in recall, listed, or
    reported as drains the tool never implicated. Slurm and slurmdbd record these steps in whole
    seconds, so the operators' side of the window starts at the whole second: a drain made just
    after ``since`` but in the same second carries a time just before it."""
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    given = sorted(drains, key=lambda d: (d.at, d.node))
    every = [d for d in given if not d.health_check]
    checks = [d for d in given if d.health_check]
    changes_all = sorted(job_changes, key=lambda c: (c.at, c.job_id, c.change))
    by_node: dict[str, list[tuple[int, Drain]]] = {}
    for n, d in enumerate(every):
        by_node.setdefault(d.node, []).append((n, d))
    matched: set[int] = set()
    rows = []
    for a in sorted(advised, key=lambda a: (a.at, a.incident)):
        implications = []
        for node in sorted(a.nodes):
            near = [(n, d) for n, d in by_node.get(node, ()) if abs(d.at - a.at) <= tolerance]
            matched.update(n for n, _ in near)
            how = "drain" if node in a.drain else "exclude"
            checked = tuple(d for d in checks if d.node == node and abs(d.at - a.at) <= tolerance)
            implications.append(Implication(a, node, how, tuple(d for _, d in near), checked))
        changes = tuple(
            c for c in changes_all if c.job_id == a.job_id and abs(c.at - a.at) <= tolerance
        )
        rows.append(AdviceRow(a, tuple(implications), changes, _job_agreement(a, changes)))

    start = None if since is None else math.floor(since)

    def own(at: float) -> bool:
        return start is None or at >= start

    counted = tuple(d for d in every if own(d.at))
    unmatched = tuple(d for n, d in enumerate(every) if n not in matched and own(d.at))
    return Scorecard(
        tolerance,
        tuple(rows),
        counted,
        tuple(c for c in changes_all if own(c.at)),
        unmatched,
        tuple(d for d in checks if own(d.at)),
    )


def _job_agreement(a: Advised, changes: Sequence[JobChange]) -> str:
    expected = EXPECTED_JOB_CHANGE.get(a.action)
    if expected == "cancelled" and not a.job_active:
        expected = None  # stopping a job that already ended is leaving it alone
    done = {c.change for c in changes}
    if expected is None:
        return "agree" if not done else "differ"
    if expected in done:
        return "agree"
    return "differ" if done else "no operator action"


# ----------------------------------------------------------------- merging the sources


def merge_drains(
    drains: Iterable[Drain],
    within: float = MERGE_WITHIN,
    resumes: Mapping[str, Sequence[float]] | None = None,
) -> list[Drain]:
    """One drain per operator step: reports of the same node within ``within`` seconds of each
    other, or with the same reason, are one drain (a health check's never one with an
    operator's), unless the node was resumed between them
    (``resumes``: node -> times the controller saw it resumed): drained, resumed and drained
    again is two steps, whatever the reasons. The exact time and user come from Slurm or
    accounting when they have them (the controller sees a change only at its next pass)."""
    resumes = resumes or {}

    def resumed_between(node: str, a: float, b: float) -> bool:
        low, high = min(a, b), max(a, b)
        return any(low < r < high for r in resumes.get(node, ()))

    out: list[Drain] = []
    for d in sorted(drains, key=lambda d: (d.node, _precision_rank(d), d.at)):
        for n, kept in enumerate(out):
            same_reason = bool(d.reason) and d.reason == kept.reason
            if (
                kept.node == d.node
                and kept.health_check == d.health_check
                and (abs(kept.at - d.at) <= within or same_reason)
                and not resumed_between(d.node, kept.at, d.at)
            ):
                out[n] = replace(
                    kept,
                    user=kept.user or d.user,
                    reason=kept.reason or d.reason,
                    sources=tuple(dict.fromkeys((*kept.sources, *d.sources))),
                )
                break
        else:
            out.append(d)
    return sorted(out, key=lambda d: (d.at, d.node))


def merge_job_changes(
    changes: Iterable[JobChange], within: float = MERGE_WITHIN
) -> list[JobChange]:
    """One change per operator step (same job, same change, within ``within`` seconds)."""
    out: list[JobChange] = []
    for c in sorted(changes, key=lambda c: (c.job_id, c.change, _precision_rank(c), c.at)):
        for n, kept in enumerate(out):
            if (
                kept.job_id == c.job_id
                and kept.change == c.change
                and abs(kept.at - c.at) <= within
            ):
                out[n] = replace(
                    kept,
                    user=kept.user or c.user,
                    sources=tuple(dict.fromkeys((*kept.sources, *c.sources))),
                )
                break
        else:
            out.append(c)
    return sorted(out, key=lambda c: (c.at, c.job_id))


def _precision_rank(item: Drain | JobChange) -> int:
    """Sources with exact times first: accounting, Slurm's record, then the observation."""
    order = {"accounting": 0, "slurm": 1, "observed": 2}
    return min((order.get(s, 3) for s in item.sources), default=3)


# ------------------------------------------------------- inputs from the controller's API


def parse_time(value: Any) -> float | None:
    """An ISO time or epoch seconds from the API (None stays None)."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return float(value)
    return datetime.fromisoformat(str(value)).timestamp()


def advised_from_api(item: Mapping[str, Any]) -> Advised | None:
    """An incident of ``/v1/history/incidents`` as :class:`Advised` (None without advice)."""
    advice = item.get("advice")
    if not advice or item.get("job_id") is None:
        return None
    at = parse_time(advice.get("created_at")) or parse_time(item.get("opened_at")) or 0.0
    return Advised(
        incident=int(item["id"]),
        job_id=int(item["job_id"]),
        at=at,
        action=str(advice.get("action") or "none"),
        mode=str(advice.get("mode") or ""),
        reason=str(advice.get("reason") or ""),
        exclude=frozenset(advice.get("exclude") or ()),
        drain=frozenset(advice.get("drain") or ()),
        fault_class=str((advice.get("verdict") or {}).get("fault_class", "unknown")),
        job_active=_active(advice.get("job"), str(item.get("kind", ""))),
    )


def _active(snapshot: Mapping[str, Any] | None, kind: str) -> bool:
    """The advised job was still active: its snapshot's state, else any kind but a crash."""
    state = (snapshot or {}).get("state")
    if isinstance(state, str) and state:
        return state in ACTIVE_JOB_STATES
    return kind != "crash"


@dataclass(frozen=True)
class Observed:
    """What the controller saw operators do, pass by pass."""

    drains: list[Drain]
    job_changes: list[JobChange]
    #: node -> when the controller saw it resumed (what separates two drains of one node)
    resumes: dict[str, list[float]]


def from_observed(changes: Iterable[Mapping[str, Any]]) -> Observed:
    """The controller's ``slurm_change`` evidence (``/v1/history/slurm``) as operator steps."""
    drains: list[Drain] = []
    jobs: list[JobChange] = []
    resumes: dict[str, list[float]] = {}
    for row in changes:
        payload = row.get("payload") or {}
        at = parse_time(row.get("observed_at"))
        if at is None:
            continue
        change = payload.get("change")
        if change in ("drained", "drain_reason_changed") and payload.get("node"):
            reason = str(payload.get("reason", ""))
            by_check = payload.get("health_check") is True
            user = None if by_check else drain_user(reason)
            drains.append(
                Drain(str(payload["node"]), at, reason, user, ("observed",), health_check=by_check)
            )
        elif change == "resumed" and payload.get("node"):
            resumes.setdefault(str(payload["node"]), []).append(at)
        elif change in ("requeued", "cancelled") and payload.get("job_id"):
            jobs.append(JobChange(int(payload["job_id"]), at, change, None, ("observed",)))
    return Observed(drains, jobs, resumes)


def clock(at: float) -> str:
    return datetime.fromtimestamp(at).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def span(seconds: float) -> str:
    if seconds % 3600 == 0 and seconds:
        return f"{seconds / 3600:g}h"
    if seconds % 60 == 0 and seconds:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def _changes(changes: Sequence[JobChange]) -> str:
    return " and ".join(sorted({c.change for c in changes})) or "did nothing"
