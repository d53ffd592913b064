"""``srecovery incidents|advice list|explain|nodes``: what the controller knows, read through its
API (signed with MUNGE), as tables that fit the terminal or as JSON (``--json``).

- ``incidents`` (``advice list`` is its older name): incidents newest first, filtered by the
  controller (``GET /v1/incidents``);
- ``explain JOBID|iN``: the story of a job's incidents, or of one incident, as a timeline
  (``GET /v1/jobs/JOBID``, ``GET /v1/incidents/N``);
- ``nodes [NODE]``: Slurm's nodes with what the tool did to them and its lemon score
  (``GET /v1/nodes``, ``GET /v1/nodes/NODE``).

The text is built by pure functions (:func:`incident_rows`, :func:`render_story`,
:func:`node_rows`, :func:`render_node`) from the API's JSON, so what ``--json`` prints is
exactly what the text shows.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

import click

from slurm_recovery.cli import common
from slurm_recovery.contract import hostlist
from slurm_recovery.contract.client import ClientError

CLASSES = ("hardware", "system", "application", "unknown")
KINDS = ("crash", "doomed", "app_fault", "hang", "straggler")
INCIDENT_HEADERS = (
    "ID",
    "OPENED",
    "JOB",
    "KIND",
    "CLASS",
    "NODES",
    "ACTION",
    "MODE",
    "STATE/OUTCOME",
    "REASON",
)
NODE_HEADERS = (
    "NODE",
    "STATE",
    "FINDINGS",
    "TOOL DRAIN",
    "EXCLUDED BY",
    "IMPLICATED",
    "LEMON",
    "REASON",
)


def _client(ctx: click.Context) -> tuple[Any, str]:
    from slurm_recovery.cli import load_or_exit

    config = load_or_exit(ctx)
    return common.client_for(config), config.client.url


def _get(ctx: click.Context, path: str, not_found: str | None = None) -> Any:
    """GET ``path``; a 404 becomes ``not_found`` (exit 1), other trouble common's message."""
    client, url = _client(ctx)
    try:
        return client.get(path)
    except ClientError as exc:
        if exc.status == 404 and not_found:
            common.fail(f"{not_found} (the controller answered 404)")
        message, code = common.explain_client_error(exc, url)
        common.fail(message, code)


# ------------------------------------------------------------------------- incidents


def incident_query(
    *,
    since: float | None,
    job_id: int | None,
    node: str | None,
    fault_class: str | None,
    state: str | None,
    kinds: Sequence[str],
    limit: int,
) -> str:
    """The ``GET /v1/incidents`` path for these filters. Pure."""
    params: list[tuple[str, str]] = []
    if since is not None:
        params.append(("since", f"{since:.3f}"))
    if job_id is not None:
        params.append(("job", str(job_id)))
    if node:
        params.append(("node", node))
    if fault_class:
        params.append(("class", fault_class))
    if state:
        params.append(("state", state))
    if kinds:
        params.append(("kind", ",".join(dict.fromkeys(kinds))))
    params.append(("limit", str(limit)))
    return f"/v1/incidents?{urlencode(params)}"


def short_outcome(item: Mapping[str, Any]) -> str:
    """``open``, or the outcome without the reason a stop repeats (REASON has it)."""
    if not item.get("closed_at"):
        return "open"
    outcome = item.get("outcome") or "closed"
    return "stopped" if outcome.startswith("stopped: ") else outcome


def incident_rows(items: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """Rows of the incidents table (INCIDENT_HEADERS). Pure."""
    rows = []
    for item in items:
        advice = item.get("advice") or {}
        verdict = advice.get("verdict") or {}
        nodes = item.get("nodes", verdict.get("nodes", []))
        rows.append(
            [
                item["id"],
                common.when(item.get("opened_at")),
                item.get("job_id"),
                item.get("kind"),
                item.get("fault_class") or verdict.get("fault_class"),
                hostlist.compress(nodes) or "-",
                advice.get("action"),
                advice.get("mode"),
                short_outcome(item),
                advice.get("reason") or item.get("summary"),
            ]
        )
    return rows


def _incident_options(fn: Any) -> Any:
    options = [
        click.option(
            "--since",
            type=common.SINCE,
            help="Only incidents opened since WHEN: 90s, 2h, 3d, 1w, or 2026-11-29[T03:00].",
        ),
        click.option("--job", "job_id", type=click.IntRange(1), help="Only this job's."),
        click.option(
            "--node",
            help="Only incidents whose job ran on NODE or whose verdict implicated it.",
        ),
        click.option(
            "--class", "fault_class", type=click.Choice(CLASSES), help="Only this verdict class."
        ),
        click.option("--state", type=click.Choice(("open", "closed")), help="Open or closed."),
        click.option("--open", "open_only", is_flag=True, help="Same as --state open."),
        click.option(
            "--kind",
            "kinds",
            type=click.Choice(KINDS),
            multiple=True,
            help="Only this kind (repeat for several).",
        ),
        click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True),
        common.json_option,
        click.pass_context,
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _list_incidents(
    ctx: click.Context,
    since: float | None,
    job_id: int | None,
    node: str | None,
    fault_class: str | None,
    state: str | None,
    open_only: bool,
    kinds: tuple[str, ...],
    limit: int,
    as_json: bool,
) -> None:
    if open_only:
        if state == "closed":
            raise click.UsageError("--open and --state closed contradict each other")
        state = "open"
    path = incident_query(
        since=since,
        job_id=job_id,
        node=node,
        fault_class=fault_class,
        state=state,
        kinds=kinds,
        limit=limit,
    )
    result = _get(ctx, path)
    if as_json:
        common.print_json(result)
        return
    items = result.get("incidents", [])
    if not items:
        click.echo("no incidents match")
        return
    common.table(INCIDENT_HEADERS, incident_rows(items))
    if result.get("more"):
        click.echo(
            f"({len(items)} shown, newest first; more match: raise --limit or narrow with "
            "--since, --job, --node)",
            err=True,
        )


@click.command("incidents")
@_incident_options
def incidents(ctx: click.Context, **kwargs: Any) -> None:
    """Incidents, newest first: verdict class, implicated nodes, advice, outcome and why.

    \b
    Examples:
      srecovery incidents --since 12h          what happened overnight
      srecovery incidents --node n17 --since 30d
      srecovery incidents --state open --class hardware --json
    """
    _list_incidents(ctx, **kwargs)


@click.group()
def advice() -> None:
    """Advice the controller gave (one per incident, newest generation)."""


@advice.command("list")
@_incident_options
def advice_list(ctx: click.Context, **kwargs: Any) -> None:
    """Incidents with their verdict and advice, newest first (same as `srecovery incidents`)."""
    _list_incidents(ctx, **kwargs)


# --------------------------------------------------------------------------- explain

_INCIDENT_REF = re.compile(r"^[iI]#?(\d+)$")


def parse_target(target: str | None, incident: int | None) -> tuple[str, int]:
    """``("job", 1234)`` or ``("incident", 56)`` from ``JOBID``, ``iN`` or ``--incident N``;
    click.UsageError otherwise. Pure."""
    if target is not None and incident is not None:
        raise click.UsageError("give a job id or --incident, not both")
    if incident is not None:
        return ("incident", incident)
    if target is None:
        raise click.UsageError("give a job id (1234) or an incident id (i56, or --incident 56)")
    text = target.strip()
    found = _INCIDENT_REF.match(text)
    if found and int(found.group(1)) >= 1:
        return ("incident", int(found.group(1)))
    if text.isdigit() and int(text) >= 1:
        return ("job", int(text))
    raise click.UsageError(
        f"{target!r} is neither a job id (1234) nor an incident id (i56, or --incident 56)"
    )


def _clock(iso_time: str | None, with_date: bool = False) -> str:
    """ISO time -> local ``HH:MM:SS.mmm`` (with the date and zone when asked)."""
    if not iso_time:
        return "-"
    local = datetime.fromisoformat(iso_time).astimezone()
    if with_date:
        return local.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + local.strftime(" %Z")
    return local.strftime("%H:%M:%S.%f")[:-3]


def _offset(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    sign = "-" if seconds < 0 else "+"
    value = abs(seconds)
    if value < 120:
        return f"{sign}{value:.3f}s"
    minutes, rest = divmod(value, 60)
    return f"{sign}{int(minutes)}m{rest:06.3f}s"


def _audit(seq: int | None) -> str:
    return f"  [audit {seq}]" if seq is not None else ""


def render_story(story: Mapping[str, Any]) -> list[str]:
    """One incident as text: header, decisive evidence, verdict, advice and rule, the timeline
    with each step's time after the failure, latencies, audit rows. Pure."""
    advice = story.get("advice") or {}
    verdict = advice.get("verdict") or {}
    state = story.get("outcome") if story.get("closed_at") else "open"
    lines = [
        f"incident {story['id']}: job {story.get('job_id')} attempt "
        f"{story.get('restart_count')} ({story.get('kind')}), {state}",
    ]
    if story.get("summary"):
        lines.append(f"  summary  {story['summary']}")
    opened = f"  opened   {_clock(story.get('opened_at'), with_date=True)}"
    if story.get("closed_at"):
        opened += f", closed {_clock(story['closed_at'])}"
    lines.append(opened)
    decisive = story.get("decisive_evidence") or []
    if decisive:
        basis = decisive[0].get("basis")
        why = "what the verdict rests on" if basis == "verdict" else "what opened the incident"
        lines.append(f"  evidence ({why}):")
        for e in decisive:
            lines.append(
                f"    #{e['id']} {_clock(e.get('observed_at'))} {e.get('source')}: "
                f"{e.get('description') or e.get('kind')}{_audit(e.get('audit_seq'))}"
            )
    else:
        lines.append("  evidence none recorded")
    nodes = hostlist.compress(verdict.get("nodes") or []) or "-"
    lines.append(
        f"  verdict  {verdict.get('fault_class', 'unknown')} nodes={nodes}"
        f" confidence={verdict.get('confidence')} cause={verdict.get('cause') or '-'}"
    )
    if advice:
        lines.append(
            f"  advice   {advice.get('action')} ({advice.get('mode')} mode, rule "
            f"{advice.get('rule')}): {advice.get('reason')}"
        )
        extra = []
        if advice.get("exclude"):
            extra.append(f"exclude {hostlist.compress(advice['exclude'])}")
        if advice.get("drain"):
            extra.append(f"drain {hostlist.compress(advice['drain'])}")
        if advice.get("needs_operator"):
            extra.append("needs an operator")
        history = story.get("advice_history") or []
        latest = next((a for a in history if a.get("id") == advice.get("id")), advice)
        extra.append(f"advice {advice.get('id')} generation {advice.get('generation')}")
        if latest.get("audit_seq") is not None:
            extra.append(f"audit {latest['audit_seq']}")
        lines.append("           " + ", ".join(extra))
    else:
        lines.append("  advice   none yet")
    timeline = story.get("timeline") or []
    failure = (story.get("milestones") or {}).get("failure")
    if timeline:
        lines.append(f"  timeline (seconds after the failure at {_clock(failure)}):")
        for entry in timeline:
            label = entry["text"]
            if entry["type"] == "evidence":
                label = f"evidence #{entry['id']}: {label}"
            elif entry["type"] == "action":
                label = f"action {label}"
                if entry.get("duration") is not None:
                    label += f" ({common.seconds(entry['duration'])})"
            lines.append(
                f"    {_offset(entry.get('offset')):>10}  {_clock(entry['at'])}  {label}"
                f"{_audit(entry.get('audit_seq'))}"
            )
    latencies = story.get("latencies") or {}
    if latencies:
        words = {"detection": "detection", "action": "action", "end_to_end": "end-to-end"}
        lines.append(
            "  latency  "
            + ", ".join(f"{words.get(k, k)} {common.seconds(v)}" for k, v in latencies.items())
        )
    seqs = [row["seq"] for row in story.get("audit") or []]
    if seqs:
        lines.append(f"  audit    rows {', '.join(map(str, seqs))}")
    return lines


@click.command("explain")
@click.argument("target", required=False, metavar="JOBID|iN")
@click.option("--incident", type=click.IntRange(1), help="Explain this incident (same as iN).")
@common.json_option
@click.pass_context
def explain(ctx: click.Context, target: str | None, incident: int | None, as_json: bool) -> None:
    """The story of a job's incidents, or of one incident: the decisive evidence, the verdict,
    the rule that decided, and a timeline of what happened and what was done, with each
    step's time after the failure and the audit rows that record it.

    \b
    JOBID   a Slurm job id: every incident of the job, oldest first
    iN      an incident id (as `srecovery incidents` lists it), e.g. i56; or --incident 56
    """
    what, ident = parse_target(target, incident)
    if what == "job":
        result = _get(
            ctx,
            f"/v1/jobs/{ident}",
            not_found=f"job {ident}: no incidents on record (`srecovery incidents --since 1d` "
            "lists recent ones)",
        )
    else:
        story = _get(ctx, f"/v1/incidents/{ident}", not_found=f"no incident {ident}")
        result = {"job_id": story.get("job_id"), "incidents": [story]}
    if as_json:
        common.print_json(result)
        return
    for index, story in enumerate(result.get("incidents", [])):
        if index:
            click.echo("")
        click.echo("\n".join(render_story(story)))
    for earlier in result.get("earlier_jobs", []):
        ids = ", ".join(f"i{i}" for i in earlier.get("incidents", []))
        click.echo(
            f"\nan earlier job with id {ident} (first seen {earlier.get('first_seen') or '?'}) "
            f"had incidents {ids}: `srecovery explain i<N>` tells them"
        )


# ----------------------------------------------------------------------------- nodes


def _state(node: Mapping[str, Any]) -> str:
    slurm = node.get("slurm")
    if not slurm:
        return "(not in Slurm)"
    flags = [f for f in slurm.get("flags", []) if f]
    return "+".join([slurm.get("state", "?"), *flags])


def _findings_short(findings: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for f in findings:
        where = f" gpu{f['gpu']}" if f.get("gpu") is not None else ""
        where += f" {f['port']}" if f.get("port") else ""
        parts.append(f"{f['check']}{where} ({f.get('severity')})")
    return ", ".join(parts) or "-"


def _lemon_short(lemon: Mapping[str, Any]) -> str:
    score = f"{lemon.get('score', 0):.2f}"
    return f"{score} LEMON" if lemon.get("lemon") else score


def node_rows(nodes: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """Rows of the nodes table (NODE_HEADERS). Pure."""
    rows = []
    for node in nodes:
        drain = node.get("drain")
        tool = "-"
        if drain and drain.get("in_force") is not False:
            tool = f"{common.when(drain.get('at'))} i{drain.get('incident') or '?'}"
        incidents = node.get("incidents") or {}
        implicated = str(incidents.get("count", 0))
        if incidents.get("last"):
            implicated += f" (last {common.when(incidents['last'])})"
        slurm = node.get("slurm") or {}
        rows.append(
            [
                node["name"],
                _state(node),
                _findings_short(node.get("findings") or []),
                tool,
                ",".join(map(str, node.get("excluded_by") or [])) or "-",
                implicated,
                _lemon_short(node.get("lemon") or {}),
                slurm.get("reason") or "-",
            ]
        )
    return rows


def aligned(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A plain table as lines, columns padded to their widest cell (the last one not). Pure."""
    cells = [list(headers), *[["-" if c in (None, "") else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)) + "  " + row[-1]
        for row in cells
    ]


def render_node(node: Mapping[str, Any], *, bullet: str = "*") -> list[str]:
    """One node in detail, like ``systemctl status``. Pure."""
    lemon = node.get("lemon") or {}
    slurm = node.get("slurm")
    drain = node.get("drain")
    title = f"{bullet} {node['name']} - {_state(node)}"
    if drain and drain.get("in_force") is not False:
        title += f" - drained by slurm-recovery (incident {drain.get('incident') or '?'})"
    if lemon.get("lemon"):
        title += f" - LEMON (score {lemon['score']:.2f})"
    lines = [title]
    if slurm:
        parts = [f"state {_state(node)}"]
        if slurm.get("partitions"):
            parts.append(f"partitions {','.join(slurm['partitions'])}")
        reason = f'reason "{slurm["reason"]}"' if slurm.get("reason") else "no reason"
        parts.append(reason)
        lines.append(f"       Slurm: {', '.join(parts)}")
    else:
        lines.append("       Slurm: not shown (not in Slurm, or the controller has not read it)")
    sidecar = node.get("sidecar")
    if sidecar:
        line = (
            f"     Sidecar: last report {common.when(sidecar.get('last_report'))}; unchanged "
            f"since {common.when(sidecar.get('last_change'))} "
            f"({sidecar.get('reports_since_change')} report(s)); readings of "
            f"{common.when(sidecar.get('readings_at'))}"
        )
        problems = sidecar.get("problems") or {}
        line += "; " + (
            ", ".join(f"{name}: {text}" for name, text in problems.items())
            if problems
            else "sources ok"
        )
        if sidecar.get("delivery_error"):
            line += f"; delivery failing: {sidecar['delivery_error']}"
        lines.append(line)
    else:
        lines.append("     Sidecar: no report on record")
    if drain and drain.get("in_force") is not False:
        lines.append(
            f"       Drain: by the tool since {common.when(drain.get('at'))}, incident "
            f"{drain.get('incident') or '?'}: {drain.get('reason')}"
        )
    else:
        lines.append("       Drain: not drained by the tool")
    excluded = node.get("excluded_by") or []
    lines.append(
        "    Excluded: "
        + (
            f"by job(s) {', '.join(map(str, excluded))} (requeued by the tool)"
            if excluded
            else "by no job the tool requeued"
        )
    )
    incidents = node.get("incidents") or {}
    implicated = f"  Implicated: {incidents.get('count', 0)} incident(s) in all"
    if incidents.get("last"):
        implicated += f", last {common.when(incidents['last'])}"
    window = lemon.get("window_days", 30)
    implicated += f"; {incidents.get('recent', 0)} in the last {window:g} days"
    if incidents.get("recent_ids"):
        implicated += f" ({', '.join(f'i{i}' for i in incidents['recent_ids'])})"
    lines.append(implicated)
    lines.append(
        f" Lemon score: {lemon.get('score', 0):.2f}"
        f" ({'a LEMON: a repeat offender' if lemon.get('lemon') else 'not a lemon'}; "
        f"threshold {lemon.get('threshold', 0):g}, last {window:g} days, half-life "
        f"{lemon.get('half_life_days', 7):g} days)"
    )
    lines.append(f"              {lemon.get('explanation', '')}")
    findings = node.get("findings") or []
    lines.append(f"    Findings: {'none open' if not findings else f'{len(findings)} open'}")
    for f in findings:
        where = f"GPU {f['gpu']} " if f.get("gpu") is not None else ""
        where += f"port {f['port']} " if f.get("port") else ""
        lines.append(
            f"              {where}{f['check']} ({f.get('severity')}) since "
            f"{common.when(f.get('since'))}: {f.get('detail') or '-'}  [evidence "
            f"#{f['evidence_id']}]"
        )
    drains = node.get("drains") or []
    if drains:
        lines.append("  Tool drains:")
        for d in drains[-10:]:
            lines.append(
                f"              {common.when(d.get('at'))}  incident {d.get('incident')}: "
                f"{d.get('reason')}"
            )
    recent = node.get("recent_incidents")
    if recent is not None:
        lines.append("")
        lines.append("Recent incidents (job ran on the node, or its verdict implicated it):")
        if recent:
            lines.extend("  " + line for line in aligned(INCIDENT_HEADERS, incident_rows(recent)))
        else:
            lines.append("  none")
    evidence = node.get("recent_evidence")
    if evidence is not None:
        lines.append("")
        lines.append("Recent evidence (newest first):")
        for e in evidence or []:
            lines.append(
                f"  {common.when(e.get('observed_at'))}  #{e['id']}  {e.get('source')}: "
                f"{e.get('description') or e.get('kind')}"
            )
        if not evidence:
            lines.append("  none")
    return lines


@click.command("nodes")
@click.argument("node", required=False)
@common.json_option
@click.pass_context
def nodes(ctx: click.Context, node: str | None, as_json: bool) -> None:
    """Slurm's nodes with what slurm-recovery knows: Slurm state and reason, open GPU and
    fabric findings, drains and exclusions by the tool, incidents that implicated the node,
    and its lemon (repeat-offender) score. With NODE: that node in detail, with its recent
    evidence and incidents."""
    if node is not None:
        if "[" in node or "," in node:
            raise click.UsageError("give one node name (not a host list)")
        item = _get(ctx, f"/v1/nodes/{node}", not_found=f"node {node}: not known")
        if as_json:
            common.print_json(item)
            return
        bullet = "●" if sys.stdout.isatty() else "*"
        click.echo("\n".join(render_node(item, bullet=bullet)))
        return
    result = _get(ctx, "/v1/nodes")
    if as_json:
        common.print_json(result)
        return
    items = result.get("nodes", [])
    if not items:
        click.echo("no nodes: Slurm shows none and the tool has no record of any")
        return
    common.table(NODE_HEADERS, node_rows(items))
    if result.get("slurm_seen_at") is None:
        click.echo("(the controller has not read Slurm yet: Slurm's state is missing)", err=True)


#: The commands this module adds to ``srecovery``.
COMMANDS: list[click.Command] = [incidents, advice, explain, nodes]
