"""Slurm's node listing, kept fresh by a thread of its own.

Why a thread: at 10,000 nodes one listing takes 0.1 to 0.3 s (``scontrol -o show nodes``,
docs/performance.md); read inside the pass, every decision that arrives during it waits behind
it, and a pass takes longer the larger the cluster. The loop instead takes the latest listing,
at most ``every`` old while Slurm answers, and never waits for one: the time to decide an
incident does not depend on the cluster's size. A step that changes a node reads that node
first, and again after (``Reconciler._reconcile``), and hands the record to :meth:`update`: a
listing a second old never decides a drain, nor hides the tool's own.

A listing older than ``max_age`` (Slurm stopped answering) is not used: the pass gets the
last read's error, as if it had read Slurm itself, and acts on nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from slurm_recovery.controller.periodic import Periodic
from slurm_recovery.scheduler import Node, SchedulerError, Unreachable


class NodeListing:
    """The latest ``read()`` (a scheduler's ``list_nodes``) by node name, and how old it is."""

    def __init__(
        self,
        read: Callable[[], list[Node]],
        *,
        every: float = 1.0,
        max_age: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self.max_age = max_age
        self.clock = clock
        self._lock = threading.Lock()
        self._latest: tuple[float, dict[str, Node]] | None = None
        self._error: SchedulerError | None = None
        #: node -> (when, its record) read afresh by the loop since a listing began
        self._updates: dict[str, tuple[float, Node]] = {}
        self._thread = Periodic(
            "srecovery-nodes", every, self.refresh, failed="reading Slurm's node listing failed"
        )
        #: listings read so far (/healthz ``node_reads``)
        self.reads = 0

    def refresh(self) -> None:
        """Read the listing now. Slurm's refusal is kept for :meth:`nodes` to raise."""
        started = self.clock()
        try:
            nodes = {node.name: node for node in self._read()}
        except SchedulerError as exc:
            with self._lock:
                self._error = exc
            return
        with self._lock:
            for name, (at, node) in list(self._updates.items()):
                if at >= started:
                    nodes[name] = node  # read afresh after this listing began: newer
                else:
                    del self._updates[name]  # this listing began after it: it shows it
            self._latest, self._error = (started, nodes), None
            self.reads += 1

    def update(self, node: Node) -> None:
        """A node the loop has just read afresh (before and after the tool drains it): the
        listing shows this record from now on, and a listing that began before now cannot
        bring the old one back. Without it, a listing a second old would show the tool's own
        drain as undone, and the blast radius would not count it."""
        at = self.clock()
        with self._lock:
            self._updates[node.name] = (at, node)
            if self._latest is not None:
                read_at, nodes = self._latest
                self._latest = (read_at, {**nodes, node.name: node})

    def nodes(self) -> dict[str, Node]:
        """The latest listing. The first call reads one; a listing older than ``max_age``
        raises the last read's error (or :class:`Unreachable` saying how old it is)."""
        if self._latest is None and self._error is None:
            self.refresh()
        with self._lock:
            latest, error = self._latest, self._error
        if latest is not None and self.clock() - latest[0] <= self.max_age:
            return latest[1]
        if error is not None:
            raise error
        age = "never read" if latest is None else f"last read {self.clock() - latest[0]:.0f}s ago"
        raise Unreachable(f"Slurm's node listing is out of date ({age})")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()
