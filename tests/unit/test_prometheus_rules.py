"""The alert rules (packaging/prometheus/) and the controller's metrics (controller/metrics.py):
`promtool check rules` and `promtool test rules` (Debian's prometheus package, installed by
scripts/bootstrap), every alert tested and linked to its runbook, every metric a rule names
exported. tests/integration/test_monitoring.py fires them through a real Prometheus."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml
from prometheus_client import generate_latest

from slurm_recovery.controller.metrics import Metrics, ReadAtScrape

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "packaging" / "prometheus" / "srecovery-rules.yml"
RULE_TESTS = ROOT / "packaging" / "prometheus" / "srecovery-rules.test.yml"
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"
METRIC = re.compile(r"\bsrecovery_[a-z_]+")


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    assert exe, "promtool not found: install Debian's prometheus package (scripts/bootstrap does)"
    return subprocess.run([exe, *args], input=stdin, capture_output=True, timeout=60)


def alerts() -> list[dict]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def scrape(tmp_path: Path) -> str:
    """What /metrics serves, beside a store and a watchdog spool in ``tmp_path``."""
    metrics = Metrics()
    metrics.registry.register(ReadAtScrape(tmp_path / "state.db", tmp_path / "spool"))
    return generate_latest(metrics.registry).decode()


def test_promtool_checks_and_tests_the_rules() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    tested = promtool("test", "rules", str(RULE_TESTS))
    out = tested.stdout.decode() + tested.stderr.decode()
    assert tested.returncode == 0 and "SUCCESS" in out, out


def test_every_alert_is_tested_firing_and_has_a_runbook_section() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        case["alertname"]
        for group in tests
        for case in group.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    names = [rule["alert"] for rule in alerts()]
    assert len(names) == len(set(names))
    assert set(names) == fired
    headings = {
        line[4:].strip().lower()
        for line in TROUBLESHOOTING.read_text().splitlines()
        if line.startswith("### ")
    }
    for rule in alerts():
        anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor in headings, f"{rule['alert']}: no '### {anchor}' in {TROUBLESHOOTING.name}"
        assert rule["labels"]["severity"] in ("warning", "critical")


def test_every_metric_a_rule_names_is_exported(tmp_path: Path) -> None:
    exported = set(METRIC.findall(scrape(tmp_path)))
    for rule in alerts():
        for name in METRIC.findall(rule["expr"]):
            assert name in exported, f"{rule['alert']} uses {name}, which /metrics lacks"


def test_promtool_accepts_the_exposition(tmp_path: Path) -> None:
    checked = promtool("check", "metrics", stdin=scrape(tmp_path).encode())
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()


def sample(text: str, name: str) -> float:
    (value,) = [float(line.split()[-1]) for line in text.splitlines() if line.split(" ")[0] == name]
    return value


def test_pass_streaks_and_the_last_good_pass() -> None:
    metrics = Metrics()
    text = lambda: generate_latest(metrics.registry).decode()  # noqa: E731
    metrics.pass_done(unreachable=False, good=True, now=100.0)
    metrics.pass_done(unreachable=True, good=False, now=101.0)
    metrics.pass_done(unreachable=True, good=False, now=102.0)
    assert sample(text(), "srecovery_slurm_unreachable_passes") == 2
    assert sample(text(), "srecovery_slurm_unreachable_total") == 2
    assert sample(text(), "srecovery_last_good_pass_timestamp_seconds") == 100.0
    metrics.pass_done(unreachable=False, good=False, now=103.0)  # answered: the streak ends
    assert sample(text(), "srecovery_slurm_unreachable_passes") == 0
    assert sample(text(), "srecovery_slurm_unreachable_total") == 2  # not Slurm's fault
    assert sample(text(), "srecovery_last_good_pass_timestamp_seconds") == 100.0
    metrics.pass_done(unreachable=False, good=True, now=104.0)
    assert sample(text(), "srecovery_last_good_pass_timestamp_seconds") == 104.0


def test_needs_operator_and_reject_series_start_at_zero_and_lemons_are_replaced() -> None:
    metrics = Metrics()
    text = generate_latest(metrics.registry).decode()
    for rule in ("blast_radius", "max_excluded_nodes", "job.required_nodes"):
        assert sample(text, f'srecovery_needs_operator_total{{rule="{rule}"}}') == 0
    for status in ("400", "401", "403", "429", "503"):
        assert sample(text, f'srecovery_ingest_rejects_total{{status="{status}"}}') == 0
    metrics.lemons({"n3": 2.5, "n4": 0.25})
    metrics.lemons({"n4": 0.5})
    text = generate_latest(metrics.registry).decode()
    assert "n3" not in text and sample(text, 'srecovery_node_lemon_score{node="n4"}') == 0.5
    assert sample(text, "srecovery_lemon_threshold") == 2.0


def test_read_at_scrape_the_heartbeat_and_the_disk(tmp_path: Path) -> None:
    never = scrape(tmp_path)
    assert sample(never, "srecovery_watchdog_heartbeat_timestamp_seconds") == 0
    assert sample(never, "srecovery_watchdog_heartbeat_stale_after_seconds") == 60
    assert sample(never, "srecovery_store_bytes") == 0
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / "heartbeat.json").write_text(json.dumps({"ts": 1234.5, "interval": 30}))
    (tmp_path / "state.db").write_bytes(b"x" * 4096)
    (tmp_path / "state.db-wal").write_bytes(b"x" * 1000)
    beat = scrape(tmp_path)
    assert sample(beat, "srecovery_watchdog_heartbeat_timestamp_seconds") == 1234.5
    assert sample(beat, "srecovery_watchdog_heartbeat_stale_after_seconds") == 90
    assert sample(beat, "srecovery_store_bytes") == 5096
    free = sample(beat, "srecovery_store_filesystem_free_bytes")
    assert 0 < free <= sample(beat, "srecovery_store_filesystem_size_bytes")
    (tmp_path / "spool" / "heartbeat.json").write_text("{not json")
    assert sample(scrape(tmp_path), "srecovery_watchdog_heartbeat_timestamp_seconds") == 0


def test_a_store_directory_gone_leaves_the_disk_metrics_out(tmp_path: Path) -> None:
    metrics = Metrics()
    metrics.registry.register(ReadAtScrape(tmp_path / "gone" / "state.db", tmp_path))
    text = generate_latest(metrics.registry).decode()
    assert "srecovery_store_filesystem_free_bytes" not in text
    assert "srecovery_watchdog_heartbeat_timestamp_seconds 0.0" in text
