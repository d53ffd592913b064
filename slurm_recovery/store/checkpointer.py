"""Checkpoints of the controller's store, on a thread of their own.

A checkpoint copies the WAL's pages into the database file and fsyncs it: 50 to 250 ms on the
disks measured (docs/performance.md). SQLite runs one inside whichever commit fills the WAL past
1,000 pages, and at ingest rates that is an evidence commit every few seconds, with every
request in its group waiting. The controller's connections therefore open with
``auto_checkpoint=False`` and this thread checkpoints every ``every`` seconds instead, beside
the commits, which go on appending to the WAL meanwhile (SQLite allows both at once).

A failed checkpoint is logged and tried again; it never stops a commit. If the thread stopped
for good, the WAL would grow until the controller restarts (the last connection to close
checkpoints it); ``/healthz`` shows ``wal_pages``.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from .errors import StoreError
from .store import Store, WalCheckpoint

log = logging.getLogger("srecovery.store")


class Checkpointer:
    """Checkpoint the store at ``path`` every ``every`` seconds until :meth:`stop`."""

    def __init__(self, path: Path, *, every: float = 1.0) -> None:
        self.path = path
        self.every = every
        #: the last checkpoint's result (None before the first)
        self.last: WalCheckpoint | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="srecovery-checkpoint", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        store: Store | None = None
        while True:
            try:
                store = store or Store.open(self.path)
                self.last = store.checkpoint()
                if self._failing:
                    log.info("checkpoints of %s work again", self.path)
                self._failing = False
            except StoreError as exc:  # e.g. a full disk: commits still work, retry later
                if not self._failing:
                    log.warning(
                        "checkpoint of %s failed (retrying every %gs): %s",
                        self.path,
                        self.every,
                        exc,
                    )
                self._failing = True
            except Exception:  # a bug here must not end checkpoints for good
                log.exception("checkpoint of %s failed; retrying", self.path)
            if self._stop.wait(self.every):
                break
        if store is not None:
            store.close()
