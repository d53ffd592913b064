"""The hook-event spool: two-phase take/commit (a crash re-sends, never loses), files still
being written are left alone, malformed files are quarantined and counted, never fatal."""

from __future__ import annotations

import json
import os

import pytest

from slurm_recovery.contract.spool import HookSpool, SpoolError
from slurm_recovery.contract.wire import event_to_json
from slurm_recovery.sidecar.spool import SpoolSource

NOW = 1_800_000_000.0


def job_end(job_id: int, node: str | None = "n2") -> dict:
    return event_to_json(
        "job_end",
        NOW + job_id,
        node=node,
        job_id=job_id,
        payload={"exit_code": 1, "signal": 0, "restart_count": 0, "nodes": "n[1-2]"},
    )


def test_put_then_take_in_order_and_commit_deletes(tmp_path):
    spool = HookSpool(tmp_path)
    paths = [spool.put(job_end(i)) for i in (1, 2, 3)]
    assert all(p.parent == tmp_path / "events" and p.suffix == ".json" for p in paths)
    assert not list((tmp_path / "events").glob("*.tmp"))
    events, commit = spool.take("n2")
    assert [e["job_id"] for e in events] == [1, 2, 3]
    assert events[0] == job_end(1)
    assert len(spool.pending()) == 3  # not gone until committed
    commit()
    assert spool.pending() == []
    assert spool.take("n2")[0] == []


def test_a_crash_before_commit_sends_them_again(tmp_path):
    HookSpool(tmp_path).put(job_end(7))
    events, _commit = HookSpool(tmp_path).take("n2")  # the sidecar dies here
    again, commit = HookSpool(tmp_path).take("n2")  # the next one
    assert events == again and [e["job_id"] for e in again] == [7]
    commit()
    assert HookSpool(tmp_path).pending() == []


def test_files_being_written_are_ignored(tmp_path):
    spool = HookSpool(tmp_path)
    spool.put(job_end(1))
    (tmp_path / "events" / "half.json.tmp").write_text('{"kind": "job_')
    (tmp_path / "events" / "README").write_text("not an event")
    events, commit = spool.take("n2")
    assert [e["job_id"] for e in events] == [1]
    commit()
    assert (tmp_path / "events" / "half.json.tmp").exists()
    assert spool.bad == 0


def test_an_event_without_node_is_about_this_node(tmp_path):
    spool = HookSpool(tmp_path)
    spool.put(job_end(1, node=None))
    (event,), _ = spool.take("n2")
    assert event["node"] == "n2"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (json.dumps(job_end(1, node="n3")).encode(), "this sidecar speaks for n2"),
        (json.dumps({**job_end(1), "observed_at": "yesterday"}).encode(), "observed_at"),
        (json.dumps({**job_end(1), "colour": "red"}).encode(), "unknown field"),
        (b" " * (64 * 1024 + 1), "larger than"),
    ],
)
def test_malformed_files_are_quarantined_and_counted(tmp_path, caplog, content, why):
    spool = HookSpool(tmp_path)
    spool.put(job_end(1))
    (tmp_path / "events" / "00-bad.json").write_bytes(content)
    spool.put(job_end(2))
    events, commit = spool.take("n2")
    assert [e["job_id"] for e in events] == [1, 2]  # the good ones still go
    assert spool.bad == 1
    assert (tmp_path / "events" / "bad" / "00-bad.json").read_bytes() == content
    assert why in caplog.text
    commit()
    assert spool.pending() == []


def test_take_is_bounded(tmp_path):
    spool = HookSpool(tmp_path)
    for i in range(1, 6):
        spool.put(job_end(i))
    events, commit = spool.take("n2", limit=2)
    assert [e["job_id"] for e in events] == [1, 2]
    commit()
    assert [e["job_id"] for e in spool.take("n2")[0]] == [3, 4, 5]


def test_a_writable_by_others_spool_is_refused(tmp_path):
    spool = HookSpool(tmp_path)
    source = SpoolSource(spool, "n2")  # creates the directories
    assert oct(os.stat(tmp_path / "events").st_mode & 0o777) == "0o755"
    os.chmod(tmp_path / "events", 0o777)
    with pytest.raises(SpoolError, match="chmod 755"):
        spool.check()
    with pytest.raises(SpoolError):  # the sidecar logs it and reports it in its status
        source.poll(NOW)
    with pytest.raises(SpoolError, match="writable by group or others"):
        SpoolSource(spool, "n2")


def test_source_hands_findings_with_the_hook_role_and_commits_after(tmp_path):
    spool = HookSpool(tmp_path)
    source = SpoolSource(spool, "n2")
    assert (source.name, source.fast, source.role) == ("hook_spool", True, "hook")
    spool.put(job_end(4))
    (finding,) = source.poll(NOW)
    assert finding.to_event("n2") == job_end(4)
    assert len(spool.pending()) == 1
    source.commit()
    assert spool.pending() == []
    source.commit()  # nothing taken: nothing happens
    assert source.poll(NOW) == []
