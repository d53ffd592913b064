"""The job's own output, followed on its batch node: progress lines and log signatures.

The sidecar learns a job's stdout and stderr paths from the prolog's ``job_start`` event
(which passes through this node's hook spool) and follows both files (one, when Slurm writes
both streams to the same file) while the job runs, each from its own offset. A job attempt's
output begins where the file ended when its prolog ran (``stdout_offset``/``stderr_offset`` in
the ``job_start``): a requeued job that appends to its output file (``--open-mode=append``)
must not read the previous attempt's lines as its own. Without those keys (an older prolog, a
file the prolog would not stat) the follower starts at the file's size when it learns of the
job, which misses whatever the job wrote before that (see :func:`_start_offset`). A file
smaller than its offset was truncated (a requeued attempt in truncate mode) and is read from
the start, and so is one modified since the prolog looked at it (``stdout_mtime``) that did not
grow past the offset: the attempt truncated it and wrote the same bytes again
(:meth:`_Stream.rewritten`):

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

The node hooks cannot always name the files: Slurm gives them no path for the default output
(``slurm-%j.out``), and no job name for ``%x`` (``-o logs/%x-%j.out``, common in training
scripts). For those jobs the follower asks slurmctld once (``scontrol show job -o``, which
shows both paths expanded), on a thread of its own so the fast loop never waits on Slurm, and
follows the files from when the answer comes: from the start for a job's first attempt whose
file name holds its job id (the file is its own), else from the size then.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from slurm_recovery.scheduler.base import Scheduler
from slurm_recovery.sidecar.base import Finding
from slurm_recovery.sidecar.sources.progress_out import LatestPerRank
from slurm_recovery.signals.logs import Match, default_catalogue, evidence_payload
from slurm_recovery.signals.progress import ProgressLineParser, ProgressPatternError

log = logging.getLogger("srecovery.sidecar.joblog")

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
#: A specifier the node hooks could not fill (``%x``: the job name) left in a path.
_UNFILLED = re.compile(r"%[0-9]*[A-Za-z]")
#: Seconds the follower waits at job end for slurmctld's answer about the job's paths.
RESOLVE_WAIT = 5.0


def slurm_output_paths(scheduler: Scheduler, job_id: int) -> dict[str, str]:
    """The job's ``stdout``/``stderr`` paths as slurmctld knows them, read through the
    scheduler backend (one JSON parser for every Slurm release); raises
    :class:`~slurm_recovery.scheduler.base.SchedulerError` when Slurm cannot say."""
    job = scheduler.get_job(job_id)
    paths = {"stdout": job.stdout_path, "stderr": job.stderr_path}
    return {name: path for name, path in paths.items() if path}


@dataclass
class _Stream:
    """One followed file: its own offset, unfinished last line and line count."""

    name: str  # "stdout" | "stderr"
    path: str
    offset: int = 0
    partial: bytes = b""
    #: complete lines read so far (from where the attempt's output began); None once lines
    #: were skipped (numbers unknown after)
    lines: int | None = 0
    #: where the next attempt's output begins in this file, once it has started: the end of
    #: this attempt's output
    stop: int | None = None
    #: where this attempt's output began and the file's modification time then (the prolog's
    #: ``stdout_offset`` and ``stdout_mtime``)
    began: int = 0
    began_mtime: float | None = None

    def rewritten(self, size: int, mtime: float) -> bool:
        """Whether a requeued attempt truncated the file (Slurm's default open mode): it is
        smaller than where this attempt's output was to begin, or, before anything was read,
        it was modified since the prolog looked at it without growing past that point.
        Opening a file to append leaves its modification time alone; truncating it and writing
        the same lines again (the same failure) leaves its size where it was. Both times come
        from the file system's clock, so a file server's clock skew does not matter."""
        if size < self.offset:
            return True
        return (
            self.began_mtime is not None
            and 0 < self.began == self.offset
            and size <= self.offset
            and mtime != self.began_mtime
        )


@dataclass
class _Followed:
    job_id: int
    streams: list[_Stream]
    restart_count: int | None = None
    progress: LatestPerRank = field(default_factory=LatestPerRank)
    signatures: int = 0  # reported as they came
    decisive: int = 0  # reported at once after the first MAX_SIGNATURES
    tail: deque[Finding] = field(default_factory=lambda: deque(maxlen=MAX_SIGNATURES))
    dropped: int = 0  # matches neither reported nor kept
    ending: bool = False
    #: per job: its own pattern (--recovery-progress), and its own count of counted steps
    parser: ProgressLineParser = field(default_factory=ProgressLineParser)
    #: slurmctld's answer about the paths, while it is awaited (the hooks could not name them)
    asked: Future[dict[str, str]] | None = None


def _parser(job_id: int, payload: Mapping[str, Any]) -> ProgressLineParser:
    """The job's progress-line parser: with its own pattern (``recovery.progress`` in the
    job_start, from the SPANK option ``--recovery-progress``) when it compiles."""
    recovery = payload.get("recovery")
    pattern = recovery.get("progress") if isinstance(recovery, Mapping) else None
    if isinstance(pattern, str) and pattern:
        try:
            return ProgressLineParser(pattern)
        except ProgressPatternError as exc:
            log.warning("job %d: progress pattern ignored: %s", job_id, exc)
    return ProgressLineParser()


class JobLogSource:
    """Fast source: follows the stdout and stderr of the jobs whose batch node this is."""

    name = "joblog"
    fast = True

    def __init__(self, node: str, resolve: Callable[[int], dict[str, str]] | None = None) -> None:
        """``resolve``: job id -> the paths slurmctld shows (:func:`slurm_output_paths`, as
        the daemon passes it); None: never ask, follow only the paths the hooks gave."""
        self.node = node
        self.resolve = resolve
        self._asker: ThreadPoolExecutor | None = None
        self.jobs: dict[int, _Followed] = {}
        #: the next attempt of a job whose previous attempt is still being finished
        self.next_attempt: dict[int, _Followed] = {}
        self.catalogue = default_catalogue()
        self._events: deque[Finding] = deque()

    def see(self, findings: Iterable[Finding]) -> None:
        """Watch the events the sidecar queued: start following on job_start, stop on job_end.

        This node's events come in the order its hooks ran. A job_end ends the attempt
        followed last (the epilog of a requeued attempt already carries the next attempt's
        ``restart_count``, so the count cannot say which attempt ended). A job_start of a new
        attempt while the previous one is still followed (its job_end not seen yet) ends the
        previous one first: it is read up to where the new attempt's output begins.

        The sidecar calls this from its fast and its slow loop: the events are queued here and
        taken in by :meth:`poll`, so the job table changes only in the fast loop."""
        self._events.extend(f for f in findings if f.kind in ("job_start", "job_end"))

    def _take_events(self) -> None:
        while self._events:
            f = self._events.popleft()
            if f.job_id is None:
                continue
            payload: dict[str, Any] = dict(f.payload)
            if f.kind == "job_start":
                self._start(f.job_id, payload)
            elif f.kind == "job_end":
                job = self.next_attempt.get(f.job_id) or self.jobs.get(f.job_id)
                if job is not None:
                    job.ending = True

    def _start(self, job_id: int, payload: dict[str, Any]) -> None:
        nodes = payload.get("nodes") or []
        if not nodes or nodes[0] != self.node:  # the batch node runs the script
            return
        count = payload.get("restart_count")
        count = count if type(count) is int else None
        current = self.jobs.get(job_id)
        for known in (current, self.next_attempt.get(job_id)):
            if known is not None and not known.ending and known.restart_count == count:
                return  # the same attempt's job_start again
        given = [payload.get(k) for k in ("stdout", "stderr")]
        unnamed = not given[0] or any(
            isinstance(path, str) and _UNFILLED.search(path) for path in given
        )
        asked = None
        if self.resolve is not None and unnamed:
            asked = self._ask(job_id)
            streams = []  # all from Slurm's answer: it names both files
        else:
            streams = [s for s in _streams(payload) if not _UNFILLED.search(s.path)]
        if not streams and asked is None:
            return
        job = _Followed(
            job_id, streams, restart_count=count, parser=_parser(job_id, payload), asked=asked
        )
        if current is None:
            self.jobs[job_id] = job
            return
        current.ending = True  # a new attempt: the previous one is over
        for old in current.streams:
            for new in streams:
                if _same_file(old.path, new.path):
                    old.stop = new.offset
        self.next_attempt[job_id] = job

    def _ask(self, job_id: int) -> Future[dict[str, str]]:
        if self._asker is None:
            self._asker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="joblog-paths")
        assert self.resolve is not None
        return self._asker.submit(self.resolve, job_id)

    def _answered(self, job: _Followed, wait: float = 0.0) -> None:
        """Take slurmctld's answer about the job's paths once it came (``wait``: at most that
        long for it)."""
        asked = job.asked
        if asked is None or (not wait and not asked.done()):
            return
        job.asked = None
        try:
            paths = asked.result(timeout=wait or None)
        except Exception as exc:  # Slurm down, job gone, a timeout: this job is not followed
            log.warning("job %d: cannot learn its output files from Slurm: %s", job.job_id, exc)
            return
        own = job.restart_count == 0
        payload: dict[str, Any] = dict(paths)
        for name, path in paths.items():  # see the module's docstring
            if own and str(job.job_id) in os.path.basename(path):
                payload[f"{name}_offset"] = 0
        job.streams = _streams(payload)
        log.info("job %d: following %s (paths from Slurm)", job.job_id, ", ".join(paths.values()))

    def poll(self, now: float) -> list[Finding]:
        self._take_events()
        out: list[Finding] = []
        for job in list(self.jobs.values()):
            self._answered(job, RESOLVE_WAIT if job.ending else 0.0)
            if job.ending:
                out += self._finish(job, now)
                del self.jobs[job.job_id]
                following = self.next_attempt.pop(job.job_id, None)
                if following is not None:
                    self.jobs[job.job_id] = following
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
        END_READ_LIMIT bytes of it when more is left), the last line too; up to where the next
        attempt's output begins, when one has started."""
        try:
            info = os.stat(stream.path)
            size, mtime = info.st_size, info.st_mtime
        except OSError:
            size, mtime = stream.offset, 0.0
        if stream.rewritten(size, mtime):  # truncated (a requeued attempt rewrote it)
            if stream.stop is not None:  # by the next attempt: what is there is not ours
                size = stream.offset
            else:
                stream.offset, stream.partial, stream.lines = 0, b"", 0
        if stream.stop is not None:
            size = max(min(size, stream.stop), stream.offset)
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
        """Up to ``limit`` bytes from the stream's offset (which moves past them). Only a
        regular file is read: opening is non-blocking, and a FIFO or a device (``-o
        /dev/null``) is left alone, so the sidecar's fast tick never waits on a job's file."""
        try:
            fd = os.open(stream.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return b""  # not created yet
        except OSError as exc:
            log.warning("job %d: cannot read %s: %s", job.job_id, stream.path, exc)
            return b""
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return b""
            if stream.rewritten(info.st_size, info.st_mtime):  # a requeued attempt rewrote it
                if stream.stop is not None:
                    return b""  # by the next attempt: nothing more of this one
                stream.offset, stream.partial, stream.lines = 0, b"", 0
            data = os.pread(fd, limit, stream.offset)
        except OSError as exc:
            log.warning("job %d: cannot read %s: %s", job.job_id, stream.path, exc)
            return b""
        finally:
            os.close(fd)
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
                sample = job.parser.parse(line, now, self.node)
                if sample is not None:
                    job.progress.see(sample)
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
        if job.restart_count is not None:
            payload["restart_count"] = job.restart_count
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
        out = []
        for sample in job.progress.due(now, force):
            payload: dict[str, Any] = {"step": sample.step, "ts": sample.ts, "origin": "log"}
            if sample.rank is not None:
                payload["rank"] = sample.rank
            if job.restart_count is not None:
                payload["restart_count"] = job.restart_count
            out.append(Finding("progress", now, job_id=job.job_id, payload=payload))
        return out

    def status(self) -> str:
        return f"ok, following {len(self.jobs)} job(s)"

    def close(self) -> None:
        self.jobs.clear()
        self.next_attempt.clear()
        if self._asker is not None:
            self._asker.shutdown(wait=False, cancel_futures=True)


def _same_file(a: str, b: str) -> bool:
    return os.path.normpath(a) == os.path.normpath(b)


def _streams(payload: dict[str, Any]) -> list[_Stream]:
    """The files to follow: stdout, and stderr when Slurm writes it elsewhere, each from
    where this attempt's output begins (:func:`_start_offset`)."""
    streams: list[_Stream] = []
    for name in ("stdout", "stderr"):
        path = payload.get(name)
        if not path or not isinstance(path, str):
            continue
        if any(_same_file(s.path, path) for s in streams):
            continue  # both streams go to one file: follow it once
        offset = _start_offset(path, payload.get(f"{name}_offset"))
        mtime = payload.get(f"{name}_mtime")
        known = mtime if type(mtime) in (int, float) else None
        streams.append(_Stream(name, path, offset=offset, began=offset, began_mtime=known))
    return streams


def _start_offset(path: str, recorded: Any) -> int:
    """Where the attempt's output begins in ``path``: the size the prolog recorded before the
    job could write (``stdout_offset``/``stderr_offset``), else the file's size now.

    The fallback is a choice between two wrongs. Reading from 0 would take a previous
    attempt's lines (or an earlier job's, in a reused file opened in append mode) as this
    attempt's: an old application error would stop a healthy requeued job. Starting at the
    size now misses only what the job wrote between its start and the sidecar reading the
    job_start (its first fast tick, a fraction of a second later), and the only cost is a
    verdict with less evidence. A missing file begins at 0."""
    if type(recorded) is int and recorded >= 0:
        return recorded
    try:
        info = os.stat(path)
    except OSError:
        return 0
    return info.st_size if stat.S_ISREG(info.st_mode) else 0
