"""The job's own output, followed on its batch node: progress lines and log signatures.

The sidecar learns a job's stdout path from the prolog's ``job_start`` event (which passes
through this node's hook spool) and follows the file while the job runs: recognised training
progress becomes ``progress`` evidence (the latest step per rank, at most every
``PROGRESS_EVERY`` seconds per job), catalogued failure lines become ``log_signature``
evidence (at most ``MAX_SIGNATURES`` per job attempt). The ``job_end`` event stops it after a
last read.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from slurm_recovery.decide.hang import ProgressSample
from slurm_recovery.sidecar.base import Finding
from slurm_recovery.signals.logs import default_catalogue, evidence_payload
from slurm_recovery.signals.progress import ProgressLineParser

log = logging.getLogger("srecovery.sidecar.joblog")

PROGRESS_EVERY = 2.0
MAX_SIGNATURES = 50
READ_LIMIT = 4 * 1024 * 1024  # bytes per job per poll: a flood waits for the next poll


@dataclass
class _Followed:
    job_id: int
    path: str
    offset: int = 0
    partial: bytes = b""
    latest: dict[int | None, ProgressSample] = field(default_factory=dict)
    sent_steps: dict[int | None, int] = field(default_factory=dict)
    last_sent: float = 0.0
    signatures: int = 0
    ending: bool = False


class JobLogSource:
    """Fast source: follows the stdout of the jobs whose batch node this is."""

    name = "joblog"
    fast = True

    def __init__(self, node: str) -> None:
        self.node = node
        self.jobs: dict[int, _Followed] = {}
        self.parser = ProgressLineParser()
        self.catalogue = default_catalogue()

    def see(self, findings: Iterable[Finding]) -> None:
        """Watch the events the sidecar queued: start following on job_start, stop on job_end."""
        for f in findings:
            if f.job_id is None:
                continue
            payload: dict[str, Any] = dict(f.payload)
            if f.kind == "job_start" and f.job_id not in self.jobs:
                nodes = payload.get("nodes") or []
                stdout = payload.get("stdout")
                if stdout and nodes and nodes[0] == self.node:  # the batch node runs the script
                    self.jobs[f.job_id] = _Followed(f.job_id, str(stdout))
            elif f.kind == "job_end" and f.job_id in self.jobs:
                self.jobs[f.job_id].ending = True

    def poll(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for job in list(self.jobs.values()):
            out += self._read(job, now)
            if job.ending:
                out += self._progress(job, now, force=True)
                del self.jobs[job.job_id]
        return out

    def _read(self, job: _Followed, now: float) -> list[Finding]:
        try:
            with open(job.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < job.offset:  # truncated (a requeued attempt rewrote it)
                    job.offset, job.partial = 0, b""
                fh.seek(job.offset)
                data = fh.read(READ_LIMIT)
        except FileNotFoundError:
            return []  # not created yet
        except OSError as exc:
            log.warning("job %d: cannot read %s: %s", job.job_id, job.path, exc)
            return []
        job.offset += len(data)
        chunk = job.partial + data
        cut = chunk.rfind(b"\n") + 1
        job.partial = chunk[cut:]
        lines = chunk[:cut].decode("utf-8", errors="replace").splitlines()
        findings: list[Finding] = []
        for line in lines:
            sample = self.parser.parse(line, now, self.node)
            if sample is not None:
                job.latest[sample.rank] = sample
        if lines and job.signatures < MAX_SIGNATURES:
            for match in self.catalogue.scan(lines):
                findings.append(
                    Finding(
                        "log_signature", now, job_id=job.job_id, payload=evidence_payload(match)
                    )
                )
                job.signatures += 1
                if job.signatures >= MAX_SIGNATURES:
                    break
        return findings + self._progress(job, now)

    def _progress(self, job: _Followed, now: float, force: bool = False) -> list[Finding]:
        if not force and now - job.last_sent < PROGRESS_EVERY:
            return []
        fresh = [s for rank, s in job.latest.items() if job.sent_steps.get(rank) != s.step]
        if not fresh:
            return []
        job.last_sent = now
        out = []
        for sample in fresh:
            job.sent_steps[sample.rank] = sample.step
            payload: dict[str, Any] = {"step": sample.step, "ts": sample.ts, "origin": "log"}
            if sample.rank is not None:
                payload["rank"] = sample.rank
            out.append(Finding("progress", now, job_id=job.job_id, payload=payload))
        return out

    def status(self) -> str:
        return f"ok, following {len(self.jobs)} job(s)"

    def close(self) -> None:
        self.jobs.clear()
