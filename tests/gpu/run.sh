#!/usr/bin/env bash
# Real-NVML checks for slurm-recovery: run on any host with an NVIDIA GPU and driver.
#
#   tests/gpu/run.sh            # a fresh venv in a temporary directory, removed at the end
#   SRECOVERY_GPU_VENV=/opt/v tests/gpu/run.sh   # reuse (or create) that venv
#
# Creates a venv (with --system-site-packages, so an offline host with pytest and
# nvidia-ml-py already installed still works), installs the project, nvidia-ml-py and
# pytest, runs `SRECOVERY_GPU_TESTS=1 pytest tests/gpu -v`, and prints a summary.
# Exit status: pytest's (0 = every check passed; a check skipped for a stated reason,
# e.g. "reading /dev/kmsg needs root", is not a failure). Run as root to include the
# /dev/kmsg check.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d -t srecovery-gpu.XXXXXX)"
VENV="${SRECOVERY_GPU_VENV:-$WORK/venv}"
REPORT="$WORK/report.xml"
trap 'rm -rf "$WORK"' EXIT  # the temporary venv and the report; SRECOVERY_GPU_VENV is kept

echo "== host"
uname -srm
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id --format=csv,noheader \
        || echo "nvidia-smi failed (is the driver loaded?)"
else
    echo "nvidia-smi not found on PATH"
fi

echo "== python environment: $VENV"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv --system-site-packages "$VENV" || { echo "cannot create a venv with $PYTHON"; exit 2; }
fi
PY="$VENV/bin/python"
if ! "$PY" -m pip install --quiet "$ROOT" nvidia-ml-py pytest pytest-timeout; then
    echo "pip install failed (offline?); continuing with what is installed"
fi
if ! "$PY" -c "import pynvml, pytest" 2>/dev/null; then
    echo "nvidia-ml-py and pytest are needed: pip install nvidia-ml-py pytest"
    exit 2
fi
"$PY" -c "import importlib.metadata as m; print('nvidia-ml-py', m.version('nvidia-ml-py'))" \
    2>/dev/null || echo "nvidia-ml-py version unknown"

echo "== tests/gpu"
SRECOVERY_GPU_TESTS=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
    "$PY" -m pytest tests/gpu -v -s -rs -p no:cacheprovider --junitxml="$REPORT"
status=$?

echo "== summary"
"$PY" - "$REPORT" "$status" <<'PYEOF'
import sys
import xml.etree.ElementTree as ET

path, status = sys.argv[1], int(sys.argv[2])
try:
    suite = ET.parse(path).getroot()
except (OSError, ET.ParseError) as exc:
    print(f"no report ({exc}); pytest exit status {status}")
    raise SystemExit(0)
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
print(
    f"{passed} passed, {counts['failures']} failed, {counts['errors']} errors, "
    f"{counts['skipped']} skipped (pytest exit status {status})"
)
for case in suite.iter("testcase"):
    for tag in ("failure", "error", "skipped"):
        item = case.find(tag)
        if item is not None:
            print(f"  {tag.upper():8} {case.get('name')}: {(item.get('message') or '')[:200]}")
PYEOF
exit "$status"
