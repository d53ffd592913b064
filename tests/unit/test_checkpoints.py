"""The controller's commits leave the WAL alone and a thread of its own checkpoints it
(controller/checkpointer.py): real SQLite files, real threads."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import pytest

from slurm_recovery.controller.checkpointer import Checkpointer
from slurm_recovery.controller.periodic import Periodic
from slurm_recovery.store import Evidence, Store

#: one batch: about 1,300 pages of 4 KiB, more than SQLite's auto-checkpoint threshold (1,000)
BIG = [Evidence("sidecar", "sidecar_status", 1.0, "n1", payload={"x": "y" * 40_000})] * 130


def wait_for(condition, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.02)
    raise AssertionError("timed out")


def evidence_in_file_alone(path: Path, scratch: Path) -> int:
    """Rows in the database file itself, without its WAL (what a checkpoint has copied)."""
    shutil.copyfile(path, scratch)
    with Store.open(scratch) as copy:
        return len(copy.find_evidence(limit=100_000))


def test_commits_leave_the_wal_to_the_checkpoint_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with Store.open(path, auto_checkpoint=False) as store:
        store.add_evidence(BIG)
        store.add_evidence(BIG)
        assert evidence_in_file_alone(path, tmp_path / "a.db") == 0  # all still in the WAL
        done = store.checkpoint()
        assert not done.busy and done.wal_pages > 2_000 and done.copied == done.wal_pages
        assert evidence_in_file_alone(path, tmp_path / "b.db") == 260
        store.add_evidence(BIG[:1])  # a checkpointed WAL starts again from its beginning
        assert store.checkpoint().wal_pages < 100


def test_by_default_a_commit_checkpoints_a_full_wal(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with Store.open(path) as store:
        store.add_evidence(BIG)
        store.add_evidence(BIG)
        assert evidence_in_file_alone(path, tmp_path / "a.db") >= 130


def test_the_checkpointer_copies_what_commits_leave(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with Store.open(path, auto_checkpoint=False) as store:
        checkpointer = Checkpointer(path, every=0.05)
        checkpointer.start()
        try:
            for _ in range(3):
                store.add_evidence(BIG)
            # a checkpoint under way now may have begun before the last commit; the one after it
            # cannot have
            under_way = checkpointer.last
            wait_for(lambda: checkpointer.last is not under_way)
            begun_before = checkpointer.last
            done = wait_for(lambda: (c := checkpointer.last) is not begun_before and c)
            assert not done.busy and done.copied == done.wal_pages
            assert evidence_in_file_alone(path, tmp_path / "a.db") == 390
        finally:
            checkpointer.stop()
        assert not checkpointer.thread.alive


def test_a_failing_checkpoint_is_logged_once_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "gone" / "state.db"  # no such directory: every try fails
    checkpointer = Checkpointer(missing, every=0.02)
    with caplog.at_level(logging.INFO, logger="srecovery.store"):
        checkpointer.start()
        time.sleep(0.2)
        missing.parent.mkdir()
        Store.open(missing).close()
        wait_for(lambda: checkpointer.last is not None)
        checkpointer.stop()
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 1 and "does not exist" in failed[0].getMessage()
    assert any("work again" in r.getMessage() for r in caplog.records)


def test_a_periodic_step_that_raises_is_logged_and_called_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []
    finished: list[bool] = []

    def step() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")

    thread = Periodic(
        "test-periodic", 0.01, step, failed="the step failed", finish=lambda: finished.append(True)
    )
    with caplog.at_level(logging.ERROR, logger="srecovery.controller"):
        thread.start()
        wait_for(lambda: len(calls) >= 3)
        thread.stop()
    assert not thread.alive and finished == [True]
    (record,) = [r for r in caplog.records if r.getMessage() == "the step failed"]
    assert record.exc_info and "a bug" in str(record.exc_info[1])
