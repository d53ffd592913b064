"""The hook spool: job events the hooks leave on disk for the sidecar (or the controller).

A hook writes one event per file, ``<spool_dir>/events/<time_ns>-<pid>-<job>.json``, through a
temporary file and a rename (files ending ``.tmp`` are still being written and are ignored), so a
reader taking ``*.json`` never sees half a file. The file holds one evidence event in the wire
format (:mod:`slurm_recovery.contract.wire`). The node hooks write into the node's sidecar spool,
which the sidecar sends on (:class:`slurm_recovery.sidecar.spool.SpoolSource`); EpilogSlurmctld
writes into the controller's when the controller does not answer, and the controller imports
them. :class:`HookSpool` reads them two-phase: :meth:`HookSpool.take` returns the events and a
``commit`` function that deletes their files, to be called only once the events are durable, so
a crash in between re-sends (at-least-once) and never loses one. A file that is not a valid
event is moved to ``events/bad/`` and counted; it never stops the reader.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Callable, Mapping
from contextlib import suppress

#: typing and pathlib cost a hook ~5 ms: the annotations need only the names (the reader
#: imports pathlib itself)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

#: Sub-directory of a spool directory that holds event files, and of that, the refused ones.
EVENTS_DIR = "events"
BAD_DIR = "bad"
SUFFIX = ".json"
TMP_SUFFIX = ".tmp"
#: A spool file larger than this is not a hook event (payloads are at most 16 KiB).
MAX_FILE_BYTES = 64 * 1024
#: Events taken per call, at most (one outbox transaction, one batch).
DEFAULT_TAKE_LIMIT = 1000


class SpoolError(RuntimeError):
    """The spool directory cannot be used (missing, unreadable, or writable by others)."""


class HookSpool:
    """``<spool_dir>/events/``: one hook event per file. Writers use :meth:`put`; the sidecar
    uses :meth:`take`. ``bad`` counts files moved to ``events/bad/`` by this object."""

    def __init__(self, spool_dir: str | os.PathLike[str]) -> None:
        from pathlib import Path

        self.spool_dir = Path(spool_dir)
        self.events_dir = self.spool_dir / EVENTS_DIR
        self.bad_dir = self.events_dir / BAD_DIR
        self.bad = 0

    # --- writing (hooks, tests) -------------------------------------------------------------

    def put(self, event: Mapping[str, Any]) -> Path:
        """Write one event as the hooks do (:func:`spool_event`); its path. Names sort by
        creation time, so the sidecar sends events in the order they were put."""
        return self.events_dir / os.path.basename(spool_event(self.spool_dir, event))

    # --- reading (the sidecar) --------------------------------------------------------------

    def check(self) -> None:
        """Raise :class:`SpoolError` unless the events directory is safe to read: whoever can
        write there can report job events for this node, so it must not be group- or
        world-writable."""
        try:
            st = os.stat(self.events_dir)
        except FileNotFoundError:
            raise SpoolError(f"{self.events_dir}: no such directory") from None
        if not stat.S_ISDIR(st.st_mode):
            raise SpoolError(f"{self.events_dir}: not a directory")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise SpoolError(
                f"{self.events_dir}: writable by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}): anyone could forge job events; "
                f"fix: chmod 755 {self.events_dir}"
            )

    def ensure(self) -> None:
        """Create the directories (mode 0755) if missing, then :meth:`check` them."""
        self.spool_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        for path in (self.events_dir, self.bad_dir):
            with contextlib.suppress(FileExistsError):
                path.mkdir(mode=0o755)
        self.check()

    def pending(self) -> list[Path]:
        """Complete event files, oldest name first."""
        try:
            entries = list(os.scandir(self.events_dir))
        except FileNotFoundError:
            return []
        names = [e.name for e in entries if e.name.endswith(SUFFIX) and e.is_file()]
        return [self.events_dir / name for name in sorted(names)]

    def take(
        self, node: str | None, limit: int = DEFAULT_TAKE_LIMIT
    ) -> tuple[list[dict[str, Any]], Callable[[], None]]:
        """Up to ``limit`` valid events about ``node`` (an event without ``node`` gets it), and
        the function that deletes their files. Invalid files go to ``bad/`` right away.
        ``node=None`` (the controller's head-node spool): events are taken as they are."""
        events: list[dict[str, Any]] = []
        taken: list[Path] = []
        for path in self.pending():
            if len(events) >= limit:
                break
            try:
                event = self._read(path, node)
            except FileNotFoundError:
                continue  # another reader, or an admin, removed it
            except (OSError, ValueError) as exc:
                self._quarantine(path, str(exc))
                continue
            events.append(event)
            taken.append(path)

        def commit() -> None:
            for path in taken:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            if taken:
                _fsync_dir(self.events_dir)

        return events, commit

    def _read(self, path: Path, node: str | None) -> dict[str, Any]:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
        try:
            event = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(event, dict):
            raise ValueError("not a JSON object")
        if node is not None:
            event.setdefault("node", node)
            if event["node"] != node:
                raise ValueError(
                    f"about node {event['node']!r}, but this sidecar speaks for {node}"
                )
        from slurm_recovery.contract.wire import WireError, parse_event  # readers only

        try:
            parse_event(event, path.name)
        except WireError as exc:
            raise ValueError(str(exc)) from None
        return event

    def _quarantine(self, path: Path, reason: str) -> None:
        import logging  # readers only: the hooks write, and never pay for it

        log = logging.getLogger(__name__)
        self.bad += 1
        log.error("hook spool: %s is not a valid event (%s); moved to %s", path, reason, BAD_DIR)
        try:
            self.bad_dir.mkdir(mode=0o755, exist_ok=True)
            os.rename(path, self.bad_dir / path.name)
        except OSError as exc:
            log.error("hook spool: cannot move %s to %s (%s); deleting it", path, BAD_DIR, exc)
            with contextlib.suppress(OSError):
                path.unlink()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def spool_event(spool_dir: str | os.PathLike[str], event: Mapping[str, Any]) -> str:
    """Write ``event`` into ``<spool_dir>/events/<time_ns>-<pid>-<job>.json`` atomically
    (``.tmp``, fsync, rename, fsync of the directory); returns the file. Raises OSError.
    ``time_ns`` has 20 digits, so names sort in the order the events were written."""
    folder = os.path.join(os.fspath(spool_dir), EVENTS_DIR)
    os.makedirs(folder, mode=0o750, exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}-{event.get('job_id') or 'nojob'}.json"
    final = os.path.join(folder, name)
    tmp = final + ".tmp"
    data = (json.dumps(event, separators=(",", ":"), sort_keys=True) + "\n").encode()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o640)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, final)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)
    return final


def read_spooled(spool_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every complete event in ``<spool_dir>/events/``, oldest first (for tests and tools;
    the sidecar and the controller have their own readers)."""
    folder = os.path.join(os.fspath(spool_dir), EVENTS_DIR)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    except (FileNotFoundError, NotADirectoryError):
        return []
    events = []
    for name in names:
        with open(os.path.join(folder, name), "rb") as fh:
            events.append(json.load(fh))
    return events
