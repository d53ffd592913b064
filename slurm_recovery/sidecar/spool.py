"""The hook spool as one of the sidecar's sources (:mod:`slurm_recovery.contract.spool` holds
the spool's format, its writer and its two-phase reader)."""

from __future__ import annotations

from collections.abc import Callable

from slurm_recovery.contract.spool import DEFAULT_TAKE_LIMIT, HookSpool
from slurm_recovery.sidecar.base import Finding


class SpoolSource:
    """The hook spool as a fast :class:`~slurm_recovery.sidecar.base.Source`.

    ``poll`` takes the waiting events (as findings, sent with the ``hook`` role so the
    controller records them as hook evidence); ``commit`` deletes their files and must be
    called only after the outbox holds them durably.
    """

    name = "hook_spool"
    fast = True
    role = "hook"

    def __init__(self, spool: HookSpool, node: str, limit: int = DEFAULT_TAKE_LIMIT) -> None:
        self.spool = spool
        self.node = node
        self.limit = limit
        self._commit: Callable[[], None] | None = None
        spool.ensure()

    def poll(self, now: float) -> list[Finding]:
        self.spool.check()
        events, self._commit = self.spool.take(self.node, self.limit)
        return [
            Finding(
                kind=e["kind"],
                observed_at=float(e["observed_at"]),
                gpu=e.get("gpu"),
                job_id=e.get("job_id"),
                payload=e.get("payload", {}),
            )
            for e in events
        ]

    def commit(self) -> None:
        commit, self._commit = self._commit, None
        if commit is not None:
            commit()

    def close(self) -> None:
        self._commit = None
