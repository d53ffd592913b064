"""`srecovery status|mode|drain|undrain` output and exit codes, with a fake controller client
(the real controller is exercised in tests/integration/test_cli_operator.py)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_recovery.cli import cli, operator_cmds
from slurm_recovery.contract.client import ClientError


def iso(seconds_ago: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).isoformat()


ACTIVE: dict[str, Any] = {
    "version": "0.1.0",
    "cluster": "prod",
    "state": "active",
    "started_at": iso(7200),
    "now": iso(0),
    "last_pass": iso(0.5),
    "last_error": "",
    "slurm_reachable": True,
    "auth": "munge",
    "modes": {
        "default": {
            "mode": "monitor",
            "source": "policy",
            "set_by": None,
            "set_at": None,
            "reason": None,
        },
        "partitions": {
            "debug": {
                "mode": "monitor",
                "source": "policy",
                "set_by": None,
                "set_at": None,
                "reason": None,
                "inherits_default": True,
            },
            "gpu": {
                "mode": "act",
                "source": "override",
                "set_by": "alice",
                "set_at": iso(60),
                "reason": "trial week",
                "inherits_default": False,
            },
        },
    },
    "in_flight": [
        {
            "incident": 42,
            "job_id": 4300,
            "kind": "doomed",
            "milestone": "held",
            "since": iso(2),
            "action": "requeue_exclude",
        }
    ],
    "incidents": {
        "last_hour": {"total": 1, "by_class": {"hardware": 1}, "by_kind": {"doomed": 1}},
        "last_day": {
            "total": 3,
            "by_class": {"hardware": 2, "unknown": 1},
            "by_kind": {"crash": 1, "doomed": 2},
        },
    },
    "needs_operator": [
        {"incident": 41, "job_id": 4242, "reason": "stop, needs operator", "opened_at": iso(99)}
    ],
    "errors": [{"at": iso(30), "level": "WARNING", "message": "incident 40: drain n17 failed"}],
    "watchdog": {"last_run": iso(3), "state": "ok", "released_total": 1},
    "drained_by_tool": ["n17"],
    "excluded_by_tool": ["n17"],
    "drained_by_operator": ["n40", "n41"],
}


class FakeClient:
    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.posts: list[tuple[str, dict]] = []

    def get(self, path: str) -> Any:
        answer = self.answers[path]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def request(self, method: str, path: str, body: bytes = b"", *, role: str = "reader") -> Any:
        assert (method, role) == ("POST", "operator")
        self.posts.append((path, json.loads(body)))
        answer = self.answers[path]
        if isinstance(answer, Exception):
            raise answer
        return answer(json.loads(body)) if callable(answer) else answer


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('[client]\nurl = "http://head:7765"\n[auth]\noperator_group = "hpcops"\n')
    path.chmod(0o644)
    return path


def run(config: Path, fake: FakeClient, monkeypatch, *args: str, stdin: str | None = None):
    monkeypatch.setattr(operator_cmds, "client_for", lambda cfg: fake)
    monkeypatch.delenv("SRECOVERY_URL", raising=False)
    return CliRunner().invoke(cli, ["--config", str(config), *args], obj={}, input=stdin)


def test_status_reads_like_systemctl(config, monkeypatch):
    result = run(config, FakeClient({"/v1/status": ACTIVE}), monkeypatch, "status")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "● slurm-recovery controller: active on cluster prod"
    out = result.output
    for text in (
        "Slurm: reachable",
        "Drained: n17",
        "Drained by ops: n[40-41]",
        "Excluded: n17",
        "Last hour: 1 (hardware 1; doomed 1)",
        "Last day: 3 (hardware 2, unknown 1; crash 1, doomed 2)",
        "1 job released in all",
        "override by alice",
        "trial week",
        "follows the default",
        "In flight: 1",
        "requeue_exclude",
        "Needs an operator (last day): 1",
        "WARNING  incident 40: drain n17 failed",
    ):
        assert text in out, text
    assert "\x1b[" not in out  # no colour without a terminal


def test_status_lists_the_jobs_that_cannot_start(config, monkeypatch):
    info = copy.deepcopy(ACTIVE)
    reason = "needs operator: job needs 4 nodes, 3 are usable after excluding n2"
    info["unplaceable"] = [{"job_id": 4400, "incident": 43, "reason": reason}]
    out = run(config, FakeClient({"/v1/status": info}), monkeypatch, "status").output
    assert "Cannot run (needs an operator): 1" in out
    (row,) = [line for line in out.splitlines() if line.lstrip().startswith("4400")]
    assert row.split()[:2] == ["4400", "43"] and row.rstrip().endswith(reason)
    # a controller older than this CLI does not send the list: nothing, not an error
    assert (
        "Cannot run (needs an operator): none"
        in run(config, FakeClient({"/v1/status": ACTIVE}), monkeypatch, "status").output
    )


@pytest.mark.parametrize(
    ("watchdog", "shown"),
    [
        ({"last_run": None, "state": "never", "released_total": 0}, "Watchdog: never ran"),
        ({"last_run": iso(900), "state": "stale", "released_total": 2}, "Watchdog: STALE"),
    ],
)
def test_a_degraded_controller_exits_5_and_says_why(config, monkeypatch, watchdog, shown):
    info = copy.deepcopy(ACTIVE)
    info.update(
        state="degraded",
        slurm_reachable=False,
        last_error="slurmctld unreachable: timed out",
        watchdog=watchdog,
    )
    result = run(config, FakeClient({"/v1/status": info}), monkeypatch, "status")
    assert result.exit_code == 5
    assert result.output.startswith("● slurm-recovery controller: degraded")
    assert "Last error: slurmctld unreachable: timed out" in result.output
    assert "Slurm: UNREACHABLE" in result.output and shown in result.output
    as_json = run(config, FakeClient({"/v1/status": info}), monkeypatch, "status", "--json")
    assert as_json.exit_code == 5 and json.loads(as_json.output) == info


def test_an_unreachable_controller_exits_3(config, monkeypatch):
    down = FakeClient({"/v1/status": ClientError(0, "connection refused")})
    result = run(config, down, monkeypatch, "status")
    assert result.exit_code == 3
    assert "unreachable (http://head:7765)" in result.output
    assert "did not answer" in result.output


def test_a_refusal_names_the_operator_group(config, monkeypatch):
    refused = ClientError(403, "uid 1000 gid 1000 is not an operator")
    fake = FakeClient({"/v1/mode": refused, "/v1/drain": refused, "/v1/undrain": refused})
    for args in (("mode", "act", "--yes"), ("drain", "n1", "--reason", "x", "--yes")):
        result = run(config, fake, monkeypatch, *args)
        assert result.exit_code == 4
        assert "the operator group is 'hpcops'" in result.output


def mode_answer(body: dict) -> dict:
    return {
        "dry_run": body.get("dry_run", False),
        "scope": "partition",
        "partition": "gpu",
        "cleared": False,
        "had_override": False,
        "previous": "monitor",
        "mode": "act",
        "source": "override",
        "changes": [{"partition": "gpu", "from": "monitor", "to": "act"}],
        "modes": ACTIVE["modes"],
        "policy": "/etc/slurm-recovery/policy.toml",
    }


def test_mode_asks_first_and_a_no_changes_nothing(config, monkeypatch):
    fake = FakeClient({"/v1/mode": mode_answer})
    monkeypatch.setattr(operator_cmds, "_interactive", lambda: True)
    result = run(config, fake, monkeypatch, "mode", "act", "-p", "gpu", stdin="n\n")
    assert result.exit_code == 1 and "nothing changed" in result.output
    assert "gpu: monitor -> act" in result.output and "changes Slurm" in result.output
    assert [body.get("dry_run") for _, body in fake.posts] == [True]
    result = run(config, fake, monkeypatch, "mode", "act", "-p", "gpu", stdin="y\n")
    assert result.exit_code == 0, result.output
    assert [body.get("dry_run") for _, body in fake.posts] == [True, True, None]
    assert fake.posts[-1][1] == {"partition": "gpu", "reason": "", "mode": "act"}
    assert "partition gpu: monitor -> act (override)" in result.output


def test_mode_refuses_without_a_terminal_or_with_both_a_mode_and_clear(config, monkeypatch):
    fake = FakeClient({})
    result = run(config, fake, monkeypatch, "mode", "act")
    assert result.exit_code == 2 and "pass --yes" in result.output
    assert run(config, fake, monkeypatch, "mode", "act", "--clear").exit_code == 2
    assert run(config, fake, monkeypatch, "mode", "--reason", "x").exit_code == 2
    assert run(config, fake, monkeypatch, "mode", "acting").exit_code == 2
    assert fake.posts == []


def test_drain_and_undrain_exit_codes(config, monkeypatch):
    def drained(result: str, reachable: bool = True):
        return {
            "reason": "srecovery-op:root: x",
            "nodes": [{"node": "n1", "result": result, "reason": "", "message": "refused"}],
            "slurm_reachable": reachable,
        }

    for answer, code in (
        (drained("drained"), 0),
        (drained("already_drained"), 0),
        (drained("failed"), 1),
        (drained("not_tried", reachable=False), 3),
    ):
        fake = FakeClient({"/v1/drain": answer})
        result = run(config, fake, monkeypatch, "drain", "n[1-2]", "--reason", "x", "--yes")
        assert result.exit_code == code, (answer, result.output)
        assert fake.posts[0][1] == {"nodes": ["n[1-2]"], "reason": "x"}
    assert run(config, FakeClient({}), monkeypatch, "drain", "n[1-", "--reason", "x").exit_code == 2

    conflict = ClientError(409, "not drained by slurm-recovery, so not resumed: n2 (...)")
    result = run(config, FakeClient({"/v1/undrain": conflict}), monkeypatch, "undrain", "n2")
    assert result.exit_code == 1 and "not drained by slurm-recovery" in result.output
    fake = FakeClient(
        {
            "/v1/undrain": {
                "nodes": [
                    {
                        "node": "n2",
                        "result": "resumed",
                        "previous_reason": "admin",
                        "drained_by": "someone else, not slurm-recovery",
                        "message": "",
                    }
                ],
                "slurm_reachable": True,
                "force": True,
            }
        }
    )
    result = run(config, fake, monkeypatch, "undrain", "n2", "--force")
    assert result.exit_code == 0 and "someone else" in result.output
    assert fake.posts[0][1] == {"nodes": ["n2"], "force": True}
