"""``srecovery sim inject|show``: fault injection into the simulated GPU backend.

For GPU-less hosts (the quickstart, the demo, the tests): a sidecar with
``sidecar.gpu_backend = "sim"`` reports what is injected here exactly as it reports NVML and
kernel-log faults. See docs/sidecar.md.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from slurm_recovery.sidecar import sim as simgpu

EXIT_FAILED, EXIT_USAGE = 1, 2


def _sim_dir(ctx: click.Context, sim_dir: Path | None) -> tuple[Path, int]:
    """The simulation directory and the GPU count for a new node, from the config unless
    ``--sim-dir`` names the directory."""
    from slurm_recovery.cli import load_or_exit

    config = load_or_exit(ctx)
    return (sim_dir or config.sidecar.sim_dir), config.sidecar.sim_gpus


@click.group()
def sim() -> None:
    """Simulated GPUs: inject faults, show their state (sidecar.gpu_backend = "sim")."""


@sim.command()
@click.option("--node", required=True, help="The node whose simulated GPUs get the fault.")
@click.option("--gpu", type=click.IntRange(0, 1023), help="GPU index (every GPU for --clear).")
@click.option("--xid", type=click.IntRange(0, 1 << 16), help="An XID, as the driver logs it.")
@click.option("--message", help="The XID's log text (default: what the driver usually says).")
@click.option("--ecc-dbe", is_flag=True, help="An uncorrectable (double-bit) ECC error.")
@click.option(
    "--throttle",
    type=click.Choice(simgpu.THROTTLE_REASONS),
    help="Clocks throttled for this reason.",
)
@click.option("--lose-gpu", is_flag=True, help="The GPU disappears from the driver.")
@click.option("--link-downgrade", is_flag=True, help="The PCIe link trains below its maximum.")
@click.option(
    "--utilization",
    type=click.IntRange(0, 100),
    help="How busy the GPU (or every GPU) looks, in percent (0 = idle, the default).",
)
@click.option(
    "--driver-mismatch",
    is_flag=True,
    help="The node's driver libraries and kernel module differ (a driver upgraded without a "
    "reboot): NVML cannot start; no --gpu, and --clear without --gpu ends it.",
)
@click.option(
    "--clear",
    is_flag=True,
    help="Reset the GPU (or every GPU, which also ends --driver-mismatch, as a reboot) to healthy.",
)
@click.option(
    "--sim-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Simulation directory (default: sidecar.sim_dir).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the recorded events as JSON.")
@click.pass_context
def inject(
    ctx: click.Context,
    node: str,
    gpu: int | None,
    xid: int | None,
    message: str | None,
    ecc_dbe: bool,
    throttle: str | None,
    lose_gpu: bool,
    link_downgrade: bool,
    utilization: int | None,
    driver_mismatch: bool,
    clear: bool,
    sim_dir: Path | None,
    as_json: bool,
) -> None:
    """Inject faults into NODE's simulated GPUs; the node's sidecar reports them (XIDs within
    sidecar.fast_interval, the others at its next poll)."""
    if clear and any(
        (xid is not None, ecc_dbe, throttle, lose_gpu, link_downgrade, driver_mismatch)
    ):
        raise click.UsageError("--clear resets the GPU; inject faults in a separate command")
    if message is not None and xid is None:
        raise click.UsageError("--message goes with --xid")
    folder, gpus = _sim_dir(ctx, sim_dir)
    try:
        events = simgpu.inject(
            folder,
            node,
            gpu=gpu,
            xid=xid,
            message=message,
            ecc_dbe=1 if ecc_dbe else 0,
            throttle=throttle,
            lose_gpu=lose_gpu,
            link_downgrade=link_downgrade,
            utilization=utilization,
            driver_mismatch=driver_mismatch,
            clear=clear,
            gpus_if_new=gpus,
        )
    except simgpu.SimError as exc:
        click.echo(f"srecovery: {exc}", err=True)
        ctx.exit(EXIT_USAGE)
    except OSError as exc:
        click.echo(f"srecovery: cannot write to {folder}: {exc}", err=True)
        ctx.exit(EXIT_FAILED)
    if as_json:
        click.echo(json.dumps({"node": node, "events": events}))
        return
    for event in events:
        click.echo(f"injected on {node}: {_describe(event)} (event {event['id']})")


def _describe(event: dict[str, Any]) -> str:
    where = "every GPU" if event["gpu"] is None else f"GPU {event['gpu']}"
    kind = event["type"]
    if kind == "xid":
        return f"xid {event['xid']} on {where}: {event['message']}"
    if kind == "ecc_dbe":
        return f"{event['count']} uncorrectable ECC error(s) on {where}"
    if kind == "throttle":
        return f"{event['reason']} throttling on {where}"
    if kind == "lose_gpu":
        return f"{where} lost"
    if kind == "link_downgrade":
        return f"PCIe link downgrade on {where}"
    if kind == "driver_mismatch":
        return "driver libraries and kernel module differ (driver_version_mismatch until --clear)"
    if kind == "clear":
        return f"{where} reset to healthy"
    if kind == "utilization":
        return f"{where} {event['percent']}% busy"
    return kind


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


@sim.command()
@click.option("--node", help="Only this node (default: every simulated node).")
@click.option(
    "--sim-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Simulation directory (default: sidecar.sim_dir).",
)
@click.option("--json", "as_json", is_flag=True, help="The state files as JSON.")
@click.pass_context
def show(ctx: click.Context, node: str | None, sim_dir: Path | None, as_json: bool) -> None:
    """Show the simulated GPUs of each node, their faults and the injected events."""
    folder, _ = _sim_dir(ctx, sim_dir)
    try:
        if node is not None:
            names = [node]
        else:
            names = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
        states = {name: simgpu.load_state(folder, name) for name in names}
    except simgpu.SimError as exc:
        click.echo(f"srecovery: {exc}", err=True)
        ctx.exit(EXIT_FAILED)
    if as_json:
        click.echo(json.dumps(states, indent=2))
        return
    if not any(states.values()):
        click.echo(f"no simulated nodes{' named ' + node if node else ''} in {folder}")
        return
    for name, state in states.items():
        if state is None:
            click.echo(f"{name}: nothing simulated yet (in {folder})\n")
            continue
        click.echo(
            f"{name}  ({len(state['gpus'])} GPUs, XIDs taken by the sidecar up to event "
            f"{state['xid_delivered']})"
        )
        if state.get("driver_mismatch"):
            click.echo("  DRIVER MISMATCH: libraries and kernel module differ, NVML cannot start")
        click.echo(f"  {'GPU':>3} {'PCI':<17} {'STATE':<8} {'ECC-DBE':>7} {'PCIE':<9} THROTTLE")
        for g in state["gpus"]:
            link = f"gen{g['pcie_gen']} x{g['pcie_width']}"
            click.echo(
                f"  {g['index']:>3} {g['pci_bus_id']:<17} "
                f"{'ok' if g['present'] else 'LOST':<8} {g['ecc_dbe_volatile']:>7} "
                f"{link:<9} {','.join(g['throttle']) or '-'}"
            )
        if state["events"]:
            click.echo("  events:")
        for event in state["events"][-20:]:
            sent = ""
            if event["type"] == "xid":
                sent = "  taken" if event["id"] <= state["xid_delivered"] else "  waiting"
            click.echo(f"  {event['id']:>5} {_when(event['at'])}  {_describe(event)}{sent}")
        click.echo()
