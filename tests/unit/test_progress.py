"""Progress: the training-side API, the progress file reader, and progress lines in job logs.

The log lines below are excerpts of real trainer output quoted in public bug reports; each
carries its source.
"""

from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery import progress
from slurm_recovery.signals.progress import (
    ProgressFileReader,
    ProgressLineParser,
    ProgressPatternError,
    ProgressSample,
    compile_job_pattern,
    match_line,
    parse_record,
)


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------------- the API


def test_without_the_env_var_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(progress.ENV_FILE, raising=False)
    monkeypatch.chdir(tmp_path)
    progress._reset()
    for step in range(100):
        progress.report(step, loss=1.0)
    progress.flush()
    assert list(tmp_path.iterdir()) == []
    progress._reset()


def test_the_env_var_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "job.progress"
    monkeypatch.setenv(progress.ENV_FILE, str(path))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("SLURMD_NODENAME", "n2.cluster")
    progress._reset()
    try:
        progress.report(1, tokens=100, samples=2, loss=2.5)
        [record] = lines(path)
        assert record["step"] == 1
        assert record["rank"] == 3
        assert record["host"] == "n2"
        assert (record["tokens"], record["samples"], record["loss"]) == (100, 2, 2.5)
        progress.report(2)
    finally:
        progress._reset()  # closes: the buffered step 2 is written, then the end record
    assert [(r["step"], r.get("done")) for r in lines(path)] == [(1, None), (2, None), (2, True)]


def test_writes_at_most_once_per_interval_and_keeps_the_latest(tmp_path):
    path = tmp_path / "p"
    clock = Clock()
    reporter = progress.Reporter(
        str(path), rank=0, host="n1", interval=1.0, clock=clock, background=False
    )
    for step in range(1, 11):  # 10 steps of 0.25 s
        reporter.report(step, tokens=10, step_time=0.25)
        clock.now += 0.25
    records = lines(path)
    assert [r["step"] for r in records] == [1, 5, 9]  # the first step, then one per second
    reporter.flush()
    records = lines(path)
    assert records[-1]["step"] == 10
    assert records[-1]["tokens"] == 100  # running total of what each step reported
    assert records[-1]["step_time"] == pytest.approx(0.25)
    assert records[-1]["ts"] == 1002.25  # when step 10 was reported, not when it was written
    reporter.flush()  # nothing new: nothing written
    assert len(lines(path)) == 4


def test_non_finite_loss_is_written_as_text(tmp_path):
    path = tmp_path / "p"
    reporter = progress.Reporter(str(path), rank=None, host="n1", interval=0.0, clock=Clock())
    reporter.report(1, loss=float("nan"))
    record = json.loads(path.read_text())
    assert record["loss"] == "nan"
    assert record["rank"] is None
    assert math.isnan(parse_record(path.read_text()).loss)


def test_never_raises_into_the_training_loop(tmp_path):
    clock = Clock()
    unwritable = progress.Reporter(
        str(tmp_path / "missing" / "p"), host="n1", interval=0.0, clock=clock
    )
    unwritable.report(1)  # the folder does not exist
    unwritable.report("not a step")  # type: ignore[arg-type]
    unwritable.report(2, loss="x")  # type: ignore[arg-type]
    unwritable.flush()
    unwritable.close()
    (tmp_path / "missing").mkdir()
    clock.now += progress.RETRY_AFTER  # it tries again after a while
    unwritable.report(3)
    assert lines(tmp_path / "missing" / "p")[-1]["step"] == 3


def test_ranks_of_one_node_share_the_file(tmp_path):
    path = tmp_path / "p"
    clock = Clock()
    reporters = [
        progress.Reporter(str(path), rank=r, host="n1", interval=0.0, clock=clock) for r in range(4)
    ]
    for step in range(1, 4):
        for reporter in reporters:
            reporter.report(step)
        clock.now += 1
    samples = ProgressFileReader(path).read()
    assert len(samples) == 12
    assert {s.rank for s in samples} == {0, 1, 2, 3}


# --------------------------------------------------------------------------------- the file


def test_parse_record_reads_what_the_api_writes():
    sample = parse_record(
        '{"ts":12.5,"step":7,"rank":1,"host":"n3","tokens":4096,"samples":8,"loss":1.5,'
        '"step_time":0.25}'
    )
    assert sample == ProgressSample(12.5, 7, 1, "n3", 4096.0, 8.0, 1.5, 0.25)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "not json",
        "[1, 2]",
        '{"step": 1}',
        '{"ts": 1.0}',
        '{"ts": 1.0, "step": "7"}',
        '{"ts": 1.0, "step": true}',
        '{"ts": "now", "step": 1}',
        b"\xff\xfe",
    ],
)
def test_parse_record_refuses_what_is_not_a_record(line):
    assert parse_record(line) is None


def test_reader_returns_complete_new_lines_only(tmp_path):
    path = tmp_path / "p"
    reader = ProgressFileReader(path)
    assert reader.read() == []  # no file yet
    path.write_text('{"ts":1,"step":1}\n{"ts":2,"st')
    assert [s.step for s in reader.read()] == [1]
    with open(path, "a") as fh:
        fh.write('ep":2}\ngarbage\n{"ts":3,"step":3}\n')
    assert [s.step for s in reader.read()] == [2, 3]
    assert reader.read() == []
    path.write_text('{"ts":9,"step":1}\n')  # truncated: a new attempt
    assert [s.step for s in reader.read()] == [1]


# --------------------------------------------------------------------------------- log lines

#: (format, line, step, loss, samples, rank, source)
REAL_LINES = [
    (
        "megatron",
        " iteration      201/  250000 | consumed samples:       205824 | elapsed time per "
        "iteration (ms): 139113.4 | learning rate: 1.507E-05 | global batch size:  1024 | lm "
        "loss: 2.373574E+00 | loss scale: 1.0 | grad norm: 0.811 | number of skipped "
        "iterations:   0 | number of nan iterations:   0 |",
        201,
        2.373574,
        205824,
        None,
        "https://github.com/epfLLM/Megatron-LLM/issues/11",
    ),
    (
        "megatron",
        "[2026-05-28 22:19:49] iteration       15/    6069 | consumed samples:         7680 | "
        "elapsed time per iteration (ms): 27447.6 | learning rate: 3.000000E-05 | global batch "
        "size:   512 | lm loss: 1.059172E+00 | loss scale: 1.0 | grad norm: 2.722 |",
        15,
        1.059172,
        7680,
        None,
        "https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/4024",
    ),
    (
        "nemo",
        "Training epoch 0, iteration 120/149 | lr: 3e-05 | consumed_samples: 121 | "
        "global_batch_size: 1 | global_step: 120 | reduced_train_loss: 1.233 | "
        "train_step_timing in s: 0.03146 | val_loss: 4.106",
        120,
        1.233,
        121,
        None,
        "https://github.com/NVIDIA-BioNeMo/bionemo-recipes/pull/740",
    ),
    (
        "lightning",
        "Epoch 0:  22%|██▏       | 4/18 [00:17<01:02,  4.47s/it, loss=10.072, v_num=193315]",
        4,
        10.072,
        None,
        None,
        "https://github.com/Lightning-AI/pytorch-lightning/issues/4225",
    ),
    (
        "lightning",
        "Epoch 0:  97% 1651/1702 [13:00<00:24,  2.11it/s, loss=0.158, v_num=0, train_loss=0.149]",
        1651,
        0.158,
        None,
        None,
        "https://github.com/Lightning-AI/pytorch-lightning/issues/3866",
    ),
    (
        "lightning",
        "Epoch 0:   1%|          | 795/77225 [9:07:58<878:01:48, 41.36s/it, loss=3.1, v_num=, "
        "reduced_train_loss=3.090, global_step=794.0, consumed_samples=1.63e+6]",
        794,
        3.1,
        1.63e6,
        None,
        "https://github.com/NVIDIA/NeMo-Framework-Launcher/issues/55",
    ),
    (
        "lightning",
        "Epoch 37:  20%|▏| 9/45 [20:01<1:20:06, 133.50s/it, v_num=8, loss/loss=0.111, lr=0.00791]",
        37 * 45 + 9,
        0.111,
        None,
        None,
        "https://github.com/Lightning-AI/pytorch-lightning/issues/12939",
    ),
    (
        "huggingface",
        "192.168.50.170: {'loss': 1.2992, 'learning_rate': 1.282051282051282e-06, 'epoch': 0.0}",
        None,
        1.2992,
        None,
        None,
        "https://github.com/haotian-liu/LLaVA/issues/1264",
    ),
    (
        "huggingface",
        "{'loss': 2.119, 'grad_norm': 37.657958984375, 'learning_rate': 4.5833333333333334e-05, "
        "'epoch': 0.25}",
        None,
        2.119,
        None,
        None,
        "https://github.com/huggingface/transformers/pull/35207",
    ),
    (
        "huggingface",
        '{"loss": 7.152712148666382, "learning_rate": 4.8358287365379566e-05, "epoch": '
        '0.03283425269240872, "step": 500}',
        500,
        7.152712148666382,
        None,
        None,
        "https://github.com/huggingface/blog/issues/56",
    ),
    (
        "torchtitan",
        "[rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - step: 200  loss:  6.1384  "
        "memory: 49.66GiB(52.28%)  tps: 5,856  tflops: 339.16  mfu: 34.29%",
        200,
        6.1384,
        None,
        0,
        "https://github.com/pytorch/torchtitan/pull/1287",
    ),
    (
        "torchtitan",
        "[titan] 2026-02-24 19:46:17,508 - root - INFO - step:  4  loss:  7.62585  grad_norm: "
        "26.6250  memory: 66.91GiB(37.51%)  tps: 10,050  tflops: 314.71  mfu: 13.99%",
        4,
        7.62585,
        None,
        None,
        "https://github.com/pytorch/torchtitan/pull/2389",
    ),
]


@pytest.mark.parametrize(
    ("fmt", "line", "step", "loss", "samples", "rank", "source"),
    REAL_LINES,
    ids=[f"{row[0]}-{n}" for n, row in enumerate(REAL_LINES)],
)
def test_real_progress_lines(fmt, line, step, loss, samples, rank, source):
    found = match_line(line)
    assert found is not None, source
    assert found.pattern == fmt
    assert found.step == step
    assert found.loss == (pytest.approx(loss) if loss is not None else None)
    assert found.samples == samples
    assert found.rank == rank


def test_a_tqdm_line_with_carriage_returns_counts_its_last_update():
    # PyTorch Lightning under mpirun, sagemaker-distributed-training-workshop issue #6
    line = (
        "Epoch 1:   0% 0/2 [00:00<?, ?it/s, loss=2.29, v_num=0, val_acc=0.166]        \r"
        "Epoch 1:  50% 1/2 [00:00<00:00, 35.14it/s, loss=2.29, v_num=0]"
    )
    assert match_line(line).step == 1 * 2 + 1


@pytest.mark.parametrize(
    "line",
    [
        "Loading checkpoint shards: 100%|██████████| 14/14 [01:19<00:00,  5.69s/it]",
        "Validation DataLoader 0: 100% 1/1 [00:00<00:00, 1113.73it/s]",
        "{'eval_loss': 4.1, 'eval_runtime': 3.2, 'epoch': 1.0}",
        "{'train_runtime': 301.2, 'train_loss': 1.9, 'epoch': 3.0}",
        "11:07:08    INFO Starting from step 0 (total_tokens=0, total_samples=0)",
        " > elapsed time per iteration (ms): 139113.4",
        "NCCL WARN Call to ibv_create_qp failed",
    ],
)
def test_lines_that_are_not_progress(line):
    assert match_line(line) is None


def test_hugging_face_lines_without_a_step_are_counted():
    parser = ProgressLineParser()
    line = "{'loss': 1.2992, 'learning_rate': 1e-06, 'epoch': 0.0}"
    assert [parser.parse(line, ts=float(t)).step for t in range(3)] == [1, 2, 3]
    assert parser.parse("nothing here", ts=4.0) is None


def test_a_per_job_pattern_comes_first():
    parser = ProgressLineParser(r"batch (?P<step>\d+) done, loss (?P<loss>\S+)")
    sample = parser.parse("3: batch 17 done, loss 0.5", ts=5.0, node="n1")
    assert sample == ProgressSample(ts=5.0, step=17, rank=3, node="n1", loss=0.5)


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        (r"step \d+", "no group for the step number"),
        (r"step (?P<step>\d+", "not a valid regular expression"),
        (r"step (?P<step>\d+) lr (?P<lr>\S+)", "unknown named group(s) lr"),
    ],
)
def test_bad_per_job_patterns_say_how_to_fix_them(pattern, words):
    """(A first unnamed group is the step, as the SPANK option's POSIX syntax writes it.)"""
    with pytest.raises(ProgressPatternError, match=None) as caught:
        compile_job_pattern(pattern)
    assert words in str(caught.value)
    assert "(?P<step>" in str(caught.value) or "named groups are" in str(caught.value)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_text_parses_without_raising(text):
    found = match_line(text)
    assert found is None or found.step is None or found.step >= 0
    assert parse_record(text) is None or isinstance(parse_record(text), ProgressSample)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=30))
def test_every_flushed_step_reads_back(tmp_path_factory, steps):
    path = tmp_path_factory.mktemp("p") / "progress"
    clock = Clock()
    reporter = progress.Reporter(str(path), rank=1, host="n1", interval=0.0, clock=clock)
    for step in steps:
        clock.now += 1
        reporter.report(step)
    read = ProgressFileReader(path).read()
    assert [s.step for s in read] == steps
    assert all(s.rank == 1 and s.node == "n1" for s in read)


def test_the_last_step_before_a_stall_is_written_by_the_timer(tmp_path):
    path = tmp_path / "p"
    reporter = progress.Reporter(str(path), rank=3, host="n1", interval=0.2)
    reporter.report(1)  # written at once
    reporter.report(2)  # within the interval: buffered ...
    assert [r["step"] for r in lines(path)] == [1]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(lines(path)) < 2:
        time.sleep(0.02)
    assert [r["step"] for r in lines(path)] == [1, 2]  # ... and written with no further call
    reporter.close()


def test_a_posix_pattern_takes_its_first_group_as_the_step():
    parser = ProgressLineParser("epoch [0-9]+ iter ([0-9]+)")
    sample = parser.parse("epoch 2 iter 340 loss 1.5", ts=5.0)
    assert sample is not None and sample.step == 340


def test_close_writes_an_end_record_that_the_reader_takes_as_done(tmp_path):
    path = tmp_path / "p"
    reporter = progress.Reporter(str(path), rank=2, host="n3", interval=60)
    reporter.report(1)
    reporter.report(2)  # buffered: the interval has not passed
    reporter.close()
    records = lines(path)
    assert [(r["step"], r.get("done")) for r in records] == [(1, None), (2, None), (2, True)]
    samples = [parse_record(json.dumps(r)) for r in records]
    assert [s.done for s in samples] == [False, False, True]
    assert samples[-1].rank == 2 and samples[-1].node == "n3"
    assert parse_record('{"ts": 1, "step": 1, "done": "yes"}').done is False


def test_a_process_that_never_stepped_writes_no_end_record(tmp_path):
    path = tmp_path / "p"
    progress.Reporter(str(path), rank=0, host="n1").close()
    assert not path.exists()
