"""The host source (sidecar/sources/host.py): memory pressure with injected readings, and the
sidecar's footprint from psutil's real readings of this process."""

from __future__ import annotations

import re

from slurm_recovery.sidecar.sources.host import HostSource, Memory, short_of_memory

GIB = 1024**3


def test_short_below_five_percent_and_again_fine_only_above_ten():
    total = 100 * GIB
    assert not short_of_memory(Memory(5 * GIB, total), was_short=False)
    assert short_of_memory(Memory(4 * GIB, total), was_short=False)
    assert short_of_memory(Memory(9 * GIB, total), was_short=True)  # between: stays short
    assert not short_of_memory(Memory(10 * GIB, total), was_short=True)
    assert not short_of_memory(Memory(0, 0), was_short=True)  # no reading: not short


def test_a_finding_on_each_change_and_none_while_it_lasts():
    readings = iter(
        [
            Memory(50 * GIB, 100 * GIB),
            Memory(3 * GIB, 100 * GIB),
            Memory(7 * GIB, 100 * GIB),
            Memory(20 * GIB, 100 * GIB),
        ]
    )
    source = HostSource(read=lambda: next(readings))
    assert source.poll(1.0) == []
    (low,) = source.poll(2.0)
    assert (low.kind, low.observed_at) == ("host_memory", 2.0)
    assert low.payload == {
        "check": "low_memory",
        "severity": "warning",
        "detail": "3072 MiB of 102400 MiB available (3.0%)",
        "available": 3 * GIB,
        "total": 100 * GIB,
    }
    assert "short of memory" in source.status()
    assert source.poll(3.0) == []  # 7 %: still short, nothing new
    (cleared,) = source.poll(4.0)
    assert cleared.payload["severity"] == "info" and cleared.payload["cleared"] is True
    assert "short of memory" not in source.status()


def test_real_readings_of_this_node_and_this_process():
    source = HostSource()
    memory = source.read()
    assert 0 < memory.available <= memory.total
    bytearray(32 * 1024 * 1024)  # some work between the CPU readings
    match = re.fullmatch(r"ok, sidecar rss (\d+) MiB, cpu (\d+\.\d)%", source.status())
    assert match and int(match[1]) > 10  # a Python process with this project imported
