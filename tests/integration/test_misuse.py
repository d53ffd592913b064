"""What held when issue 30's probes misused the tool, kept true on the real local cluster:
a 20 MB body and 300 idle connections do not slow a recovery, and a job that fails the same way
on every attempt is restarted at most ``max_restarts`` times and drains nothing. (An ordinary
user who may not report, drain or switch modes: test_controller.py and test_cli_operator.py; a
forged XID line in a user's job output: test_log_lines_and_cleared_evidence.py.)"""

from __future__ import annotations

import socket
import time
from datetime import datetime
from urllib.parse import urlparse

import pytest

from slurm_recovery.contract import requests
from tests.conftest import wait_for
from tests.integration import test_controller
from tests.integration.test_controller import running, story_or_none

pytestmark = pytest.mark.cluster

scheduler = test_controller.scheduler
stacks = test_controller.stacks


def post_huge(url: str, munge_socket: str, size: int) -> bytes:
    """POST ``size`` bytes of a signed evidence body as a sidecar would; the answer's first
    line (the controller may answer and close before the body is all sent)."""
    body = b'{"events":[' + b" " * (size - 13) + b"]}"
    headers = requests.sign("POST", "/v1/evidence", body, role="sidecar", node="n1",
                            socket=munge_socket)  # fmt: skip
    where = urlparse(url)
    head = (
        f"POST /v1/evidence HTTP/1.1\r\nHost: {where.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        + "\r\n"
    ).encode()
    with socket.create_connection((where.hostname, where.port), timeout=30) as conn:
        conn.sendall(head)
        try:
            for start in range(0, len(body), 1 << 20):
                conn.sendall(body[start : start + (1 << 20)])
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused on its Content-Length, before the body
        return conn.recv(4096).split(b"\r\n", 1)[0]


@pytest.mark.timeout(180)
def test_a_huge_body_and_300_idle_connections_do_not_slow_a_recovery(stacks, submit, scheduler):
    stack = stacks("act")
    where = urlparse(stack.url)
    idle = []
    try:
        for i in range(300):
            conn = socket.create_connection((where.hostname, where.port), timeout=10)
            if i % 2:  # half of them stop in the middle of their headers
                conn.sendall(b"POST /v1/evidence HTTP/1.1\r\nHost: x\r\nContent-Len")
            idle.append(conn)
        status = post_huge(stack.url, str(stack.client.munge_socket), 20 << 20)
        assert status.startswith(b"HTTP/1.1 413"), status

        job_id = submit("-N2", "--wrap=sleep 600")
        bad = wait_for(lambda: running(scheduler, job_id), timeout=60).nodes[1]
        reported = stack.report_xid(bad)
        again = wait_for(lambda: running(scheduler, job_id, restarts=1), timeout=60)
        assert bad not in again.nodes
        (incident,) = wait_for(lambda: [i for i in story_or_none(stack, job_id) if i["outcome"]])
        released = datetime.fromisoformat(incident["milestones"]["released"]).timestamp()
        print(f"with 300 idle connections: reported -> released {released - reported:.2f}s")
        assert released - reported < 5, "a recovery on a healthy slurmctld takes 1-4 s"
    finally:
        for conn in idle:
            conn.close()


@pytest.mark.timeout(180)
def test_a_job_failing_the_same_way_every_time_is_restarted_max_restarts_times_and_drains_nothing(
    stacks, submit, scheduler
):
    """Exit 3 on every attempt, nothing in its output: no evidence of the cause, so each end is
    restarted (never "the same failure": there is none to compare) until the limit stops it."""
    stack = stacks("act", policy_extra="max_restarts = 2\n")
    job_id = submit("-N2", "--wrap=sleep 2; exit 3")

    def stopped() -> list | None:
        found = story_or_none(stack, job_id)
        return found if found and all(i["outcome"] for i in found) and len(found) == 3 else None

    incidents = wait_for(stopped, timeout=120, interval=0.5)
    rules = [i["advice"]["rule"] for i in sorted(incidents, key=lambda i: i["id"])]
    assert rules == ["classes.unknown.action", "classes.unknown.action", "max_restarts"], rules
    job = wait_for(lambda: (j := scheduler.get_job(job_id)).state == "FAILED" and j, timeout=30)
    assert job.restart_count == 2 and job.exit_code.returncode == 3
    assert all(i["advice"]["drain"] == [] for i in incidents)
    assert not [n.name for n in scheduler.list_nodes() if n.drained]
    assert not stack.actions("drain") and not job.excluded_nodes
    time.sleep(3)  # and nothing more happens
    assert len(story_or_none(stack, job_id)) == 3
