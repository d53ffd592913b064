"""The pure parts of `srecovery status|mode|drain|undrain`: mode overrides (store, effective
policy, the modes table), the error ring, incident counts, drain reasons and owners, and the
watchdog's heartbeat."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.controller.loop import effective_policy
from slurm_recovery.controller.operator_api import (
    ErrorRing,
    RecentIncident,
    drain_owner,
    expand_nodes,
    incident_counts,
    install_error_ring,
    mode_changes,
    modes_json,
    operator_reason,
)
from slurm_recovery.decide.model import Mode
from slurm_recovery.decide.policy import Policy
from slurm_recovery.store import LATEST_VERSION, ModeOverride, Store
from slurm_recovery.watchdog import (
    SweepResult,
    heartbeat_state,
    read_heartbeat,
    write_heartbeat,
)

POLICY = Policy(mode=Mode.MONITOR, partition_modes={"gpu": Mode.MONITOR, "big": Mode.ACT})


def override(partition: str | None, mode: str, at: float = 100.0) -> ModeOverride:
    return ModeOverride(partition, mode, "alice", at, "trial", set_by_uid=1000)


# --- the store ----------------------------------------------------------------------------


def test_store_keeps_one_override_per_partition_and_one_default(tmp_path: Path) -> None:
    with Store.open(tmp_path / "state.db") as store:
        assert store.schema_version == LATEST_VERSION >= 4
        assert store.mode_overrides() == []
        assert store.set_mode_override(override(None, "act")) is None
        assert store.set_mode_override(override("gpu", "act")) is None
        replaced = store.set_mode_override(override("gpu", "monitor", at=200.0))
        assert replaced == override("gpu", "act")
        assert store.mode_overrides() == [override(None, "act"), override("gpu", "monitor", 200.0)]
        assert store.get_mode_override("gpu").mode == "monitor"
        assert store.clear_mode_override(None) == override(None, "act")
        assert store.clear_mode_override(None) is None
        assert store.get_mode_override(None) is None
        assert [o.partition for o in store.mode_overrides()] == ["gpu"]
    with Store.open(tmp_path / "state.db", readonly=True) as store:  # survives a reopen
        assert store.mode_overrides()[0].set_by_uid == 1000


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "acting"}, "mode must be one of monitor, act"),
        ({"partition": "a,b"}, "one partition name"),
        ({"partition": " gpu"}, "one partition name"),
        ({"set_by": ""}, "set_by must not be empty"),
        ({"set_at": -1.0}, "set_at"),
    ],
)
def test_a_bad_override_is_refused_before_any_write(kwargs: dict, match: str) -> None:
    fields = {"partition": "gpu", "mode": "act", "set_by": "alice", "set_at": 1.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        ModeOverride(**fields)


# --- the effective policy -------------------------------------------------------------------


def test_no_override_leaves_the_policy_as_it_is() -> None:
    assert effective_policy(POLICY, []) is POLICY


def test_a_partition_override_beats_its_policy_table() -> None:
    policy = effective_policy(POLICY, [override("gpu", "act")])
    assert policy.mode_for("gpu") is Mode.ACT
    assert policy.mode_for("other") is Mode.MONITOR
    assert POLICY.mode_for("gpu") is Mode.MONITOR  # the file's policy is untouched
    assert policy.max_restarts == POLICY.max_restarts and policy.source == POLICY.source


def test_a_default_override_is_like_editing_the_top_level_mode() -> None:
    policy = effective_policy(POLICY, [override(None, "act")])
    assert policy.mode is Mode.ACT
    assert policy.mode_for("other") is Mode.ACT  # follows the default
    assert policy.mode_for("gpu") is Mode.MONITOR  # keeps its own table
    back = effective_policy(POLICY, [override(None, "monitor"), override("big", "monitor")])
    assert back.mode_for("big") is Mode.MONITOR and back.mode_for("other") is Mode.MONITOR


def test_a_job_in_several_partitions_acts_only_when_all_act() -> None:
    policy = effective_policy(POLICY, [override("gpu", "act")])
    assert policy.mode_for("gpu,big") is Mode.ACT
    assert policy.mode_for("gpu,other") is Mode.MONITOR


MODES = st.sampled_from(["monitor", "act"])
NAMES = st.sampled_from(["gpu", "big", "cpu", "debug"])


@given(
    default=MODES,
    tables=st.dictionaries(NAMES, MODES),
    overrides=st.dictionaries(st.none() | NAMES, MODES),
    seen=st.sets(NAMES),
)
def test_the_modes_table_agrees_with_the_policy_the_loop_uses(default, tables, overrides, seen):
    policy = Policy(mode=Mode(default), partition_modes={k: Mode(v) for k, v in tables.items()})
    items = [override(name, mode) for name, mode in overrides.items()]
    table = modes_json(policy, items, seen)
    effective = effective_policy(policy, items)
    assert table["default"]["mode"] == str(effective.mode)
    assert set(table["partitions"]) == seen | set(tables) | {n for n in overrides if n}
    for name, entry in table["partitions"].items():
        assert entry["mode"] == str(effective.mode_for(name))
        if name in overrides:
            assert (entry["source"], entry["inherits_default"]) == ("override", False)
        elif name in tables:
            assert (entry["source"], entry["inherits_default"]) == ("policy", False)
        else:
            assert entry == {**table["default"], "inherits_default": True}


def test_the_modes_table_says_who_set_an_override() -> None:
    table = modes_json(POLICY, [override("gpu", "act")], {"gpu", "cpu"})
    assert table["default"] == {
        "mode": "monitor",
        "source": "policy",
        "set_by": None,
        "set_at": None,
        "reason": None,
    }
    gpu = table["partitions"]["gpu"]
    assert (gpu["mode"], gpu["source"], gpu["set_by"], gpu["reason"]) == (
        "act",
        "override",
        "alice",
        "trial",
    )
    assert gpu["set_at"].startswith("1970-01-01T00:01:40")
    assert table["partitions"]["cpu"]["inherits_default"] is True


def test_changes_name_every_partition_that_follows_the_default() -> None:
    seen = {"gpu", "cpu", "debug"}
    before = modes_json(POLICY, [], seen)
    after = modes_json(POLICY, [override(None, "act")], seen)
    assert mode_changes(before, after) == [
        {"partition": None, "from": "monitor", "to": "act"},
        {"partition": "cpu", "from": "monitor", "to": "act"},
        {"partition": "debug", "from": "monitor", "to": "act"},
    ]
    assert mode_changes(after, after) == []


# --- the error ring -------------------------------------------------------------------------


def test_the_ring_keeps_only_the_last_records_warning_and_up() -> None:
    ring = ErrorRing(capacity=5)
    logger = logging.getLogger("test.operator_api.ring")
    logger.propagate = False
    logger.addHandler(ring)
    try:
        logger.info("not kept")
        for i in range(12):
            logger.warning("warning %d", i)
        try:
            raise RuntimeError("boom\nsecond line")
        except RuntimeError:
            logger.exception("pass failed")
    finally:
        logger.removeHandler(ring)
    assert len(ring.records) == 5
    last = ring.last(10)
    assert [r["message"] for r in last[:4]] == [f"warning {i}" for i in range(8, 12)]
    assert last[-1]["level"] == "ERROR"
    assert last[-1]["message"] == "pass failed: RuntimeError: boom second line"
    assert ring.last(2) == last[-2:] and ring.last(0) == []
    assert all(isinstance(r["at"], float) for r in last)


def test_a_huge_message_is_cut() -> None:
    ring = ErrorRing(capacity=2)
    ring.handle(logging.makeLogRecord({"msg": "x" * 5000, "levelno": 40, "levelname": "ERROR"}))
    assert len(ring.last(1)[0]["message"]) == 1000


def test_the_ring_leaves_the_root_logger_with_its_owner() -> None:
    class Owner:
        pass

    owner = Owner()
    ring = install_error_ring(owner)
    assert ring in logging.getLogger().handlers
    del owner
    assert ring not in logging.getLogger().handlers


def test_a_ring_needs_room() -> None:
    with pytest.raises(ValueError):
        ErrorRing(capacity=0)


# --- incidents --------------------------------------------------------------------------------


def test_incident_counts_by_window_class_and_kind() -> None:
    now = 100_000.0
    incidents = [
        RecentIncident(now - 10, "doomed", "hardware"),
        RecentIncident(now - 3000, "crash", "unknown"),
        RecentIncident(now - 7200, "crash", "hardware"),
        RecentIncident(now - 90_000, "hang", "unknown"),
    ]
    assert incident_counts(incidents, now, 3600) == {
        "total": 2,
        "by_class": {"hardware": 1, "unknown": 1},
        "by_kind": {"crash": 1, "doomed": 1},
    }
    assert incident_counts(incidents, now, 86400)["by_class"] == {"hardware": 2, "unknown": 1}
    assert incident_counts([], now, 60) == {"total": 0, "by_class": {}, "by_kind": {}}


# --- drains ---------------------------------------------------------------------------------


def test_an_operators_drain_reason_is_one_marked_line() -> None:
    assert operator_reason("alice", "bad fan\n(see ticket 12)") == (
        "srecovery-op:alice: bad fan (see ticket 12)"
    )
    assert len(operator_reason("alice", "x" * 500)) == 200
    with pytest.raises(ValueError):
        operator_reason("alice", " \n ")


@pytest.mark.parametrize(
    ("reason", "owner"),
    [
        ("srecovery-op:alice: bad fan", "operator alice through slurm-recovery"),
        ("srecovery:12:xid 79 (GPU has fallen off the bus)", "slurm-recovery (incident 12)"),
        ("srecovery:held:3:1795960000", None),  # not a drain reason of ours
        ("admin maintenance", None),
        ("Not responding", None),
        ("", None),
    ],
)
def test_whose_drain(reason: str, owner: str | None) -> None:
    assert drain_owner(reason) == owner


def test_nodes_of_a_request_are_expanded_once_each() -> None:
    assert expand_nodes(["n[1-3]", "n2", "m1"]) == ["n1", "n2", "n3", "m1"]
    for bad in ([], "n1", [1], ["n[1-"]):
        with pytest.raises(ValueError):
            expand_nodes(bad)


# --- the watchdog's heartbeat ---------------------------------------------------------------


def test_heartbeat_round_trip_and_staleness(tmp_path: Path) -> None:
    spool = tmp_path / "watchdog"
    assert read_heartbeat(spool) is None and heartbeat_state(None, 0.0) == "never"
    write_heartbeat(spool, ts=1000.0, host="head", interval=5.0, result=SweepResult())
    beat = read_heartbeat(spool)
    assert beat is not None
    assert (beat["ts"], beat["host"], beat["interval"], beat["released"]) == (
        1000.0,
        "head",
        5.0,
        0,
    )
    assert beat["slurm_reachable"] is True
    assert heartbeat_state(beat, 1059.0) == "ok"  # at least 60 s
    assert heartbeat_state(beat, 1061.0) == "stale"
    slow = {**beat, "interval": 60.0}
    assert heartbeat_state(slow, 1000.0 + 179) == "ok"  # 3 intervals
    assert heartbeat_state(slow, 1000.0 + 181) == "stale"
    (spool / "heartbeat.json").write_text("{not json")
    assert read_heartbeat(spool) is None
    assert [p.name for p in spool.iterdir()] == ["heartbeat.json"]  # no temporary left
