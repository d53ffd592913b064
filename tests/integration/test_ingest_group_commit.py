"""Evidence requests that arrive together are committed together (one transaction, one fsync),
yet each is still checked and answered on its own: a refused request among many accepted ones
changes nothing for the others (bench/controller_scale.py measures the rate this buys)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from slurm_recovery.contract import requests
from slurm_recovery.contract.wire import event_to_json
from slurm_recovery.store import Store
from tests.integration.test_controller import _post, scheduler, stacks  # noqa: F401

pytestmark = pytest.mark.cluster


def test_concurrent_requests_are_stored_together_and_refused_alone(stacks, local_cluster):  # noqa: F811
    stack = stacks("monitor")
    sock = str(local_cluster.munge_socket)
    requests_to_send = []
    for i in range(120):
        node = f"n{1 + i % 4}"
        body = json.dumps(
            {"events": [event_to_json("test_event", time.time(), node=node, payload={"queued": i})]}
        ).encode()
        headers = requests.sign(
            "POST", "/v1/evidence", body, role="sidecar", node=node, socket=sock
        )
        if i % 10 == 3:  # not the body the credential was signed for: 401
            body = body.replace(b'"queued":', b'"queued": ')
        elif i % 10 == 7:  # a sidecar of another node: 403
            other = f"n{1 + (i + 1) % 4}"
            headers = requests.sign(
                "POST", "/v1/evidence", body, role="sidecar", node=other, socket=sock
            )
        requests_to_send.append((i, body, headers))

    with ThreadPoolExecutor(max_workers=24) as pool:
        codes = dict(
            pool.map(lambda item: (item[0], _post(stack.url, item[1], item[2])), requests_to_send)
        )

    expected = {i: 401 if i % 10 == 3 else 403 if i % 10 == 7 else 202 for i in codes}
    assert codes == expected
    with Store.open(stack.db, readonly=True) as store:
        stored = sorted(r.evidence.payload["queued"] for r in store.find_evidence())
    assert stored == sorted(i for i, code in expected.items() if code == 202)
