"""A job's own recovery settings (the SPANK options ``--recovery*``), and what they change.

The SPANK plugin puts a job's options into its job-control environment; the Prolog sends them
in the ``job_start`` payload as ``recovery``: ``{mode: auto|monitor|off, max_restarts: int,
hang_timeout: seconds, progress: regex}`` (only what was set; the plugin's plugstack.conf
arguments fill in site defaults). Pure: evidence in, settings out, and the policy a job's
advice follows.

- ``off``: the tool leaves the job alone (no incident is opened for it);
- ``monitor``: advice is recorded for it, Slurm is never touched for it, whatever the mode of
  its partition; ``auto``: the partition's mode;
- ``max_restarts``: replaces the policy's ``max_restarts`` for this job;
- ``hang_timeout``: replaces the adaptive hang deadline (still within ``[hang] floor`` and
  ``ceiling``);
- ``progress``: the job's own progress-line pattern (the sidecar's job-log follower uses it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from slurm_recovery.decide.model import Evidence, Mode
from slurm_recovery.decide.policy import Policy

MODES = ("auto", "monitor", "off")
MAX_RESTARTS_LIMIT = 100


@dataclass(frozen=True)
class JobSettings:
    mode: str = "auto"
    max_restarts: int | None = None
    hang_timeout: float | None = None
    progress: str | None = None


DEFAULT_SETTINGS = JobSettings()


def settings_from_payload(raw: Any) -> JobSettings:
    """The settings in a ``job_start`` payload's ``recovery`` value; what is missing or not
    valid is left at its default (the plugin validated it at submit: this is a second check)."""
    if not isinstance(raw, Mapping):
        return JobSettings()
    mode = raw.get("mode")
    restarts = raw.get("max_restarts")
    timeout = raw.get("hang_timeout")
    progress = raw.get("progress")
    return JobSettings(
        mode=mode if mode in MODES else "auto",
        max_restarts=restarts
        if type(restarts) is int and 0 <= restarts <= MAX_RESTARTS_LIMIT
        else None,
        hang_timeout=float(timeout)
        if type(timeout) in (int, float) and math.isfinite(timeout) and timeout > 0
        else None,
        progress=progress if isinstance(progress, str) and progress else None,
    )


def job_settings(evidence: Iterable[Evidence]) -> dict[int, JobSettings]:
    """job id -> its settings, from the latest ``job_start`` that carries ``recovery``."""
    latest: dict[int, tuple[float, int, JobSettings]] = {}
    for ev in evidence:
        if ev.kind != "job_start" or ev.job_id is None or "recovery" not in ev.payload:
            continue
        key = (ev.observed_at, ev.id)
        if ev.job_id not in latest or key > latest[ev.job_id][:2]:
            latest[ev.job_id] = (*key, settings_from_payload(ev.payload["recovery"]))
    return {job_id: found[2] for job_id, found in latest.items()}


def policy_for_job(policy: Policy, settings: JobSettings | None) -> Policy:
    """The policy a job's advice follows: its ``max_restarts``, and monitor everywhere for a
    job that asked for monitor."""
    if settings is None:
        return policy
    if settings.max_restarts is not None:
        policy = dataclasses.replace(policy, max_restarts=settings.max_restarts)
    if settings.mode == "monitor":
        policy = dataclasses.replace(
            policy,
            mode=Mode.MONITOR,
            partition_modes={name: Mode.MONITOR for name in policy.partition_modes},
        )
    return policy
