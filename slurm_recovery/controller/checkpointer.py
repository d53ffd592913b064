"""Checkpoints of the controller's store, on a thread of their own.

A checkpoint copies the WAL's pages into the database file and syncs it (11 to 15 ms for 1,400
pages on an idle disk here, longer under load). SQLite runs one inside whichever commit takes
the WAL past 1,000 pages, and at ingest rates that is an evidence commit every few seconds,
with every request of its group waiting. The controller's connections therefore open with
``auto_checkpoint=False`` and this thread checkpoints every ``every`` seconds instead, beside
the commits, which go on appending to the WAL meanwhile (SQLite allows both at once).

A failed checkpoint is logged once and tried again; it never stops a commit. Until one works,
the WAL grows; ``/healthz`` shows ``wal_pages`` (docs/troubleshooting.md).
"""

from __future__ import annotations

import logging
from pathlib import Path

from slurm_recovery.controller.periodic import Periodic
from slurm_recovery.store import Store, StoreError, WalCheckpoint

log = logging.getLogger("srecovery.store")


class Checkpointer:
    """Checkpoint the store at ``path`` every ``every`` seconds between :meth:`start` and
    :meth:`stop`, on its own connection."""

    def __init__(self, path: Path, *, every: float = 1.0) -> None:
        self.path = path
        #: the last checkpoint's result (None before the first)
        self.last: WalCheckpoint | None = None
        self._store: Store | None = None  # opened and closed on the thread
        self._failing = False
        self.thread = Periodic(
            "srecovery-checkpoint",
            every,
            self.checkpoint,
            failed=f"checkpoint of {path} failed; retrying",
            finish=self._close,
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.thread.stop()

    def checkpoint(self) -> None:
        try:
            self._store = self._store or Store.open(self.path)
            self.last = self._store.checkpoint()
        except StoreError as exc:  # e.g. a full disk: commits still work; retry next time
            if not self._failing:
                log.warning(
                    "checkpoint of %s failed (retrying every %gs): %s",
                    self.path,
                    self.thread.every,
                    exc,
                )
            self._failing = True
            return
        if self._failing:
            log.info("checkpoints of %s work again", self.path)
        self._failing = False

    def _close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
