"""``srecovery explain-log``: classify log files offline, with the controller's own code path
(:func:`slurm_recovery.signals.logs.classify` on the shipped signature catalogue); given Slurm's
end state (``--state``, ``--exit-code``), the controller's own decision for that job
(:func:`slurm_recovery.decide.ended_job.decide_ended_job`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NoReturn, cast

import click

from slurm_recovery.config import ConfigError
from slurm_recovery.contract import hostlist
from slurm_recovery.decide.ended_job import (
    END_STATES,
    EndedJobDecision,
    decide_ended_job,
    parse_exit_code,
)
from slurm_recovery.decide.policy import Policy, PolicyError, load_policy
from slurm_recovery.scheduler.base import ExitCode
from slurm_recovery.signals.logs import THIS_NODE, LogVerdict, Match, classify, default_catalogue

EXIT_UNREADABLE, EXIT_USAGE = 1, 2


@click.command("explain-log")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--nodes",
    "nodes_expr",
    default=None,
    metavar="HOSTLIST",
    help="The job's nodes (n[1-4]); only these can be blamed.",
)
@click.option(
    "--state",
    type=click.Choice(END_STATES, case_sensitive=False),
    default=None,
    help="How Slurm ended the job (sacct's State): answer as the controller would.",
)
@click.option(
    "--exit-code",
    "exit_text",
    default=None,
    metavar="RC[:SIG]",
    help="The job's exit code as sacct shows it (1, or 0:9 for a signal). "
    "Alone: --state FAILED when not 0.",
)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="With --state: the site's policy file (default: the built-in policy).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def explain_log(
    ctx: click.Context,
    paths: tuple[Path, ...],
    nodes_expr: str | None,
    state: str | None,
    exit_text: str | None,
    policy_file: Path | None,
    as_json: bool,
) -> None:
    """Classify job output and kernel logs (dmesg, syslog, journald exports, or a mix).

    Prints the fault domain (hardware, system, application, unknown), the nodes to blame,
    the action, and the decisive lines. With --state (or --exit-code) the answer is the
    controller's for a job Slurm ended so, with these lines as its evidence: a FAILED job
    whose log shows no cause is restarted, a CANCELLED or TIMEOUT one is left alone.
    Exit 0 when classified, 1 when a file cannot be read, 2 on bad usage.
    """
    try:
        nodes = hostlist.expand(nodes_expr) if nodes_expr else None
    except hostlist.HostlistError as exc:
        refuse(ctx, f"--nodes: {exc}")
    exit_code: ExitCode | None = None
    if exit_text is not None:
        try:
            exit_code = parse_exit_code(exit_text)
        except ValueError as exc:
            refuse(ctx, f"--exit-code: {exc}")
    if policy_file is not None and state is None and exit_code is None:
        refuse(ctx, "--policy needs --state or --exit-code")
    policy = Policy()
    if policy_file is not None:
        try:
            policy = load_policy(policy_file)
        except PolicyError as exc:
            refuse(ctx, f"--policy: {exc}")
    try:
        catalogue = default_catalogue()
    except ConfigError as exc:
        refuse(ctx, str(exc))
    matches: list[Match] = []
    for path in paths:
        try:
            matches.extend(catalogue.scan_file(path, source=str(path)))
        except OSError as exc:
            refuse(ctx, f"{path}: cannot read it: {exc.strerror or exc}", EXIT_UNREADABLE)
    verdict = classify(matches, nodes=nodes, catalogue=catalogue)
    decision = None
    if state is not None or exit_code is not None:
        code = exit_code if exit_code is not None else ExitCode(1 if state == "FAILED" else 0)
        if state is None:
            state = "FAILED" if code.returncode or code.signal else "COMPLETED"
        decision = decide_ended_job(
            matches,
            state=state,
            exit_code=code,
            nodes=nodes or job_nodes(matches),
            catalogue=catalogue,
            policy=policy,
        )
    if as_json:
        out = verdict.to_json() if decision is None else decision_json(decision, verdict)
        click.echo(json.dumps(out, indent=2))
        return
    if decision is None:
        blame = hostlist.compress(verdict.blame_nodes) or "none"
        click.echo(f"fault domain: {verdict.fault_domain}")
        click.echo(f"category:     {verdict.category}")
        click.echo(f"blame nodes:  {blame}")
        click.echo(f"action:       {verdict.action}")
        click.echo(f"cause:        {verdict.cause}")
    else:
        echo_decision(decision, verdict)
    if not verdict.signatures:
        return
    click.echo("decisive lines:")
    many = len(set(paths)) > 1
    for line, source in zip(verdict.signatures, verdict.sources, strict=False):
        where = f"{source}:{line['line_no']}" if many and source else f"line {line['line_no']}"
        click.echo(f"  {where} [{line['id']}] {line['text']}")


def job_nodes(matches: list[Match]) -> list[str]:
    """The job's nodes when ``--nodes`` is not given: the hosts its lines name (short names),
    else one node, the machine that wrote the log."""
    named = sorted({m.host.split(".", 1)[0] for m in matches if m.host})
    return named or [THIS_NODE]


def decision_json(decision: EndedJobDecision, verdict: LogVerdict) -> dict[str, object]:
    """``--json`` with ``--state``: the controller's answer under the usual keys (``action``,
    ``fault_domain``, ``blame_nodes``), its details under ``controller``, and the text-only
    verdict under ``log``."""
    log_only = {
        "fault_domain": verdict.fault_domain,
        "blame_nodes": list(verdict.blame_nodes),
        "action": verdict.action,
    }
    controller: dict[str, object] = {
        "state": decision.state,
        "exit_code": str(decision.exit_code),
        "nodes": list(decision.nodes),
        "incident": decision.advice is not None,
    }
    fault_domain, blame = "unknown", []
    if decision.advice is not None and decision.verdict is not None:
        advice, judged = decision.advice, decision.verdict
        fault_domain, blame = str(judged.fault_class), sorted(judged.nodes)
        controller |= {
            "rule": advice.rule,
            "reason": advice.reason,
            "exclude": sorted(advice.exclude),
            "drain": sorted(advice.drain),
            "needs_operator": advice.needs_operator,
            "confidence": judged.confidence,
            "cause": judged.cause,
        }
    else:
        controller["reason"] = f"Slurm ended the job {decision.state}: no failure to recover"
    return {
        "category": verdict.category,
        "fault_domain": fault_domain,
        "blame_nodes": blame,
        "action": decision.action,
        "signatures": [dict(s) for s in verdict.signatures],
        "controller": controller,
        "log": log_only,
    }


def echo_decision(decision: EndedJobDecision, verdict: LogVerdict) -> None:
    out = decision_json(decision, verdict)
    controller = cast(dict[str, object], out["controller"])
    blame = cast(list[str], out["blame_nodes"])
    click.echo(
        f"as the controller, for a job Slurm ended {decision.state} "
        f"(exit {decision.exit_code}) on {hostlist.compress(list(decision.nodes))}:"
    )
    click.echo(f"fault domain: {out['fault_domain']}")
    click.echo(f"category:     {verdict.category}")
    click.echo(f"blame nodes:  {hostlist.compress(blame) or 'none'}")
    click.echo(f"action:       {decision.action}")
    click.echo(f"reason:       {controller['reason']}")
    click.echo(f"log alone:    {verdict.action} ({verdict.cause})")


def refuse(ctx: click.Context, problem: str, code: int = EXIT_USAGE) -> NoReturn:
    """Say why on stderr and exit with ``code`` (bad usage unless told otherwise)."""
    click.echo(f"srecovery explain-log: {problem}", err=True)
    ctx.exit(code)
