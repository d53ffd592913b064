"""The systemd units in packaging/systemd/ and the daemons' side of ``Type=notify``.

- ``systemd-analyze verify`` on the units (scripts/bootstrap installs systemd), plus a small
  parser check that always runs: sections, known keys, the design decisions (docs/install.md).
- The tmpfiles.d entries create every directory a unit's ``ReadWritePaths=`` names, and those
  are the configuration's default paths.
- The real controller and watchdog processes on the local cluster, with ``NOTIFY_SOCKET``
  pointing at a socket of ours: READY=1 only once /healthz answers, WATCHDOG=1 per pass,
  STOPPING=1 on SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.config import DEFAULTS
from tests.conftest import _free_port_block

ROOT = Path(__file__).resolve().parents[2]
UNITS_DIR = ROOT / "packaging" / "systemd"
UNITS = ["srecovery-controller.service", "srecovery-sidecar.service", "srecovery-watchdog.service"]
TMPFILES = {
    "srecovery-controller.service": "slurm-recovery-controller.conf",
    "srecovery-watchdog.service": "slurm-recovery-controller.conf",
    "srecovery-sidecar.service": "slurm-recovery-sidecar.conf",
}

#: The keys the units may use, per section (systemd.unit(5), .service(5), .exec(5), .kill(5)).
KNOWN = {
    "Unit": {
        "Description", "Documentation", "Wants", "Requires", "After", "Before", "BindsTo",
        "PartOf", "StartLimitIntervalSec", "StartLimitBurst", "ConditionPathExists",
    },
    "Service": {
        "Type", "NotifyAccess", "ExecStart", "ExecStartPre", "Environment", "EnvironmentFile",
        "User", "Group", "UMask", "Restart", "RestartSec", "TimeoutStartSec", "TimeoutStopSec",
        "WatchdogSec", "LimitNOFILE", "Nice", "KillSignal", "ProtectSystem", "ReadWritePaths",
        "ProtectHome", "PrivateTmp", "PrivateDevices", "NoNewPrivileges",
        "CapabilityBoundingSet", "AmbientCapabilities", "ProtectKernelTunables",
        "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups", "ProtectClock",
        "ProtectHostname", "ProtectProc", "RestrictSUIDSGID", "RestrictRealtime",
        "RestrictNamespaces", "LockPersonality", "RestrictAddressFamilies",
        "SystemCallArchitectures", "SystemCallFilter",
    },
    "Install": {"WantedBy", "RequiredBy", "Alias"},
}  # fmt: skip


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """INI as systemd reads it: comments, sections, repeated keys (each value kept)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        assert not line.endswith("\\"), f"{path.name}:{number}: no continuation lines"
        if line.startswith("["):
            assert line.endswith("]"), f"{path.name}:{number}: bad section header"
            current = line[1:-1]
            assert current in KNOWN, f"{path.name}:{number}: unknown section {current}"
            assert current not in sections, f"{path.name}:{number}: section twice"
            sections[current] = {}
            continue
        assert current, f"{path.name}:{number}: key outside a section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}:{number}: not KEY=VALUE: {line}"
        key = key.strip()
        assert key in KNOWN[current], f"{path.name}:{number}: unknown key {key} in [{current}]"
        sections[current].setdefault(key, []).append(value.strip())
    return sections


def one(unit: dict[str, dict[str, list[str]]], section: str, key: str) -> str:
    values = unit[section].get(key, [])
    assert len(values) == 1, f"[{section}] {key}: {values}"
    return values[0]


@pytest.fixture(scope="module")
def units() -> dict[str, dict[str, dict[str, list[str]]]]:
    return {name: parse_unit(UNITS_DIR / name) for name in UNITS}


# --------------------------------------------------------------------------------- the files


def test_units_parse_with_known_keys(units):
    for name, unit in units.items():
        assert set(unit) == {"Unit", "Service", "Install"}, name
        assert one(unit, "Service", "Type") == "notify", name
        assert one(unit, "Service", "NotifyAccess") == "main", name
        assert one(unit, "Service", "ExecStart").startswith("/usr/bin/srecovery"), name
        assert one(unit, "Service", "Environment") == (
            "SRECOVERY_CONFIG=/etc/slurm-recovery/config.toml"
        )
        assert one(unit, "Service", "ProtectSystem") == "strict", name
        assert one(unit, "Service", "NoNewPrivileges") == "yes", name
        assert one(unit, "Service", "RestartSec"), name
        assert "StartLimitIntervalSec" in unit["Unit"], name
        assert one(unit, "Install", "WantedBy") == "multi-user.target", name
        families = one(unit, "Service", "RestrictAddressFamilies").split()
        assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families), name


def test_unit_design_decisions(units):
    controller = units["srecovery-controller.service"]
    sidecar = units["srecovery-sidecar.service"]
    watchdog = units["srecovery-watchdog.service"]
    # controller: the SlurmUser, no capabilities, watchdog pings per loop pass
    assert one(controller, "Service", "User") == "slurm"
    assert one(controller, "Service", "CapabilityBoundingSet") == ""
    assert one(controller, "Service", "ProtectHome") == "yes"
    assert one(controller, "Service", "Restart") == "on-failure"
    assert int(one(controller, "Service", "WatchdogSec")) >= 60
    # sidecar: root with a few capabilities, /home readable, /tmp shared (job output)
    assert one(sidecar, "Service", "User") == "root"
    caps = set(one(sidecar, "Service", "CapabilityBoundingSet").split())
    assert caps == {"CAP_SYSLOG", "CAP_DAC_READ_SEARCH", "CAP_DAC_OVERRIDE", "CAP_FOWNER"}
    assert one(sidecar, "Service", "ProtectHome") == "read-only"
    assert one(sidecar, "Service", "PrivateTmp") == "no"
    assert "ProtectKernelLogs" not in sidecar["Service"]  # would deny /dev/kmsg
    assert "PrivateDevices" not in sidecar["Service"]  # NVML needs /dev/nvidia*
    assert int(one(sidecar, "Service", "WatchdogSec")) >= 10
    # watchdog: independent of the controller, restarts forever
    for key in ("Requires", "BindsTo", "PartOf", "After", "Wants"):
        for value in watchdog["Unit"].get(key, []):
            assert "srecovery-controller" not in value, key
    assert one(watchdog, "Service", "Restart") == "always"
    assert one(watchdog, "Unit", "StartLimitIntervalSec") == "0"
    assert one(watchdog, "Service", "ExecStart") == "/usr/bin/srecovery watchdog"


def tmpfiles_dirs(name: str) -> set[str]:
    dirs = set()
    for line in (UNITS_DIR / "tmpfiles.d" / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            kind, path, mode, *_ = line.split()
            # the state (the store: evidence, audit) is the SlurmUser's alone; the rest 0755
            wanted = "0750" if path == "/var/lib/slurm-recovery" else "0755"
            assert kind == "d" and mode == wanted, line
            dirs.add(path)
    return dirs


def test_read_write_paths_exist_and_match_the_defaults(units):
    for name, unit in units.items():
        created = tmpfiles_dirs(TMPFILES[name])
        for path in one(unit, "Service", "ReadWritePaths").split():
            assert path in created, f"{name}: {path} is not created by tmpfiles.d"
    controller = set(
        one(units["srecovery-controller.service"], "Service", "ReadWritePaths").split()
    )
    assert str(Path(DEFAULTS["store.path"]).parent) in controller
    assert str(DEFAULTS["controller.spool_dir"]) in controller
    watchdog = one(units["srecovery-watchdog.service"], "Service", "ReadWritePaths").split()
    assert watchdog == [str(DEFAULTS["watchdog.spool_dir"])]
    sidecar = one(units["srecovery-sidecar.service"], "Service", "ReadWritePaths").split()
    assert all(
        any(str(default).startswith(p) for p in sidecar)
        for default in (DEFAULTS["sidecar.spool_dir"], DEFAULTS["hooks.job_dir"])
    )


def test_systemd_analyze_verify(tmp_path):
    """verify with ExecStart pointed at stubs (the RPM's /usr/bin is not installed here);
    systemd-analyze exits 0 even for an unknown key, so any output is a failure."""
    assert shutil.which("systemd-analyze"), "apt-get install systemd (scripts/bootstrap does)"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("srecovery", "srecovery-controller", "srecovery-sidecar"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    for name in UNITS:
        text = (UNITS_DIR / name).read_text().replace("/usr/bin/", f"{bin_dir}/")
        (tmp_path / name).write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / n) for n in UNITS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert (result.stdout + result.stderr).strip() == ""
    # and the check above does catch a bad key
    (tmp_path / "bad.service").write_text(
        (tmp_path / UNITS[0]).read_text().replace("LockPersonality=", "LockPersonalty=")
    )
    bad = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "bad.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "LockPersonalty" in bad.stdout + bad.stderr


# --------------------------------------------------------------------------------- processes


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    with tempfile.TemporaryDirectory(prefix="sdn-", dir="/tmp") as d:
        path = os.path.join(d, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        os.chmod(path, 0o777)
        try:
            yield sock, path
        finally:
            sock.close()


def next_datagram(sock: socket.socket, timeout: float, pid: int, log: Path) -> str:
    sock.settimeout(0.2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return sock.recv(4096).decode()
        except TimeoutError:
            if not localcluster.process_alive(pid, ""):
                pytest.fail(f"the process exited: {log.read_text()[-3000:]}")
    pytest.fail(f"no notification within {timeout}s: {log.read_text()[-3000:]}")


def healthz(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.cluster
def test_controller_ready_only_once_healthz_answers(local_cluster, notify_socket):
    sock, path = notify_socket
    base = Path(tempfile.mkdtemp(prefix="srecovery-units-"))
    base.chmod(0o755)
    port = _free_port_block(1, start=local_cluster.port_base + 700)
    devstack.write_policy(base / "policy.toml", "monitor")
    config = devstack.write_config(base, local_cluster, port)
    url = f"http://127.0.0.1:{port}"
    log = base / "controller.log"
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000"}
    pid = devstack.start_controller(config, log, env=env)
    try:
        before = []  # what it says before READY=1: per-pass STATUS=/WATCHDOG=1, no READY
        while not (said := next_datagram(sock, 60, pid, log)).startswith("READY=1"):
            before.append(said)
        # READY=1 comes after the first loop pass, once the port answers: /healthz says ok
        assert healthz(url) == 200
        assert set(before) <= {"WATCHDOG=1"} | {d for d in before if d.startswith("STATUS=")}
        assert said.startswith(f"READY=1\nSTATUS=listening on 127.0.0.1:{port}"), said
        seen = [next_datagram(sock, 10, pid, log) for _ in range(4)]
        assert "WATCHDOG=1" in seen  # per loop pass (loop_interval 1 s)
        assert any(d.startswith("STATUS=last pass ") for d in seen), seen
    finally:
        localcluster.stop_process(pid, "slurm_recovery.controller")
    rest = []
    sock.settimeout(0.5)
    while True:
        try:
            rest.append(sock.recv(4096).decode())
        except TimeoutError:
            break
    assert any(d.startswith("STOPPING=1") for d in rest), rest
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.cluster
def test_watchdog_ready_after_first_sweep_then_stopping(local_cluster, notify_socket, tmp_path):
    sock, path = notify_socket
    port = _free_port_block(1, start=local_cluster.port_base + 740)
    config = devstack.write_config(tmp_path, local_cluster, port)
    log = tmp_path / "watchdog.log"
    spool = tmp_path / "wd"
    argv = [
        sys.executable, "-m", "slurm_recovery.cli", "--config", str(config),
        "watchdog", "--interval", "1", "--spool-dir", str(spool),
    ]  # fmt: skip
    env = {**os.environ, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000"}
    pid = localcluster.spawn_daemon(argv, log, env)
    try:
        first = next_datagram(sock, 60, pid, log)
        assert first.startswith("READY=1\nSTATUS=sweeping every 1s"), first
        assert (spool / "heartbeat.json").exists()  # the first sweep came first
        assert next_datagram(sock, 10, pid, log) == "WATCHDOG=1"
        status = next_datagram(sock, 10, pid, log)
        assert status.startswith("STATUS=last sweep "), status
        assert "slurmctld answered" in status
    finally:
        localcluster.stop_process(pid, "slurm_recovery.cli")
    sock.settimeout(0.5)
    rest = []
    while True:
        try:
            rest.append(sock.recv(4096).decode())
        except TimeoutError:
            break
    assert "STOPPING=1" in rest, rest
