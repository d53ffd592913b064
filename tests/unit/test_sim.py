"""The simulated GPU backend: stable inventory, injected faults as findings, XIDs delivered once
across restarts, concurrent injectors, ``srecovery sim``, the registry, and health.json."""

from __future__ import annotations

import json
import multiprocessing
import tempfile
from pathlib import Path
from unittest.mock import ANY

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_recovery.config import SidecarConfig
from slurm_recovery.sidecar import registry
from slurm_recovery.sidecar.base import Finding
from slurm_recovery.sidecar.daemon import HEALTH_FILE, Health
from slurm_recovery.sidecar.gpu import GpuBackend, GpuInfo
from slurm_recovery.sidecar.gpu.nvml import NvmlBackend
from slurm_recovery.sidecar.sim import (
    SimBackend,
    SimError,
    SimXidSource,
    inject,
    load_state,
    state_path,
)
from slurm_recovery.signals.xid import load_xid_catalogue

NOW = 1_800_000_000.0


def checks(findings: list[Finding]) -> list[tuple[str, int | None, str]]:
    return [
        (f.payload["check"], f.gpu, f.payload["severity"])
        for f in findings
        if f.kind == "gpu_finding"
    ]


# --- inventory -----------------------------------------------------------------------------


def test_inventory_is_stable_per_node_and_distinct_across_nodes(tmp_path):
    a = SimBackend("n2", tmp_path, 8)
    again = SimBackend("n2", tmp_path / "elsewhere", 8)
    other = SimBackend("n3", tmp_path, 8)
    inv = a.inventory()
    assert isinstance(a, GpuBackend)
    assert all(isinstance(g, GpuInfo) for g in inv)
    assert [g.index for g in inv] == list(range(8))
    assert inv == again.inventory()  # derived from the node name, not from chance
    assert len({g.uuid for g in inv}) == 8 and len({g.pci_bus_id for g in inv}) == 8
    assert not {g.uuid for g in inv} & {g.uuid for g in other.inventory()}
    assert inv[0].uuid.startswith("GPU-") and inv[0].pci_bus_id == "00000000:18:00.0"
    assert all(g.serial.isdigit() and len(g.serial) == 13 for g in inv)


def test_first_poll_reports_the_inventory_then_only_changes(tmp_path):
    backend = SimBackend("n1", tmp_path, 4)
    (first,) = backend.poll(NOW)
    assert first.kind == "gpu_inventory"
    assert first.payload["expected"] == 4 and len(first.payload["gpus"]) == 4
    assert first.payload["gpus"][1] == backend.inventory()[1].to_payload()
    assert backend.poll(NOW + 10) == []


def test_open_resizes_an_existing_node_and_keeps_its_events(tmp_path):
    inject(tmp_path, "n1", gpu=1, xid=79, gpus_if_new=8)
    backend = SimBackend("n1", tmp_path, 2)
    assert len(backend.inventory()) == 2
    assert [f.payload["xid"] for f in backend.poll_xids(NOW)] == [79]


def test_fewer_gpus_than_expected_is_a_node_level_gpu_lost(tmp_path):
    backend = SimBackend("n1", tmp_path, 2, expected_gpus=4)
    found = backend.poll(NOW)
    assert ("gpu_lost", None, "fatal") in checks(found)
    lost = next(f for f in found if f.kind == "gpu_finding")
    assert lost.payload["count"] == 2 and lost.payload["expected"] == 4


# --- XIDs: the fast path, delivered once -----------------------------------------------------


def test_injected_xid_becomes_an_xid_finding(tmp_path):
    backend = SimBackend("n2", tmp_path, 8)
    (event,) = inject(tmp_path, "n2", gpu=1, xid=79, now=NOW)
    (found,) = backend.poll_xids(NOW + 1)
    assert found.kind == "xid" and found.gpu == 1
    assert found.observed_at == NOW  # when it happened, not when it was read
    assert found.payload == {
        "xid": 79,
        "message": "GPU has fallen off the bus.",
        "origin": "sim",
        "injection": event["id"],
        "pci": "00000000:2A:00.0",
    }
    assert found.to_event("n2")["node"] == "n2"


def test_xids_are_redelivered_until_committed_and_never_after(tmp_path):
    backend = SimBackend("n2", tmp_path, 8)
    inject(tmp_path, "n2", gpu=0, xid=48)
    inject(tmp_path, "n2", gpu=3, xid=79, message="custom text")
    assert [f.payload["xid"] for f in backend.poll_xids(NOW)] == [48, 79]
    # a crash before the outbox had them: a new sidecar sees them again
    restarted = SimBackend("n2", tmp_path, 8)
    assert [f.payload["xid"] for f in restarted.poll_xids(NOW)] == [48, 79]
    restarted.commit_xids()
    assert restarted.poll_xids(NOW) == []
    assert load_state(tmp_path, "n2")["xid_delivered"] == 2
    # after the commit, no restart re-sends them; a new injection still arrives
    again = SimBackend("n2", tmp_path, 8)
    assert again.poll_xids(NOW) == []
    inject(tmp_path, "n2", gpu=3, xid=94)
    (new,) = SimXidSource(again).poll(NOW)
    assert new.payload["xid"] == 94 and new.payload["message"].startswith("Contained")


def test_telemetry_injections_do_not_take_the_fast_path(tmp_path):
    backend = SimBackend("n2", tmp_path, 8)
    inject(tmp_path, "n2", gpu=2, ecc_dbe=1, lose_gpu=False, throttle="thermal")
    assert backend.poll_xids(NOW) == []


def test_a_clear_is_a_gpu_reset_on_the_fast_path(tmp_path):
    backend = SimBackend("n2", tmp_path, 8)
    inject(tmp_path, "n2", gpu=1, xid=79)
    backend.poll_xids(NOW)
    backend.commit_xids()
    inject(tmp_path, "n2", gpu=1, clear=True, now=NOW + 5)
    (reset,) = backend.poll_xids(NOW + 6)
    assert (reset.kind, reset.gpu, reset.observed_at) == ("gpu_finding", 1, NOW + 5)
    assert reset.payload["check"] == "gpu_reset" and reset.payload["cleared"] is True
    assert reset.payload["severity"] == "info" and "GPU 1 reset" in reset.payload["detail"]
    backend.commit_xids()
    # a reset while no sidecar runs is delivered by the next one, once
    inject(tmp_path, "n2", clear=True)
    restarted = SimBackend("n2", tmp_path, 8)
    (node_reset,) = restarted.poll_xids(NOW)
    assert node_reset.gpu is None and "every GPU reset" in node_reset.payload["detail"]
    restarted.commit_xids()
    assert SimBackend("n2", tmp_path, 8).poll_xids(NOW) == []


# --- telemetry faults: the slow path ---------------------------------------------------------


def test_each_fault_is_reported_when_it_appears_and_cleared_when_it_goes(tmp_path):
    backend = SimBackend("n2", tmp_path, 8)
    backend.poll(NOW)
    inject(tmp_path, "n2", gpu=1, ecc_dbe=1)
    inject(tmp_path, "n2", gpu=2, throttle="hw_slowdown")
    inject(tmp_path, "n2", gpu=3, link_downgrade=True)
    found = backend.poll(NOW + 10)
    assert sorted(checks(found), key=str) == sorted(
        [
            ("ecc_dbe", 1, "fatal"),
            ("throttle_hw_slowdown", 2, "warning"),
            ("pcie_link_downgrade", 3, "warning"),
        ],
        key=str,
    )
    link = next(f for f in found if f.payload["check"] == "pcie_link_downgrade")
    assert (link.payload["current_gen"], link.payload["max_gen"]) == (3, 5)
    assert (link.payload["current_width"], link.payload["max_width"]) == (8, 16)
    assert all(f.payload["origin"] == "sim" and f.payload["uuid"] for f in found)
    assert backend.poll(NOW + 20) == []  # nothing new, nothing said
    inject(tmp_path, "n2", gpu=1, ecc_dbe=1)
    (worse,) = backend.poll(NOW + 30)  # the count went up: reported again
    assert worse.payload["volatile"] == 2 and worse.payload["aggregate"] == 2
    inject(tmp_path, "n2", clear=True)
    cleared = backend.poll(NOW + 40)
    assert {(f.payload["check"], f.gpu) for f in cleared} == {
        ("ecc_dbe", 1),
        ("throttle_hw_slowdown", 2),
        ("pcie_link_downgrade", 3),
    }
    assert all(f.payload["cleared"] is True and f.payload["severity"] == "info" for f in cleared)
    state = load_state(tmp_path, "n2")
    assert state["gpus"][1]["ecc_dbe_volatile"] == 0  # a reset clears the volatile count
    assert state["gpus"][1]["ecc_dbe_aggregate"] == 2  # not the lifetime one


def test_a_lost_gpu_leaves_the_inventory_and_is_fatal(tmp_path):
    backend = SimBackend("n2", tmp_path, 8)
    backend.poll(NOW)
    inject(tmp_path, "n2", gpu=5, lose_gpu=True, throttle="power_brake")
    found = backend.poll(NOW + 10)
    inventory = next(f for f in found if f.kind == "gpu_inventory")
    assert [g["index"] for g in inventory.payload["gpus"]] == [0, 1, 2, 3, 4, 6, 7]
    assert inventory.payload["expected"] == 8
    assert checks(found) == [("gpu_lost", 5, "fatal")]  # a lost GPU reports nothing else
    assert 5 not in backend.telemetry()


def test_a_restarted_backend_reports_the_conditions_present(tmp_path):
    inject(tmp_path, "n2", gpu=4, ecc_dbe=1, gpus_if_new=8)
    found = SimBackend("n2", tmp_path, 8).poll(NOW)
    assert ("ecc_dbe", 4, "fatal") in checks(found)


def test_telemetry_readings_are_plain_json(tmp_path):
    backend = SimBackend("n2", tmp_path, 2)
    inject(tmp_path, "n2", gpu=0, throttle="thermal")
    readings = backend.telemetry()
    assert set(readings) == {0, 1}
    assert readings[0]["throttle"] == ["thermal"]
    json.dumps(readings)


# --- injection ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "nothing to inject"),
        ({"xid": 79}, "which GPU"),
        ({"gpu": 8, "xid": 79}, "there is no GPU 8"),
        ({"gpu": 0, "throttle": "cosmic"}, "throttle reason"),
    ],
)
def test_bad_injections_are_refused_with_the_fix(tmp_path, kwargs, message):
    with pytest.raises(SimError, match=message):
        inject(tmp_path, "n2", gpus_if_new=8, **kwargs)


def test_node_names_cannot_escape_the_directory(tmp_path):
    with pytest.raises(SimError, match="not a Slurm node name"):
        inject(tmp_path, "../etc/passwd", gpu=0, xid=79)


def test_state_file_is_replaced_atomically_and_readable(tmp_path):
    inject(tmp_path, "n2", gpu=0, xid=13, gpus_if_new=2)
    path = state_path(tmp_path, "n2")
    assert json.loads(path.read_text())["events"][0]["xid"] == 13
    assert not list(tmp_path.glob("*.tmp"))
    path.write_text("{not json")
    with pytest.raises(SimError, match="delete it to start over"):
        load_state(tmp_path, "n2")


def _inject_many(sim_dir: str, count: int) -> None:
    for _ in range(count):
        inject(sim_dir, "n1", gpu=0, xid=31, gpus_if_new=2)


def test_concurrent_injectors_never_lose_an_event(tmp_path):
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_inject_many, args=(str(tmp_path), 25)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    state = load_state(tmp_path, "n1")
    assert [e["id"] for e in state["events"]] == list(range(1, 101))
    assert len(SimBackend("n1", tmp_path, 2).poll_xids(NOW)) == 100


# --- srecovery sim -------------------------------------------------------------------------------


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """The ``srecovery`` group with ``sim`` in it, and a config whose sim_dir is private."""
    from slurm_recovery.cli import cli as group
    from slurm_recovery.cli.sim import sim

    config = tmp_path / "config.toml"
    config.write_text(f'[sidecar]\nsim_dir = "{tmp_path / "sim"}"\nsim_gpus = 4\n')
    config.chmod(0o644)
    monkeypatch.setenv("SRECOVERY_CONFIG", str(config))
    if "sim" not in group.commands:
        monkeypatch.setitem(group.commands, "sim", sim)

    def run(*args: str) -> click.testing.Result:
        return CliRunner().invoke(group, ["sim", *args], obj={}, catch_exceptions=False)

    return run


def test_cli_inject_and_show(cli, tmp_path):
    out = cli("inject", "--node", "n2", "--gpu", "1", "--xid", "79")
    assert out.exit_code == 0, out.output
    assert out.output == "injected on n2: xid 79 on GPU 1: GPU has fallen off the bus. (event 1)\n"
    out = cli("inject", "--node", "n2", "--gpu", "2", "--ecc-dbe", "--throttle", "thermal")
    assert out.exit_code == 0 and out.output.count("injected on n2") == 2
    for flag in ("--lose-gpu", "--link-downgrade"):
        assert cli("inject", "--node", "n2", "--gpu", "3", flag).exit_code == 0
    state = load_state(tmp_path / "sim", "n2")
    assert len(state["gpus"]) == 4  # sidecar.sim_gpus of the config
    gpus = state["gpus"]
    assert gpus[2]["ecc_dbe_volatile"] == 1 and gpus[2]["throttle"] == ["thermal"]
    assert gpus[3]["present"] is False and gpus[3]["pcie_gen"] == 3
    shown = cli("show", "--node", "n2")
    assert shown.exit_code == 0
    assert "LOST" in shown.output and "thermal" in shown.output
    assert "xid 79 on GPU 1: GPU has fallen off the bus.  waiting" in shown.output
    as_json = json.loads(cli("show", "--json").output)
    assert as_json["n2"]["events"][0]["xid"] == 79
    cleared = cli("inject", "--node", "n2", "--clear", "--json")
    assert json.loads(cleared.output)["events"][0]["type"] == "clear"
    assert all(g["present"] for g in load_state(tmp_path / "sim", "n2")["gpus"])


def test_cli_sets_utilization(cli, tmp_path):
    result = cli("inject", "--node", "n2", "--utilization", "80")
    assert result.exit_code == 0, result.output
    assert "every GPU 80% busy" in result.output
    readings = SimBackend("n2", tmp_path / "sim", 4).telemetry()
    assert {r["utilization_gpu"] for r in readings.values()} == {80}
    assert cli("inject", "--node", "n2", "--utilization", "101").exit_code != 0


def test_cli_refuses_bad_usage_with_a_reason(cli):
    no_gpu = cli("inject", "--node", "n2", "--xid", "79")
    assert no_gpu.exit_code == 2 and "give --gpu INDEX" in no_gpu.output
    mixed = cli("inject", "--node", "n2", "--gpu", "0", "--xid", "79", "--clear")
    assert mixed.exit_code == 2 and "separate command" in mixed.output
    bad_gpu = cli("inject", "--node", "n2", "--gpu", "9", "--lose-gpu")
    assert bad_gpu.exit_code == 2 and "there is no GPU 9" in bad_gpu.output
    assert "no simulated nodes" in cli("show").output


# --- the registry with the simulated backend --------------------------------------------------


def sidecar_config(tmp_path: Path, **overrides) -> SidecarConfig:
    values = {
        "gpu_backend": "sim",
        "sim_dir": tmp_path / "sim",
        "sim_gpus": 8,
        "kmsg": False,
        "ib_sysfs": "",
        "spool_dir": tmp_path / "spool" / "{node}",
    }
    return SidecarConfig(**{**values, **overrides})


def test_registry_wires_sim_xids_and_the_spool_fast_and_the_gpus_slow(tmp_path):
    config = sidecar_config(tmp_path)
    wired = registry.build(config, "n2", config.spool_path("n2"))
    try:
        assert [s.name for s in wired.fast] == ["sim_xid", "hook_spool", "joblog"]
        assert [s.name for s in wired.slow] == ["sim", "gpu_activity", "host"]
        assert isinstance(wired.gpu, SimBackend) and wired.broken == {}
        assert (tmp_path / "spool" / "n2" / "events" / "bad").is_dir()
    finally:
        wired.close()


def test_registry_with_no_gpus(tmp_path):
    wired = registry.build(sidecar_config(tmp_path, gpu_backend="none"), "n2", tmp_path / "s")
    assert wired.gpu is None and [s.name for s in wired.sources] == ["hook_spool", "joblog", "host"]


def test_a_source_that_cannot_open_is_reported_not_fatal(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.GPU_BACKENDS, "nvml", "slurm_recovery.sidecar.nowhere:Nvml")
    wired = registry.build(sidecar_config(tmp_path, gpu_backend="nvml"), "n2", tmp_path / "s")
    assert wired.gpu is None
    assert "nvml" in wired.broken and "cannot open" in wired.broken["nvml"]
    assert [s.name for s in wired.sources] == ["hook_spool", "joblog", "host"]


# --- health.json from what the sim reports ----------------------------------------------------


def test_health_lists_open_fatal_conditions_until_cleared(tmp_path):
    catalogue = load_xid_catalogue()
    backend = SimBackend("n2", tmp_path, 8)
    health = Health(tmp_path / HEALTH_FILE, "n2", catalogue, boot_id="boot-1")
    inject(tmp_path, "n2", gpu=1, xid=79, now=NOW)
    inject(tmp_path, "n2", gpu=2, xid=13, now=NOW)  # an application XID: not the node's fault
    inject(tmp_path, "n2", gpu=3, ecc_dbe=1, throttle="thermal", now=NOW)
    assert health.observe(backend.poll_xids(NOW))
    assert health.observe(backend.poll(NOW + 1))
    health.write(NOW + 1)
    doc = json.loads((tmp_path / HEALTH_FILE).read_text())
    assert doc["node"] == "n2" and doc["updated_at"] == NOW + 1 and doc["boot_id"] == "boot-1"
    assert doc["fatal"] == [
        {
            "check": "ecc_dbe",
            "gpu": 3,
            "since": NOW + 1,
            "detail": "GPU 3 (00000000:5D:00.0): 1 uncorrectable (double-bit) ECC errors since "
            "the last GPU reset",
        },
        {
            "check": "xid",
            "gpu": 1,
            "since": NOW,
            "detail": "xid 79 (GPU has fallen off the bus) on GPU 1",
        },
    ]
    backend.commit_xids()
    # a sidecar restart in the same boot keeps them (an edge-triggered backend would not
    # report them again); a reboot forgets them
    kept = Health(tmp_path / HEALTH_FILE, "n2", catalogue, "boot-1")
    assert set(kept.open) == {("xid", 1), ("ecc_dbe", 3)}
    assert not kept.observe(SimBackend("n2", tmp_path, 8).poll(NOW + 2))  # already open
    assert Health(tmp_path / HEALTH_FILE, "n2", catalogue, "boot-2").open == {}
    # the throttle cleared: nothing changes (it was never fatal); GPU 3 reset: its DBE goes
    inject(tmp_path, "n2", gpu=3, clear=True)
    assert health.observe(backend.poll_xids(NOW + 3) + backend.poll(NOW + 3))
    assert set(health.open) == {("xid", 1)}
    inject(tmp_path, "n2", gpu=1, lose_gpu=True)
    assert health.observe(backend.poll(NOW + 4))
    assert set(health.open) == {("xid", 1), ("gpu_lost", 1)}
    inject(tmp_path, "n2", clear=True)  # every GPU reset
    assert health.observe(backend.poll_xids(NOW + 5))
    assert health.open == {}
    assert not health.observe(backend.poll(NOW + 6))  # the cleared findings change nothing


# --- the node's driver version mismatch (--driver-mismatch) -------------------------------------


def mismatches(findings: list[Finding]) -> list[tuple[str | None, str, bool]]:
    return [
        (f.gpu, f.payload["severity"], bool(f.payload.get("cleared")))
        for f in findings
        if f.kind == "gpu_finding" and f.payload["check"] == "driver_version_mismatch"
    ]


def test_the_injected_mismatch_is_what_nvml_reports_for_its_own_failed_init(tmp_path):
    from tests.unit.test_nvml_backend import _real_pynvml, _RealInitError

    nvml = NvmlBackend(
        expected_gpus=8,
        timeout=0.5,
        nvml=_RealInitError(_real_pynvml().NVML_ERROR_LIB_RM_VERSION_MISMATCH),
    )
    try:
        (real,) = nvml.poll(NOW)
    finally:
        nvml.close()
    backend = SimBackend("n2", tmp_path, 8)
    inject(tmp_path, "n2", driver_mismatch=True)
    (sim,) = backend.poll(NOW)
    assert (sim.kind, sim.gpu, sim.observed_at) == (real.kind, real.gpu, real.observed_at)
    assert (sim.kind, sim.gpu) == ("gpu_finding", None)
    assert {**sim.payload, "origin": None} == {**real.payload, "origin": None, "detail": ANY}
    assert sim.payload["origin"] == "sim" and "origin" not in real.payload
    assert (sim.payload["check"], sim.payload["severity"], sim.payload["call"]) == (
        "driver_version_mismatch",
        "fatal",
        "nvmlInit",
    )
    # one text, made in one place: the simulated cause only says it is simulated
    assert sim.payload["detail"].replace(" (simulated)", "") == real.payload["detail"]


def test_while_the_mismatch_holds_nvml_answers_nothing_else(tmp_path):
    backend = SimBackend("n2", tmp_path, 4)
    assert [f.kind for f in backend.poll(NOW)] == ["gpu_inventory"]
    assert backend.status() == "ok"
    inject(tmp_path, "n2", driver_mismatch=True)
    inject(tmp_path, "n2", gpu=1, ecc_dbe=1)  # a GPU fault no NVML call can see meanwhile
    assert mismatches(backend.poll(NOW + 10)) == [(None, "fatal", False)]
    assert backend.inventory() == [] and backend.telemetry() == {}
    assert backend.status().startswith("degraded: nvmlInit failed: NVMLError_LibRmVersion")
    assert backend.poll(NOW + 20) == []  # said once per repeat_after
    # a GPU reset does not end it: the libraries still differ from the module
    inject(tmp_path, "n2", gpu=1, clear=True)
    assert backend.poll(NOW + 30) == [] and backend.inventory() == []
    # XIDs still come: the kernel log does not need NVML
    inject(tmp_path, "n2", gpu=2, xid=79)
    assert [f.kind for f in backend.poll_xids(NOW + 31)] == ["gpu_finding", "xid"]


def test_the_mismatch_is_sent_again_every_repeat_after_while_it_holds(tmp_path):
    backend = SimBackend("n2", tmp_path, 2, repeat_after=60.0)
    inject(tmp_path, "n2", driver_mismatch=True)
    assert mismatches(backend.poll(NOW)) == [(None, "fatal", False)]
    assert backend.poll(NOW + 59) == []
    assert mismatches(backend.poll(NOW + 60)) == [(None, "fatal", False)]
    assert backend.poll(NOW + 61) == []
    # a restarted sidecar says it at its first poll
    assert mismatches(SimBackend("n2", tmp_path, 2).poll(NOW + 62)) == [(None, "fatal", False)]


def test_a_clear_of_every_gpu_ends_it_as_a_reboot_would(tmp_path):
    backend = SimBackend("n2", tmp_path, 4)
    backend.poll(NOW)
    inject(tmp_path, "n2", gpu=3, throttle="thermal")
    assert checks(backend.poll(NOW + 5)) == [("throttle_thermal", 3, "warning")]
    inject(tmp_path, "n2", driver_mismatch=True)
    (held,) = backend.poll(NOW + 10)
    inject(tmp_path, "n2", clear=True, now=NOW + 15)
    (reset,) = backend.poll_xids(NOW + 16)
    assert (reset.payload["check"], reset.gpu) == ("gpu_reset", None)
    found = backend.poll(NOW + 20)
    assert mismatches(found) == [(None, "info", True)]
    cleared = next(f for f in found if f.payload.get("check") == "driver_version_mismatch")
    assert cleared.payload["detail"] == f"cleared: {held.payload['detail']}"
    assert ("throttle_thermal", 3, "info") in checks(found)  # the reset ended it too
    (inventory,) = [f for f in found if f.kind == "gpu_inventory"]  # enumerated afresh
    assert len(inventory.payload["gpus"]) == 4 and len(backend.telemetry()) == 4
    assert backend.status() == "ok" and "driver_mismatch" not in load_state(tmp_path, "n2")
    assert backend.poll(NOW + 400) == []  # over: never sent again


def test_the_health_file_holds_the_mismatch_until_the_clear(tmp_path):
    backend = SimBackend("n2", tmp_path, 4)
    health = Health(tmp_path / HEALTH_FILE, "n2", boot_id="boot-1")
    inject(tmp_path, "n2", driver_mismatch=True)
    assert health.observe(backend.poll(NOW))
    assert list(health.open) == [("driver_version_mismatch", None)]
    inject(tmp_path, "n2", gpu=0, clear=True)  # a GPU reset: still open
    assert not health.observe(backend.poll_xids(NOW + 1) + backend.poll(NOW + 1))
    inject(tmp_path, "n2", clear=True)
    health.observe(backend.poll_xids(NOW + 2) + backend.poll(NOW + 2))
    assert health.open == {}


def test_a_mismatch_on_a_gpu_is_refused(tmp_path):
    with pytest.raises(SimError, match="leave out --gpu"):
        inject(tmp_path, "n2", gpu=0, driver_mismatch=True)
    assert load_state(tmp_path, "n2") is None


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["mismatch", "clear", "clear_gpu", "poll"]), st.floats(0, 200)),
        max_size=25,
    )
)
def test_the_mismatch_is_reported_as_a_condition_whatever_the_order(steps):
    """Any order of injections, clears and polls (time only moves forward): while it holds,
    the fatal finding at the first poll and again once ``repeat_after`` has passed since the
    last; a ``cleared`` one at the first poll after it ended, only if it was reported."""
    with tempfile.TemporaryDirectory() as folder:
        backend = SimBackend("n2", folder, 2, repeat_after=100.0)
        now, holds, last, model_reported = NOW, False, None, False
        for op, step in steps:
            now += step
            if op == "mismatch":
                inject(folder, "n2", driver_mismatch=True, now=now)
                holds = True
            elif op == "clear":
                inject(folder, "n2", clear=True, now=now)
                holds = False
            elif op == "clear_gpu":
                inject(folder, "n2", gpu=1, clear=True, now=now)
            else:
                seen = mismatches(backend.poll(now))
                if holds:
                    due = last is None or now - last >= 100.0
                    assert seen == ([(None, "fatal", False)] if due else [])
                    last = now if due else last
                    model_reported = True
                else:
                    assert seen == ([(None, "info", True)] if model_reported else [])
                    last, model_reported = None, False
                assert (backend.inventory() == []) == holds
                assert (backend.status() != "ok") == holds


def test_cli_injects_and_clears_the_driver_mismatch(cli, tmp_path):
    out = cli("inject", "--node", "n3", "--driver-mismatch")
    assert out.exit_code == 0, out.output
    assert out.output == (
        "injected on n3: driver libraries and kernel module differ "
        "(driver_version_mismatch until --clear) (event 1)\n"
    )
    assert load_state(tmp_path / "sim", "n3")["driver_mismatch"] is True
    assert "DRIVER MISMATCH" in cli("show", "--node", "n3").output
    (event,) = json.loads(cli("inject", "--node", "n3", "--driver-mismatch", "--json").output)[
        "events"
    ]
    assert (event["type"], event["gpu"]) == ("driver_mismatch", None)
    assert cli("inject", "--node", "n3", "--gpu", "0", "--clear").exit_code == 0
    assert load_state(tmp_path / "sim", "n3")["driver_mismatch"] is True  # a GPU reset: no
    assert cli("inject", "--node", "n3", "--clear").exit_code == 0
    assert "driver_mismatch" not in load_state(tmp_path / "sim", "n3")
    assert "DRIVER MISMATCH" not in cli("show", "--node", "n3").output


def test_cli_refuses_a_driver_mismatch_on_a_gpu_or_with_a_clear(cli):
    on_gpu = cli("inject", "--node", "n3", "--gpu", "0", "--driver-mismatch")
    assert on_gpu.exit_code == 2 and "leave out --gpu" in on_gpu.output
    both = cli("inject", "--node", "n3", "--driver-mismatch", "--clear")
    assert both.exit_code == 2 and "separate command" in both.output
    assert "--driver-mismatch" in cli("inject", "--help").output
