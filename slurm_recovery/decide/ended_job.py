"""What the controller decides for an ended job when its log is all the evidence there is.

``srecovery explain-log --state FAILED --exit-code 1 --nodes n[1-2] FILE`` asks the question
the controller answers for every failed job: the log's recognised lines become the
``log_signature`` evidence the sidecar's job-log follower would have sent from the batch node,
the job is the one Slurm would show (its end state, exit code and nodes), and the controller's
own :func:`~slurm_recovery.decide.detect.detect`, :func:`~slurm_recovery.decide.attribute.attribute`
and :func:`~slurm_recovery.decide.advise.advise` decide, on a cluster of just those nodes.

Without Slurm's end state a log is judged as text (:func:`~slurm_recovery.signals.logs.classify`)
and a failure no line shows reads as "no failure"; with it, a job Slurm ended FAILED with
nothing recognised is what the controller sees: a crash of unknown cause, restarted within
``max_restarts``. A state that is no failure (COMPLETED, CANCELLED, TIMEOUT, PREEMPTED) opens no
incident, whatever the log says. ``tests/unit/test_explain_agrees.py`` checks on every corpus case
that this answer equals the advice a real controller pass stores for the same evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurm_recovery.decide.advise import advise
from slurm_recovery.decide.attribute import attribute
from slurm_recovery.decide.detect import detect
from slurm_recovery.decide.model import Advice, ClusterView, Evidence, Verdict
from slurm_recovery.decide.policy import Policy
from slurm_recovery.scheduler.base import ExitCode, Job, Node
from slurm_recovery.signals.logs import Match, SignatureCatalogue, evidence_payload

#: The job's id, times and partition in the one-job cluster (none of them changes a decision).
JOB_ID = 1
PARTITION = "explain"
STARTED_AT = 1_000_000_000
#: How long before its end the job read its lines: inside every policy's evidence window.
READ_BEFORE_END = 1.0
#: The partition's size the blast radius counts against: the radius depends on the cluster and
#: its recent drains, not on the log, so the answer is the one for a large cluster that no
#: other drain has touched (``srecovery replay`` answers with the real cluster).
LARGE_PARTITION = 1_000_000

#: Slurm's end states (as 22.05 spells them on every release, ``scheduler.slurmjson``).
END_STATES = (
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "COMPLETED",
    "CANCELLED",
    "TIMEOUT",
    "PREEMPTED",
    "DEADLINE",
)


@dataclass(frozen=True)
class EndedJobDecision:
    """The controller's answer: no incident (``advice`` None: the state is no failure), or the
    verdict and advice it would record."""

    state: str
    exit_code: ExitCode
    nodes: tuple[str, ...]
    verdict: Verdict | None = None
    advice: Advice | None = None

    @property
    def action(self) -> str:
        return str(self.advice.action) if self.advice is not None else "none"


def parse_exit_code(text: str) -> ExitCode:
    """``1``, or Slurm's ``rc:signal`` (``0:9``, as sacct and squeue print it). Raises
    ValueError for anything else."""
    code, _, signal = text.strip().partition(":")
    try:
        returncode, signo = int(code), int(signal) if signal else 0
    except ValueError:
        raise ValueError(
            f"{text!r} is not an exit code (write 1, or rc:signal as in 0:9)"
        ) from None
    if not 0 <= returncode <= 255 or not 0 <= signo <= 128:
        raise ValueError(f"{text!r}: the code is 0-255 and the signal 0-128")
    return ExitCode(returncode, signo)


def log_evidence(
    matches: Sequence[Match], nodes: Sequence[str], catalogue: SignatureCatalogue, at: float
) -> list[Evidence]:
    """The ``log_signature`` evidence the batch node's job-log follower sends for ``matches``
    (:func:`~slurm_recovery.signals.logs.evidence_payload`), observed at ``at``."""
    return [
        Evidence(
            i,
            "sidecar",
            "log_signature",
            at,
            node=nodes[0],
            job_id=JOB_ID,
            payload=evidence_payload(match, catalogue),
        )
        for i, match in enumerate(matches, start=1)
    ]


def decide_ended_job(
    matches: Sequence[Match],
    *,
    state: str,
    exit_code: ExitCode,
    nodes: Sequence[str],
    catalogue: SignatureCatalogue,
    policy: Policy,
) -> EndedJobDecision:
    """The controller's decision for a job Slurm ended ``state`` with ``exit_code`` on
    ``nodes`` (the first is its batch node), whose log held ``matches``."""
    state = state.upper()
    if state not in END_STATES:
        raise ValueError(f"{state!r} is not an end state (one of {', '.join(END_STATES)})")
    if not nodes:
        raise ValueError("a job ran on at least one node")
    names = tuple(dict.fromkeys(nodes))
    ended = STARTED_AT + 3600
    job = Job(
        job_id=JOB_ID,
        name="explain-log",
        state=state,
        reason="",
        user="",
        partition=PARTITION,
        nodes=names,
        num_nodes=len(names),
        submit_time=STARTED_AT - 60,
        restart_count=0,
        exit_code=exit_code,
        start_time=STARTED_AT,
        end_time=ended,
    )
    view = ClusterView(
        now=ended + policy.fatal_evidence_window.settle,
        jobs={JOB_ID: job},
        nodes={name: Node(name, "IDLE", partitions=(PARTITION,)) for name in names},
        partition_sizes={PARTITION: LARGE_PARTITION},
        whole_listing=False,
    )
    evidence = log_evidence(matches, names, catalogue, ended - READ_BEFORE_END)
    found = detect(view, evidence, (), catalogue.xids, policy)
    if not found:
        return EndedJobDecision(state, exit_code, names)
    (incident,) = found
    verdict = attribute(incident, job, evidence, catalogue.xids, policy, view.nodes)
    advice = advise(incident, verdict, job, policy, view, restarts_so_far=0)
    return EndedJobDecision(state, exit_code, names, verdict, advice)
