"""``srecovery audit tail|export|verify``, ``srecovery compare`` and ``srecovery replay``.

All three read through the controller's API (``controller/audit_api.py``) in pages and do their
work here, on the admin's machine:

- ``audit verify`` recomputes every row's hash with this program's own code from the rows as
  stored (or from an exported file), so the check does not rest on the controller's word.
- ``compare`` reads what operators did from Slurm with this machine's Slurm client, as
  ``srecovery slurm`` does; the controller runs no Slurm commands for readers.
- ``replay`` runs the decision core here with the policy file given: the file never has to be
  put on the head node, a long replay never holds the controller's ingest thread, and nothing
  can be stored or sent to Slurm (every request is a GET).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from slurm_recovery.cli.common import (
    EXIT_CHECK,
    EXIT_USAGE,
    SINCE,
    call,
    client_for,
    fail,
    json_option,
    print_json,
    table,
)
from slurm_recovery.config import Config, parse_duration
from slurm_recovery.contract.client import ControllerClient
from slurm_recovery.store.audit import AuditAnchor, AuditRow, AuditVerification, verify_chain
from slurm_recovery.store.values import canonical_json

#: Audit rows per request.
PAGE = 1000
#: Incidents per request (with their evidence, for replay).
REPLAY_PAGE = 50
COMPARE_PAGE = 500


def _config(ctx: click.Context) -> Config:
    from slurm_recovery.cli import load_or_exit

    return load_or_exit(ctx)


def _client(ctx: click.Context) -> tuple[ControllerClient, Config]:
    config = _config(ctx)
    return client_for(config), config


# =================================================================================== audit


def export_line(item: dict[str, Any]) -> dict[str, Any]:
    """An API row as one line of ``audit export``: seq, ts (ISO), ts_epoch (the exact stored
    time, which the hash covers), actor, action, target, details, hash, prev_hash; and
    ``details_json`` (the exact stored text) only when ``details`` does not spell it."""
    line = {
        "seq": item["seq"],
        "ts": item["ts"],
        "ts_epoch": item["ts_epoch"],
        "actor": item["actor"],
        "action": item["action"],
        "target": item["target"],
        "details": item["details"],
        "hash": item["hash"],
        "prev_hash": item["prev_hash"],
    }
    stored = item.get("details_json")
    if stored is not None and (item["details"] is None or _canonical(item["details"]) != stored):
        line["details_json"] = stored
    return line


def _canonical(value: Any) -> str | None:
    try:
        return canonical_json(value, "details")
    except ValueError:
        return None


def row_from_line(item: dict[str, Any]) -> AuditRow:
    """An API row or an export line as the stored row it stands for."""
    stored = item.get("details_json")
    if stored is None:
        stored = _canonical(item.get("details")) or ""
    ts = item.get("ts_epoch")
    if ts is None:
        ts = datetime.fromisoformat(item["ts"]).timestamp()
    return AuditRow(
        seq=item["seq"],
        ts=ts,
        actor=item["actor"],
        kind=item["action"],
        subject=item["target"],
        payload_json=stored,
        prev_hash=item["prev_hash"],
        hash=item["hash"],
    )


def _pages(
    client: ControllerClient, *, since: float | None = None, after: int = 0
) -> Iterator[dict[str, Any]]:
    """Every audit row after ``after`` (from ``since``), a page at a time."""
    while True:
        query = f"/v1/audit/rows?after={after}&limit={PAGE}"
        if since is not None:
            query += f"&since={since!r}"
        page = call(client.get, query, url=client.url)
        rows = page["rows"]
        yield from rows
        if not rows or not page.get("more"):
            return
        after = rows[-1]["seq"]


def _reader_gone() -> None:
    """stdout's reader went away (``| head``): stop quietly, as cat does."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(0)


def _short(details: Any, width: int = 100) -> str:
    text = json.dumps(details, separators=(",", ":"), sort_keys=True) if details else "-"
    return text if len(text) <= width else text[: width - 3] + "..."


def _local(iso: str) -> str:
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError):
        return str(iso)


def _print_row(item: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(export_line(item), separators=(",", ":")))
        return
    click.echo(
        f"{item['seq']:>7}  {_local(item['ts'])}  {item['actor']:<16} {item['action']:<20} "
        f"{item['target']:<16} {_short(item['details'])}"
    )


@click.group("audit")
def audit() -> None:
    """The audit trail: every decision and action, hash-chained (docs/store.md).

    \b
    srecovery audit tail [-n N] [--follow]      the latest rows
    srecovery audit export [--since WHEN] [-o FILE]   all rows as JSON lines
    srecovery audit verify [--anchor SEQ:HASH]  walk the chain; exit 5 if broken
    """


@audit.command("tail")
@click.option("-n", "--lines", "count", type=click.IntRange(1, 5000), default=20, show_default=True)
@click.option(
    "-f", "--follow", is_flag=True, help="Keep printing new rows as they come (^C stops)."
)
@click.option(
    "--interval", type=float, default=1.0, show_default=True, help="Seconds between polls."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row (as in export).")
@click.pass_context
def audit_tail(
    ctx: click.Context, count: int, follow: bool, interval: float, as_json: bool
) -> None:
    """The last N audit rows, oldest first; with --follow, then every new row."""
    client, _ = _client(ctx)
    page = call(client.get, f"/v1/audit/rows?last={count}", url=client.url)
    after = 0
    if not as_json and page["rows"]:
        click.echo(f"{'SEQ':>7}  {'TIME':<19}  {'ACTOR':<16} {'ACTION':<20} {'TARGET':<16} DETAILS")
    for item in page["rows"]:
        _print_row(item, as_json)
        after = item["seq"]
    if not page["rows"] and page.get("head"):
        after = page["head"]["seq"]
    if not follow:
        return
    try:
        while True:
            sys.stdout.flush()
            time.sleep(max(0.1, interval))
            for item in _pages(client, after=after):
                _print_row(item, as_json)
                after = item["seq"]
    except KeyboardInterrupt:
        return
    except BrokenPipeError:
        _reader_gone()


@audit.command("export")
@click.option("--since", type=SINCE, help="Rows from WHEN on (2h, 3d, 2026-11-29, ISO 8601).")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write to FILE (replaced only when complete) instead of standard output.",
)
@click.option("--json", "as_json", is_flag=True, help="Accepted for scripts: always JSON lines.")
@click.pass_context
def audit_export(
    ctx: click.Context, since: float | None, output: Path | None, as_json: bool
) -> None:
    """Every audit row (from --since on) as JSON lines, paged through the API.

    One object per line: seq, ts (ISO 8601), ts_epoch, actor, action, target, details, hash,
    prev_hash. An export without --since can be verified later, anywhere:
    `srecovery audit verify --input FILE`.
    """
    client, _ = _client(ctx)
    count = 0
    if output is None:
        try:
            for item in _pages(client, since=since):
                click.echo(json.dumps(export_line(item), separators=(",", ":")))
        except BrokenPipeError:
            _reader_gone()
        return
    partial = output.with_name(f".{output.name}.partial")
    try:
        with partial.open("w") as out:
            for item in _pages(client, since=since):
                out.write(json.dumps(export_line(item), separators=(",", ":")) + "\n")
                count += 1
        partial.replace(output)
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}")
    finally:
        if partial.exists():
            partial.unlink()
    click.echo(f"exported {count} audit rows to {output}", err=True)


def _file_rows(path: Path) -> Iterator[AuditRow]:
    try:
        with path.open() as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = row_from_line(json.loads(line))
                except (ValueError, KeyError, TypeError) as exc:
                    fail(f"{path}:{number}: not an audit export line ({exc})", EXIT_USAGE)
                if number == 1 and row.seq != 1:
                    fail(
                        f"{path} starts at seq {row.seq}: only a whole export (without --since) "
                        "can be verified",
                        EXIT_USAGE,
                    )
                yield row
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}", EXIT_USAGE)


def verification_json(result: AuditVerification, source: str) -> dict[str, Any]:
    return {
        "ok": result.ok,
        "source": source,
        "rows_verified": result.rows_checked,
        "last": {"seq": result.head.seq, "hash": result.head.hash} if result.head else None,
        "first_bad_seq": result.first_bad_seq,
        "problem": result.problem.value if result.problem else None,
        "detail": result.detail or None,
    }


@audit.command("verify")
@click.option(
    "--anchor",
    help="SEQ:HASH kept earlier (from `verify` or `python -m slurm_recovery.store head`): also "
    "catches rows removed from the end, and any rewrite up to it.",
)
@click.option(
    "--input",
    "input_file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Verify this `audit export` file instead of asking the controller.",
)
@json_option
@click.pass_context
def audit_verify(
    ctx: click.Context, anchor: str | None, input_file: Path | None, as_json: bool
) -> None:
    """Walk the hash chain here and name the first modified, inserted or deleted row.

    Every row's hash is recomputed on this machine from the row as stored (read through the
    API a page at a time, or from an export), so the result does not rest on the controller's
    word. Exit 0: intact; 5: broken.
    """
    try:
        pinned = AuditAnchor.parse(anchor) if anchor else None
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    if input_file is not None:
        rows: Iterator[AuditRow] = _file_rows(input_file)
        source = str(input_file)
    else:
        client, _ = _client(ctx)
        rows = (row_from_line(item) for item in _pages(client))
        source = f"{client.url} (hashes recomputed here)"
    result = verify_chain(rows, pinned)
    if as_json:
        print_json(verification_json(result, source))
    elif result.ok:
        if result.head is None:
            click.echo("0 rows verified: the audit log is empty")
        else:
            click.echo(
                f"{result.rows_checked} rows verified, chain intact, last hash "
                f"{result.head.hash} (seq {result.head.seq})"
            )
            click.echo(f"keep this anchor somewhere safe: {result.head}")
    else:
        assert result.problem is not None
        click.echo(
            f"audit chain BROKEN at seq {result.first_bad_seq}: row {result.problem.value} "
            f"({result.detail}); {result.rows_checked} rows verified before it",
            err=False,
        )
    if not result.ok:
        raise SystemExit(EXIT_CHECK)


# ================================================================================ compare


def _incidents(
    client: ControllerClient, *, since: float | None, evidence: bool
) -> list[dict[str, Any]]:
    """Every incident opened since ``since`` (all with None), newest first, paged."""
    out: list[dict[str, Any]] = []
    before = 0
    size = REPLAY_PAGE if evidence else COMPARE_PAGE
    while True:
        query = f"/v1/history/incidents?limit={size}&evidence={int(evidence)}"
        if since is not None:
            query += f"&since={since!r}"
        if before:
            query += f"&before={before}"
        page = call(client.get, query, url=client.url)
        out += page["incidents"]
        if not page["incidents"] or not page.get("more"):
            return out
        before = page["incidents"][-1]["id"]


def _slurm_history(client: ControllerClient, since: float | None) -> dict[str, Any]:
    query = "/v1/history/slurm" + (f"?since={since!r}" if since is not None else "")
    return call(client.get, query, url=client.url)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _iso(at: float | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, UTC).isoformat()


def _window(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("compare")
@click.option("--since", type=SINCE, required=True, help="Window start: 7d, 2026-11-01, ...")
@click.option(
    "--window",
    "tolerance",
    metavar="DURATION",
    default="1h",
    show_default=True,
    help="An operator drain this close to the advice (either side) agrees with it.",
)
@json_option
@click.pass_context
def compare(ctx: click.Context, since: float, tolerance: str, as_json: bool) -> None:
    """The monitor-mode scorecard: the tool's advice against what operators did in Slurm.

    For each advice since WHEN: the nodes it would exclude or drain, the operators' drains of
    them (who, when, why) and what operators did with the job; then precision and recall of the
    tool's exclusions and drains against the operators' drains, and the cases that differ.
    Sources: what the controller observed pass by pass, Slurm now (node reasons carry user and
    time), and slurmdbd where there is one. docs/cli.md says how to read it.
    """
    from slurm_recovery import scorecard, slurmfacts

    window = _window(tolerance)
    client, config = _client(ctx)
    until = time.time()
    incidents = _incidents(client, since=since, evidence=False)
    # operators' steps up to one window before the start may agree with early advice
    reach = max(0.0, since - window)
    history = _slurm_history(client, reach)
    tool = []
    for action in history["tool_actions"]:
        target = str(action.get("target", ""))
        job = int(target[4:]) if target.startswith("job ") and target[4:].isdigit() else None
        at = scorecard.parse_time(action.get("at"))
        if at is not None:
            tool.append(slurmfacts.ToolStep(action["step"], job, None if job else target, at))
    facts = slurmfacts.read(config.scheduler, reach, until, tool)
    observed = scorecard.from_observed(history["changes"])
    # the controller's prefixes decide what its health check is (an older one sends none)
    prefixes = history.get("health_check_drain_prefixes")
    if not isinstance(prefixes, list):
        prefixes = list(config.controller.health_check_drain_prefixes)
    drains = scorecard.merge_drains(
        scorecard.mark_health_checks([*observed.drains, *facts.drains], prefixes),
        resumes=observed.resumes,
    )
    jobs = scorecard.merge_job_changes([*observed.job_changes, *facts.job_changes])
    advised = [a for item in incidents if (a := scorecard.advised_from_api(item))]
    card = scorecard.score(advised, drains, jobs, window, since=since)
    sources = {
        "controller": (
            f"{len(history['changes'])} Slurm changes observed; this controller has watched "
            f"since {_local(history['observing_since'])}"
            + (" (truncated)" if history.get("truncated") else "")
        ),
        **facts.notes,
    }
    if as_json:
        body = card.to_json()
        for row in body["advice"]:
            row["at"] = _iso(row["at"])
        for group in body["operator_actions"].values():
            for item in group:
                item["at"] = _iso(item["at"])
        for item in body["health_check_drains"]:
            item["at"] = _iso(item["at"])
        for row in body["advice"]:
            for node in row["nodes"]:
                for d in [*node["operator_drains"], *node["health_check_drains"]]:
                    d["at"] = _iso(d["at"])
            for c in row["operator_job_actions"]:
                c["at"] = _iso(c["at"])
        for item in body["differences"]:
            item["at"] = _iso(item["at"])
        print_json(
            {
                "since": _iso(since),
                "until": _iso(until),
                "sources": sources,
                "accounting": facts.accounting,
                **body,
            }
        )
        return
    _print_scorecard(card, since, until, sources)


def _print_scorecard(card: Any, since: float, until: float, sources: dict[str, str]) -> None:
    from slurm_recovery.scorecard import clock, span

    click.echo(f"monitor-mode scorecard {clock(since)} .. {clock(until)}")
    for name, note in sources.items():
        click.echo(f"  source {name}: {note}")
    body = card.to_json()
    agreement = body["agreement"]
    click.echo("")
    click.echo(
        f"advice: {len(card.rows)}; operator drains: {agreement['operator_drains']}, "
        f"requeues: {len(body['operator_actions']['requeues'])}, "
        f"cancels: {len(body['operator_actions']['cancels'])}"
    )
    within = span(card.tolerance)
    click.echo(
        f"precision {_pct(card.precision)}  ({agreement['implications_agreeing']} of "
        f"{agreement['tool_implications']} nodes the tool would exclude or drain were drained "
        f"by an operator within ±{within})"
    )
    click.echo(
        f"recall    {_pct(card.recall)}  ({agreement['operator_drains_matched']} of "
        f"{agreement['operator_drains']} operator drains were of nodes the tool implicated "
        f"within ±{within})"
    )
    if card.health_check_drains:
        click.echo(
            f"health-check drains: {agreement['health_check_drains']} (the site's health check, "
            "neither the tool's nor an operator's: in neither precision nor recall)"
        )
    jobs = agreement["job_actions"]
    click.echo(
        f"job actions: {jobs['agree']} agree, {jobs['differ']} differ, "
        f"{jobs['no operator action']} with no operator action"
    )
    if card.rows:
        click.echo("")
        table(
            ["INCIDENT", "JOB", "WHEN", "MODE", "TOOL SAID", "OPERATORS DID"],
            [
                [
                    r.advised.incident,
                    r.advised.job_id,
                    clock(r.advised.at),
                    r.advised.mode,
                    r.advised.says(),
                    "; ".join(
                        [d.words() for i in r.implications for d in (*i.drains, *i.health_checks)]
                        + [c.words() for c in r.job_changes]
                    )
                    or "nothing",
                ]
                for r in card.rows
            ],
            title="advice and what operators did",
        )
    differences = card.differences()
    click.echo("")
    if not differences:
        click.echo("no cases differ")
        return
    table(
        ["INCIDENT", "JOB", "WHEN", "TOOL SAID", "OPERATORS DID", "WHY IT DIFFERS"],
        [
            [
                d["incident"],
                d["job_id"],
                clock(d["at"]),
                d["tool_said"],
                d["operators_did"],
                d["why"],
            ]
            for d in differences
        ],
        title=f"cases that differ ({len(differences)})",
    )


# ================================================================================= replay


@click.command("replay")
@click.option(
    "--policy",
    "policy_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The policy file to decide with (docs/policy.md).",
)
@click.option("--since", type=SINCE, help="Only incidents opened from WHEN on (default: all).")
@click.option("--all", "show_all", is_flag=True, help="List unchanged incidents too.")
@json_option
@click.pass_context
def replay(
    ctx: click.Context, policy_file: Path, since: float | None, show_all: bool, as_json: bool
) -> None:
    """Decide recorded incidents again with another policy; show which advice would change.

    Runs the decision core (attribute, advise) of this srecovery on each incident's recorded
    job, evidence and nodes, with the policy in FILE, and compares with the advice on record.
    Read-only: nothing is stored, nothing is sent to Slurm. Operators' mode overrides
    (`srecovery mode`) are not applied: the file's modes are.
    """
    from slurm_recovery.decide import replay as core
    from slurm_recovery.decide.policy import PolicyError, load_policy
    from slurm_recovery.signals.xid import load_xid_catalogue

    try:
        policy = load_policy(policy_file)
    except PolicyError as exc:
        problems = exc.problems or (str(exc),)
        click.echo(
            f"srecovery: {policy_file}: not a usable policy ({len(problems)} problem"
            f"{'s' if len(problems) != 1 else ''}):",
            err=True,
        )
        for problem in problems:
            click.echo(f"  {problem}", err=True)
        raise SystemExit(EXIT_USAGE) from None
    catalogue = load_xid_catalogue()
    client, _ = _client(ctx)
    incidents = _incidents(client, since=since, evidence=True)
    history = _slurm_history(client, None)
    nodes = (
        {n["name"]: core.node_from_json(n) for n in history["nodes"]}
        if history.get("nodes")
        else None
    )
    events, tool_drains = core.events_from_json(history["changes"], history["tool_actions"])
    changes = core.evidence_from_json(history["changes"])  # the resumes the loop saw
    cases, skipped = [], []
    for item in incidents:
        case = core.case_from_json(item, nodes, events, tool_drains, changes)
        if case is None:
            skipped.append(item["id"])
        else:
            cases.append(case)
    outcomes = sorted(core.replay(cases, policy, catalogue), key=lambda o: o.case.incident_id)
    changed = [o for o in outcomes if o.changed]
    unchanged = [o for o in outcomes if not o.changed]
    approximate = [o for o in outcomes if o.case.approximate]
    notes = []
    if nodes is None:
        notes.append("the controller has no view of Slurm's nodes yet: minimal views used")
    if history.get("truncated"):
        notes.append("the controller's record of Slurm changes was truncated")
    if as_json:
        print_json(
            {
                "policy": str(policy_file),
                "since": _iso(since),
                "replayed": len(outcomes),
                "changed": [core.outcome_json(o) for o in changed],
                "unchanged": len(unchanged),
                "unchanged_incidents": [o.case.incident_id for o in unchanged],
                "approximate": len(approximate),
                "skipped_without_advice": skipped,
                "notes": notes,
                **({"all": [core.outcome_json(o) for o in outcomes]} if show_all else {}),
            }
        )
        return
    effect = sum(1 for o in changed if o.effect_changed)
    click.echo(
        f"replayed {len(outcomes)} incident{'s' if len(outcomes) != 1 else ''} with "
        f"{policy_file} (read-only: nothing stored, nothing sent to Slurm)"
    )
    click.echo(
        f"would change: {len(changed)} ({effect} in what happens, {len(changed) - effect} in "
        f"wording or rule only); unchanged: {len(unchanged)}; approximate: {len(approximate)}"
    )
    for note in notes:
        click.echo(f"note: {note}")
    shown = outcomes if show_all else changed
    if shown:
        click.echo("")
        table(
            ["INCIDENT", "JOB", "CHANGED", "WAS", "WOULD BE", "RULE"],
            [
                [
                    o.case.incident_id,
                    o.case.job.job_id,
                    ",".join(o.changed) or "-",
                    f"{o.case.recorded.action} ({o.case.recorded.mode}): {o.case.recorded.reason}",
                    f"{o.new.action} ({o.new.mode}): {o.new.reason}",
                    o.new.rule,
                ]
                for o in shown
            ],
        )
    for o in approximate:
        click.echo(f"approximate: incident {o.case.incident_id}: {'; '.join(o.case.approximate)}")


#: The commands this module adds to ``srecovery``.
COMMANDS: list[click.Command] = [audit, compare, replay]
