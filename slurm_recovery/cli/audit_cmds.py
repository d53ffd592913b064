"""(filled in by the CLI issue) ``srecovery`` commands."""

from __future__ import annotations

import click

#: The commands this module adds to ``srecovery``.
COMMANDS: list[click.Command] = []
