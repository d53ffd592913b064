"""Real-NVML checks: collected only with SRECOVERY_GPU_TESTS=1 (tests/gpu/run.sh sets it).

The default test run (``pytest`` from the repository root) skips this folder without
importing anything in it, so GPU-less machines never see these tests.
"""

from __future__ import annotations

import os

import pytest

ENABLED = os.environ.get("SRECOVERY_GPU_TESTS") == "1"

collect_ignore_glob = [] if ENABLED else ["test_*.py"]


@pytest.fixture(scope="session")
def pynvml():
    """The real nvidia-ml-py, initialized; skips with the reason when NVML cannot start."""
    try:
        import pynvml as module
    except ImportError as exc:
        pytest.skip(f"nvidia-ml-py is not installed: {exc}")
    try:
        module.nvmlInit()
    except Exception as exc:
        pytest.skip(f"NVML cannot start on this host ({type(exc).__name__}: {exc})")
    yield module
    module.nvmlShutdown()
