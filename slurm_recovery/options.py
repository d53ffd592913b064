"""Command-line options every slurm-recovery program shares (srecovery, the controller, the
sidecar), defined once so they read and document the same way everywhere."""

from __future__ import annotations

from pathlib import Path

import click

#: ``--config PATH``, passed to the command as ``config_path`` (None: $SRECOVERY_CONFIG, else
#: the default file; see slurm_recovery.config.load_config).
config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Config file (default: $SRECOVERY_CONFIG, else /etc/slurm-recovery/config.toml).",
)
