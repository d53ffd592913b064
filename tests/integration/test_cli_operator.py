"""`srecovery status|mode|drain|undrain` against the real local cluster and a live controller
(`srecovery dev up` in monitor mode, one stack for the module, operator group "adm"), run as
the admin would run them: the installed CLI in a subprocess, signed with the cluster's munged.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
import urllib.request
from datetime import datetime
from pathlib import Path

import pexpect
import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ControllerClient
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.store import Store
from tests.conftest import _free_port_block, wait_for, wait_passes

pytestmark = pytest.mark.cluster

OPERATOR_GROUP = "adm"  # in Debian's /etc/group; nobody is not a member

STATUS_KEYS = {
    "version",
    "cluster",
    "state",
    "started_at",
    "now",
    "last_pass",
    "last_error",
    "slurm_reachable",
    "auth",
    "modes",
    "in_flight",
    "incidents",
    "needs_operator",
    "errors",
    "watchdog",
    "drained_by_tool",
    "excluded_by_tool",
}
#: keys added to the contract (docs/cli.md says what they are)
STATUS_EXTRA = {"drained_by_operator", "unplaceable"}
MODE_KEYS = {"mode", "source", "set_by", "set_at", "reason"}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(local_cluster):
    base = Path(tempfile.mkdtemp(prefix="srecovery-op-"))
    base.chmod(0o755)
    port = _free_port_block(7, start=local_cluster.port_base + 1700)
    stack = devstack.up(base, nodes=4, mode="monitor", port_base=port, api_port=port + 6)
    try:
        # The same stack, with an operator group: restart the controller on the new config.
        config = stack.config.read_text()
        stack.config.write_text(
            config.replace(
                'slurm_user = "root"\n',
                f'slurm_user = "root"\noperator_group = "{OPERATOR_GROUP}"\n',
            )
        )
        state_file = base / devstack.STATE_FILE
        state = json.loads(state_file.read_text())
        localcluster.stop_process(state["controller"], "slurm_recovery.controller")
        state["controller"] = devstack.start_controller(
            stack.config, base / "log" / "controller-2.log"
        )
        state_file.write_text(json.dumps(state))
        devstack.wait_healthy(stack.url, pid=state["controller"])
        yield stack
    finally:
        devstack.down(base)


@pytest.fixture
def sched(stack) -> ScontrolScheduler:
    return ScontrolScheduler(timeout=10, slurm_conf=str(stack.cluster.slurm_conf))


@pytest.fixture(autouse=True)
def as_found(stack, sched):
    """After each test, the shared stack as the next expects it: no node drained, no mode
    override. A test that fails midway (leaving its drain) must not fail the next one."""
    yield
    changed = False
    for node in sched.list_nodes():
        if node.drained:
            sched.resume_node(node.name)
            changed = True
    modes = status(stack)["modes"]
    for name, mode in [("", modes["default"]), *modes["partitions"].items()]:
        if mode["source"] == "override":
            srecovery(stack, "mode", "--clear", "--yes", *(["--partition", name] if name else []))
            changed = True
    if changed:
        wait_passes(stack.url, 2)  # status and the next test read what the passes saw


@pytest.fixture
def client(stack) -> ControllerClient:
    return ControllerClient(stack.url, munge_socket=str(stack.cluster.munge_socket))


@pytest.fixture
def jobs(stack):
    """``jobs("-N2", "--wrap=sleep 600")`` -> job id; cancelled after the test."""
    env = localcluster.slurm_env(stack.cluster)
    made: list[int] = []

    def submit(*args: str) -> int:
        out = subprocess.run(
            ["sbatch", "--parsable", *args],
            env=env,
            cwd="/tmp",
            capture_output=True,
            text=True,
            check=True,
        )
        made.append(int(out.stdout.split(";")[0]))
        return made[-1]

    yield submit
    if made:
        subprocess.run(["scancel", *map(str, made)], env=env, capture_output=True)


def srecovery(stack, *args: str, env: dict[str, str] | None = None, user: str = ""):
    """The CLI in a subprocess, no terminal (stdin /dev/null); as ``user`` when given."""
    environ = {**os.environ, **stack.exports(), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    argv = [sys.executable, "-m", "slurm_recovery.cli", *args]
    if user:
        argv = ["runuser", "-u", user, "--", *_python_for(user), "-m", "slurm_recovery.cli", *args]
        environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *site.getsitepackages()])
    return subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        cwd="/" if user else None,
    )


def _python_for(user: str) -> list[str]:
    """An interpreter ``user`` may run: this one, or the system's (same minor version) when
    this one lives where ``user`` cannot reach (e.g. /root/.pyenv)."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for python in (sys.executable, f"/usr/bin/{version}", shutil.which(version)):
        if (
            python
            and subprocess.run(
                ["runuser", "-u", user, "--", python, "-c", "pass"], capture_output=True, cwd="/"
            ).returncode
            == 0
        ):
            return [python, "-s"]
    pytest.fail(f"no Python interpreter {user} may run")


def status(stack) -> dict:
    out = srecovery(stack, "status", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def audit(client, kind: str) -> list[dict]:
    return [r for r in client.get("/v1/audit?limit=10000")["audit"] if r["kind"] == kind]


def healthz(stack) -> dict:
    with urllib.request.urlopen(f"{stack.url}/healthz", timeout=5) as resp:
        return json.loads(resp.read())


def node_line(stack, node: str) -> str:
    """``STATE REASON`` of ``node`` as sinfo shows it."""
    return subprocess.run(
        ["sinfo", "-h", "-N", "-n", node, "-o", "%T %E"],
        env=localcluster.slurm_env(stack.cluster),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


# --- status ---------------------------------------------------------------------------------


def test_status_json_is_the_contract(stack):
    info = wait_for(lambda: (s := status(stack))["watchdog"]["state"] == "ok" and s, timeout=30)
    assert set(info) == STATUS_KEYS | STATUS_EXTRA
    assert info["unplaceable"] == []  # no requeued job waits without room
    assert info["state"] == "active" and info["cluster"] == "srdev" and info["auth"] == "munge"
    assert info["slurm_reachable"] is True and info["last_error"] == ""
    for key in ("started_at", "now", "last_pass"):
        datetime.fromisoformat(info[key])
    assert set(info["modes"]) == {"default", "partitions"}
    assert set(info["modes"]["default"]) == MODE_KEYS
    assert info["modes"]["default"]["mode"] == "monitor"
    assert info["modes"]["default"]["source"] == "policy"
    debug = info["modes"]["partitions"]["debug"]  # every partition Slurm shows
    assert set(debug) == MODE_KEYS | {"inherits_default"} and debug["mode"] == "monitor"
    assert set(info["incidents"]) == {"last_hour", "last_day"}
    for block in info["incidents"].values():
        assert set(block) == {"total", "by_class", "by_kind"}
    assert set(info["watchdog"]) == {"last_run", "state", "released_total"}
    datetime.fromisoformat(info["watchdog"]["last_run"])
    assert isinstance(info["watchdog"]["released_total"], int)
    for key in ("in_flight", "needs_operator", "errors", "drained_by_tool", "excluded_by_tool"):
        assert isinstance(info[key], list)


def test_status_reads_like_systemctl_status(stack):
    out = srecovery(stack, "status")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "● slurm-recovery controller: active on cluster srdev"
    text = out.stdout
    for line in ("Slurm: reachable", "Auth: munge", "Last error: -", "Watchdog: ok, last run"):
        assert line in text
    assert "Modes (`srecovery mode`):" in text and "(default)" in text
    assert any(line.split()[:2] == ["debug", "monitor"] for line in lines)
    assert "In flight:" in text and "Needs an operator (last day):" in text
    # keys are aligned on their colons
    keyed = [line for line in lines[1:12] if ": " in line]
    assert len({line.index(": ") for line in keyed}) == 1


def test_status_of_a_controller_that_does_not_answer(stack):
    dead = f"http://127.0.0.1:{_free_port_block(1)}"
    out = srecovery(stack, "status", env={"SRECOVERY_URL": dead})
    assert out.returncode == 3
    assert out.stdout.startswith("● slurm-recovery controller: unreachable")
    assert "did not answer" in out.stderr and "systemctl status srecovery-controller" in out.stderr
    out = srecovery(stack, "status", "--json", env={"SRECOVERY_URL": dead})
    assert out.returncode == 3 and out.stdout == ""


# --- who may -------------------------------------------------------------------------------


def test_a_non_operator_may_read_but_not_change(stack, sched, client):
    reads = srecovery(stack, "status", "--json", user="nobody")
    assert reads.returncode == 0, reads.stderr
    assert json.loads(reads.stdout)["state"] == "active"
    for args in (
        ("mode", "act", "--yes"),
        ("mode", "--clear", "--yes"),
        ("drain", "n1", "--reason", "mine now", "--yes"),
        ("undrain", "n1"),
    ):
        out = srecovery(stack, *args, user="nobody")
        assert out.returncode == 4, (args, out.stdout, out.stderr)
        assert "not an operator" in out.stderr
        assert f"operator group is '{OPERATOR_GROUP}'" in out.stderr
    assert status(stack)["modes"]["default"]["source"] == "policy"
    assert not sched.get_node("n1").drained
    assert not audit(client, "mode_set") and not audit(client, "operator_drain")


# --- mode ----------------------------------------------------------------------------------


def test_mode_without_yes_needs_a_terminal(stack):
    out = srecovery(stack, "mode", "act")
    assert out.returncode == 2
    assert "--yes" in out.stderr and "no terminal" in out.stderr
    assert status(stack)["modes"]["default"]["mode"] == "monitor"
    assert srecovery(stack, "mode", "act", "--clear").returncode == 2
    assert srecovery(stack, "mode", "act", "--partition", "nope", "--yes").returncode == 1


def test_mode_asks_on_a_terminal_and_shows_what_changes(stack):
    env = {**os.environ, **stack.exports()}
    argv = ["-m", "slurm_recovery.cli", "mode", "act", "--partition", "debug", "--reason", "try"]
    child = pexpect.spawn(sys.executable, argv, env=env, encoding="utf-8", timeout=30)
    child.expect("debug: monitor -> act")
    child.expect("changes Slurm")
    child.expect(r"Proceed\? \[y/N\]")
    child.sendline("n")
    child.expect("nothing changed")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert status(stack)["modes"]["partitions"]["debug"]["mode"] == "monitor"

    child = pexpect.spawn(sys.executable, argv, env=env, encoding="utf-8", timeout=30)
    child.expect(r"Proceed\? \[y/N\]")
    child.sendline("y")
    child.expect("partition debug: monitor -> act")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    debug = status(stack)["modes"]["partitions"]["debug"]
    assert (debug["mode"], debug["source"], debug["set_by"], debug["reason"]) == (
        "act",
        "override",
        "root",
        "try",
    )
    out = srecovery(stack, "mode", "--clear", "--partition", "debug", "--yes")
    assert out.returncode == 0, out.stderr
    assert "override cleared; act -> monitor" in out.stdout
    assert status(stack)["modes"]["partitions"]["debug"]["source"] == "policy"


def test_a_mode_change_decides_the_next_incidents(stack, sched, client, jobs):
    """monitor (policy) -> act (override): an operator's report on a running job's node gets
    the job requeued off it; -> monitor: the next report gets advice only."""
    out = srecovery(stack, "mode", "act", "--yes", "--reason", "trial")
    assert out.returncode == 0, out.stderr
    assert "the default mode: monitor -> act (override)" in out.stdout
    assert "debug: monitor -> act" in out.stdout  # debug follows the default
    assert "changes Slurm" in out.stdout
    default = status(stack)["modes"]["default"]
    assert (default["mode"], default["source"], default["set_by"]) == ("act", "override", "root")
    (row,) = [r for r in audit(client, "mode_set") if r["subject"] == "default"]
    assert row["actor"] == "uid:0" and row["subject"] == "default"
    assert (row["payload"]["mode"], row["payload"]["previous"]) == ("act", "monitor")
    wait_for(lambda: healthz(stack)["modes"] == {"default": "act"})  # from the next pass

    first = jobs("-N2", "--wrap=sleep 600")
    job = wait_for(lambda: (j := sched.get_job(first)).state == "RUNNING" and j)
    bad = job.nodes[1]
    out = srecovery(stack, "report", bad, "--reason", "fails the NCCL test", "--job", str(first))
    assert out.returncode == 0, out.stderr
    again = wait_for(
        lambda: (j := sched.get_job(first)).state == "RUNNING" and j.restart_count == 1 and j,
        timeout=30,
    )
    assert bad not in again.nodes and bad in again.excluded_nodes
    (story,) = client.get(f"/v1/jobs/{first}")["incidents"]
    assert story["advice"]["mode"] == "act"
    info = wait_for(lambda: (s := status(stack))["drained_by_tool"] and s)
    assert info["drained_by_tool"] == [bad] and info["excluded_by_tool"] == [bad]
    assert info["incidents"]["last_hour"]["by_class"] == {"hardware": 1}

    out = srecovery(stack, "mode", "monitor", "--yes")
    assert out.returncode == 0, out.stderr
    assert "the default mode: act -> monitor (override)" in out.stdout
    second = jobs("-N1", "--wrap=sleep 600")
    job2 = wait_for(lambda: (j := sched.get_job(second)).state == "RUNNING" and j)
    out = srecovery(stack, "report", job2.nodes[0], "--reason", "suspect", "--job", str(second))
    assert out.returncode == 0, out.stderr
    # the incident opens, then the same pass closes it with its outcome: wait for both (CI: an
    # incident read between the two commits had no outcome yet)
    (story2,) = wait_for(
        lambda: [i for i in client.get(f"/v1/incidents?job={second}")["incidents"] if i["outcome"]]
    )
    assert story2["advice"]["mode"] == "monitor"
    assert story2["outcome"].startswith("monitor: would requeue")
    still = sched.get_job(second)
    assert still.state == "RUNNING" and still.restart_count == 0
    assert not sched.get_node(job2.nodes[0]).drained
    info = status(stack)
    assert info["incidents"]["last_hour"]["total"] == 2
    assert info["incidents"]["last_hour"]["by_kind"] == {"doomed": 2}

    # The controller's own drain is slurm-recovery's: undrain needs no --force.
    out = srecovery(stack, "undrain", bad)
    assert out.returncode == 0, out.stderr
    assert "resumed" in out.stdout and "slurm-recovery (incident" in out.stdout
    assert not sched.get_node(bad).drained
    out = srecovery(stack, "mode", "--clear", "--yes")
    assert out.returncode == 0, out.stderr
    assert status(stack)["modes"]["default"]["source"] == "policy"
    assert [r["subject"] for r in audit(client, "mode_cleared")][-1] == "default"


# --- drain and undrain ------------------------------------------------------------------------


def test_drain_and_undrain_change_slurm_and_are_audited(stack, sched, client):
    out = srecovery(stack, "drain", "n[3-4]", "--reason", "bad fan\n(ticket 7)", "--yes")
    assert out.returncode == 0, out.stderr
    reason = "srecovery-op:root: bad fan (ticket 7)"
    for node in ("n3", "n4"):
        assert any(
            line.split()[:2] == [node, "drained"] and line.rstrip().endswith(reason)
            for line in out.stdout.splitlines()
        )
        state, shown = node_line(stack, node).split(" ", 1)
        assert state in ("drained", "draining") and shown == reason
        assert sched.get_node(node).drained
    rows = [r for r in audit(client, "operator_drain") if r["subject"] in ("node n3", "node n4")]
    assert [(r["actor"], r["subject"], r["payload"]["result"]) for r in rows] == [
        ("uid:0", "node n3", "drained"),
        ("uid:0", "node n4", "drained"),
    ]
    with Store.open(stack.base / "state.db", readonly=True) as store:
        n3 = store.get_node("n3")
    assert n3.drain_reason == reason and n3.drained_at and not n3.drained_by_tool
    info = wait_for(lambda: (s := status(stack))["drained_by_operator"] and s)
    assert info["drained_by_operator"] == ["n3", "n4"] and info["drained_by_tool"] == []

    # a second drain keeps the reason already there
    out = srecovery(stack, "drain", "n3", "--reason", "other", "--yes")
    assert out.returncode == 0 and "already drained" in out.stdout
    assert node_line(stack, "n3").endswith(reason)

    out = srecovery(stack, "undrain", "n[3-4]", "n1")
    assert out.returncode == 0, out.stderr
    assert "drained by operator root through slurm-recovery" in out.stdout
    assert "not drained" in out.stdout  # n1: nothing to do
    assert not sched.get_node("n3").drained and not sched.get_node("n4").drained
    assert not node_line(stack, "n3").split()[0].startswith("drain")
    undrains = [
        r for r in audit(client, "operator_undrain") if r["subject"] in ("node n3", "node n4")
    ]
    assert [(r["subject"], r["payload"]["result"]) for r in undrains] == [
        ("node n3", "resumed"),
        ("node n4", "resumed"),
    ]
    with Store.open(stack.base / "state.db", readonly=True) as store:
        assert store.get_node("n3").drain_reason == ""


def test_undrain_refuses_someone_elses_drain_without_force(stack, sched, client):
    env = localcluster.slurm_env(stack.cluster)
    before = max((r["seq"] for r in client.get("/v1/audit?limit=10000")["audit"]), default=0)
    subprocess.run(
        ["scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=admin maintenance"],
        env=env,
        check=True,
    )
    try:
        out = srecovery(stack, "undrain", "n2", "n1")
        assert out.returncode == 1
        assert "admin maintenance" in out.stderr and "--force" in out.stderr
        assert "not drained by slurm-recovery" in out.stderr and "nothing was resumed" in out.stderr
        assert sched.get_node("n2").drained
        assert not [r for r in audit(client, "operator_undrain") if r["seq"] > before]

        out = srecovery(stack, "drain", "n2", "--reason", "mine", "--yes")
        assert out.returncode == 0 and node_line(stack, "n2").endswith("admin maintenance")

        out = srecovery(stack, "undrain", "n2", "--force", "--json")
        assert out.returncode == 0, out.stderr
        (result,) = json.loads(out.stdout)["nodes"]
        assert result["result"] == "resumed" and result["previous_reason"] == "admin maintenance"
        assert result["drained_by"] == "someone else, not slurm-recovery"
        assert not sched.get_node("n2").drained
        row = [r for r in audit(client, "operator_undrain") if r["subject"] == "node n2"][-1]
        assert row["payload"]["force"] is True and row["actor"] == "uid:0"
    finally:
        sched.resume_node("n2")


def test_drain_refuses_bad_requests(stack, sched):
    out = srecovery(stack, "drain", "n1", "--reason", "x")  # no terminal, no --yes
    assert out.returncode == 2 and "--yes" in out.stderr
    out = srecovery(stack, "drain", "n9", "--reason", "x", "--yes")
    assert out.returncode == 1 and "unknown node n9" in out.stderr
    out = srecovery(stack, "drain", "n[1-", "--reason", "x", "--yes")
    assert out.returncode == 2
    out = srecovery(stack, "drain", "n1", "--reason", "  ", "--yes")
    assert out.returncode == 2
    assert not sched.get_node("n1").drained
