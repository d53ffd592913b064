"""The controller's two seams (docs/troubleshooting.md): the per-pass callback systemd's
notifications ride on, and the step callback the ``SRECOVERY_FAILPOINT`` kill rides on; and
the daemon's start-up hook for the garbage collector, and its choice of event loop."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time
from pathlib import Path

import pytest
from msgspec.structs import replace

from slurm_recovery.config import Config
from slurm_recovery.controller import (
    EVENT_LOOP_ENV,
    FAILPOINT_ENV,
    GC_YOUNG_THRESHOLD,
    failpoint_from_env,
    new_event_loop,
    settle_gc,
)
from slurm_recovery.controller.loop import Reconciler
from slurm_recovery.controller.service import Controller
from slurm_recovery.scheduler import Unreachable
from tests.unit.test_replay import FakeSlurm, job, nodes

POLICY = Path(__file__).parents[2] / "etc" / "policy.toml"


def config(tmp_path: Path) -> Config:
    base = Config()
    return replace(
        base,
        store=replace(base.store, path=tmp_path / "state.db"),
        controller=replace(base.controller, policy=POLICY, loop_interval=0.01),
        cluster=replace(base.cluster, name="c1"),
        scheduler=replace(base.scheduler, slurm_bin_dir=str(tmp_path)),  # no Slurm
    )


def passes(controller: Controller, heard: list[str], count: int) -> list[str]:
    """Start the controller's loop, wait until ``count`` passes were heard, stop it."""

    async def run() -> None:
        await controller.start(None)
        deadline = time.monotonic() + 10
        while len(heard) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await controller.stop(None)

    asyncio.run(run())
    return heard


class UnreachableSlurm(FakeSlurm):
    def list_jobs(self):
        raise Unreachable("connection refused")


def test_on_pass_hears_every_pass_and_its_trouble(tmp_path: Path):
    heard: list[str] = []
    controller = Controller(config(tmp_path), on_pass=heard.append)
    controller.scheduler = FakeSlurm([job()], nodes())
    assert passes(controller, heard, 3)[:3] == ["", "", ""]

    heard.clear()
    controller = Controller(config(tmp_path), on_pass=heard.append)
    controller.scheduler = UnreachableSlurm([], [])
    trouble = passes(controller, heard, 2)
    assert trouble[:2] == ["slurmctld unreachable: connection refused"] * 2


def test_on_pass_hears_why_slurm_could_not_be_read(tmp_path: Path):
    """The real scontrol backend with no Slurm commands in its bin_dir: each pass ends with the
    reason (no exception out of the loop), and systemd's STATUS says it."""
    heard: list[str] = []
    passes(Controller(config(tmp_path), on_pass=heard.append), heard, 2)
    assert heard[:2] == [heard[0]] * 2
    assert heard[0].startswith("cannot read Slurm: squeue not found"), heard[0]


def test_on_pass_hears_a_pass_that_raised(tmp_path: Path, caplog, monkeypatch):
    """A pass that raises (a bug) still counts: systemd's watchdog hears the loop is alive,
    STATUS says to read the log, and the log has the error."""
    heard: list[str] = []
    controller = Controller(config(tmp_path), on_pass=heard.append)
    controller.scheduler = FakeSlurm([job()], nodes())

    def broken(self, view) -> None:
        raise RuntimeError("a bug in a pass")

    monkeypatch.setattr(Reconciler, "_detect_and_decide", broken)
    passes(controller, heard, 2)
    assert heard[:2] == ["the pass failed (see the log)"] * 2
    assert "a bug in a pass" in caplog.text


def test_no_failpoint_unless_asked():
    assert failpoint_from_env({}) is None
    assert failpoint_from_env({FAILPOINT_ENV: ""}) is None


@pytest.mark.parametrize("spec", ["before:mark", "after:", "requeue_hold"])
def test_a_failpoint_it_cannot_read_is_refused(spec: str):
    with pytest.raises(ValueError, match="expected after:STEP"):
        failpoint_from_env({FAILPOINT_ENV: spec})


def test_the_failpoint_kills_after_its_step_only(monkeypatch):
    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append((pid, sig)))
    after_step = failpoint_from_env({FAILPOINT_ENV: "after:mark"})
    assert after_step is not None
    after_step("drain")
    assert kills == []
    after_step("mark")
    assert kills == [(os.getpid(), signal.SIGKILL)]


def test_the_daemon_takes_its_start_up_objects_out_of_the_collectors_walks():
    """srecovery-controller's start-up hook: a full collection walks every object the
    collector tracks, and at 10,000 kept-alive connections took 0.3-0.5 s with no request
    answered; what start-up made is frozen, and the young generation is collected less often
    (docs/performance.md)."""
    before = gc.get_threshold()
    try:
        asyncio.run(settle_gc())
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *before[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def _serve_one_request(loop: asyncio.AbstractEventLoop) -> bytes:
    """A request answered by an aiohttp server on ``loop``: the loop can serve the API."""
    from aiohttp import web

    async def go() -> bytes:
        app = web.Application()

        async def hello(request: web.Request) -> web.Response:
            return web.Response(body=await request.read())

        app.router.add_post("/", hello)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        body = await reader.readexactly(2)
        writer.close()
        await runner.cleanup()
        return head.split(b"\r\n", 1)[0] + b" " + body

    try:
        return loop.run_until_complete(go())
    finally:
        loop.close()


def test_the_api_runs_on_uvloop_where_installed():
    import uvloop  # a dependency (pyproject.toml): missing here is an install fault, not a skip

    loop, name = new_event_loop({})
    assert name == f"uvloop {uvloop.__version__}"
    assert type(loop).__module__.startswith("uvloop")
    assert _serve_one_request(loop) == b"HTTP/1.1 200 OK hi"


def test_asyncio_s_own_loop_when_asked_or_without_uvloop(monkeypatch):
    loop, name = new_event_loop({EVENT_LOOP_ENV: "asyncio"})
    assert (name, type(loop).__module__) == ("asyncio", "asyncio.unix_events")
    assert _serve_one_request(loop) == b"HTTP/1.1 200 OK hi"
    monkeypatch.setitem(__import__("sys").modules, "uvloop", None)  # as if not installed
    loop, name = new_event_loop({})
    loop.close()
    assert name == "asyncio"
    with pytest.raises(ValueError, match="uvloop is not installed"):
        new_event_loop({EVENT_LOOP_ENV: "uvloop"})


def test_an_event_loop_it_does_not_know_is_refused():
    with pytest.raises(ValueError, match="expected auto, uvloop or asyncio"):
        new_event_loop({EVENT_LOOP_ENV: "trio"})


def test_the_ingest_queue_is_bounded_by_count_and_by_bytes(tmp_path: Path):
    base = config(tmp_path)
    limits = replace(
        base.controller,
        max_queued_requests=3,
        max_queued_bytes=2_000_000,
        max_request_bytes=1_048_576,
    )
    controller = Controller(replace(base, controller=limits), insecure_no_auth=True)
    assert controller._queue_full(1_048_576) == ""  # an empty queue takes any allowed body
    controller._ingest_queue.append(("request", b"x" * 1_500_000, None, None))  # type: ignore[arg-type]
    controller._queued_bytes = 1_500_000
    assert controller._queue_full(400_000) == ""
    assert controller._queue_full(600_000) == "1500000 bytes of requests waiting to be stored"
    assert controller._queue_full(None) == "1500000 bytes of requests waiting to be stored"
    controller._ingest_queue *= 3
    assert controller._queue_full(10) == "3 requests waiting to be stored"
