"""Job attempts: which run of which job an event belongs to, so a reused job id never
inherits another job's history (pure functions, no I/O).

A *job history* is one submission and its requeues. Slurm keeps the job id across a requeue,
adds one to the restart count, and moves the submit time to the requeue time
(``batch_requeue_fini()`` in slurmctld; seen on Slurm 22.05: SubmitTime moved by the requeue,
Restarts 0 -> 1). Until the old attempt finishes completing, the job already shows the new
restart count with the old submit time. A reused job id (wraparound, purged state) shows up as
restart count 0 with another submit time. :func:`relate` encodes exactly this; when a view
fits no history it is a different job, so a doubtful case starts a new history rather than
inheriting advice.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .values import check_int, check_text


@dataclass(frozen=True, order=True)
class JobAttempt:
    """One run of a Slurm job as the scheduler showed it: the store's key for an attempt."""

    cluster: str
    job_id: int
    submit_time: int
    restart_count: int = 0

    def __post_init__(self) -> None:
        check_text(self.cluster, "JobAttempt.cluster")
        check_int(self.job_id, "JobAttempt.job_id", minimum=1)
        check_int(self.submit_time, "JobAttempt.submit_time")
        check_int(self.restart_count, "JobAttempt.restart_count")

    def same_job_id(self, other: JobAttempt) -> bool:
        """Same cluster and job id (which may still be a different job: see :func:`relate`)."""
        return (self.cluster, self.job_id) == (other.cluster, other.job_id)

    def __str__(self) -> str:
        return f"{self.cluster}:{self.job_id}+{self.restart_count}@{self.submit_time}"


class AttemptRelation(enum.Enum):
    """How a newly seen attempt relates to the latest known attempt of a job history."""

    SAME_ATTEMPT = "same_attempt"
    NEXT_ATTEMPT = "next_attempt"
    EARLIER_ATTEMPT = "earlier_attempt"
    DIFFERENT_JOB = "different_job"

    @property
    def same_job(self) -> bool:
        return self is not AttemptRelation.DIFFERENT_JOB


def relate(known: JobAttempt, seen: JobAttempt) -> AttemptRelation:
    """Classify ``seen`` against ``known``, the latest attempt recorded for a job history.

    - other cluster or job id: DIFFERENT_JOB;
    - higher restart count, submit time not earlier: NEXT_ATTEMPT (a requeue: the submit time
      stays the same until the old attempt finishes completing, then moves forward);
    - same restart count: SAME_ATTEMPT if the submit time is equal, or if the job was already
      requeued (restart count > 0: the requeue moved its submit time); with restart count 0 and
      another submit time, a reused job id: DIFFERENT_JOB;
    - lower restart count, submit time not later: EARLIER_ATTEMPT (a late event about an attempt
      already superseded);
    - anything else (restart count down while submit time went up, or up while it went down):
      DIFFERENT_JOB.
    """
    if not known.same_job_id(seen):
        return AttemptRelation.DIFFERENT_JOB
    if seen.restart_count > known.restart_count:
        if seen.submit_time >= known.submit_time:
            return AttemptRelation.NEXT_ATTEMPT
        return AttemptRelation.DIFFERENT_JOB
    if seen.restart_count == known.restart_count:
        if seen.submit_time == known.submit_time or seen.restart_count > 0:
            return AttemptRelation.SAME_ATTEMPT
        return AttemptRelation.DIFFERENT_JOB
    if seen.submit_time <= known.submit_time:
        return AttemptRelation.EARLIER_ATTEMPT
    return AttemptRelation.DIFFERENT_JOB
