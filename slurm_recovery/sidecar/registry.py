"""The one place that wires the sidecar's sources from ``[sidecar]`` in the config.

Sources are imported by name, lazily, so a node without NVML (or without InfiniBand) never
loads that code. A source that cannot be opened is reported (``Registry.broken``), never
fatal: the sidecar runs with the others and says what is missing in every status event.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_recovery.config import SidecarConfig
from slurm_recovery.contract.spool import HookSpool
from slurm_recovery.sidecar.base import Source
from slurm_recovery.sidecar.spool import SpoolSource

log = logging.getLogger(__name__)

#: ``sidecar.gpu_backend`` -> "module:class" of the backend ("none": no GPU telemetry).
GPU_BACKENDS = {
    "nvml": "slurm_recovery.sidecar.gpu.nvml:NvmlBackend",
    "sim": "slurm_recovery.sidecar.sim:SimBackend",
}
KMSG_SOURCE = "slurm_recovery.sidecar.sources.kmsg:KmsgSource"
INFINIBAND_SOURCE = "slurm_recovery.sidecar.sources.infiniband:InfinibandSource"
SIM_XID_SOURCE = "slurm_recovery.sidecar.sim:SimXidSource"
JOBLOG_SOURCE = "slurm_recovery.sidecar.sources.joblog:JobLogSource"
PROGRESSFILE_SOURCE = "slurm_recovery.sidecar.sources.progressfile:ProgressFileSource"
GPU_ACTIVITY_SOURCE = "slurm_recovery.sidecar.sources.gpuactivity:GpuActivitySource"
HOST_SOURCE = "slurm_recovery.sidecar.sources.host:HostSource"


def load(target: str) -> Any:
    """``"package.module:Name"`` -> the object (imported now)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass
class Registry:
    """The sources the sidecar polls: ``fast`` every ``fast_interval``, ``slow`` every
    ``poll_interval``; ``gpu`` is the GPU backend (also in ``slow``), if any; ``broken``
    names each source that could not be opened and why."""

    fast: list[Source] = field(default_factory=list)
    slow: list[Source] = field(default_factory=list)
    gpu: Any = None
    broken: dict[str, str] = field(default_factory=dict)

    @property
    def sources(self) -> list[Source]:
        return [*self.fast, *self.slow]

    def add(self, source: Source) -> None:
        (self.fast if source.fast else self.slow).append(source)

    def close(self) -> None:
        for source in reversed(self.sources):
            try:
                source.close()
            except Exception:  # closing must not stop the others from closing
                log.exception("closing source %s failed", getattr(source, "name", source))


def open_gpu_backend(sidecar: SidecarConfig, node: str) -> Any:
    """The configured GPU backend, opened; None for ``none``. Raises what the backend raises."""
    if sidecar.gpu_backend == "none":
        return None
    cls = load(GPU_BACKENDS[sidecar.gpu_backend])
    if sidecar.gpu_backend == "sim":
        return cls(node, sidecar.sim_dir, sidecar.sim_gpus, sidecar.expected_gpus)
    return cls(expected_gpus=sidecar.expected_gpus, timeout=sidecar.nvml_timeout)


def build(
    sidecar: SidecarConfig,
    node: str,
    spool_dir: Path,
    job_dir: str | Path | None = None,
    resolve_paths: Callable[[int], dict[str, str]] | None = None,
) -> Registry:
    """Open every source ``sidecar`` asks for, for ``node``; state files go to ``spool_dir``.
    ``job_dir``: ``hooks.job_dir``, where the jobs' progress files are (None: not followed).
    ``resolve_paths``: job id -> its output files as slurmctld shows them, for the jobs whose
    hooks could not name them (None: those jobs' output is not followed)."""
    registry = Registry()

    def attempt(name: str, make: Callable[[], Source | None]) -> Source | None:
        try:
            source = make()
        except Exception as exc:
            registry.broken[name] = f"cannot open: {exc}"
            log.error("source %s unavailable: %s", name, exc)
            return None
        if source is not None:
            registry.add(source)
        return source

    registry.gpu = attempt(sidecar.gpu_backend, lambda: open_gpu_backend(sidecar, node))
    if sidecar.gpu_backend == "sim" and registry.gpu is not None:
        attempt("sim_xid", lambda: load(SIM_XID_SOURCE)(registry.gpu))
    if registry.gpu is not None:
        attempt("gpu_activity", lambda: load(GPU_ACTIVITY_SOURCE)(registry.gpu, node))
    if sidecar.kmsg:
        attempt("kmsg", lambda: load(KMSG_SOURCE)(spool_dir))
    if sidecar.ib_sysfs:
        attempt("infiniband", lambda: load(INFINIBAND_SOURCE)(sidecar.ib_sysfs))
    attempt("hook_spool", lambda: SpoolSource(HookSpool(spool_dir), node))
    attempt("joblog", lambda: load(JOBLOG_SOURCE)(node, resolve_paths))
    if job_dir is not None:
        attempt("progressfile", lambda: load(PROGRESSFILE_SOURCE)(node, str(job_dir)))
    attempt("host", lambda: load(HOST_SOURCE)())
    return registry


def close_quietly(registry: Registry | None) -> None:
    if registry is not None:
        with contextlib.suppress(Exception):
            registry.close()
