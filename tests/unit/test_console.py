"""``srecovery console`` frames, without a controller: what each panel says, that a frame fits
80x24 and 120x40, fewer rows when there is less room, the header when the controller does not
answer, the fallback to /healthz for controllers without /v1/status."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any

import pytest

from slurm_recovery.cli import console
from slurm_recovery.contract.client import ClientError
from tests.screen import cells, panel, row, title

#: Local noon today: the console prints a time without its date only when it is today, and the
#: fixtures below reach an hour back, which crosses midnight when the tests run just after it.
NOW = datetime.now().replace(hour=12, minute=0, second=0, microsecond=0).timestamp()


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def mode(value: str, source: str = "policy", by: str | None = None) -> dict[str, Any]:
    return {
        "mode": value,
        "source": source,
        "set_by": by,
        "set_at": iso(NOW - 600) if by else None,
        "reason": "trial" if by else None,
    }


def status(**overrides: Any) -> dict[str, Any]:
    """A /v1/status answer, in the shape the controller gives."""
    body = {
        "version": "0.1.0",
        "cluster": "prod-a",
        "state": "active",
        "started_at": iso(NOW - 86400),
        "now": iso(NOW),
        "last_pass": iso(NOW - 1),
        "last_error": "",
        "slurm_reachable": True,
        "auth": "munge",
        "modes": {
            "default": mode("monitor"),
            "partitions": {"gpu": mode("act", "override", "uid:0(root)")},
        },
        "in_flight": [
            {
                "incident": 7,
                "job_id": 4242,
                "kind": "crash",
                "milestone": "excluded",
                "since": iso(NOW - 125),
                "action": "requeue_exclude",
            }
        ],
        "incidents": {
            "last_hour": {"total": 1, "by_class": {"hardware": 1}, "by_kind": {"crash": 1}},
            "last_day": {"total": 2, "by_class": {"hardware": 2}, "by_kind": {"crash": 2}},
        },
        "needs_operator": [{"incident": 5, "job_id": 4100, "reason": "restart limit reached"}],
        "errors": [{"at": iso(NOW - 30), "level": "error", "message": "drain n9 refused"}],
        "watchdog": {"last_run": iso(NOW - 3), "state": "ok", "released_total": 2},
        "drained_by_tool": ["n17"],
        "excluded_by_tool": ["n17", "n18"],
    }
    body.update(overrides)
    return body


def incident(
    ident: int, job: int, *, closed: bool = True, latencies: dict[str, float] | None = None
) -> dict[str, Any]:
    return {
        "id": ident,
        "kind": "crash",
        "cluster": "prod-a",
        "job_id": job,
        "restart_count": 0,
        "opened_at": iso(NOW - 3600 + ident),
        "closed_at": iso(NOW - 3500) if closed else None,
        "outcome": "running_again" if closed else None,
        "summary": "",
        "advice": {
            "action": "requeue_exclude",
            "mode": "act",
            "reason": "XID 79 on n17",
            "needs_operator": False,
            "verdict": {"fault_class": "hardware", "nodes": ["n17"]},
        },
        "latencies": latencies if latencies is not None else {"detection": 0.5},
    }


def snapshot(**kwargs: Any) -> console.Snapshot:
    incidents = kwargs.pop(
        "incidents",
        [
            incident(7, 4242, closed=False, latencies={"detection": 0.2}),
            incident(6, 4200, latencies={"detection": 0.4, "action": 2.0, "end_to_end": 9.0}),
        ],
    )
    nodes = [
        {"name": "n17", "drained_by_tool": True, "drain_reason": "srecovery:7:xid 79"},
        {
            "name": "n30",
            "drained_by_tool": False,
            "drain_reason": "",
            "implicated_count": 3,
            "last_implicated_at": iso(NOW - 60),
        },
    ]
    return console.Snapshot(
        fetched_at=NOW, status=status(**kwargs), incidents=incidents, nodes=nodes
    )


def frame(state: console.ViewState, width: int, height: int) -> list[str]:
    out = io.StringIO()
    screen = console.Console(file=out, width=width, height=height, no_color=True)
    screen.print(console.render(state, width, height, 0.5, NOW), height=height)
    lines = out.getvalue().splitlines()
    assert len(lines) == height, "\n".join(lines)
    assert all(len(line) <= width for line in lines), "\n".join(lines)
    return lines


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (100, 30), (200, 60)])
def test_every_panel_says_what_the_controller_said(size):
    lines = frame(console.ViewState(snapshot=snapshot()), *size)
    head = panel(lines, "srecovery console")
    assert "cluster prod-a" in head[0] and "controller active" in head[0]
    assert "v0.1.0" in head[0] and "last pass" in head[0]
    assert "default monitor" in head[1] and "gpu act (override by uid:0(root)" in head[1]
    assert "watchdog ok" in head[1] or size[0] < 100
    assert "every 0.5s" in head[2]

    assert row(panel(lines, "Incidents"), "7", "4242")[2:5] == ["crash", "hardware", "n17"]
    assert row(panel(lines, "Incidents"), "7", "4242")[-2] == "open"
    assert row(panel(lines, "Incidents"), "6", "4200")[-2] == "running again"

    recovery = row(panel(lines, "Jobs in recovery"), "4242", "7")
    # the milestone, when it was reached, how long since the incident opened
    assert recovery[2:7] == [
        "crash",
        "excluded",
        console.clock(NOW - 125),
        "59m53s",
        "requeue_exclude",
    ]

    nodes = panel(lines, "Nodes")
    assert row(nodes, "n17")[1] == "drained + excluded"
    assert row(nodes, "n18")[1] == "excluded"
    assert row(nodes, "n30")[1] == "implicated"

    latency = panel(lines, "Latency")
    assert row(latency, "detection")[1:] == ["200ms", "400ms", "2"]
    assert row(latency, "action")[1:] == ["2.0s", "2.0s", "1"]
    assert row(latency, "running again")[1:] == ["9.0s", "9.0s", "1"]

    assert title(lines, "Needs operator") == "Needs operator · errors (2)"
    attention = " ".join(line.strip() for line in panel(lines, "Needs operator"))
    assert "job 4100 (incident 5): restart limit reached" in attention
    assert "drain n9 refused" in attention or size == (80, 24)  # one line of room there


def test_a_job_that_cannot_start_needs_attention():
    reason = "needs operator: job needs 4 nodes, 3 are usable after excluding n2"
    stuck = [{"job_id": 4400, "incident": 43, "reason": reason}]
    lines = console.attention_lines(console.ViewState(snapshot=snapshot(unplaceable=stuck)))
    assert f"job 4400 cannot start (incident 43): {reason}" in [str(line) for line in lines]


def test_a_small_window_shows_fewer_rows_and_says_how_many_more():
    many = [incident(i, 5000 + i) for i in range(60, 0, -1)]
    lines = frame(console.ViewState(snapshot=snapshot(incidents=many)), 80, 24)
    shown = panel(lines, "Incidents")
    assert title(lines, "Incidents") == "Incidents (last hour 1, last day 2)"  # /v1/status
    assert cells(shown[1])[:2] == ["60", "5060"]  # newest first, under the header row
    more = [line for line in shown if "more" in line]
    listed = [line for line in shown[1:] if line.strip() and "more" not in line]
    assert more and cells(more[0]) == [f"+{60 - len(listed)} more"]
    tall = frame(console.ViewState(snapshot=snapshot(incidents=many)), 80, 50)
    assert len([x for x in panel(tall, "Incidents")[1:] if x.strip()]) > len(listed) + 1


def test_a_failed_fetch_keeps_the_last_data_and_says_since_when():
    state = console.ViewState(snapshot=snapshot(), url="http://head:7765")
    failed_at = datetime(2026, 11, 29, 3, 4, 5).timestamp()
    refused = ClientError(0, "controller at http://head:7765 unreachable: connection refused")
    state.failed(refused, "http://head:7765", failed_at)
    state.failed(refused, "http://head:7765", failed_at + 30)  # still since the first
    lines = frame(state, 120, 40)
    head = panel(lines, "srecovery console")
    assert "controller unreachable since" in head[2] and "— retrying" in head[2]
    assert console.clock(failed_at) in head[2]
    assert row(panel(lines, "Incidents"), "7", "4242")  # the last data stays
    attention = " ".join(line.strip() for line in panel(lines, "Needs operator"))
    assert "did not answer" in attention and "Is it running?" in attention
    state.succeeded(snapshot())
    assert "every 0.5s" in panel(frame(state, 120, 40), "srecovery console")[2]


def test_nothing_fetched_yet_and_unreachable():
    state = console.ViewState(url="http://head:7765")
    state.failed(ClientError(0, "refused"), "http://head:7765", NOW)
    head = panel(frame(state, 80, 24), "srecovery console")
    assert "http://head:7765: no data yet" in head[0]
    assert "controller unreachable since" in head[2]


def test_a_refusal_is_not_called_unreachable():
    state = console.ViewState(snapshot=snapshot())
    state.failed(ClientError(401, "credential expired"), "http://head:7765", NOW)
    head = panel(frame(state, 120, 40), "srecovery console")
    assert "controller refused (401) since" in head[2]
    assert "munged" in " ".join(panel(frame(state, 120, 40), "Needs operator"))


def test_a_degraded_controller_and_slurm_unreachable_show_in_the_header():
    snap = snapshot(
        state="degraded",
        slurm_reachable=False,
        last_error="slurmctld unreachable: timeout",
        in_flight=[],
        needs_operator=[],
        errors=[],
        drained_by_tool=[],
        excluded_by_tool=[],
    )
    lines = frame(console.ViewState(snapshot=snap), 120, 40)
    head = panel(lines, "srecovery console")
    assert "controller degraded" in head[0] and "slurmctld unreachable" in head[0]
    assert "no job in recovery" in panel(lines, "Jobs in recovery")[0]
    assert "nothing needs an operator" in panel(lines, "Needs operator")[0]


@pytest.mark.parametrize("width,height", [(80, 24), (120, 40), (60, 16), (200, 80)])
def test_plan_fills_the_window(width, height):
    p = console.plan(width, height)
    fills = max(height, p.header + (14 if p.wide else 17))
    if p.wide:
        assert p.header + p.incidents + p.recovery == fills
        assert p.header + p.nodes + p.latency + p.attention == fills
    else:
        assert p.nodes == p.latency
        assert p.header + p.incidents + p.recovery + p.attention + p.nodes == fills
    assert min(p.incidents, p.recovery, p.nodes) >= 4 and p.latency >= 6 and p.attention >= 3


def test_percentile_is_nearest_rank():
    assert console.percentile([], 50) is None
    assert console.percentile([3.0], 95) == 3.0
    values = [float(v) for v in range(1, 101)]
    assert console.percentile(values, 50) == 50.0 and console.percentile(values, 95) == 95.0
    assert console.percentile([1.0, 2.0, 10.0], 95) == 10.0


def test_times():
    assert console.elapsed(5) == "5s" and console.elapsed(125) == "2m05s"
    assert console.elapsed(7380) == "2h03m" and console.elapsed(2 * 86400 + 3600) == "2d01h"
    assert console.short_seconds(0.031) == "31ms" and console.short_seconds(2.44) == "2.4s"
    assert console.short_seconds(None) == "-"


class FakeClient:
    """Answers like a controller without /v1/status."""

    url = "http://head:7765"
    timeout = 2.0

    def __init__(self) -> None:
        self.paths: list[str] = []

    def tls_context(self) -> None:
        return None

    def get(self, path: str) -> Any:
        self.paths.append(path)
        if path == "/v1/status":
            raise ClientError(404, "Not Found")
        if path.startswith("/v1/incidents?"):
            return {"incidents": [incident(7, 4242, closed=False), incident(6, 4200)]}
        if path == "/v1/nodes":
            return {"nodes": []}
        if path == "/v1/incidents/7":
            return {"milestones": {"failure": iso(NOW - 9), "held": iso(NOW - 5)}}
        raise AssertionError(path)


def test_a_controller_without_v1_status_is_read_from_healthz(monkeypatch):
    health = {
        "status": "ok",
        "version": "0.1.0",
        "cluster": "old",
        "last_pass": iso(NOW),
        "last_error": "",
        "auth": "munge",
        "modes": {"default": "monitor", "gpu": "act"},
    }
    monkeypatch.setattr(console, "read_healthz", lambda url, timeout, tls: health)
    client = FakeClient()
    snap = console.fetch(client)  # type: ignore[arg-type]
    assert snap.source == "healthz"
    assert client.paths[0] == "/v1/status" and "/v1/incidents/7" in client.paths
    assert snap.status["in_flight"] == [
        {
            "incident": 7,
            "job_id": 4242,
            "kind": "crash",
            "milestone": "held",
            "since": iso(NOW - 5),  # when it reached its last milestone
            "action": "requeue_exclude",
        }
    ]
    lines = frame(console.ViewState(snapshot=snap), 120, 40)
    assert title(lines, "Incidents") == "Incidents (newest first, 2)"
    head = panel(lines, "srecovery console")
    assert "cluster old" in head[0] and "default monitor · gpu act" in head[1]
    assert row(panel(lines, "Jobs in recovery"), "4242", "7")[3] == "held"


def test_a_fetch_that_fails_is_remembered_not_raised():
    class Broken(FakeClient):
        def get(self, path: str) -> Any:
            raise ClientError(0, "controller at http://head:7765 unreachable: refused")

    class Garbled(FakeClient):
        def get(self, path: str) -> Any:
            return ["not", "a", "status"]

    for client in (Broken(), Garbled()):
        state = console.ViewState()
        console.refresh(client, state)  # type: ignore[arg-type]
        assert state.failed_since is not None and state.snapshot is None
        assert state.advice


def test_no_color_is_honoured(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert console.make_console(file=io.StringIO()).no_color
    monkeypatch.delenv("NO_COLOR")
    assert not console.make_console(file=io.StringIO()).no_color


def test_many_errors_fill_their_panel_and_say_how_many_more():
    errors = [  # oldest first, as the controller keeps them
        {"at": iso(NOW - 30 + i), "level": "warning", "message": f"drain n{i} refused"}
        for i in range(30)
    ]
    state = console.ViewState(snapshot=snapshot(errors=errors, needs_operator=[]))
    for size in ((80, 24), (120, 40)):
        lines = frame(state, *size)
        assert title(lines, "Needs operator") == "Needs operator · errors (30)"
        shown = [line.strip() for line in panel(lines, "Needs operator") if line.strip()]
        assert shown[0].endswith("warning drain n29 refused")  # newest first
        if size == (120, 40):
            assert shown[-1] == f"+{30 - len(shown) + 1} more"
