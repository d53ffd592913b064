"""Retention in a running controller: at its first pass it deletes routine evidence older
than store.retention (kept: other kinds, recent rows) and records it in the audit trail."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.store import Evidence, Store
from tests.conftest import _free_port_block, wait_for

pytestmark = pytest.mark.cluster


def test_the_controller_prunes_old_routine_evidence_and_audits_it(local_cluster):
    base = Path(tempfile.mkdtemp(prefix="srecovery-retention-"))
    base.chmod(0o755)
    port = _free_port_block(1, start=local_cluster.port_base + 950)
    devstack.write_policy(base / "policy.toml", "monitor", "")
    config = devstack.write_config(base, local_cluster, port)
    text = config.read_text()
    assert "[store]\n" in text
    config.write_text(text.replace("[store]\n", '[store]\nretention = "2d"\n', 1))
    old, recent = time.time() - 3 * 86400, time.time() - 3600
    with Store.open(base / "state.db") as store:
        store.add_evidence(
            [Evidence("sidecar", "sidecar_status", old + i, node="n1") for i in range(500)]
            + [Evidence("sidecar", "xid", old, node="n2", payload={"xid": 48, "message": ""})]
            + [Evidence("sidecar", "sidecar_status", recent, node="n1")]
        )
    pid = devstack.start_controller(config, base / "controller.log")
    try:
        devstack.wait_healthy(f"http://127.0.0.1:{port}", pid=pid)

        def retention_row():
            with Store.open(base / "state.db", readonly=True) as store:
                return [r for r in store.audit_rows() if r.kind == "retention"]

        [row] = wait_for(retention_row, timeout=30)
        assert row.payload["deleted"] == 500 and row.actor == "controller"
        with Store.open(base / "state.db", readonly=True) as store:
            left = sorted((r.evidence.kind, r.evidence.node) for r in store.find_evidence())
            assert left == [("sidecar_status", "n1"), ("xid", "n2")]
            assert store.verify_audit().ok
    finally:
        localcluster.stop_process(pid, "slurm_recovery.controller")
