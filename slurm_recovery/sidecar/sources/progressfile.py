"""The files each job running on this node writes into its job directory: the progress file,
followed while the job runs, and PyTorch flight-recorder dumps, read when they appear.

The Prolog gives each job a directory on each of its nodes and the TaskProlog points the job's
tasks at ``<job dir>/progress.jsonl`` (:mod:`slurm_recovery.contract.jobdir`), which
:mod:`slurm_recovery.progress` appends to. Every node has its own file, holding the ranks that
run there, so every node's sidecar follows it (not only the batch node's, unlike the job log).

The ``job_start`` of the Prolog (through this node's hook spool) starts following a job, its
``job_end`` ends it with a last read, after which the directory is removed. The latest sample
per rank goes out as ``progress`` evidence at most every ``PROGRESS_EVERY`` seconds per job:
the first new step after a quiet spell goes out at once, later ones wait out the rest of the
interval. Each carries the attempt (``restart_count``) the ``job_start`` named, so a restarted
job is never judged on its previous attempt's steps. Job directories found at start are followed
too (their ``job_start`` went out before a restart), after those untouched for
``jobdir.STALE_AFTER`` are removed as leftovers.

Flight-recorder dumps (``nccl_trace_rank_<rank>``: NCCL writes them on its timeout, the
progress API's stall dump while the job is stuck) are looked for every ``DUMP_EVERY`` seconds
and once more before the directory is removed; each new or rewritten dump goes out as one
``flight_recorder`` evidence (:func:`slurm_recovery.signals.flight_recorder.evidence_payload`).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from slurm_recovery.contract import jobdir
from slurm_recovery.sidecar.base import Finding
from slurm_recovery.sidecar.sources.progress_out import LatestPerRank
from slurm_recovery.signals.flight_recorder import evidence_payload, read_dumps
from slurm_recovery.signals.progress import ProgressFileReader, ProgressSample

log = logging.getLogger("srecovery.sidecar.progressfile")

#: The last read at job end reads at most this many chunks of the reader's ``max_bytes``.
FINAL_READS = 16
#: The progress API writes ``ts`` rounded to the millisecond.
TS_ROUNDING = 0.001
#: Seconds between two looks for new flight-recorder dumps in one job's directory.
DUMP_EVERY = 1.0


def loss_value(loss: float) -> float | str:
    """A loss for the wire: a number, or ``"nan"``, ``"inf"``, ``"-inf"`` (JSON has none of
    these, and the controller refuses a payload that holds them)."""
    if math.isfinite(loss):
        return loss
    return "nan" if math.isnan(loss) else ("inf" if loss > 0 else "-inf")


def progress_payload(sample: ProgressSample, restart_count: int | None = None) -> dict[str, Any]:
    """The ``progress`` evidence payload of one progress-file sample of attempt
    ``restart_count`` (None: unknown)."""
    payload: dict[str, Any] = {"step": sample.step, "ts": sample.ts, "origin": "file"}
    if restart_count is not None:
        payload["restart_count"] = restart_count
    if sample.rank is not None:
        payload["rank"] = sample.rank
    for key in ("tokens", "samples", "step_time"):
        value = getattr(sample, key)
        if value is not None:
            payload[key] = value
    if sample.loss is not None:
        payload["loss"] = loss_value(sample.loss)
    if sample.done:
        payload["done"] = True
    return payload


@dataclass
class _Followed:
    job_id: int
    reader: ProgressFileReader
    #: samples from before this (the job_start) belong to an earlier attempt; None: keep all
    since: float | None = None
    progress: LatestPerRank = field(default_factory=LatestPerRank)
    #: when the job ended on this node (its job_end); None while it runs
    ended_at: float | None = None
    #: the reader's last problem, logged once
    error: str | None = None
    #: the attempt, from the job_start's payload (None: unknown)
    restart_count: int | None = None
    #: flight-recorder dumps already read: path -> (mtime_ns, size)
    dumps_seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    last_dump_look: float = -math.inf


class ProgressFileSource:
    """Fast source: follows ``<job_dir>/<job_id>/progress.jsonl`` of every job on this node."""

    name = "progressfile"
    fast = True

    def __init__(self, node: str, job_dir: str) -> None:
        self.node = node
        self.template = job_dir
        self.root = jobdir.node_root(job_dir, node)
        #: running jobs, by id
        self.jobs: dict[int, _Followed] = {}
        #: jobs that ended, waiting for their last read and removal
        self.ending: list[_Followed] = []
        # see() runs in whichever loop queued the findings; poll() takes them in order
        self._events: deque[Finding] = deque()
        self._started = False
        self._problem = ""

    def _follow(
        self, job_id: int, since: float | None, restart_count: int | None = None
    ) -> _Followed:
        path = jobdir.progress_file(self._dir(job_id))
        return _Followed(job_id, ProgressFileReader(path), since=since, restart_count=restart_count)

    def _dir(self, job_id: int) -> str:
        return jobdir.job_dir_for(self.template, self.node, job_id)

    def see(self, findings: Iterable[Finding]) -> None:
        """Note the job starts and ends the sidecar queued (all about this node: the hook
        spool refuses events about another)."""
        for f in findings:
            if f.job_id is not None and f.kind in ("job_start", "job_end"):
                self._events.append(f)

    def _take_events(self) -> None:
        while self._events:
            f = self._events.popleft()
            job_id = f.job_id
            assert job_id is not None
            if f.kind == "job_start":
                if f.payload.get("health_gate"):
                    continue  # refused here: the job did not start on this node
                count = f.payload.get("restart_count")
                count = count if type(count) is int else None
                known = self.jobs.get(job_id)
                if known is None:
                    self.jobs[job_id] = self._follow(job_id, f.observed_at, count)
                elif known.restart_count is None:  # found on disk at start: now we know
                    known.restart_count, known.since = count, f.observed_at
            else:
                job = self.jobs.pop(job_id, None) or self._follow(job_id, since=None)
                job.ended_at = f.observed_at
                self.ending.append(job)

    def _start(self, now: float) -> None:
        """Once: remove week-old leftovers, follow the job directories still there."""
        self._started = True
        try:
            removed = jobdir.remove_stale(self.root, now)
        except OSError as exc:
            self._problem = f"cannot clean {self.root}: {exc}"
            log.error("%s", self._problem)
            return
        if removed:
            log.info("removed %d leftover job director(ies) in %s", len(removed), self.root)
        for job_id in jobdir.job_ids(self.root):
            self.jobs.setdefault(job_id, self._follow(job_id, since=None))

    def poll(self, now: float) -> list[Finding]:
        if not self._started:
            self._start(now)
        self._take_events()
        out: list[Finding] = []
        for job in list(self.jobs.values()):
            self._read(job)
            out += self._progress(job, now)
            out += self._dumps(job, now)
        ending, self.ending = self.ending, []
        for job in ending:
            for _ in range(FINAL_READS):
                self._read(job)
                if job.reader.caught_up:
                    break
            out += self._progress(job, now, force=True)
            out += self._dumps(job, now, force=True)
            self._remove(job)
        return out

    def _dumps(self, job: _Followed, now: float, force: bool = False) -> list[Finding]:
        """``flight_recorder`` evidence for each dump new or rewritten since the last look."""
        if not force and now - job.last_dump_look < DUMP_EVERY:
            return []
        job.last_dump_look = now
        out = []
        for trace in read_dumps(self._dir(job.job_id), job.dumps_seen):
            payload = evidence_payload(trace)
            if job.restart_count is not None:
                payload["restart_count"] = job.restart_count
            out.append(Finding("flight_recorder", now, job_id=job.job_id, payload=payload))
        return out

    def _read(self, job: _Followed) -> None:
        samples = job.reader.read()
        if job.reader.error != job.error:
            job.error = job.reader.error
            if job.error:
                log.warning("job %d: cannot read its progress file: %s", job.job_id, job.error)
        for sample in samples:
            if job.since is None or sample.ts >= job.since - TS_ROUNDING:
                job.progress.see(sample)

    def _progress(self, job: _Followed, now: float, force: bool = False) -> list[Finding]:
        return [
            Finding(
                "progress", now, job_id=job.job_id, payload=progress_payload(s, job.restart_count)
            )
            for s in job.progress.due(now, force)
        ]

    def _remove(self, job: _Followed) -> None:
        """Remove the job's directory after its last read, unless a later attempt of the same
        job started here meanwhile (it is running again, or the Prolog claimed the directory
        after the job ended: :func:`jobdir.remove` checks that under the lock)."""
        if job.job_id in self.jobs:
            return
        try:
            jobdir.remove(self.root, job.job_id, unless_changed_after=job.ended_at)
        except OSError as exc:  # left for the clean-up at the next start
            log.warning("job %d: cannot remove its directory in %s: %s", job.job_id, self.root, exc)

    def status(self) -> str:
        if self._problem:
            return self._problem
        return f"ok, following {len(self.jobs)} job(s)"

    def close(self) -> None:
        self.jobs.clear()
        self.ending.clear()
