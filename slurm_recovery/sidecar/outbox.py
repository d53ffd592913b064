"""Delivery: a durable, bounded on-disk queue of evidence events and the sender that drains it.

:class:`Outbox` is a FIFO in SQLite (WAL journal, ``synchronous=FULL``: every append and every
acknowledgement is fsynced before it returns). SQLite rather than JSONL segments because one
transaction can append a batch, trim the oldest events past the bound and count them, or
remove a delivered batch, and a crash at any instant leaves either all of it or none: no torn
lines to repair, no segment/offset bookkeeping of our own. It is already how the controller
stores its state.

:class:`Sender` posts batches to the controller signed with MUNGE (role ``sidecar``, or
``hook`` for events the hooks spooled) and removes them only after a 2xx: delivery is
at-least-once. Unreachable, 5xx and 429: keep, back off 0.5 s doubling to 30 s with jitter,
honour Retry-After. 400/413 (a bad event or a batch too large): split the batch to isolate
the event; a single rejected event goes to the dead-letter file and is counted, so one poison
event never blocks the queue. 401/403/404 and other refusals: keep, back off, log loudly (the
node or the controller is misconfigured). Events are never dropped except by the bound, and
every drop is counted (``Outbox.dropped``, reported in the next ``sidecar_status`` event).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import random
import sqlite3
import threading
import time
import urllib.error
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from slurm_recovery.contract.client import ClientError
from slurm_recovery.contract.status import HELD, STATUS_KIND, payload_digest
from slurm_recovery.contract.wire import MAX_EVENTS

log = logging.getLogger(__name__)

DB_FILE = "outbox.db"
LOCK_FILE = "outbox.lock"
DEAD_LETTER_FILE = "dead-letter.jsonl"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queue (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    role TEXT NOT NULL,
    event TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO counters (name, value) VALUES ('dropped', 0), ('dead_lettered', 0);
"""


class OutboxError(RuntimeError):
    """The outbox cannot be opened (locked by another sidecar, unreadable, corrupt)."""


@dataclass(frozen=True)
class Entry:
    """One queued event: its queue ``id``, the ``role`` to send it as, the event itself."""

    id: int
    role: str
    event: dict[str, Any]
    size: int  # bytes of its JSON


class Outbox:
    """``<directory>/outbox.db``: events waiting for the controller, oldest first, at most
    ``max_events`` (past it the oldest are dropped and counted). One process at a time: the
    directory is locked while open. Safe to share between threads."""

    def __init__(self, directory: str | os.PathLike[str], max_events: int) -> None:
        if max_events < 1:
            raise ValueError("max_events must be at least 1")
        self.directory = Path(directory)
        self.max_events = max_events
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock_fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise OutboxError(
                f"{self.directory}: the outbox is in use by another process (a second sidecar "
                "for this node?); stop it first"
            ) from None
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(
                self.directory / DB_FILE, isolation_level=None, check_same_thread=False
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            (self._count,) = self._db.execute("SELECT COUNT(*) FROM queue").fetchone()
        except sqlite3.Error as exc:
            os.close(self._lock_fd)
            raise OutboxError(f"{self.directory / DB_FILE}: cannot open the outbox: {exc}") from exc
        self.dead_letter_path = self.directory / DEAD_LETTER_FILE

    # --- the queue ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def append(self, entries: Iterable[tuple[str, dict[str, Any]]]) -> int:
        """Queue ``(role, event)`` pairs durably, in order; returns how many of the oldest
        events were dropped to stay within ``max_events`` (also added to :attr:`dropped`)."""
        rows = [(role, json.dumps(event, separators=(",", ":"))) for role, event in entries]
        if not rows:
            return 0
        with self._lock, self._transaction():
            self._db.executemany("INSERT INTO queue (role, event) VALUES (?, ?)", rows)
            self._count += len(rows)
            over = self._count - self.max_events
            dropped = 0
            if over > 0:
                dropped = self._db.execute(
                    "DELETE FROM queue WHERE id IN (SELECT id FROM queue ORDER BY id LIMIT ?)",
                    (over,),
                ).rowcount
                self._count -= dropped
                self._bump("dropped", dropped)
        if dropped:
            log.warning(
                "outbox full (%d events): dropped the %d oldest (reported in sidecar_status)",
                self.max_events,
                dropped,
            )
        return dropped

    def peek(self, limit: int = MAX_EVENTS, max_bytes: int = 512 * 1024) -> list[Entry]:
        """The oldest events that can go in one request: the same role, at most ``limit``, at
        most ``max_bytes`` of JSON (but always at least one event)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, role, event FROM queue ORDER BY id LIMIT ?", (limit,)
            ).fetchall()
        batch: list[Entry] = []
        total = 0
        for row_id, role, text in rows:
            size = len(text) + 1
            if batch and (role != batch[0].role or total + size > max_bytes):
                break
            batch.append(Entry(row_id, role, json.loads(text), size))
            total += size
        return batch

    def ack(self, ids: Sequence[int]) -> int:
        """Remove delivered events; returns how many were still queued."""
        if not ids:
            return 0
        with self._lock, self._transaction():
            removed = self._delete(ids)
        return removed

    def dead_letter(self, entries: Sequence[Entry], status: int, reason: str) -> None:
        """Move events the controller refused for good to ``dead-letter.jsonl`` (one JSON
        object per line, fsynced before they leave the queue) and count them."""
        if not entries:
            return
        now = time.time()
        lines = "".join(
            json.dumps(
                {"at": now, "status": status, "reason": reason, "role": e.role, "event": e.event},
                separators=(",", ":"),
            )
            + "\n"
            for e in entries
        )
        with self._lock:
            fd = os.open(self.dead_letter_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, lines.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            with self._transaction():
                self._delete([e.id for e in entries])
                self._bump("dead_lettered", len(entries))

    # --- counters ----------------------------------------------------------------------------

    @property
    def dropped(self) -> int:
        """Events dropped by the bound since the outbox was created (persistent)."""
        return self._counter("dropped")

    @property
    def dead_lettered(self) -> int:
        """Events moved to the dead-letter file since the outbox was created (persistent)."""
        return self._counter("dead_lettered")

    def close(self) -> None:
        with self._lock:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- inside ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self):
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            (self._count,) = self._db.execute("SELECT COUNT(*) FROM queue").fetchone()
            raise
        self._db.execute("COMMIT")

    def _delete(self, ids: Sequence[int]) -> int:
        removed = 0
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            marks = ",".join("?" * len(chunk))
            removed += self._db.execute(f"DELETE FROM queue WHERE id IN ({marks})", chunk).rowcount
        self._count -= removed
        return removed

    def _bump(self, name: str, by: int) -> None:
        self._db.execute("UPDATE counters SET value = value + ? WHERE name = ?", (by, name))

    def _counter(self, name: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0


# --------------------------------------------------------------------------------- the sender


class EvidenceClient(Protocol):
    """What the sender needs of :class:`~slurm_recovery.contract.client.ControllerClient`."""

    def post_evidence(
        self, events: Sequence[dict[str, Any]], *, role: str, node: str | None = None
    ) -> Any: ...

    def post_heartbeat(self, node: str, digest: str) -> Any: ...


#: Outcome of one delivery attempt (:meth:`Sender.send_available`).
SENT, EMPTY, RETRY = "sent", "empty", "retry"

#: Statuses that say "not now": retried with backoff, quietly.
_TRANSIENT = frozenset({0, 408, 425, 429})
#: Statuses that say "this event (or batch) is wrong": split, then dead-letter.
_POISON = frozenset({400, 413, 422})
#: Longest Retry-After honoured, in seconds (a larger one is clamped).
MAX_RETRY_AFTER = 300.0
#: Seconds heartbeats stay off after a controller that does not take them (an older one: 404),
#: refuses them, or keeps asking for the full status it was just sent (it judges a status's
#: condition differently: a rolling upgrade); every status goes in full meanwhile.
HEARTBEATS_OFF = 3600.0
#: "Send it in full" answers in a row, each after the full status, that turn heartbeats off.
WANTED_IN_A_ROW = 3


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (``Retry-After``, delta-seconds form), if any."""
    value = getattr(exc, "retry_after", None)
    if value is None:
        cause = exc.__cause__
        if isinstance(cause, urllib.error.HTTPError) and cause.headers is not None:
            value = cause.headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER) if seconds == seconds else None


class _Retry(Exception):
    """Stop this attempt; keep what is queued and try again after ``delay``."""

    def __init__(self, error: ClientError) -> None:
        super().__init__(str(error))
        self.error = error


class Sender:
    """Drains an :class:`Outbox` to the controller. Call :meth:`send_available` (synchronous,
    one attempt) or run :meth:`run` in a thread and :meth:`wake` it when events are queued."""

    def __init__(
        self,
        outbox: Outbox,
        client: EvidenceClient,
        node: str,
        batch_max: int = MAX_EVENTS,
        *,
        max_batch_bytes: int = 512 * 1024,
        backoff_min: float = 0.5,
        backoff_max: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.outbox = outbox
        self.client = client
        self.node = node
        self.batch_max = max(1, min(batch_max, MAX_EVENTS))
        self.max_batch_bytes = max_batch_bytes
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.clock = clock
        self.rng = rng or random.Random()
        #: consecutive failed attempts (0: the last attempt delivered, or none was made)
        self.failures = 0
        #: when (``clock``) the next attempt may start; 0 = now
        self.next_attempt = 0.0
        self.last_error: ClientError | None = None
        self.delivered = 0
        self._outage_since: float | None = None
        #: (condition digest, ``clock`` time) of the last full status the controller accepted
        self.held: tuple[str, float] | None = None
        #: the controller asked for the full status (the sidecar sends one at its next tick)
        self.status_wanted = False
        self.heartbeats_off_until = 0.0
        self._heartbeat: str | None = None  # the digest of the heartbeat waiting to be sent
        self._wanted_in_a_row = 0
        self._wake = threading.Event()
        self._urgent = False
        self._stop = threading.Event()

    # --- one attempt -------------------------------------------------------------------------

    def send_available(self) -> str:
        """Send queued batches until the queue is empty (``EMPTY``) or a request fails
        (``RETRY``: :attr:`next_attempt` says when to try again). ``SENT``: delivered some and
        stopped because :meth:`stop` was called."""
        sent_any = False
        while True:
            batch = self.outbox.peek(self.batch_max, self.max_batch_bytes)
            if not batch:
                return self._send_heartbeat()
            queued = len(self.outbox)
            try:
                self._deliver(batch)
            except _Retry as retry:
                self._failed(retry.error)
                return RETRY
            sent_any = True
            self._succeeded(queued)
            if self._stop.is_set():
                return SENT if sent_any else EMPTY

    def _deliver(self, batch: Sequence[Entry]) -> None:
        try:
            self.client.post_evidence([e.event for e in batch], role=batch[0].role, node=self.node)
        except ClientError as exc:
            if exc.status in _POISON:
                if len(batch) == 1:
                    self.outbox.dead_letter(batch, exc.status, exc.reason)
                    log.error(
                        "controller refused an event for good (%s): %s; moved to %s",
                        exc.status,
                        exc.reason,
                        self.outbox.dead_letter_path,
                    )
                    return
                half = len(batch) // 2
                self._deliver(batch[:half])
                self._deliver(batch[half:])
                return
            raise _Retry(exc) from exc
        self.outbox.ack([e.id for e in batch])
        self.delivered += len(batch)
        for entry in reversed(batch):
            if entry.role == "sidecar" and entry.event.get("kind") == STATUS_KIND:
                digest = payload_digest(entry.event.get("payload") or {})
                self.held = (digest, self.clock())
                if self._heartbeat != digest:  # made before this status: it says nothing now
                    self._heartbeat = None
                break

    # --- heartbeats --------------------------------------------------------------------------

    def heartbeat(self, digest: str, max_age: float) -> bool:
        """Instead of a status whose condition has ``digest``: True, and a heartbeat is on
        its way, when the controller accepted a full status of that condition less than
        ``max_age`` seconds ago and takes heartbeats; False: send the status in full."""
        if max_age <= 0 or self.held is None or self.clock() < self.heartbeats_off_until:
            return False
        held, since = self.held
        if held != digest or self.clock() - since >= max_age:
            return False
        self._heartbeat = digest
        self._wake.set()
        return True

    def _send_heartbeat(self) -> str:
        """Send the heartbeat waiting, if any (the queue is empty): EMPTY, or RETRY when the
        controller cannot be reached (it stays, unless a newer one replaces it)."""
        digest = self._heartbeat
        if digest is None:
            return EMPTY
        try:
            answer = self.client.post_heartbeat(self.node, digest)
        except ClientError as exc:
            if exc.status in _TRANSIENT or exc.status >= 500:
                self._failed(exc)
                return RETRY
            self._heartbeat = None
            self._heartbeats_off(
                "the controller takes no heartbeats"
                if exc.status in (404, 405)
                else f"the controller refused a heartbeat ({exc.status}: {exc.reason})"
            )
            return EMPTY
        if self._heartbeat == digest:
            self._heartbeat = None
        self._succeeded(0)
        if isinstance(answer, dict) and answer.get("status") == HELD:
            self._wanted_in_a_row = 0
            return EMPTY
        # "wanted" (or an answer this sidecar does not know): the status in full, now
        self.held = None
        self.status_wanted = True
        self._wanted_in_a_row += 1
        if self._wanted_in_a_row >= WANTED_IN_A_ROW:
            self._heartbeats_off(
                f"the controller asked for the full status {self._wanted_in_a_row} times in a "
                "row (does it judge a status's condition differently: another version?)"
            )
        return EMPTY

    def _heartbeats_off(self, why: str) -> None:
        self.heartbeats_off_until = self.clock() + HEARTBEATS_OFF
        self.held = None
        self.status_wanted = True
        self._wanted_in_a_row = 0
        log.warning("%s: every status goes in full for %.0f s", why, HEARTBEATS_OFF)

    def _succeeded(self, queued: int) -> None:
        if self._outage_since is not None:
            log.info(
                "controller reachable again after %.1fs; delivering the %d queued events",
                self.clock() - self._outage_since,
                queued,
            )
        self.failures = 0
        self.next_attempt = 0.0
        self.last_error = None
        self._outage_since = None

    def _failed(self, exc: ClientError) -> None:
        self.failures += 1
        base = min(self.backoff_max, self.backoff_min * 2 ** (self.failures - 1))
        delay = base * self.rng.uniform(0.5, 1.0)
        asked = retry_after(exc)
        if asked is not None:
            delay = max(delay, asked)
        now = self.clock()
        self.next_attempt = now + delay
        first = self._outage_since is None
        if first:
            self._outage_since = now
        self.last_error = exc
        queued = len(self.outbox)
        if exc.status in _TRANSIENT or exc.status >= 500:
            if first:
                log.warning(
                    "cannot deliver to the controller (%s); keeping %d events, retrying with "
                    "backoff",
                    exc,
                    queued,
                )
            else:
                log.debug("still cannot deliver (%s); next try in %.1fs", exc, delay)
        else:
            log.error(
                "the controller REFUSED this sidecar (%s): check that node %r is this host's "
                "Slurm node name, that munged here shares the controller's key, that the "
                "sidecar runs as root or the SlurmUser, and client.url; keeping %d events, "
                "retrying in %.0fs",
                exc,
                self.node,
                queued,
                delay,
            )

    # --- the thread --------------------------------------------------------------------------

    def wake(self, urgent: bool = False) -> None:
        """Events were queued: send now; ``urgent`` (a fatal finding) skips a backoff wait."""
        if urgent:
            self._urgent = True
        self._wake.set()

    def stop(self) -> None:
        """Ask :meth:`run` to return after the request in flight, if any."""
        self._stop.set()
        self._wake.set()

    def run(self) -> None:
        """Drain continuously until :meth:`stop`. Never raises for delivery trouble."""
        while not self._stop.is_set():
            wait = self.next_attempt - self.clock()
            if self._urgent:
                wait = 0.0
            if wait > 0 or (len(self.outbox) == 0 and self._heartbeat is None):
                self._wake.wait(timeout=wait if wait > 0 else None)
                self._wake.clear()
                continue
            self._urgent = False
            try:
                self.send_available()
            except Exception:  # a bug or a disk error: log, back off, never die
                log.exception("sender: unexpected error; retrying later")
                self.failures += 1
                self.next_attempt = self.clock() + self.backoff_max

    def flush(self, timeout: float) -> bool:
        """Deliver what is queued now, within about ``timeout`` seconds (call when
        :meth:`run` is not running). True if the queue is empty afterwards."""
        deadline = self.clock() + timeout
        while True:
            if self.send_available() == EMPTY:
                return True
            if self.next_attempt >= deadline or self.clock() >= deadline:
                return len(self.outbox) == 0
            time.sleep(max(0.0, self.next_attempt - self.clock()))
