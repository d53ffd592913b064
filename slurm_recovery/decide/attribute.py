"""Attribute: whose fault an incident is, which nodes and GPUs are implicated, how sure, on what.

Pure and deterministic: no clock, no files, no logging; the order of the evidence does not
matter. Only evidence inside the policy's ``fatal_evidence_window`` around the failure counts
(Meta's study: node events from 10 minutes before to 5 minutes after), and only evidence from one
of the job's nodes, or naming the job; a GPU-scoped XID on a GPU Slurm shows the job does not
hold is another job's (``detect.concerns_job``). **A node is implicated only by evidence about
that node** (``Evidence.node``, or a hardware/system line of the job's log naming it:
``decide.joblogs``); the evidence ids behind every implicated node are in the verdict.

Node evidence that the node itself ended before the failure (a later GPU reset, a healthy
reading: :mod:`decide.cleared`) and evidence about a node from before Slurm last showed it resumed
implicate nothing. A hang's own log lines count from the attempt's start, however long before
its deadline passed: they explain why it stopped.

Each piece of evidence becomes a finding: a class, whether it is *decisive*, a confidence, and
the node it implicates (if any). The verdict is the first tier that has findings:

1. decisive hardware: an operator's report (1.0), a fatal hardware XID (0.95);
2. decisive system: the node's sidecar found its NVIDIA driver libraries and loaded kernel
   module at different versions (``driver_version_mismatch``, 0.95); a fatal driver/firmware
   XID (0.9); a node Slurm shows down when Slurm ended the job NODE_FAIL or BOOT_FAIL (0.8;
   with no node named, 0.5 and no node implicated);
3. application: the job's application log signature (0.9), OUT_OF_MEMORY (0.9), an application
   XID (0.8). Never implicates a node;
4. weak hardware: a hardware log signature blaming a node (0.8), a non-fatal hardware XID (0.6),
   a hardware log signature naming no node (0.5, no node implicated);
5. weak system: the same for system evidence (0.6, 0.5, 0.5), a node Slurm shows down
   while the job failed some other way (0.6), and the site's health check (NHC) against a node:
   a drain with its reason (``health_check_drain``), or its failure in the prolog's health gate
   at this attempt's start (``job_start``'s ``health_gate.nhc``) (0.7), a node whose sidecar
   fell silent while it ran the job (``sidecar_silent``: ``decide.silence``) (0.5);
6. unknown: nothing above (confidence 0); the cause says what little is known (an exit code in
   ``do_not_requeue_exit_codes``, an XID the catalogue does not list).

Why a health check is weak evidence: the site's check took the node out, so it explains a
failure nothing stronger explains, but it can fail for reasons that never touched this job (a
full /tmp, a mount the job did not use): the job's own log naming an application error wins.

Why decisive node evidence beats application evidence: a GPU that fell off the bus makes the
application crash too, and its log then shows an application error. Why application evidence
beats weak node evidence: a corrected-ECC warning on a node does not explain a crash that the
application's own log explains. Application log signatures and XIDs never implicate a node.

The verdict's nodes are the nodes with findings in the winning tier; its confidence is the
lowest of their confidences (each node's best finding), so a weakly implicated node never rides
on a strongly implicated one past ``drain_min_confidence``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_recovery.contract.hostlist import compress
from slurm_recovery.contract.wire import health_check_failure_line
from slurm_recovery.decide.cleared import cleared_ids
from slurm_recovery.decide.detect import (
    NODE_FINDING_KINDS,
    NODE_SOFTWARE_CHECKS,
    START_SLACK,
    concerns_job,
    in_attempt,
)
from slurm_recovery.decide.joblogs import judge_job_log
from slurm_recovery.decide.model import Evidence, FaultClass, Incident, IncidentKind, Verdict
from slurm_recovery.decide.policy import Policy
from slurm_recovery.decide.silence import KIND as SILENCE_KIND
from slurm_recovery.scheduler.base import Job, Node
from slurm_recovery.signals.xid import XidCatalogue, is_knock_on, xid_code

# Confidences, by kind of finding (see the module docstring and docs/policy.md).
OPERATOR_REPORT = 1.0
FATAL_HARDWARE_XID = 0.95
FATAL_SYSTEM_XID = 0.9
NODE_LOST = 0.8  # node shown down by Slurm, job ended NODE_FAIL / BOOT_FAIL
NODE_LOST_UNNAMED = 0.5  # job ended NODE_FAIL / BOOT_FAIL, no evidence names the node
NODE_DOWN = 0.6  # node shown down by Slurm, job failed some other way
APPLICATION_LOG = 0.9
OUT_OF_MEMORY = 0.9
APPLICATION_XID = 0.8
HARDWARE_LOG = 0.8
SYSTEM_LOG = 0.6
WEAK_HARDWARE_XID = 0.6
WEAK_SYSTEM_XID = 0.5
UNNAMED_NODE_LOG = 0.5  # a hardware/system log line that names no node of the job
STRAGGLER_SLOWDOWN = 0.7  # a straggler's node with a throttling / link-downgrade finding
STRAGGLER_LAG = 0.6  # a straggler's node whose rank's own step time lags the others'
HEALTH_CHECK = 0.7  # the site's health check (NHC) drained the node, or failed it at job start
SIDECAR_SILENT = 0.5  # the node's sidecar sent nothing past the grace while it ran the job
# The node's own sidecar: its NVML library and the loaded kernel module differ. Certain for the
# host and lasting until a reboot, so at least drain_min_confidence's default (0.9): drained
# wherever the site drains system faults (classes.system.drain), excluded everywhere.
DRIVER_VERSION_MISMATCH = 0.95

#: Slurm job states meaning Slurm itself lost a node of the job.
NODE_LOST_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})
#: Node base states and flags meaning the node is not working.
DOWN_STATES = frozenset({"DOWN", "FAIL", "FAILING"})
DOWN_FLAGS = frozenset({"NOT_RESPONDING", "FAIL"})

#: How far back repeats of an XID on one GPU count (``policy.xid_repeats``), and the gap that
#: separates two episodes (a crash logs its XID on every channel within seconds: one episode).
XID_REPEAT_WINDOW = 86400.0
XID_EPISODE_GAP = 600.0

_MAX_CAUSES = 2  # distinct causes spelled out in Verdict.cause; the rest are counted


@dataclass(frozen=True)
class _Finding:
    fault_class: FaultClass
    decisive: bool
    confidence: float
    text: str
    evidence_id: int | None = None
    node: str | None = None
    gpu: int | None = None

    @property
    def tier(self) -> int:
        if self.fault_class is FaultClass.APPLICATION:
            return 3
        if self.fault_class is FaultClass.HARDWARE:
            return 1 if self.decisive else 4
        if self.fault_class is FaultClass.SYSTEM:
            return 2 if self.decisive else 5
        return 6

    def order(self) -> tuple[float, str, int, int, str]:
        return (
            -self.confidence,
            self.node or "",
            -1 if self.gpu is None else self.gpu,
            -1 if self.evidence_id is None else self.evidence_id,
            self.text,
        )


def node_is_down(state: str, flags: Sequence[str] | frozenset[str] = ()) -> bool:
    """Slurm shows the node as not working (DOWN, FAIL, or not responding: ``down*``)."""
    base = state.upper()
    return (
        base.rstrip("*") in DOWN_STATES
        or base.endswith("*")
        or bool(DOWN_FLAGS & {f.upper() for f in flags})
    )


def attribute(
    incident: Incident,
    job: Job,
    evidence: Sequence[Evidence],
    catalogue: XidCatalogue,
    policy: Policy,
    nodes: Mapping[str, Node] | None = None,
) -> Verdict:
    """The verdict for ``incident`` on ``job`` (the job as Slurm shows it, same attempt).

    ``nodes`` (Slurm's nodes now) only improves the words of the cause when Slurm lost a node
    no evidence names; nodes are implicated by evidence alone (``node_state`` evidence records
    what Slurm showed, and when).
    """
    if incident.job_id != job.job_id:
        raise ValueError(f"incident for job {incident.job_id} attributed with job {job.job_id}")
    if incident.kind is IncidentKind.STRAGGLER:
        return _straggler(incident, evidence)
    window = policy.fatal_evidence_window
    low = incident.failed_at - window.window_before
    high = incident.failed_at + window.window_after
    lost = job.state in NODE_LOST_STATES
    findings: list[_Finding] = []
    job_end_ids: list[int] = []
    resumed = resumed_at(evidence, incident.failed_at)
    ended = cleared_ids(evidence, until=incident.failed_at)
    # the XID codes on each node in the window: an XID that only follows another (45, a channel
    # torn down after an earlier error) is a knock-on symptom, never a finding of its own
    codes: dict[str | None, list[int]] = {}
    for ev in evidence:
        if ev.kind == "xid" and low <= ev.observed_at <= high and ev.id not in ended:
            code = xid_code(ev.payload)
            if code is not None:
                codes.setdefault(ev.node, []).append(code)
    repeats = xid_repeats(evidence, incident.failed_at, high) if policy.xid_repeats else {}
    for ev in sorted(evidence, key=lambda e: (e.observed_at, e.id)):
        if not low <= ev.observed_at <= high or ev.id in ended:
            continue
        if ev.node is not None and ev.observed_at < resumed.get(ev.node, -1.0):
            continue  # about the node before someone repaired and resumed it
        # on one of the job's nodes, and not a GPU-scoped XID on a GPU it does not hold
        on_node = concerns_job(ev, job, catalogue, nodes)
        mine = ev.job_id == job.job_id and in_attempt(ev, job)
        if ev.kind == "job_end" and mine:
            job_end_ids.append(ev.id)
        repeated = _repeated_on_one_gpu(ev, repeats, evidence, low, high, policy.xid_repeats)
        found = _finding(ev, on_node, mine, lost, job, catalogue, codes.get(ev.node, ()), repeated)
        if found is not None:
            findings.append(found)
    log_low = job.start_time - START_SLACK if incident.kind is IncidentKind.HANG else low
    findings += _log_findings(evidence, job, min(low, log_low), high)
    ends = tuple(job_end_ids)
    if job.state == "OUT_OF_MEMORY":
        findings.append(
            _Finding(
                FaultClass.APPLICATION,
                True,
                OUT_OF_MEMORY,
                "out of memory (Slurm: OUT_OF_MEMORY)",
            )
        )
    if lost:
        named = {f.node for f in findings if f.fault_class is FaultClass.SYSTEM and f.decisive}
        findings.append(
            _Finding(FaultClass.SYSTEM, True, NODE_LOST_UNNAMED, _lost_text(job, nodes, named))
        )
    for tier in (1, 2, 3, 4, 5):
        chosen = [f for f in findings if f.tier == tier]
        if chosen:
            # Findings from Slurm's job state (no evidence id) rest on the job's end record.
            from_state = any(f.evidence_id is None for f in chosen)
            return _verdict(chosen, ends if from_state else ())
    return _unknown(job, incident, findings, ends, policy)


def xid_repeats(
    evidence: Iterable[Evidence], failed_at: float, until: float
) -> dict[tuple[str, int | None, int], int]:
    """(node, GPU, XID) -> separate episodes of that XID on that GPU in the day before
    ``failed_at`` (to ``until``): occurrences at least :data:`XID_EPISODE_GAP` apart, across
    jobs and reboots. The controller passes a day of the job's nodes' XIDs for this."""
    times: dict[tuple[str, int | None, int], list[float]] = {}
    for ev in evidence:
        if ev.kind != "xid" or ev.node is None:
            continue
        if not failed_at - XID_REPEAT_WINDOW <= ev.observed_at <= until:
            continue
        code = xid_code(ev.payload)
        if code is not None:
            times.setdefault((ev.node, ev.gpu, code), []).append(ev.observed_at)
    episodes = {}
    for key, seen in times.items():
        seen.sort()
        count, last = 0, None
        for at in seen:
            if last is None or at - last >= XID_EPISODE_GAP:
                count += 1
            last = at
        episodes[key] = count
    return episodes


def _repeated_on_one_gpu(
    ev: Evidence,
    repeats: Mapping[tuple[str, int | None, int], int],
    evidence: Sequence[Evidence],
    low: float,
    high: float,
    threshold: int,
) -> int:
    """How many episodes of ``ev``'s XID its GPU logged, when at least ``threshold`` and no
    other GPU logged that XID in the incident's window (an application bug hits every GPU it
    runs on); else 0."""
    if ev.kind != "xid" or ev.node is None or threshold <= 0:
        return 0
    code = xid_code(ev.payload)
    count = repeats.get((ev.node, ev.gpu, code), 0) if code is not None else 0
    if count < threshold:
        return 0
    for other in evidence:
        if (
            other.kind == "xid"
            and low <= other.observed_at <= high
            and (other.node, other.gpu) != (ev.node, ev.gpu)
            and xid_code(other.payload) == code
        ):
            return 0
    return count


def _finding(
    ev: Evidence,
    on_node: bool,
    mine: bool,
    lost: bool,
    job: Job,
    catalogue: XidCatalogue,
    node_xids: Iterable[int] = (),
    repeated: int = 0,
) -> _Finding | None:
    where = f"{ev.node}" + (f" gpu{ev.gpu}" if ev.gpu is not None else "")
    if ev.kind == "xid":
        code = xid_code(ev.payload)
        if code is None:
            return None
        info = catalogue.assess(code, str(ev.payload.get("message", "")))
        if is_knock_on(info, node_xids):
            return _Finding(FaultClass.UNKNOWN, False, 0.0, f"{info.label} on {where}", ev.id)
        if repeated and on_node and not info.blames_node:
            text = (
                f"{info.label} on {where} {repeated} times in 24 h while the job's other GPUs "
                "ran clean (the GPU, not the program)"
            )
            return _Finding(
                FaultClass.HARDWARE, False, WEAK_HARDWARE_XID, text, ev.id, ev.node, ev.gpu
            )
        if info.fault_class is FaultClass.APPLICATION:
            # An application XID names a GPU, never a culprit node; another job's is not ours.
            if on_node and (ev.job_id is None or ev.job_id == job.job_id):
                return _Finding(
                    FaultClass.APPLICATION, True, APPLICATION_XID, f"{info.label} on {where}", ev.id
                )
            return None
        if not on_node:
            return None
        if info.fault_class is FaultClass.HARDWARE:
            confidence = FATAL_HARDWARE_XID if info.fatal else WEAK_HARDWARE_XID
        elif info.fault_class is FaultClass.SYSTEM:
            confidence = FATAL_SYSTEM_XID if info.fatal else WEAK_SYSTEM_XID
        else:
            return _Finding(FaultClass.UNKNOWN, False, 0.0, f"{info.label} on {where}", ev.id)
        return _Finding(
            info.fault_class,
            info.fatal,
            confidence,
            f"{info.label} on {where}",
            ev.id,
            ev.node,
            ev.gpu,
        )
    if ev.kind == "operator_report":
        if not on_node:
            return None
        code = xid_code(ev.payload)
        said = f"xid {code}" if code is not None else ""
        reason = _one_line(str(ev.payload.get("reason", "")))
        detail = ": ".join(part for part in (said, reason) if part)
        text = f"operator report on {where}" + (f" ({detail})" if detail else "")
        return _Finding(FaultClass.HARDWARE, True, OPERATOR_REPORT, text, ev.id, ev.node, ev.gpu)
    if ev.kind in NODE_FINDING_KINDS:
        return _sidecar_finding(ev, on_node, where)
    if ev.kind == "health_check_drain":
        if not on_node:
            return None
        reason = _one_line(str(ev.payload.get("reason", "")))
        text = f"the site's health check drained {ev.node}" + (f" ({reason})" if reason else "")
        return _Finding(FaultClass.SYSTEM, False, HEALTH_CHECK, text, ev.id, ev.node)
    if ev.kind == "job_start":
        failed = nhc_failure(ev.payload)
        if not (on_node and mine and failed):
            return None
        text = f"the site's health check failed on {ev.node} at the job's start ({failed})"
        return _Finding(FaultClass.SYSTEM, False, HEALTH_CHECK, text, ev.id, ev.node)
    if ev.kind == SILENCE_KIND:
        if not on_node:
            return None
        silent = ev.payload.get("silent_for")
        quiet = f" for {silent:.0f}s" if isinstance(silent, int | float) else ""
        text = f"{ev.node}'s sidecar sent nothing{quiet} while it ran the job"
        return _Finding(FaultClass.SYSTEM, False, SIDECAR_SILENT, text, ev.id, ev.node)
    if ev.kind == "node_state":
        if not on_node:
            return None
        state = str(ev.payload.get("state", ""))
        flags = ev.payload.get("flags", ()) or ()
        if not isinstance(flags, list | tuple | frozenset | set):
            flags = ()
        if not node_is_down(state, [str(f) for f in flags]):
            return None
        reason = _one_line(str(ev.payload.get("reason", "")))
        text = f"Slurm showed {ev.node} {state.lower() or 'down'}" + (
            f" ({reason})" if reason else ""
        )
        return _Finding(
            FaultClass.SYSTEM, lost, NODE_LOST if lost else NODE_DOWN, text, ev.id, ev.node
        )
    return None  # log_signature: judged together (_log_findings)


def nhc_failure(payload: Mapping[str, Any]) -> str:
    """What the prolog's health gate recorded of a failed site health check (``nhc``) in a
    ``job_start`` payload: ``"exit 1: NHC: check_fs_mount: /scratch not mounted"``, or ""
    when it passed, did not run or the record is malformed (fail open)."""
    gate = payload.get("health_gate")
    nhc = gate.get("nhc") if isinstance(gate, Mapping) else None
    if not isinstance(nhc, Mapping) or nhc.get("verdict") != "fail":
        return ""
    code = nhc.get("exit_code")
    why = health_check_failure_line(nhc.get("output"))
    said = f"exit {code}" if isinstance(code, int) and not isinstance(code, bool) else "failed"
    return said + (f": {_one_line(why)}" if why else "")


def _sidecar_finding(ev: Evidence, on_node: bool, where: str) -> _Finding | None:
    """A GPU or fabric finding from the node's sidecar: fatal ones are decisive hardware
    evidence (a lost GPU, uncorrectable ECC, a port that stays down); warnings are weak. A
    check of the node's driver install (:data:`NODE_SOFTWARE_CHECKS`) is system evidence."""
    severity = ev.payload.get("severity")
    if not on_node or severity not in ("fatal", "warning"):
        return None
    check = _one_line(str(ev.payload.get("check", ""))) or ev.kind
    port = ev.payload.get("port")
    text = f"{check} on {where}" + (f" port {port}" if port else "")
    fatal = severity == "fatal"
    if ev.kind == "gpu_finding" and check in NODE_SOFTWARE_CHECKS:
        # the node's driver install, not its GPUs: system, decisive while fatal
        text += " (its NVIDIA driver libraries and kernel module differ until a reboot)"
        confidence = DRIVER_VERSION_MISMATCH if fatal else WEAK_SYSTEM_XID
        return _Finding(FaultClass.SYSTEM, fatal, confidence, text, ev.id, ev.node, ev.gpu)
    confidence = FATAL_HARDWARE_XID if fatal else WEAK_HARDWARE_XID
    return _Finding(FaultClass.HARDWARE, fatal, confidence, text, ev.id, ev.node, ev.gpu)


def _log_findings(
    evidence: Sequence[Evidence], job: Job, low: float, high: float
) -> list[_Finding]:
    """The job's log lines in the window, judged together as ``explain-log`` judges a file
    (:mod:`decide.joblogs`): one finding for the root line, for each node the verdict blames
    (a host named in the line, or the node Slurm's task layout gives its rank)."""
    window = [ev for ev in evidence if low <= ev.observed_at <= high]
    judged = judge_job_log(window, job, since=job.start_time - START_SLACK)
    if judged is None or not judged.evidence_ids:
        return []
    verdict, root = judged.verdict, judged.evidence_ids[0]
    text = f"log: {_one_line(verdict.cause, 120)}"
    try:
        fault_class = FaultClass(verdict.fault_domain)
    except ValueError:
        fault_class = FaultClass.UNKNOWN
    if fault_class is FaultClass.APPLICATION:
        return [_Finding(fault_class, True, APPLICATION_LOG, text, root)]
    if fault_class is FaultClass.UNKNOWN:
        return [_Finding(fault_class, False, 0.0, text, root)]
    if not verdict.blame_nodes:
        return [_Finding(fault_class, False, UNNAMED_NODE_LOG, text, root)]
    confidence = HARDWARE_LOG if fault_class is FaultClass.HARDWARE else SYSTEM_LOG
    return [  # each blamed node backed by a line about it (naming its host, or its rank)
        _Finding(fault_class, False, confidence, text, lines[0], node)
        for node, lines in judged.blamed.items()
        if lines
    ]


def _verdict(chosen: list[_Finding], extra_ids: tuple[int, ...]) -> Verdict:
    fault_class = chosen[0].fault_class  # one tier holds one class
    best: dict[str, float] = {}
    gpus: set[tuple[str, int]] = set()
    for f in chosen:
        if f.node is not None and fault_class is not FaultClass.APPLICATION:
            best[f.node] = max(best.get(f.node, 0.0), f.confidence)
            if f.gpu is not None:
                gpus.add((f.node, f.gpu))
    # nodes: the weakest implicated node's best finding; no node: the strongest finding
    confidence = min(best.values()) if best else max(f.confidence for f in chosen)
    ids = {f.evidence_id for f in chosen if f.evidence_id is not None} | set(extra_ids)
    return Verdict(
        fault_class=fault_class,
        nodes=frozenset(best),
        gpus=frozenset(gpus),
        confidence=confidence,
        evidence_ids=tuple(sorted(ids)),
        cause=_cause(chosen),
    )


def _unknown(
    job: Job,
    incident: Incident,
    findings: list[_Finding],
    ends: tuple[int, ...],
    policy: Policy,
) -> Verdict:
    unknown = [f for f in findings if f.fault_class is FaultClass.UNKNOWN]
    ids = {f.evidence_id for f in unknown if f.evidence_id is not None}
    code = job.exit_code.returncode
    if incident.kind is IncidentKind.CRASH and code in policy.do_not_requeue_exit_codes:
        # The code says what to do (do not requeue), not whose fault it is: the class stays
        # unknown and advise() stops the job under do_not_requeue_exit_codes.
        cause = f"exit code {code}: the job asked not to be requeued; no evidence of a fault"
        return Verdict(
            fault_class=FaultClass.UNKNOWN,
            confidence=0.0,
            evidence_ids=tuple(sorted(ids | set(ends))),
            cause=cause,
        )
    cause = _cause(unknown) if unknown else "no evidence of the cause"
    if incident.kind is IncidentKind.HANG and not unknown:
        cause = incident.summary or "no progress past the deadline"
    elif incident.kind is IncidentKind.CRASH and not unknown:
        cause = f"no evidence of the cause (job ended {job.state}, exit {job.exit_code})"
    return Verdict(
        fault_class=FaultClass.UNKNOWN,
        confidence=0.0,
        evidence_ids=tuple(sorted(ids)),
        cause=cause,
    )


def resumed_at(evidence: Sequence[Evidence], before: float) -> dict[str, float]:
    """node -> when Slurm last showed it resumed from a drain, up to ``before`` (the
    controller's ``slurm_change`` evidence). What was said about a node before it was repaired
    and put back into service does not explain a later failure."""
    found: dict[str, float] = {}
    for ev in evidence:
        if (
            ev.kind == "slurm_change"
            and ev.node is not None
            and ev.payload.get("change") == "resumed"
            and ev.observed_at <= before
        ):
            found[ev.node] = max(found.get(ev.node, ev.observed_at), ev.observed_at)
    return found


def _straggler(incident: Incident, evidence: Sequence[Evidence]) -> Verdict:
    """A straggler's verdict from what its detector found (``decide.straggler``): the nodes
    with slowdown GPU findings among the triggers (hardware), else the nodes of lagging ranks
    (system), else no node (unknown). A node is never implicated by the job's throughput alone."""
    triggers = set(incident.trigger_ids)
    slowed: dict[str, list[Evidence]] = {}
    for ev in evidence:
        if ev.id in triggers and ev.kind == "gpu_finding" and ev.node is not None:
            slowed.setdefault(ev.node, []).append(ev)
    suspects = dict(incident.suspects)
    hardware = {node for node in suspects if node in slowed}
    if hardware:
        nodes, fault_class, confidence = hardware, FaultClass.HARDWARE, STRAGGLER_SLOWDOWN
        ids = {ev.id for node in hardware for ev in slowed[node]}
    elif suspects:
        nodes, fault_class, confidence = set(suspects), FaultClass.SYSTEM, STRAGGLER_LAG
        ids = {ev.id for ev in evidence if ev.id in triggers and ev.kind == "progress"}
    else:
        return Verdict(
            fault_class=FaultClass.UNKNOWN,
            evidence_ids=tuple(sorted(triggers)),
            cause=f"straggler: {incident.summary}",
        )
    words = "; ".join(f"{suspects[node]} on {node}" for node in sorted(nodes))
    return Verdict(
        fault_class=fault_class,
        nodes=frozenset(nodes),
        confidence=confidence,
        evidence_ids=tuple(sorted(ids)),
        cause=f"straggler ({_one_line(incident.summary.split(';')[0])}): {words}",
    )


def _cause(chosen: list[_Finding]) -> str:
    texts: list[str] = []
    for f in sorted(chosen, key=_Finding.order):
        if f.text not in texts:
            texts.append(f.text)
    shown = "; ".join(texts[:_MAX_CAUSES])
    more = len(texts) - _MAX_CAUSES
    return shown + (f" (+{more} more)" if more > 0 else "")


def _lost_text(job: Job, nodes: Mapping[str, Node] | None, named: set[str | None]) -> str:
    """``Slurm ended the job NODE_FAIL``, plus the job's down nodes that no evidence names
    (shown, not implicated: without evidence recorded about a node, it is not excluded)."""
    text = f"Slurm ended the job {job.state}"
    down = [
        name
        for name in sorted(job.nodes)
        if nodes
        and name in nodes
        and name not in named
        and node_is_down(nodes[name].state, nodes[name].flags)
    ]
    if down:
        text += f" (it shows {compress(down)} down, but no node evidence names it)"
    return text


def _one_line(text: str, limit: int = 80) -> str:
    words = " ".join(text.split())
    return words if len(words) <= limit else words[: limit - 3] + "..."
