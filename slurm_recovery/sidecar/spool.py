"""The hook-event spool: job events the prolog/epilog hooks leave on disk for the sidecar to send.

A hook writes one event per file, ``<spool_dir>/events/<name>.json``, through a temporary file
and a rename (files ending ``.tmp`` are still being written and are ignored). The file holds
one evidence event in the controller's wire format (``controller/wire.py``), about this node.
:class:`HookSpool` reads them two-phase: :meth:`HookSpool.take` returns the events and a
``commit`` function that deletes their files, to be called only once the events are durable
in the outbox, so a crash in between re-sends (at-least-once) and never loses one. A file that
is not a valid event is moved to ``events/bad/`` and counted; it never stops the loop.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from slurm_recovery.controller.wire import WireError, parse_event
from slurm_recovery.hooks import EVENTS_DIR, spool_event
from slurm_recovery.sidecar.base import Finding

log = logging.getLogger(__name__)

BAD_DIR = "bad"
SUFFIX = ".json"
TMP_SUFFIX = ".tmp"
#: A spool file larger than this is not a hook event (payloads are at most 16 KiB).
MAX_FILE_BYTES = 64 * 1024
#: Events taken per call, at most (one outbox transaction, one batch).
DEFAULT_TAKE_LIMIT = 1000


class SpoolError(RuntimeError):
    """The spool directory cannot be used (missing, unreadable, or writable by others)."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HookSpool:
    """``<spool_dir>/events/``: one hook event per file. Writers use :meth:`put`; the sidecar
    uses :meth:`take`. ``bad`` counts files moved to ``events/bad/`` by this object."""

    def __init__(self, spool_dir: str | os.PathLike[str]) -> None:
        self.spool_dir = Path(spool_dir)
        self.events_dir = self.spool_dir / EVENTS_DIR
        self.bad_dir = self.events_dir / BAD_DIR
        self.bad = 0

    # --- writing (hooks, tests) -------------------------------------------------------------

    def put(self, event: Mapping[str, Any]) -> Path:
        """Write one event exactly as the hooks do (``slurm_recovery.hooks.spool_event``:
        tmp file, fsync, rename, fsync the directory); its path. Names sort by creation time,
        so the sidecar sends events in the order they were put."""
        return Path(spool_event(self.events_dir.parent, event))

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
        try:
            parse_event(event, path.name, source="hook")
        except WireError as exc:
            raise ValueError(str(exc)) from None
        return event

    def _quarantine(self, path: Path, reason: str) -> None:
        self.bad += 1
        log.error("hook spool: %s is not a valid event (%s); moved to %s", path, reason, BAD_DIR)
        try:
            self.bad_dir.mkdir(mode=0o755, exist_ok=True)
            os.rename(path, self.bad_dir / path.name)
        except OSError as exc:
            log.error("hook spool: cannot move %s to %s (%s); deleting it", path, BAD_DIR, exc)
            with contextlib.suppress(OSError):
                path.unlink()


class SpoolSource:
    """The hook spool as a fast :class:`~slurm_recovery.sidecar.base.Source`.

    ``poll`` takes the waiting events (as findings, sent with the ``hook`` role so the
    controller records them as hook evidence); ``commit`` deletes their files and must be
    called only after the outbox holds them durably.
    """

    name = "hook_spool"
    fast = True
    role = "hook"

    def __init__(self, spool: HookSpool, node: str, limit: int = DEFAULT_TAKE_LIMIT) -> None:
        self.spool = spool
        self.node = node
        self.limit = limit
        self._commit: Callable[[], None] | None = None
        spool.ensure()

    def poll(self, now: float) -> list[Finding]:
        self.spool.check()
        events, self._commit = self.spool.take(self.node, self.limit)
        return [
            Finding(
                kind=e["kind"],
                observed_at=float(e["observed_at"]),
                gpu=e.get("gpu"),
                job_id=e.get("job_id"),
                payload=e.get("payload", {}),
            )
            for e in events
        ]

    def commit(self) -> None:
        commit, self._commit = self._commit, None
        if commit is not None:
            commit()

    def close(self) -> None:
        self._commit = None
