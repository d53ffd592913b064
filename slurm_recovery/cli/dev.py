"""``srecovery dev up|down``: the local stack (cluster, controller, watchdog) on this host."""

from __future__ import annotations

from pathlib import Path

import click

from slurm_recovery import devstack, localcluster

#: ``--slurm``: the release the local cluster runs (``dev up``, ``demo``).
slurm_release_option = click.option(
    "--slurm",
    "slurm",
    type=click.Choice(["default", *localcluster.SLURM_SERIES]),
    default="default",
    show_default=True,
    help="Slurm release to run: apt's, or one built by scripts/build-slurm.",
)


@click.group()
@click.option(
    "--base",
    type=click.Path(path_type=Path),
    default=devstack.DEV_BASE,
    show_default=True,
    help="Directory for the whole stack.",
)
@click.pass_context
def dev(ctx: click.Context, base: Path) -> None:
    """A development stack: real Slurm cluster + controller + watchdog + sidecars here."""
    ctx.obj = {**(ctx.obj or {}), "dev_base": base}


@dev.command("up")
@click.option(
    "--mode",
    type=click.Choice(["monitor", "act"]),
    default="monitor",
    show_default=True,
    help="Policy mode for every partition.",
)
@click.option("--nodes", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(1, 64),
    default=8,
    show_default=True,
    help="Simulated GPUs per node (inject faults with `srecovery sim inject`).",
)
@click.option("--port-base", type=int, default=devstack.DEV_PORT_BASE, show_default=True)
@click.option("--api-port", type=int, default=devstack.DEV_API_PORT, show_default=True)
@slurm_release_option
@click.pass_context
def dev_up(
    ctx: click.Context,
    mode: str,
    nodes: int,
    gpus_per_node: int,
    port_base: int,
    api_port: int,
    slurm: str,
) -> None:
    """Start the stack (idempotent), wait until healthy, print the exports to use it."""
    try:
        stack = devstack.up(
            ctx.obj["dev_base"],
            nodes=nodes,
            mode=mode,
            port_base=port_base,
            api_port=api_port,
            gpus_per_node=gpus_per_node,
            slurm=slurm,
        )
    except localcluster.ClusterError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"# slurm-recovery dev stack up ({mode} mode, {nodes} nodes, "
        f"Slurm {localcluster.slurm_release(stack.cluster)}); logs in {stack.base / 'log'}",
        err=True,
    )
    for key, value in stack.exports().items():
        click.echo(f"export {key}={value}")


@dev.command("down")
@click.pass_context
def dev_down(ctx: click.Context) -> None:
    """Stop everything `dev up` started."""
    for item in devstack.down(ctx.obj["dev_base"]):
        click.echo(f"stopped {item}")
