"""What the benchmarks that drive a dev stack share: waiting for a condition, and reading a
job's incidents and milestone times from the controller."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from slurm_recovery.client import ClientError, ControllerClient

T = TypeVar("T")


def wait(predicate: Callable[[], T], timeout: float = 90.0, interval: float = 0.1) -> T:
    """``predicate()``'s first truthy value, polled every ``interval``; TimeoutError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("condition not met")


def job_incidents(client: ControllerClient, job_id: int) -> list[dict[str, Any]]:
    """The job's incident stories; empty while the controller has none (it answers 404)."""
    try:
        return client.get(f"/v1/jobs/{job_id}")["incidents"]
    except ClientError as exc:
        if exc.status == 404:
            return []
        raise


def milestone_times(story: dict[str, Any]) -> dict[str, float]:
    """An incident story's milestones as epoch seconds."""
    return {k: datetime.fromisoformat(v).timestamp() for k, v in story["milestones"].items()}
