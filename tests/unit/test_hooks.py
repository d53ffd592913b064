"""The job hooks without Slurm: environment -> event, exit codes, the spool, the health gate,
the controller path, and "exit 0 whatever goes wrong". The real cluster runs them in
tests/integration/test_hooks.py."""

from __future__ import annotations

import io
import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery import config as cfg
from slurm_recovery import hooks
from slurm_recovery.contract import jobdir, settings
from slurm_recovery.contract.outputs import expand_output_path
from slurm_recovery.contract.settings import HOOK_CHECKS
from slurm_recovery.contract.spool import HookSpool, read_spooled, spool_event
from slurm_recovery.contract.wire import parse_event

NOW = 1_800_000_000.0
REPO = Path(__file__).resolve().parents[2]

# What slurmd 22.05 gives the node prolog/epilog (recorded on the local cluster).
PROLOG_2205 = {
    "SLURMD_NODENAME": "n2",
    "SLURM_CLUSTER_NAME": "srlocal",
    "SLURM_JOBID": "41",
    "SLURM_JOB_GID": "1000",
    "SLURM_JOB_ID": "41",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_PARTITION": "debug",
    "SLURM_JOB_RESTART_COUNT": "0",
    "SLURM_JOB_STDIN": "/dev/null",
    "SLURM_JOB_STDOUT": "/home/alice/logs/train-%j.out",
    "SLURM_JOB_UID": "1000",
    "SLURM_JOB_USER": "alice",
    "SLURM_JOB_WORK_DIR": "/home/alice",
    "SLURM_NODELIST": "n[1-2]",
    "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
}
EPILOG_2205 = {
    **PROLOG_2205,
    "SLURM_SCRIPT_CONTEXT": "epilog_slurmd",
    "SLURM_JOB_EXIT_CODE": "768",
    "SLURM_JOB_EXIT_CODE2": "3:0",
    "SLURM_JOB_DERIVED_EC": "0",
}
# What slurmstepd 22.05 gives the TaskProlog of the batch step (the job's environment besides;
# recorded on the local cluster).
TASK_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "SLURMD_NODENAME": "n2",
    "SLURM_JOBID": "41",
    "SLURM_JOB_GID": "1000",
    "SLURM_JOB_ID": "41",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_JOB_UID": "1000",
    "SLURM_JOB_USER": "alice",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_SCRIPT_CONTEXT": "prolog_task",
    "SLURM_STEP_ID": "0",
}
# What slurmctld 22.05 gives EpilogSlurmctld.
CTLD_2205 = {
    "SLURM_CLUSTER_NAME": "srlocal",
    "SLURM_JOBID": "41",
    "SLURM_JOB_ID": "41",
    "SLURM_JOB_NAME": "train",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_JOB_PARTITION": "debug",
    "SLURM_JOB_RESTART_COUNT": "2",
    "SLURM_JOB_STDOUT": "slurm-%j.out",
    "SLURM_JOB_USER": "alice",
    "SLURM_JOB_WORK_DIR": "/home/alice",
    "SLURM_JOB_EXIT_CODE": "9",
    "SLURM_JOB_EXIT_CODE2": "0:9",
    "SLURM_JOB_DERIVED_EC": "34304",
    "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld",
}


def make_config(tmp_path: Path, **sections: dict) -> hooks.HookConfig:
    """The hooks' settings as a config file with these sections would give them."""
    data = {
        "sidecar": {"spool_dir": f"{tmp_path}/spool/{{node}}", "poll_interval": 10},
        "controller": {
            "spool_dir": f"{tmp_path}/ctl-spool",
            "policy": f"{tmp_path}/policy.toml",
        },
        "client": {"url": "http://127.0.0.1:9"},
        "hooks": {"controller_timeout": 0.5, "job_dir": f"{tmp_path}/jobs/{{node}}"},
    }
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    values = {
        f"{section}.{key}": HOOK_CHECKS[f"{section}.{key}"](value)
        for section, table in data.items()
        for key, value in table.items()
    }
    return hooks.HookConfig(values)


def node_events(tmp_path: Path, node: str = "n2") -> list[dict]:
    return read_spooled(tmp_path / "spool" / node)


def config_file(tmp_path: Path, extra: str = "", folder: Path | None = None) -> Path:
    """A config file with the node spool and the job directories under ``tmp_path``."""
    path = (folder or tmp_path) / "config.toml"
    path.write_text(
        f'[sidecar]\nspool_dir = "{tmp_path}/spool/{{node}}"\n'
        f'[hooks]\njob_dir = "{tmp_path}/jobs/{{node}}"\n{extra}'
    )
    return path


# --------------------------------------------------------------------------------- env -> event


def test_prolog_event_from_2205_environment():
    event = hooks.build_event("prolog", PROLOG_2205, NOW, node="n2")
    assert event == {
        "kind": "job_start",
        "observed_at": NOW,
        "job_id": 41,
        "node": "n2",
        "payload": {
            "nodes": ["n1", "n2"],
            "restart_count": 0,
            "context": "prolog",
            "stdout": "/home/alice/logs/train-41.out",
            "partition": "debug",
        },
    }


def test_newer_slurm_job_nodelist_wins_over_nodelist():
    env = {**PROLOG_2205, "SLURM_JOB_NODELIST": "gpu[001-003]", "SLURM_NODELIST": "n1"}
    assert hooks.build_event("prolog", env, NOW)["payload"]["nodes"] == [
        "gpu001",
        "gpu002",
        "gpu003",
    ]
    env = {k: v for k, v in PROLOG_2205.items() if k != "SLURM_NODELIST"}
    env["SLURM_JOB_NODELIST"] = "n4"
    assert hooks.build_event("prolog", env, NOW)["payload"]["nodes"] == ["n4"]


def test_old_jobid_variable_and_missing_optional_variables():
    env = {"SLURM_JOBID": "7", "SLURMD_NODENAME": "n1"}
    event = hooks.build_event("epilog", env, NOW, node="n1")
    assert event["job_id"] == 7
    assert event["payload"] == {
        "nodes": [],
        "restart_count": 0,
        "context": "epilog",
        "exit_code": None,
        "signal": None,
    }


@pytest.mark.parametrize("value", [None, "", "abc", "0", "-3", "1.5", "99999999999999999999"])
def test_no_job_id_is_an_error(value):
    env = {} if value is None else {"SLURM_JOB_ID": value}
    with pytest.raises(hooks.HookError, match="SLURM_JOB_ID"):
        hooks.build_event("prolog", env, NOW)


def test_unparsable_nodelist_is_kept_as_text():
    env = {**PROLOG_2205, "SLURM_NODELIST": "n[1-"}
    payload = hooks.build_event("prolog", env, NOW)["payload"]
    assert payload["nodes"] == [] and payload["nodelist"] == "n[1-"


def test_restart_count_and_array_ids():
    env = {
        **PROLOG_2205,
        "SLURM_JOB_RESTART_COUNT": "3",
        "SLURM_ARRAY_JOB_ID": "40",
        "SLURM_ARRAY_TASK_ID": "1",
        "SLURM_JOB_STDOUT": "out-%A_%a.log",
    }
    payload = hooks.build_event("prolog", env, NOW)["payload"]
    assert payload["restart_count"] == 3
    assert (payload["array_job_id"], payload["array_task_id"]) == (40, 1)
    assert payload["stdout"] == "/home/alice/out-40_1.log"
    env["SLURM_JOB_RESTART_COUNT"] = "lots"
    assert hooks.build_event("prolog", env, NOW)["payload"]["restart_count"] == 0


@pytest.mark.parametrize(
    ("env", "gpus"),
    [
        ({"SLURM_JOB_GPUS": "0,1,3"}, [0, 1, 3]),
        ({"CUDA_VISIBLE_DEVICES": "2"}, [2]),
        ({"SLURM_JOB_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "0,1"}, [4, 5]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-8d1e,GPU-77aa"}, ["GPU-8d1e", "GPU-77aa"]),
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, None),
        ({"CUDA_VISIBLE_DEVICES": ""}, None),
        ({}, None),
    ],
)
def test_gpus(env, gpus):
    payload = hooks.build_event("prolog", {**PROLOG_2205, **env}, NOW)["payload"]
    assert payload.get("gpus") == gpus


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("/abs/out-%j.txt", "/abs/out-41.txt"),
        ("rel/%x-%j.out", "/home/alice/rel/train-41.out"),
        ("/o/%8j.out", "/o/00000041.out"),
        ("/o/100%%-%u.out", "/o/100%-alice.out"),
        ("/o/%N-%n-%t-%s.out", "/o/%N-0-0-batch.out"),  # no nodes given: %N unknown
        ("/o/lit\\%j.out", "/o/lit%j.out"),  # a backslash turns expansion off
        ("/o/%20j", "/o/0000000041"),  # sbatch pads to 10 digits at most
        ("/o/%A_%a.out", "/o/41_4294967294.out"),  # not an array job: as Slurm writes it
        ("(null)", None),
        ("", None),
    ],
)
def test_output_path(pattern, expected):
    env = {"SLURM_JOB_ID": "41", "SLURM_JOB_USER": "alice", "SLURM_JOB_NAME": "train"}
    env["SLURM_JOB_WORK_DIR"] = "/home/alice"
    assert hooks.output_path(pattern, env) == expected


_PATH_TEXT = st.text(st.characters(codec="ascii", exclude_characters="\x00/"), max_size=12)


@given(
    parts=st.lists(
        st.one_of(_PATH_TEXT, st.sampled_from(["%j", "%J", "%u", "%x", "%A", "%a", "%b", "%N"])),
        max_size=6,
    ),
    absolute=st.booleans(),
    job=st.integers(1, 2**31),
    array=st.one_of(st.none(), st.tuples(st.integers(1, 2**31), st.integers(0, 5000))),
)
def test_the_hooks_environment_gives_the_path_slurms_job_record_gives(parts, absolute, job, array):
    pattern = ("/o/" if absolute else "") + "".join(parts)
    env = {
        "SLURM_JOB_ID": str(job),
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_NAME": "train",
        "SLURM_JOB_WORK_DIR": "/home/alice",
    }
    kwargs = dict(job_id=job, name="train", user="alice", workdir="/home/alice", batch_host="n3")
    if array:
        env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"] = map(str, array)
        kwargs["array_job_id"], kwargs["array_task_id"] = array
    ours = hooks.output_path(pattern, env, ["n3", "n4"])
    if not pattern:
        assert ours is None
        return
    assert str(PurePosixPath(ours)) == expand_output_path(pattern, **kwargs)


def test_epilog_event_has_exit_codes():
    event = hooks.build_event("epilog", EPILOG_2205, NOW, node="n2")
    assert event["kind"] == "job_end" and event["node"] == "n2"
    payload = event["payload"]
    assert payload["context"] == "epilog"
    assert (payload["exit_code"], payload["signal"]) == (3, 0)
    assert (payload["exit_status"], payload["exit_code2"]) == (768, "3:0")
    assert (payload["derived_exit_code"], payload["derived_signal"]) == (0, 0)
    assert payload["nodes"] == ["n1", "n2"]


def test_epilog_slurmctld_event_is_about_the_job_not_a_node():
    event = hooks.build_event("epilog_slurmctld", CTLD_2205, NOW, node="head")
    assert "node" not in event
    assert event["kind"] == "job_end"
    payload = event["payload"]
    assert payload["context"] == "epilog_slurmctld"
    assert payload["nodes"] == ["n1", "n2"]
    assert payload["restart_count"] == 2
    assert (payload["exit_code"], payload["signal"]) == (0, 9)
    assert (payload["derived_exit_code"], payload["derived_signal"]) == (134, 0)
    assert payload["stdout"] == "/home/alice/slurm-41.out"


def batch_node_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The prolog's environment on the batch node (n1) of a job writing into ``tmp_path``."""
    return {
        **PROLOG_2205,
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_WORK_DIR": str(tmp_path),
        "SLURM_JOB_STDOUT": "train-%j.out",
        "SLURM_JOB_STDERR": "train-%j.err",
        **extra,
    }


def test_prolog_on_the_batch_node_records_where_the_attempts_output_begins(tmp_path):
    """A requeued job appending to its output (--open-mode=append): the prolog, which runs
    before the batch step opens the files, records their sizes; a file not there yet begins
    at 0."""
    (tmp_path / "train-41.out").write_bytes(b"attempt 0\n[rank1]: KeyError: 'sample_20'\n")
    env = batch_node_env(tmp_path, SLURM_JOB_RESTART_COUNT="1")
    payload = hooks.build_event("prolog", env, NOW, node="n1")["payload"]
    assert payload["stdout"] == f"{tmp_path}/train-41.out"
    assert payload["stdout_offset"] == len(b"attempt 0\n[rank1]: KeyError: 'sample_20'\n")
    assert payload["stdout_mtime"] == os.stat(payload["stdout"]).st_mtime  # to tell truncation
    assert payload["stderr"] == f"{tmp_path}/train-41.err"
    assert payload["stderr_offset"] == 0  # no such file yet: the attempt's output is all of it
    # the other nodes' prologs and the epilogs do not look at the files
    assert "stdout_offset" not in hooks.build_event("prolog", env, NOW, node="n2")["payload"]
    for hook in ("epilog", "epilog_slurmctld"):
        assert "stdout_offset" not in hooks.build_event(hook, env, NOW, node="n1")["payload"]


def test_prolog_never_opens_or_follows_what_the_user_put_in_the_outputs_place(tmp_path):
    """The prolog is root on a path the user chose: a FIFO is not opened (it would block), a
    link is not followed, a directory or a relative path gives no offset (the sidecar then
    takes the file's size when it learns of the job)."""
    os.mkfifo(tmp_path / "train-41.out")
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 123)
    (tmp_path / "train-41.err").symlink_to(secret)
    env = batch_node_env(tmp_path)
    payload = hooks.build_event("prolog", env, NOW, node="n1")["payload"]  # returns at once
    assert "stdout_offset" not in payload and "stderr_offset" not in payload
    assert hooks.output_offset(str(tmp_path)) is None  # a directory
    assert hooks.output_offset("relative/train.out") is None
    assert hooks.output_offset(f"{tmp_path}/no/such/dir/train.out") == 0
    assert hooks.output_offset(f"{secret}/below-a-file") is None
    assert hooks.output_offset("/tmp/with\0nul") is None
    assert hooks.output_offset(None) is None


def test_prolog_offset_reaches_the_sidecar_through_the_spool(tmp_path):
    (tmp_path / "train-41.out").write_bytes(b"0123456789\n")
    env = batch_node_env(tmp_path)
    assert hooks.run_hook("prolog", env, now=NOW, config=make_config(tmp_path)) == 0
    (event,) = node_events(tmp_path, "n1")
    assert event["payload"]["stdout_offset"] == 11
    events, _ = HookSpool(make_config(tmp_path).sidecar_spool("n1")).take("n1")
    assert [(e["kind"], e["payload"]["stdout_offset"]) for e in events] == [("job_start", 11)]


@pytest.mark.parametrize("hook", hooks.EVENT_HOOKS)
@pytest.mark.parametrize("env", [PROLOG_2205, EPILOG_2205, CTLD_2205])
def test_every_event_passes_the_controllers_wire_check(hook, env):
    event = hooks.build_event(hook, env, time.time(), node="n2")
    evidence = parse_event(json.loads(json.dumps(event)), "event")
    assert evidence.job_id == 41 and evidence.kind == hooks.KIND[hook]


# --------------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize(
    ("raw", "decoded"),
    [
        ("0", (0, 0)),
        ("256", (1, 0)),
        ("768", (3, 0)),
        ("65280", (255, 0)),
        ("9", (0, 9)),
        ("15", (0, 15)),
        ("139", (0, 11)),  # SIGSEGV with a core dump
        ("4991", (0, 19)),  # stopped by SIGSTOP
        (" 768 ", (3, 0)),
        (None, None),
        ("", None),
        ("-1", None),
        ("3:0", None),
        ("4294967296", None),
    ],
)
def test_decode_wait_status(raw, decoded):
    assert hooks.decode_wait_status(raw) == decoded


@given(st.integers(min_value=0, max_value=0xFFFF))
def test_decode_wait_status_agrees_with_os(status):
    exit_code, signo = hooks.decode_wait_status(str(status))
    if os.WIFEXITED(status):
        assert (exit_code, signo) == (os.WEXITSTATUS(status), 0)
    elif os.WIFSIGNALED(status):
        assert (exit_code, signo) == (0, os.WTERMSIG(status))
    elif os.WIFSTOPPED(status):
        assert (exit_code, signo) == (0, os.WSTOPSIG(status))


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [("3:0", (3, 0)), ("0:9", (0, 9)), (" 255:0 ", (255, 0)), ("3", None), ("a:b", None)],
)
def test_parse_exit_code2(raw, parsed):
    assert hooks.parse_exit_code2(raw) == parsed


def test_exit_code2_alone_is_enough():
    fields = hooks.exit_fields({"SLURM_JOB_EXIT_CODE2": "2:0"})
    assert fields == {"exit_code2": "2:0", "exit_code": 2, "signal": 0}
    fields = hooks.exit_fields({"SLURM_JOB_EXIT_CODE": "junk", "SLURM_JOB_EXIT_CODE2": "0:15"})
    assert (fields["exit_code"], fields["signal"]) == (0, 15)
    assert "exit_status" not in fields


def test_raw_status_wins_over_exit_code2():
    fields = hooks.exit_fields({"SLURM_JOB_EXIT_CODE": "512", "SLURM_JOB_EXIT_CODE2": "9:9"})
    assert (fields["exit_code"], fields["signal"]) == (2, 0)


# --------------------------------------------------------------------------------- the spool


def test_spool_write_format_and_atomic_rename(tmp_path):
    event = hooks.build_event("prolog", PROLOG_2205, NOW, node="n2")
    path = Path(spool_event(tmp_path, event))
    assert path.parent == tmp_path / "events"
    stamp, pid, job = path.name.removesuffix(".json").split("-")
    assert len(stamp) == 20 and int(pid) == os.getpid() and job == "41"
    assert json.loads(path.read_text()) == event
    assert [p.name for p in (tmp_path / "events").iterdir()] == [path.name]  # no .tmp left
    assert path.stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "events").stat().st_mode & 0o022 == 0


def test_spool_failure_leaves_no_partial_file(tmp_path, monkeypatch):
    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hooks.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space"):
        spool_event(tmp_path, {"kind": "job_end", "observed_at": NOW, "job_id": 1})
    assert list((tmp_path / "events").iterdir()) == []


def test_spool_names_sort_in_write_order_and_never_clash(tmp_path):
    written: list[str] = []
    lock = threading.Lock()

    def writer(job: int) -> None:
        for _ in range(20):
            path = spool_event(tmp_path, {"kind": "job_end", "observed_at": NOW, "job_id": job})
            with lock:
                written.append(path)

    threads = [threading.Thread(target=writer, args=(j,)) for j in (1, 2, 3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(written)) == 80
    assert len(read_spooled(tmp_path)) == 80


def test_the_sidecar_reads_what_the_hooks_spool(tmp_path):
    config = make_config(tmp_path)
    assert hooks.run_hook("prolog", PROLOG_2205, now=time.time(), config=config) == 0
    assert hooks.run_hook("epilog", EPILOG_2205, now=time.time(), config=config) == 0
    spool = HookSpool(config.sidecar_spool("n2"))
    events, commit = spool.take("n2")
    assert [e["kind"] for e in events] == ["job_start", "job_end"]
    assert spool.bad == 0
    commit()
    assert spool.pending() == []


def test_node_hooks_write_into_their_nodes_spool(tmp_path):
    config = make_config(tmp_path)
    assert hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=config) == 0
    assert hooks.run_hook("epilog", {**EPILOG_2205, "SLURMD_NODENAME": "n1"}, config=config) == 0
    (start,) = node_events(tmp_path, "n2")
    (end,) = node_events(tmp_path, "n1")
    assert start["kind"] == "job_start" and start["node"] == "n2" and start["observed_at"] == NOW
    assert end["kind"] == "job_end" and end["node"] == "n1"
    assert end["payload"]["exit_code"] == 3


def test_without_slurmd_nodename_the_configured_node_is_used(tmp_path):
    config = make_config(tmp_path, sidecar={"node": "gpu7"})
    env = {k: v for k, v in PROLOG_2205.items() if k != "SLURMD_NODENAME"}
    assert hooks.run_hook("prolog", env, config=config) == 0
    assert node_events(tmp_path, "gpu7")[0]["node"] == "gpu7"


def test_unwritable_spool_still_exits_zero(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    config = make_config(tmp_path, sidecar={"spool_dir": f"{blocker}/{{node}}"})
    for hook, env in (("prolog", PROLOG_2205), ("epilog", EPILOG_2205)):
        assert hooks.run_hook(hook, env, config=config) == 0
    err = capsys.readouterr().err
    assert err.count("cannot spool") == 2
    assert "srecovery-prolog: job 41" in err


def test_no_job_id_exits_zero_with_one_line(tmp_path, capsys):
    assert hooks.run_hook("prolog", {"SLURMD_NODENAME": "n1"}, config=make_config(tmp_path)) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "event dropped" in err


def test_missing_config_file_exits_zero(tmp_path, capsys):
    env = {**PROLOG_2205, "SRECOVERY_CONFIG": str(tmp_path / "nope.toml")}
    assert hooks.run_hook("prolog", env) == 0
    assert "configuration unusable" in capsys.readouterr().err


def test_broken_config_file_exits_zero(tmp_path, capsys):
    bad = tmp_path / "config.toml"
    bad.write_text("[hooks]\nhealth_gate = maybe\n")
    env = {**PROLOG_2205, "SRECOVERY_CONFIG": str(bad)}
    assert hooks.run_hook("prolog", env) == 0
    assert "configuration unusable" in capsys.readouterr().err


def test_config_is_found_through_srecovery_config(tmp_path):
    env = {**PROLOG_2205, "SRECOVERY_CONFIG": str(config_file(tmp_path))}
    assert hooks.run_hook("prolog", env) == 0
    assert node_events(tmp_path)[0]["job_id"] == 41


def test_unexpected_bug_exits_zero(tmp_path, monkeypatch, capsys):
    def boom(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(hooks, "build_event", boom)
    monkeypatch.setattr(hooks, "task_prolog_lines", boom)
    for hook in hooks.HOOKS:
        assert hooks.run_hook(hook, PROLOG_2205, config=make_config(tmp_path)) == 0
    assert capsys.readouterr().err.count("unexpected RuntimeError: a bug") == 4


def test_main_swallows_even_base_exceptions(monkeypatch):
    def interrupted(hook):
        raise KeyboardInterrupt

    monkeypatch.setattr(hooks, "run_hook", interrupted)
    assert hooks.main("prolog") == 0


def test_unknown_hook_exits_zero(tmp_path):
    assert hooks.run_hook("jobcomp", PROLOG_2205, config=make_config(tmp_path)) == 0


# --------------------------------------------------------------------------------- health gate


def write_health(tmp_path: Path, node: str = "n2", **fields) -> Path:
    health = {
        "updated_at": NOW - 5,
        "node": node,
        "fatal": [{"check": "ecc_dbe", "gpu": 3, "since": NOW - 60, "detail": "DBE +2"}],
        **fields,
    }
    path = tmp_path / "spool" / node / hooks.HEALTH_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(health))
    return path


def write_policy(tmp_path: Path, text: str = 'mode = "act"\n') -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    path.chmod(0o644)


def gate(tmp_path: Path, partition: str = "debug", now: float = NOW, **hooks_keys):
    config = make_config(tmp_path, hooks={"health_gate": True, **hooks_keys})
    return hooks.gate_decision(config, "n2", partition, now)


def test_gate_refuses_a_fresh_fatal_finding_in_act_mode(tmp_path):
    write_health(tmp_path)
    write_policy(tmp_path)
    refuse, why, fatal = gate(tmp_path)
    assert refuse
    assert why == "node n2 has open fatal GPU findings: ecc_dbe on GPU 3 (DBE +2)"
    assert fatal[0]["check"] == "ecc_dbe"


def test_refusal_exits_1_and_spools_the_reason(tmp_path, capsys):
    write_health(tmp_path)
    write_policy(tmp_path)
    config = make_config(tmp_path, hooks={"health_gate": True})
    assert hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=config) == hooks.EXIT_REFUSE
    (event,) = node_events(tmp_path)
    assert event["kind"] == "job_start"
    gate_info = event["payload"]["health_gate"]
    assert gate_info["refused"] is True and "ecc_dbe" in gate_info["reason"]
    err = capsys.readouterr().err
    assert "refusing job 41" in err
    assert "allowed" not in err  # one line, and it says what happened
    assert not job_dir(tmp_path).exists()  # the job does not start here


def test_the_epilog_never_gates(tmp_path):
    write_health(tmp_path)
    write_policy(tmp_path)
    config = make_config(tmp_path, hooks={"health_gate": True})
    assert hooks.run_hook("epilog", EPILOG_2205, now=NOW, config=config) == 0


# ------------------------------------------------- the epilog gate (25.11+ fast path)


def epilog_gate(tmp_path: Path, failed: bool = True, now: float = NOW, **hooks_keys):
    config = make_config(tmp_path, hooks={"epilog_gate": True, **hooks_keys})
    return hooks.epilog_gate_decision(config, "n2", "debug", failed, now, sleep=lambda s: None)


def test_the_epilog_fails_on_a_proven_fault_in_act_mode(tmp_path, capsys):
    write_health(tmp_path)
    write_policy(tmp_path)
    config = make_config(tmp_path, hooks={"epilog_gate": True})
    assert hooks.run_hook("epilog", EPILOG_2205, now=NOW, config=config) == hooks.EXIT_REFUSE
    (event,) = node_events(tmp_path)  # the job_end is still sent, before the gate decides
    assert event["kind"] == "job_end"
    err = capsys.readouterr().err
    assert "so that Slurm drains n2" in err and "ecc_dbe on GPU 3" in err


def test_the_epilog_gate_is_off_by_default_and_monitor_mode_passes(tmp_path):
    write_health(tmp_path)
    write_policy(tmp_path)
    assert hooks.run_hook("epilog", EPILOG_2205, now=NOW, config=make_config(tmp_path)) == 0
    write_policy(tmp_path, 'mode = "monitor"\n')
    fail, why, fatal = epilog_gate(tmp_path)
    assert not fail and fatal and "monitor mode" in why
    config = make_config(tmp_path, hooks={"epilog_gate": True})
    assert hooks.run_hook("epilog", EPILOG_2205, now=NOW, config=config) == 0


def test_the_prolog_gate_does_not_fail_epilogs_nor_the_epilog_gate_prologs(tmp_path):
    write_health(tmp_path)
    write_policy(tmp_path)
    config = make_config(tmp_path, hooks={"epilog_gate": True})
    assert hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=config) == 0


@pytest.mark.parametrize(
    "trouble", ["missing", "stale", "other_node", "not_json", "no_policy", "crash"]
)
def test_the_epilog_gate_fails_open(tmp_path, monkeypatch, trouble):
    write_policy(tmp_path)
    if trouble == "stale":
        write_health(tmp_path, updated_at=NOW - 3600)
    elif trouble == "other_node":
        path = write_health(tmp_path)
        path.write_text(path.read_text().replace('"node": "n2"', '"node": "n7"'))
    elif trouble == "not_json":
        write_health(tmp_path).write_text("{")
    elif trouble == "no_policy":
        write_health(tmp_path)
        (tmp_path / "policy.toml").unlink()
    elif trouble == "crash":
        write_health(tmp_path)

        def boom(*args, **kwargs):
            raise RuntimeError("a bug")

        monkeypatch.setattr(hooks, "_judge_health", boom)
    config = make_config(tmp_path, hooks={"epilog_gate": True, "epilog_gate_wait": 0})
    assert hooks.run_hook("epilog", EPILOG_2205, now=NOW, config=config) == 0
    assert node_events(tmp_path)[0]["kind"] == "job_end"  # the event is never lost


def test_a_failed_job_waits_briefly_for_the_finding_a_good_one_does_not(tmp_path):
    """The XID that ended the job may reach health.json a fast tick after the job's end."""
    write_policy(tmp_path)
    write_health(tmp_path, fatal=[])
    config = make_config(tmp_path, hooks={"epilog_gate": True, "epilog_gate_wait": 1.0})
    clock = iter(x * 0.05 for x in range(1000))
    reads = []
    xid_comes = [True]

    def sleep(seconds):
        reads.append(seconds)
        if len(reads) == 3 and xid_comes[0]:  # the sidecar lists the XID meanwhile
            write_health(tmp_path)

    def decide(failed):
        return hooks.epilog_gate_decision(
            config, "n2", "debug", failed, NOW, clock=lambda: next(clock), sleep=sleep
        )

    assert decide(failed=False)[0] is False and reads == []
    fail, why, fatal = decide(failed=True)
    assert "n2" in why and "fatal" in why, why
    assert fail and fatal and len(reads) == 3
    write_health(tmp_path, fatal=[])
    reads.clear()
    xid_comes[0] = False
    fail, _why, fatal = decide(failed=True)  # nothing comes: gives up after the wait
    assert not fail and not fatal
    assert 0.9 <= sum(reads) <= 1.0 + hooks.EPILOG_GATE_POLL


def test_a_failed_jobs_wait_ends_once_the_sidecar_read_its_sources_after_the_job_end(tmp_path):
    """A healthy node's Epilog need not sit out the whole wait: once the sidecar has read the
    fault sources after the job_end reached its spool (fast_read_at) and lists nothing, no
    finding is coming. A read from before the job_end, or none at all, does not end it."""
    write_policy(tmp_path)
    config = make_config(tmp_path, hooks={"epilog_gate": True, "epilog_gate_wait": 1.0})
    clock = iter(x * 0.05 for x in range(1000))
    reads = []

    def sleep(seconds):
        reads.append(seconds)
        if len(reads) == 2:  # the sidecar's next fast tick, after the job_end was spooled
            write_health(tmp_path, fatal=[], fast_read_at=NOW + 0.3)

    def decide(spooled_at):
        reads.clear()
        return hooks.epilog_gate_decision(
            config,
            "n2",
            "debug",
            True,
            NOW,
            spooled_at=spooled_at,
            clock=lambda: next(clock),
            sleep=sleep,
        )

    write_health(tmp_path, fatal=[], fast_read_at=NOW - 5)  # read before the job ended
    fail, why, fatal = decide(spooled_at=NOW + 0.1)
    assert not fail and not fatal and why == "no open fatal finding"
    assert len(reads) == 2, reads  # ended at the first read after the spool, not at 1 s
    write_health(tmp_path, fatal=[], fast_read_at=NOW - 5)
    decide(spooled_at=NOW + 0.5)  # the tick of NOW + 0.3 came before this job_end: waits on
    assert 0.9 <= sum(reads) <= 1.0 + hooks.EPILOG_GATE_POLL
    write_health(tmp_path, fatal=[], fast_read_at=True)  # not a time
    decide(spooled_at=None)  # the job_end could not be spooled: the whole wait
    assert 0.9 <= sum(reads) <= 1.0 + hooks.EPILOG_GATE_POLL


def test_job_failed_reads_slurms_exit_codes():
    assert hooks.job_failed(EPILOG_2205)  # exit 3
    assert not hooks.job_failed(
        {**EPILOG_2205, "SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_EXIT_CODE2": "0:0"}
    )
    assert hooks.job_failed({**EPILOG_2205, "SLURM_JOB_EXIT_CODE": "9"})  # SIGKILL
    assert not hooks.job_failed(PROLOG_2205)  # no exit code given: not known to have failed


def test_gate_off_never_refuses(tmp_path):
    write_health(tmp_path)
    write_policy(tmp_path)
    config = make_config(tmp_path)
    assert hooks.gate_decision(config, "n2", "debug", NOW)[:2] == (False, "health gate off")
    assert hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=config) == 0


def test_gate_in_monitor_mode_allows(tmp_path):
    write_health(tmp_path)
    write_policy(tmp_path, 'mode = "monitor"\n')
    refuse, why, fatal = gate(tmp_path)
    assert not refuse and "monitor mode" in why and fatal
    assert "would refuse node n2: open fatal GPU findings: ecc_dbe on GPU 3" in why


def test_monitor_mode_logs_what_the_gate_would_have_done(tmp_path, capsys):
    write_health(tmp_path)
    write_policy(tmp_path, 'mode = "monitor"\n')
    config = make_config(tmp_path, hooks={"health_gate": True})
    assert hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=config) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "job 41 allowed on n2" in err and "would refuse" in err
    assert "health_gate" not in node_events(tmp_path)[0]["payload"]


def test_gate_follows_the_partitions_mode(tmp_path):
    write_health(tmp_path)
    write_policy(tmp_path, 'mode = "monitor"\n[partitions.gpu]\nmode = "act"\n')
    assert gate(tmp_path, partition="gpu")[0]
    assert not gate(tmp_path, partition="debug")[0]
    assert not gate(tmp_path, partition="gpu,debug")[0]


@pytest.mark.parametrize(
    "setup",
    [
        "missing",
        "stale",
        "future",
        "corrupt",
        "not_object",
        "no_timestamp",
        "bad_fatal",
        "other_node",
        "no_fatal",
        "huge",
        "directory",
    ],
)
def test_gate_fails_open_on_health_file_trouble(tmp_path, setup):
    write_policy(tmp_path)
    if setup != "missing":
        path = write_health(tmp_path)
        if setup == "stale":
            write_health(tmp_path, updated_at=NOW - 31)  # 3 x 10 s poll interval
        elif setup == "future":
            write_health(tmp_path, updated_at=NOW + 3600)
        elif setup == "corrupt":
            path.write_text('{"updated_at": 17')
        elif setup == "not_object":
            path.write_text("[1, 2]")
        elif setup == "no_timestamp":
            path.write_text(json.dumps({"fatal": [{"check": "gpu_lost"}]}))
        elif setup == "bad_fatal":
            write_health(tmp_path, fatal="gpu_lost")
        elif setup == "other_node":
            path.write_text(json.dumps({"updated_at": NOW, "node": "n9", "fatal": [{}]}))
        elif setup == "no_fatal":
            write_health(tmp_path, fatal=[])
        elif setup == "huge":
            path.write_text(" " * (hooks.MAX_HEALTH_BYTES + 1))
        elif setup == "directory":
            path.unlink()
            path.mkdir()
    refuse, why, _ = gate(tmp_path)
    assert not refuse, why


def test_gate_freshness_boundary(tmp_path):
    write_policy(tmp_path)
    write_health(tmp_path, updated_at=NOW - 29.9)
    assert gate(tmp_path)[0]
    assert not gate(tmp_path, now=NOW + 0.2)[0]


@pytest.mark.parametrize(
    "policy", [None, 'mode = "actt"\n', "mode = \n", "world-writable", "directory"]
)
def test_gate_fails_open_when_the_policy_cannot_be_read(tmp_path, policy):
    write_health(tmp_path)
    path = tmp_path / "policy.toml"
    if policy == "world-writable":
        write_policy(tmp_path)
        path.chmod(0o666)
    elif policy == "directory":
        path.mkdir()
    elif policy is not None:
        write_policy(tmp_path, policy)
    refuse, why, fatal = gate(tmp_path)
    assert not refuse and "cannot read the policy" in why and fatal


def test_gate_crash_fails_open(tmp_path, monkeypatch, capsys):
    write_health(tmp_path)
    write_policy(tmp_path)

    def boom(*args):
        raise RuntimeError("gate bug")

    monkeypatch.setattr(hooks, "gate_decision", boom)
    config = make_config(tmp_path, hooks={"health_gate": True})
    assert hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=config) == 0
    assert "failing open" in capsys.readouterr().err
    assert "health_gate" not in node_events(tmp_path)[0]["payload"]


def test_gate_refuses_even_when_the_event_cannot_be_spooled(tmp_path):
    write_health(tmp_path)
    write_policy(tmp_path)
    events = tmp_path / "spool" / "n2" / "events"
    events.write_text("a file where the directory should be")
    config = make_config(tmp_path, hooks={"health_gate": True})
    assert hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=config) == 1


# --------------------------------------------------------------------------------- EpilogSlurmctld


def test_ctld_posts_to_the_controller(tmp_path, monkeypatch):
    sent = []
    monkeypatch.setattr(hooks, "post_event", lambda config, event: sent.append(event))
    config = make_config(tmp_path)
    assert hooks.run_hook("epilog_slurmctld", CTLD_2205, now=NOW, config=config) == 0
    assert sent == [hooks.build_event("epilog_slurmctld", CTLD_2205, NOW)]
    assert read_spooled(config["controller.spool_dir"]) == []


def test_ctld_spools_when_the_controller_is_down(tmp_path, capsys):
    config = make_config(tmp_path, client={"url": f"http://127.0.0.1:{free_port()}"})
    started = time.monotonic()
    assert hooks.run_hook("epilog_slurmctld", CTLD_2205, now=NOW, config=config) == 0
    assert time.monotonic() - started < 2
    (event,) = read_spooled(config["controller.spool_dir"])
    assert event == hooks.build_event("epilog_slurmctld", CTLD_2205, NOW)
    assert "spooled" in capsys.readouterr().err


def test_ctld_exits_zero_when_it_can_neither_post_nor_spool(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    config = make_config(tmp_path, controller={"spool_dir": str(blocker)})
    assert hooks.run_hook("epilog_slurmctld", CTLD_2205, config=config) == 0
    assert "event lost" in capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_munge(monkeypatch):
    """Requests go unsigned (no munged in unit tests); the client code path is otherwise real."""
    from slurm_recovery.contract import requests

    monkeypatch.setattr(requests, "sign", lambda *args, **kwargs: {})


def test_ctld_gives_up_on_a_silent_controller_within_the_timeout(tmp_path, no_munge):
    with socket.socket() as server:  # accepts connections, never answers
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        config = make_config(tmp_path, client={"url": url}, hooks={"controller_timeout": 0.3})
        started = time.monotonic()
        assert hooks.run_hook("epilog_slurmctld", CTLD_2205, now=NOW, config=config) == 0
        elapsed = time.monotonic() - started
    assert elapsed < 1.0
    assert len(read_spooled(config["controller.spool_dir"])) == 1


def test_deadline_bounds_a_slow_block_in_the_main_thread():
    started = time.monotonic()
    with pytest.raises(TimeoutError), hooks._deadline(0.2):
        time.sleep(5)
    assert time.monotonic() - started < 1


def test_ctld_posts_the_event_as_json(tmp_path, no_munge):
    import http.server

    bodies = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            bodies.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"accepted": 1}')

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        config = make_config(tmp_path, client={"url": f"http://127.0.0.1:{server.server_port}"})
        assert hooks.run_hook("epilog_slurmctld", CTLD_2205, now=NOW, config=config) == 0
    finally:
        server.shutdown()
    ((path, body),) = bodies
    assert path == "/v1/evidence"
    assert json.loads(body) == {"events": [hooks.build_event("epilog_slurmctld", CTLD_2205, NOW)]}
    assert read_spooled(config["controller.spool_dir"]) == []


# --------------------------------------------------------------------------------- job directory

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to the job user needs root")


@pytest.fixture
def open_tmp():
    """A temporary directory every user can reach (pytest's own is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="srecovery-jobdir-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def job_dir(tmp_path: Path, job: int = 41, node: str = "n2") -> Path:
    return tmp_path / "jobs" / node / str(job)


@needs_root
def test_prolog_creates_the_job_directory_for_the_job_user(tmp_path):
    old_umask = os.umask(0o077)  # slurmd's umask must not leave the folders closed to users
    try:
        assert hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=make_config(tmp_path)) == 0
    finally:
        os.umask(old_umask)
    st = job_dir(tmp_path).stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1000, 1000, 0o700)
    for folder in (tmp_path / "jobs", tmp_path / "jobs" / "n2"):
        st = folder.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755), folder
    assert node_events(tmp_path)[0]["kind"] == "job_start"


@needs_root
def test_prolog_claims_again_the_directory_of_an_earlier_attempt(tmp_path):
    config = make_config(tmp_path)
    assert hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=config) == 0
    (job_dir(tmp_path) / "progress.jsonl").write_text('{"ts": 1, "step": 1}\n')
    before = job_dir(tmp_path).stat()
    time.sleep(0.02)
    requeued = {**PROLOG_2205, "SLURM_JOB_RESTART_COUNT": "1"}
    assert hooks.run_hook("prolog", requeued, now=NOW, config=config) == 0
    after = job_dir(tmp_path).stat()
    assert after.st_ino == before.st_ino and stat.S_IMODE(after.st_mode) == 0o700
    assert after.st_ctime > before.st_ctime  # the sidecar sees it was claimed again
    assert (job_dir(tmp_path) / "progress.jsonl").exists()


@needs_root
@pytest.mark.parametrize("planted", ["other_users_dir", "symlink", "file"])
def test_prolog_replaces_anything_else_in_the_jobs_place(tmp_path, planted):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not yours")
    root = tmp_path / "jobs" / "n2"
    root.mkdir(parents=True)
    place = root / "41"
    if planted == "other_users_dir":
        place.mkdir()
        (place / "secret").write_text("the last user's")
        os.chown(place, 2000, 2000)
    elif planted == "symlink":
        place.symlink_to(outside)
    else:
        place.write_text("a file")
    assert hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=make_config(tmp_path)) == 0
    st = os.lstat(place)
    assert stat.S_ISDIR(st.st_mode) and (st.st_uid, stat.S_IMODE(st.st_mode)) == (1000, 0o700)
    assert os.listdir(place) == []
    assert sorted(os.listdir(root)) == ["41"]  # nothing left over
    assert (outside / "keep").read_text() == "not yours" and outside.stat().st_uid == 0


def test_prolog_without_the_job_uid_logs_one_line_and_the_job_starts(tmp_path, capsys):
    env = {k: v for k, v in PROLOG_2205.items() if k != "SLURM_JOB_UID"}
    assert hooks.run_hook("prolog", env, now=NOW, config=make_config(tmp_path)) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "job 41: no job directory on n2" in err
    assert "SLURM_JOB_UID" in err
    assert not job_dir(tmp_path).exists()
    assert node_events(tmp_path)[0]["kind"] == "job_start"


@needs_root
def test_prolog_without_the_job_gid_takes_the_users_group(tmp_path):
    nobody = pwd.getpwnam("nobody")
    env = {**PROLOG_2205, "SLURM_JOB_UID": str(nobody.pw_uid)}
    del env["SLURM_JOB_GID"]
    assert hooks.run_hook("prolog", env, now=NOW, config=make_config(tmp_path)) == 0
    st = job_dir(tmp_path).stat()
    assert (st.st_uid, st.st_gid) == (nobody.pw_uid, nobody.pw_gid)


@pytest.mark.parametrize("unsafe", ["world_writable", "other_owner"])
def test_prolog_refuses_a_root_others_could_write_to(tmp_path, capsys, unsafe):
    root = tmp_path / "jobs" / "n2"
    root.mkdir(parents=True)
    if unsafe == "world_writable":
        root.chmod(0o777)
        problem = "writable by group or others"
    else:
        os.chown(root, 2000, 2000)
        problem = "owned by uid 2000"
    assert hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=make_config(tmp_path)) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and problem in err
    assert os.listdir(root) == []
    assert node_events(tmp_path)[0]["kind"] == "job_start"


def task_prolog(tmp_path: Path, env: dict[str, str] = TASK_ENV) -> tuple[int, str]:
    out = io.StringIO()
    code = hooks.run_hook("task_prolog", env, config=make_config(tmp_path), out=out)
    return code, out.getvalue()


@needs_root
def test_task_prolog_exports_the_progress_file_and_the_nccl_dump_prefix(tmp_path, capsys):
    assert hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=make_config(tmp_path)) == 0
    code, out = task_prolog(tmp_path)
    assert code == 0
    where = job_dir(tmp_path)
    assert out == (
        f"export SRECOVERY_PROGRESS_FILE={where}/progress.jsonl\n"
        f"export TORCH_NCCL_DEBUG_INFO_TEMP_FILE={where}/nccl_trace_rank_\n"
    )
    assert capsys.readouterr() == ("", "")
    # what the job's own setting asked for stays
    code, out = task_prolog(tmp_path, {**TASK_ENV, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/t_"})
    assert out == f"export SRECOVERY_PROGRESS_FILE={where}/progress.jsonl\n"
    # what srun carried over from the batch step on another node is replaced
    batch_node = {
        **TASK_ENV,
        "SRECOVERY_PROGRESS_FILE": f"{job_dir(tmp_path, node='n1')}/progress.jsonl",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{job_dir(tmp_path, node='n1')}/nccl_trace_rank_",
    }
    code, out = task_prolog(tmp_path, batch_node)
    assert out.splitlines() == [
        f"export SRECOVERY_PROGRESS_FILE={where}/progress.jsonl",
        f"export TORCH_NCCL_DEBUG_INFO_TEMP_FILE={where}/nccl_trace_rank_",
    ]


def test_task_prolog_without_a_job_directory_prints_nothing(tmp_path, capsys):
    code, out = task_prolog(tmp_path)
    assert (code, out) == (0, "")
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"progress file not set: job 41: no job directory {job_dir(tmp_path)}" in err


@pytest.mark.parametrize(
    "env",
    [
        {k: v for k, v in TASK_ENV.items() if k not in ("SLURM_JOB_ID", "SLURM_JOBID")},
        {**TASK_ENV, "SLURMD_NODENAME": "../../etc"},
    ],
)
def test_task_prolog_refuses_odd_environments_quietly(tmp_path, capsys, env):
    assert task_prolog(tmp_path, env) == (0, "")
    assert "progress file not set" in capsys.readouterr().err


@needs_root
def test_task_prolog_script_runs_as_the_job_user_whatever_the_jobs_python(open_tmp):
    """The real executable, as Slurm runs it: the job user, the job's environment, which here
    has a PATH whose python3 prints rubbish and a PYTHONHOME that breaks any Python started
    without -I."""
    nobody = pwd.getpwnam("nobody")
    config = config_file(open_tmp)
    config.chmod(0o644)
    env = {**PROLOG_2205, "SLURM_JOB_UID": str(nobody.pw_uid), "SLURM_JOB_GID": "0"}
    assert (
        hooks.run_hook(
            "prolog", env, now=NOW, config=hooks.load_hook_config({"SRECOVERY_CONFIG": str(config)})
        )
        == 0
    )
    fake = open_tmp / "bin"
    fake.mkdir(mode=0o755)
    (fake / "python3").write_text("#!/bin/sh\necho export EVIL=1\n")
    (fake / "python3").chmod(0o755)
    script = REPO / "hooks" / "task_prolog" / "srecovery-task-prolog"
    job_env = {
        **TASK_ENV,
        "PATH": f"{fake}:/usr/bin:/bin",
        "PYTHONHOME": "/nonexistent",
        "PYTHONPATH": str(fake),
        "SRECOVERY_CONFIG": str(config),
    }
    if not hooks.runnable_by_everyone(script) or not hooks.runnable_by_everyone("/usr/bin/python3"):
        pytest.skip("this checkout or /usr/bin/python3 is not reachable by other users")
    done = subprocess.run(
        [str(script)], env=job_env, user=nobody.pw_uid, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    where = job_dir(open_tmp)
    assert done.stdout == (
        f"export SRECOVERY_PROGRESS_FILE={where}/progress.jsonl\n"
        f"export TORCH_NCCL_DEBUG_INFO_TEMP_FILE={where}/nccl_trace_rank_\n"
    )
    # another user's job directory: not writable, so nothing is exported
    other = {**job_env, "SLURM_JOB_ID": "42", "SLURM_JOBID": "42"}
    assert (
        hooks.run_hook(
            "prolog",
            {**env, "SLURM_JOB_ID": "42", "SLURM_JOBID": "42", "SLURM_JOB_UID": "1000"},
            now=NOW,
            config=hooks.load_hook_config({"SRECOVERY_CONFIG": str(config)}),
        )
        == 0
    )
    done = subprocess.run(
        [str(script)], env=other, user=nobody.pw_uid, capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stdout) == (0, "")
    assert f"not writable by uid {nobody.pw_uid}" in done.stderr
    # a config file the job user cannot read: nothing exported either
    config.chmod(0o600)
    done = subprocess.run(
        [str(script)], env=job_env, user=nobody.pw_uid, capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stdout) == (0, "")
    assert "configuration unusable" in done.stderr


def test_task_prolog_wrapper_exits_zero_when_its_python_cannot_start(tmp_path):
    wrappers = hooks.write_hook_wrappers(
        tmp_path / "bin", config_file(tmp_path), user_python=tmp_path / "no-such-python"
    )
    text = wrappers["task_prolog"].read_text()
    assert text.rstrip().endswith("exit 0") and "exec " not in text
    done = subprocess.run([str(wrappers["task_prolog"])], env=TASK_ENV, capture_output=True)
    assert (done.returncode, done.stdout) == (0, b"")
    assert b"no-such-python" in done.stderr


def test_python_for_job_users_prefers_one_everyone_can_run(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    python = private / "python3"
    python.symlink_to(sys.executable)
    assert not hooks.runnable_by_everyone(python)
    chosen = hooks.python_for_job_users(python)
    assert chosen in ("/usr/bin/python3", str(python))
    if hooks.runnable_by_everyone(sys.executable):
        assert hooks.python_for_job_users(sys.executable) == sys.executable


# --------------------------------------------------------------------------------- executables


def test_hook_scripts_are_executable_python():
    for hook in hooks.HOOKS:
        script = REPO / "hooks" / hooks.SCRIPT_DIRS[hook] / hooks.SCRIPT_NAMES[hook]
        assert os.access(script, os.X_OK), script
        # slurmd runs the root hooks with no PATH; the TaskProlog runs with the job's PATH,
        # which must not pick the interpreter (a conda python3 without the package)
        shebang = "#!/usr/bin/python3 -I\n" if hook == "task_prolog" else "#!/usr/bin/env python3\n"
        assert script.read_text().startswith(shebang)
        assert f'main("{hook}")' in script.read_text()


def test_wrappers_run_the_hooks_with_their_config(tmp_path):
    config = config_file(
        tmp_path,
        f'[controller]\nspool_dir = "{tmp_path}/ctl-spool"\n'
        f'[client]\nurl = "http://127.0.0.1:{free_port()}"\n'
        f'[auth]\nmunge_socket = "{tmp_path}/no-munge.socket"\n',
    )
    wrappers = hooks.write_hook_wrappers(tmp_path / "bin", config)
    assert set(wrappers) == set(hooks.HOOKS)
    for hook, env in (
        ("prolog", PROLOG_2205),
        ("epilog", EPILOG_2205),
        ("epilog_slurmctld", CTLD_2205),
    ):
        path = wrappers[hook]
        assert path.parent == tmp_path / "bin" and os.access(path, os.X_OK)
        assert sys.executable in path.read_text()
        done = subprocess.run([str(path)], env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
    assert [e["kind"] for e in node_events(tmp_path)] == ["job_start", "job_end"]
    assert (tmp_path / "jobs" / "n2" / "41").is_dir()
    task = subprocess.run(
        [str(wrappers["task_prolog"])], env=TASK_ENV, capture_output=True, text=True, timeout=30
    )
    assert task.returncode == 0, task.stderr
    assert task.stdout.startswith(f"export SRECOVERY_PROGRESS_FILE={tmp_path}/jobs/n2/41/")
    (ctld,) = read_spooled(tmp_path / "ctl-spool")
    assert ctld["payload"]["context"] == "epilog_slurmctld"
    assert not list((tmp_path / "bin").glob("*.tmp"))


def test_wrappers_fall_back_to_the_module_outside_a_source_tree(tmp_path, monkeypatch):
    monkeypatch.setattr(hooks, "source_hooks_dir", lambda: None)
    config = config_file(tmp_path)
    wrappers = hooks.write_hook_wrappers(tmp_path / "bin", config, python=sys.executable)
    assert "-m slurm_recovery.hooks prolog" in wrappers["prolog"].read_text()
    assert "-I -m slurm_recovery.hooks task_prolog" in wrappers["task_prolog"].read_text()
    done = subprocess.run([str(wrappers["prolog"])], env=PROLOG_2205, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert node_events(tmp_path)[0]["kind"] == "job_start"


def test_wrapper_quotes_awkward_paths(tmp_path):
    odd = tmp_path / "it's here"
    odd.mkdir()
    wrappers = hooks.write_hook_wrappers(odd / "bin", config_file(tmp_path, folder=odd))
    done = subprocess.run([str(wrappers["prolog"])], env=PROLOG_2205, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert node_events(tmp_path)[0]["job_id"] == 41


def test_script_exits_zero_when_the_package_does_not_import(tmp_path):
    script = REPO / "hooks" / "prolog" / "srecovery-prolog"
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    done = subprocess.run(
        [python, "-I", "-S", str(script)],
        env=PROLOG_2205,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0
    assert "cannot import slurm_recovery" in done.stderr


def test_script_exits_zero_outside_slurm(tmp_path):
    script = REPO / "hooks" / "epilog" / "srecovery-epilog"
    env = {"SRECOVERY_CONFIG": str(tmp_path / "missing.toml"), "PATH": os.environ["PATH"]}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0
    assert done.stderr.startswith("srecovery-epilog: ")


def test_slurm_conf_lines():
    lines = hooks.slurm_conf_lines({"prolog": "/a/p", "epilog": "/a/e", "epilog_slurmctld": "/a/c"})
    assert lines == [
        "Prolog=/a/p",
        "Epilog=/a/e",
        "EpilogSlurmctld=/a/c",
        "PrologFlags=Alloc",
        "SchedulerParameters=nohold_on_prolog_fail",
    ]
    with_task = {
        "prolog": "/a/p",
        "epilog": "/a/e",
        "epilog_slurmctld": "/a/c",
        "task_prolog": "/t",
    }
    assert hooks.slurm_conf_lines(with_task)[3] == "TaskProlog=/t"


def test_deadline_gives_an_outer_timer_back():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *args: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with hooks._deadline(0.1):
            pass
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0.3 < left <= 0.5
        time.sleep(0.6)
        assert fired == [True]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------------------- the light config


def test_the_hooks_read_keys_the_daemons_know_and_every_hooks_key():
    """The hooks' reader and the daemons' schema share the keys' defaults and checks
    (contract.settings); what can still drift is the set of keys. A key only the hooks read
    would be refused by the daemons as unknown; a [hooks] key the reader lacks, ignored."""
    assert set(settings.HOOK_DEFAULTS) <= set(cfg.DEFAULTS)
    assert {k.dotted for k in cfg.KEYS if k.section == "hooks"} <= set(settings.HOOK_DEFAULTS)


FULL_CONFIG = """
[scheduler]
backend = "scontrol"
[sidecar]
node = "gpu7"
spool_dir = "{base}/spool/{{node}}"
poll_interval = "1m30s"
gpu_backend = "sim"
[hooks]
health_gate = true
controller_timeout = "250ms"
job_dir = "{base}/jobs/{{node}}/"
[controller]
spool_dir = "{base}/ctl"
policy = "{base}/policy.toml"
listen = "127.0.0.1:7000"
[client]
url = "http://head1:7765/"
[auth]
munge_socket = "/run/munge/other.socket"
"""


def test_the_light_reader_reads_what_the_config_module_reads(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(FULL_CONFIG.format(base=tmp_path))
    env = {"SRECOVERY_CONFIG": str(path)}
    light = hooks.load_hook_config(env)
    full = cfg.load_config(env=env)
    assert light.source == str(path)
    assert light["sidecar.spool_dir"] == str(full.sidecar.spool_dir)
    assert light.sidecar_spool("n3") == str(full.sidecar.spool_path("n3"))
    assert light["sidecar.node"] == full.sidecar.node
    assert light["sidecar.poll_interval"] == full.sidecar.poll_interval == 90
    assert light["hooks.health_gate"] is full.hooks.health_gate is True
    assert light["hooks.controller_timeout"] == full.hooks.controller_timeout == 0.25
    assert light.job_dir("n3", 41) == jobdir.job_dir_for(str(full.hooks.job_dir), "n3", 41)
    assert light.job_dir("n3", 41) == f"{tmp_path}/jobs/n3/41"
    assert light["controller.spool_dir"] == str(full.controller.spool_dir)
    assert light["controller.policy"] == str(full.controller.policy)
    assert light["client.url"] == full.client.url == "http://head1:7765"
    assert light["auth.munge_socket"] == full.auth.munge_socket
    env["SRECOVERY_URL"] = "https://other:1/"
    assert hooks.load_hook_config(env)["client.url"] == cfg.load_config(env=env).client.url


def test_the_default_file_may_be_absent(monkeypatch, tmp_path):
    monkeypatch.setattr(settings, "DEFAULT_CONFIG_PATH", str(tmp_path / "absent.toml"))
    config = hooks.load_hook_config({})
    assert config.source is None
    assert config.values == dict(settings.HOOK_DEFAULTS)
    assert config["sidecar.poll_interval"] == 10.0


def test_every_hook_default_passes_its_own_check_unchanged():
    """The hooks use the defaults as they are, without checking them on every run (the URL
    check alone would import urllib.parse into every job start)."""
    for dotted, value in settings.HOOK_DEFAULTS.items():
        checked = HOOK_CHECKS[dotted](value)
        assert (checked, type(checked)) == (value, type(value)), dotted


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[hooks]\nhealth_gate = "yes"\n', "hooks.health_gate"),
        ("[hooks]\ncontroller_timeout = 0\n", "hooks.controller_timeout"),
        ('[hooks]\ncontroller_timeout = "fast"\n', "hooks.controller_timeout"),
        ('[sidecar]\nspool_dir = "relative/{node}"\n', "sidecar.spool_dir"),
        ("[sidecar]\npoll_interval = -1\n", "sidecar.poll_interval"),
        ('[sidecar]\nnode = "bad name"\n', "sidecar.node"),
        ('[sidecar]\nspool_dir = "/x/{host}"\n', "sidecar.spool_dir"),
        ('[hooks]\njob_dir = "jobs/{node}"\n', "hooks.job_dir"),
        ('[hooks]\njob_dir = "/x/{job}"\n', "hooks.job_dir"),
        ('[hooks]\njob_dir = "/x/a\\nexport LD_PRELOAD=/y"\n', "hooks.job_dir"),
        ('[controller]\nspool_dir = "x"\n', "controller.spool_dir"),
        ('[client]\nurl = "head1:7765"\n', "client.url"),
        ("[auth]\nmunge_socket = 7\n", "auth.munge_socket"),
        ("[hooks\n", "not a valid TOML file"),
        (b"\xff\xfe", "not a valid TOML file"),
    ],
)
def test_the_light_reader_refuses_bad_values_of_its_keys(tmp_path, text, problem):
    path = tmp_path / "config.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(hooks.HookError, match=re.escape(problem)):
        hooks.load_hook_config({"SRECOVERY_CONFIG": str(path)})
    if not isinstance(text, bytes):  # and the config module refuses the same file
        with pytest.raises(cfg.ConfigError):
            cfg.load_config(env={"SRECOVERY_CONFIG": str(path)})


def test_the_light_reader_leaves_other_keys_to_their_daemons(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[scheduler]\nbackend = "slurmrestd"\n[sidecar]\nsim_gpus = 900\n')
    assert hooks.load_hook_config({"SRECOVERY_CONFIG": str(path)}).source == str(path)


def test_the_light_reader_refuses_a_world_writable_file(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("")
    path.chmod(0o666)
    with pytest.raises(hooks.HookError, match="world-writable"):
        hooks.load_hook_config({"SRECOVERY_CONFIG": str(path)})
    path.chmod(0o644)
    tmp_path.chmod(0o777)
    try:
        with pytest.raises(hooks.HookError, match=r"directory .* is world-writable"):
            hooks.load_hook_config({"SRECOVERY_CONFIG": str(path)})
    finally:
        tmp_path.chmod(0o755)


def test_a_bad_url_in_the_environment_is_refused(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("")
    with pytest.raises(hooks.HookError, match="SRECOVERY_URL"):
        hooks.load_hook_config({"SRECOVERY_CONFIG": str(path), "SRECOVERY_URL": "ftp://x"})


# --------------------------------------------------------------------------------- host lists


@pytest.mark.parametrize(
    "expr",
    [
        "n1",
        "n[1-2]",
        "gpu[001-008]",
        "n[1-3,5,9-11]",
        "n[3,1-2]",
        "n[1-3,2]",
        "rack1n[08-12]-ib",
        "n[9-10]",
        "node-a",
        "n[1-2],m1",  # two patterns: ClusterShell
        "r[1-2]n[1-2]",  # two dimensions: ClusterShell
        "n[01-9]",  # mixed padding: ClusterShell
        "n[1-3,01]",
    ],
)
def test_fast_host_lists_match_clustershell(expr):
    assert hooks.expand_nodes(expr) == clustershell(expr)


def clustershell(expr: str) -> list[str]:
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError

    try:
        return list(NodeSet(expr))
    except NodeSetParseError:
        return []


@given(
    st.sampled_from(["n", "gpu", "rack2n", "x-"]),
    st.lists(st.tuples(st.integers(0, 120), st.integers(0, 15)), min_size=1, max_size=4),
    st.sampled_from([0, 2, 3]),
    st.sampled_from(["", "-ib"]),
)
def test_fast_host_lists_match_clustershell_property(prefix, ranges, width, suffix):
    parts = []
    for low, span in ranges:
        high = low + span
        parts.append(f"{low:0{width}d}-{high:0{width}d}" if span else f"{low:0{width}d}")
    expr = f"{prefix}[{','.join(parts)}]{suffix}"
    assert hooks.expand_nodes(expr) == clustershell(expr)


def test_the_hooks_need_the_standard_library_and_the_contract_layer_only():
    """Without site-packages (``-S``), the hooks module imports, and leaves out the standard
    modules that cost a hook milliseconds on every job start (bench/hook_overhead.py)."""
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "import slurm_recovery.hooks\n"
        "ours = sorted(m for m in sys.modules if m.startswith('slurm_recovery.'))\n"
        "heavy = {'typing', 'pathlib', 'decimal', 'logging', 'dataclasses', 'tomllib'}\n"
        "print(json.dumps([ours, sorted(heavy & set(sys.modules))]))\n"
    )
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    ours, heavy = json.loads(done.stdout)
    assert "slurm_recovery.hooks" in ours
    assert [m for m in ours if not m.startswith("slurm_recovery.contract")] == [
        "slurm_recovery.hooks"
    ]
    assert heavy == []


def test_the_hot_path_imports_neither_the_config_module_nor_clustershell(tmp_path):
    config = config_file(tmp_path)
    code = (
        "import sys\n"
        "from slurm_recovery import hooks\n"
        "assert hooks.run_hook('prolog') == 0\n"
        "assert hooks.run_hook('epilog') == 0\n"
        "assert hooks.run_hook('task_prolog', out=sys.stderr) == 0\n"
        "loaded = {'slurm_recovery.config', 'ClusterShell', 'slurm_recovery.contract.client', "
        "'slurm_recovery.decide.policy', 'dataclasses'} & set(sys.modules)\n"
        "print(sorted(loaded))\n"
    )
    env = {**EPILOG_2205, "SRECOVERY_CONFIG": str(config), "PATH": os.environ["PATH"]}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert len(node_events(tmp_path)) == 2
    assert "export SRECOVERY_PROGRESS_FILE=" in done.stderr  # the task prolog ran through


# ------------------------------------- the epilog gate beside a real sidecar (sim GPUs)


class _Dropping:
    """A controller that takes nothing: the events stay in the outbox."""

    def post_evidence(self, events, role="sidecar"):
        raise OSError("no controller here")


@pytest.mark.parametrize("xid", [False, True])
def test_the_epilog_gate_beside_a_ticking_sidecar(tmp_path, xid):
    """A failed job's Epilog, the node's sidecar ticking meanwhile: with no fault it passes at
    the sidecar's first read after the job_end, not after the whole wait (30 s here); with the
    XID that ended the job in the sim, it fails the node."""
    import threading

    from slurm_recovery.config import SidecarConfig
    from slurm_recovery.sidecar import registry
    from slurm_recovery.sidecar.daemon import Sidecar
    from slurm_recovery.sidecar.outbox import Outbox, Sender
    from slurm_recovery.sidecar.sim import inject

    write_policy(tmp_path)
    side = SidecarConfig(
        gpu_backend="sim", sim_dir=tmp_path / "sim", sim_gpus=2, kmsg=False, ib_sysfs=""
    )
    spool = tmp_path / "spool" / "n2"
    wired = registry.build(side, "n2", spool, f"{tmp_path}/jobs/{{node}}")
    box = Outbox(spool / "outbox", 1000)
    from slurm_recovery.signals.xid import load_xid_catalogue

    sender = Sender(box, _Dropping(), "n2")
    sidecar = Sidecar(
        *("n2", wired, box, sender, spool),
        fast_interval=0.05,
        poll_interval=1,
        catalogue=load_xid_catalogue(),
    )
    sidecar.tick_slow(time.time())  # health.json as a running sidecar keeps it
    stop = threading.Event()

    def ticking():
        while not stop.wait(0.05):
            sidecar.tick_fast(time.time())

    ticker = threading.Thread(target=ticking, daemon=True)
    ticker.start()
    config = make_config(tmp_path, hooks={"epilog_gate": True, "epilog_gate_wait": 30})
    try:
        if xid:
            inject(tmp_path / "sim", "n2", gpu=1, xid=79)
        started = time.monotonic()
        status = hooks.run_hook("epilog", EPILOG_2205, config=config)
        took = time.monotonic() - started
    finally:
        stop.set()
        ticker.join()
        wired.close()
    assert status == (hooks.EXIT_REFUSE if xid else hooks.EXIT_OK)
    assert took < 10, f"the Epilog sat out {took:.1f} s of the 30 s wait"
    health = json.loads((spool / hooks.HEALTH_FILE).read_text())
    assert isinstance(health["fast_read_at"], float)
