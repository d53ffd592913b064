"""(filled in by the CLI issue) Routes of the controller's HTTP API for `srecovery`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from slurm_recovery.controller.service import Controller


def routes(controller: Controller) -> list[web.RouteDef]:
    """The routes this module serves, bound to ``controller``."""
    return []
