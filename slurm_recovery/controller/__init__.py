"""``srecovery-controller``: the head-node daemon (HTTP API + the recovery loop)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from slurm_recovery.config import ConfigError, load_config, split_host_port
from slurm_recovery.options import config_option


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="DEVELOPMENT ONLY: accept requests without MUNGE credentials.",
)
def main(config_path: Path | None, insecure_no_auth: bool) -> None:
    """Run the slurm-recovery controller: ingest evidence, decide, act (or advise)."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        click.echo(f"srecovery-controller: {exc}", err=True)
        sys.exit(2)
    logging.basicConfig(
        level=config.log.level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from aiohttp import web

    from slurm_recovery.controller.service import Controller

    try:
        controller = Controller(config, insecure_no_auth=insecure_no_auth)
    except Exception as exc:  # a clear line, not a traceback, for config/policy/Slurm trouble
        click.echo(f"srecovery-controller: cannot start: {exc}", err=True)
        sys.exit(1)
    host, port = split_host_port(config.controller.listen)
    logging.getLogger("srecovery.controller").info(
        "listening on %s (config %s, store %s)",
        config.controller.listen,
        config.source or "defaults",
        config.store.path,
    )
    web.run_app(
        controller.app(), host=host, port=port, print=None, access_log=None, handle_signals=True
    )
