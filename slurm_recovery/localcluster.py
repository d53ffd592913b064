"""A real Slurm cluster on one host: munged, slurmctld and N slurmd, for tests and the demo.

Standard library only, so ``scripts/local-cluster`` runs before the project's venv exists.
Each cluster lives in its own base directory with its own slurm.conf, ports, state, logs and
its own munged socket, so two clusters on one host never share a process. ``down`` stops
exactly the processes ``up`` started (recorded by pid, checked against their command line
before any signal) and the slurmstepd they spawned (found by the SLURM_CONF in their
environment).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from stat import S_IFCHR

DEFAULT_BASE = Path("/tmp/srecovery-cluster")
DEFAULT_PORT_BASE = 17000
STATE_FILE = "cluster.json"
DEBIAN_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
MUNGE_KEY = Path("/etc/munge/munge.key")
#: Where scripts/build-slurm puts the Slurm releases apt does not install (/opt/slurm/24.11).
BUILT_SLURM = Path(os.environ.get("SRECOVERY_SLURM_ROOT", "/opt/slurm"))
#: Releases scripts/build-slurm knows; ``--slurm`` takes one of these or ``default``.
SLURM_SERIES = ("22.05", "24.11", "26.05")


class ClusterError(RuntimeError):
    """The local cluster could not be brought to the requested state."""


@dataclass
class ClusterSpec:
    """What to run. Ports: slurmctld on ``port_base``, slurmd nI on ``port_base + I``."""

    base: Path = DEFAULT_BASE
    nodes: int = 4
    port_base: int = DEFAULT_PORT_BASE
    name: str = "srlocal"
    cpus_per_node: int = 2
    #: GPU GRES per node (gres.conf ``File=`` on plain files standing in for /dev/nvidiaN), as
    #: many as the dev stack's simulated GPUs, so jobs that ask ``--gres=gpu:N`` get indices.
    gpus_per_node: int = 8
    extra_conf: list[str] = field(default_factory=list)
    #: Install prefix of the Slurm to run ("" = the programs on PATH, what apt installed).
    slurm_prefix: str = ""

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    @property
    def slurm_conf(self) -> Path:
        return self.base / "etc" / "slurm.conf"

    @property
    def state_dir(self) -> Path:
        """StateSaveLocation, one per release: a newer slurmctld rewrites files there (the
        clustername file) in a form an older one refuses ("CLUSTER NAME MISMATCH")."""
        if not self.slurm_prefix:
            return self.base / "state"
        return self.base / f"state-{Path(self.slurm_prefix).name}"

    @property
    def gres_conf(self) -> Path:
        """gres.conf beside slurm.conf (slurmd reads it from the same directory)."""
        return self.base / "etc" / "gres.conf"

    def gpu_files(self, node: str) -> list[Path]:
        """The device-like files of ``node``'s simulated GPUs, in index order."""
        return [self.base / "gpus" / node / f"nvidia{i}" for i in range(self.gpus_per_node)]

    @property
    def munge_socket(self) -> Path:
        return self.base / "munge" / "munge.socket"

    def to_json(self) -> dict:
        data = asdict(self)
        data["base"] = str(self.base)
        return data

    @classmethod
    def from_json(cls, data: dict) -> ClusterSpec:
        return cls(**{**data, "base": Path(data["base"])})


# --- configuration ---------------------------------------------------------------------


def render_slurm_conf(spec: ClusterSpec, hostname: str) -> str:
    """slurm.conf for ``spec``: several slurmd on this host, every port on loopback."""
    b = spec.base
    relocated = relocated_prefix(spec)
    lines = [
        "# Written by scripts/local-cluster; rewritten on every `up`.",
        *([f"PluginDir={_relocated_plugins(relocated)}"] if relocated else []),
        f"ClusterName={spec.name}",
        f"SlurmctldHost={hostname}(127.0.0.1)",
        f"SlurmctldPort={spec.port_base}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={spec.munge_socket}",
        f"StateSaveLocation={spec.state_dir}",
        f"SlurmdSpoolDir={b}/spool/%n",
        f"SlurmctldPidFile={b}/run/slurmctld.pid",
        f"SlurmdPidFile={b}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={b}/log/slurmctld.log",
        f"SlurmdLogFile={b}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "MpiDefault=none",
        "ReturnToService=2",
        "KillWait=5",
        "MinJobAge=600",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=60",
        *(["GresTypes=gpu"] if spec.gpus_per_node else []),
        *spec.extra_conf,
        f"NodeName=n[1-{spec.nodes}] NodeHostname={hostname} NodeAddr=127.0.0.1 "
        f"Port=[{spec.port_base + 1}-{spec.port_base + spec.nodes}] CPUs={spec.cpus_per_node} "
        + (f"Gres=gpu:{spec.gpus_per_node} " if spec.gpus_per_node else "")
        + "RealMemory=1000 State=UNKNOWN",
        f"PartitionName=debug Nodes=n[1-{spec.nodes}] Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def render_gres_conf(spec: ClusterSpec) -> str:
    """gres.conf: one line per node (all slurmd share this host), each GPU a plain file, so
    Slurm hands out real indices (``IDX``) and sets CUDA_VISIBLE_DEVICES in jobs."""
    lines = ["# Written by scripts/local-cluster; rewritten on every `up`.", "AutoDetect=off"]
    last = spec.gpus_per_node - 1
    for node in spec.node_names if spec.gpus_per_node else []:
        folder = spec.gpu_files(node)[0].parent
        names = f"nvidia[0-{last}]" if last else "nvidia0"
        lines.append(f"NodeName={node} Name=gpu File={folder}/{names}")
    return "\n".join(lines) + "\n"


def _make_gpu_file(path: Path) -> None:
    """A character device with /dev/null's numbers (harmless to open): slurmd wants ``File=``
    to be a device ("is not a valid character or block device") and then sets
    CUDA_VISIBLE_DEVICES; a plain file where mknod is not allowed (slurmd logs an error per
    file but still hands out the indices)."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        path.touch()


# --- processes -------------------------------------------------------------------------


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _reap(pid: int) -> None:
    """Collect our own exited child so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def process_alive(pid: int, must_contain: str) -> bool:
    """pid runs and its command line contains ``must_contain`` (guards against pid reuse)."""
    if pid <= 0:
        return False
    _reap(pid)
    if _is_zombie(pid):
        return False
    return must_contain in " ".join(_cmdline(pid))


def stop_process(pid: int, must_contain: str, timeout: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after ``timeout``; only if the pid is still what we started."""
    if not process_alive(pid, must_contain):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process_alive(pid, must_contain):
            return True
        time.sleep(0.05)
    if process_alive(pid, must_contain):
        os.kill(pid, signal.SIGKILL)
        while process_alive(pid, must_contain):
            time.sleep(0.05)
    return True


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _parents() -> dict[int, int]:
    """pid -> parent pid for every process."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _spool_sockets(spec: ClusterSpec) -> set[str]:
    """Inodes of the unix sockets bound under this cluster's slurmd spool directories: each
    slurmstepd listens on ``SPOOL/<node>_<job>.<step>`` (/proc/net/unix: ... inode path)."""
    spool = f"{spec.base / 'spool'}/"
    inodes = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[7].startswith(spool):
                inodes.add(fields[6])
    return inodes


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _job_pids(spec: ClusterSpec) -> list[int]:
    """slurmstepd spawned by this cluster's slurmd and the job processes under them, children
    first. A stepd is this cluster's when it carries its SLURM_CONF (22.05) or listens on a
    socket in its spool (24.11's slurmstepd has an empty environment)."""
    parents = _parents()
    ours = _spool_sockets(spec)
    stepds = [
        pid
        for pid in parents
        if " ".join(_cmdline(pid)).startswith("slurmstepd")
        and (
            _environ(pid).get("SLURM_CONF") == str(spec.slurm_conf)
            or bool(ours & _socket_inodes(pid))
        )
    ]
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    ordered: list[int] = []

    def walk(pid: int) -> None:
        for child in children.get(pid, []):
            walk(child)
        ordered.append(pid)

    for pid in stepds:
        walk(pid)
    return ordered


def spawn_daemon(argv: list[str], log: Path, env: dict[str, str], user: str | None = None) -> int:
    """Start a daemon in its own session; the pid returned is the daemon itself."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            user=user,
            group=user,
            extra_groups=[] if user else None,
        )
    return proc.pid


# --- state -----------------------------------------------------------------------------


def _load_state(base: Path) -> dict | None:
    path = base / STATE_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text())


def _save_state(base: Path, state: dict) -> None:
    tmp = base / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(base / STATE_FILE)


def slurm_env(spec: ClusterSpec) -> dict[str, str]:
    """The environment for Slurm commands against this cluster: its SLURM_CONF, and its
    release's programs first on PATH (for the daemons too, so hooks find the same scontrol)."""
    env = {**os.environ, "SLURM_CONF": str(spec.slurm_conf)}
    if spec.slurm_prefix:
        env["PATH"] = path_with_slurm(spec.slurm_prefix, env.get("PATH", ""))
    return env


def path_with_slurm(prefix: str, path: str) -> str:
    """``path`` with ``prefix``'s bin and sbin first (and not repeated)."""
    first = [f"{prefix}/bin", f"{prefix}/sbin"]
    rest = [p for p in path.split(os.pathsep) if p and p not in first]
    return os.pathsep.join(first + rest)


def _program(spec: ClusterSpec, name: str) -> str:
    """The path of a Slurm program of this cluster's release."""
    if not spec.slurm_prefix:
        return name
    sub = "sbin" if name in ("slurmctld", "slurmd") else "bin"
    return f"{spec.slurm_prefix}/{sub}/{name}"


def relocated_prefix(spec: ClusterSpec) -> str:
    """The prefix of a relocated Debian package set (26.05 from Debian unstable,
    scripts/build-slurm) that this cluster runs, named by ``slurm_prefix`` or first on PATH;
    "" for a build from source or apt's Slurm. Its programs keep Debian's compiled-in paths
    (plugins, slurmstepd), which on this host belong to apt's release: they are overridden."""
    prefix = spec.slurm_prefix
    if not prefix:
        found = shutil.which("slurmctld")
        prefix = str(Path(found).parent.parent) if found else ""
    return prefix if prefix and Path(_relocated_plugins(prefix)).is_dir() else ""


def _relocated_plugins(prefix: str) -> str:
    return f"{prefix}/root/usr/lib/x86_64-linux-gnu/slurm-wlm"


def _slurmd_argv(spec: ClusterSpec, node: str) -> list[str]:
    """slurmd for ``node``; a relocated release's slurmd is told where its own slurmstepd is
    (its compiled-in /usr/sbin/slurmstepd is the host's, another release)."""
    argv = [_program(spec, "slurmd"), "-D", "-N", node, "-f", str(spec.slurm_conf)]
    relocated = relocated_prefix(spec)
    if relocated:
        argv += ["-d", f"{relocated}/sbin/slurmstepd"]
    return argv


def _release_of(slurmctld: str) -> str:
    """``"24.11"`` from ``slurmctld -V`` (``slurm 24.11.5``; the client commands need a
    slurm.conf even for ``--version``); "" when it cannot run."""
    try:
        out = subprocess.run([slurmctld, "-V"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    words = out.stdout.split()
    return ".".join(words[-1].split(".")[:2]) if out.returncode == 0 and words else ""


def resolve_slurm(series: str) -> str:
    """The install prefix for ``--slurm SERIES`` ("" = the Slurm on PATH).

    ``default`` (or "") is whatever apt installed. A named series is the build under
    ``/opt/slurm/SERIES`` (scripts/build-slurm) or, when that is absent and apt's Slurm is
    that series (24.11 on Debian 13), apt's.
    """
    if series in ("", "default"):
        return ""
    built = BUILT_SLURM / series
    if _release_of(str(built / "sbin" / "slurmctld")) == series:
        return str(built)
    if shutil.which("slurmctld") and _release_of("slurmctld") == series:
        return ""
    known = ", ".join(SLURM_SERIES)
    raise ClusterError(
        f"Slurm {series} is not installed here: run `scripts/build-slurm {series}` "
        f"(builds it under {built}; known series: {known}), or use --slurm default"
    )


def other_series() -> str:
    """The series scripts/bootstrap builds beside apt's: 24.11 beside Debian 12's 22.05,
    22.05 beside Debian 13's 24.11 (so the tests can run on both everywhere)."""
    return "22.05" if _release_of("slurmctld") == "24.11" else "24.11"


def slurm_release(spec: ClusterSpec) -> str:
    """The series (``22.05``) of the Slurm this cluster runs."""
    return _release_of(_program(spec, "slurmctld"))


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux's default is
    32768-60999): a server port inside it can be taken by any outgoing connection between the
    moment it is found free and the moment the server binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low, high = (int(part) for part in fh.read().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port_block(count: int, start: int = 20000, stop: int | None = None) -> int:
    """First port p with p..p+count-1 all free on loopback (so clusters never clash), from a
    point in [start, stop) that depends on the process, wrapping around at ``stop``. ``stop``
    defaults to the bottom of the kernel's ephemeral range (:func:`ephemeral_ports`): a port
    above it was seen taken by an outgoing connection before the controller bound it
    (``[Errno 98] address already in use`` in CI)."""
    if stop is None:
        stop = ephemeral_ports()[0]
    if start > stop - count - 1:  # asked for a point past the range: start from its bottom
        start = max(1024, min(20000, stop - 10 * count - 1))
    first = start + (os.getpid() % 500) * 20 % max(stop - start - count, 1)
    for base in [*range(first, stop - count, count + 1), *range(start, first, count + 1)]:
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise ClusterError(f"no block of {count} free ports on loopback in [{start}, {stop})")


# --- install and munge -----------------------------------------------------------------


def ensure_packages() -> None:
    """Install Debian's Slurm and munge when any of their programs is missing."""
    if all(shutil.which(p) for p in ("slurmctld", "slurmd", "sinfo", "munged")):
        return
    if os.geteuid() != 0:
        raise ClusterError(
            "slurmctld/slurmd/munged are missing and installing them needs root: "
            f"apt-get install {' '.join(DEBIAN_PACKAGES)}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", *DEBIAN_PACKAGES], check=True, env=env)


def _searchable_by(path: Path, uid: int, gid: int) -> bool:
    st = path.stat()
    if st.st_uid == uid:
        return bool(st.st_mode & 0o100)
    if st.st_gid == gid:
        return bool(st.st_mode & 0o010)
    return bool(st.st_mode & 0o001)


def _prepare_munge_dirs(spec: ClusterSpec) -> None:
    munge = pwd.getpwnam("munge")
    mdir = spec.munge_socket.parent
    base = spec.base.resolve()
    for parent in (*reversed(base.parents), base):
        if not _searchable_by(parent, munge.pw_uid, munge.pw_gid):
            raise ClusterError(
                f"munged runs as user munge and cannot reach {parent}: choose a --base "
                f"whose every directory others may search (e.g. chmod o+x {parent})"
            )
    mdir.mkdir(parents=True, exist_ok=True)
    os.chown(mdir, munge.pw_uid, munge.pw_gid)
    mdir.chmod(0o755)
    # The Debian package leaves these for the system munged; fix them as munged demands.
    for path in (Path("/etc/munge"), Path("/var/lib/munge"), Path("/var/log/munge")):
        if path.exists():
            os.chown(path, munge.pw_uid, munge.pw_gid)
    if not MUNGE_KEY.exists():
        subprocess.run(["mungekey", "--create", f"--keyfile={MUNGE_KEY}"], check=True)
        os.chown(MUNGE_KEY, munge.pw_uid, munge.pw_gid)
        MUNGE_KEY.chmod(0o600)


def _munge_works(spec: ClusterSpec) -> bool:
    sock = str(spec.munge_socket)
    try:
        cred = subprocess.run(
            ["munge", "-n", "-S", sock], capture_output=True, timeout=5, check=True
        ).stdout
        subprocess.run(
            ["unmunge", "-S", sock], input=cred, capture_output=True, timeout=5, check=True
        )
    except (subprocess.SubprocessError, OSError):
        return False
    return True


# --- slurm queries ---------------------------------------------------------------------


def node_states(spec: ClusterSpec) -> dict[str, str]:
    """``{"n1": "idle", ...}`` as sinfo reports them (lower-case, ``*`` when not responding)."""
    try:
        out = subprocess.run(
            [_program(spec, "sinfo"), "-h", "-N", "-o", "%N %t"],
            env=slurm_env(spec),
            capture_output=True,
            text=True,
            timeout=10,
        )
    except subprocess.TimeoutExpired:
        return {}
    if out.returncode != 0:
        return {}
    states = {}
    for line in out.stdout.splitlines():
        name, _, state = line.partition(" ")
        states[name] = state.strip()
    return states


def _wait_for_nodes(spec: ClusterSpec, timeout: float) -> dict[str, str]:
    """Until every node answers (idle, or busy with work): a fresh cluster is all idle."""
    ready = {"idle", "alloc", "mix", "drain", "drng", "comp"}
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = node_states(spec)
        if len(states) == spec.nodes and all(s in ready for s in states.values()):
            return states
        time.sleep(0.2)
    raise ClusterError(
        f"nodes not ready after {timeout:.0f}s: {states or 'slurmctld not answering'}; "
        f"see logs in {spec.base / 'log'}"
    )


# --- the commands ----------------------------------------------------------------------


def up(spec: ClusterSpec, timeout: float = 90.0, keep_state: bool = False) -> ClusterSpec:
    """Start whatever is not running yet; harmless when the cluster is already up.

    An ``up`` that fails stops what it started itself (a munged or slurmd left behind would
    hold the base and its ports), and leaves running what an earlier ``up`` started."""
    if os.geteuid() != 0:
        raise ClusterError("the local cluster runs slurmd as root: run as root")
    ensure_packages()
    state = _load_state(spec.base)
    if state is not None:
        recorded = ClusterSpec.from_json(state["spec"])
        if (recorded.nodes, recorded.port_base, recorded.name, recorded.slurm_prefix) != (
            spec.nodes,
            spec.port_base,
            spec.name,
            spec.slurm_prefix,
        ) and any_running(recorded):
            raise ClusterError(
                f"a cluster with {recorded.nodes} nodes on port {recorded.port_base} "
                f"(Slurm {recorded.slurm_prefix or 'on PATH'}) is running in {spec.base}; "
                f"run `down --base {spec.base}` first"
            )
    pids: dict[str, int] = dict(state["pids"]) if state else {}
    before = dict(pids)
    try:
        return _start(spec, pids, timeout, keep_state)
    except BaseException:
        for label, pid, must in _processes(spec, pids):
            if before.get(label) != pid:
                stop_process(pid, must)
                pids.pop(label, None)
        _save_state(spec.base, {"spec": spec.to_json(), "pids": pids})
        raise


def _start(
    spec: ClusterSpec, pids: dict[str, int], timeout: float, keep_state: bool
) -> ClusterSpec:
    for sub in ("etc", spec.state_dir.name, "run", "log", "spool"):
        (spec.base / sub).mkdir(parents=True, exist_ok=True)
    for node in spec.node_names:
        (spec.base / "spool" / node).mkdir(exist_ok=True)
    spec.slurm_conf.write_text(render_slurm_conf(spec, socket.gethostname()))
    spec.gres_conf.write_text(render_gres_conf(spec))
    for node in spec.node_names:
        for gpu in spec.gpu_files(node):
            _make_gpu_file(gpu)
    env = slurm_env(spec)
    log = spec.base / "log"

    def save() -> None:
        _save_state(spec.base, {"spec": spec.to_json(), "pids": pids})

    if not process_alive(pids.get("munged", 0), "munged"):
        _prepare_munge_dirs(spec)
        spec.munge_socket.unlink(missing_ok=True)
        pids["munged"] = spawn_daemon(
            [
                "munged",
                "--foreground",
                f"--socket={spec.munge_socket}",
                f"--pid-file={spec.munge_socket.parent / 'munged.pid'}",
                f"--seed-file={spec.munge_socket.parent / 'munged.seed'}",
            ],
            log / "munged.log",
            env,
            user="munge",
        )
        save()
        _wait(
            lambda: _munge_works(spec),
            10,
            "munged did not start",
            log / "munged.log",
            alive=lambda: process_alive(pids["munged"], "munged"),
        )

    if not process_alive(pids.get("slurmctld", 0), "slurmctld"):
        argv = [_program(spec, "slurmctld"), "-D", "-f", str(spec.slurm_conf)]
        if not keep_state:
            argv.append("-c")  # a fresh cluster: no jobs or drains from an earlier run
        pids["slurmctld"] = spawn_daemon(argv, log / "slurmctld.out", env)
        save()
        _wait(
            lambda: _controller_answers(spec),
            30,
            "slurmctld did not answer",
            log / "slurmctld.out",
            log / "slurmctld.log",
            alive=lambda: process_alive(pids["slurmctld"], "slurmctld"),
        )

    for node in spec.node_names:
        key = f"slurmd:{node}"
        if not process_alive(pids.get(key, 0), f"-N {node}"):
            pids[key] = spawn_daemon(
                _slurmd_argv(spec, node),
                log / f"slurmd-{node}.out",
                env,
            )
    save()
    _wait_for_nodes(spec, timeout)
    return spec


def _controller_answers(spec: ClusterSpec) -> bool:
    return (
        subprocess.run(
            [_program(spec, "scontrol"), "ping"],
            env=slurm_env(spec),
            capture_output=True,
            timeout=10,
        ).returncode
        == 0
    )


def _wait(
    check, timeout: float, what: str, *logfiles: Path, alive: Callable[[], bool] | None = None
) -> None:
    """Until ``check()``; a daemon that exits (``alive`` false) fails at once, not at the end."""
    deadline = time.monotonic() + timeout
    exited = False
    while time.monotonic() < deadline:
        if check():
            return
        if alive is not None and not alive():
            exited = True
            break
        time.sleep(0.1)
    tails = []
    for logfile in logfiles:
        if logfile.exists() and logfile.stat().st_size:
            lines = logfile.read_text(errors="replace").splitlines()[-15:]
            tails.append(f"last lines of {logfile}:\n" + "\n".join(lines))
    why = "it exited" if exited else f"within {timeout:.0f}s"
    raise ClusterError(f"{what} ({why}); " + ("\n".join(tails) or "no log written"))


def _processes(spec: ClusterSpec, pids: dict[str, int]) -> list[tuple[str, int, str]]:
    """(label, pid, text that must be in its command line) for every recorded process."""
    rows = []
    for label, pid in pids.items():
        if label == "munged":
            rows.append((label, pid, "munged"))
        elif label == "slurmctld":
            rows.append((label, pid, "slurmctld"))
        else:
            node = label.split(":", 1)[1]
            rows.append((label, pid, f"-N {node}"))
    return rows


def any_running(spec: ClusterSpec) -> bool:
    state = _load_state(spec.base)
    if not state:
        return False
    return any(process_alive(pid, must) for _, pid, must in _processes(spec, state["pids"]))


def stop_slurmctld(base: Path) -> None:
    """Stop only slurmctld (to test what happens while the controller is down)."""
    state = _require_state(base)
    stop_process(state["pids"].get("slurmctld", 0), "slurmctld")


def down(base: Path) -> list[str]:
    """Stop every process this cluster started; returns what was stopped."""
    state = _load_state(base)
    if state is None:
        return []
    spec = ClusterSpec.from_json(state["spec"])
    stopped = []
    rows = _processes(spec, state["pids"])
    order = {"slurmd": 0, "slurmctld": 1, "munged": 2}  # munged last: the others need it
    for label, pid, must in sorted(rows, key=lambda r: order[r[0].split(":")[0]]):
        if stop_process(pid, must):
            stopped.append(f"{label} (pid {pid})")
    for pid in _job_pids(spec):  # steps outlive slurmd; their jobs must not outlive `down`
        label = " ".join(_cmdline(pid)) or "?"
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            stopped.append(f"{label} (pid {pid})")
    _save_state(base, {"spec": spec.to_json(), "pids": {}})
    return stopped


def _require_state(base: Path) -> dict:
    state = _load_state(base)
    if state is None:
        raise ClusterError(f"no local cluster in {base} (run `up` first)")
    return state


def status(base: Path) -> dict:
    state = _require_state(base)
    spec = ClusterSpec.from_json(state["spec"])
    procs = {
        label: {"pid": pid, "running": process_alive(pid, must)}
        for label, pid, must in _processes(spec, state["pids"])
    }
    return {
        "base": str(base),
        "slurm_conf": str(spec.slurm_conf),
        "processes": procs,
        "nodes": node_states(spec) if procs.get("slurmctld", {}).get("running") else {},
    }


def _exports(spec: ClusterSpec) -> str:
    """Shell lines that point Slurm's commands at this cluster (and its release)."""
    lines = [f"export SLURM_CONF={spec.slurm_conf}"]
    if spec.slurm_prefix:
        lines.append(f'export PATH="{spec.slurm_prefix}/bin:{spec.slurm_prefix}/sbin:$PATH"')
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="local-cluster",
        description="A real Slurm cluster (munged, slurmctld, N slurmd) on this host.",
    )
    parser.add_argument(
        "--base",
        type=Path,
        default=DEFAULT_BASE,
        help=f"directory for config, state and logs (default {DEFAULT_BASE})",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start the cluster (idempotent) and print SLURM_CONF")
    p_up.add_argument("--nodes", type=int, default=4, help="number of slurmd, named n1..nN")
    p_up.add_argument(
        "--port-base",
        type=int,
        default=DEFAULT_PORT_BASE,
        help="slurmctld port; slurmd nI listens on port-base+I",
    )
    p_up.add_argument("--name", default="srlocal", help="ClusterName")
    p_up.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="LINE",
        help="extra slurm.conf line (repeatable)",
    )
    p_up.add_argument(
        "--keep-state", action="store_true", help="keep jobs and node states from the last run"
    )
    p_up.add_argument("--timeout", type=float, default=90.0)
    p_up.add_argument(
        "--slurm",
        default="default",
        metavar="SERIES",
        help=f"Slurm release to run: default (what apt installed) or one of "
        f"{', '.join(SLURM_SERIES)} (built by scripts/build-slurm under {BUILT_SLURM})",
    )
    sub.add_parser("down", help="stop every process the cluster started")
    sub.add_parser("status", help="processes and node states, as JSON")
    sub.add_parser("env", help="print the export lines for SLURM_CONF (and PATH)")
    args = parser.parse_args(argv)
    base = args.base.resolve()
    try:
        if args.command == "up":
            if not 1 <= args.nodes <= 64:
                parser.error("--nodes must be between 1 and 64")
            spec = up(
                ClusterSpec(
                    base=base,
                    nodes=args.nodes,
                    port_base=args.port_base,
                    name=args.name,
                    extra_conf=args.conf,
                    slurm_prefix=resolve_slurm(args.slurm),
                ),
                timeout=args.timeout,
                keep_state=args.keep_state,
            )
            print(
                f"cluster {spec.name} up: {spec.nodes} nodes answering "
                f"(Slurm {slurm_release(spec)})",
                file=sys.stderr,
            )
            print(_exports(spec))
        elif args.command == "down":
            for item in down(base):
                print(f"stopped {item}")
        elif args.command == "status":
            print(json.dumps(status(base), indent=2))
        elif args.command == "env":
            print(_exports(ClusterSpec.from_json(_require_state(base)["spec"])))
    except ClusterError as exc:
        print(f"local-cluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
