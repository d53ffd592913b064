"""The controller's two seams (docs/troubleshooting.md): the per-pass callback systemd's
notifications ride on, and the step callback the ``SRECOVERY_FAILPOINT`` kill rides on; and
the daemon's start-up hook for the garbage collector."""

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
    FAILPOINT_ENV,
    GC_YOUNG_THRESHOLD,
    failpoint_from_env,
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
