"""``srecovery-sidecar``: the per-node daemon that turns GPU, kernel-log, fabric and hook signals
into evidence and delivers it to the controller.

Three threads. The fast loop (every ``sidecar.fast_interval``) polls the fast sources (kernel
log XIDs, injected XIDs, the hook spool, job logs and progress files) and sends a
``sidecar_status`` event every ``sidecar.status_interval`` (a minute; while its condition is the
one the controller holds, a heartbeat stands for it, and the full status with its readings goes
every ``sidecar.full_status_interval``: contract.status); the slow loop (every
``sidecar.poll_interval``) polls the GPU backend and InfiniBand, so a hung NVML call never
delays an XID; the sender drains the outbox. Each finding is appended to the on-disk outbox
(then, and only then, its source may forget it) and the sender is woken at once. After each slow
poll, and whenever the set changes, ``<spool_dir>/health.json`` lists the open fatal GPU
conditions for the prolog health gate. A source's failure is logged and reported in a status
event; it never stops the daemon. SIGTERM: finish the request in flight, deliver what the
controller will take within a few seconds, exit 0."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from slurm_recovery import __version__, service_notify
from slurm_recovery.config import ConfigError, load_config
from slurm_recovery.contract.client import ControllerClient
from slurm_recovery.contract.spool import BAD_DIR, EVENTS_DIR
from slurm_recovery.contract.status import payload_digest
from slurm_recovery.contract.wire import MAX_PAYLOAD_BYTES, WireError, parse_event
from slurm_recovery.options import config_option
from slurm_recovery.sidecar.base import Finding, Source
from slurm_recovery.sidecar.outbox import Entry, Outbox, OutboxError, Sender
from slurm_recovery.sidecar.registry import Registry, build
from slurm_recovery.sidecar.sim import SimError, check_node

log = logging.getLogger("srecovery.sidecar")

HEALTH_FILE = "health.json"
OUTBOX_DIR = "outbox"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
#: Seconds between ``sidecar_status`` events.
STATUS_INTERVAL = 60.0
#: The longest seconds between two full statuses (a heartbeat stands for the others).
FULL_STATUS_INTERVAL = 300.0
#: Seconds the sidecar keeps delivering after SIGTERM (when the controller answers).
EXIT_FLUSH_SECONDS = 5.0
#: Request timeout towards the controller, seconds.
CONTROLLER_TIMEOUT = 10.0
#: Exit codes: 0 ok; 1 cannot start; 2 bad usage or config; 3 (--once) events left queued.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNDELIVERED = 0, 1, 2, 3


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


# --------------------------------------------------------------------------------- health


class Health:
    """The open fatal GPU conditions of this node, kept in ``health.json`` for the prolog gate.

    A ``gpu_finding`` of severity ``fatal`` opens ``(check, gpu)``; the same check reported
    ``cleared`` (or at a lower severity) closes it, and a ``gpu_reset`` finding closes every
    condition of its GPU (of the node, without a GPU). An XID the catalogue calls fatal and not
    the application's opens ``("xid", gpu)``. Fatal conditions need a GPU reset or a reboot to
    go away, and an edge-triggered backend does not report them again, so they are kept across
    sidecar restarts within one boot (``boot_id``) and forgotten at a reboot. One exception: a
    ``gpu_inventory`` (the driver answered and listed the GPUs) closes the node's
    ``driver_version_mismatch``, which a module reloaded without a reboot also ends, so that
    a sidecar restarted in between does not hold the node on its predecessor's word.
    """

    def __init__(self, path: Path, node: str, catalogue: Any = None, boot_id: str = "") -> None:
        self.path = path
        self.node = node
        self.catalogue = catalogue
        self.boot_id = boot_id
        self.open: dict[tuple[str, int | None], dict[str, Any]] = {}
        #: When the fast sources (XIDs, the hook spool) were last read, for a waiting Epilog.
        self.fast_read_at: float | None = None
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("%s: unreadable (%s); starting with no open conditions", self.path, exc)
            return
        if not isinstance(data, dict) or not self.boot_id or data.get("boot_id") != self.boot_id:
            return  # another boot: the GPUs were reset since
        for item in data.get("fatal", []):
            if isinstance(item, dict) and isinstance(item.get("check"), str):
                gpu = item.get("gpu")
                self.open[(item["check"], gpu if type(gpu) is int else None)] = item

    def observe(self, findings: Iterable[Finding]) -> bool:
        """Update the open conditions; True if they changed."""
        changed = False
        with self._lock:
            for finding in findings:
                if finding.kind == "gpu_finding" and finding.payload.get("check") == "gpu_reset":
                    reset = [k for k in self.open if finding.gpu is None or k[1] == finding.gpu]
                    for key in reset:
                        del self.open[key]
                    changed |= bool(reset)
                    continue
                if finding.kind == "gpu_inventory":
                    changed |= self.open.pop(("driver_version_mismatch", None), None) is not None
                    continue
                key, entry = self._assess(finding)
                if key is None:
                    continue
                if entry is None:
                    changed |= self.open.pop(key, None) is not None
                elif key not in self.open:
                    self.open[key] = entry
                    changed = True
        return changed

    def _assess(
        self, finding: Finding
    ) -> tuple[tuple[str, int | None] | None, dict[str, Any] | None]:
        payload = finding.payload
        if finding.kind == "gpu_finding" and isinstance(payload.get("check"), str):
            key = (payload["check"], finding.gpu)
            if payload.get("cleared") or payload.get("severity") != "fatal":
                return key, None
            return key, self._entry(key, finding.observed_at, str(payload.get("detail", "")))
        if finding.kind == "xid" and self.catalogue is not None:
            code = payload.get("xid")
            if type(code) is not int:
                return None, None
            info = self.catalogue.assess(code, str(payload.get("message", "")))
            if not info.fatal or info.fault_class == "application":
                return None, None
            where = f" on GPU {finding.gpu}" if finding.gpu is not None else ""
            key = ("xid", finding.gpu)
            return key, self._entry(key, finding.observed_at, f"{info.label}{where}")
        return None, None

    @staticmethod
    def _entry(key: tuple[str, int | None], since: float, detail: str) -> dict[str, Any]:
        return {"check": key[0], "gpu": key[1], "since": since, "detail": detail}

    def write(self, now: float) -> None:
        """Replace ``health.json`` atomically (temporary file, fsync, rename)."""
        with self._lock:
            fatal = sorted(
                self.open.values(), key=lambda e: (e["check"], -1 if e["gpu"] is None else e["gpu"])
            )
            doc: dict[str, Any] = {
                "updated_at": now,
                "node": self.node,
                "boot_id": self.boot_id,
                "fatal": fatal,
            }
            if self.fast_read_at is not None:
                doc["fast_read_at"] = self.fast_read_at
            tmp = self.path.with_name(self.path.name + ".tmp")
            with open(tmp, "w") as fh:
                json.dump(doc, fh, indent=1)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)


# --------------------------------------------------------------------------------- the loop


def _urgent(event: Mapping[str, Any]) -> bool:
    """Worth cutting a delivery backoff short: XIDs, fatal findings, job ends."""
    kind = event["kind"]
    payload = event.get("payload") or {}
    return kind in ("xid", "job_end") or payload.get("severity") == "fatal"


class Sidecar:
    """The sidecar's loops over a :class:`Registry`, an :class:`Outbox` and a :class:`Sender`.

    :meth:`run` runs until ``stop`` is set; :meth:`run_once` does one of everything.
    """

    def __init__(
        self,
        node: str,
        registry: Registry,
        outbox: Outbox,
        sender: Sender,
        spool_dir: Path,
        *,
        fast_interval: float,
        poll_interval: float,
        status_interval: float = STATUS_INTERVAL,
        full_status_interval: float = FULL_STATUS_INTERVAL,
        catalogue: Any = None,
        boot_id: str = "",
    ) -> None:
        self.node = node
        self.registry = registry
        self.outbox = outbox
        self.sender = sender
        self.spool_dir = spool_dir
        self.fast_interval = fast_interval
        self.poll_interval = poll_interval
        self.status_interval = status_interval
        self.full_status_interval = full_status_interval
        self.health = Health(spool_dir / HEALTH_FILE, node, catalogue, boot_id)
        self.started_at = time.time()
        #: source name -> error text while its poll fails
        self.failing: dict[str, str] = {}
        self._failing_lock = threading.Lock()
        self._status_due = time.monotonic()

    # --- one source ------------------------------------------------------------------------

    def collect(self, source: Source, now: float) -> list[Finding]:
        """Poll one source, queue what it found, let it forget it; what was queued. Never
        raises."""
        name = getattr(source, "name", type(source).__name__)
        try:
            findings = source.poll(now)
        except Exception as exc:
            self._failed(name, exc)
            return []
        self._recovered(name)
        if not findings:
            return []
        try:
            self.queue(findings, getattr(source, "role", "sidecar"))
        except Exception:
            log.exception("cannot queue %d findings from %s; they stay there", len(findings), name)
            return []
        commit = getattr(source, "commit", None)
        if commit is not None:
            try:
                commit()
            except Exception as exc:  # a re-send later, never a loss
                self._failed(name, exc)
        return findings

    def queue(self, findings: Sequence[Finding], role: str = "sidecar") -> None:
        """Append findings to the outbox as events (invalid ones to the dead-letter file),
        update the health file, wake the sender."""
        good: list[tuple[str, dict[str, Any]]] = []
        for finding in findings:
            event = finding.to_event(self.node)
            try:
                parse_event(event, f"{finding.kind} finding")
            except WireError as exc:
                log.error("a source produced an invalid event (%s): dead-lettered", exc)
                self.outbox.dead_letter([Entry(0, role, event, 0)], 0, str(exc))
                continue
            good.append((role, event))
        self.outbox.append(good)
        for source in self.registry.fast:  # e.g. the job-log follower learns of job starts
            see = getattr(source, "see", None)
            if see is not None:
                see(findings)
        if self.health.observe(findings):
            self._write_health(time.time())
        if good:
            self.sender.wake(urgent=any(_urgent(event) for _, event in good))

    def _failed(self, name: str, exc: Exception) -> None:
        text = f"{type(exc).__name__}: {exc}"
        with self._failing_lock:
            previous = self.failing.get(name)
            self.failing[name] = text
        if previous != text:
            log.error("source %s failed: %s", name, text, exc_info=previous is None)
            self._status_due = 0.0  # say so in a status event now
        else:
            log.debug("source %s still failing: %s", name, text)

    def _recovered(self, name: str) -> None:
        if name in self.failing:
            with self._failing_lock:
                self.failing.pop(name, None)
            log.info("source %s works again", name)
            self._status_due = 0.0

    # --- ticks -----------------------------------------------------------------------------

    def tick_fast(self, now: float) -> None:
        ended = False
        for source in self.registry.fast:
            ended |= any(f.kind == "job_end" for f in self.collect(source, now))
        if ended:
            # The job's Epilog may be waiting for the fault that ended it (hooks.epilog_gate):
            # read the fast sources once more, now that its job_end is in, and say when, so
            # that a read listing nothing ends its wait (hooks.epilog_gate_decision).
            again = time.time()
            for source in self.registry.fast:
                self.collect(source, again)
            self.health.fast_read_at = again
            self._write_health(again)

    def tick_slow(self, now: float) -> None:
        for source in self.registry.slow:
            found = self.collect(source, now)
            if source is self.registry.gpu and any(f.kind == "gpu_inventory" for f in found):
                self._share_inventory()
        self._write_health(now)

    def _share_inventory(self) -> None:
        """Give sources that name GPUs by PCI bus id (the kernel log) the GPU map."""
        takers = [s for s in self.registry.fast if hasattr(s, "set_gpus")]
        if not takers:
            return
        try:
            from slurm_recovery.sidecar.gpu import pci_index

            table = pci_index(self.registry.gpu.inventory())
        except Exception as exc:
            log.debug("GPU inventory unavailable for the kernel-log source: %s", exc)
            return
        for source in takers:
            source.set_gpus(table)

    def _write_health(self, now: float) -> None:
        try:
            self.health.write(now)
        except OSError as exc:
            log.error("cannot write %s: %s", self.health.path, exc)

    def status(self, now: float) -> Finding:
        """The ``sidecar_status`` finding: queue, drops, sources, delivery, GPU readings."""
        sources: dict[str, str] = dict(self.registry.broken)
        for source in self.registry.sources:
            name = getattr(source, "name", type(source).__name__)
            text = "ok"
            reporter = getattr(source, "status", None)
            if callable(reporter):
                try:
                    text = str(reporter())
                except Exception as exc:
                    text = f"status failed: {exc}"
            sources[name] = self.failing.get(name, text)
        try:
            bad = sum(1 for _ in os.scandir(self.spool_dir / EVENTS_DIR / BAD_DIR))
        except OSError:
            bad = 0
        last = self.sender.last_error
        payload: dict[str, Any] = {
            "version": __version__,
            "started_at": self.started_at,
            "queued": len(self.outbox),
            "dropped": self.outbox.dropped,
            "dead_lettered": self.outbox.dead_lettered,
            "spool_bad": bad,
            "sources": sources,
            "delivery": {
                "delivered": self.sender.delivered,
                "failures": self.sender.failures,
                "last_error": str(last) if last else "",
            },
            "fatal": len(self.health.open),
        }
        gpu = self.registry.gpu
        if gpu is not None and hasattr(gpu, "telemetry"):
            try:
                readings = {str(k): v for k, v in gpu.telemetry().items()}
            except Exception as exc:
                sources[getattr(gpu, "name", "gpu")] = f"telemetry failed: {exc}"
            else:
                payload["gpus"] = readings
                if len(json.dumps(payload, default=str)) > MAX_PAYLOAD_BYTES - 1024:
                    del payload["gpus"]  # many GPUs: the readings would not fit
        return Finding("sidecar_status", now, payload=payload)

    def emit_status(self, now: float) -> None:
        """The status in full through the queue, or a heartbeat when its condition is the one
        the controller holds from a full status less than ``full_status_interval`` ago
        (contract.status): the readings wait for the next full status, a change never does."""
        self._status_due = time.monotonic() + self.status_interval
        wanted, self.sender.status_wanted = self.sender.status_wanted, False
        try:
            status = self.status(now)
            if not wanted and self.sender.heartbeat(
                payload_digest(status.payload), self.full_status_interval
            ):
                return
            self.queue([status])
        except Exception:
            log.exception("cannot queue the status event")

    # --- loops -----------------------------------------------------------------------------

    def run_once(self, flush_timeout: float = CONTROLLER_TIMEOUT) -> bool:
        """A status event, one slow and one fast tick, one delivery attempt. True if nothing
        is left queued."""
        self.emit_status(time.time())
        self.tick_slow(time.time())
        self.tick_fast(time.time())
        return self.sender.flush(flush_timeout)

    def _slow_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.tick_slow(time.time())
            except Exception:
                log.exception("slow poll failed")
            stop.wait(max(0.0, self.poll_interval - (time.monotonic() - started)))

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set, then deliver for up to a few seconds and return."""
        log.info(
            "sidecar for %s: %s; spool %s; queued %d",
            self.node,
            ", ".join(getattr(s, "name", "?") for s in self.registry.sources) or "no sources",
            self.spool_dir,
            len(self.outbox),
        )
        for name, error in self.registry.broken.items():
            log.error("running without %s: %s", name, error)
        sender = threading.Thread(target=self.sender.run, name="srecovery-sender", daemon=True)
        sender.start()
        self.emit_status(time.time())
        slow = threading.Thread(
            target=self._slow_loop, args=(stop,), name="srecovery-slow", daemon=True
        )
        slow.start()
        service_notify.ready(f"sidecar for {self.node}")
        next_fast = time.monotonic()
        while not stop.is_set():
            service_notify.watchdog_ping()  # WatchdogSec=: once per fast tick, when enabled
            try:
                self.tick_fast(time.time())
                if time.monotonic() >= self._status_due or self.sender.status_wanted:
                    self.emit_status(time.time())
            except Exception:
                log.exception("fast tick failed")
            next_fast = max(next_fast + self.fast_interval, time.monotonic())
            stop.wait(max(0.0, next_fast - time.monotonic()))
        log.info("stopping: finishing the request in flight")
        service_notify.stopping("finishing the request in flight")
        slow.join(timeout=self.poll_interval + 5)
        self.sender.stop()
        sender.join(timeout=CONTROLLER_TIMEOUT + 5)
        if len(self.outbox) and self.sender.failures == 0:
            self.sender.flush(EXIT_FLUSH_SECONDS)
        log.info("stopped; %d events stay queued for the next start", len(self.outbox))


# --------------------------------------------------------------------------------- main


def _load_catalogue() -> Any:
    try:
        from slurm_recovery.signals.xid import load_xid_catalogue

        return load_xid_catalogue()
    except Exception as exc:
        log.error("XID catalogue unavailable (%s): fatal XIDs will not show in health.json", exc)
        return None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@click.option(
    "--node",
    default=None,
    help="The Slurm node this sidecar speaks for (default: sidecar.node, else the short hostname).",
)
@click.option(
    "--once",
    is_flag=True,
    help="One status, slow and fast poll, and delivery "
    "attempt, then exit (3 if events stay queued).",
)
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="DEVELOPMENT ONLY: send without MUNGE credentials (to a controller started with "
    "--insecure-no-auth).",
)
@click.version_option(__version__, prog_name="srecovery-sidecar")
def main(config_path: Path | None, node: str | None, once: bool, insecure_no_auth: bool) -> None:
    """Run the slurm-recovery sidecar for one node: GPU, kernel-log, fabric and hook events
    to the controller, durably."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        click.echo(f"srecovery-sidecar: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    logging.basicConfig(  # the journal's native protocol under systemd, else stderr
        level=config.log.level.upper(),
        handlers=[
            service_notify.log_handler(
                "srecovery-sidecar", "%(asctime)s %(levelname)s %(name)s: %(message)s"
            )
        ],
    )
    side = config.sidecar
    node = node or side.node_name
    try:
        check_node(node)
    except SimError as exc:
        click.echo(f"srecovery-sidecar: --node: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    spool_dir = side.spool_path(node)
    try:
        spool_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        outbox = Outbox(spool_dir / OUTBOX_DIR, side.queue_max_events)
    except (OSError, OutboxError) as exc:
        click.echo(f"srecovery-sidecar: cannot start: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    client = ControllerClient(
        config.client.url,
        munge_socket=config.auth.munge_socket or None,
        insecure=insecure_no_auth,
        timeout=CONTROLLER_TIMEOUT,
        ca_file=config.client.ca_file or None,
        sessions=config.auth.sessions,
        keep_alive=True,  # one connection through the status period (client.KEEP_ALIVE_IDLE)
        datagrams=True,  # heartbeats as datagrams where the controller offers a port for them
    )
    sender = Sender(outbox, client, node, side.batch_max_events)
    from slurm_recovery.scheduler.scontrol import ScontrolScheduler
    from slurm_recovery.sidecar.sources.joblog import slurm_output_paths

    # one backend object for the sidecar's life: it learns the Slurm release once
    slurm = ScontrolScheduler(
        timeout=config.scheduler.command_timeout,
        bin_dir=config.scheduler.slurm_bin_dir,
        slurm_conf=config.scheduler.slurm_conf,
    )
    ask_slurm = functools.partial(slurm_output_paths, slurm)
    registry = build(side, node, spool_dir, config.hooks.job_dir, ask_slurm)
    sidecar = Sidecar(
        node,
        registry,
        outbox,
        sender,
        spool_dir,
        fast_interval=side.fast_interval,
        poll_interval=side.poll_interval,
        status_interval=side.status_interval,
        full_status_interval=side.full_status_interval,
        catalogue=_load_catalogue(),
        boot_id=read_boot_id(),
    )
    code = EXIT_OK
    try:
        if once:
            code = EXIT_OK if sidecar.run_once() else EXIT_UNDELIVERED
        else:
            stop = threading.Event()

            def on_signal(signum: int, _frame: Any) -> None:
                log.info("%s received", signal.Signals(signum).name)
                stop.set()

            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
            sidecar.run(stop)
    finally:
        registry.close()
        with contextlib.suppress(Exception):
            outbox.close()
    sys.exit(code)
