"""``srecovery console``: a live dashboard of the controller in the terminal.

Read endpoints only: ``GET /v1/status`` (or, from a controller without it, ``/healthz``),
``/v1/incidents``, ``/v1/nodes`` (and ``/v1/incidents/ID`` for open incidents when there is no
``/v1/status``). Plain terminal, no mouse, works over SSH; 80x24 is the smallest it is laid out
for (smaller windows show fewer rows); NO_COLOR is honoured. ``q`` or Ctrl-C quits and gives
the terminal back as it was. A fetch that fails shows "controller unreachable since HH:MM:SS —
retrying" in the header and keeps the last data on screen.

The pieces are pure where they can be (:func:`status_from_healthz`, :func:`plan`,
:func:`render`) so the unit tests check the frames without a controller or a terminal;
:func:`fetch` reads, :func:`run_live` and :func:`run_once` drive the terminal.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import click
from rich.console import Console, Group, RenderableType
from rich.layout import Layout
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from slurm_recovery.cli.common import EXIT_OK, explain_client_error
from slurm_recovery.contract.client import ClientError, ControllerClient

#: How many incidents one refresh reads (the table shows the newest that fit; the latency
#: figures are over all of them).
INCIDENT_WINDOW = 200
#: Open incidents whose story is read, one request each, when there is no /v1/status.
IN_FLIGHT_FALLBACK = 8
#: Below this width the panels are stacked in one column.
WIDE = 110
HEADER_HEIGHT = 5


# --- data ------------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """One successful fetch, normalized to the shape of ``GET /v1/status``."""

    fetched_at: float
    status: dict[str, Any]
    incidents: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    #: "status" (the controller's /v1/status) or "healthz" (an older controller).
    source: str = "status"
    #: controller clock minus ours, seconds (so elapsed times are the controller's).
    skew: float = 0.0


@dataclass
class ViewState:
    """What the screen shows: the last good data and the state of the connection."""

    snapshot: Snapshot | None = None
    failed_since: float | None = None
    failure: str = ""
    failure_status: int = 0
    advice: str = ""
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def succeeded(self, snapshot: Snapshot) -> None:
        with self.lock:
            self.snapshot = snapshot
            self.failed_since = None
            self.failure = self.advice = ""
            self.failure_status = 0

    def failed(self, exc: ClientError, url: str, at: float) -> None:
        with self.lock:
            if self.failed_since is None:
                self.failed_since = at
            self.failure = exc.reason
            self.failure_status = exc.status
            self.advice = explain_client_error(exc, url)[0]


def parse_iso(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _mode_entry(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    return {"mode": str(value), "source": "policy", "set_by": None, "set_at": None, "reason": None}


def status_from_healthz(health: dict[str, Any]) -> dict[str, Any]:
    """A ``/v1/status``-shaped dict from what ``/healthz`` says (controllers before
    ``/v1/status``); what /healthz does not know is None."""
    modes = dict(health.get("modes") or {})
    default = modes.pop("default", "monitor")
    last_error = health.get("last_error") or ""
    return {
        "version": health.get("version", ""),
        "cluster": health.get("cluster", ""),
        "state": "active" if health.get("status") == "ok" else "degraded",
        "started_at": None,
        "now": None,
        "last_pass": health.get("last_pass"),
        "last_error": last_error,
        "slurm_reachable": not last_error.startswith("slurmctld unreachable"),
        "auth": health.get("auth", ""),
        "modes": {
            "default": _mode_entry(default),
            "partitions": {name: _mode_entry(mode) for name, mode in modes.items()},
        },
        "in_flight": None,
        "incidents": None,
        "needs_operator": None,
        "errors": (
            [{"at": health.get("last_pass"), "level": "error", "message": last_error}]
            if last_error
            else []
        ),
        "watchdog": None,
        "drained_by_tool": None,
        "excluded_by_tool": None,
    }


def read_healthz(url: str, timeout: float, tls: ssl.SSLContext | None = None) -> dict[str, Any]:
    """``/healthz`` (no credential needed), whether it answers 200 or 503."""
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout, context=tls) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return json.loads(exc.read())
        except ValueError:
            raise ClientError(exc.code, str(exc.reason)) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ClientError(0, f"controller at {url} unreachable: {exc}") from exc


def _last_milestone(story: dict[str, Any]) -> tuple[str, str | None]:
    milestones = story.get("milestones") or {}
    if not milestones:
        return "-", None
    name, at = max(milestones.items(), key=lambda kv: parse_iso(kv[1]) or 0.0)
    return name, at


def fetch(client: ControllerClient, now: float | None = None) -> Snapshot:
    """One refresh from the controller's read endpoints; ClientError when it fails. Every
    string comes back printable: it goes to the terminal past the CLI's PrintableStream."""
    from slurm_recovery.cli.common import printable_data

    def get(path: str) -> Any:
        return printable_data(client.get(path))

    source = "status"
    try:
        status = get("/v1/status")
    except ClientError as exc:
        if exc.status != 404:
            raise
        health = read_healthz(client.url, client.timeout, client.tls_context())
        status = status_from_healthz(health)
        source = "healthz"
    if not isinstance(status, dict):
        raise ClientError(502, "unexpected answer to /v1/status")
    incidents = (get(f"/v1/incidents?limit={INCIDENT_WINDOW}") or {}).get("incidents", [])
    nodes = (get("/v1/nodes") or {}).get("nodes", [])
    if status.get("in_flight") is None:
        in_flight = []
        for item in [i for i in incidents if not i.get("closed_at")][:IN_FLIGHT_FALLBACK]:
            try:
                story = get(f"/v1/incidents/{item['id']}")
            except ClientError as exc:
                if exc.status != 404:
                    raise
                continue
            milestone, reached = _last_milestone(story)
            in_flight.append(
                {
                    "incident": item["id"],
                    "job_id": item.get("job_id"),
                    "kind": item.get("kind", ""),
                    "milestone": milestone,
                    "since": reached or item.get("opened_at"),
                    "action": ((item.get("advice") or {}).get("action") or "-"),
                }
            )
        status["in_flight"] = in_flight
    if status.get("needs_operator") is None:
        status["needs_operator"] = [
            {
                "incident": i["id"],
                "job_id": i.get("job_id"),
                "reason": (i.get("advice") or {}).get("reason") or i.get("outcome") or "",
            }
            for i in incidents
            if (i.get("advice") or {}).get("needs_operator") and not i.get("closed_at")
        ]
    fetched = time.time() if now is None else now
    controller_now = parse_iso(status.get("now"))
    return Snapshot(
        fetched_at=fetched,
        status=status,
        incidents=list(incidents),
        nodes=list(nodes),
        source=source,
        skew=(controller_now - fetched) if controller_now else 0.0,
    )


# --- figures ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


#: (label, key in an incident's "latencies")
LATENCIES = (("detection", "detection"), ("action", "action"), ("running again", "end_to_end"))


def latency_figures(incidents: Sequence[dict[str, Any]]) -> list[tuple[str, Any, Any, int]]:
    """(label, p50, p95, n) per latency, over the incidents that have it."""
    out = []
    for label, key in LATENCIES:
        values = [
            float(v)
            for i in incidents
            if isinstance(v := (i.get("latencies") or {}).get(key), int | float)
        ]
        out.append((label, percentile(values, 50), percentile(values, 95), len(values)))
    return out


def short_seconds(value: float | None) -> str:
    """A latency: ``31ms``, ``2.4s``, ``3m05s``."""
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 100:
        return f"{value:.1f}s"
    minutes, rest = divmod(int(value), 60)
    return f"{minutes}m{rest:02d}s"


def elapsed(value: float | None) -> str:
    """An elapsed time: ``12s``, ``3m05s``, ``2h03m``, ``3d04h``."""
    if value is None:
        return "-"
    value = max(0, int(value))
    if value < 60:
        return f"{value}s"
    if value < 3600:
        return f"{value // 60}m{value % 60:02d}s"
    if value < 86400:
        return f"{value // 3600}h{value % 3600 // 60:02d}m"
    return f"{value // 86400}d{value % 86400 // 3600:02d}h"


def clock(ts: float | None) -> str:
    """Epoch seconds as local ``HH:MM:SS`` (a date too when not today)."""
    if ts is None:
        return "-"
    moment = datetime.fromtimestamp(ts)
    if moment.date() == datetime.now().date():
        return moment.strftime("%H:%M:%S")
    return moment.strftime("%Y-%m-%d %H:%M")


def clock_iso(text: Any) -> str:
    return clock(parse_iso(text))


def incident_state(item: dict[str, Any]) -> str:
    outcome = item.get("outcome")
    if not item.get("closed_at") or not outcome:
        return "open"
    if outcome == "running_again":
        return "running again"
    if outcome.startswith("monitor"):
        return "advised"
    return str(outcome).split(":", 1)[0]


# --- layout ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Heights of the panels for a window; ``wide``: two columns."""

    wide: bool
    header: int
    incidents: int
    recovery: int
    nodes: int
    latency: int
    attention: int


def plan(width: int, height: int) -> Plan:
    """Panel heights that fill ``height`` rows; a small window gets fewer table rows, never a
    panel too small to say what it is."""
    header = HEADER_HEIGHT
    if width >= WIDE:
        rest = max(height - header, 14)
        incidents = math.ceil(rest * 0.6)
        recovery = rest - incidents
        latency = 6
        nodes = (rest - latency) // 2
        attention = rest - latency - nodes
        return Plan(True, header, incidents, recovery, nodes, latency, attention)
    # one column: incidents, jobs in recovery, attention (full width: its lines are long),
    # then nodes beside latency
    rest = max(height - header, 17)
    bottom = 6 if rest < 19 else min(10, 6 + (rest - 19) // 3)
    attention = min(8, 3 + (rest - 17) // 4)
    upper = rest - bottom - attention
    recovery = max(4, upper - math.ceil(upper * 0.6))
    return Plan(False, header, upper - recovery, recovery, bottom, bottom, attention)


def _rows_that_fit(items: Sequence[Any], height: int) -> tuple[list[Any], int]:
    """The items a table panel of ``height`` rows shows, and how many are left out (the last
    row then says "+N more")."""
    room = max(1, height - 3)  # two borders, one header row
    if len(items) <= room:
        return list(items), 0
    shown = max(0, room - 1)
    return list(items[:shown]), len(items) - shown


def _table(*columns: tuple[str, dict[str, Any]], expand: bool = True) -> Table:
    grid = Table(box=None, pad_edge=False, show_edge=False, expand=expand, header_style="bold")
    for name, options in columns:
        grid.add_column(name, no_wrap=True, overflow="ellipsis", **options)
    return grid


def _more(grid: Table, left: int) -> None:
    if left:
        grid.add_row(Text(f"+{left} more", style="dim"))


def _panel(body: RenderableType, title: str, height: int) -> Panel:
    return Panel(body, title=title, title_align="left", height=height, padding=(0, 1))


def _mode_text(name: str, entry: dict[str, Any]) -> str:
    text = f"{name} {entry.get('mode', '?')}"
    if entry.get("source") == "override":
        who = entry.get("set_by") or "?"
        text += f" (override by {who}"
        if entry.get("set_at"):
            text += f" at {clock_iso(entry['set_at'])}"
        text += ")"
    return text


def header(state: ViewState, interval: float, now: float) -> Group:
    snap = state.snapshot
    status = snap.status if snap else {}
    lines = []
    if snap:
        last_pass = parse_iso(status.get("last_pass"))
        ago = f" ({elapsed(now + snap.skew - last_pass)} ago)" if last_pass else ""
        ctl = str(status.get("state", "?"))
        line = Text()
        line.append(f"cluster {status.get('cluster') or '?'}", style="bold")
        line.append("  controller ")
        line.append(ctl, style="bold green" if ctl == "active" else "bold yellow")
        line.append(f"  v{status.get('version', '?')}")
        line.append(f"  last pass {clock(last_pass)}{ago}")
        if status.get("slurm_reachable") is False:
            line.append("  slurmctld unreachable", style="bold red")
        if status.get("auth") and status.get("auth") != "munge":
            line.append(f"  auth {status['auth']}", style="yellow")
        lines.append(line)
        modes = status.get("modes") or {}
        parts = [_mode_text("default", _mode_entry(modes.get("default", "?")))]
        parts += [
            _mode_text(name, _mode_entry(entry))
            for name, entry in sorted((modes.get("partitions") or {}).items())
        ]
        second = Text("mode " + " · ".join(parts))
        watchdog = status.get("watchdog")
        if isinstance(watchdog, dict):
            second.append(
                f"  watchdog {watchdog.get('state', '?')}"
                f" (released {watchdog.get('released_total', 0)})",
                style="" if watchdog.get("state") in ("ok", "never") else "bold yellow",
            )
        lines.append(second)
    else:
        lines.append(
            Text(
                f"controller {state.url or ''}: "
                + ("no data yet" if state.failure else "waiting for the first answer…")
            )
        )
        lines.append(Text(""))
    if state.failed_since is not None:
        what = "unreachable" if state.failure_status == 0 else f"refused ({state.failure_status})"
        lines.append(
            Text(
                f"controller {what} since {clock(state.failed_since)} — retrying"
                + (" (showing the last data)" if snap else ""),
                style="bold red",
            )
        )
    else:
        updated = clock(snap.fetched_at) if snap else "-"
        lines.append(
            Text(f"updated {updated} · every {interval:g}s · q quits · r refreshes", style="dim")
        )
    for line in lines:
        line.no_wrap = True
        line.overflow = "ellipsis"
    return Group(*lines)


def incidents_panel(snap: Snapshot | None, height: int) -> Panel:
    grid = _table(
        ("ID", {"justify": "right", "min_width": 3}),
        ("JOB", {"justify": "right", "min_width": 4}),
        ("KIND", {"min_width": 5}),
        ("CLASS", {"min_width": 5}),
        ("NODES", {"min_width": 5}),
        ("ACTION", {"min_width": 6}),
        ("STATE", {"min_width": 6, "ratio": 1}),  # the column that gives up room
        ("OPENED", {"min_width": 8}),
    )
    items = snap.incidents if snap else []
    shown, left = _rows_that_fit(items, height)
    for item in shown:
        advice = item.get("advice") or {}
        verdict = advice.get("verdict") or {}
        state = incident_state(item)
        grid.add_row(
            str(item.get("id", "?")),
            str(item.get("job_id", "-")),
            str(item.get("kind", "-")),
            str(item.get("fault_class") or verdict.get("fault_class") or "-"),
            ",".join(item.get("nodes") or verdict.get("nodes") or []) or "-",
            str(advice.get("action") or "-"),
            Text(state, style="bold" if state == "open" else ""),
            clock_iso(item.get("opened_at")),
        )
    _more(grid, left)
    body: RenderableType = grid if items else Text("no incidents", style="dim")
    return _panel(body, incidents_title(snap), height)


def incidents_title(snap: Snapshot | None) -> str:
    """``Incidents (last hour 2, last day 9)`` from /v1/status, else how many were read."""
    counts = (snap.status.get("incidents") if snap else None) or {}
    hour = (counts.get("last_hour") or {}).get("total")
    day = (counts.get("last_day") or {}).get("total")
    if isinstance(hour, int) and isinstance(day, int):
        return f"Incidents (last hour {hour}, last day {day})"
    return f"Incidents (newest first, {len(snap.incidents) if snap else 0})"


def recovery_panel(snap: Snapshot | None, height: int, now: float) -> Panel:
    """Open incidents: the milestone the job has reached and when, and how long since the
    incident opened (ELAPSED)."""
    grid = _table(
        ("JOB", {"justify": "right", "min_width": 4}),
        ("INCIDENT", {"justify": "right"}),
        ("KIND", {}),
        ("MILESTONE", {"min_width": 8}),
        ("REACHED", {"min_width": 8}),
        ("ELAPSED", {"justify": "right"}),
        ("ACTION", {"ratio": 1}),
    )
    items = (snap.status.get("in_flight") or []) if snap else []
    opened = {i.get("id"): parse_iso(i.get("opened_at")) for i in snap.incidents} if snap else {}
    shown, left = _rows_that_fit(items, height)
    for item in shown:
        since = opened.get(item.get("incident")) or parse_iso(item.get("since"))
        grid.add_row(
            str(item.get("job_id", "-")),
            str(item.get("incident", "-")),
            str(item.get("kind", "-")),
            str(item.get("milestone") or "-"),
            clock_iso(item.get("since")),
            elapsed(now + snap.skew - since) if since and snap else "-",
            str(item.get("action") or "-"),
        )
    _more(grid, left)
    body: RenderableType = grid if items else Text("no job in recovery", style="dim")
    return _panel(body, f"Jobs in recovery ({len(items)})", height)


def node_rows(snap: Snapshot) -> list[tuple[str, str, str]]:
    """(node, what the tool did, why): drained and excluded by the tool, then nodes implicated
    in the last day."""
    status = snap.status
    known = {n.get("name"): n for n in snap.nodes if n.get("name")}
    drained = status.get("drained_by_tool")
    if drained is None:
        drained = [name for name, n in known.items() if n.get("drained_by_tool")]
    excluded = status.get("excluded_by_tool") or []
    rows = []
    for name in sorted(set(drained) | set(excluded)):
        what = " + ".join(
            w for w, on in (("drained", name in drained), ("excluded", name in excluded)) if on
        )
        rows.append((name, what, (known.get(name) or {}).get("drain_reason") or ""))
    horizon = snap.fetched_at + snap.skew - 86400
    for name, n in sorted(known.items()):
        last = parse_iso(n.get("last_implicated_at"))
        if name in drained or name in excluded or not last or last < horizon:
            continue
        count = n.get("implicated_count", 0)
        rows.append((name, "implicated", f"{count} times, last {clock(last)}"))
    return rows


def nodes_panel(snap: Snapshot | None, height: int) -> Panel:
    grid = _table(("NODE", {"min_width": 4}), ("BY THE TOOL", {}), ("WHY", {"ratio": 1}))
    items = node_rows(snap) if snap else []
    shown, left = _rows_that_fit(items, height)
    for row in shown:
        grid.add_row(*row)
    _more(grid, left)
    body: RenderableType = grid if items else Text("none drained or excluded", style="dim")
    return _panel(body, "Nodes", height)


def latency_panel(snap: Snapshot | None, height: int) -> Panel:
    grid = _table(
        ("", {}),
        ("p50", {"justify": "right"}),
        ("p95", {"justify": "right"}),
        ("n", {"justify": "right"}),
        expand=False,
    )
    figures = latency_figures(snap.incidents if snap else [])
    for label, p50, p95, n in figures:
        grid.add_row(label, short_seconds(p50), short_seconds(p95), str(n))
    count = len(snap.incidents) if snap else 0
    return _panel(grid, f"Latency (last {count} incident{'' if count == 1 else 's'})", height)


def attention_lines(state: ViewState) -> list[Text]:
    lines = []
    if state.advice:
        lines.append(Text(state.advice, style="red", no_wrap=False, overflow="fold"))
    snap = state.snapshot
    if snap:
        for item in snap.status.get("needs_operator") or []:
            lines.append(
                Text(
                    f"job {item.get('job_id')} (incident {item.get('incident')}): "
                    f"{item.get('reason', '')}",
                    style="bold yellow",
                )
            )
        for item in snap.status.get("unplaceable") or []:
            lines.append(
                Text(
                    f"job {item.get('job_id')} cannot start (incident {item.get('incident')}): "
                    f"{item.get('reason', '')}",
                    style="bold yellow",
                )
            )
        for item in reversed(snap.status.get("errors") or []):
            lines.append(
                Text(
                    f"{clock_iso(item.get('at'))} {item.get('level', '')} "
                    f"{item.get('message', '')}",
                    style="red" if item.get("level") in ("error", "critical") else "",
                )
            )
    return lines


def attention_panel(state: ViewState, height: int, wrap_width: int = 0) -> Panel:
    """Needs-operator items, then the newest errors. ``wrap_width``: long lines wrap at that
    width (a narrow panel with room below), else each is one line cut with an ellipsis."""
    lines = attention_lines(state)
    count = len(lines)
    room = max(1, height - 2)

    def rows(line: Text) -> int:
        return max(1, math.ceil(len(line.plain) / wrap_width)) if wrap_width else 1

    shown: list[Text] = []
    used = 0
    for index, line in enumerate(lines):
        left = count - index - 1
        need = rows(line) + (1 if left else 0)  # keep a row for "+N more"
        if used + need > room and shown:
            break
        shown.append(line)
        used += rows(line)
    if len(shown) < count and used < room:
        shown.append(Text(f"+{count - len(shown)} more", style="dim"))
    for line in shown:
        if line.no_wrap is None:
            line.no_wrap = not wrap_width
            line.overflow = "fold" if wrap_width else "ellipsis"
    body: RenderableType = (
        Group(*shown) if shown else Text("nothing needs an operator; no errors", style="dim")
    )
    return _panel(body, f"Needs operator · errors ({count})", height)


def render(state: ViewState, width: int, height: int, interval: float, now: float) -> Layout:
    """One frame for a ``width`` x ``height`` window."""
    with state.lock:
        p = plan(width, height)
        snap = state.snapshot
        root = Layout(name="root")
        top = Layout(
            Panel(
                header(state, interval, now),
                title="srecovery console",
                title_align="left",
                height=p.header,
                padding=(0, 1),
            ),
            size=p.header,
        )
        incidents = Layout(incidents_panel(snap, p.incidents), size=p.incidents)
        recovery = Layout(recovery_panel(snap, p.recovery, now), size=p.recovery)
        nodes = Layout(nodes_panel(snap, p.nodes), size=p.nodes)
        latency = Layout(latency_panel(snap, p.latency), size=p.latency)
        attention = Layout(attention_panel(state, p.attention))
        if p.wide:
            left = Layout(ratio=1)
            left.split_column(incidents, recovery)
            right_width = min(64, max(40, width * 3 // 10))
            attention.update(attention_panel(state, p.attention, right_width - 4))
            right = Layout(size=right_width)
            right.split_column(nodes, latency, attention)
            body = Layout()
            body.split_row(left, right)
            root.split_column(top, body)
        else:
            bottom = Layout(size=p.nodes)
            latency.size = 36
            nodes.size = None
            bottom.split_row(nodes, latency)
            attention.size = p.attention
            root.split_column(top, incidents, recovery, attention, bottom)
        return root


# --- the terminal ----------------------------------------------------------------------------


def make_console(file: Any = None, width: int | None = None, height: int | None = None) -> Console:
    from slurm_recovery.cli.common import raw_stream

    return Console(
        file=file if file is not None else raw_stream(),
        width=width,
        height=height,
        highlight=False,
        markup=False,  # "[bold]" in a user's words is shown, not obeyed
        no_color=bool(os.environ.get("NO_COLOR")) or None,
    )


class Fetcher(threading.Thread):
    """Fetches every ``interval`` seconds (at once when woken) into ``state``."""

    def __init__(self, client: ControllerClient, state: ViewState, interval: float) -> None:
        super().__init__(name="srecovery-console-fetch", daemon=True)
        self.client, self.state, self.interval = client, state, interval
        self.changed = threading.Event()
        self.wake = threading.Event()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            refresh(self.client, self.state)
            self.changed.set()
            self.wake.wait(self.interval)
            self.wake.clear()


def refresh(client: ControllerClient, state: ViewState) -> None:
    """One fetch into ``state``; a failure is remembered there, never raised."""
    try:
        state.succeeded(fetch(client))
    except ClientError as exc:
        state.failed(exc, client.url, time.time())
    except Exception as exc:  # an answer we could not read: say so, keep the last data
        state.failed(ClientError(502, f"unexpected answer: {exc!r}"), client.url, time.time())


@contextlib.contextmanager
def keys(stream: Any) -> Iterator[int | None]:
    """Single keypresses from ``stream`` (cbreak: no echo, no Enter; Ctrl-C still interrupts),
    the terminal restored on the way out; None when it is not a terminal."""
    try:
        fd = stream.fileno()
        interactive = os.isatty(fd)
    except (AttributeError, ValueError, OSError):
        interactive = False
    if not interactive:
        yield None
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run_live(client: ControllerClient, interval: float) -> int:
    from rich.live import Live

    state = ViewState(url=client.url)
    fetcher = Fetcher(client, state, interval)
    console = make_console()
    fetcher.start()

    def frame() -> RenderableType:
        width, height = console.size
        try:
            return render(state, width, height, interval, time.time())
        except Exception as exc:  # a bug in a panel must not leave a traceback on screen
            return Panel(Text(f"cannot draw this frame: {exc!r}"), title="srecovery console")

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM, SIGHUP: leave as q does, terminal restored

    def resized(signum: int, frame: Any) -> None:
        fetcher.changed.set()  # draw again at the new size now, not within the second

    previous = {
        sig: signal.signal(sig, handler)
        for sig, handler in (
            # SIGINT too: a ^C must quit even when the console inherited SIGINT ignored (a
            # parent that ignores it: nohup, some job launchers and test runners)
            (signal.SIGINT, interrupted),
            (signal.SIGTERM, interrupted),
            (signal.SIGHUP, interrupted),
            (signal.SIGWINCH, resized),
        )
    }
    try:
        with (
            keys(sys.stdin) as fd,
            Live(
                frame(),
                console=console,
                screen=True,
                auto_refresh=False,
                redirect_stdout=False,
                redirect_stderr=False,
            ) as live,
        ):
            last_draw = 0.0
            while True:
                if fd is not None:
                    ready, _, _ = select.select([fd], [], [], 0.1)
                    pressed = os.read(fd, 64).decode(errors="replace") if ready else ""
                else:
                    time.sleep(0.1)
                    pressed = ""
                if "q" in pressed.lower():
                    break
                if "r" in pressed.lower():
                    fetcher.wake.set()
                if fetcher.changed.is_set() or time.monotonic() - last_draw >= 1.0:
                    fetcher.changed.clear()
                    live.update(frame(), refresh=True)
                    last_draw = time.monotonic()
    except KeyboardInterrupt:
        pass
    finally:
        fetcher.stopping.set()
        fetcher.wake.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return EXIT_OK


def run_once(client: ControllerClient, interval: float) -> int:
    """One frame on stdout; the exit code of the fetch (0, or what explain_client_error
    says)."""
    state = ViewState(url=client.url)
    code = EXIT_OK
    try:
        state.succeeded(fetch(client))
    except ClientError as exc:
        state.failed(exc, client.url, time.time())
        code = explain_client_error(exc, client.url)[1]
    console = make_console()
    width, height = console.size
    if not sys.stdout.isatty():
        width = int(os.environ.get("COLUMNS") or 120)
        height = int(os.environ.get("LINES") or 40)
        console = make_console(width=width, height=height)
    console.print(render(state, width, height, interval, time.time()), height=height)
    if code:
        click.echo(f"srecovery: {state.advice}", err=True)
    return code


@click.command("console")
@click.option(
    "--interval",
    type=click.FloatRange(0.2, 3600),
    default=2.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds between refreshes.",
)
@click.option("--once", is_flag=True, help="Print one frame to stdout and exit (for scripts).")
@click.pass_context
def console_command(ctx: click.Context, interval: float, once: bool) -> None:
    """Show a live dashboard of the controller: incidents, jobs in recovery, nodes, latency.

    Refreshes every --interval seconds from the controller's read endpoints; q or Ctrl-C quits.
    Plain terminal, no mouse (fine over SSH), 80x24 or larger; NO_COLOR turns colour off.
    When the controller does not answer, the header says since when and the last data stays.
    Without a terminal on stdout it prints one frame, like --once (size from $COLUMNS and
    $LINES, default 120x40).
    """
    from slurm_recovery.cli import load_or_exit
    from slurm_recovery.cli.common import client_for

    config = load_or_exit(ctx)
    client = client_for(config)
    client.timeout = min(client.timeout, max(2.0, interval * 4))
    if once or not sys.stdout.isatty():
        ctx.exit(run_once(client, interval))
    ctx.exit(run_live(client, interval))


#: The commands this module adds to ``srecovery``.
COMMANDS: list[click.Command] = [console_command]
