"""InfiniBand / RoCE port findings from a sysfs tree (built in tmp_path: real file I/O)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from slurm_recovery.sidecar.sources.infiniband import IB_CHECKS, InfinibandSource

STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE"}
PHYS = {2: "Polling", 3: "Disabled", 5: "LinkUp"}


class Sysfs:
    """``<root>/<hca>/ports/<n>/`` with the files the kernel's ib_core shows."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def port(
        self,
        hca: str,
        n: int,
        state: int = 4,
        phys: int = 5,
        layer: str = "InfiniBand",
        **counters: int,
    ) -> None:
        base = self.root / hca / "ports" / str(n)
        (base / "counters").mkdir(parents=True, exist_ok=True)
        (base / "state").write_text(f"{state}: {STATES[state]}\n")
        (base / "phys_state").write_text(f"{phys}: {PHYS[phys]}\n")
        (base / "link_layer").write_text(f"{layer}\n")
        for name in ("link_downed", "symbol_error", "port_rcv_errors"):
            path = base / "counters" / name
            if name in counters or not path.exists():
                path.write_text(f"{counters.get(name, 0)}\n")

    def counters(self, hca: str, n: int, **counters: int) -> None:
        for name, value in counters.items():
            (self.root / hca / "ports" / str(n) / "counters" / name).write_text(f"{value}\n")

    def state(self, hca: str, n: int, state: int, phys: int = 5) -> None:
        base = self.root / hca / "ports" / str(n)
        (base / "state").write_text(f"{state}: {STATES[state]}\n")
        (base / "phys_state").write_text(f"{phys}: {PHYS[phys]}\n")


@pytest.fixture
def sysfs(tmp_path) -> Sysfs:
    tree = Sysfs(tmp_path / "infiniband")
    tree.port("mlx5_0", 1)
    tree.port("mlx5_1", 1, layer="Ethernet")  # RoCE shows up in the same place
    return tree


def checks(findings) -> list[tuple[str, str, str]]:
    return [(f.payload["port"], f.payload["check"], f.payload["severity"]) for f in findings]


def test_healthy_ports_say_nothing(sysfs):
    source = InfinibandSource(sysfs.root)
    assert source.name == "infiniband" and source.fast is False
    assert source.poll(1.0) == []
    assert source.poll(2.0) == []
    assert source.ports()["mlx5_1/1"]["link_layer"] == "Ethernet"
    assert source.ports()["mlx5_0/1"]["state"] == "ACTIVE"
    assert source.status() == "ok"


def test_a_port_that_stays_down_is_fatal_after_two_polls(sysfs):
    source = InfinibandSource(sysfs.root)
    source.poll(1.0)
    sysfs.state("mlx5_0", 1, 1, phys=2)
    sysfs.counters("mlx5_0", 1, link_downed=1)
    assert source.poll(2.0) == []  # one poll down could be a flap
    found = source.poll(3.0)
    assert checks(found) == [("mlx5_0/1", "port_down", "fatal")]
    assert "state DOWN, physical state 2: Polling for 2 polls" in found[0].payload["detail"]
    assert found[0].kind == "ib_finding"
    assert source.poll(4.0) == []  # said once
    sysfs.state("mlx5_0", 1, 4)
    found = source.poll(5.0)
    assert checks(found) == [("mlx5_0/1", "port_recovered", "info")]
    assert "link_downed +1" in found[0].payload["detail"]


def test_a_flap_that_healed_is_a_finding_never_fatal(sysfs):
    source = InfinibandSource(sysfs.root)
    source.poll(1.0)
    sysfs.counters("mlx5_0", 1, link_downed=1)  # went down and came back between polls
    assert checks(source.poll(2.0)) == [("mlx5_0/1", "link_flap", "info")]
    sysfs.counters("mlx5_0", 1, link_downed=4)  # three more
    found = source.poll(3.0)
    assert checks(found) == [("mlx5_0/1", "link_flap", "warning")]
    assert "3 times" in found[0].payload["detail"]


def test_a_flap_seen_mid_way_is_still_a_flap(sysfs):
    source = InfinibandSource(sysfs.root)
    source.poll(1.0)
    sysfs.state("mlx5_1", 1, 2)  # caught while training
    sysfs.counters("mlx5_1", 1, link_downed=1)
    assert source.poll(2.0) == []
    sysfs.state("mlx5_1", 1, 4)
    found = source.poll(3.0)
    assert checks(found) == [("mlx5_1/1", "link_flap", "info")]
    assert found[0].payload["link_layer"] == "Ethernet"


def test_symbol_errors_rising_are_a_warning(sysfs):
    source = InfinibandSource(sysfs.root, symbol_error_threshold=10, repeat_after=300)
    source.poll(1.0)
    sysfs.counters("mlx5_0", 1, symbol_error=3)
    assert source.poll(2.0) == []
    sysfs.counters("mlx5_0", 1, symbol_error=40)
    found = source.poll(3.0)
    assert checks(found) == [("mlx5_0/1", "symbol_errors_rising", "warning")]
    assert "symbol_error +37" in found[0].payload["detail"]
    sysfs.counters("mlx5_0", 1, symbol_error=80)
    assert source.poll(4.0) == []  # not again within repeat_after
    sysfs.counters("mlx5_0", 1, symbol_error=120)
    assert checks(source.poll(400.0)) == [("mlx5_0/1", "symbol_errors_rising", "warning")]


def test_receive_errors_rising_are_a_warning(sysfs):
    source = InfinibandSource(sysfs.root)
    source.poll(1.0)
    sysfs.counters("mlx5_1", 1, port_rcv_errors=25)
    assert checks(source.poll(2.0)) == [("mlx5_1/1", "rcv_errors_rising", "warning")]


def test_cleared_counters_are_a_new_baseline(sysfs):
    source = InfinibandSource(sysfs.root)
    sysfs.counters("mlx5_0", 1, symbol_error=500, link_downed=9)
    source.poll(1.0)
    sysfs.counters("mlx5_0", 1, symbol_error=0, link_downed=0)  # perfquery -R
    assert source.poll(2.0) == []


def test_a_port_never_up_stays_quiet_unless_expected(sysfs):
    sysfs.port("mlx5_0", 2, state=1, phys=3)  # not cabled
    source = InfinibandSource(sysfs.root)
    for t in range(1, 5):
        assert source.poll(float(t)) == []
    assert source.ports()["mlx5_0/2"]["state"] == "DOWN"
    expecting = InfinibandSource(sysfs.root, expected_ports=["mlx5_0/2"])
    expecting.poll(1.0)
    assert checks(expecting.poll(2.0)) == [("mlx5_0/2", "port_down", "fatal")]


def test_a_vanished_adapter_is_a_port_down(sysfs):
    source = InfinibandSource(sysfs.root)
    source.poll(1.0)
    shutil.rmtree(sysfs.root / "mlx5_1")
    assert source.poll(2.0) == []
    found = source.poll(3.0)
    assert checks(found) == [("mlx5_1/1", "port_down", "fatal")]
    assert "gone from sysfs" in found[0].payload["detail"]


def test_debounce_is_configurable(sysfs):
    source = InfinibandSource(sysfs.root, debounce=3)
    source.poll(1.0)
    sysfs.state("mlx5_0", 1, 1, phys=2)
    assert source.poll(2.0) == [] and source.poll(3.0) == []
    assert checks(source.poll(4.0)) == [("mlx5_0/1", "port_down", "fatal")]
    with pytest.raises(ValueError, match="debounce"):
        InfinibandSource(sysfs.root, debounce=0)


def test_no_infiniband_at_all(tmp_path):
    source = InfinibandSource(tmp_path / "absent")
    assert source.poll(1.0) == []
    assert source.status() == "ok"
    source.close()


def test_unreadable_files_are_reported_not_raised(sysfs):
    (sysfs.root / "mlx5_0" / "ports" / "1" / "state").write_text("garbage\n")
    (sysfs.root / "mlx5_1" / "ports" / "1" / "counters" / "symbol_error").write_text("x\n")
    source = InfinibandSource(sysfs.root)
    assert source.poll(1.0) == []
    assert "unexpected content" in source.status() and "not a number" in source.status()


def test_every_finding_matches_the_evidence_kind(sysfs):
    source = InfinibandSource(sysfs.root)
    source.poll(1.0)
    sysfs.counters("mlx5_0", 1, link_downed=2, symbol_error=99, port_rcv_errors=99)
    sysfs.state("mlx5_1", 1, 1)
    found = source.poll(2.0) + source.poll(3.0)
    assert {f.payload["check"] for f in found} == {
        "link_flap",
        "symbol_errors_rising",
        "rcv_errors_rising",
        "port_down",
    }
    for finding in found:
        assert finding.kind == "ib_finding" and finding.gpu is None
        assert set(finding.payload) >= {"port", "check", "severity", "detail"}
        assert finding.payload["check"] in IB_CHECKS
        assert finding.payload["severity"] in ("fatal", "warning", "info")
