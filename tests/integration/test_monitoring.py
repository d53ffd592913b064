"""The alert rules and the Grafana dashboard against real parts: Debian's Prometheus and
Alertmanager on loopback scrape a live controller on the local cluster; an XID storm past the
blast radius makes the needs-operator alerts fire in Alertmanager, and every metric a rule or a
dashboard panel names is in the real scrape, every panel's query answers with data."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from tests.conftest import _free_port_block, wait_for
from tests.integration import test_controller
from tests.integration.test_controller import running
from tests.integration.test_faults import capped_stack, xid_storm

pytestmark = pytest.mark.cluster

scheduler = test_controller.scheduler
stacks = test_controller.stacks

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "packaging" / "prometheus" / "srecovery-rules.yml"
DASHBOARD = ROOT / "packaging" / "grafana" / "srecovery-dashboard.json"
METRIC = re.compile(r"\bsrecovery_[a-z_]+")
#: Grafana's variables, as the dashboard's queries would be sent for "all controllers"
GRAFANA_VARIABLES = {"$instance": ".*", "$__rate_interval": "1m"}


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@dataclass
class Monitoring:
    prometheus: str
    alertmanager: str

    def query(self, expr: str) -> list[dict]:
        q = urllib.parse.urlencode({"query": expr})
        body = get_json(f"{self.prometheus}/api/v1/query?{q}")
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def metric_names(self) -> set[str]:
        return set(get_json(f"{self.prometheus}/api/v1/label/__name__/values")["data"])

    def alerts(self) -> list[dict]:
        """What Alertmanager holds now (its v2 API): the alerts Prometheus sent it."""
        return get_json(f"{self.alertmanager}/api/v2/alerts?active=true&silenced=false")


@pytest.fixture
def monitoring(local_cluster, tmp_path: Path) -> Iterator:
    """Factory: Alertmanager, and Prometheus scraping the controller at ``target`` as job
    "srecovery" every second with the project's rules, both on loopback."""
    prometheus = shutil.which("prometheus")
    alertmanager = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    assert prometheus and alertmanager, (
        "install Debian's prometheus and prometheus-alertmanager (scripts/bootstrap does)"
    )
    procs: list[subprocess.Popen] = []

    def start(target: str) -> Monitoring:
        prom_port = _free_port_block(2, start=local_cluster.port_base + 420)
        am_port = prom_port + 1
        (tmp_path / "am.yml").write_text(
            "route: {receiver: nobody, group_wait: 1s, group_interval: 1s}\n"
            "receivers: [{name: nobody}]\n"
        )
        (tmp_path / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(RULES)],
                    "alerting": {
                        "alertmanagers": [
                            {"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}
                        ]
                    },
                    "scrape_configs": [
                        {"job_name": "srecovery", "static_configs": [{"targets": [target]}]}
                    ],
                }
            )
        )
        log = (tmp_path / "monitoring.log").open("ab")
        procs.append(
            subprocess.Popen(
                [
                    alertmanager,
                    f"--config.file={tmp_path / 'am.yml'}",
                    f"--storage.path={tmp_path / 'am'}",
                    f"--web.listen-address=127.0.0.1:{am_port}",
                    "--cluster.listen-address=",  # no gossip with other Alertmanagers
                ],
                stdout=log,
                stderr=log,
            )
        )
        procs.append(
            subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=log,
                stderr=log,
            )
        )
        found = Monitoring(f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{am_port}")
        wait_for(lambda: ready(found.prometheus) and ready(found.alertmanager), timeout=60)
        return found

    yield start
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, query) of every panel, with Grafana's variables filled in."""
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            out.append((panel["title"], expr))
    return out


@pytest.mark.timeout(300)
def test_an_xid_storm_past_the_blast_radius_fires_in_alertmanager(
    stacks, submit, scheduler, monitoring
):
    stack = capped_stack(stacks)  # 4 nodes, 25 %: one drain, then the cap
    mon = monitoring(stack.url.removeprefix("http://"))
    # scraped, with the needs-operator series at 0 before anything happens
    wait_for(lambda: mon.query('srecovery_needs_operator_total{rule="blast_radius"} == 0'))
    assert mon.query('up{job="srecovery"}')[0]["value"][1] == "1"
    time.sleep(3)  # a few evaluations: nothing fires on a quiet controller
    quiet = {a["labels"]["alertname"] for a in mon.alerts()}
    assert not quiet & {"SRecoveryNeedsOperator", "SRecoveryBlastRadiusReached"}, quiet

    jobs = [submit("-N1", "--exclusive", "--wrap=sleep 600") for _ in range(2)]
    nodes = [wait_for(lambda j=j: running(scheduler, j)).nodes[0] for j in jobs]
    stormed = time.time()
    xid_storm(stack, nodes)

    def firing() -> dict[str, dict]:
        found = {a["labels"]["alertname"]: a for a in mon.alerts()}
        wanted = {"SRecoveryNeedsOperator", "SRecoveryBlastRadiusReached"}
        return found if wanted <= set(found) else {}

    alerts = wait_for(firing, timeout=90)
    needs = alerts["SRecoveryNeedsOperator"]
    assert needs["labels"]["rule"] == "blast_radius" and needs["status"]["state"] == "active"
    assert needs["labels"]["severity"] == "warning" and needs["labels"]["job"] == "srecovery"
    assert needs["labels"]["instance"] == stack.url.removeprefix("http://")
    assert "troubleshooting.md#srecoveryneedsoperator" in needs["annotations"]["runbook_url"]
    blast = alerts["SRecoveryBlastRadiusReached"]
    assert blast["labels"]["severity"] == "critical"
    assert "blast radius is reached" in blast["annotations"]["summary"]
    active_at = min(datetime.fromisoformat(a["startsAt"]).timestamp() for a in alerts.values())
    print(f"XID storm to active in Alertmanager: {active_at - stormed:.1f} s;", list(alerts))

    # the lemon scores are read every 30 s: the drained node scores above 0 within a minute
    lemons = wait_for(lambda: mon.query("srecovery_node_lemon_score > 0"), timeout=70)
    assert {s["metric"]["node"] for s in lemons} <= set(nodes)

    names = mon.metric_names()
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    for rule in rules:
        for name in METRIC.findall(rule["expr"]):
            assert name in names, f"{rule['alert']}: {name} is not in a real scrape"
    empty = []
    for title, expr in dashboard_queries():
        for name in METRIC.findall(expr):
            assert name in names, f"panel {title!r}: {name} is not in a real scrape"
        if not mon.query(expr):  # runs on the real Prometheus, and answers with data
            empty.append((title, expr))
    assert not empty, empty
