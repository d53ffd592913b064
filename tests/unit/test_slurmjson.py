"""Slurm's JSON -> Job/Node on every release: real recordings (tests/fixtures/slurm/<release>/,
from scripts/record-slurm-fixtures), SchedMD's published shapes for the releases that cannot be
run here (hand-checked: each directory's README cites the source), and generated shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.scheduler.base import ExitCode, UnsupportedOutput
from slurm_recovery.scheduler.slurmjson import (
    effective_job_state,
    gpu_count,
    gpu_indices,
    job_from_json,
    jobs_from_json,
    node_from_json,
    nodes_from_json,
    release,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
RECORDED = sorted(p for p in FIXTURES.iterdir() if (p / "scenario.json").exists())
PUBLISHED = sorted(p for p in FIXTURES.iterdir() if (p / "nodes.json").exists())


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_there_are_recordings_of_two_releases_and_four_published_shapes():
    assert {p.name for p in RECORDED} >= {"22.05", "24.11"}
    assert {p.name for p in PUBLISHED} >= {"23.02", "23.11", "24.05", "25.05"}


# ------------------------------------------------------------------------ real recordings


@pytest.mark.parametrize("recorded", RECORDED, ids=lambda p: p.name)
def test_recorded_jobs(recorded: Path):
    scenario = _load(recorded / "scenario.json")
    ids = scenario["jobs"]
    work = scenario["workdir"]
    doc = _load(recorded / "squeue.json")
    assert release(doc).startswith(recorded.name)
    jobs = {j.job_id: j for j in jobs_from_json(doc)}

    running = jobs[ids["running"]]
    assert (running.name, running.state, running.user, running.partition) == (
        "train run",
        "RUNNING",
        "root",
        "debug",
    )
    assert len(running.nodes) == 2 and running.num_nodes == 2 and "n4" not in running.nodes
    assert running.stdout_path == f"{work}/o-{running.job_id}-train run.out"
    assert running.stderr_path == running.stdout_path
    assert not running.held and running.active and running.requeueable
    assert running.submit_time > 1_700_000_000 and running.start_time >= running.submit_time
    assert running.exit_code == ExitCode(0, 0) and running.array_task_id is None

    failed = jobs[ids["failed"]]
    assert failed.state == "FAILED" and failed.exit_code == ExitCode(3, 0)
    assert failed.stdout_path == f"{work}/slurm-{failed.job_id}.out"  # Slurm's default name
    assert not failed.active
    assert jobs[ids["killed"]].exit_code == ExitCode(0, 9)

    held = jobs[ids["held"]]
    assert held.state == "PENDING" and held.held
    assert held.restart_count == 1 and held.excluded_nodes == {"n1", "n2"}
    assert held.nodes == () and held.active

    pinned = jobs[ids["pinned"]]
    assert not pinned.requeueable and pinned.required_nodes == {"n3"}
    assert pinned.stderr_path == f"{work}/e-{pinned.job_id}.err"

    array = ids["array_job_id"]
    tasks = sorted((jobs[i].array_job_id, jobs[i].array_task_id) for i in ids["array_tasks"])
    assert tasks == [(array, 0), (array, 1)]
    for i in ids["array_tasks"]:
        task = jobs[i]
        assert task.stdout_path == f"{work}/a-{array}_{task.array_task_id}.out"


@pytest.mark.parametrize("recorded", RECORDED, ids=lambda p: p.name)
def test_recorded_nodes(recorded: Path):
    name = "sinfo.json" if (recorded / "sinfo.json").exists() else "scontrol-show-nodes.json"
    nodes = {n.name: n for n in nodes_from_json(_load(recorded / name))}
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    drained = nodes["n4"]
    assert drained.drained and drained.reason == "xid 79 gpu1"
    assert drained.reason_set_by == "root" and drained.reason_changed_at > 1_700_000_000
    assert nodes["n3"].state in {"MIXED", "ALLOCATED"} and not nodes["n3"].drained
    assert nodes["n1"].partitions == ("debug",)
    assert nodes["n1"].address == "127.0.0.1" and nodes["n1"].hostname


def test_recorded_single_job_reads_like_the_listing():
    compared = []
    for recorded in RECORDED:
        path = recorded / "scontrol-show-job.json"
        if not path.exists():
            continue  # 22.05: scontrol has no --json
        (job,) = jobs_from_json(_load(path), "scontrol show job --json")
        listed = {j.job_id: j for j in jobs_from_json(_load(recorded / "squeue.json"))}
        assert job == listed[job.job_id]
        compared.append(recorded.name)
    assert "24.11" in compared


# ------------------------------------------------------- SchedMD's shapes (hand-checked)


@pytest.mark.parametrize("published", PUBLISHED, ids=lambda p: p.name)
def test_published_shapes(published: Path):
    jobs = {j.job_id: j for j in jobs_from_json(_load(published / "squeue.json"))}
    running = jobs[11]
    assert (running.state, running.nodes, running.restart_count) == ("RUNNING", ("n1", "n2"), 1)
    assert running.excluded_nodes == {"n3"} and running.stdout_path == "/tmp/out-11.log"
    assert not running.held and running.exit_code == ExitCode(0, 0)
    held = jobs[12]
    assert held.state == "REQUEUE_HOLD" and held.held and held.restart_count == 2
    assert "REQUEUE_HOLD" in held.state_flags and held.begin_time > 1_700_000_000
    task = jobs[15]
    assert (task.array_job_id, task.array_task_id, task.nodes) == (13, 2, ("n3",))
    ended = jobs[14]
    if published.name >= "25.05":  # Slurm's own expansion (stdout_expanded) is taken
        assert ended.stdout_path == "/tmp/eval-14.out"
    assert ended.state == "COMPLETING" and {"COMPLETING"} <= ended.state_flags
    assert ended.exit_code == ExitCode(1, 0) and ended.active
    nodes = {n.name: n for n in nodes_from_json(_load(published / "nodes.json"))}
    assert nodes["n3"].drained and nodes["n3"].reason.startswith("slurm-recovery:")
    assert nodes["n3"].reason_set_by == "root" and nodes["n3"].reason_changed_at > 0
    assert nodes["n4"].state == "DOWN" and "NOT_RESPONDING" in nodes["n4"].flags
    assert nodes["n1"].address == "127.0.0.1" and nodes["n1"].partitions == ("debug",)


# ----------------------------------------------------------------- shapes and errors


def _job(**fields):
    recorded = _load(FIXTURES / "22.05" / "squeue.json")
    return {**recorded["jobs"][0], **fields}


NUMBER = st.integers(0, 2**31)


@given(NUMBER)
def test_a_number_reads_the_same_in_every_shape(n):
    plain = job_from_json(_job(restart_cnt=n)).restart_count
    boxed = job_from_json(
        _job(restart_cnt={"set": True, "infinite": False, "number": n})
    ).restart_count
    assert plain == boxed == n
    unset = _job(restart_cnt={"set": False, "infinite": False, "number": n})
    assert job_from_json(unset).restart_count == 0


@given(st.integers(0, 255), st.integers(0, 127))
def test_exit_codes_in_every_release_shape(returncode, signal):
    status = signal if signal else returncode << 8  # the raw wait status (22.05)
    expected = ExitCode(0, signal) if signal else ExitCode(returncode, 0)
    as_2205 = job_from_json(_job(exit_code=status)).exit_code
    as_2302 = job_from_json(_job(exit_code={"set": True, "number": status})).exit_code
    as_2311 = job_from_json(
        _job(
            exit_code={
                "status": ["SIGNALED" if signal else "SUCCESS" if not returncode else "ERROR"],
                "return_code": {"set": True, "infinite": False, "number": expected.returncode},
                "signal": {
                    "id": {"set": bool(signal), "infinite": False, "number": signal},
                    "name": "",
                },
            }
        )
    ).exit_code
    assert as_2205 == as_2302 == as_2311 == expected


FLAGS = st.sets(
    st.sampled_from(
        ["COMPLETING", "REQUEUE_HOLD", "REQUEUED", "CONFIGURING", "UPDATE_DB", "LAUNCH_FAILED"]
    )
)


@given(st.sampled_from(["PENDING", "RUNNING", "FAILED", "COMPLETED", "CANCELLED"]), FLAGS)
def test_state_lists_keep_22_05_spelling_and_every_flag(base, flags):
    job = job_from_json(_job(job_state=[base, *sorted(flags)]))
    assert job.state_flags == frozenset(flags)
    assert job.state == effective_job_state(base, frozenset(flags))
    if "COMPLETING" in flags:
        assert job.state == "COMPLETING"  # 22.05 showed COMPLETING before anything else
    elif not flags & {"REQUEUE_HOLD", "REQUEUED", "CONFIGURING"}:
        assert job.state == base


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("array_task_id", {"weird": 1}),
        ("job_state", []),
        ("job_state", 7),
        ("exit_code", "0:0"),
        ("restart_cnt", "1"),
        ("restart_cnt", {"set": True}),
        ("nodes", ["n1"]),
        ("requeue", "yes"),
        ("priority", 1.5),
    ],
)
def test_an_unknown_shape_names_the_field_and_the_release(field, value):
    doc = {"meta": {"slurm": {"release": "26.05.1"}}, "jobs": [_job(**{field: value})]}
    with pytest.raises(UnsupportedOutput, match=rf"Slurm 26\.05\.1: .*{field}") as err:
        jobs_from_json(doc)
    assert err.value.field == field and err.value.slurm_version == "26.05.1"


@pytest.mark.parametrize(
    "field", ["job_id", "job_state", "nodes", "exit_code", "priority", "restart_cnt", "batch_flag"]
)
def test_a_missing_field_is_an_error_not_a_default(field):
    data = _job()
    del data[field]
    with pytest.raises(UnsupportedOutput, match=field):
        jobs_from_json({"meta": {}, "jobs": [data]})


def test_a_listing_without_its_list_says_what_it_had():
    with pytest.raises(UnsupportedOutput, match=r"no .nodes. list .*sinfo"):
        nodes_from_json({"meta": {"slurm": {"release": "24.11.5"}}, "sinfo": []}, "sinfo --json")
    with pytest.raises(UnsupportedOutput, match="not an object"):
        jobs_from_json([1, 2])
    with pytest.raises(UnsupportedOutput, match="node"):
        node_from_json({"name": "n1", "state": None})


@given(st.text(max_size=40))
def test_garbage_in_a_text_field_never_escapes_as_another_error(text):
    try:
        job = job_from_json(_job(excluded_nodes=text))
    except UnsupportedOutput as exc:
        assert exc.field == "excluded_nodes"
    else:
        assert isinstance(job.excluded_nodes, frozenset)


def test_batch_flag_tells_an_interactive_job():
    # srun/salloc jobs print batch_flag false (seen on 22.05 and 24.11); Slurm will not requeue them
    assert job_from_json(_job(batch_flag=False)).batch is False
    assert job_from_json(_job(batch_flag=True)).batch is True
    with pytest.raises(UnsupportedOutput, match="batch_flag"):
        job_from_json(_job(batch_flag=1))


def test_heterogeneous_job_fields_in_both_number_shapes():
    plain = job_from_json(_job(het_job_id=40, het_job_offset=1))
    assert (plain.het_job_id, plain.het_job_offset) == (40, 1)
    boxed = job_from_json(
        _job(
            het_job_id={"set": True, "infinite": False, "number": 40},
            het_job_offset={"set": True, "infinite": False, "number": 0},
        )
    )
    assert (boxed.het_job_id, boxed.het_job_offset) == (40, 0)
    unset = {"set": False, "infinite": False, "number": 0}
    assert job_from_json(_job(het_job_id=unset)).het_job_id == 0
    assert job_from_json(_job(features="a100&ib")).features == "a100&ib"
    assert job_from_json(_job(features=None)).features == ""


@pytest.mark.parametrize("recorded", RECORDED, ids=lambda p: p.name)
def test_recorded_jobs_are_not_heterogeneous_and_nodes_say_their_features(recorded: Path):
    jobs = jobs_from_json(_load(recorded / "squeue.json"))
    assert jobs and all(j.het_job_id == 0 and j.features == "" for j in jobs)
    name = "sinfo.json" if (recorded / "sinfo.json").exists() else "scontrol-show-nodes.json"
    assert all(n.features == frozenset() for n in nodes_from_json(_load(recorded / name)))


UNSET = {"set": False, "infinite": False, "number": 0}


@given(st.integers(1, 2**31), st.integers(0, 10_000), st.integers(1, 2**31), st.booleans())
def test_an_array_task_is_addressed_as_array_underscore_task(array_id, task, own_id, boxed):
    def number(n):
        return {"set": True, "infinite": False, "number": n} if boxed else n

    job = job_from_json(
        _job(job_id=own_id, array_job_id=number(array_id), array_task_id=number(task))
    )
    assert job.slurm_address == f"{array_id}_{task}" and not job.pending_array_record
    pending = job_from_json(
        _job(job_id=array_id, array_job_id=number(array_id), array_task_id=UNSET if boxed else None)
    )
    assert pending.pending_array_record and pending.array_task_id is None
    plain = job_from_json(_job(job_id=own_id, array_job_id=number(0), array_task_id=None))
    assert plain.slurm_address == str(own_id) and not plain.pending_array_record


# ------------------------------------------------------------------------------ GPU GRES


@pytest.mark.parametrize("recorded", RECORDED, ids=lambda p: p.name)
def test_recorded_gres_indices_per_node(recorded: Path):
    """Recorded by scripts/record-gres-fixtures (3 nodes, ``Gres=gpu:8`` each): gres_detail is
    one string per node, in node order, on 22.05 and 24.11 alike."""
    jobs = {j.name: j for j in jobs_from_json(_load(recorded / "gres-squeue.json"))}
    assert jobs["gpu2"].gpus == {"n1": {0, 1}}
    assert jobs["gpu1"].gpus == {"n1": {2}}
    assert jobs["nogpu"].gpus == {}  # on a GPU node, holding none of its GPUs
    assert jobs["multi"].gpus == {"n2": {0}, "n3": {0}}
    assert jobs["gpus3"].gpus == {"n3": {1, 2, 3}}  # --gpus=3
    gres_nodes = {n.name: n.gpus for n in nodes_from_json(_load(recorded / "gres-nodes.json"))}
    assert gres_nodes == {"n1": 8, "n2": 8, "n3": 8}
    # the plain recordings: jobs without GPU GRES hold no GPU
    assert all(j.gpus == {} for j in jobs_from_json(_load(recorded / "squeue.json")))


def test_without_gres_detail_slurm_does_not_say():
    doc = _job()
    del doc["gres_detail"]
    assert job_from_json(doc).gpus is None
    assert job_from_json(_job(gres_detail=["gpu:1(IDX:N/A)"], nodes="n1")).gpus is None
    assert job_from_json(_job(gres_detail=["gpu:1(IDX:0)"], nodes="n[1-2]")).gpus is None
    with pytest.raises(UnsupportedOutput, match="gres_detail"):
        job_from_json(_job(gres_detail="gpu:1(IDX:0)"))


def test_a_finished_job_that_asked_for_gpus_no_longer_says_which():
    """A FAILED job's ``gres_detail`` is ``[]`` although it held GPUs (seen on 22.05):
    with ``tres_per_node = gres/gpu:1`` that means unknown, not "held none", or a GPU-scoped
    XID that killed it would be ignored when its crash is attributed."""
    finished = job_from_json(_job(gres_detail=[], tres_per_node="gres/gpu:1", nodes="n1"))
    assert finished.gpus is None
    two = job_from_json(_job(gres_detail=[""], tres_per_job="gres/gpu:2", nodes="n1"))
    assert two.gpus is None
    assert job_from_json(_job(gres_detail=[], tres_per_node="", nodes="n1")).gpus == {}


@pytest.mark.parametrize(
    ("detail", "indices"),
    [
        ("gpu:2(IDX:0-1)", {0, 1}),
        ("gpu:3(IDX:0-1,3)", {0, 1, 3}),
        ("gpu:a100:2(IDX:0,2)", {0, 2}),
        ("gpu:a100:1(IDX:0),gpu:v100:1(IDX:4)", {0, 4}),
        ("gpu:1(IDX:5),nic:1", {5}),
        ("gpu:0", set()),
        ("", set()),
        ("gpu:1(IDX:N/A)", None),
        ("gpu:1", None),
        ("gpu:1(IDX:0),mps:50(0/100)", None),
        ("shard:2(2/4)", None),
        ("gpu:2(IDX:x-1)", None),
    ],
)
def test_gpu_indices_of_one_node(detail, indices):
    assert gpu_indices(detail) == (None if indices is None else frozenset(indices))


@given(st.lists(st.integers(0, 63), min_size=1, max_size=8, unique=True), st.booleans())
def test_gpu_indices_read_back_what_slurm_writes(indices, typed):
    """Slurm writes an index set as sorted ranges joined by commas (bit_fmt)."""
    ranges, run = [], []
    for i in sorted(indices):
        if run and i != run[-1] + 1:
            ranges.append(run)
            run = []
        run.append(i)
    ranges.append(run)
    text = ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in ranges)
    kind = "gpu:h100:" if typed else "gpu:"
    assert gpu_indices(f"{kind}{len(indices)}(IDX:{text})") == frozenset(indices)


@given(st.text(max_size=40))
def test_any_gres_detail_text_reads_as_indices_or_not_known(text):
    found = gpu_indices(text)
    assert found is None or all(isinstance(i, int) and i >= 0 for i in found)


@pytest.mark.parametrize(
    ("gres", "count"),
    [
        ("gpu:8", 8),
        ("gpu:h100:4(S:0-1),gpu:a100:4(S:1)", 8),
        ("gpu:8(S:0),mps:400", 8),
        ("", 0),
        ("(null)", 0),
        ("nic:2", 0),
        ("gpu:lots", 0),
    ],
)
def test_gpu_count_of_a_node(gres, count):
    assert gpu_count(gres) == count


def test_slurms_own_expedited_hold_as_26_05_shows_it():
    """squeue --json on 26.05.5 for an ``--requeue=expedite`` job after ``exit 1`` with
    ``enable_expedited_requeue`` (recorded on the real cluster): Slurm held it itself."""
    held = job_from_json(
        _job(
            job_state=["PENDING", "REQUEUE_HOLD"],
            flags=["USING_DEFAULT_QOS", "PARTITION_ASSIGNED", "EXPEDITED_REQUEUE"],
            state_reason="JobHeldUser",
            restart_cnt={"set": True, "infinite": False, "number": 1},
            hold=True,
            priority={"set": True, "infinite": False, "number": 0},
            exit_code={
                "status": ["ERROR"],
                "return_code": {"set": True, "infinite": False, "number": 143},
                "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""},
            },
        )
    )
    assert (held.state, held.held, held.restart_count) == ("REQUEUE_HOLD", True, 1)
    assert held.expedited_requeue and held.exit_code == ExitCode(143, 0)
    assert not job_from_json(_job()).expedited_requeue  # 22.05: no such flag


@pytest.mark.parametrize(
    ("state", "down", "drained"),
    [
        (["IDLE", "POWER_DOWN_ASAP"], False, False),  # being powered down after its jobs
        (["MIXED", "POWER_DOWN_FORCE"], False, False),
        (["IDLE", "POWERED_DOWN"], False, False),  # power saving: asleep, not broken
        (["BLOCKED"], False, False),  # 25.11+: blocked by a segment or reservation
        (["EXTERNAL"], False, False),  # 25.11+: managed outside Slurm
        (["IDLE", "DRAIN"], False, True),
        (["DOWN", "NOT_RESPONDING"], True, False),
    ],
)
def test_new_node_states_of_26_05_are_understood_not_taken_for_faults(state, down, drained):
    """26.05's node states and flags read from its real output (the recorded n1), with only
    the state changed: power saving and BLOCKED/EXTERNAL are not a fault; the reason's setter
    reads "" when there is no reason (``reason_set_by_user`` ``""``)."""
    from slurm_recovery.decide.attribute import node_is_down

    doc = json.loads((FIXTURES / "26.05" / "scontrol-show-nodes.json").read_text())
    record = {**doc["nodes"][0], "state": state, "reason": "", "reason_set_by_user": ""}
    node = node_from_json(record, slurm="26.05")
    assert node_is_down(node.state, node.flags) is down
    assert node.drained is drained
    assert node.reason == "" and node.reason_set_by == ""


@pytest.mark.parametrize("text", ["@@0", "@gpu", "n[1-2],@all"])
def test_a_group_name_in_a_host_list_is_no_crash(text):
    """'@' is ClusterShell's group syntax, not Slurm's: it once escaped as ClusterShell's
    GroupResolverSourceError (found by hypothesis in the test above); no group is resolved."""
    job = job_from_json(_job(excluded_nodes=text))
    assert isinstance(job.excluded_nodes, frozenset)


def test_a_name_with_an_at_sign_is_kept_by_compress():
    """ClusterShell read '@a' as a group and dropped it from the list it compressed."""
    from slurm_recovery.contract import hostlist

    assert hostlist.compress(["@a", "n1"]) == "@a,n1"
