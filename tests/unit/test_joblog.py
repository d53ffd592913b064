"""The job-log follower, on real files: progress and signatures from a growing stdout and stderr."""

from __future__ import annotations

import logging
import os
import threading
import time

from slurm_recovery.sidecar.base import Finding
from slurm_recovery.sidecar.sources import joblog
from slurm_recovery.sidecar.sources.joblog import MAX_SIGNATURES, JobLogSource
from slurm_recovery.sidecar.sources.progress_out import PROGRESS_EVERY


def start(source: JobLogSource, path, nodes=("n1", "n2"), job_id=7) -> None:
    """The job_start of a job whose output file did not exist when its prolog ran: everything
    written to it is the job's (``stdout_offset`` 0)."""
    payload = {"nodes": list(nodes), "stdout": str(path), "stdout_offset": 0}
    source.see([Finding("job_start", 1.0, job_id=job_id, payload=payload)])


def line(i: int) -> str:
    return f" iteration {i:>8}/    1000 | consumed samples: {8 * i:>10} | lm loss: 2.5E+00 |\n"


def test_follows_progress_throttled_and_reads_the_rest_at_job_end(tmp_path):
    out = tmp_path / "train-7.out"
    source = JobLogSource("n1")
    start(source, out)
    assert source.poll(100.0) == []  # not created yet: fine
    out.write_text(line(1) + line(2) + " iteration        3/")  # a partial last line
    (first,) = source.poll(100.0)
    assert (first.kind, first.job_id, first.payload["step"]) == ("progress", 7, 2)
    with out.open("a") as f:
        f.write("    1000 | lm loss: 2.4E+00 |\n" + line(4))
    assert source.poll(100.0 + PROGRESS_EVERY / 2) == []  # throttled
    (second,) = source.poll(100.0 + PROGRESS_EVERY)
    assert second.payload["step"] == 4
    with out.open("a") as f:
        f.write(line(5) + "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    source.see([Finding("job_end", 103.0, job_id=7, payload={})])
    found = source.poll(103.0)
    kinds = sorted(f.kind for f in found)
    assert kinds == ["log_signature", "progress"]
    sig = next(f for f in found if f.kind == "log_signature")
    # a GPU kernel's fault: a symptom whose class is unknown since i28k (a bad GPU prints it)
    assert sig.job_id == 7 and sig.payload["fault_class"] == "unknown"
    assert sig.payload["knock_on"] is True
    assert source.jobs == {}  # forgotten after the job ended


def test_only_the_batch_node_follows_and_truncation_restarts(tmp_path):
    out = tmp_path / "o.out"
    out.write_text(line(1) + line(2))
    other = JobLogSource("n2")
    start(other, out)
    assert other.jobs == {}
    source = JobLogSource("n1")
    start(source, out)
    assert [f.payload["step"] for f in source.poll(10.0)] == [2]
    out.write_text(line(1))  # a requeued attempt truncated the file
    assert [f.payload["step"] for f in source.poll(10.0 + PROGRESS_EVERY)] == [1]


def test_signature_floods_are_capped(tmp_path):
    out = tmp_path / "o.out"
    out.write_text("NCCL WARN NET/IB : Got completion from peer 10.0.0.2 with status=12\n" * 500)
    source = JobLogSource("n1")
    start(source, out)
    assert len([f for f in source.poll(1.0) if f.kind == "log_signature"]) == MAX_SIGNATURES
    assert source.poll(2.0 + PROGRESS_EVERY) == []


# ------------------------------------------------------------------ stderr, job end, budget

ERROR = "RuntimeError: CUDA error: an illegal memory access was encountered\n"
ECC = "[rank5]: RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
BENIGN = "NCCL WARN NET/IB : Got completion from peer 10.0.0.2 with status=12\n"


def start_both(source: JobLogSource, stdout, stderr, job_id: int = 7) -> None:
    payload = {
        "nodes": ["n1"],
        "stdout": str(stdout),
        "stderr": str(stderr),
        "stdout_offset": 0,
        "stderr_offset": 0,
    }
    source.see([Finding("job_start", 1.0, job_id=job_id, payload=payload)])


def end(source: JobLogSource, job_id: int = 7) -> None:
    source.see([Finding("job_end", 9.0, job_id=job_id, payload={})])


def signatures(findings: list[Finding]) -> list[dict]:
    return [dict(f.payload) for f in findings if f.kind == "log_signature"]


def test_stderr_is_followed_with_its_own_offset_and_line_numbers(tmp_path):
    out, err = tmp_path / "o.out", tmp_path / "o.err"
    source = JobLogSource("n1")
    start_both(source, out, err)
    out.write_text(line(1) + line(2))
    err.write_text("warming up\n")
    assert [f.kind for f in source.poll(10.0)] == ["progress"]
    with err.open("a") as f:
        f.write("still fine\n" + ERROR)
    with out.open("a") as f:
        f.write(line(3) + BENIGN)
    found = signatures(source.poll(10.0 + PROGRESS_EVERY))
    by_stream = {p["stream"]: p for p in found}
    assert by_stream["stderr"]["signature"] == "cuda.illegal_memory_access"
    assert by_stream["stderr"]["line_no"] == 3  # the file's own line, across polls
    assert by_stream["stdout"]["signature"] == "nccl.warn"
    assert by_stream["stdout"]["line_no"] == 4


def test_one_file_for_both_streams_is_read_once(tmp_path):
    out = tmp_path / "o.out"
    out.write_text(ERROR)
    source = JobLogSource("n1")
    start_both(source, out, out)
    assert [p["stream"] for p in signatures(source.poll(1.0))] == ["stdout"]


def test_job_end_reads_the_whole_rest_and_the_unfinished_last_line(tmp_path, monkeypatch):
    monkeypatch.setattr(joblog, "READ_LIMIT", 1024)
    out, err = tmp_path / "o.out", tmp_path / "o.err"
    source = JobLogSource("n1")
    start_both(source, out, err)
    out.write_text("".join(line(i) for i in range(1, 2001)) + ERROR)
    err.write_text("x" * 5000 + "\n" + ECC.rstrip("\n"))  # no newline at the very end
    first = source.poll(1.0)
    assert signatures(first) == []  # far behind: 1 KB per file per poll
    end(source)
    found = signatures(source.poll(2.0))
    assert sorted((p["stream"], p["signature"], p["line_no"]) for p in found) == [
        ("stderr", "cuda.ecc_uncorrectable", 2),
        ("stdout", "cuda.illegal_memory_access", 2001),
    ]
    assert source.jobs == {}


def test_job_end_skips_the_middle_of_a_huge_rest_but_reads_the_end(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(joblog, "END_READ_LIMIT", 64 * 1024)
    out = tmp_path / "o.out"
    out.write_text(ERROR + "".join(line(i) for i in range(1, 20001)) + ECC)
    source = JobLogSource("n1")
    start(source, out)
    end(source)
    with caplog.at_level(logging.WARNING, logger="srecovery.sidecar.joblog"):
        found = source.poll(1.0)
    (only,) = signatures(found)
    assert only["signature"] == "cuda.ecc_uncorrectable"
    assert only["line_no"] is None  # lines before it were skipped: its number is unknown
    assert "read the last 65536, skipped the rest" in caplog.text
    assert [f.payload["step"] for f in found if f.kind == "progress"] == [20000]


def test_the_first_and_the_last_signatures_are_kept(tmp_path, caplog):
    out = tmp_path / "o.out"
    out.write_text(BENIGN * 120)
    source = JobLogSource("n1")
    start(source, out)
    assert len(signatures(source.poll(1.0))) == MAX_SIGNATURES
    with out.open("a") as f:
        f.write(ECC + BENIGN * 30 + ERROR)
    live = signatures(source.poll(2.0))
    # a decisive line is reported at once, past the budget; the benign flood is not
    assert [p["signature"] for p in live] == ["cuda.ecc_uncorrectable"]
    end(source)
    with caplog.at_level(logging.INFO, logger="srecovery.sidecar.joblog"):
        tail = signatures(source.poll(3.0))
    assert len(tail) == MAX_SIGNATURES
    assert tail[-1]["signature"] == "cuda.illegal_memory_access"  # the end is never lost
    assert tail[-1]["line_no"] == 120 + 1 + 30 + 1
    assert [p["line_no"] for p in tail] == sorted(p["line_no"] for p in tail)
    assert "signature line(s) not reported" in caplog.text


def test_a_line_that_never_ends_is_read_up_to_its_last_carriage_return(tmp_path, monkeypatch):
    monkeypatch.setattr(joblog, "MAX_PARTIAL", 4096)
    err = tmp_path / "o.err"
    bar = "".join(f"Epoch 0:  {i % 100}%|##   | {i}/9000 [00:01<00:09]\r" for i in range(200))
    err.write_text(bar + ERROR.rstrip("\n") + "\r" + bar)  # tqdm on stderr: no newline yet
    source = JobLogSource("n1")
    start_both(source, tmp_path / "o.out", err)
    (found,) = signatures(source.poll(1.0))
    assert (found["signature"], found["stream"], found["line_no"]) == (
        "cuda.illegal_memory_access",
        "stderr",
        1,
    )
    (stream,) = [s for s in source.jobs[7].streams if s.name == "stderr"]
    assert len(stream.partial) <= 4096 + joblog.READ_LIMIT
    with err.open("a") as f:
        f.write("\n" + ERROR)
    assert [p["line_no"] for p in signatures(source.poll(2.0))] == [2]


# ------------------------------------------------------------------ where an attempt begins

OLD_BUG = "[rank1]: KeyError: 'sample_20'\n"  # attempt 0's traceback, already in the file


def start_attempt(source: JobLogSource, payload: dict, job_id: int = 7) -> None:
    """A job_start, taken in as the fast loop's next poll takes it (before it reads files)."""
    source.see([Finding("job_start", 1.0, job_id=job_id, payload={"nodes": ["n1"], **payload})])
    source._take_events()


def test_a_requeued_attempt_appending_to_its_output_starts_where_the_prolog_saw_it_end(tmp_path):
    """--open-mode=append: the previous attempt's application error is in the file; the prolog
    recorded the file's size, and the new attempt reads only what it writes itself."""
    out = tmp_path / "o.out"
    out.write_text(line(1) + OLD_BUG)
    offset = out.stat().st_size
    source = JobLogSource("n1")
    start_attempt(source, {"stdout": str(out), "stdout_offset": offset, "restart_count": 1})
    assert source.poll(1.0) == []  # nothing of attempt 0 becomes evidence of attempt 1
    with out.open("a") as f:
        f.write(line(6) + ERROR)
    found = source.poll(1.0 + PROGRESS_EVERY)
    assert [f.payload["step"] for f in found if f.kind == "progress"] == [6]
    (sig,) = signatures(found)
    assert sig["signature"] == "cuda.illegal_memory_access"
    assert sig["line_no"] == 2  # counted from where the attempt's output begins
    assert sig["restart_count"] == 1
    end(source)
    assert signatures(source.poll(2.0 + PROGRESS_EVERY)) == []


def test_without_a_recorded_offset_the_follower_starts_at_the_size_it_first_sees(tmp_path):
    out, err = tmp_path / "o.out", tmp_path / "o.err"
    out.write_text(OLD_BUG)
    source = JobLogSource("n1")
    start_attempt(source, {"stdout": str(out), "stderr": str(err)})  # an older prolog
    (stream_out, stream_err) = source.jobs[7].streams
    assert (stream_out.offset, stream_err.offset) == (len(OLD_BUG), 0)  # err not there yet
    err.write_text(ERROR)
    assert [(p["stream"], p["line_no"]) for p in signatures(source.poll(1.0))] == [("stderr", 1)]


def test_a_file_smaller_than_its_offset_was_truncated_and_is_read_from_the_start(tmp_path):
    out = tmp_path / "o.out"
    out.write_text(ERROR)  # the new attempt truncated a file of 5000 bytes and wrote this
    source = JobLogSource("n1")
    start_attempt(source, {"stdout": str(out), "stdout_offset": 5000})
    (sig,) = signatures(source.poll(1.0))
    assert (sig["signature"], sig["line_no"]) == ("cuda.illegal_memory_access", 1)


def test_an_attempt_that_rewrote_the_same_lines_into_a_truncated_file_is_read(tmp_path):
    """Slurm's default open mode truncates the file for a requeued attempt; one that fails the
    same way writes the same bytes, so the file is as long as the prolog saw it. Its changed
    modification time gives it away; a file opened to append, and not written, keeps it."""
    out = tmp_path / "o.out"
    out.write_text(ERROR)
    before = os.stat(out)
    appended = JobLogSource("n1")  # --open-mode=append: the attempt has written nothing yet
    start_attempt(
        appended,
        {"stdout": str(out), "stdout_offset": before.st_size, "stdout_mtime": before.st_mtime},
    )
    assert signatures(appended.poll(1.0)) == []
    out.write_text(ERROR)  # truncated and written again
    later = before.st_mtime + 5
    os.utime(out, (later, later))
    source = JobLogSource("n1")
    start_attempt(
        source,
        {"stdout": str(out), "stdout_offset": before.st_size, "stdout_mtime": before.st_mtime},
    )
    (sig,) = signatures(source.poll(1.0))
    assert (sig["signature"], sig["line_no"]) == ("cuda.illegal_memory_access", 1)
    # the follower of the untouched file did not take it as rewritten later either
    os.utime(out, (before.st_mtime, before.st_mtime))
    assert signatures(appended.poll(2.0)) == []


def test_end_and_next_start_in_one_batch_split_the_file_between_the_attempts(tmp_path):
    """The epilog of attempt 0 and the prolog of attempt 1 reach the sidecar together (it was
    busy, or restarted): attempt 0 is finished up to where attempt 1's output begins, and
    attempt 1 is followed from there."""
    out = tmp_path / "o.out"
    source = JobLogSource("n1")
    start_attempt(source, {"stdout": str(out), "stdout_offset": 0, "restart_count": 0})
    out.write_text(line(1))
    source.poll(1.0)
    with out.open("a") as f:
        f.write(OLD_BUG)  # attempt 0 fails after the last poll
    boundary = out.stat().st_size
    with out.open("a") as f:
        f.write(line(1) + ECC)  # attempt 1 already wrote before the sidecar looked
    source.see(
        [
            Finding("job_end", 5.0, job_id=7, payload={"restart_count": 1}),
            Finding(
                "job_start",
                5.1,
                job_id=7,
                payload={
                    "nodes": ["n1"],
                    "stdout": str(out),
                    "stdout_offset": boundary,
                    "restart_count": 1,
                },
            ),
        ]
    )
    finished = signatures(source.poll(6.0))
    assert [(p["signature"], p["restart_count"]) for p in finished] == [("python.exception", 0)]
    assert source.jobs[7].restart_count == 1  # the next attempt took over
    following = signatures(source.poll(7.0))
    assert [(p["signature"], p["line_no"], p["restart_count"]) for p in following] == [
        ("cuda.ecc_uncorrectable", 2, 1)
    ]


def test_a_new_attempt_without_the_previous_ones_end_finishes_it_first(tmp_path):
    out = tmp_path / "o.out"
    out.write_text(line(1) * 10 + OLD_BUG)
    source = JobLogSource("n1")
    start_attempt(source, {"stdout": str(out), "stdout_offset": 0, "restart_count": 0})
    start_attempt(source, {"stdout": str(out), "stdout_offset": 0, "restart_count": 0})  # again
    assert 7 not in source.next_attempt  # the same attempt's job_start twice: nothing changes
    size = out.stat().st_size
    start_attempt(source, {"stdout": str(out), "stdout_offset": size, "restart_count": 1})
    pending = source.next_attempt[7]
    start_attempt(source, {"stdout": str(out), "stdout_offset": size, "restart_count": 1})
    assert source.next_attempt[7] is pending  # its job_start twice: nothing changes either
    assert [p["restart_count"] for p in signatures(source.poll(1.0))] == [0]
    assert source.jobs[7].restart_count == 1 and source.jobs[7].streams[0].offset == size
    # attempt 1 truncates the file: nothing of it is attempt 0's, and attempt 1 reads it all
    out.write_text(ERROR)
    assert [p["restart_count"] for p in signatures(source.poll(2.0))] == [1]


def test_a_job_end_in_the_same_batch_as_the_next_start_ends_the_next_attempt_too(tmp_path):
    out = tmp_path / "o.out"
    out.write_text("")
    source = JobLogSource("n1")
    start_attempt(source, {"stdout": str(out), "stdout_offset": 0, "restart_count": 0})
    start_attempt(source, {"stdout": str(out), "stdout_offset": 0, "restart_count": 1})
    end(source)  # attempt 1 ended before the sidecar read anything
    out.write_text(ERROR)
    assert [p["restart_count"] for p in signatures(source.poll(1.0))] == []  # 0: nothing
    assert [p["restart_count"] for p in signatures(source.poll(2.0))] == [1]
    assert source.jobs == {} and source.next_attempt == {}


def test_a_fifo_or_a_device_as_output_is_never_read(tmp_path):
    fifo = tmp_path / "o.out"
    os.mkfifo(fifo)
    source = JobLogSource("n1")
    start_attempt(source, {"stdout": str(fifo), "stderr": "/dev/null"})
    assert source.poll(1.0) == []  # returns at once: a FIFO without a writer does not block
    end(source)
    assert source.poll(2.0) == [] and source.jobs == {}


class SlurmAnswers:
    """Stands in for ``scontrol show job -o``: the paths slurmctld shows, per job."""

    def __init__(self, paths: dict[int, dict[str, str]] | Exception) -> None:
        self.paths = paths
        self.asked: list[int] = []

    def __call__(self, job_id: int) -> dict[str, str]:
        self.asked.append(job_id)
        if isinstance(self.paths, Exception):
            raise self.paths
        return self.paths[job_id]


def started(source: JobLogSource, job_id: int, restart_count: int = 0, **paths: str) -> None:
    payload = {"nodes": ["n1", "n2"], "restart_count": restart_count, **paths}
    source.see([Finding("job_start", 1.0, job_id=job_id, payload=payload)])


def wait_answered(source: JobLogSource, job_id: int, now: float = 100.0) -> list[Finding]:
    found = []
    for _ in range(200):
        found += source.poll(now)
        if source.jobs[job_id].asked is None:
            return found
        time.sleep(0.01)
    raise AssertionError("no answer taken")


def test_the_default_output_is_asked_of_slurm_and_followed_from_its_start(tmp_path):
    out = tmp_path / "slurm-7.out"  # the default: the hooks get no path for it
    out.write_text(line(1) + line(2))  # written before the answer came: still the job's
    slurm = SlurmAnswers({7: {"stdout": str(out), "stderr": str(out)}})
    source = JobLogSource("n1", resolve=slurm)
    started(source, 7)
    found = wait_answered(source, 7)
    assert slurm.asked == [7]
    assert [s.path for s in source.jobs[7].streams] == [str(out)]  # one file, followed once
    assert [f.payload["step"] for f in found if f.kind == "progress"] == [2]


def test_a_job_name_in_the_path_is_filled_by_slurm(tmp_path):
    hooks_gave = str(tmp_path / "%x-8.out")
    real = tmp_path / "train-8.out"
    slurm = SlurmAnswers({8: {"stdout": str(real)}})
    source = JobLogSource("n1", resolve=slurm)
    started(source, 8, stdout=hooks_gave, stdout_offset=0)
    wait_answered(source, 8)
    assert [s.path for s in source.jobs[8].streams] == [str(real)]
    assert source.jobs[8].streams[0].offset == 0


def test_a_file_that_may_hold_earlier_output_is_followed_from_its_size(tmp_path):
    shared = tmp_path / "train.log"  # no job id in the name: another job's lines may be there
    shared.write_text("RuntimeError: an earlier job's failure\n")
    requeued = tmp_path / "slurm-9.out"  # the job's own file, but a later attempt (append mode)
    requeued.write_text("RuntimeError: the first attempt's failure\n")
    slurm = SlurmAnswers({5: {"stdout": str(shared)}, 9: {"stdout": str(requeued)}})
    source = JobLogSource("n1", resolve=slurm)
    started(source, 5, stdout=str(tmp_path / "%x.log"))
    started(source, 9, restart_count=1)
    wait_answered(source, 5)
    wait_answered(source, 9)
    assert source.jobs[5].streams[0].offset == shared.stat().st_size
    assert source.jobs[9].streams[0].offset == requeued.stat().st_size


def test_slurm_not_answering_leaves_the_job_unfollowed_and_says_so(tmp_path, caplog):
    slurm = SlurmAnswers(OSError("slurm_load_jobs error: Unable to contact slurm controller"))
    source = JobLogSource("n1", resolve=slurm)
    started(source, 7)
    with caplog.at_level(logging.WARNING):
        assert wait_answered(source, 7) == []
    assert source.jobs[7].streams == []
    assert "cannot learn its output files from Slurm" in caplog.text
    source.see([Finding("job_end", 2.0, job_id=7, payload={})])
    assert source.poll(101.0) == [] and source.jobs == {}


def test_a_job_that_ends_before_the_answer_is_read_whole(tmp_path):
    out = tmp_path / "slurm-7.out"
    out.write_text(line(3) + "KeyError: 'sample_7'\n")
    gate = threading.Event()

    def slow(job_id: int) -> dict[str, str]:
        gate.wait(2)
        return {"stdout": str(out)}

    source = JobLogSource("n1", resolve=slow)
    started(source, 7)
    source.see([Finding("job_end", 2.0, job_id=7, payload={})])
    threading.Timer(0.2, gate.set).start()
    found = source.poll(101.0)  # waits for the answer, then reads the rest
    assert {f.kind for f in found} == {"progress", "log_signature"}


def test_without_a_resolver_only_the_paths_the_hooks_gave_are_followed(tmp_path):
    source = JobLogSource("n1")
    started(source, 7)
    started(source, 8, stdout=str(tmp_path / "%x-8.out"))
    assert source.poll(100.0) == [] and source.jobs == {}


def test_paths_the_hooks_named_in_full_are_not_asked_of_slurm(tmp_path):
    out = tmp_path / "train-7.out"  # -o without -e: Slurm names one file for both streams
    slurm = SlurmAnswers({})
    source = JobLogSource("n1", resolve=slurm)
    started(source, 7, stdout=str(out), stderr=str(out), stdout_offset=0, stderr_offset=0)
    source.poll(100.0)
    assert slurm.asked == [] and source.jobs[7].asked is None
    assert [s.path for s in source.jobs[7].streams] == [str(out)]
