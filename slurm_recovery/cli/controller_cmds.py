"""``srecovery report|advice|explain``: talk to the controller (signed with MUNGE)."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from slurm_recovery.client import ClientError, ControllerClient
from slurm_recovery.config import Config
from slurm_recovery.controller.wire import event_to_json

EXIT_FAILED, EXIT_UNREACHABLE = 1, 3


def client_for(config: Config, insecure: bool = False) -> ControllerClient:
    return ControllerClient(
        config.client.url, munge_socket=config.auth.munge_socket or None, insecure=insecure
    )


def _call(fn, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except ClientError as exc:
        click.echo(
            f"srecovery: {exc.reason}"
            if exc.status == 0
            else f"srecovery: controller refused ({exc.status}): {exc.reason}",
            err=True,
        )
        raise SystemExit(EXIT_UNREACHABLE if exc.status == 0 else EXIT_FAILED) from exc


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
    result = _call(client_for(config).post_evidence, [event], role="operator")
    if as_json:
        click.echo(json.dumps(result))
    else:
        click.echo(f"reported {event['kind']} on {node}: evidence {result['ids'][0]}")


@click.group()
def advice() -> None:
    """Advice the controller gave (one per incident, newest generation)."""


@advice.command("list")
@click.option("--job", "job_id", type=click.IntRange(1), help="Only this job.")
@click.option("--open", "open_only", is_flag=True, help="Only incidents still open.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def advice_list(
    ctx: click.Context, job_id: int | None, open_only: bool, limit: int, as_json: bool
) -> None:
    """Incidents with their verdict and advice, newest first."""
    from slurm_recovery.cli import load_or_exit

    query = f"/v1/incidents?limit={limit}" + (f"&job={job_id}" if job_id else "")
    query += "&open=1" if open_only else ""
    result = _call(client_for(load_or_exit(ctx)).get, query)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"{'INCIDENT':>8} {'JOB':>8} {'CLASS':<12} {'MODE':<8} {'ACTION':<16} REASON")
    for item in result["incidents"]:
        a = item["advice"] or {}
        click.echo(
            f"{item['id']:>8} {item['job_id']:>8} "
            f"{a.get('verdict', {}).get('fault_class', '-'):<12} {a.get('mode', '-'):<8} "
            f"{a.get('action', '-'):<16} {a.get('reason', '')}"
        )


@click.command()
@click.argument("job_id", type=click.IntRange(1))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def explain(ctx: click.Context, job_id: int, as_json: bool) -> None:
    """The story of a job's incidents: evidence, verdict, advice, actions, milestones."""
    from slurm_recovery.cli import load_or_exit

    result = _call(client_for(load_or_exit(ctx)).get, f"/v1/jobs/{job_id}")
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for story in result["incidents"]:
        a = story["advice"] or {}
        v = a.get("verdict", {})
        click.echo(
            f"incident {story['id']}: job {job_id} attempt {story['restart_count']} "
            f"({story['kind']}), {story['outcome'] or 'open'}"
        )
        if story.get("summary"):
            click.echo(f"  summary  {story['summary']}")
        click.echo(
            f"  verdict  {v.get('fault_class')} nodes={','.join(v.get('nodes', [])) or '-'}"
            f" confidence={v.get('confidence')} cause={v.get('cause') or '-'}"
        )
        click.echo(
            f"  advice   {a.get('action')} ({a.get('mode')} mode, rule {a.get('rule')}): "
            f"{a.get('reason')}"
        )
        for e in story["evidence"]:
            click.echo(
                f"  evidence #{e['id']} {e['observed_at']} {e['source']}/{e['kind']} "
                f"node={e['node'] or '-'} gpu={e['gpu'] if e['gpu'] is not None else '-'}"
                f" {json.dumps(e['payload'])}"
            )
        for name, at in story["milestones"].items():
            click.echo(f"  {at}  {name}")
        for act in story["actions"]:
            click.echo(
                f"  action {act['step']} {act['target']}: {act['result']} {act['message']}".rstrip()
            )
        for name, seconds in story["latencies"].items():
            click.echo(f"  {name:<11} {seconds * 1000:8.0f} ms")
