"""The job-log follower, on real files: progress and signatures from a growing stdout."""

from __future__ import annotations

from slurm_recovery.sidecar.base import Finding
from slurm_recovery.sidecar.sources.joblog import MAX_SIGNATURES, PROGRESS_EVERY, JobLogSource


def start(source: JobLogSource, path, nodes=("n1", "n2"), job_id=7) -> None:
    source.see(
        [
            Finding(
                "job_start", 1.0, job_id=job_id, payload={"nodes": list(nodes), "stdout": str(path)}
            )
        ]
    )


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
    assert sig.job_id == 7 and sig.payload["fault_class"] == "application"
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
