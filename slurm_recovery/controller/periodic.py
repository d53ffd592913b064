"""A daemon thread that runs one step every few seconds: the node listing and the store's
checkpoints each have one, beside the loop and the ingest threads."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("srecovery.controller")


class Periodic:
    """Call ``step`` every ``every`` seconds (start to start) on a thread named ``name`` until
    :meth:`stop`, then ``finish`` once on that thread. An exception from ``step`` is logged
    with ``failed`` and the next call comes as usual: a bug must not end the thread for good."""

    def __init__(
        self,
        name: str,
        every: float,
        step: Callable[[], None],
        *,
        failed: str,
        finish: Callable[[], None] | None = None,
    ) -> None:
        self.every = every
        self._step, self._failed, self._finish = step, failed, finish
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            begun = time.monotonic()
            try:
                self._step()
            except Exception:
                log.exception(self._failed)
            self._stop.wait(max(0.0, self.every - (time.monotonic() - begun)))
        if self._finish is not None:
            self._finish()
