"""Progress signals: training steps read from job log lines and from the per-job progress file.

Two sources of :class:`~slurm_recovery.decide.hang.ProgressSample` values, both pure apart from
:class:`ProgressFileReader`'s reads:

- :func:`match_line` recognises the progress lines of common trainers (Megatron-LM, NeMo,
  PyTorch Lightning, Hugging Face Trainer, torchtitan) and a per-job pattern with a named group
  ``step``; :class:`ProgressLineParser` turns matches into samples stamped with the time the
  line was read;
- :func:`parse_record` reads one line the ``slurm_recovery.progress`` API wrote, and
  :class:`ProgressFileReader` follows the file.

docs/progress.md lists the line formats.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass

#: A progress stream: one rank's reports (rank), or one node's (node) when no rank is known.
StreamKey = tuple[int | None, str | None]


@dataclass(frozen=True)
class ProgressSample:
    """One progress report: ``step`` was done by ``ts`` (seconds since the epoch).

    From the progress file (every field the API wrote) or a log line (``rank`` when the line
    names it; ``node`` where the caller knows it). ``tokens``/``samples`` are running totals of
    the process; ``step_time`` the rank's own work per step, without waiting for other ranks.
    """

    ts: float
    step: int
    rank: int | None = None
    node: str | None = None
    tokens: float | None = None
    samples: float | None = None
    loss: float | None = None
    step_time: float | None = None
    #: the rank's process ended normally after ``step`` (its last report, written at exit)
    done: bool = False

    @property
    def key(self) -> StreamKey:
        return (self.rank, self.node)


__all__ = [
    "BUILTIN_PATTERNS",
    "LineMatch",
    "ProgressFileReader",
    "ProgressLineParser",
    "ProgressPatternError",
    "compile_job_pattern",
    "match_line",
    "parse_record",
]

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf"


class ProgressPatternError(ValueError):
    """A per-job progress pattern cannot be used; the message says why and how to fix it."""


@dataclass(frozen=True)
class LineMatch:
    """What a progress line says. ``step`` None: the format has no step number (each such line
    is one more logging interval; :class:`ProgressLineParser` counts them)."""

    pattern: str
    step: int | None
    rank: int | None = None
    loss: float | None = None
    samples: float | None = None
    tokens: float | None = None


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    value = _number(text)
    if value is None or not math.isfinite(value):
        return None
    return int(value)


# ------------------------------------------------------------------------------ the formats

# Megatron-LM (training_log), e.g.
#  iteration      201/  250000 | consumed samples:       205824 | elapsed time per iteration
#  (ms): 139113.4 | learning rate: 1.507E-05 | global batch size:  1024 | lm loss: 2.373574E+00 |
_MEGATRON = re.compile(r"\biteration\s+(?P<step>\d+)\s*/\s*\d+\s*\|")
_MEGATRON_SAMPLES = re.compile(r"consumed samples:\s*(?P<v>\d+)")
_MEGATRON_LOSS = re.compile(rf"lm loss:\s*(?P<v>{_NUM})")

# NeMo 2 (NeMo/Megatron progress printer), e.g.
#  Training epoch 0, iteration 120/149 | lr: 3e-05 | consumed_samples: 121 | global_batch_size: 1
#  | global_step: 120 | reduced_train_loss: 1.233 | train_step_timing in s: 0.03146
_NEMO = re.compile(r"\bTraining epoch \d+, iteration (?P<step>\d+)/\d+")
_NEMO_STEP = re.compile(r"global_step: (?P<v>\d+)")
_NEMO_SAMPLES = re.compile(r"consumed_samples: (?P<v>\d+)")
_NEMO_LOSS = re.compile(rf"reduced_train_loss: (?P<v>{_NUM})")

# PyTorch Lightning's progress bar (also NeMo 1), e.g.
#  Epoch 0:  22%|██▏       | 4/18 [00:17<01:02,  4.47s/it, loss=10.072, v_num=193315]
#  Epoch 0:  97% 1651/1702 [13:00<00:24,  2.11it/s, loss=0.158, v_num=0]
#  Epoch 0:   1%|  | 795/77225 [9:07:58<878:01:48, 41.36s/it, ..., global_step=794.0, ...]
_LIGHTNING = re.compile(
    r"\bEpoch (?P<epoch>\d+):\s*\d+%(?:\|[^|\r\n]*\|)?\s*(?P<n>\d+)/(?P<total>\d+)\s*\["
)
_LIGHTNING_STEP = re.compile(r"global_step=(?P<v>\d+(?:\.\d*)?)")
_LIGHTNING_SAMPLES = re.compile(rf"consumed_samples=(?P<v>{_NUM})")
_LIGHTNING_LOSS = re.compile(rf"\b(?:reduced_train_)?loss=(?P<v>{_NUM})")

# Hugging Face Trainer's log dict (printed every logging_steps), e.g.
#  {'loss': 1.2992, 'learning_rate': 1.282051282051282e-06, 'epoch': 0.0}
#  {"loss": 7.152712148666382, "learning_rate": 4.83e-05, "epoch": 0.0328, "step": 500}
_HF = re.compile(rf"\{{['\"]loss['\"]: (?P<loss>{_NUM}),")
_HF_EPOCH = re.compile(r"['\"]epoch['\"]: ")
_HF_STEP = re.compile(r"['\"]step['\"]: (?P<v>\d+)")

# torchtitan, e.g.
#  [rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - step: 200  loss:  6.1384  memory:
#  49.66GiB(52.28%)  tps: 5,856  tflops: 339.16  mfu: 34.29%
_TITAN = re.compile(rf"\bstep:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{_NUM})")

# Who wrote the line: torchrun's "[rank3]:" prefix, or srun --label's "3: ".
_RANK_PREFIX = re.compile(r"^\s*(?:\[(?:rank|default)(?P<a>\d+)\]:|(?P<b>\d+): )")


def _group(pattern: re.Pattern[str], line: str) -> str | None:
    found = pattern.search(line)
    return found.group("v") if found else None


def _megatron(line: str) -> LineMatch | None:
    found = _MEGATRON.search(line)
    if not found:
        return None
    return LineMatch(
        "megatron",
        int(found.group("step")),
        loss=_number(_group(_MEGATRON_LOSS, line)),
        samples=_number(_group(_MEGATRON_SAMPLES, line)),
    )


def _nemo(line: str) -> LineMatch | None:
    found = _NEMO.search(line)
    if not found:
        return None
    step = _int(_group(_NEMO_STEP, line))
    return LineMatch(
        "nemo",
        step if step is not None else int(found.group("step")),
        loss=_number(_group(_NEMO_LOSS, line)),
        samples=_number(_group(_NEMO_SAMPLES, line)),
    )


def _lightning(line: str) -> LineMatch | None:
    # a \r-joined tqdm line holds every update: the last one counts
    found = next(iter(reversed(list(_LIGHTNING.finditer(line)))), None)
    if found is None:
        return None
    rest = line[found.start() :]
    step = _int(_group(_LIGHTNING_STEP, rest))
    if step is None:
        step = int(found.group("epoch")) * int(found.group("total")) + int(found.group("n"))
    return LineMatch(
        "lightning",
        step,
        loss=_number(_group(_LIGHTNING_LOSS, rest)),
        samples=_number(_group(_LIGHTNING_SAMPLES, rest)),
    )


def _huggingface(line: str) -> LineMatch | None:
    found = _HF.search(line)
    if not found or not _HF_EPOCH.search(line, found.end()):
        return None
    return LineMatch("huggingface", _int(_group(_HF_STEP, line)), loss=_number(found.group("loss")))


def _torchtitan(line: str) -> LineMatch | None:
    found = _TITAN.search(line)
    if not found:
        return None
    return LineMatch("torchtitan", int(found.group("step")), loss=_number(found.group("loss")))


#: The built-in formats, tried in this order, each with a cheap substring test first.
BUILTIN_PATTERNS: tuple[tuple[str, str, Callable[[str], LineMatch | None]], ...] = (
    ("nemo", "Training epoch", _nemo),
    ("megatron", "iteration", _megatron),
    ("lightning", "Epoch ", _lightning),
    ("huggingface", "loss", _huggingface),
    ("torchtitan", "step:", _torchtitan),
)


def compile_job_pattern(text: str) -> re.Pattern[str]:
    """Check a per-job progress pattern: a regular expression with a named group ``step``
    (digits; optionally ``loss``, ``samples`` and ``tokens``), or, as the SPANK option
    ``--recovery-progress`` takes it (POSIX extended syntax, no named groups), whose first
    group is the step: ``iteration ([0-9]+)``."""
    try:
        pattern = re.compile(text)
    except re.error as exc:
        raise ProgressPatternError(
            f"progress pattern {text!r}: not a valid regular expression ({exc}); write e.g. "
            r"'step (?P<step>\d+)'"
        ) from None
    if "step" not in pattern.groupindex and pattern.groups == 0:
        raise ProgressPatternError(
            f"progress pattern {text!r}: has no group for the step number; mark it with "
            r"(?P<step>\d+) or a first group, e.g. 'step ([0-9]+)'"
        )
    unknown = set(pattern.groupindex) - {"step", "loss", "samples", "tokens"}
    if unknown:
        raise ProgressPatternError(
            f"progress pattern {text!r}: unknown named group(s) {', '.join(sorted(unknown))}; "
            "the named groups are step, loss, samples and tokens"
        )
    return pattern


def _job_match(pattern: re.Pattern[str], line: str) -> LineMatch | None:
    found = pattern.search(line)
    if not found:
        return None
    step = _int(found.group("step") if "step" in pattern.groupindex else found.group(1))
    if step is None:
        return None
    groups = found.groupdict()
    return LineMatch(
        "job",
        step,
        loss=_number(groups.get("loss")),
        samples=_number(groups.get("samples")),
        tokens=_number(groups.get("tokens")),
    )


def match_line(line: str, job_pattern: re.Pattern[str] | None = None) -> LineMatch | None:
    """What progress ``line`` reports, if any: the job's own pattern first, then the built-in
    formats in order. Never raises."""
    found = None
    try:
        if job_pattern is not None:
            found = _job_match(job_pattern, line)
        if found is None:
            for _name, needle, parse in BUILTIN_PATTERNS:
                if needle in line:
                    found = parse(line)
                    if found is not None:
                        break
    except (ValueError, IndexError, OverflowError):
        return None
    if found is None:
        return None
    prefix = _RANK_PREFIX.match(line)
    if prefix:
        rank = int(prefix.group("a") or prefix.group("b"))
        found = dataclasses.replace(found, rank=rank)
    return found


class ProgressLineParser:
    """Turns one job's log lines into progress samples.

    Lines of a format without a step number (Hugging Face's log dict) are counted: the n-th such
    line is step n. ``node`` is where the lines came from when known (the batch node for a
    job's output file is not where every rank ran: leave it None unless it is).
    """

    def __init__(self, job_pattern: str | re.Pattern[str] | None = None) -> None:
        if isinstance(job_pattern, str):
            job_pattern = compile_job_pattern(job_pattern)
        self.job_pattern = job_pattern
        self._counted = 0

    def parse(self, line: str, ts: float, node: str | None = None) -> ProgressSample | None:
        found = match_line(line, self.job_pattern)
        if found is None:
            return None
        step = found.step
        if step is None:
            self._counted += 1
            step = self._counted
        return ProgressSample(
            ts=ts,
            step=step,
            rank=found.rank,
            node=node,
            tokens=found.tokens,
            samples=found.samples,
            loss=found.loss,
        )


# ------------------------------------------------------------------------------ the file

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def parse_record(line: str | bytes) -> ProgressSample | None:
    """One line of a progress file (``slurm_recovery.progress``), or None when it is not one."""
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    ts = _finite(record.get("ts"))
    step = record.get("step")
    if ts is None or isinstance(step, bool) or not isinstance(step, int):
        return None
    rank = record.get("rank")
    host = record.get("host")
    loss = record.get("loss")
    loss = _number(loss) if isinstance(loss, str) else _finite(loss)
    step_time = _finite(record.get("step_time"))
    return ProgressSample(
        ts=ts,
        step=step,
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
        node=host if isinstance(host, str) and host else None,
        tokens=_finite(record.get("tokens")),
        samples=_finite(record.get("samples")),
        loss=loss if isinstance(loss, float) else None,
        step_time=step_time if step_time is not None and step_time >= 0 else None,
        done=record.get("done") is True,
    )


class ProgressFileReader:
    """Follows one progress file: each :meth:`read` returns the samples of the complete lines
    added since the last one (at most ``max_bytes`` of them; :attr:`caught_up` is False when
    more is waiting). A file that was replaced or truncated is read again from its start; a
    missing file is no samples. Never raises.

    The sidecar reads as root a file in a directory the job user owns, so the file is opened
    without following a symlink and without blocking (a FIFO planted there must not hang the
    reader), and only a regular file is read (:attr:`error` says what else was found)."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int = 4 << 20) -> None:
        self.path = os.fspath(path)
        self.max_bytes = max_bytes
        self._offset = 0
        self._inode: tuple[int, int] | None = None
        self._partial = b""
        self.error: str | None = None
        self.caught_up = True

    def read(self) -> list[ProgressSample]:
        self.caught_up = True
        try:
            fd = os.open(self.path, _OPEN_FLAGS)
        except FileNotFoundError:
            self.error = None
            return []
        except OSError as exc:
            self.error = f"{self.path}: {exc.strerror or exc}"
            return []
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self.error = f"{self.path}: not a regular file"
                return []
            inode = (st.st_dev, st.st_ino)
            if inode != self._inode or st.st_size < self._offset:
                self._inode, self._offset, self._partial = inode, 0, b""
            data = os.pread(fd, self.max_bytes, self._offset)
        except OSError as exc:
            self.error = f"{self.path}: {exc.strerror or exc}"
            return []
        finally:
            os.close(fd)
        self.error = None
        self.caught_up = len(data) < self.max_bytes
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > self.max_bytes:  # no newline in sight: not a progress file
            self._partial = b""
        samples = []
        for line in lines:
            sample = parse_record(line) if line.strip() else None
            if sample is not None:
                samples.append(sample)
        return samples
