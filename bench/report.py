"""What every benchmark's JSON file carries besides its figures: the machine and the load it
ran under, so a figure is never read without them."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _slurm_version() -> str | None:
    if not shutil.which("slurmd"):  # (sinfo needs a configuration even for --version)
        return None
    try:
        done = subprocess.run(["slurmd", "-V"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def machine() -> dict[str, Any]:
    """The host, its CPUs and memory, the software measured, and the load average now."""
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "slurm": _slurm_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_json(path: Path | None, name: str, figures: dict[str, Any], quick: bool) -> None:
    """Write ``figures`` of benchmark ``name`` to ``path`` (nothing when None), with the machine
    and the exact command line."""
    if path is None:
        return
    record = {
        "benchmark": name,
        "quick": quick,
        "command": [Path(sys.executable).name, *sys.argv],
        "machine": machine(),
        "figures": figures,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
