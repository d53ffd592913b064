"""Progress reporting for training scripts: ``report(step)`` once per step, nothing else needed.

Standard library only, so any training environment can import it. It is safe to call every step:
it never raises into the training loop, costs well under a microsecond per call between flushes,
and writes one JSON line at most every ``SRECOVERY_PROGRESS_INTERVAL`` seconds (default 1) to
the file named by ``SRECOVERY_PROGRESS_FILE``, which slurm-recovery's sidecar reads to tell a
hung or slowed-down job. Without that variable every call does nothing. docs/progress.md.

Each line: ``{"ts", "step", "rank", "host", "tokens"?, "samples"?, "loss"?, "step_time"?}`` —
``ts`` when the latest step was reported (seconds since the epoch), ``tokens``/``samples`` the
totals this process reported so far, ``loss`` the latest loss (``"nan"``/``"inf"`` when not
finite), ``step_time`` the mean of the ``step_time`` values reported since the last line.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import socket
import threading
import time

from slurm_recovery.contract.jobdir import PROGRESS_ENV

__all__ = [
    "ENV_FILE",
    "ENV_FR_DUMP_AFTER",
    "ENV_INTERVAL",
    "Reporter",
    "dump_flight_recorder_when_stalled",
    "flush",
    "report",
]

#: The environment variable naming the progress file (set for the job by slurm-recovery).
ENV_FILE = PROGRESS_ENV
#: Seconds between writes (a number; default :data:`DEFAULT_INTERVAL`).
ENV_INTERVAL = "SRECOVERY_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 1.0
#: After a failed write, the reporter stays quiet this long before it tries again.
RETRY_AFTER = 60.0
#: Seconds without a new step after which the process dumps PyTorch's flight recorder (unset:
#: never; see :func:`dump_flight_recorder_when_stalled`).
ENV_FR_DUMP_AFTER = "SRECOVERY_FR_DUMP_AFTER"
#: Where PyTorch names its dumps (the rank is appended); the first one set is used.
FR_PATH_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def _rank() -> int | None:
    for name in ("RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        value = os.environ.get(name, "")
        if value.strip().isdigit():
            return int(value)
    return None


def _host() -> str:
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    return name.split(".", 1)[0]


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _interval() -> float:
    try:
        value = float(os.environ.get(ENV_INTERVAL, DEFAULT_INTERVAL))
    except ValueError:
        return DEFAULT_INTERVAL
    return value if math.isfinite(value) and value >= 0 else DEFAULT_INTERVAL


class Reporter:
    """Buffers the latest step and writes it to ``path`` at most every ``interval`` seconds.

    ``path`` None: every call does nothing. Lines are appended with one ``write`` each on a file
    opened ``O_APPEND``, so the ranks of one node may share the file. ``background``: a step
    reported between two writes is written by a timer at the end of the interval, so a rank
    that stops right after a step still shows that step (its last one) in the file.
    """

    def __init__(
        self,
        path: str | None,
        *,
        rank: int | None = None,
        host: str | None = None,
        interval: float = DEFAULT_INTERVAL,
        clock=time.time,
        background: bool = True,
    ) -> None:
        self.path = path or None
        self.rank = rank
        self.host = host if host is not None else _host()
        self.interval = interval
        self._clock = clock
        self._fd: int | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._next_write = 0.0  # clock time from which the next report may write
        self._step: int | None = None
        self._ts = 0.0
        self._written_step: int | None = None
        self._written_ts = 0.0
        self._tokens: float | None = None
        self._samples: float | None = None
        self._loss: float | None = None
        self._step_time_sum = 0.0
        self._step_time_count = 0
        self._background = background
        self._timer: threading.Timer | None = None

    def report(
        self,
        step: int,
        *,
        tokens: float | None = None,
        samples: float | None = None,
        loss: float | None = None,
        step_time: float | None = None,
    ) -> None:
        """Record that ``step`` is done. ``tokens``/``samples``: processed in this step (added
        to running totals); ``loss``: this step's loss; ``step_time``: seconds of this rank's own
        work in the step, not counting the wait for other ranks. Never raises."""
        if self.path is None:
            return
        try:
            now = self._clock()
            with self._lock:  # the timer's flush reads these
                self._step = step if type(step) is int else int(step)
                self._ts = now
                if tokens is not None:
                    self._tokens = (self._tokens or 0) + tokens
                if samples is not None:
                    self._samples = (self._samples or 0) + samples
                if loss is not None:
                    self._loss = float(loss)
                if step_time is not None:
                    self._step_time_sum += float(step_time)
                    self._step_time_count += 1
            if now >= self._next_write:
                self.flush()
            elif self._background and not (self._timer and self._timer.is_alive()):
                # (a timer does not survive fork: is_alive() is False in the child)
                delay = min(max(self._next_write - now, 0.0), self.interval)
                self._timer = threading.Timer(delay, self.flush)
                self._timer.daemon = True
                self._timer.start()
        except Exception:  # a bad argument or a full disk must never stop training
            return

    def flush(self) -> None:
        """Write the latest step now if it was not written yet. Never raises."""
        if self.path is None or self._step is None:
            return
        try:
            with self._lock:
                if self._step == self._written_step and self._ts == self._written_ts:
                    return
                line = self._line()
                self._next_write = self._ts + self.interval
                self._write(line)
                self._written_step, self._written_ts = self._step, self._ts
        except Exception:
            self._close()
            self._next_write = self._clock() + RETRY_AFTER

    def _line(self) -> bytes:
        record: dict[str, object] = {
            "ts": round(self._ts, 3),
            "step": self._step,
            "rank": self.rank,
            "host": self.host,
        }
        if self._tokens is not None:
            record["tokens"] = self._tokens
        if self._samples is not None:
            record["samples"] = self._samples
        if self._loss is not None:
            loss = self._loss
            record["loss"] = loss if math.isfinite(loss) else str(loss)
        if self._step_time_count:
            record["step_time"] = round(self._step_time_sum / self._step_time_count, 6)
            self._step_time_sum, self._step_time_count = 0.0, 0
        return (json.dumps(record, separators=(",", ":")) + "\n").encode()

    def _write(self, line: bytes) -> None:
        if self._fd is None or self._pid != os.getpid():  # reopen in a forked child
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._pid = os.getpid()
        os.write(self._fd, line)

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        """Write what is buffered, then an end record (``"done": true``: this process finished
        stepping, so a slow teardown afterwards is not a hang), and close the file. Runs at
        interpreter exit for the process-wide reporter. Never raises."""
        timer = self._timer
        if timer is not None:
            timer.cancel()
        self.flush()
        if self.path is not None and self._step is not None:
            try:
                with self._lock:
                    record = {"ts": round(self._clock(), 3), "step": self._step, "rank": self.rank}
                    record |= {"host": self.host, "done": True}
                    self._write((json.dumps(record, separators=(",", ":")) + "\n").encode())
            except Exception:
                pass
        self._close()


_reporter: Reporter | None = None
_init_lock = threading.Lock()


def _default() -> Reporter:
    global _reporter
    with _init_lock:
        if _reporter is None:
            path = os.environ.get(ENV_FILE) or None
            reporter = Reporter(
                path, rank=_rank(), host=_host() if path else "", interval=_interval()
            )
            if path:
                atexit.register(reporter.close)
                after = os.environ.get(ENV_FR_DUMP_AFTER)
                if after:
                    dump_flight_recorder_when_stalled(_float(after))
            _reporter = reporter
        return _reporter


def report(
    step: int,
    *,
    tokens: float | None = None,
    samples: float | None = None,
    loss: float | None = None,
    step_time: float | None = None,
) -> None:
    """Record that training ``step`` is done (see :meth:`Reporter.report`). Never raises; does
    nothing unless ``SRECOVERY_PROGRESS_FILE`` is set."""
    try:
        reporter = _reporter or _default()
        reporter.report(step, tokens=tokens, samples=samples, loss=loss, step_time=step_time)
    except Exception:
        return


def flush() -> None:
    """Write the latest step now (e.g. before a long checkpoint save). Never raises."""
    try:
        (_reporter or _default()).flush()
    except Exception:
        return


class _StallDumper(threading.Thread):
    """Dumps the flight recorder once per stall: when no step was reported for ``after``
    seconds. A daemon thread, so it runs while the main thread is blocked in a collective."""

    def __init__(self, after: float, clock=time.time) -> None:
        super().__init__(name="srecovery-fr-dump", daemon=True)
        self.after = after
        self._clock = clock
        self._last_step: int | None = None
        self._last_change = clock()
        self._dumped_for: int | None = None
        self.stop = threading.Event()
        self.dumps = 0

    def run(self) -> None:
        while not self.stop.wait(min(1.0, self.after / 4)):
            try:
                self.check()
            except Exception:  # never into the training process
                continue

    def check(self) -> str | None:
        reporter = _reporter
        step = reporter._step if reporter is not None else None
        now = self._clock()
        if step != self._last_step:
            self._last_step, self._last_change = step, now
            return None
        if step is None or now - self._last_change < self.after or self._dumped_for == step:
            return None
        self._dumped_for = step
        path = dump_flight_recorder()
        if path:
            self.dumps += 1
        return path


def dump_flight_recorder() -> str | None:
    """Write this process's PyTorch flight-recorder trace where PyTorch would name it
    (``$TORCH_FR_DUMP_TEMP_FILE`` or ``$TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, plus the rank).
    Returns the path, or None when there is nothing to dump (torch.distributed not in use, no
    path set, no trace). Written to a temporary name and renamed, so a reader never sees half.
    Never raises."""
    try:
        import sys

        torch = sys.modules.get("torch")  # never imported here: only a job using it dumps
        if torch is None or not torch.distributed.is_initialized():
            return None
        prefix = next((os.environ[v] for v in FR_PATH_VARIABLES if os.environ.get(v)), None)
        if prefix is None:
            return None
        c10d = torch._C._distributed_c10d
        dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
        if dump is None:
            return None
        data = dump()
        path = f"{prefix}{torch.distributed.get_rank()}"
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(data if isinstance(data, bytes) else str(data).encode())
        os.replace(tmp, path)
        return path
    except Exception:
        return None


_dumper: _StallDumper | None = None


def dump_flight_recorder_when_stalled(after: float) -> None:
    """Dump PyTorch's flight recorder when this process reported no new step for ``after``
    seconds (once per stall). gloo never dumps by itself and NCCL only on its own timeout
    (minutes); a dump taken while the job is stuck lets slurm-recovery name the ranks that
    never entered the stuck collective. Call once, after ``report`` is in use; also turned on
    by ``SRECOVERY_FR_DUMP_AFTER=<seconds>``. Never raises."""
    global _dumper
    try:
        seconds = float(after)
        if not math.isfinite(seconds) or seconds <= 0 or _dumper is not None:
            return
        _dumper = _StallDumper(seconds)
        _dumper.start()
    except Exception:
        return


def _reset() -> None:
    """Forget the process-wide reporter, so that the next call reads the environment again."""
    global _reporter, _dumper
    with _init_lock:
        if _reporter is not None:
            _reporter.close()
        _reporter = None
        if _dumper is not None:
            _dumper.stop.set()
        _dumper = None
