"""``srecovery-controller``: the head-node daemon (HTTP API + the recovery loop).

Its edge to the world: :func:`main` reads the configuration, tells systemd how the loop fares
through the controller's per-pass callback (:class:`SystemdNotifier`), and reads the one test
seam, ``SRECOVERY_FAILPOINT`` (:func:`failpoint_from_env`), once at start-up, and which
event loop serves the HTTP API (:func:`new_event_loop`). The loop itself reads no environment
and is patched by nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import stat
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from slurm_recovery import service_notify
from slurm_recovery.config import ConfigError, load_config, split_host_port
from slurm_recovery.options import config_option

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Test seam: ``after:STEP`` (e.g. ``after:requeue_hold``) makes the controller SIGKILL itself
#: right after it records STEP done, so the integration tests can check what a restarted
#: controller makes of a half-finished recovery (docs/troubleshooting.md).
FAILPOINT_ENV = "SRECOVERY_FAILPOINT"

#: The collector's youngest generation is collected after this many new container objects
#: (CPython's default is 700). At a thousand requests a second the default collects many
#: times a second and so promotes each kept-alive connection's short-lived objects (its
#: keep-alive timer, its last request) into the oldest generation, whose collection walks
#: every live object: 0.3-0.5 s with 10,000 open connections on the bench machine, while no
#: request is answered (docs/performance.md, "Pauses").
GC_YOUNG_THRESHOLD = 50_000

#: Seconds an idle kept-alive connection stays open (aiohttp's default is 75 s). Past the
#: sidecar's own limit (contract.client.KEEP_ALIVE_IDLE, 420 s: longer than its five-minute
#: full-status interval and a status period, the heartbeats between going as datagrams), so
#: the sidecar, not the controller, closes a connection it stopped using, and never sends on
#: one the controller is closing. 10,000 sidecars hold 10,000 connections: the service's
#: LimitNOFILE is 65,536.
KEEPALIVE_TIMEOUT = 480.0

#: ``auto`` (the default): uvloop where it is installed, else asyncio's own loop; ``asyncio``
#: or ``uvloop`` to insist (docs/troubleshooting.md).
EVENT_LOOP_ENV = "SRECOVERY_EVENT_LOOP"


class UnsafeStateError(Exception):
    """The store's file or directory can be changed by users other than the controller's."""


def check_state_permissions(db: Path) -> list[str]:
    """Refuse a store others could write (whoever can write it can forge evidence, advice
    and the audit trail, which the hash chain would only detect afterwards); warnings for a
    store others can read (it holds job names, node reasons and log lines)."""
    warnings = []
    folder = db.parent
    try:
        dst = folder.stat()
    except FileNotFoundError:
        return []  # the store creates it (tmpfiles.d makes it 0750 in the packages)
    if dst.st_mode & stat.S_IWOTH and not dst.st_mode & stat.S_ISVTX:
        raise UnsafeStateError(
            f"store.path {db}: its directory {folder} is world-writable (mode "
            f"{stat.S_IMODE(dst.st_mode):04o}): any user could replace the audit trail; "
            f"fix: chmod 0750 {folder}"
        )
    for path in (db, db.with_name(db.name + "-wal")):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        if st.st_mode & stat.S_IWOTH:
            raise UnsafeStateError(
                f"store.path {path}: world-writable (mode {stat.S_IMODE(st.st_mode):04o}): any "
                f"user could forge evidence and advice; fix: chmod 0640 {path}"
            )
        if st.st_mode & stat.S_IROTH and dst.st_mode & stat.S_IXOTH:
            warnings.append(
                f"store.path {path}: readable by every user (mode "
                f"{stat.S_IMODE(st.st_mode):04o}); it holds job names, node reasons and log "
                f"lines: chmod 0640 {path} or chmod o-rx {folder}"
            )
    return warnings


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="DEVELOPMENT ONLY: accept requests without MUNGE credentials.",
)
def main(config_path: Path | None, insecure_no_auth: bool) -> None:
    """Run the slurm-recovery controller: ingest evidence, decide, act (or advise)."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        click.echo(f"srecovery-controller: {exc}", err=True)
        sys.exit(2)
    logging.basicConfig(  # the journal's native protocol under systemd, else stderr
        level=config.log.level.upper(),
        handlers=[service_notify.log_handler("srecovery-controller", LOG_FORMAT)],
    )
    from aiohttp import web

    from slurm_recovery.controller.service import Controller
    from slurm_recovery.controller.tls import TLSConfigError, server_context

    try:
        for warning in check_state_permissions(config.store.path):
            logging.getLogger("srecovery.controller").warning("%s", warning)
    except UnsafeStateError as exc:
        click.echo(f"srecovery-controller: cannot start: {exc}", err=True)
        sys.exit(2)
    tls = None
    if config.controller.tls_cert:
        try:
            tls = server_context(config.controller.tls_cert, config.controller.tls_key)
        except TLSConfigError as exc:
            click.echo(f"srecovery-controller: cannot start: {exc}", err=True)
            sys.exit(2)
    try:
        after_step = failpoint_from_env(os.environ)
    except ValueError as exc:
        click.echo(f"srecovery-controller: {exc}", err=True)
        sys.exit(2)
    systemd = SystemdNotifier()
    try:
        controller = Controller(
            config,
            insecure_no_auth=insecure_no_auth,
            on_pass=systemd.pass_done,
            after_step=after_step,
        )
    except Exception as exc:  # a clear line, not a traceback, for config/policy/Slurm trouble
        click.echo(f"srecovery-controller: cannot start: {exc}", err=True)
        sys.exit(1)
    try:
        loop, loop_name = new_event_loop(os.environ)
    except ValueError as exc:
        click.echo(f"srecovery-controller: cannot start: {exc}", err=True)
        sys.exit(2)
    host, port = split_host_port(config.controller.listen)
    logging.getLogger("srecovery.controller").info(
        "listening on %s%s (config %s, store %s, event loop %s)",
        config.controller.listen,
        " with TLS" if tls else "",
        config.source or "defaults",
        config.store.path,
        loop_name,
    )
    app = controller.app()
    app.on_startup.append(controller.open_heartbeat_port)
    app.on_cleanup.append(controller.close_heartbeat_port)
    app.on_startup.append(settle_gc)  # after the controller's own start-up
    systemd.install(app, host, port)
    web.run_app(
        app,
        host=host,
        port=port,
        ssl_context=tls,
        backlog=4096,  # thousands of sidecars connect at once after an outage (default 128)
        keepalive_timeout=KEEPALIVE_TIMEOUT,
        print=None,
        access_log=None,
        handle_signals=True,
        loop=loop,
    )


def new_event_loop(env: Mapping[str, str]) -> tuple[asyncio.AbstractEventLoop, str]:
    """The event loop the HTTP API runs on, and its name for the log. uvloop where it is
    installed: its transports, polling and callbacks are C, and at thousands of requests a
    second they are most of what a request costs (docs/performance.md, "The event loop").
    ``$SRECOVERY_EVENT_LOOP`` (:data:`EVENT_LOOP_ENV`) = ``asyncio`` takes asyncio's own
    loop (a what-if, or a way around a uvloop fault); ``uvloop`` refuses to start without it."""
    choice = env.get(EVENT_LOOP_ENV, "").strip().lower() or "auto"
    if choice not in ("auto", "uvloop", "asyncio"):
        raise ValueError(f"{EVENT_LOOP_ENV}={choice!r}: expected auto, uvloop or asyncio")
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise ValueError(
                    f"{EVENT_LOOP_ENV}=uvloop, but uvloop is not installed "
                    "(pip install uvloop, or the python3-uvloop package)"
                ) from None
        else:
            return uvloop.new_event_loop(), f"uvloop {uvloop.__version__}"
    return asyncio.new_event_loop(), "asyncio"


async def settle_gc(app: Any = None) -> None:
    """Take what start-up made (modules, the configuration, the node table, the reports it
    loaded: they live as long as the process) out of the collector's walks, and collect the
    young generation less often (:data:`GC_YOUNG_THRESHOLD`): pauses, not throughput, are
    what the collector costs a server with thousands of connections open."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


# --------------------------------------------------------------------------------- seams


def failpoint_from_env(env: Mapping[str, str]) -> Callable[[str], None] | None:
    """The step callback ``$SRECOVERY_FAILPOINT`` asks for (None when unset): ``after:STEP``
    kills this process with SIGKILL, no clean-up, once STEP is recorded done."""
    spec = env.get(FAILPOINT_ENV, "")
    if not spec:
        return None
    when, _, target = spec.partition(":")
    if when != "after" or not target:
        raise ValueError(f"{FAILPOINT_ENV}={spec!r}: expected after:STEP, e.g. after:requeue_hold")

    def kill_after(step: str) -> None:
        if step == target:
            logging.getLogger("srecovery.controller").critical(
                "failpoint %s: killing the controller (tests only)", spec
            )
            os.kill(os.getpid(), signal.SIGKILL)

    return kill_after


class SystemdNotifier:
    """``Type=notify`` (docs/install.md): READY=1 once the store is open, the loop has made
    its first pass and the port accepts connections (so /healthz answers); STATUS= and, with
    ``WatchdogSec=``, WATCHDOG=1 after every loop pass; STOPPING=1 on shutdown. No-ops
    without ``$NOTIFY_SOCKET``."""

    def __init__(self) -> None:
        self.passes = 0
        self._tasks: list[asyncio.Task[None]] = []

    def pass_done(self, trouble: str) -> None:
        """The controller's ``on_pass``: runs on the event loop after every pass."""
        self.passes += 1
        service_notify.watchdog_ping()
        service_notify.status(f"last pass {time.strftime('%H:%M:%S')}: {trouble or 'ok'}")

    def install(self, app: Any, host: str, port: int) -> None:
        """Announce readiness from ``app``'s start-up, and stopping from its shutdown."""

        async def announce_ready() -> None:
            connect_host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
            while True:
                if self.passes:
                    with contextlib.suppress(OSError):
                        _, writer = await asyncio.open_connection(connect_host, port)
                        writer.close()
                        await writer.wait_closed()
                        service_notify.ready(f"listening on {host}:{port}")
                        return
                await asyncio.sleep(0.05)

        async def on_startup(app: Any) -> None:
            self._tasks.append(asyncio.create_task(announce_ready()))

        async def on_shutdown(app: Any) -> None:
            service_notify.stopping("shutting down")
            for task in self._tasks:
                task.cancel()

        app.on_startup.append(on_startup)
        app.on_shutdown.append(on_shutdown)
