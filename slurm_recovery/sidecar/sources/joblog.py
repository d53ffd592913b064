"""The job's own output, followed on its batch node: progress lines and log signatures.

The sidecar learns a job's stdout and stderr paths from the prolog's ``job_start`` event
(which passes through this node's hook spool) and follows both files (one, when Slurm writes
both streams to the same file) while the job runs, each from its own offset:

- recognised training progress becomes ``progress`` evidence (the latest step per rank, at
  most every ``PROGRESS_EVERY`` seconds per job);
- catalogued failure lines become ``log_signature`` evidence, with the ``stream`` and the
  file's ``line_no``. A job attempt reports its first ``MAX_SIGNATURES`` matches as they come
  and keeps its last ``MAX_SIGNATURES`` after those, reported at job end: the lines that say
  why a job failed are near the end, and a job that printed fifty benign-but-matching lines
  first must not lose them. A *decisive* line (hardware or system proof: uncorrectable ECC,
  a fatal XID, a node failure) is reported at once, up to ``MAX_DECISIVE`` more.

Each poll reads at most ``READ_LIMIT`` bytes per file (a flood waits for the next poll), and
keeps at most about ``MAX_PARTIAL`` bytes of a line that has not ended. The
``job_end`` event makes the next poll read the rest of each file, however far behind the
follower is, up to ``END_READ_LIMIT`` bytes per file; beyond that the middle is skipped (and
logged) so the end of the log is always read. Lines past ``READ_LIMIT`` at job end are scanned
for signatures only, and progress is read from the last block.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from slurm_recovery.decide.hang import ProgressSample
from slurm_recovery.sidecar.base import Finding
from slurm_recovery.signals.logs import Match, default_catalogue, evidence_payload
from slurm_recovery.signals.progress import ProgressLineParser

log = logging.getLogger("srecovery.sidecar.joblog")

PROGRESS_EVERY = 2.0
#: Signatures per job attempt reported as they come, and again kept for the end.
MAX_SIGNATURES = 50
#: Decisive signatures reported at once after the first MAX_SIGNATURES.
MAX_DECISIVE = 20
READ_LIMIT = 4 * 1024 * 1024  # bytes per file per poll: a flood waits for the next poll
#: At job end, the most read per file; the middle of a larger rest is skipped.
END_READ_LIMIT = 256 * 1024 * 1024
#: A line longer than this that has not ended (a progress bar redrawn with carriage returns
#: for hours) is read up to its last carriage return, so memory stays bounded.
MAX_PARTIAL = 1024 * 1024


@dataclass
class _Stream:
    """One followed file: its own offset, unfinished last line and line count."""

    name: str  # "stdout" | "stderr"
    path: str
    offset: int = 0
    partial: bytes = b""
    #: complete lines read so far; None once lines were skipped (numbers unknown after)
    lines: int | None = 0


@dataclass
class _Followed:
    job_id: int
    streams: list[_Stream]
    latest: dict[int | None, ProgressSample] = field(default_factory=dict)
    sent_steps: dict[int | None, int] = field(default_factory=dict)
    last_sent: float = 0.0
    signatures: int = 0  # reported as they came
    decisive: int = 0  # reported at once after the first MAX_SIGNATURES
    tail: deque[Finding] = field(default_factory=lambda: deque(maxlen=MAX_SIGNATURES))
    dropped: int = 0  # matches neither reported nor kept
    ending: bool = False


class JobLogSource:
    """Fast source: follows the stdout and stderr of the jobs whose batch node this is."""

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
                if not nodes or nodes[0] != self.node:  # the batch node runs the script
                    continue
                streams = _streams(payload.get("stdout"), payload.get("stderr"))
                if streams:
                    self.jobs[f.job_id] = _Followed(f.job_id, streams)
            elif f.kind == "job_end" and f.job_id in self.jobs:
                self.jobs[f.job_id].ending = True

    def poll(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for job in list(self.jobs.values()):
            if job.ending:
                out += self._finish(job, now)
                del self.jobs[job.job_id]
            else:
                for stream in job.streams:
                    out += self._read(job, stream, now)
                out += self._progress(job, now)
        return out

    # ------------------------------------------------------------------ reading

    def _read(self, job: _Followed, stream: _Stream, now: float) -> list[Finding]:
        """One poll of one file: at most READ_LIMIT bytes."""
        data = self._chunk(job, stream, READ_LIMIT)
        return self._take(job, stream, data, now, progress=True) if data else []

    def _take(
        self, job: _Followed, stream: _Stream, data: bytes, now: float, *, progress: bool
    ) -> list[Finding]:
        """``data``, just read from ``stream``: its whole lines are read now; the unfinished
        last line waits for its end, unless it grows past MAX_PARTIAL."""
        chunk = stream.partial + data
        cut = chunk.rfind(b"\n") + 1
        stream.partial = chunk[cut:]
        out = self._lines(job, stream, chunk[:cut], now, progress=progress)
        if len(stream.partial) > MAX_PARTIAL:  # a line that does not end: read what it has
            rest = stream.partial
            cut = rest.rfind(b"\r") + 1 or len(rest)  # a progress bar redrawn with \r
            stream.partial = rest[cut:]
            out += self._lines(job, stream, rest[:cut], now, progress=progress, whole=False)
        return out

    def _finish(self, job: _Followed, now: float) -> list[Finding]:
        """The job ended: read the rest of each file (the last line too), then report the
        kept signatures and the last progress."""
        out: list[Finding] = []
        for stream in job.streams:
            out += self._read_rest(job, stream, now)
        out += list(job.tail)
        if job.dropped:
            log.info(
                "job %d: %d signature line(s) not reported (the first %d and the last %d are)",
                job.job_id,
                job.dropped,
                MAX_SIGNATURES,
                MAX_SIGNATURES,
            )
        return out + self._progress(job, now, force=True)

    def _read_rest(self, job: _Followed, stream: _Stream, now: float) -> list[Finding]:
        """Everything from the stream's offset to the end of the file as it is now (the last
        END_READ_LIMIT bytes of it when more is left), the last line too."""
        try:
            size = os.stat(stream.path).st_size
        except OSError:
            size = stream.offset
        if size < stream.offset:  # truncated (a requeued attempt rewrote it)
            stream.offset, stream.partial, stream.lines = 0, b"", 0
        rest = size - stream.offset
        if rest > END_READ_LIMIT:
            log.warning(
                "job %d: %s %s: %d bytes left at job end; read the last %d, skipped the rest",
                job.job_id,
                stream.name,
                stream.path,
                rest,
                END_READ_LIMIT,
            )
            stream.offset = size - END_READ_LIMIT
            stream.lines = None
            # the skip lands inside a line: drop that fragment
            first = self._chunk(job, stream, min(READ_LIMIT, size - stream.offset))
            cut = first.find(b"\n") + 1
            stream.partial = first[cut:] if cut else b""
        out: list[Finding] = []
        while stream.offset < size:
            data = self._chunk(job, stream, min(READ_LIMIT, size - stream.offset))
            if not data:
                break  # shrank or vanished meanwhile
            out += self._take(job, stream, data, now, progress=stream.offset >= size)
        # the job is over: an unfinished last line is complete
        out += self._lines(job, stream, stream.partial, now, progress=True)
        stream.partial = b""
        return out

    def _chunk(self, job: _Followed, stream: _Stream, limit: int) -> bytes:
        """Up to ``limit`` bytes from the stream's offset (which moves past them)."""
        try:
            with open(stream.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < stream.offset:  # truncated (a requeued attempt rewrote it)
                    stream.offset, stream.partial, stream.lines = 0, b"", 0
                fh.seek(stream.offset)
                data = fh.read(limit)
        except FileNotFoundError:
            return b""  # not created yet
        except OSError as exc:
            log.warning("job %d: cannot read %s: %s", job.job_id, stream.path, exc)
            return b""
        stream.offset += len(data)
        return data

    def _lines(
        self,
        job: _Followed,
        stream: _Stream,
        block: bytes,
        now: float,
        *,
        progress: bool,
        whole: bool = True,
    ) -> list[Finding]:
        """Progress and signatures in ``block``: whole lines of ``stream``, or (``whole``
        false) the beginning of a line that has not ended yet."""
        if not block:
            return []
        if progress:
            for line in block.decode("utf-8", errors="replace").splitlines():
                sample = self.parser.parse(line, now, self.node)
                if sample is not None:
                    job.latest[sample.rank] = sample
        first = (stream.lines or 0) + 1
        findings: list[Finding] = []
        for match in self.catalogue.scan_text(block, first_line=first, source=stream.name):
            findings += self._signature(job, stream, match, now)
        if stream.lines is not None and whole:
            stream.lines += block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
        return findings

    def _signature(
        self, job: _Followed, stream: _Stream, match: Match, now: float
    ) -> list[Finding]:
        """Report ``match`` now, keep it for the end, or drop it (see the module docstring)."""
        payload = evidence_payload(match, self.catalogue)
        payload["stream"] = stream.name
        if stream.lines is None:
            payload["line_no"] = None  # lines were skipped before it: its number is unknown
        finding = Finding("log_signature", now, job_id=job.job_id, payload=payload)
        if job.signatures < MAX_SIGNATURES:
            job.signatures += 1
            return [finding]
        if job.decisive < MAX_DECISIVE and self.catalogue.assess(match).decisive:
            job.decisive += 1
            return [finding]
        if len(job.tail) == job.tail.maxlen:
            job.dropped += 1
        job.tail.append(finding)
        return []

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


def _streams(stdout: Any, stderr: Any) -> list[_Stream]:
    """The files to follow: stdout, and stderr when Slurm writes it elsewhere."""
    streams: list[_Stream] = []
    for name, path in (("stdout", stdout), ("stderr", stderr)):
        if not path or not isinstance(path, str):
            continue
        if any(os.path.normpath(s.path) == os.path.normpath(path) for s in streams):
            continue  # both streams go to one file: follow it once
        streams.append(_Stream(name, path))
    return streams
