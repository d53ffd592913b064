"""The progress-file follower and the job directories, on real files: what
slurm_recovery.progress writes, followed per job, sent per rank, then removed safely."""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path

import pytest

from slurm_recovery.contract import jobdir
from slurm_recovery.contract.wire import parse_event
from slurm_recovery.controller.loop import core_evidence
from slurm_recovery.decide.hang import progress_samples
from slurm_recovery.progress import Reporter
from slurm_recovery.sidecar.base import Finding
from slurm_recovery.sidecar.sources.progress_out import PROGRESS_EVERY
from slurm_recovery.sidecar.sources.progressfile import ProgressFileSource, loss_value
from slurm_recovery.store.records import Evidence, EvidenceRecord

NODE = "n1"
UID = os.getuid()
GID = os.getgid()


def template(tmp_path: Path) -> str:
    return f"{tmp_path}/jobs/{{node}}"


def start(source: ProgressFileSource, job_id: int, at: float, **payload) -> None:
    source.see(
        [Finding("job_start", at, job_id=job_id, payload={"nodes": ["n1", "n2"], **payload})]
    )


def end(source: ProgressFileSource, job_id: int, at: float) -> None:
    source.see([Finding("job_end", at, job_id=job_id, payload={"exit_code": 0})])


def job(tmp_path: Path, job_id: int = 7) -> Path:
    """The job's directory as the prolog makes it."""
    return Path(jobdir.create(template(tmp_path), NODE, job_id, UID, GID))


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def reporter(directory: Path, rank: int, clock: Clock) -> Reporter:
    return Reporter(
        str(directory / jobdir.PROGRESS_FILE), rank=rank, host=NODE, interval=0, clock=clock
    )


def steps(findings: list[Finding]) -> dict[int | None, int]:
    return {f.payload.get("rank"): f.payload["step"] for f in findings if f.kind == "progress"}


def test_the_path_is_in_one_place():
    assert jobdir.job_dir_for("/run/sr/jobs/{node}", "gpu7", 41) == "/run/sr/jobs/gpu7/41"
    assert jobdir.job_dir_for("/run/sr/jobs/", "gpu7", 41) == "/run/sr/jobs/41"
    assert jobdir.progress_file("/d/41") == "/d/41/progress.jsonl"
    assert jobdir.nccl_trace_prefix("/d/41") == "/d/41/nccl_trace_rank_"
    for node, job_id in (("../etc", 41), ("n1", 0), ("n1", True), ("n1", "41"), ("", 41)):
        with pytest.raises(ValueError):
            jobdir.job_dir_for("/run/sr/{node}", node, job_id)
    with pytest.raises(ValueError):
        jobdir.job_dir_for("relative/{node}", "n1", 41)


@pytest.mark.parametrize(
    ("template", "value", "ours"),
    [
        ("/run/sr/jobs/{node}", "/run/sr/jobs/n1/41/nccl_trace_rank_", True),
        ("/run/sr/jobs/{node}/", "/run/sr/jobs/gpu-007.a/41/progress.jsonl", True),
        ("/run/sr/jobs/{node}", "/run/sr/jobs/n1/411/nccl_trace_rank_", False),
        ("/run/sr/jobs/{node}", "/run/sr/jobs/n1/4/nccl_trace_rank_", False),
        ("/run/sr/jobs/{node}", "/run/sr/jobs/n1/41/sub/x", False),
        ("/run/sr/jobs/{node}", "/scratch/alice/nccl_trace_rank_", False),
        ("/run/sr/jobs/{node}", "/run/sr/jobs/../41/x", False),
        ("/run/s.r/{node}", "/run/sxr/n1/41/x", False),
        ("/run/sr", "/run/sr/41/nccl_trace_rank_", True),
        ("/run/sr/{node}", "/run/sr/n141/nccl_trace_rank_", False),
        ("/", "/41/nccl_trace_rank_", True),
    ],
)
def test_a_path_in_the_jobs_directory_on_any_node_is_recognised(template, value, ours):
    assert jobdir.is_job_path(template, 41, value) is ours


def test_follows_what_the_reporter_writes_per_rank_with_every_field(tmp_path):
    where = job(tmp_path)
    source = ProgressFileSource(NODE, template(tmp_path))
    t0 = time.time()
    start(source, 7, t0)
    assert source.poll(t0) == []  # no file yet: nothing, and no complaint
    assert source.status() == "ok, following 1 job(s)"
    clock = Clock(t0 + 1)
    r0, r1 = reporter(where, 0, clock), reporter(where, 1, clock)
    r0.report(1, tokens=4096, loss=2.5, step_time=0.4)
    r1.report(1, samples=8, loss=float("nan"), step_time=0.5)
    r0.report(2, tokens=4096, loss=2.25, step_time=0.3)
    found = source.poll(t0 + 1)
    assert steps(found) == {0: 2, 1: 1}
    by_rank = {f.payload["rank"]: f for f in found}
    assert by_rank[0].payload == {
        "step": 2,
        "ts": round(t0 + 1, 3),
        "origin": "file",
        "rank": 0,
        "tokens": 8192.0,
        "step_time": 0.3,
        "loss": 2.25,
    }
    assert by_rank[1].payload == {
        "step": 1,
        "ts": round(t0 + 1, 3),
        "origin": "file",
        "rank": 1,
        "samples": 8.0,
        "step_time": 0.5,
        "loss": "nan",
    }
    for finding in found:
        assert (finding.kind, finding.job_id, finding.observed_at) == ("progress", 7, t0 + 1)
        event = finding.to_event(NODE)
        evidence = parse_event(event, "progress")  # the controller takes it
        assert evidence.node == NODE and evidence.payload == finding.payload


def test_loss_values_the_wire_can_carry():
    assert loss_value(1.5) == 1.5
    assert loss_value(float("nan")) == "nan"
    assert loss_value(math.inf) == "inf"
    assert loss_value(-math.inf) == "-inf"


def test_at_most_every_interval_but_a_step_after_a_quiet_spell_goes_at_once(tmp_path):
    where = job(tmp_path)
    source = ProgressFileSource(NODE, template(tmp_path))
    t0 = time.time()
    start(source, 7, t0)
    clock = Clock(t0)
    r0 = reporter(where, 0, clock)
    r0.report(1)
    assert steps(source.poll(t0)) == {0: 1}
    clock.now = t0 + 0.5
    r0.report(2)
    assert source.poll(t0 + 0.5) == []  # within the interval: waits
    assert steps(source.poll(t0 + PROGRESS_EVERY)) == {0: 2}  # then goes out
    assert source.poll(t0 + PROGRESS_EVERY + 5) == []  # a quiet spell: nothing new, nothing sent
    clock.now = t0 + 30
    r0.report(3)
    assert steps(source.poll(t0 + 30)) == {0: 3}  # the first new step after it: at once


def test_a_truncated_or_replaced_file_is_read_from_its_start(tmp_path):
    where = job(tmp_path)
    source = ProgressFileSource(NODE, template(tmp_path))
    t0 = time.time()
    start(source, 7, t0)
    path = where / jobdir.PROGRESS_FILE
    path.write_text(f'{{"ts": {t0 + 1}, "step": 10, "rank": 0}}\n')
    assert steps(source.poll(t0 + 1)) == {0: 10}
    path.write_text(f'{{"ts": {t0 + 2}, "step": 3, "rank": 0}}\n')  # shorter: truncated
    assert steps(source.poll(t0 + 1 + PROGRESS_EVERY)) == {0: 3}
    replaced = where / "new.jsonl"
    replaced.write_text(f'{{"ts": {t0 + 3}, "step": 4, "rank": 0}}\n' + "x" * 200 + "\n")
    os.replace(replaced, path)  # a new file, longer than the old offset
    assert steps(source.poll(t0 + 1 + 2 * PROGRESS_EVERY)) == {0: 4}


def test_missing_job_directory_and_file_are_quiet(tmp_path, caplog):
    source = ProgressFileSource(NODE, template(tmp_path))
    t0 = time.time()
    start(source, 8, t0)  # the prolog could not make it: nothing to read
    assert source.poll(t0) == [] and source.poll(t0 + 10) == []
    end(source, 8, t0 + 11)
    assert source.poll(t0 + 11) == []
    assert source.jobs == {} and source.ending == []
    assert not caplog.records


def test_job_end_reads_the_rest_then_removes_the_directory(tmp_path):
    where = job(tmp_path)
    (where / "nccl_trace_rank_0").write_bytes(b"\0" * 100)
    source = ProgressFileSource(NODE, template(tmp_path))
    t0 = time.time()
    start(source, 7, t0)
    clock = Clock(t0 + 1)
    r0 = reporter(where, 0, clock)
    r0.report(1)
    assert steps(source.poll(t0 + 1)) == {0: 1}
    clock.now = t0 + 1.1
    r0.report(2)  # written just before the job ended, within the interval
    end(source, 7, time.time())
    assert steps(source.poll(t0 + 1.2)) == {0: 2}  # the last read is not throttled
    assert not where.exists()
    assert os.listdir(where.parent) == []
    assert source.jobs == {} and source.ending == []


def test_removal_never_follows_a_symlink_out_of_the_directory(tmp_path):
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "data").write_text("keep me")
    where = job(tmp_path)
    (where / "escape").symlink_to(outside)
    (where / "sub").mkdir()
    (where / "sub" / "escape").symlink_to(outside / "data")
    (where / jobdir.PROGRESS_FILE).symlink_to(outside / "data")
    source = ProgressFileSource(NODE, template(tmp_path))
    t0 = time.time()
    start(source, 7, t0)
    assert source.poll(t0) == []  # a symlink is not followed, not read
    end(source, 7, time.time())
    assert source.poll(t0 + 1) == []
    assert not where.exists()
    assert (outside / "data").read_text() == "keep me"


def test_a_fifo_planted_as_the_progress_file_does_not_hang_the_sidecar(tmp_path):
    where = job(tmp_path)
    os.mkfifo(where / jobdir.PROGRESS_FILE)
    source = ProgressFileSource(NODE, template(tmp_path))
    t0 = time.time()
    start(source, 7, t0)
    done = []
    thread = threading.Thread(target=lambda: done.append(source.poll(t0)), daemon=True)
    thread.start()
    thread.join(5)
    assert done == [[]]


def test_every_node_follows_its_own_file_not_only_the_batch_node(tmp_path):
    """n2 is not the first node of the job (the job log is read on n1 only); its ranks
    write their own file there."""
    where = Path(jobdir.create(template(tmp_path), "n2", 7, UID, GID))
    source = ProgressFileSource("n2", template(tmp_path))
    t0 = time.time()
    start(source, 7, t0)
    reporter(where, 5, Clock(t0 + 1)).report(40)
    assert steps(source.poll(t0 + 1)) == {5: 40}


def test_a_refused_start_is_not_followed(tmp_path):
    source = ProgressFileSource(NODE, template(tmp_path))
    start(source, 7, time.time(), health_gate={"refused": True, "reason": "ecc", "fatal": []})
    source.poll(time.time())
    assert source.jobs == {}


def test_requeued_onto_the_same_node_keeps_the_directory_and_ignores_the_old_attempt(tmp_path):
    where = job(tmp_path)
    source = ProgressFileSource(NODE, template(tmp_path))
    t0 = time.time() - 100  # the first attempt ran for 100 s
    start(source, 7, t0)
    reporter(where, 0, Clock(t0 + 1)).report(50)
    assert steps(source.poll(t0 + 1)) == {0: 50}
    ended = time.time()
    time.sleep(0.02)
    jobdir.create(template(tmp_path), NODE, 7, UID, GID)  # the next attempt's prolog
    restarted = time.time()
    end(source, 7, ended)
    start(source, 7, restarted, restart_count=1)
    assert source.poll(restarted) == []  # step 50 was sent; the new attempt reported nothing
    assert where.is_dir()
    reporter(where, 0, Clock(restarted + 1)).report(51)
    assert steps(source.poll(restarted + 1)) == {0: 51}


def test_a_directory_claimed_again_after_the_job_ended_is_kept(tmp_path):
    """The next attempt's prolog ran before the sidecar took the job_end, and its job_start
    is not seen yet: the directory's change time tells."""
    where = job(tmp_path)
    source = ProgressFileSource(NODE, template(tmp_path))
    t0 = time.time()
    start(source, 7, t0)
    source.poll(t0)
    ended = time.time()
    time.sleep(0.02)
    jobdir.create(template(tmp_path), NODE, 7, UID, GID)
    end(source, 7, ended)
    source.poll(time.time())
    assert where.is_dir()


def test_a_restarted_sidecar_cleans_leftovers_and_follows_the_jobs_still_there(tmp_path):
    old, running = job(tmp_path, 5), job(tmp_path, 6)
    (old / jobdir.PROGRESS_FILE).write_text('{"ts": 1, "step": 1}\n')
    root = Path(jobdir.node_root(template(tmp_path), NODE))
    (root / f"{jobdir.REMOVING_PREFIX}4-1-2").mkdir()  # a removal cut short
    (root / "notes.txt").write_text("an admin's file")
    later = time.time() + jobdir.STALE_AFTER + 3600
    fresh = later - 60  # job 6 wrote progress a minute before "later"
    (running / jobdir.PROGRESS_FILE).write_text(f'{{"ts": {fresh}, "step": 9, "rank": 0}}\n')
    os.utime(running / jobdir.PROGRESS_FILE, (fresh, fresh))
    source = ProgressFileSource(NODE, template(tmp_path))
    assert steps(source.poll(later)) == {0: 9}
    assert sorted(os.listdir(root)) == ["6", "notes.txt"]
    assert set(source.jobs) == {6}


def test_an_unsafe_root_is_reported_not_cleaned(tmp_path):
    root = Path(jobdir.node_root(template(tmp_path), NODE))
    root.mkdir(parents=True)
    (root / "9").mkdir()
    root.chmod(0o777)
    source = ProgressFileSource(NODE, template(tmp_path))
    assert source.poll(time.time() + 2 * jobdir.STALE_AFTER) == []
    assert "writable by group or others" in source.status()
    assert (root / "9").is_dir()
    with pytest.raises(jobdir.JobDirError):
        jobdir.remove(str(root), 9)


class Accepting:
    """The controller's side of delivery: takes everything."""

    def __init__(self) -> None:
        self.accepted: list[dict] = []

    def post_evidence(self, events, *, role, node=None):
        self.accepted.extend(events)
        return {"accepted": len(events)}


def test_the_sidecar_wires_it_from_the_prolog_to_the_outbox(tmp_path):
    """The real prolog makes the directory and spools job_start; the registry's source,
    fed by the sidecar's queue, follows the file the task writes; job_end removes it."""
    from slurm_recovery import hooks
    from slurm_recovery.config import SidecarConfig
    from slurm_recovery.sidecar import registry
    from slurm_recovery.sidecar.daemon import Sidecar
    from slurm_recovery.sidecar.outbox import Outbox, Sender

    config = hooks.HookConfig(
        {"sidecar.spool_dir": f"{tmp_path}/spool/{{node}}", "hooks.job_dir": template(tmp_path)}
    )
    env = {
        "SLURMD_NODENAME": NODE,
        "SLURM_JOB_ID": "31",
        "SLURM_JOB_UID": str(UID),
        "SLURM_JOB_GID": str(GID),
        "SLURM_NODELIST": "n[1-2]",
    }
    side = SidecarConfig(gpu_backend="none", kmsg=False, ib_sysfs="")
    spool = tmp_path / "spool" / NODE
    wired = registry.build(side, NODE, spool, template(tmp_path))
    assert [s.name for s in wired.fast] == ["hook_spool", "joblog", "progressfile"]
    box = Outbox(spool / "outbox", 1000)
    controller = Accepting()
    sender = Sender(box, controller, NODE)
    sidecar = Sidecar(NODE, wired, box, sender, spool, fast_interval=0.05, poll_interval=1)
    try:
        assert hooks.run_hook("prolog", env, config=config) == 0
        sidecar.tick_fast(time.time())  # job_start taken from the spool, seen by the source
        where = Path(config.job_dir(NODE, 31))
        reporter(where, 3, Clock(time.time())).report(12, loss=1.0)
        sidecar.tick_fast(time.time() + PROGRESS_EVERY)
        assert hooks.run_hook("epilog", env, config=config) == 0
        sidecar.tick_fast(time.time() + 2 * PROGRESS_EVERY)
        sidecar.tick_fast(time.time() + 3 * PROGRESS_EVERY)
        assert sender.flush(5)
        queued = controller.accepted
        assert [e["kind"] for e in queued] == ["job_start", "progress", "job_end"]
        progress = queued[1]
        assert progress["node"] == NODE and progress["job_id"] == 31
        assert progress["payload"]["origin"] == "file" and progress["payload"]["rank"] == 3
        assert not where.exists()
    finally:
        wired.close()
        box.close()


def test_progress_names_the_attempt_from_the_job_start(tmp_path):
    where = job(tmp_path)
    source = ProgressFileSource(NODE, template(tmp_path))
    t0 = time.time()
    start(source, 7, t0, restart_count=2)
    reporter(where, 0, Clock(t0 + 1)).report(5)
    (found,) = source.poll(t0 + 1)
    assert found.payload["restart_count"] == 2 and found.payload["step"] == 5


FR_FIXTURES = Path(__file__).parent / "data" / "flight_recorder" / "hang"


def test_flight_recorder_dumps_go_out_once_per_version_and_before_removal(tmp_path):
    where = job(tmp_path)
    source = ProgressFileSource(NODE, template(tmp_path))
    t0 = time.time()
    start(source, 7, t0, restart_count=0)
    assert source.poll(t0) == []
    (where / f"{jobdir.NCCL_TRACE_PREFIX}3").write_bytes(
        (FR_FIXTURES / "nccl_trace_rank_3").read_bytes()
    )
    (found,) = [f for f in source.poll(t0 + 2) if f.kind == "flight_recorder"]
    assert found.job_id == 7 and found.payload["rank"] == 3 and found.payload["restart_count"] == 0
    evidence = parse_event(found.to_event(NODE), "fr")  # the wire takes it
    assert evidence.payload["groups"]
    assert [f for f in source.poll(t0 + 4) if f.kind == "flight_recorder"] == []  # unchanged
    (where / f"{jobdir.NCCL_TRACE_PREFIX}0").write_bytes(
        (FR_FIXTURES / "nccl_trace_rank_0").read_bytes()
    )
    end(source, 7, t0 + 4.1)  # ended before the next look: the last read still takes it
    last = [f for f in source.poll(t0 + 4.2) if f.kind == "flight_recorder"]
    assert [f.payload["rank"] for f in last] == [0]
    assert not where.exists()


def test_a_ranks_end_record_goes_out_once_as_done_and_reaches_the_hang_detector(tmp_path):
    where = job(tmp_path)
    source = ProgressFileSource(NODE, template(tmp_path))
    t0 = time.time()
    start(source, 7, t0, restart_count=0)
    clock = Clock(t0 + 1)
    r0 = reporter(where, 0, clock)
    r0.report(5)
    assert [f.payload.get("done") for f in source.poll(t0 + 1)] == [None]
    clock.now = t0 + 9
    r0.close()  # what atexit does when the training script returns
    sent = source.poll(t0 + 9)
    assert [(f.payload["step"], f.payload.get("done")) for f in sent] == [(5, True)]
    assert source.poll(t0 + 20) == []  # sent once
    evidence = [  # as the controller reads it back from the store
        core_evidence(
            EvidenceRecord(
                i, t0, Evidence.from_wire(parse_event(f.to_event(NODE), "progress"), "sidecar")
            )
        )
        for i, f in enumerate(sent, 1)
    ]
    samples = progress_samples(evidence, 7, [NODE], 0)
    assert [(s.step, s.done) for s in samples] == [(5, True)]
