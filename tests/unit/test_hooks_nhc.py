"""The prolog's health gate running the site's health check (``hooks.nhc``): real scripts
standing in for LBNL NHC, their verdict in ``job_start``, and failing open."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from slurm_recovery import hooks
from slurm_recovery.contract.wire import health_check_failure_line, parse_event
from tests.unit.test_hooks import NOW, PROLOG_2205, make_config, node_events, write_policy


def script(tmp_path: Path, body: str, name: str = "nhc") -> str:
    """An executable shell script standing in for ``/usr/sbin/nhc``."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


FAILING = (
    'echo "ERROR:  nhc:  Health check failed:  check_fs_mount:  /scratch not mounted"\nexit 1\n'
)


def run_prolog(tmp_path: Path, nhc: str, **keys) -> tuple[int, dict]:
    config = make_config(tmp_path, hooks={"health_gate": True, "nhc": nhc, **keys})
    code = hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=config)
    (event,) = node_events(tmp_path)
    return code, event


def test_a_passing_check_lets_the_job_start_and_is_recorded(tmp_path):
    write_policy(tmp_path)
    code, event = run_prolog(tmp_path, script(tmp_path, "echo all good\nexit 0\n"))
    assert code == hooks.EXIT_OK
    nhc = event["payload"]["health_gate"]["nhc"]
    assert nhc["verdict"] == "pass" and nhc["exit_code"] == 0
    assert nhc["output"] == ["all good"] and 0 <= nhc["duration"] < 5
    assert event["payload"]["health_gate"]["refused"] is False
    parse_event(event, "event")  # the controller takes it


def test_a_failing_check_refuses_the_node_in_act_mode(tmp_path, capsys):
    write_policy(tmp_path)
    code, event = run_prolog(tmp_path, script(tmp_path, FAILING))
    assert code == hooks.EXIT_REFUSE
    gate = event["payload"]["health_gate"]
    assert gate["refused"] is True
    assert gate["nhc"]["verdict"] == "fail" and gate["nhc"]["exit_code"] == 1
    assert "check_fs_mount:  /scratch not mounted" in gate["nhc"]["output"][0]
    assert "site health check" in gate["reason"] and "exit 1" in gate["reason"]
    assert "refusing job 41" in capsys.readouterr().err


def test_the_refusal_quotes_the_line_that_says_why(tmp_path):
    """NHC may print a banner first: the reason Slurm's log and `explain` show quotes its
    ERROR line, else its last line (first caught on the local cluster)."""
    write_policy(tmp_path)
    body = 'echo "nhc: 12 checks"\n' + FAILING
    _, event = run_prolog(tmp_path, script(tmp_path, body, name="banner"))
    assert event["payload"]["health_gate"]["reason"].endswith(
        "(exit 1): ERROR:  nhc:  Health check failed:  check_fs_mount:  /scratch not mounted"
    )
    assert health_check_failure_line(["starting", "disk 93% full"]) == "disk 93% full"
    assert health_check_failure_line(["x", 3, None]) == "x"  # malformed: what can be read
    assert health_check_failure_line("ERROR") == health_check_failure_line([]) == ""


def test_a_failing_check_in_monitor_mode_only_says_what_it_would_do(tmp_path, capsys):
    write_policy(tmp_path, 'mode = "monitor"\n')
    code, event = run_prolog(tmp_path, script(tmp_path, FAILING))
    assert code == hooks.EXIT_OK
    gate = event["payload"]["health_gate"]
    assert gate["refused"] is False and gate["nhc"]["verdict"] == "fail"
    assert "would refuse node n2" in capsys.readouterr().err


def test_an_absent_check_is_skipped_with_a_note(tmp_path, capsys):
    write_policy(tmp_path)
    code, event = run_prolog(tmp_path, str(tmp_path / "no-such-nhc"))
    assert code == hooks.EXIT_OK
    nhc = event["payload"]["health_gate"]["nhc"]
    assert nhc["verdict"] == "absent" and "no-such-nhc" in nhc["note"]
    assert "failing open" in capsys.readouterr().err


def test_a_hung_check_is_killed_with_its_children_and_the_job_starts(tmp_path):
    write_policy(tmp_path)
    marker = tmp_path / "child.pid"
    hung = script(tmp_path, f"sleep 60 &\necho $! > {marker}\nwait\n")
    started = time.monotonic()
    code, event = run_prolog(tmp_path, hung, nhc_timeout=0.5)
    assert time.monotonic() - started < 10
    assert code == hooks.EXIT_OK
    nhc = event["payload"]["health_gate"]["nhc"]
    assert nhc["verdict"] == "timeout" and nhc["exit_code"] is None
    child = int(marker.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # killed with its group (reaped by init, not us)
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the check's child {child} outlived the timeout")


def test_a_check_that_cannot_run_fails_open(tmp_path):
    write_policy(tmp_path)
    path = tmp_path / "nhc"
    path.write_text("not executable")
    path.chmod(0o644)
    code, event = run_prolog(tmp_path, str(path))
    assert code == hooks.EXIT_OK
    assert event["payload"]["health_gate"]["nhc"]["verdict"] == "error"


def test_output_is_cut_to_its_first_lines(tmp_path):
    write_policy(tmp_path, 'mode = "monitor"\n')
    chatty = script(
        tmp_path,
        "i=0\nwhile [ $i -lt 50 ]; do printf 'x%.0s' $(seq 500); echo; i=$((i+1)); done\nexit 3\n",
    )
    _, event = run_prolog(tmp_path, chatty)
    nhc = event["payload"]["health_gate"]["nhc"]
    assert len(nhc["output"]) == hooks.NHC_OUTPUT_LINES
    assert all(len(line) <= hooks.NHC_LINE_CHARS for line in nhc["output"])
    assert nhc["exit_code"] == 3


def test_the_check_is_not_run_when_the_gate_refuses_already(tmp_path):
    from tests.unit.test_hooks import write_health

    write_health(tmp_path)
    write_policy(tmp_path)
    ran = tmp_path / "ran"
    code, event = run_prolog(tmp_path, script(tmp_path, f"touch {ran}\nexit 0\n"))
    assert code == hooks.EXIT_REFUSE and not ran.exists()
    assert "nhc" not in event["payload"]["health_gate"]


def test_no_check_configured_leaves_the_event_as_before(tmp_path):
    write_policy(tmp_path)
    config = make_config(tmp_path, hooks={"health_gate": True})
    assert hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=config) == hooks.EXIT_OK
    (event,) = node_events(tmp_path)
    assert "health_gate" not in event["payload"]


def test_the_check_runs_only_with_the_gate_on(tmp_path):
    ran = tmp_path / "ran"
    config = make_config(tmp_path, hooks={"nhc": script(tmp_path, f"touch {ran}\n")})
    assert hooks.run_hook("prolog", PROLOG_2205, now=NOW, config=config) == hooks.EXIT_OK
    assert not ran.exists()
