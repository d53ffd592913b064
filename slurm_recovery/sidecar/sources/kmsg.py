"""XIDs from the kernel log: the NVIDIA driver's ``NVRM: Xid`` lines, read from /dev/kmsg.

The lines are parsed by :func:`slurm_recovery.signals.xid.parse_xid_line` (pure, shared with
the log signatures). :class:`KmsgSource` is the sidecar source: a reader thread on /dev/kmsg
(root only; opening it replays the kernel's ring buffer), deduplicated across sidecar restarts
by the last record sequence number it handed over, saved with the boot id in a small state
file (sequence numbers restart at each boot).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from slurm_recovery.sidecar.base import Finding
from slurm_recovery.signals.xid import (
    FALLEN_OFF_THE_BUS_XID,
    KMSG_RECORD,
    XidLine,
    gpu_of,
    parse_xid_line,
)

__all__ = ["KmsgSource"]

#: An inferred XID 79 within this many seconds of another XID 79 on the same GPU is the same
#: event told twice (the driver logs both "Xid ...: 79" and "GPU ...: GPU has fallen off the bus").
INFERRED_79_WINDOW = 300.0
#: The same XID (code and GPU) again within this many seconds of the last one reported is a
#: repeat: not sent, counted, and the count rides on the next one sent (``repeats``). A GPU
#: logging thousands of identical XIDs a second costs one event per GPU and code per window.
REPEAT_WINDOW = 10.0


@dataclass(frozen=True)
class _Cursor:
    boot_id: str
    seq: int


class KmsgSource:
    """XIDs from /dev/kmsg as ``xid`` findings (``origin: "kmsg"``).

    A daemon thread reads records as the kernel writes them. ``poll`` returns the XIDs read
    so far that were not yet committed; :meth:`commit` (the sidecar calls it once the
    outbox holds them) forgets them and saves the sequence number of the last record they
    cover, with the boot id, in ``<state_dir>/kmsg-cursor.json``. A restarted sidecar skips
    what was committed; what was polled but not committed is reported again: never lost.

    ``device`` may be any file of kmsg-formatted records (a FIFO or a regular file: the
    reader follows it like ``tail -f``). ``gpus`` maps PCI bus ids to GPU indexes, or is a
    callable returning that map (the GPU backend's inventory); :meth:`set_gpus` replaces it.
    ``boot_time`` is the wall-clock time of boot, turning record timestamps into
    ``observed_at`` (default: now minus the monotonic clock, which is what printk uses).
    """

    name = "kmsg"
    fast = True

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        device: str | os.PathLike[str] = "/dev/kmsg",
        gpus: Mapping[str, int] | Callable[[], Mapping[str, int]] | None = None,
        boot_id_path: str | os.PathLike[str] = "/proc/sys/kernel/random/boot_id",
        boot_time: float | None = None,
        reopen_interval: float = 5.0,
        max_pending: int = 10_000,
    ) -> None:
        self._device = Path(device)
        self._state = Path(state_dir) / "kmsg-cursor.json"
        self._gpus = gpus
        self._boot_id = _read_boot_id(Path(boot_id_path))
        self._boot_time = time.time() - time.monotonic() if boot_time is None else boot_time
        self._reopen_interval = reopen_interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        #: (XID, when read, repeats of its code on its GPU held back before it)
        self._pending: deque[tuple[XidLine, float, int]] = deque()
        self._max_pending = max_pending
        self._dropped = 0
        self._overruns = 0
        self._error: str | None = None
        self._state_error: str | None = None
        self._gpu_error: str | None = None
        cursor = self._load_cursor()
        #: records at or below this sequence number were committed by an earlier run
        self._floor = cursor.seq if cursor is not None else -1
        self._committed = self._floor
        self._handed = self._floor
        self._highest = self._floor
        #: findings returned by ``poll`` and not committed yet
        self._unacked: list[Finding] = []
        self._recent_79: dict[str | None, float] = {}
        #: (pci, xid) -> when the last one reported was observed, and the repeats since
        self._last_sent: dict[tuple[str | None, int], float] = {}
        self._repeats: dict[tuple[str | None, int], int] = {}
        self._suppressed = 0
        self._thread = threading.Thread(target=self._run, name="srecovery-kmsg", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ Source interface

    def poll(self, now: float) -> list[Finding]:
        """The XIDs not committed yet, oldest first (those of earlier polls come again)."""
        with self._lock:
            batch = list(self._pending)
            self._pending.clear()
            self._handed = self._highest
        if batch:
            gpus = self._gpu_map()
            for xid_line, read_at, repeats in batch:
                observed = self._observed_at(xid_line, read_at, now)
                payload = xid_line.to_payload()
                if repeats:
                    payload["repeats"] = repeats
                self._unacked.append(
                    Finding(
                        kind="xid",
                        observed_at=observed,
                        gpu=gpu_of(xid_line.pci, gpus),
                        payload=payload,
                    )
                )
        return list(self._unacked)

    def commit(self) -> None:
        """What the last ``poll`` returned is safe (in the sidecar's outbox): forget it, and
        save the cursor so that a restart does not report it again."""
        self._unacked.clear()
        self._save(self._handed)

    def close(self) -> None:
        """Stop the reader. When nothing is waiting to be reported, save the cursor up to
        the last record read (records without an XID need not be read again)."""
        self._stop.set()
        self._thread.join(timeout=2.0)
        with self._lock:
            idle = not self._pending and not self._unacked
            highest = self._highest
        if idle:
            self._save(highest)

    # ------------------------------------------------------------------ state for status

    def status(self) -> str:
        """``"ok"``, or what is wrong (for the sidecar's status event)."""
        with self._lock:
            problems = [p for p in (self._error, self._state_error, self._gpu_error) if p]
            if self._dropped:
                problems.append(f"{self._dropped} XIDs dropped (reader queue full)")
            if self._suppressed:
                problems.append(
                    f"{self._suppressed} repeated XIDs not sent (same GPU and code within "
                    f"{REPEAT_WINDOW:g}s)"
                )
            if self._overruns:
                problems.append(f"kernel ring buffer overran {self._overruns} times")
        return "; ".join(problems) or "ok"

    def set_gpus(self, gpus: Mapping[str, int] | Callable[[], Mapping[str, int]] | None) -> None:
        """Replace the PCI bus id -> GPU index map (after the inventory changed)."""
        self._gpus = gpus

    # ------------------------------------------------------------------ internals

    def _gpu_map(self) -> Mapping[str, int] | None:
        source = self._gpus
        if callable(source):
            try:
                table = source()
            except Exception as exc:  # the inventory's trouble must not stop XIDs
                self._gpu_error = f"GPU inventory unavailable, XIDs name no GPU: {exc}"
                return None
            self._gpu_error = None
            return table
        return source

    def _observed_at(self, xid_line: XidLine, read_at: float, now: float) -> float:
        if xid_line.timestamp_us is None:
            return min(read_at, now)
        return min(self._boot_time + xid_line.timestamp_us / 1e6, now)

    def _repeat(self, xid_line: XidLine, observed: float) -> bool:
        """The same code on the same GPU within REPEAT_WINDOW of the last one reported."""
        key = (xid_line.pci, xid_line.xid)
        last = self._last_sent.get(key)
        if last is not None and 0 <= observed - last < REPEAT_WINDOW:
            self._repeats[key] = self._repeats.get(key, 0) + 1
            self._suppressed += 1
            return True
        self._last_sent[key] = observed
        return False

    def _duplicate_79(self, xid_line: XidLine, observed: float) -> bool:
        if xid_line.xid != FALLEN_OFF_THE_BUS_XID:
            return False
        key = xid_line.pci
        if xid_line.inferred:
            for seen_pci, seen_at in self._recent_79.items():
                if (key is None or seen_pci in (key, None)) and abs(
                    observed - seen_at
                ) <= INFERRED_79_WINDOW:
                    return True
        self._recent_79[key] = observed
        return False

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                fd = os.open(self._device, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as exc:
                hint = " (the sidecar must run as root)" if exc.errno == errno.EACCES else ""
                with self._lock:
                    self._error = f"cannot open {self._device}: {exc.strerror}{hint}"
                self._stop.wait(self._reopen_interval)
                continue
            with self._lock:
                self._error = None
            try:
                self._read(fd)
            finally:
                os.close(fd)
            if not self._stop.is_set():
                self._stop.wait(self._reopen_interval)

    def _read(self, fd: int) -> None:
        partial = b""
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([fd], [], [], 0.2)
                if not ready:
                    continue
                chunk = os.read(fd, 16384)
            except BlockingIOError:
                continue
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # /dev/kmsg: records overwritten before read
                    with self._lock:
                        self._overruns += 1
                    continue
                with self._lock:
                    self._error = f"reading {self._device} failed: {exc.strerror}; reopening"
                return
            if not chunk:  # end of a regular file, or a FIFO without a writer: follow it
                self._stop.wait(0.1)
                continue
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()
            for raw in lines:
                self._take(raw)

    def _take(self, raw: bytes) -> None:
        if not raw or raw[:1] in (b" ", b"\t"):  # empty, or a record's KEY=value line
            return
        text = raw.decode("utf-8", "replace")
        record = KMSG_RECORD.match(text)
        seq = int(record["seq"]) if record is not None else None
        if seq is not None:
            with self._lock:
                if seq <= max(self._floor, self._highest):
                    return
        found = parse_xid_line(text)
        read_at = time.time()
        with self._lock:
            if seq is not None:
                self._highest = seq
            if found is None:
                return
            # a repeat is counted here, in the reader, so that a storm of one code never
            # takes the queue's places from the other XIDs
            observed = self._observed_at(found, read_at, read_at)
            if self._duplicate_79(found, observed) or self._repeat(found, observed):
                return
            repeats = self._repeats.pop((found.pci, found.xid), 0)
            if len(self._pending) >= self._max_pending:
                self._pending.popleft()
                self._dropped += 1
            self._pending.append((found, read_at, repeats))

    # ------------------------------------------------------------------ the cursor file

    def _load_cursor(self) -> _Cursor | None:
        try:
            data = json.loads(self._state.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self._state_error = f"{self._state}: unreadable ({exc}); reading from the start"
            return None
        if not isinstance(data, dict):
            return None
        boot_id, seq = data.get("boot_id"), data.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(boot_id, str):
            return None
        if boot_id != self._boot_id:  # another boot: its sequence numbers mean nothing now
            return None
        return _Cursor(boot_id, seq)

    def _save(self, seq: int) -> None:
        if seq <= self._committed:
            return
        try:
            self._state.parent.mkdir(parents=True, exist_ok=True)
            temp = self._state.with_name(self._state.name + ".tmp")
            temp.write_text(json.dumps({"boot_id": self._boot_id, "seq": seq}) + "\n")
            os.replace(temp, self._state)
        except OSError as exc:
            with self._lock:
                self._state_error = f"cannot save {self._state}: {exc.strerror or exc}"
            return
        self._committed = seq
        with self._lock:
            self._state_error = None


def _read_boot_id(path: Path) -> str:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return path.read_text(encoding="utf-8").strip()
    return ""
