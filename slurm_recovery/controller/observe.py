"""(filled in by the CLI issue) What the controller records each pass about what operators do
in Slurm, for ``srecovery compare``."""

from __future__ import annotations

from slurm_recovery.decide.model import ClusterView
from slurm_recovery.store import Store


def observe(store: Store, view: ClusterView, previous: ClusterView | None) -> None:
    """Record what changed in Slurm between ``previous`` and ``view``."""
