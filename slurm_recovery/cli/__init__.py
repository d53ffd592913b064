"""``srecovery``: the admin CLI. Exit codes: 0 ok, 1 failed, 2 bad usage or config, 3 Slurm
unreachable (see docs/cli.md)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from slurm_recovery import __version__
from slurm_recovery.cli import audit_cmds, console, operator_cmds, read_cmds
from slurm_recovery.cli.controller_cmds import advice, explain, report
from slurm_recovery.cli.demo import demo
from slurm_recovery.cli.dev import dev
from slurm_recovery.cli.explain_log import explain_log
from slurm_recovery.cli.sim import sim
from slurm_recovery.config import Config, ConfigError, load_config
from slurm_recovery.contract import hostlist
from slurm_recovery.options import config_option
from slurm_recovery.scheduler import SchedulerError, Unreachable, open_scheduler
from slurm_recovery.watchdog import watchdog_command

EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3
#: The environment variable of click's completion protocol for ``srecovery``.
COMPLETE_VAR = "_SRECOVERY_COMPLETE"


def load_or_exit(ctx: click.Context) -> Config:
    try:
        return load_config(ctx.obj["config_path"])
    except ConfigError as exc:
        click.echo(f"srecovery: {exc}", err=True)
        ctx.exit(EXIT_USAGE)
        raise AssertionError("unreachable") from exc


EPILOG = """\b
Examples (a job was requeued at 3 a.m.):
  srecovery status                  controller up? which mode? what needs me?
  srecovery incidents --since 12h   what happened overnight
  srecovery explain 4242            job 4242: evidence, verdict, what was done
  srecovery nodes n17               what the tool did to n17, and why
  srecovery console                 live dashboard (q quits)
  eval "$(srecovery completion bash)"   tab completion

Exit codes: 0 done, 1 failed, 2 bad usage or config, 3 controller or slurmctld did not
answer, 4 not allowed, 5 a check found a problem. More: docs/cli.md, `srecovery COMMAND -h`.
"""


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.version_option(__version__, prog_name="srecovery")
@config_option
@click.pass_context
def cli(ctx: click.Context, config_path: Path | None) -> None:
    """slurm-recovery: detect, attribute and recover failed multi-node jobs on Slurm."""
    from slurm_recovery.cli.common import printable_output

    printable_output()  # users' text (job output, reasons) never drives the terminal
    ctx.ensure_object(dict)
    ctx.obj["config_path"] = config_path


@cli.group()
def config() -> None:
    """Inspect the configuration."""


@config.command("check")
@click.option("--json", "as_json", is_flag=True, help="Print the effective config as JSON.")
@click.pass_context
def config_check(ctx: click.Context, as_json: bool) -> None:
    """Validate the config file and print the effective settings (defaults filled in)."""
    cfg = load_or_exit(ctx)
    data = cfg.asdict()
    source = data.pop("source")
    if as_json:
        click.echo(json.dumps({"source": source, **data}, default=str, indent=2))
        return
    click.echo(f"# {source or 'no config file: all defaults'} is valid")
    for section, values in data.items():
        click.echo(f"[{section}]")
        for key, value in values.items():
            click.echo(f"{key} = {json.dumps(value, default=str)}")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def slurm(ctx: click.Context, as_json: bool) -> None:
    """Show what slurm-recovery sees in Slurm: backend, cluster, nodes and active jobs."""
    cfg = load_or_exit(ctx)
    try:
        sched = open_scheduler(
            cfg.scheduler.backend,
            timeout=cfg.scheduler.command_timeout,
            bin_dir=cfg.scheduler.slurm_bin_dir,
            slurm_conf=cfg.scheduler.slurm_conf,
        )
        info = {
            "backend": sched.name,
            "backend_chosen_because": getattr(sched, "chosen_because", ""),
            "cluster": sched.cluster_name(),
            "slurm_version": sched.version(),
            "nodes": [asdict(n) for n in sched.list_nodes()],
            "jobs": [asdict(j) for j in sched.list_jobs() if j.active],
        }
    except Unreachable as exc:
        click.echo(f"srecovery: slurmctld unreachable: {exc}", err=True)
        ctx.exit(EXIT_UNREACHABLE)
    except SchedulerError as exc:
        click.echo(f"srecovery: {exc}", err=True)
        ctx.exit(EXIT_FAILED)
    if as_json:
        click.echo(json.dumps(info, default=sorted, indent=2))
        return
    click.echo(
        f"cluster {info['cluster']}  Slurm {info['slurm_version']}  backend {info['backend']}"
    )
    if info["backend_chosen_because"]:
        click.echo(f"  ({info['backend_chosen_because']})")
    click.echo(f"\n{'NODE':<12} {'STATE':<12} {'FLAGS':<16} REASON")
    for n in info["nodes"]:
        flags = ",".join(sorted(n["flags"])) or "-"
        click.echo(f"{n['name']:<12} {n['state']:<12} {flags:<16} {n['reason'] or '-'}")
    click.echo(f"\n{'JOBID':>8} {'STATE':<10} {'RESTARTS':>8} {'NODES':<16} EXCLUDED")
    for j in info["jobs"]:
        nodes = hostlist.compress(j["nodes"]) or "-"
        excluded = hostlist.compress(j["excluded_nodes"]) or "-"
        click.echo(
            f"{j['job_id']:>8} {j['state']:<10} {j['restart_count']:>8} {nodes:<16} {excluded}"
        )


@cli.command("completion")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the tab-completion script for SHELL (bash, zsh or fish).

    \b
    bash:  eval "$(srecovery completion bash)"     (in ~/.bashrc), or
           srecovery completion bash > /etc/bash_completion.d/srecovery
    zsh:   eval "$(srecovery completion zsh)"      (in ~/.zshrc)
    fish:  srecovery completion fish > ~/.config/fish/completions/srecovery.fish

    Commands, subcommands, options and choices complete; bash needs version 4.4 or later.
    """
    from click.shell_completion import get_completion_class

    complete = get_completion_class(shell)
    assert complete is not None  # the Choice allows only the shells click knows
    click.echo(complete(cli, {}, "srecovery", COMPLETE_VAR).source())


cli.add_command(demo)
cli.add_command(report)
cli.add_command(advice)
cli.add_command(explain)
cli.add_command(dev)
cli.add_command(explain_log)
cli.add_command(sim)
cli.add_command(watchdog_command, name="watchdog")
for _module in (read_cmds, operator_cmds, audit_cmds, console):
    for _command in _module.COMMANDS:
        cli.add_command(_command)


def main() -> None:
    cli(obj={})
