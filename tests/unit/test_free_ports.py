"""Test ports come from below the kernel's ephemeral range, where no outgoing connection can
take them between the check and the bind (CI saw ``[Errno 98]`` on a port above it)."""

from __future__ import annotations

import socket

from slurm_recovery import localcluster


def test_blocks_are_free_and_below_the_ephemeral_range():
    low, high = localcluster.ephemeral_ports()
    assert 1024 <= low <= high
    for count, start in ((1, 20000), (7, 20000), (7, 41000), (20, low - 5)):
        base = localcluster.free_port_block(count, start=start)
        assert base >= 1024 and base + count <= low, (count, start, base)
        for port in range(base, base + count):
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))  # free, as promised


def test_a_taken_port_is_skipped():
    first = localcluster.free_port_block(3)
    with socket.socket() as held:
        held.bind(("127.0.0.1", first + 1))
        other = localcluster.free_port_block(3)
        assert not other <= first + 1 < other + 3
