"""What the two progress followers (job log, progress file) share: the latest sample per rank,
sent when its step changed, at most every ``PROGRESS_EVERY`` seconds per job."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from slurm_recovery.signals.progress import ProgressSample

#: Seconds between two progress findings of one job.
PROGRESS_EVERY = 2.0


@dataclass
class LatestPerRank:
    latest: dict[int | None, ProgressSample] = field(default_factory=dict)
    #: per rank, the (step, done) last sent
    sent_steps: dict[int | None, tuple[int, bool]] = field(default_factory=dict)
    #: when samples last went out (-inf: never, so the first goes at once)
    last_sent: float = -math.inf

    def see(self, sample: ProgressSample) -> None:
        self.latest[sample.rank] = sample

    def due(self, now: float, force: bool = False) -> list[ProgressSample]:
        """The samples whose step (or end) changed since they were last sent, if the interval
        passed (or ``force``: the job ended); marks them sent."""
        if not force and now - self.last_sent < PROGRESS_EVERY:
            return []
        fresh = [
            s for rank, s in self.latest.items() if self.sent_steps.get(rank) != (s.step, s.done)
        ]
        if fresh:
            self.last_sent = now
            for sample in fresh:
                self.sent_steps[sample.rank] = (sample.step, sample.done)
        return fresh
