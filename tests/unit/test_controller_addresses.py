"""Node addresses for the per-node authorization rule: resolved once, cached, fail closed."""

from __future__ import annotations

from slurm_recovery.controller.service import RESOLVE_TTL, AddressBook
from slurm_recovery.scheduler import Node


def test_addresses_are_cached_and_refreshed():
    asked: list[str] = []

    def resolve(host: str) -> list[str]:
        asked.append(host)
        if host == "gone":
            raise OSError("no such host")
        return {"10.0.0.7": ["10.0.0.7"], "gpu7": ["10.0.0.7", "10.1.0.7"]}[host]

    book = AddressBook(resolve)
    nodes = {
        "gpu7": Node("gpu7", "IDLE", address="10.0.0.7", hostname="gpu7"),
        "gpu8": Node("gpu8", "IDLE", address="gone"),
        "gpu9": Node("gpu9", "IDLE"),
    }
    first = book.addresses(nodes, now=100.0)
    assert first == {
        "gpu7": {"10.0.0.7", "10.1.0.7"},
        "gpu8": frozenset(),  # unresolvable: no address, so no sidecar may speak for it
        "gpu9": frozenset(),
    }
    book.addresses(nodes, now=100.0 + RESOLVE_TTL - 1)
    assert sorted(asked) == ["10.0.0.7", "gone", "gpu7"]  # no second lookup within the TTL
    book.addresses(nodes, now=100.0 + RESOLVE_TTL + 1)
    assert len(asked) == 6
