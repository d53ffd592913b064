"""``srecovery dev up|down``: the local cluster plus the controller and the watchdog on this host.

What the demo, the tests and the benchmarks run on, so what they show is what an admin gets:
the same daemons, the same config file format, MUNGE authentication on. Everything lives in
one base directory; ``down`` stops exactly what ``up`` started (by pid, checked by command line).
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_recovery import localcluster

DEV_BASE = Path("/tmp/srecovery-dev")
DEV_PORT_BASE = 17200
DEV_API_PORT = 17765
STATE_FILE = "dev.json"


@dataclass(frozen=True)
class DevStack:
    base: Path
    cluster: localcluster.ClusterSpec
    config: Path
    url: str

    def exports(self) -> dict[str, str]:
        exports = {
            "SLURM_CONF": str(self.cluster.slurm_conf),
            "SRECOVERY_URL": self.url,
            "SRECOVERY_CONFIG": str(self.config),
        }
        if self.cluster.slurm_prefix:  # sbatch, squeue... of the stack's own release
            exports["PATH"] = localcluster.slurm_env(self.cluster)["PATH"]
        return exports


def write_policy(path: Path, mode: str, extra: str = "") -> None:
    """The dev policy: every partition in ``mode``. A small cluster needs a larger drain share
    than a real one (1 node of 4 is 25 %). ``extra``: more top-level policy keys."""
    path.write_text(
        f'# Written by `srecovery dev up`; see docs/policy.md.\nmode = "{mode}"\n{extra}'
        "\n[blast_radius]\nmax_nodes = 2\nmax_percent = 50.0\n"
    )
    path.chmod(0o644)


def write_config(
    base: Path,
    cluster: localcluster.ClusterSpec,
    api_port: int,
    hold_deadline: str = "2m",
    gpus_per_node: int = 8,
) -> Path:
    """config.toml for the stack: MUNGE through the cluster's own munged, simulated GPUs,
    one spool directory and one job-directory root per node (several sidecars share this
    host). Readable by all: the TaskProlog reads it as the job user."""
    config = base / "config.toml"
    (base / "watchdog").mkdir(parents=True, exist_ok=True)
    # a built release's commands (scripts/build-slurm); apt's are on PATH
    prefix = cluster.slurm_prefix
    bin_dir_line = f'slurm_bin_dir = "{prefix}/bin"\n' if prefix else ""
    config.write_text(
        f"""# Written by `srecovery dev up`.
[scheduler]
backend = "scontrol"
slurm_conf = "{cluster.slurm_conf}"
{bin_dir_line}command_timeout = 10

[store]
path = "{base / "state.db"}"

[controller]
spool_dir = "{base / "spool" / "controller"}"
listen = "127.0.0.1:{api_port}"
policy = "{base / "policy.toml"}"
loop_interval = 1
hold_deadline = "{hold_deadline}"

[auth]
munge_socket = "{cluster.munge_socket}"
slurm_user = "root"

[watchdog]
interval = 5
spool_dir = "{base / "watchdog"}"

[client]
url = "http://127.0.0.1:{api_port}"

[sidecar]
gpu_backend = "sim"
sim_dir = "{base / "sim"}"
sim_gpus = {gpus_per_node}
spool_dir = "{base / "spool"}/{{node}}"
kmsg = false
ib_sysfs = ""

[hooks]
job_dir = "{base / "jobs"}/{{node}}"
"""
    )
    config.chmod(0o644)
    for sub in ("sim", "spool"):
        (base / sub).mkdir(exist_ok=True)
    return config


def start_controller(
    config: Path, log: Path, *, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
) -> int:
    argv = [sys.executable, "-m", "slurm_recovery.controller", "--config", str(config), *args]
    return localcluster.spawn_daemon(argv, log, {**os.environ, **(env or {})})


def start_sidecar(config: Path, node: str, log: Path, *, env: dict[str, str] | None = None) -> int:
    argv = [sys.executable, "-m", "slurm_recovery.sidecar", "--config", str(config), "--node", node]
    return localcluster.spawn_daemon(argv, log, {**os.environ, **(env or {})})


def start_watchdog(config: Path, log: Path, *, env: dict[str, str] | None = None) -> int:
    argv = [sys.executable, "-m", "slurm_recovery.cli", "--config", str(config), "watchdog"]
    return localcluster.spawn_daemon(argv, log, {**os.environ, **(env or {})})


def wait_healthy(url: str, timeout: float = 30.0, pid: int | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if pid is not None and not localcluster.process_alive(pid, ""):
            raise localcluster.ClusterError(f"the controller (pid {pid}) exited: {last}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (OSError, http.client.HTTPException) as exc:
            # HTTPException: before the controller listens, a connection to a port in the
            # kernel's ephemeral range can connect to itself and read back its own request
            # ("BadStatusLine: GET /healthz HTTP/1.1"): not up yet, ask again
            last = str(exc)
        time.sleep(0.1)
    raise localcluster.ClusterError(
        f"controller at {url} not healthy within {timeout:.0f}s: {last}"
    )


def up(
    base: Path = DEV_BASE,
    *,
    nodes: int = 4,
    mode: str = "monitor",
    port_base: int = DEV_PORT_BASE,
    api_port: int = DEV_API_PORT,
    gpus_per_node: int = 8,
    policy_extra: str = "",
    slurm: str = "default",
    slurm_conf_extra: Sequence[str] = (),
) -> DevStack:
    """Cluster (with the hooks, TaskProlog included, in its slurm.conf), controller, watchdog
    and one sidecar per node with simulated GPUs; idempotent. ``slurm``: the release to run
    (``default`` = apt's, or a series built by scripts/build-slurm); ``slurm_conf_extra``: more
    slurm.conf lines (``SlurmctldParameters=enable_expedited_requeue``). A controller that does not
    become healthy stops the whole stack (ClusterError; its logs stay in ``base/log``)."""
    from slurm_recovery.hooks import slurm_conf_lines, write_hook_wrappers

    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)
    spec = localcluster.ClusterSpec(
        base=base / "cluster",
        nodes=nodes,
        port_base=port_base,
        name="srdev",
        slurm_prefix=localcluster.resolve_slurm(slurm),
    )
    write_policy(base / "policy.toml", mode, policy_extra)
    config = write_config(base, spec, api_port, gpus_per_node=gpus_per_node)
    wrappers = write_hook_wrappers(base / "hooks", config)
    spec.extra_conf = [*slurm_conf_lines(wrappers), *slurm_conf_extra]
    localcluster.up(spec)
    url = f"http://127.0.0.1:{api_port}"
    state = _load(base)
    logs = base / "log"
    logs.mkdir(exist_ok=True)
    env = localcluster.slurm_env(spec)  # the daemons run the stack's own Slurm commands
    if not localcluster.process_alive(state.get("controller", 0), "slurm_recovery.controller"):
        state["controller"] = start_controller(config, logs / "controller.log", env=env)
    if not localcluster.process_alive(state.get("watchdog", 0), "watchdog"):
        state["watchdog"] = start_watchdog(config, logs / "watchdog.log", env=env)
    for node in spec.node_names:
        key = f"sidecar:{node}"
        if not localcluster.process_alive(state.get(key, 0), f"--node {node}"):
            state[key] = start_sidecar(config, node, logs / f"sidecar-{node}.log", env=env)
    (base / STATE_FILE).write_text(json.dumps(state))
    try:
        wait_healthy(url, pid=state["controller"])
    except localcluster.ClusterError as exc:
        # a stack without its controller is of no use, and its daemons would outlive the
        # caller (a test fixture whose setup failed is never torn down): stop them all
        down(base)
        raise localcluster.ClusterError(f"{exc}; stack stopped, logs in {logs}") from exc
    return DevStack(base=base, cluster=spec, config=config, url=url)


def down(base: Path = DEV_BASE) -> list[str]:
    state = _load(base)
    stopped = []
    daemons = [(k, f"--node {k.split(':', 1)[1]}") for k in state if k.startswith("sidecar:")]
    daemons += [("watchdog", "watchdog"), ("controller", "slurm_recovery.controller")]
    for label, must in daemons:
        pid = state.get(label, 0)
        if localcluster.stop_process(pid, must):
            stopped.append(f"{label} (pid {pid})")
    if state:
        (base / STATE_FILE).write_text("{}")
    stopped += localcluster.down(base / "cluster")
    return stopped


def _load(base: Path) -> dict[str, int]:
    path = base / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else {}
