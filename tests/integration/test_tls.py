"""TLS for the HTTP API (docs/security.md#tls): a real controller process on the session
cluster serving a certificate from a CA made here with openssl, real MUNGE-signed requests."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_recovery import devstack, localcluster
from slurm_recovery.contract.client import ClientError, ControllerClient
from slurm_recovery.contract.wire import event_to_json
from tests.conftest import _free_port_block

pytestmark = pytest.mark.cluster


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(where: Path, name: str) -> None:
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=where)  # fmt: skip


@pytest.fixture(scope="module")
def pki() -> Path:
    """ca.crt signs server.crt (for 127.0.0.1 and localhost); rogue.crt is another CA."""
    where = Path(tempfile.mkdtemp(prefix="srecovery-pki-"))
    make_ca(where, "ca")
    make_ca(where, "rogue")
    (where / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=controller",
            "-keyout", "server.key", "-out", "server.csr", cwd=where)  # fmt: skip
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.crt",
            cwd=where)  # fmt: skip
    for key in where.glob("*.key"):
        key.chmod(0o600)
    return where


def config_with_tls(local_cluster, cert: Path, key: Path) -> tuple[Path, int]:
    base = Path(tempfile.mkdtemp(prefix="srecovery-tls-"))
    base.chmod(0o755)
    port = _free_port_block(1, start=local_cluster.port_base + 700)
    devstack.write_policy(base / "policy.toml", "monitor", "")
    config = devstack.write_config(base, local_cluster, port)
    text = config.read_text()
    assert "[controller]\n" in text
    tls = f'[controller]\ntls_cert = "{cert}"\ntls_key = "{key}"\n'
    config.write_text(text.replace("[controller]\n", tls, 1))
    return config, port


def start(config: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "slurm_recovery.controller", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def tls_controller(local_cluster, pki) -> Iterator[tuple[str, Path]]:
    config, port = config_with_tls(local_cluster, pki / "server.crt", pki / "server.key")
    log = config.parent / "controller.log"
    pid = devstack.start_controller(config, log)
    url = f"https://127.0.0.1:{port}"
    client = ControllerClient(url, ca_file=str(pki / "ca.crt"), timeout=2, insecure=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.get("/healthz")
            break
        except ClientError as exc:
            if time.monotonic() > deadline or not localcluster.process_alive(pid, ""):
                localcluster.stop_process(pid, "slurm_recovery.controller")
                pytest.fail(f"TLS controller not up: {exc}\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
    try:
        yield url, config
    finally:
        localcluster.stop_process(pid, "slurm_recovery.controller")


def test_signed_requests_work_over_tls_with_the_ca_trusted(tls_controller, local_cluster, pki):
    url, _ = tls_controller
    client = ControllerClient(
        url, munge_socket=str(local_cluster.munge_socket), ca_file=str(pki / "ca.crt")
    )
    event = event_to_json("operator_report", time.time(), node="n1", payload={"reason": "tls"})
    assert client.post_evidence([event], role="operator")["accepted"] == 1
    status = client.get("/v1/status")
    assert status["state"] in {"active", "degraded"} and status["auth"] == "munge"


@pytest.mark.parametrize("ca", [None, "rogue.crt"])
def test_a_certificate_from_an_untrusted_ca_is_refused_with_the_fix(tls_controller, pki, ca):
    url, _ = tls_controller
    client = ControllerClient(url, ca_file=str(pki / ca) if ca else None, insecure=True)
    with pytest.raises(ClientError) as refused:
        client.get("/v1/status")
    assert refused.value.status == 0
    assert "does not verify" in refused.value.reason and "client.ca_file" in refused.value.reason


def test_plain_http_to_the_tls_port_gets_no_answer(tls_controller):
    url, _ = tls_controller
    client = ControllerClient(url.replace("https://", "http://"), insecure=True, timeout=3)
    with pytest.raises(ClientError) as refused:
        client.get("/healthz")
    assert refused.value.status in (0, 400)  # aiohttp closes, or answers 400 in plain text


def test_the_cli_reaches_a_tls_controller_through_client_ca_file(
    tls_controller, local_cluster, pki
):
    url, config = tls_controller
    cli_config = config.parent / "cli.toml"
    cli_config.write_text(
        f'[client]\nurl = "{url}"\nca_file = "{pki / "ca.crt"}"\n'
        f'[auth]\nmunge_socket = "{local_cluster.munge_socket}"\n'
    )
    srecovery = str(Path(sys.executable).parent / "srecovery")
    env = {k: v for k, v in os.environ.items() if k != "SRECOVERY_URL"}
    done = subprocess.run(
        [srecovery, "--config", str(cli_config), "status"], capture_output=True, text=True, env=env
    )
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: degraded, still an answer
    assert "unreachable" not in done.stdout + done.stderr


def test_a_key_other_users_can_read_stops_the_start_with_the_fix(local_cluster, pki, tmp_path):
    loose = tmp_path / "server.key"
    loose.write_bytes((pki / "server.key").read_bytes())
    loose.chmod(0o644)
    config, _ = config_with_tls(local_cluster, pki / "server.crt", loose)
    done = start(config)
    out, _ = done.communicate(timeout=30)
    assert done.returncode == 2, out
    assert "other users can read or write it (mode 0644)" in out and f"chmod 0640 {loose}" in out


def test_a_key_that_is_not_the_certificates_stops_the_start(local_cluster, pki):
    config, _ = config_with_tls(local_cluster, pki / "server.crt", pki / "rogue.key")
    done = start(config)
    out, _ = done.communicate(timeout=30)
    assert done.returncode == 2, out
    assert "the key must be the certificate's" in out
