"""The watchdog: fail-open insurance that releases jobs the tool held past their deadline.

A separate small process that needs Slurm and nothing else (no controller, no store). It finds
the jobs the tool held by the hold mark in their AdminComment (:mod:`slurm_recovery.holdmark`),
releases those still held after the mark's deadline, appends one JSON line per release to
``<spool_dir>/releases.jsonl`` for the controller to copy into its audit trail, and replaces the
mark with a note saying what it did. See docs/watchdog.md.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterable, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from slurm_recovery import service_notify
from slurm_recovery.config import ConfigError, load_config, parse_duration
from slurm_recovery.holdmark import parse_hold_mark
from slurm_recovery.scheduler import (
    Job,
    Scheduler,
    SchedulerError,
    UnknownJob,
    Unreachable,
    open_scheduler,
)

#: The spool file, one JSON object per line: see :class:`Release`.
RELEASES_FILE = "releases.jsonl"
#: Written (replaced) after every sweep: when the watchdog last ran, for ``srecovery status``.
HEARTBEAT_FILE = "heartbeat.json"
#: A heartbeat older than this many sweep intervals (and at least STALE_MIN seconds) is stale.
STALE_INTERVALS = 3
STALE_MIN = 60.0
#: The ``action`` of every record the watchdog writes.
ACTION_RELEASED = "released"
#: Exit codes of ``srecovery watchdog`` (the same meanings as every ``srecovery`` command).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------- the rule


@dataclass(frozen=True)
class Overdue:
    """A job the tool held whose hold mark's deadline has passed: the watchdog releases it."""

    job_id: int
    incident_id: int
    held_until: int


def overdue(jobs: Iterable[Job], now: float, released: Set[Overdue] = frozenset()) -> list[Overdue]:
    """The jobs to release: PENDING, held, with the hold mark, ``until < now``, not in ``released``.

    Pure: the whole of the watchdog's selection rule. A job held by anyone else (no mark), one
    still within its deadline, or one with the mark that is not held, is left alone.
    ``released`` holds the marks the watchdog released before (from its spool): a job held
    again under the same mark was held by someone else, after the tool let go of it.
    """
    found = []
    for job in jobs:
        if job.state != "PENDING" or not job.held:
            continue
        mark = parse_hold_mark(job.admin_comment)
        if mark is None:
            continue
        item = Overdue(job_id=job.job_id, incident_id=mark[0], held_until=mark[1])
        if item.held_until < now and item not in released:
            found.append(item)
    return found


# --------------------------------------------------------------------------------- the spool


@dataclass(frozen=True)
class Release:
    """One release, as one line of ``releases.jsonl``: the field names are the JSON keys.

    ``ts`` is when Slurm accepted the release (epoch seconds, float); ``held_until`` is the
    deadline from the hold mark (epoch seconds, int); ``action`` is always ``"released"``.
    """

    ts: float
    job_id: int
    incident_id: int
    held_until: int
    watchdog_host: str
    action: str = ACTION_RELEASED

    @property
    def mark(self) -> Overdue:
        return Overdue(self.job_id, self.incident_id, self.held_until)

    def to_json(self) -> str:
        return json.dumps(
            {
                "ts": self.ts,
                "job_id": self.job_id,
                "incident_id": self.incident_id,
                "held_until": self.held_until,
                "action": self.action,
                "watchdog_host": self.watchdog_host,
            }
        )

    @classmethod
    def from_json(cls, line: str) -> Release:
        """Raises ValueError for anything that is not a record this module wrote."""
        data: Any = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        ints = ("job_id", "incident_id", "held_until")
        if any(type(data.get(k)) is not int for k in ints):
            raise ValueError(f"{', '.join(ints)} must be integers")
        if type(data.get("ts")) not in (int, float) or not isinstance(
            data.get("watchdog_host"), str
        ):
            raise ValueError("ts must be a number and watchdog_host a string")
        if data.get("action") != ACTION_RELEASED:
            raise ValueError(f"unknown action {data.get('action')!r}")
        return cls(
            ts=float(data["ts"]),
            job_id=data["job_id"],
            incident_id=data["incident_id"],
            held_until=data["held_until"],
            watchdog_host=data["watchdog_host"],
        )


def read_releases(spool: Path) -> list[Release]:
    """Every record in ``spool/releases.jsonl``, oldest first; [] when there is none yet.

    A line that is not a record (a write cut short by a crash, a hand edit) is skipped with a
    warning naming the file and line. Raises OSError if the file exists but cannot be read.
    """
    path = spool / RELEASES_FILE
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(Release.from_json(line))
        except ValueError as exc:
            log.warning("%s:%d: skipped, not a release record: %s", path, number, exc)
    return records


def append_release(spool: Path, record: Release) -> None:
    """Append ``record`` as one line to ``spool/releases.jsonl`` and fsync it (and the
    directory, when the file is new). Raises OSError."""
    spool.mkdir(mode=0o750, parents=True, exist_ok=True)
    path = spool / RELEASES_FILE
    data = (record.to_json() + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # a crash cut the last line short: do not glue onto it
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if size == 0:
        dir_fd = os.open(spool, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


# --------------------------------------------------------------------------------- the heartbeat


def write_heartbeat(
    spool: Path, *, ts: float, host: str, interval: float, result: SweepResult
) -> None:
    """Replace ``spool/heartbeat.json`` (atomically) with what this sweep did. Raises OSError."""
    spool.mkdir(mode=0o750, parents=True, exist_ok=True)
    beat = {
        "ts": ts,
        "host": host,
        "pid": os.getpid(),
        "interval": interval,
        "released": len(result.released),
        "slurm_reachable": not result.unreachable,
        "problems": len(result.problems),
    }
    tmp = spool / f".{HEARTBEAT_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(beat) + "\n", encoding="utf-8")
    tmp.chmod(0o644)
    tmp.replace(spool / HEARTBEAT_FILE)


def read_heartbeat(spool: Path) -> dict[str, Any] | None:
    """The last heartbeat, or None when the watchdog never ran here (or it is unreadable)."""
    try:
        beat = json.loads((spool / HEARTBEAT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(beat, dict) or type(beat.get("ts")) not in (int, float):
        return None
    return beat


def stale_after(beat: dict[str, Any] | None) -> float:
    """How old a heartbeat may grow before it is stale: STALE_INTERVALS of the sweep interval
    it states, at least STALE_MIN seconds. Pure."""
    interval = (beat or {}).get("interval")
    if type(interval) not in (int, float) or interval <= 0:
        interval = 0.0
    return max(STALE_INTERVALS * interval, STALE_MIN)


def heartbeat_state(beat: dict[str, Any] | None, now: float) -> str:
    """``never`` (no heartbeat), ``stale`` (older than :func:`stale_after`) or ``ok``. Pure."""
    if beat is None:
        return "never"
    return "stale" if now - float(beat["ts"]) > stale_after(beat) else "ok"


# --------------------------------------------------------------------------------- the sweep


@dataclass
class SweepResult:
    """What one sweep did: the releases, whether slurmctld answered, and what went wrong."""

    released: list[Release] = field(default_factory=list)
    unreachable: bool = False
    #: One line per problem: the listing failed, a job was not released, a record not written.
    problems: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.unreachable:
            return EXIT_UNREACHABLE
        return EXIT_FAILED if self.problems else EXIT_OK


def sweep(scheduler: Scheduler, *, now: float, spool: Path) -> list[Release]:
    """Release every job the tool held past its deadline (see :func:`overdue`); never raises.

    For each: begin time set to now (Slurm adds ~121 s on requeue), release, one record
    appended to ``spool/releases.jsonl``, then the hold mark replaced by
    :func:`released_note`. A refusal on one job is logged and the others go on; slurmctld
    unreachable is logged and the sweep ends (the next interval tries again).
    """
    return sweep_result(scheduler, now=now, spool=spool).released


def sweep_result(
    scheduler: Scheduler, *, now: float, spool: Path, host: str | None = None
) -> SweepResult:
    """:func:`sweep`, also saying whether slurmctld answered and what failed (for exit codes)."""
    result = SweepResult()
    host = host or socket.gethostname()
    try:
        jobs = scheduler.list_jobs()
    except Unreachable as exc:
        log.warning("slurmctld unreachable, nothing released this sweep: %s", exc)
        result.unreachable = True
        return result
    except Exception as exc:
        log.error("cannot list jobs, nothing released this sweep: %s", exc)
        result.problems.append(f"listing jobs: {exc}")
        return result
    due = overdue(jobs, now)
    if due:
        due = overdue(jobs, now, _released_before(spool, result))
    for item in due:
        try:
            record = _release(scheduler, item, now=now, host=host, result=result)
        except Unreachable as exc:
            log.warning("slurmctld unreachable, sweep stopped at job %d: %s", item.job_id, exc)
            result.unreachable = True
            return result
        except Exception as exc:  # a bug must not stop the other jobs' release
            log.exception("job %d: not released: %s", item.job_id, exc)
            result.problems.append(f"job {item.job_id}: {exc}")
            continue
        if record is None:
            continue
        result.released.append(record)
        try:
            append_release(spool, record)
        except OSError as exc:
            log.error(
                "job %d released but its record was not written to %s: %s; the record: %s",
                item.job_id,
                spool / RELEASES_FILE,
                exc,
                record.to_json(),
            )
            result.problems.append(f"job {item.job_id}: record not written: {exc}")
        try:
            _unmark(scheduler, record)
        except Unreachable as exc:
            log.warning("slurmctld unreachable, sweep stopped at job %d: %s", item.job_id, exc)
            result.unreachable = True
            return result
        except Exception as exc:
            # The job runs; the spool keeps this mark from being released twice.
            log.warning("job %d: hold mark not replaced: %s", item.job_id, exc)
    return result


def released_note(record: Release) -> str:
    """The AdminComment that replaces the hold mark once the watchdog released the job."""
    return (
        f"srecovery: released by the watchdog on {record.watchdog_host} at {_iso(record.ts)}: "
        f"the hold for incident {record.incident_id} passed its deadline "
        f"{_iso(record.held_until)}"
    )


def _unmark(scheduler: Scheduler, record: Release) -> None:
    """Replace the hold mark, only after the release: a held job always keeps its mark."""
    job = scheduler.get_job(record.job_id)
    if parse_hold_mark(job.admin_comment) == (record.incident_id, record.held_until):
        scheduler.set_admin_comment(record.job_id, released_note(record))


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _released_before(spool: Path, result: SweepResult) -> frozenset[Overdue]:
    try:
        return frozenset(r.mark for r in read_releases(spool))
    except OSError as exc:
        # Fail open: without the spool, release what is overdue (at worst a job held by
        # someone else under an old mark of ours is released once more).
        log.error("cannot read %s: %s; releasing without it", spool / RELEASES_FILE, exc)
        result.problems.append(f"reading {spool / RELEASES_FILE}: {exc}")
        return frozenset()


def _release(
    scheduler: Scheduler, item: Overdue, *, now: float, host: str, result: SweepResult
) -> Release | None:
    """Begin time now, then release; the record, or None if the job needs nothing or failed.

    Raises :class:`Unreachable` (the caller stops the sweep).
    """
    job_id = item.job_id
    begin = "begin time set to now"
    try:
        scheduler.set_begin_now(job_id)
    except UnknownJob:
        log.info("job %d is gone: nothing to release", job_id)
        return None
    except Unreachable:
        raise
    except SchedulerError as exc:
        # Release anyway: a job that starts ~2 minutes late beats a job held for ever.
        log.warning(
            "job %d: could not set its begin time to now (%s); releasing anyway", job_id, exc
        )
        begin = "begin time NOT cleared: it may wait up to ~2 min to start"
    try:
        scheduler.release(job_id)
    except UnknownJob:
        log.info("job %d is gone: nothing to release", job_id)
        return None
    except Unreachable:
        raise
    except SchedulerError as exc:
        if _let_go_meanwhile(scheduler, job_id):
            log.info("job %d was released by someone else meanwhile", job_id)
            return None
        log.error("job %d: release refused: %s; trying again next sweep", job_id, exc)
        result.problems.append(f"job {job_id}: release refused: {exc}")
        return None
    record = Release(
        ts=time.time(),
        job_id=job_id,
        incident_id=item.incident_id,
        held_until=item.held_until,
        watchdog_host=host,
    )
    log.warning(
        "released job %d, held by incident %d past its deadline %s (%.0f s ago); %s",
        job_id,
        item.incident_id,
        _iso(item.held_until),
        max(0.0, now - item.held_until),
        begin,
    )
    return record


def _let_go_meanwhile(scheduler: Scheduler, job_id: int) -> bool:
    try:
        job = scheduler.get_job(job_id)
    except UnknownJob:
        return True
    except SchedulerError:
        return False
    return not (job.state == "PENDING" and job.held)


# --------------------------------------------------------------------------------- the process


def run(
    config_path: str | os.PathLike[str] | None = None,
    *,
    once: bool = False,
    interval: float | None = None,
    spool_dir: Path | None = None,
) -> int:
    """The watchdog process: sweep every ``interval`` until SIGTERM/SIGINT; returns the exit code.

    ``interval`` and ``spool_dir`` override ``watchdog.interval`` and ``watchdog.spool_dir``
    from the config file. With ``once``: one sweep, then 0 (nothing failed), 1 (a job was not
    released or a record not written), 3 (slurmctld unreachable). 2: invalid configuration.
    Logs to stderr.
    """
    handler = service_notify.log_handler(  # the journal's native protocol under systemd
        "srecovery-watchdog", "%(asctime)s srecovery-watchdog %(levelname)s %(message)s"
    )
    package_log = logging.getLogger("slurm_recovery")
    saved_level = package_log.level
    package_log.addHandler(handler)
    package_log.setLevel(logging.INFO)
    try:
        try:
            config = load_config(config_path)
        except ConfigError as exc:
            log.error("%s", exc)
            return EXIT_USAGE
        package_log.setLevel(config.log.level.upper())
        every = interval if interval is not None else config.watchdog.interval
        spool = Path(spool_dir if spool_dir is not None else config.watchdog.spool_dir).absolute()
        try:
            scheduler = open_scheduler(
                config.scheduler.backend,
                timeout=config.scheduler.command_timeout,
                bin_dir=config.scheduler.slurm_bin_dir,
                slurm_conf=config.scheduler.slurm_conf,
            )
        except SchedulerError as exc:
            log.error("cannot use the configured scheduler backend: %s", exc)
            return EXIT_USAGE
        host = socket.gethostname()
        if once:
            return _safe_sweep(scheduler, spool, host, every).exit_code
        return _loop(scheduler, spool, host, every)
    finally:
        package_log.removeHandler(handler)
        handler.close()
        package_log.setLevel(saved_level)


def _safe_sweep(scheduler: Scheduler, spool: Path, host: str, every: float) -> SweepResult:
    try:
        result = sweep_result(scheduler, now=time.time(), spool=spool, host=host)
    except Exception as exc:  # never let a bug end the process
        log.exception("sweep failed: %s", exc)
        result = SweepResult(problems=[f"sweep failed: {exc}"])
    try:
        write_heartbeat(spool, ts=time.time(), host=host, interval=every, result=result)
    except OSError as exc:
        log.warning("heartbeat not written to %s: %s", spool / HEARTBEAT_FILE, exc)
    return result


def _loop(scheduler: Scheduler, spool: Path, host: str, every: float) -> int:
    stop = threading.Event()
    saved: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            saved[signum] = signal.signal(signum, lambda *_: stop.set())
    log.info(
        "watchdog started on %s: backend %s, sweep every %gs, spool %s",
        host,
        scheduler.name,
        every,
        spool / RELEASES_FILE,
    )
    try:
        next_at = time.monotonic()
        first = True
        while not stop.is_set():
            result = _safe_sweep(scheduler, spool, host, every)
            if first:  # Type=notify: ready after the first sweep
                service_notify.ready(f"sweeping every {every:g}s")
                first = False
            service_notify.watchdog_ping()  # WatchdogSec=: once per sweep, when enabled
            service_notify.status(
                f"last sweep {time.strftime('%H:%M:%S')}: {len(result.released)} released, "
                f"{'slurmctld UNREACHABLE' if result.unreachable else 'slurmctld answered'}"
            )
            next_at = max(next_at + every, time.monotonic())
            stop.wait(next_at - time.monotonic())
    finally:
        for signum, previous in saved.items():
            signal.signal(signum, previous)
    service_notify.stopping()
    log.info("watchdog stopped")
    return EXIT_OK


class _Duration(click.ParamType):
    name = "DURATION"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            self.fail(f"{value!r}: {exc}", param, ctx)
        if seconds <= 0:
            self.fail(f"{value!r}: must be more than 0 seconds", param, ctx)
        return seconds


@click.command("watchdog")
@click.option(
    "--once",
    is_flag=True,
    help="Sweep once and exit (for a systemd timer): 0 ok, 1 a job not released, "
    "3 slurmctld unreachable.",
)
@click.option(
    "--interval",
    type=_Duration(),
    default=None,
    help='Time between sweeps, e.g. 10, "30s", "1m" (default: watchdog.interval).',
)
@click.option(
    "--spool-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory of releases.jsonl (default: watchdog.spool_dir).",
)
@click.pass_context
def watchdog_command(
    ctx: click.Context, once: bool, interval: float | None, spool_dir: Path | None
) -> None:
    """Release jobs slurm-recovery held past their deadline (fail-open; docs/watchdog.md).

    Needs only Slurm: it runs whether the controller is up or not.
    """
    obj = ctx.find_root().obj
    config_path = obj.get("config_path") if isinstance(obj, dict) else None
    ctx.exit(run(config_path, once=once, interval=interval, spool_dir=spool_dir))
