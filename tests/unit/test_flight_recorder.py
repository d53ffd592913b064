"""PyTorch flight-recorder dumps: the restricted reader, the evidence payload, the analysis.

Real dumps made with torch 2.13 and gloo are in tests/unit/data/flight_recorder (its README
says how); the NCCL-shaped dumps below are built in the structure of the same torch version's
writer (format "2.10"), with the ``started``/``completed`` states and ``pg_config`` names that
only the NCCL backend produces.
"""

from __future__ import annotations

import json
import os
import pickle
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_recovery.signals.flight_recorder import (
    MAX_GROUPS,
    FlightRecorderError,
    GroupTrace,
    RankTrace,
    evidence_payload,
    read_dump,
    read_dumps,
    stuck_collective,
    trace_from_payload,
)

DATA = Path(__file__).parent / "data" / "flight_recorder"
CALLS: list[str] = []


def _record_call(what: str) -> str:
    """What a hostile pickle would run; the reader must never call it."""
    CALLS.append(what)
    return what


class _Hostile:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _record_call, ("ran",)


# ------------------------------------------------------------------ NCCL-shaped dumps


def entry(
    seq: int,
    *,
    pg: str = "0",
    desc: str = "default_pg",
    pg_id: int = 0,
    op: str = "nccl:all_reduce",
    state: str = "completed",
    created: int = 1_700_000_000_000_000_000,
    p2p: bool = False,
    record: int = 0,
) -> dict[str, Any]:
    """One entry with every key torch 2.13's writer puts in it."""
    return {
        "frames": [{"name": "all_reduce", "filename": "distributed_c10d.py", "line": 2696}],
        "record_id": record,
        "pg_id": pg_id,
        "process_group": (pg, desc),
        "thread_name": "pt_main_thread",
        "thread_id": "140000000000000",
        "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": seq if p2p else 0,
        "op_id": seq,
        "profiling_name": "nccl:send 0->1" if p2p else op,
        "time_created_ns": created,
        "duration_ms": 1.5,
        "input_sizes": [[1024, 1024]],
        "input_dtypes": ["BFloat16"],
        "output_sizes": [[1024, 1024]],
        "output_dtypes": ["BFloat16"],
        "state": state,
        "time_discovered_started_ns": None if state == "scheduled" else created + 10,
        "time_discovered_completed_ns": created + 20 if state == "completed" else None,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": p2p,
    }


def dump(
    entries: list[dict[str, Any]],
    *,
    status: dict[str, dict[str, int]] | None = None,
    config: dict[str, list[int]] | None = None,
) -> dict[str, Any]:
    groups = [e["process_group"] for e in entries if isinstance(e, dict) and "process_group" in e]
    descs = dict(groups)
    return {
        "version": "2.10",
        "comm_lib_version": "2.27.3",
        "pg_config": {
            name: {"name": name, "desc": descs.get(name, ""), "ranks": str(ranks)}
            for name, ranks in (config or {}).items()
        },
        "pg_status": status or {},
        "nccl_comm_state": {},
        "entries": entries,
    }


def write(folder: Path, rank: int, document: dict[str, Any], *, as_json: bool = False) -> Path:
    path = folder / f"nccl_trace_rank_{rank}"
    if as_json:
        path.write_text(json.dumps(document))
    else:
        path.write_bytes(pickle.dumps(document, protocol=2))
    return path


def collectives(
    last: int, pending: int | None = None, *, state: str = "started", **kw: Any
) -> list[dict[str, Any]]:
    """Entries 1..last completed, then ``pending`` in ``state``."""
    out = [entry(s, **kw) for s in range(1, last + 1)]
    if pending is not None:
        out.append(entry(pending, state=state, **kw))
    return out


# ------------------------------------------------------------------ real gloo dumps


def test_real_gloo_hang_names_the_rank_that_never_entered() -> None:
    traces = read_dumps(DATA / "hang", {})
    assert [t.rank for t in traces] == [0, 1, 2, 3]
    for trace in traces:
        assert (trace.backend, trace.format, trace.version) == ("gloo", "pickle", "2.10")
    waiting = traces[0].groups["0"]
    assert (waiting.desc, waiting.last_enqueued, waiting.last_completed) == ("default_pg", 6, 5)
    assert waiting.pending and waiting.first_pending is not None
    assert (waiting.first_pending.seq_id, waiting.first_pending.op) == (6, "gloo:all_reduce")
    assert waiting.first_pending.input_sizes == ((8, 2),)
    assert waiting.first_pending.timeout_ms == 60000
    straggler = traces[3].groups["0"]
    assert (straggler.last_enqueued, straggler.last_completed, straggler.pending) == (5, 5, False)
    assert traces[2].groups["1"].last_completed == 1  # the pair group: done
    assert waiting.ranks is None  # gloo records pg_config under "": members unknown
    stuck = stuck_collective(traces)
    assert stuck is not None
    assert (stuck.pg, stuck.desc, stuck.seq_id, stuck.op) == (
        "0",
        "default_pg",
        6,
        "gloo:all_reduce",
    )
    assert (stuck.suspects, stuck.waiting, stuck.missing) == ((3,), (0, 1, 2), ())
    assert dict(stuck.behind) == {3: 5}


def test_real_json_dumps_read_as_the_pickles() -> None:
    pickles = read_dumps(DATA / "hang", {})
    jsons = read_dumps(DATA / "hang_json", {})
    assert [t.format for t in jsons] == ["json"] * 4
    assert [t.groups for t in jsons] == [t.groups for t in pickles]
    assert stuck_collective(jsons) == stuck_collective(pickles)


def test_real_gloo_timeout_dumps() -> None:
    traces = read_dumps(DATA / "timeout", {})
    stuck = stuck_collective(traces)
    assert stuck is not None
    assert (stuck.seq_id, stuck.suspects, stuck.waiting) == (5, (2,), (0, 1))


def test_payload_is_small_json_and_reads_back() -> None:
    traces = read_dumps(DATA / "hang", {})
    payloads = [json.loads(json.dumps(evidence_payload(t))) for t in traces]
    assert len(json.dumps(payloads[0])) < 1000
    first = payloads[0]
    assert first["rank"] == 0 and first["backend"] == "gloo"
    assert first["groups"][0]["pending"]["seq_id"] == 6
    back = [trace_from_payload(p) for p in payloads]
    assert [t.groups for t in back] == [t.groups for t in traces]
    assert stuck_collective(back) == stuck_collective(traces)


# ------------------------------------------------------------------ NCCL-shaped scenarios


def test_nested_groups_the_earliest_stuck_collective_wins(tmp_path: Path) -> None:
    """8 ranks, tensor-parallel groups 1 (ranks 0-3) and 2 (ranks 4-7). Rank 6 never enters
    group 2's 11th all-reduce; ranks 4, 5, 7 wait in it. Ranks 0-3 finished theirs and wait
    in the world group's 21st, which 4-7 never reach: a knock-on of the same fault."""
    t0 = 1_700_000_000_000_000_000
    config = {"0": list(range(8)), "1": [0, 1, 2, 3], "2": [4, 5, 6, 7]}
    for rank in range(8):
        tp = "1" if rank < 4 else "2"
        tp_entries = collectives(11 if rank < 4 else 10, pg=tp, desc="tp", pg_id=1, created=t0)
        world_last, world_pending = (20, 21) if rank < 4 else (20, None)
        world = collectives(world_last, world_pending, created=t0 + 5_000_000_000)
        if rank in (4, 5, 7):
            tp_entries.append(entry(11, pg=tp, desc="tp", pg_id=1, state="started", created=t0))
        write(tmp_path, rank, dump(world + tp_entries, config=config))
    traces = read_dumps(tmp_path, {})
    assert traces[0].groups["0"].ranks == tuple(range(8))
    assert traces[6].groups["2"].last_enqueued == 10
    stuck = stuck_collective(traces)
    assert stuck is not None
    assert (stuck.pg, stuck.desc, stuck.seq_id) == ("2", "tp", 11)
    assert (stuck.suspects, stuck.waiting, dict(stuck.behind)) == ((6,), (4, 5, 7), {6: 10})


def test_a_member_without_a_dump_is_missing(tmp_path: Path) -> None:
    for rank in (0, 1, 2):
        write(tmp_path, rank, dump(collectives(6, 7), config={"0": [0, 1, 2, 3]}))
    stuck = stuck_collective(read_dumps(tmp_path, {}))
    assert stuck is not None
    assert (stuck.seq_id, stuck.suspects, stuck.waiting, stuck.missing) == (7, (), (0, 1, 2), (3,))


def test_every_rank_inside_blames_no_rank(tmp_path: Path) -> None:
    for rank in range(4):
        write(tmp_path, rank, dump(collectives(8, 9), config={"0": [0, 1, 2, 3]}))
    stuck = stuck_collective(read_dumps(tmp_path, {}))
    assert stuck is not None
    assert (stuck.seq_id, stuck.suspects, stuck.missing) == (9, (), ())
    assert stuck.waiting == (0, 1, 2, 3)


def test_healthy_dumps_show_nothing_stuck(tmp_path: Path) -> None:
    for rank in range(3):
        write(tmp_path, rank, dump(collectives(12), config={"0": [0, 1, 2]}))
    assert stuck_collective(read_dumps(tmp_path, {})) is None
    assert stuck_collective([]) is None


def test_point_to_point_and_odd_entries_are_not_collectives(tmp_path: Path) -> None:
    entries = collectives(3)
    entries.append(entry(4, p2p=True, state="scheduled"))
    entries.append({"collective_seq_id": "x"})
    entries.append("not a map")
    path = write(tmp_path, 0, dump(entries))
    trace = read_dump(path)
    assert trace is not None and trace.entries == 6
    group = trace.groups["0"]
    assert (group.last_enqueued, group.last_completed, group.pending) == (3, 3, False)


def test_pg_status_counts_and_json_strings(tmp_path: Path) -> None:
    """The watchdog's counters count even when the ring buffer has dropped the entries; -1
    means none; JSON dumps write them as strings."""
    status = {"0": {"last_enqueued_collective": "41", "last_started_collective": "41"}}
    status["0"]["last_completed_collective"] = "40"
    path = write(tmp_path, 5, dump([entry(41, state="started")], status=status), as_json=True)
    trace = read_dump(path)
    assert trace is not None and trace.rank == 5 and trace.format == "json"
    group = trace.groups["0"]
    assert (group.last_enqueued, group.last_started, group.last_completed) == (41, 41, 40)
    assert group.first_pending is not None and group.first_pending.seq_id == 41
    none = {"0": {"last_enqueued_collective": -1, "last_completed_collective": -1}}
    trace = read_dump(write(tmp_path, 6, dump([], status=none)))
    assert trace is not None and trace.groups == {}


def test_payload_keeps_pending_groups_first_and_bounded() -> None:
    groups = {str(i): GroupTrace(pg=str(i), last_enqueued=3, last_completed=3) for i in range(40)}
    groups["39"] = GroupTrace(pg="39", last_enqueued=4, last_completed=3, ranks=tuple(range(512)))
    payload = evidence_payload(RankTrace(rank=2, groups=groups))
    assert len(payload["groups"]) == MAX_GROUPS
    assert payload["groups"][0]["pg"] == "39" and payload["groups"][0]["ranks"] == "0-511"
    assert trace_from_payload(payload).groups["39"].ranks == tuple(range(512))
    with pytest.raises(FlightRecorderError):
        trace_from_payload({"rank": 1})


# ------------------------------------------------------------------ reading files safely


def test_only_new_or_changed_dumps_are_read(tmp_path: Path) -> None:
    for rank in range(3):
        write(tmp_path, rank, dump(collectives(2)))
    (tmp_path / "comm_lib_trace_rank_3").write_bytes(pickle.dumps(dump(collectives(2))))
    (tmp_path / "nccl_trace_rank_x").write_bytes(pickle.dumps(dump(collectives(2))))
    (tmp_path / "progress.jsonl").write_text("{}\n")
    seen: dict[str, tuple[int, int]] = {}
    assert [t.rank for t in read_dumps(tmp_path, seen)] == [0, 1, 2, 3]
    assert read_dumps(tmp_path, seen) == []
    write(tmp_path, 1, dump(collectives(2, 3)))
    (changed,) = read_dumps(tmp_path, seen)
    assert changed.rank == 1 and changed.groups["0"].pending
    assert read_dumps(tmp_path / "absent", {}) == []


def test_links_fifos_and_damaged_files_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(pickle.dumps(dump(collectives(1))))
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    (jobdir / "nccl_trace_rank_0").symlink_to(secret)
    os.mkfifo(jobdir / "nccl_trace_rank_1")
    (jobdir / "nccl_trace_rank_2").write_bytes(pickle.dumps(dump(collectives(3)))[:-20])
    (jobdir / "nccl_trace_rank_3").write_bytes(b"")
    assert read_dumps(jobdir, {}) == []
    assert "nccl_trace_rank_2: not a readable pickle" in caplog.text
    with pytest.raises(FlightRecorderError, match="cannot open"):
        read_dump(jobdir / "nccl_trace_rank_0")  # O_NOFOLLOW: the link is not followed
    with pytest.raises(FlightRecorderError, match="not a regular file"):
        read_dump(jobdir / "nccl_trace_rank_1")  # never blocks on a FIFO
    assert read_dump(jobdir / "nccl_trace_rank_3") is None  # not written yet
    assert read_dump(jobdir / "nccl_trace_rank_9") is None
    big = write(tmp_path, 4, dump(collectives(40)))
    with pytest.raises(FlightRecorderError, match="more than the 100 a dump may have"):
        read_dump(big, max_bytes=100)
    assert stat.S_ISREG(os.lstat(big).st_mode)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_pickle_that_names_code_is_refused_and_nothing_runs(
    tmp_path: Path, protocol: int
) -> None:
    CALLS.clear()
    document = dump(collectives(2))
    document["entries"].append({"payload": _Hostile()})
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(document, protocol=protocol))
    with pytest.raises(FlightRecorderError, match=r"refused: the pickle asks for .*_record_call"):
        read_dump(path)
    assert CALLS == []


@pytest.mark.parametrize(
    "data",
    [
        b"cos\nsystem\n(S'touch /tmp/owned'\ntR.",
        b"cbuiltins\neval\n(S'1+1'\ntR.",
        b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93.",
        b"\x80\x02(cbuiltins\nprint\nq\x00o.",
        b"\x80\x02\x82\x01.",  # EXT1: the extension registry names code too
    ],
)
def test_hand_made_hostile_pickles_are_refused(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(data if data[:1] == b"\x80" else b"\x80\x02" + data)
    with pytest.raises(FlightRecorderError):
        read_dump(path)


# ------------------------------------------------------------------ properties

_OPS = [
    b"c" + name
    for name in (
        b"os\nsystem\n",
        b"builtins\neval\n",
        b"subprocess\nPopen\n",
        b"tests.unit.test_flight_recorder\n_record_call\n",
    )
] + [
    b"\x8c\x02os\x8c\x06system\x93",  # STACK_GLOBAL
    b"R",  # REDUCE
    b"\x81",  # NEWOBJ
    b"i" + b"builtins\nexec\n",  # INST
    b"o",  # OBJ
    b"b",  # BUILD
    b"\x82\x01",  # EXT1
    b"}",
    b"]",
    b"(",
    b"t",
    b"u",
    b"e",
    b"N",
    b"K\x05",
    b"X\x03\x00\x00\x00abc",
    b"S'text'\n",
    b".",
]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fr")


def _read_bytes(folder: Path, data: bytes) -> RankTrace | None:
    path = folder / "nccl_trace_rank_0"
    path.write_bytes(data)
    try:
        return read_dump(path)
    except FlightRecorderError:
        return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=400),
        st.binary(max_size=400).map(lambda b: b"\x80\x02" + b),
        st.binary(max_size=400).map(lambda b: b"{" + b),
        st.lists(st.sampled_from(_OPS), max_size=30).map(lambda ops: b"\x80\x02" + b"".join(ops)),
    )
)
def test_random_bytes_never_raise_nor_run_anything(scratch: Path, data: bytes) -> None:
    CALLS.clear()
    result = _read_bytes(scratch, data)
    assert result is None or isinstance(result, RankTrace)
    assert CALLS == []


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.binary(max_size=8),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=8), inner, max_size=4),
    ),
    max_leaves=20,
)
_entry_like = st.fixed_dictionaries(
    {},
    optional={
        key: st.one_of(_values, st.integers(min_value=-3, max_value=9))
        for key in (
            "pg_id",
            "process_group",
            "collective_seq_id",
            "profiling_name",
            "state",
            "retired",
            "is_p2p",
            "input_sizes",
            "time_created_ns",
            "timeout_ms",
        )
    },
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {"entries": st.lists(st.one_of(_entry_like, _values), max_size=6)},
        optional={"version": _values, "pg_status": _values, "pg_config": _values},
    ),
    st.integers(min_value=0, max_value=pickle.HIGHEST_PROTOCOL),
    st.booleans(),
)
def test_any_dump_shaped_document_reads_or_is_refused_cleanly(
    scratch: Path, document: dict[str, Any], protocol: int, as_json: bool
) -> None:
    if as_json:
        try:
            data = json.dumps(document).encode()
        except (TypeError, ValueError):
            return
    else:
        data = pickle.dumps(document, protocol=protocol)
    trace = _read_bytes(scratch, data)
    if trace is not None:
        json.dumps(evidence_payload(trace))
        for group in trace.groups.values():
            assert group.last_completed <= group.last_started <= group.last_enqueued


_group = st.tuples(st.integers(0, 30), st.integers(0, 5)).map(
    lambda t: GroupTrace(pg="0", last_enqueued=t[0] + t[1], last_completed=t[0])
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(0, 15), _group, max_size=8))
def test_stuck_collective_splits_ranks_by_the_stuck_sequence(groups: dict[int, GroupTrace]) -> None:
    traces = [RankTrace(rank=r, groups={"0": g}) for r, g in groups.items()]
    stuck = stuck_collective(traces)
    anyone_inside = any(g.pending for g in groups.values())
    disagree = len({g.last_enqueued for g in groups.values()}) > 1
    if not (anyone_inside or disagree):
        assert stuck is None
        return
    assert stuck is not None
    assert set(stuck.suspects) | set(stuck.waiting) == set(groups)
    assert not set(stuck.suspects) & set(stuck.waiting)
    for rank in stuck.suspects:
        assert groups[rank].last_enqueued == stuck.behind[rank] < stuck.seq_id
    for rank in stuck.waiting:
        assert groups[rank].last_enqueued >= stuck.seq_id
    if anyone_inside:  # the sequence some rank is inside
        assert stuck.seq_id in {g.last_completed + 1 for g in groups.values() if g.pending}
    # the evidence payloads carry all the analysis needs
    back = [trace_from_payload(evidence_payload(t)) for t in traces]
    assert stuck_collective(back) == stuck
