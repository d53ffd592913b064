"""``srecovery explain-log``: classify log files offline, with the controller's own code path
(:func:`slurm_recovery.signals.logs.classify` on the shipped signature catalogue)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from slurm_recovery.config import ConfigError
from slurm_recovery.contract import hostlist
from slurm_recovery.signals.logs import Match, classify, default_catalogue

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
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def explain_log(
    ctx: click.Context, paths: tuple[Path, ...], nodes_expr: str | None, as_json: bool
) -> None:
    """Classify job output and kernel logs (dmesg, syslog, journald exports, or a mix).

    Prints the fault domain (hardware, system, application, unknown), the nodes to blame,
    the action, and the decisive lines. Exit 0 when classified, 1 when a file cannot be
    read, 2 on bad usage.
    """
    try:
        nodes = hostlist.expand(nodes_expr) if nodes_expr else None
    except hostlist.HostlistError as exc:
        click.echo(f"srecovery explain-log: --nodes: {exc}", err=True)
        ctx.exit(EXIT_USAGE)
        return
    try:
        catalogue = default_catalogue()
    except ConfigError as exc:
        click.echo(f"srecovery explain-log: {exc}", err=True)
        ctx.exit(EXIT_USAGE)
        return
    matches: list[Match] = []
    for path in paths:
        try:
            matches.extend(catalogue.scan_file(path, source=str(path)))
        except OSError as exc:
            click.echo(
                f"srecovery explain-log: {path}: cannot read it: {exc.strerror or exc}", err=True
            )
            ctx.exit(EXIT_UNREADABLE)
            return
    verdict = classify(matches, nodes=nodes, catalogue=catalogue)
    if as_json:
        click.echo(json.dumps(verdict.to_json(), indent=2))
        return
    blame = hostlist.compress(verdict.blame_nodes) or "none"
    click.echo(f"fault domain: {verdict.fault_domain}")
    click.echo(f"category:     {verdict.category}")
    click.echo(f"blame nodes:  {blame}")
    click.echo(f"action:       {verdict.action}")
    click.echo(f"cause:        {verdict.cause}")
    if not verdict.signatures:
        return
    click.echo("decisive lines:")
    many = len(set(paths)) > 1
    for line, source in zip(verdict.signatures, verdict.sources, strict=False):
        where = f"{source}:{line['line_no']}" if many and source else f"line {line['line_no']}"
        click.echo(f"  {where} [{line['id']}] {line['text']}")
