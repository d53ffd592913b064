"""The sidecar on the real local cluster: its own process, simulated GPUs, a real controller,
MUNGE-signed delivery. Injected XIDs arrive within a second; a controller outage loses
nothing; a sidecar restart re-sends no XID; SIGTERM exits 0."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.spool import HookSpool
from slurm_recovery.contract.wire import event_to_json
from slurm_recovery.scheduler.scontrol import ScontrolScheduler
from slurm_recovery.store import Store
from tests.conftest import _free_port_block, wait_for

pytestmark = pytest.mark.cluster

NODE = "n2"


@dataclass
class Controller:
    base: Path
    config: Path
    url: str
    pid: int = 0

    @property
    def db(self) -> Path:
        return self.base / "state.db"

    def start(self) -> None:
        self.pid = devstack.start_controller(self.config, self.base / "controller.log")
        devstack.wait_healthy(self.url, pid=self.pid)

    def stop(self) -> None:
        localcluster.stop_process(self.pid, "slurm_recovery.controller")

    def evidence(self, kind: str | None = None) -> list:
        if not self.db.exists():
            return []
        with Store.open(self.db, readonly=True) as store:
            found = [r.evidence for r in store.find_evidence(node=NODE)]
        return [e for e in found if kind is None or e.kind == kind]


@dataclass
class Sidecar:
    config: Path
    log: Path
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "slurm_recovery.sidecar",
                    "--config",
                    str(self.config),
                    "--node",
                    NODE,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise

    def text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture
def scheduler(local_cluster) -> ScontrolScheduler:
    return ScontrolScheduler(timeout=10, slurm_conf=str(local_cluster.slurm_conf))


@pytest.fixture
def stack(local_cluster) -> Iterator[tuple[Controller, Sidecar, Callable[..., None]]]:
    """A controller (monitor mode) and n2's sidecar with 8 simulated GPUs, and ``sim(...)``,
    which runs ``srecovery sim inject --node n2 ...``."""
    yield from _stack(local_cluster)


#: the sidecar's status period and the controller's grace for a silent node, in quick_stack
PERIOD, GRACE = 1.0, 2.5


@pytest.fixture
def quick_stack(local_cluster) -> Iterator[tuple[Controller, Sidecar, Callable[..., None]]]:
    """The same, with a sidecar status every PERIOD and a node silent past GRACE a finding."""
    yield from _stack(
        local_cluster,
        controller_lines=f"missing_report_grace = {GRACE}\n",
        sidecar_lines=f"status_interval = {PERIOD}\n",
    )


def _stack(
    local_cluster, controller_lines: str = "", sidecar_lines: str = ""
) -> Iterator[tuple[Controller, Sidecar, Callable[..., None]]]:
    """A stack whose config.toml has these lines added to [controller] and [sidecar]."""
    base = Path(tempfile.mkdtemp(prefix="srecovery-sidecar-"))
    base.chmod(0o755)
    port = _free_port_block(1, start=local_cluster.port_base + 600)
    devstack.write_policy(base / "policy.toml", "monitor")
    config = devstack.write_config(base, local_cluster, port)
    text = config.read_text()
    text = text.replace("[controller]\n", "[controller]\n" + controller_lines, 1)
    config.write_text(text.replace("[sidecar]\n", "[sidecar]\n" + sidecar_lines, 1))
    controller = Controller(base, config, f"http://127.0.0.1:{port}")
    controller.start()
    sidecar = Sidecar(config, base / "sidecar.log")

    srecovery = [sys.executable, "-m", "slurm_recovery.cli", "--config", str(config)]

    def sim(*args: str) -> None:
        out = subprocess.run(
            [*srecovery, "sim", "inject", "--node", NODE, *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr

    try:
        yield controller, sidecar, sim
    finally:
        if sidecar.proc is not None and sidecar.proc.poll() is None:
            sidecar.stop()
        controller.stop()


def started(controller: Controller, after: float = 0.0) -> bool:
    """The sidecar's start-up status reached the controller (it is authorised and sending)."""
    return any(
        e.payload.get("started_at", 0) > after and e.source == "sidecar"
        for e in controller.evidence("sidecar_status")
    )


def xids(controller: Controller) -> list[int]:
    return sorted(e.payload["injection"] for e in controller.evidence("xid"))


def test_injected_xid_reaches_the_controller_within_a_second(stack):
    controller, sidecar, sim = stack
    sidecar.start()
    wait_for(lambda: started(controller), timeout=30)
    (inventory,) = wait_for(lambda: controller.evidence("gpu_inventory"))
    assert len(inventory.payload["gpus"]) == 8 and inventory.payload["expected"] == 8
    latencies = []
    for run in range(5):
        before = time.monotonic()
        sim("--gpu", "1", "--xid", "79")
        wait_for(lambda n=run: len(controller.evidence("xid")) > n, timeout=10, interval=0.01)
        latencies.append(time.monotonic() - before)
    xid = controller.evidence("xid")[0]
    assert (xid.source, xid.node, xid.gpu) == ("sidecar", NODE, 1)
    assert xid.payload["xid"] == 79 and xid.payload["origin"] == "sim"
    latencies.sort()
    print(f"inject -> evidence stored: median {latencies[2]:.3f}s, max {latencies[-1]:.3f}s")
    assert latencies[2] < 1.0, latencies
    health = json.loads((controller.base / "spool" / NODE / "health.json").read_text())
    assert health["node"] == NODE
    assert [(f["check"], f["gpu"]) for f in health["fatal"]] == [("xid", 1)]
    # telemetry faults take the slow poll (sidecar.poll_interval, 10 s by default)
    sim("--gpu", "4", "--lose-gpu")
    lost = wait_for(
        lambda: [e for e in controller.evidence("gpu_finding") if e.payload["check"] == "gpu_lost"],
        timeout=30,
    )
    assert lost[0].gpu == 4 and lost[0].payload["severity"] == "fatal"
    assert sidecar.stop() == 0, sidecar.text()


def test_controller_outage_loses_nothing(stack):
    controller, sidecar, sim = stack
    sidecar.start()
    wait_for(lambda: started(controller), timeout=30)
    controller.stop()
    for gpu in (0, 3, 7):
        sim("--gpu", str(gpu), "--xid", "48")
    spool = HookSpool(controller.base / "spool" / NODE)
    for job_id in (4101, 4102):
        spool.put(
            event_to_json(
                "job_end",
                time.time(),
                node=NODE,
                job_id=job_id,
                payload={"exit_code": 1, "signal": 0, "restart_count": 0, "nodes": [NODE]},
            )
        )
    time.sleep(3)  # the sidecar retries, backing off; the spool files are taken, queued on disk
    wait_for(lambda: not spool.pending(), timeout=10)
    assert sidecar.proc.poll() is None, sidecar.text()
    assert "cannot deliver to the controller" in sidecar.text()
    controller.start()  # the same store
    wait_for(lambda: len(xids(controller)) >= 3, timeout=60)
    wait_for(lambda: len(controller.evidence("job_end")) >= 2, timeout=10)
    assert sorted(e.gpu for e in controller.evidence("xid")) == [0, 3, 7]
    ends = controller.evidence("job_end")
    assert sorted(e.job_id for e in ends) == [4101, 4102]
    assert {e.source for e in ends} == {"hook"}
    assert sidecar.stop() == 0, sidecar.text()


def test_a_restarted_sidecar_resends_no_xid(stack):
    controller, sidecar, sim = stack
    sidecar.start()
    wait_for(lambda: started(controller), timeout=30)
    sim("--gpu", "2", "--xid", "79")
    sim("--gpu", "5", "--xid", "31")
    wait_for(lambda: len(xids(controller)) == 2)
    assert sidecar.stop() == 0, sidecar.text()  # SIGTERM: exit 0

    restarted_at = time.time()
    sidecar.start()
    wait_for(lambda: started(controller, after=restarted_at), timeout=30)
    time.sleep(1.5)  # several fast ticks
    assert xids(controller) == [1, 2]
    sim("--gpu", "6", "--xid", "94")
    wait_for(lambda: xids(controller) == [1, 2, 3])
    # the XID 79 on GPU 2 is still an open fatal condition after the restart (same boot)
    health = json.loads((controller.base / "spool" / NODE / "health.json").read_text())
    assert ("xid", 2) in [(f["check"], f["gpu"]) for f in health["fatal"]]
    assert sidecar.stop() == 0, sidecar.text()


def test_a_node_whose_sidecar_is_killed_while_it_runs_a_job_is_a_finding_within_three_periods(
    quick_stack, submit, scheduler
):
    """n2 runs a job; its sidecar is SIGKILLed. Within 3 status periods of the kill the
    controller stores one sidecar_silent finding about n2 naming the job (long before Slurm's
    SlurmdTimeout), and nothing else happens: no incident, no drain, the job runs on. The
    sidecar back, the node is heard again; killed again, it is a second finding."""
    controller, sidecar, _ = quick_stack
    job = submit("-w", NODE, "--wrap=sleep 300")
    wait_for(lambda: scheduler.get_job(job).state == "RUNNING", timeout=30)
    sidecar.start()
    wait_for(lambda: started(controller), timeout=30)
    time.sleep(2 * PERIOD)  # a status or two on the record
    assert sidecar.proc is not None
    sidecar.proc.kill()
    killed = time.time()
    sidecar.proc.wait(10)

    (silent,) = wait_for(lambda: controller.evidence("sidecar_silent"), timeout=3 * PERIOD + 10)
    noticed = silent.observed_at - killed
    print(f"silence noticed {noticed:.2f}s after the kill (period {PERIOD}s, grace {GRACE}s)")
    assert noticed <= 3 * PERIOD + 1.0, noticed  # + one loop pass
    assert silent.source == "controller" and silent.node == NODE
    assert silent.payload["jobs"] == [job] and silent.payload["grace"] == GRACE
    assert silent.payload["silent_for"] > GRACE
    time.sleep(3 * PERIOD)  # more passes: one finding per silence, and nothing else
    assert len(controller.evidence("sidecar_silent")) == 1
    with Store.open(controller.db, readonly=True) as store:
        assert store.list_incidents(limit=10) == []
    assert not scheduler.get_node(NODE).drained
    assert scheduler.get_job(job).state == "RUNNING"

    sidecar.start()
    wait_for(lambda: started(controller, after=killed), timeout=30)
    time.sleep(GRACE + 2 * PERIOD)  # heard again: no new finding while it reports
    assert len(controller.evidence("sidecar_silent")) == 1
    sidecar.proc.kill()
    sidecar.proc.wait(10)
    wait_for(lambda: len(controller.evidence("sidecar_silent")) == 2, timeout=3 * PERIOD + 10)


def test_a_quiet_sidecars_status_is_state_not_a_growing_history(quick_stack):
    """Issue 29, item 1: a sidecar reporting every PERIOD with nothing changing updates its
    node's report in place; the evidence holds its first status (and the one with its GPU
    readings after the first poll), not one per period. ``srecovery nodes`` shows the last
    report and the last change."""
    controller, sidecar, _ = quick_stack
    sidecar.start()
    wait_for(lambda: started(controller), timeout=30)
    time.sleep(3 * PERIOD)
    stored = len(controller.evidence("sidecar_status"))
    assert 1 <= stored <= 2, controller.evidence("sidecar_status")
    time.sleep(5 * PERIOD)
    assert len(controller.evidence("sidecar_status")) == stored  # nothing new to say

    def nodes(*args: str) -> str:
        cli = [sys.executable, "-m", "slurm_recovery.cli", "--config", str(controller.config)]
        out = subprocess.run(
            [*cli, "nodes", NODE, *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    # the report as the controller holds it (in memory: the store has it every 30 s)
    shown = json.loads(nodes("--json"))["sidecar"]
    assert shown["reports_since_change"] >= 5, shown
    assert shown["silent_for"] < 2 * PERIOD + 1 and shown["last_report"] > shown["last_change"]
    line = next(x for x in nodes().splitlines() if x.strip().startswith("Sidecar:"))
    assert "last report" in line and "unchanged since" in line, line
    # and it reported in one session (issue 29, item 2), not a MUNGE credential per report
    log = (controller.base / "controller.log").read_text()
    assert log.count(f"session opened for the sidecar of {NODE} ") == 1, log[-2000:]
    # and after its first full statuses, in heartbeats (the readings wait for the next full
    # status, sidecar.full_status_interval: 300 s here)
    with urllib.request.urlopen(f"{controller.url}/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    held = re.search(r'srecovery_heartbeats_total\{answer="held"\} ([0-9.]+)', metrics)
    assert held and float(held.group(1)) >= 5, metrics[-3000:]
    # sent as datagrams (contract.datagrams), the controller's default, each one answered
    by_datagram = re.search(
        r'srecovery_heartbeat_datagrams_total\{outcome="answered"\} ([0-9.]+)', metrics
    )
    assert by_datagram and float(by_datagram.group(1)) >= 5, metrics[-3000:]
    assert shown["readings_at"] < shown["last_report"], shown
