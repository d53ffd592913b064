"""``srecovery console`` for real: a dev stack in act mode, a 4-node job whose node n2 an
operator reports bad (the controller drains n2 and requeues the job excluding it; with n2 out
the job cannot run again, so it stays in recovery), and the console in a pseudo-terminal,
its screen read through a terminal emulator (pyte) panel by panel, at 120x40 and 80x24.
Then the controller is stopped (the header says since when it is unreachable, the last data
stays), started again, and q quits with exit code 0 and the terminal as it was."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pexpect
import pyte
import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ClientError, ControllerClient
from tests.conftest import _free_port_block, wait_for
from tests.screen import panel, row, title

pytestmark = pytest.mark.cluster

SRECOVERY = str(Path(sys.executable).parent / "srecovery")
#: SGR parameters that set a colour (foreground, background, 256/true colour, bright)
COLOUR = re.compile(rb"\x1b\[([0-9;]*)m")


def has_colour(raw: bytes) -> bool:
    for match in COLOUR.finditer(raw):
        for param in match.group(1).split(b";"):
            if param and (30 <= int(param) <= 48 or 90 <= int(param) <= 107):
                return True
    return False


class Stack:
    def __init__(self, base: Path, port: int) -> None:
        self.base, self.port = base, port
        self.dev = self.up()

    def up(self) -> devstack.DevStack:
        return devstack.up(
            self.base, nodes=4, mode="act", port_base=self.port, api_port=self.port + 6
        )

    def stop_controller(self) -> None:
        pid = json.loads((self.base / devstack.STATE_FILE).read_text())["controller"]
        assert localcluster.stop_process(pid, "slurm_recovery.controller")

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
        return {**env, **self.dev.exports(), "TERM": "xterm-256color", **extra}

    def client(self) -> ControllerClient:
        return ControllerClient(self.dev.url, munge_socket=str(self.dev.cluster.munge_socket))


@pytest.fixture(scope="module")
def stack(local_cluster):
    base = Path(tempfile.mkdtemp(prefix="srecovery-console-"))
    base.chmod(0o755)
    port = _free_port_block(7, start=local_cluster.port_base + 1300)
    stack = Stack(base, port)
    try:
        yield stack
    finally:
        devstack.down(base)


@pytest.fixture(scope="module")
def recovering(stack) -> dict[str, Any]:
    """A 4-node job, n2 reported bad: n2 drained, the job requeued excluding n2 and pending
    (3 nodes are not enough), its incident open."""
    env = localcluster.slurm_env(stack.dev.cluster)
    job_id = int(
        subprocess.run(
            ["sbatch", "--parsable", "-N4", "--wrap=sleep 600"],
            env=env,
            cwd="/tmp",
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split(";")[0]
    )
    client = stack.client()
    wait_for(lambda: "RUNNING" in squeue(env, job_id), timeout=30)
    report = subprocess.run(
        [SRECOVERY, "report", "n2", "--job", str(job_id), "--reason", "fails NCCL all-reduce"],
        env=stack.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr

    def released() -> Any:
        try:
            stories = client.get(f"/v1/jobs/{job_id}")["incidents"]
        except ClientError as exc:  # 404: none recorded yet (the report is read by the next pass)
            if exc.status != 404:
                raise
            return None
        return stories and "released" in stories[-1]["milestones"] and stories[-1]

    story = wait_for(released, timeout=60, interval=0.5)
    assert story["outcome"] is None  # open: the job cannot run on 3 nodes
    return {"job": job_id, "incident": story["id"], "env": env}


def squeue(env: dict[str, str], job_id: int) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", str(job_id), "-o", "%T"], env=env, capture_output=True, text=True
    ).stdout


class Terminal:
    """A command in a pseudo-terminal of a fixed size, its output fed to a screen model."""

    def __init__(self, command: str, env: dict[str, str], cols: int, rows: int) -> None:
        script = f"{command}; echo EXIT=$?; stty -a"
        self.child = pexpect.spawn(
            "bash", ["--norc", "--noprofile", "-c", script], env=env, dimensions=(rows, cols)
        )
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()

    def pump(self, seconds: float = 0.2) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                data = self.child.read_nonblocking(65536, timeout=0.05)
            except pexpect.TIMEOUT:
                continue
            except pexpect.EOF:
                return
            self.raw += data
            self.stream.feed(data)

    def lines(self) -> list[str]:
        return list(self.screen.display)

    def wait(self, check: Callable[[list[str]], Any], timeout: float = 30.0) -> Any:
        """Until ``check(screen lines)`` returns without an AssertionError; its value."""
        deadline = time.monotonic() + timeout
        last: AssertionError | None = None
        while time.monotonic() < deadline:
            self.pump()
            try:
                return check(self.lines())
            except AssertionError as exc:
                last = exc
            assert self.child.isalive(), "the console exited:\n" + "\n".join(self.lines())
        raise AssertionError(f"{last}\n--- screen ---\n" + "\n".join(self.lines()))

    def resize(self, cols: int, rows: int) -> None:
        self.child.setwinsize(rows, cols)
        self.screen.resize(rows, cols)

    def finish(self, key: str) -> tuple[int, str]:
        """Send ``key`` (if any); the console's exit code and ``stty -a`` after it."""
        if key:
            self.child.send(key)
        self.child.expect(r"EXIT=(\d+)", timeout=15)
        code = int(self.child.match.group(1))
        self.child.expect(pexpect.EOF, timeout=15)
        stty = self.child.before.decode(errors="replace")
        self.child.close()
        assert self.child.exitstatus == 0, stty
        return code, stty


def restored(stty: str) -> bool:
    flags = stty.split()
    return "icanon" in flags and "echo" in flags and "-icanon" not in flags


def check_frame(lines: list[str], job: int, incident: int, cols: int, rows: int) -> None:
    assert len(lines) == rows and lines[0].startswith("╭") and lines[-1].rstrip().endswith("╯")
    assert lines[0].rstrip().endswith("╮") and len(lines[0].rstrip()) == cols
    head = panel(lines, "srecovery console")
    assert "cluster srdev" in head[0] and "controller active" in head[0], head
    assert "mode default act" in head[1], head
    assert "every 0.5s" in head[2] and "q quits" in head[2], head

    assert title(lines, "Incidents") == "Incidents (last hour 1, last day 1)"  # /v1/status
    cells = row(panel(lines, "Incidents"), str(incident), str(job))
    assert cells[2:7] == ["doomed", "hardware", "n2", "requeue_exclude", "open"], cells
    assert re.fullmatch(r"\d\d:\d\d:\d\d", cells[7]), cells

    cells = row(panel(lines, "Jobs in recovery"), str(job), str(incident))
    assert cells[2:4] == ["doomed", "released"] and cells[6] == "requeue_exclude", cells
    assert re.fullmatch(r"\d\d:\d\d:\d\d", cells[4]), cells  # when it was released
    assert re.fullmatch(r"\d+s|\d+m\d\ds", cells[5]), cells  # since the incident opened

    cells = row(panel(lines, "Nodes"), "n2")
    assert cells[1] == "drained + excluded", cells
    assert "srecovery" in cells[2], cells  # the drain reason the tool wrote

    cells = row(panel(lines, "Latency"), "detection")
    assert re.fullmatch(r"\d+ms|\d+\.\ds", cells[1]) and int(cells[3]) >= 1, cells
    assert title(lines, "Needs operator").startswith("Needs operator · errors (")


def test_the_console_in_a_terminal(stack, recovering):
    job, incident = recovering["job"], recovering["incident"]
    term = Terminal(f"{SRECOVERY} console --interval 0.5", stack.env(), 120, 40)
    try:
        term.wait(lambda lines: check_frame(lines, job, incident, 120, 40))
        assert has_colour(bytes(term.raw))  # colour on a terminal, unless NO_COLOR
        assert "watchdog" in panel(term.lines(), "srecovery console")[1]  # from /v1/status

        term.resize(80, 24)
        term.wait(lambda lines: check_frame(lines, job, incident, 80, 24))

        stack.stop_controller()
        try:

            def unreachable(lines: list[str]) -> None:
                head = panel(lines, "srecovery console")
                assert re.search(
                    r"controller unreachable since \d\d:\d\d:\d\d — retrying", head[2]
                ), head
                # the last data stays on screen
                assert row(panel(lines, "Incidents"), str(incident), str(job))
                assert row(panel(lines, "Jobs in recovery"), str(job), str(incident))
                assert "did not answer" in " ".join(panel(lines, "Needs operator"))

            term.wait(unreachable)
            assert "Traceback" not in "\n".join(term.lines())
        finally:
            stack.dev = stack.up()
        term.wait(lambda lines: check_frame(lines, job, incident, 80, 24))
        code, stty = term.finish("q")
        assert code == 0 and restored(stty), stty
    finally:
        term.child.close(force=True)


def test_ctrl_c_quits_cleanly_and_no_color_is_honoured(stack, recovering):
    term = Terminal(f"{SRECOVERY} console --interval 0.5", stack.env(NO_COLOR="1"), 80, 24)
    try:
        term.wait(
            lambda lines: check_frame(lines, recovering["job"], recovering["incident"], 80, 24)
        )
        assert not has_colour(bytes(term.raw))
        code, stty = term.finish("\x03")
        assert code == 0 and restored(stty), stty
        assert "Traceback" not in stty
    finally:
        term.child.close(force=True)


def test_a_controller_that_never_answered(stack):
    dead = f"http://127.0.0.1:{_free_port_block(1, start=stack.port + 100)}"
    term = Terminal(f"{SRECOVERY} console --interval 0.5", stack.env(SRECOVERY_URL=dead), 80, 24)
    try:

        def waiting(lines: list[str]) -> None:
            head = panel(lines, "srecovery console")
            assert f"controller {dead}: no data yet" in head[0], head
            assert "controller unreachable since" in head[2], head
            assert "no incidents" in panel(lines, "Incidents")[0]

        term.wait(waiting)
        # a SIGTERM (or the SSH session's SIGHUP) leaves as q does
        (pid,) = Path(f"/proc/{term.child.pid}/task/{term.child.pid}/children").read_text().split()
        os.kill(int(pid), signal.SIGTERM)
        code, stty = term.finish("")
        assert code == 0 and restored(stty) and "Traceback" not in stty
    finally:
        term.child.close(force=True)


def test_once_prints_one_frame_for_scripts(stack, recovering):
    job, incident = recovering["job"], recovering["incident"]
    out = subprocess.run(
        [SRECOVERY, "console", "--once", "--interval", "0.5"],
        env=stack.env(COLUMNS="80", LINES="24"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "\x1b[" not in out.stdout  # a pipe gets plain text
    lines = out.stdout.splitlines()
    check_frame(lines, job, incident, 80, 24)

    dead = subprocess.run(
        [SRECOVERY, "console", "--once"],
        env=stack.env(SRECOVERY_URL="http://127.0.0.1:1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        dead.returncode == 3 and "did not answer" in dead.stderr and "Is it running?" in dead.stderr
    )
    assert "controller unreachable since" in dead.stdout and "Traceback" not in dead.stderr
