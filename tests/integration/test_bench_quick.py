"""Every benchmark's quick mode runs from the checkout and writes its figures
(``python -m bench --quick``), so the benchmarks never rot. No thresholds are asserted: the
figures are for docs/performance.md; what is checked is that each one measured something."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import BENCHMARKS

REPO = Path(__file__).resolve().parents[2]


def numbers(value: object) -> list[float]:
    """Every number in a JSON value (booleans are not numbers)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [n for item in value.values() for n in numbers(item)]
    if isinstance(value, list):
        return [n for item in value for n in numbers(item)]
    return []


@pytest.mark.cluster
@pytest.mark.timeout(900)
# soak_faults' scenarios run in tests/integration/test_faults.py (run_kill, run_outage)
@pytest.mark.parametrize("name", [b.name for b in BENCHMARKS if b.name != "soak_faults"])
def test_the_quick_mode_runs_and_writes_measured_figures(name, local_cluster, tmp_path):
    argv = [sys.executable, "-m", "bench", "--quick", "--only", name, "--out", str(tmp_path)]
    done = subprocess.run(
        [*argv, "--munge-socket", str(local_cluster.munge_socket)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert f"{name:20} ok" in done.stdout
    record = json.loads((tmp_path / f"{name}.json").read_text())
    assert record["benchmark"] == name and record["quick"] is True
    assert record["machine"]["cpus"] >= 1 and len(record["machine"]["load_average"]) == 3
    figures = numbers(record["figures"])
    assert figures and any(n > 0 for n in figures), record["figures"]
