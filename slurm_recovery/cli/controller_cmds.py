"""``srecovery report``: an operator's evidence, sent to the controller (signed with MUNGE).

``srecovery advice list`` and ``srecovery explain`` live in :mod:`slurm_recovery.cli.read_cmds`
with the other read commands; they are re-exported here for the imports that name this module.
"""

from __future__ import annotations

import json
import time

import click

from slurm_recovery.cli.common import EXIT_USAGE, client_for, explain_client_error, fail
from slurm_recovery.cli.read_cmds import advice, explain
from slurm_recovery.contract.client import ClientError
from slurm_recovery.contract.wire import event_to_json


@click.command()
@click.argument("node")
@click.option("--reason", required=True, help="What is wrong, in words (shown in the audit).")
@click.option("--xid", type=click.IntRange(0, 1 << 16), help="Report an NVIDIA XID code.")
@click.option("--gpu", type=click.IntRange(0, 1023), help="GPU index on the node.")
@click.option("--job", "job_id", type=click.IntRange(1), help="The job it concerns, if known.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def report(
    ctx: click.Context,
    node: str,
    reason: str,
    xid: int | None,
    gpu: int | None,
    job_id: int | None,
    as_json: bool,
) -> None:
    """Report, as an operator, that NODE is bad (signed evidence; operators only)."""
    from slurm_recovery.cli import load_or_exit

    if not reason.strip():
        fail("--reason is blank: say what is wrong with the node, in words", EXIT_USAGE)
    config = load_or_exit(ctx)
    if xid is not None:
        event = event_to_json(
            "xid",
            time.time(),
            node=node,
            gpu=gpu,
            job_id=job_id,
            payload={"xid": xid, "message": reason},
        )
    else:
        event = event_to_json(
            "operator_report",
            time.time(),
            node=node,
            gpu=gpu,
            job_id=job_id,
            payload={"reason": reason},
        )
    try:
        result = client_for(config).post_evidence([event], role="operator")
    except ClientError as exc:
        if exc.status == 400:  # the controller refused what was asked (unknown node or job)
            fail(f"report refused: {exc.reason}", EXIT_USAGE)
        message, code = explain_client_error(exc, config.client.url)
        fail(message, code)
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"reported {event['kind']} on {node}: evidence {result['ids'][0]}")


__all__ = ["advice", "explain", "report"]
