"""Slurm's job hooks: node Prolog/Epilog, TaskProlog and the head node's EpilogSlurmctld
(docs/hooks.md).

Each run of an event hook turns Slurm's environment into ONE evidence event (the controller's
wire format, :mod:`slurm_recovery.contract.wire`) and hands it on:

- ``prolog`` (slurmd, root, each node, job start): creates the job's directory on the node
  (:mod:`slurm_recovery.contract.jobdir`), then ``job_start`` written into the node's sidecar spool,
  ``<sidecar.spool_dir>/events/``, which the sidecar sends on. On the batch node it records
  where the attempt's output begins in the job's output files (:func:`output_offset`). With
  ``hooks.health_gate`` on, it may refuse the node (exit 1; see :func:`gate_decision`).
- ``epilog`` (slurmd, root, each node, job end): ``job_end`` into the same spool.
- ``epilog_slurmctld`` (slurmctld, SlurmUser, head node, job end): ``job_end`` posted to the
  controller, or, on any failure, written into ``<controller.spool_dir>/events/``, which the
  controller imports.

``task_prolog`` (slurmstepd, the job user, before each task) sends nothing: it prints
``export SRECOVERY_PROGRESS_FILE=...`` (and the NCCL flight recorder's dump prefix), which
Slurm puts into the task's environment (:func:`task_prolog_lines`).

A spooled event is one JSON object (one wire event) in ``<time_ns>-<pid>-<job>.json``, written
as ``<name>.tmp``, fsynced and renamed, so a reader taking ``*.json`` never sees half a file.

The hooks never fail a job because of slurm-recovery: every error is logged as one line (stderr,
which slurmd and slurmctld log when a hook fails, and syslog) and the hook exits 0. The one
non-zero exit is the health gate's deliberate refusal.

Cost: Slurm waits for each hook, so this module imports the standard library and
:mod:`slurm_recovery.contract` only (import-linter holds it to that in CI): its settings come
from :mod:`slurm_recovery.contract.settings`, which reads the few keys the hooks use with the
same defaults and checks the daemons' schema takes from it; host lists, output patterns, the
spool and the job directory are the contract's too. The HTTP client (EpilogSlurmctld's post)
and the policy's mode (the health gate) are loaded only on the paths that use them.
bench/hook_overhead.py measures the result (docs/performance.md).
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import sys
import time
import warnings
from collections.abc import Callable, Mapping
from contextlib import suppress

from slurm_recovery.contract import hostlist, jobdir
from slurm_recovery.contract.outputs import expand_output_path
from slurm_recovery.contract.settings import (
    HOOK_DEFAULTS,
    NODE_PLACEHOLDER,
    SettingsError,
    policy_mode,
    read_hook_settings,
)
from slurm_recovery.contract.spool import spool_event

#: typing costs a hook ~3 ms to import; the annotations need only its names
TYPE_CHECKING = False
if TYPE_CHECKING:
    # pathlib is imported only where a Path is returned (it costs ~3 ms)
    from pathlib import Path
    from typing import Any, TextIO

#: The hooks that send an event.
EVENT_HOOKS = ("prolog", "epilog", "epilog_slurmctld")
#: Every hook, as named in :func:`write_hook_wrappers`' result and on the command line.
HOOKS = (*EVENT_HOOKS, "task_prolog")
#: The executable of each hook (under ``hooks/<dir>/`` in the source tree).
SCRIPT_NAMES: Mapping[str, str] = {
    "prolog": "srecovery-prolog",
    "epilog": "srecovery-epilog",
    "epilog_slurmctld": "srecovery-epilog-slurmctld",
    "task_prolog": "srecovery-task-prolog",
}
#: Where each hook's executable lives under ``hooks/`` in the source tree.
SCRIPT_DIRS: Mapping[str, str] = {
    "prolog": "prolog",
    "epilog": "epilog",
    "epilog_slurmctld": "epilog_slurmctld",
    "task_prolog": "task_prolog",
}
#: The slurm.conf key of each hook.
SLURM_CONF_KEYS: Mapping[str, str] = {
    "prolog": "Prolog",
    "epilog": "Epilog",
    "epilog_slurmctld": "EpilogSlurmctld",
    "task_prolog": "TaskProlog",
}
#: The event kind each hook sends and the ``context`` it puts in the payload.
KIND = {"prolog": "job_start", "epilog": "job_end", "epilog_slurmctld": "job_end"}
CONTEXT = {"prolog": "prolog", "epilog": "epilog", "epilog_slurmctld": "epilog_slurmctld"}

#: The sidecar's health file in its spool directory (read by the prolog's health gate).
HEALTH_FILE = "health.json"
#: The health file counts as fresh for this many ``sidecar.poll_interval``.
HEALTH_FRESH_POLLS = 3
#: A larger health file is not read (the gate then fails open).
MAX_HEALTH_BYTES = 1024 * 1024


EXIT_OK = 0
#: The health gate's refusal: slurmd drains the node ("Prolog error") and requeues the job.
EXIT_REFUSE = 1


class HookError(Exception):
    """Something a hook needs is missing or unusable; logged, and the hook exits 0."""


class HookConfigError(HookError):
    """The config file cannot be used (the message names the file and the key)."""


# --------------------------------------------------------------------------------- logging


def log(hook: str, message: str) -> None:
    """One line to stderr (slurmd and slurmctld log it when the hook fails) and to syslog."""
    name = SCRIPT_NAMES.get(hook, "srecovery-hook")
    line = " ".join(message.split())
    with suppress(Exception):  # stderr closed: syslog still has it
        print(f"{name}: {line}", file=sys.stderr, flush=True)
    try:
        import syslog

        syslog.openlog(name, syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_WARNING, line)
        syslog.closelog()
    except Exception:
        pass


# --------------------------------------------------------------------------------- the config


class HookConfig:
    """The settings the hooks use, by their dotted names in config.toml (``source``: the file,
    or None for all defaults)."""

    __slots__ = ("source", "values")

    def __init__(self, values: Mapping[str, object] | None = None, source: str | None = None):
        self.values = {**HOOK_DEFAULTS, **(values or {})}
        self.source = source

    def __getitem__(self, dotted: str) -> Any:
        return self.values[dotted]

    def __repr__(self) -> str:
        return f"HookConfig({self.values!r}, source={self.source!r})"

    def node_name(self, env: Mapping[str, str]) -> str:
        """The node a node hook runs for: ``SLURMD_NODENAME`` (several slurmd may share a
        host), else ``sidecar.node``, else the short hostname."""
        return (
            env.get("SLURMD_NODENAME")
            or self["sidecar.node"]
            or os.uname().nodename.split(".", 1)[0]
        )

    def sidecar_spool(self, node: str) -> str:
        """``sidecar.spool_dir`` with ``{node}`` replaced: the node's spool directory."""
        return self["sidecar.spool_dir"].replace(NODE_PLACEHOLDER, node)

    def job_dir(self, node: str, job: int) -> str:
        """The job's directory on ``node`` (:func:`slurm_recovery.contract.jobdir.job_dir_for`)."""
        return jobdir.job_dir_for(self["hooks.job_dir"], node, job)


def load_hook_config(env: Mapping[str, str] | None = None) -> HookConfig:
    """The hooks' settings (:func:`slurm_recovery.contract.settings.read_hook_settings`: the
    config file's hook keys, then ``$SRECOVERY_URL``); HookConfigError names the file and key."""
    try:
        values, source = read_hook_settings(os.environ if env is None else env)
    except SettingsError as exc:
        raise HookConfigError(str(exc)) from None
    return HookConfig(values, source=source)


# --------------------------------------------------------------------------------- reading Slurm


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip()
    if not re.fullmatch(r"[0-9]{1,19}", value):
        return None
    return int(value)


def job_id(env: Mapping[str, str]) -> int:
    """``SLURM_JOB_ID`` (``SLURM_JOBID`` on old Slurm); HookError when absent or not a job id."""
    raw = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    value = _int(raw)
    if value is None or not 0 < value < 2**63:
        raise HookError(f"SLURM_JOB_ID is {raw!r}, not a job id: not run by Slurm?")
    return value


def expand_nodes(expr: str | None) -> list[str]:
    """A Slurm host list (``n[1-3]``) -> node names; [] when absent or unparsable."""
    try:
        return hostlist.expand(expr)
    except hostlist.HostlistError:
        return []


def decode_wait_status(raw: str | None) -> tuple[int, int] | None:
    """A raw wait(2) status as Slurm passes it (``"768"``) -> ``(exit code, signal)``, Slurm's
    ``ExitCode=E:S`` convention: ``(3, 0)`` for ``exit 3``, ``(0, 9)`` for SIGKILL."""
    status = _int(raw)
    if status is None or status > 0xFFFFFFFF:
        return None
    signo = status & 0x7F
    if signo == 0:  # exited
        return (status >> 8) & 0xFF, 0
    if signo == 0x7F:  # stopped: not an end, but report the stop signal
        return 0, (status >> 8) & 0xFF
    return 0, signo


def parse_exit_code2(raw: str | None) -> tuple[int, int] | None:
    """``SLURM_JOB_EXIT_CODE2`` (``"3:0"``) -> ``(3, 0)``."""
    if not raw:
        return None
    found = re.fullmatch(r"\s*([0-9]{1,3}):([0-9]{1,3})\s*", raw)
    if not found:
        return None
    return int(found.group(1)), int(found.group(2))


def exit_fields(env: Mapping[str, str]) -> dict[str, Any]:
    """The job's exit codes: ``exit_code`` and ``signal`` (None when Slurm gave neither
    SLURM_JOB_EXIT_CODE nor SLURM_JOB_EXIT_CODE2), ``exit_status`` (the raw wait status) and
    ``exit_code2`` as given, ``derived_exit_code``/``derived_signal`` from
    SLURM_JOB_DERIVED_EC (the worst of the job's steps) when present."""
    fields: dict[str, Any] = {}
    raw = env.get("SLURM_JOB_EXIT_CODE")
    decoded = decode_wait_status(raw)
    if decoded is not None:
        fields["exit_status"] = _int(raw)
    code2 = env.get("SLURM_JOB_EXIT_CODE2")
    if parse_exit_code2(code2) is not None:
        fields["exit_code2"] = code2.strip() if code2 else code2
    if decoded is None:
        decoded = parse_exit_code2(code2)
    fields["exit_code"], fields["signal"] = decoded if decoded is not None else (None, None)
    derived = decode_wait_status(env.get("SLURM_JOB_DERIVED_EC"))
    if derived is not None:
        fields["derived_exit_code"], fields["derived_signal"] = derived
    return fields


def parse_gpus(raw: str | None) -> list[int | str] | None:
    """``"0,1"`` -> ``[0, 1]``; UUIDs and MIG names stay strings; None when there are none."""
    if not raw or raw.strip() in ("", "NoDevFiles", "(null)"):
        return None
    items = [part.strip() for part in raw.split(",") if part.strip()]
    return [int(item) if item.isdigit() else item for item in items] or None


def output_path(
    pattern: str | None, env: Mapping[str, str], nodes: list[str] | None = None
) -> str | None:
    """``SLURM_JOB_STDOUT``/``STDERR`` (the pattern as the user gave it) -> the batch step's
    file (:func:`slurm_recovery.contract.outputs.expand_output_path`; the batch host is the
    first of ``nodes``); None when Slurm gave no pattern or the file cannot be known. A value
    the environment does not give (the job name in an old Slurm's prolog) leaves its
    specifier as written."""
    if not pattern or pattern == "(null)":
        return None
    return expand_output_path(
        pattern,
        job_id=_int(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")) or 0,
        name=env.get("SLURM_JOB_NAME"),
        user=env.get("SLURM_JOB_USER"),
        workdir=env.get("SLURM_JOB_WORK_DIR"),
        batch_host=nodes[0] if nodes else None,
        array_job_id=_int(env.get("SLURM_ARRAY_JOB_ID")),
        array_task_id=_int(env.get("SLURM_ARRAY_TASK_ID")),
    )


def output_offset(path: str | None) -> int | None:
    """Where a job attempt's output will begin in ``path``: its size now, before the batch
    step opens it (the prolog runs first), so that a requeued attempt appending to the same
    file does not read the previous attempt's lines as its own; 0 when there is no such file
    yet. ``None`` (the sidecar then takes the size when it learns of the job) for a relative
    path, a path that is not a regular file, or one that cannot be looked at."""
    found = output_stat(path)
    return None if found is None else found[0]


def output_stat(path: str | None) -> tuple[int, float | None] | None:
    """``(size, modification time)`` of a job's output file before the batch step opens it:
    the size is where the attempt's output begins when Slurm appends; a modification time
    that then changes without the file growing tells the sidecar that the attempt truncated
    it instead (:func:`output_offset`). ``(0, None)`` when there is no such file yet.

    The prolog runs as root on a path the job user chose: the file is never opened (a FIFO
    could block, a device could do anything), and a symbolic link is not followed (it could
    point anywhere, a hung network mount too); only the final name is looked at."""
    if not path or not path.startswith("/"):
        return None
    try:
        info = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return 0, None
    except (OSError, ValueError):  # no permission, a file in its path, a NUL byte
        return None
    return (info.st_size, info.st_mtime) if stat.S_ISREG(info.st_mode) else None


def _restart_count(env: Mapping[str, str]) -> int:
    return _int(env.get("SLURM_JOB_RESTART_COUNT")) or 0


def _node_list(env: Mapping[str, str]) -> str | None:
    # 22.05 node prolog/epilog: SLURM_NODELIST; EpilogSlurmctld and newer Slurm: SLURM_JOB_NODELIST.
    return env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")


#: Job-control variables the SPANK plugin (spank/slurm_recovery.c) sets at submission;
#: slurmd hands them to the Prolog with Slurm's ``SPANK_`` prefix (seen on 22.05).
RECOVERY_ENV = {
    "mode": "SPANK_SRECOVERY_RECOVERY_MODE",
    "max_restarts": "SPANK_SRECOVERY_RECOVERY_MAX_RESTARTS",
    "hang_timeout": "SPANK_SRECOVERY_RECOVERY_HANG_TIMEOUT",
    "progress": "SPANK_SRECOVERY_RECOVERY_PROGRESS",
}
RECOVERY_MODES = ("auto", "monitor", "off")
_WHOLE = re.compile(r"[0-9]{1,6}")


def recovery_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """The job's own slurm-recovery settings (docs/spank.md), checked again as the plugin
    checks them; a missing or invalid one is left out (the controller's defaults apply)."""
    found: dict[str, Any] = {}
    mode = env.get(RECOVERY_ENV["mode"])
    if mode in RECOVERY_MODES:
        found["mode"] = mode
    raw = env.get(RECOVERY_ENV["max_restarts"], "")
    if _WHOLE.fullmatch(raw) and int(raw) <= 100:
        found["max_restarts"] = int(raw)
    raw = env.get(RECOVERY_ENV["hang_timeout"], "")
    if _WHOLE.fullmatch(raw) and 10 <= int(raw) <= 86400:
        found["hang_timeout"] = int(raw)
    regex = env.get(RECOVERY_ENV["progress"], "")
    if 0 < len(regex) <= 512:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                groups = re.compile(regex).groups
        except (re.error, RecursionError, OverflowError):
            groups = 0
        if groups >= 1:
            found["progress"] = regex
    return found


def build_event(
    hook: str, env: Mapping[str, str], now: float, node: str | None = None
) -> dict[str, Any]:
    """The event ``hook`` sends for Slurm's environment ``env`` (docs/hooks.md, "Events").

    ``node`` is the node a node hook runs on (None for ``epilog_slurmctld``: the event is
    about the job, not about a node). The prolog on the batch node (the first of the job's
    nodes) adds ``stdout_offset``/``stderr_offset`` (:func:`output_offset`). Raises HookError
    without a job id.
    """
    if hook not in EVENT_HOOKS:
        raise HookError(f"unknown hook {hook!r}; one of {', '.join(EVENT_HOOKS)}")
    job = job_id(env)
    nodelist = _node_list(env)
    payload: dict[str, Any] = {
        "nodes": expand_nodes(nodelist),
        "restart_count": _restart_count(env),
        "context": CONTEXT[hook],
    }
    if nodelist and not payload["nodes"]:
        payload["nodelist"] = nodelist  # Slurm's text, when it could not be expanded
    if hook != "prolog":
        payload.update(exit_fields(env))
    for key, var in (("stdout", "SLURM_JOB_STDOUT"), ("stderr", "SLURM_JOB_STDERR")):
        path = output_path(env.get(var), env, payload["nodes"])
        if path:
            payload[key] = path
    if hook == "prolog" and node is not None and payload["nodes"][:1] == [node]:
        for key in ("stdout", "stderr"):
            found = output_stat(payload.get(key))
            if found is not None:
                payload[f"{key}_offset"] = found[0]
                if found[1] is not None:
                    payload[f"{key}_mtime"] = found[1]
    gpus = parse_gpus(env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES"))
    if gpus is not None and hook != "epilog_slurmctld":
        payload["gpus"] = gpus
    partition = env.get("SLURM_JOB_PARTITION")
    if partition:
        payload["partition"] = partition
    for key, var in (
        ("array_job_id", "SLURM_ARRAY_JOB_ID"),
        ("array_task_id", "SLURM_ARRAY_TASK_ID"),
    ):
        value = _int(env.get(var))
        if value is not None:
            payload[key] = value
    if hook == "prolog":
        recovery = recovery_settings(env)
        if recovery:
            payload["recovery"] = recovery
    event: dict[str, Any] = {"kind": KIND[hook], "observed_at": now, "job_id": job}
    if node is not None and hook != "epilog_slurmctld":
        event["node"] = node
    event["payload"] = payload
    return event


# --------------------------------------------------------------------------------- the spool


# --------------------------------------------------------------------------------- health gate


def read_health(path: str) -> dict[str, Any]:
    """The sidecar's health file; raises HookError when it cannot be read or is malformed."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_HEALTH_BYTES + 1)
    except FileNotFoundError:
        raise HookError(f"no health file {path}") from None
    except OSError as exc:
        raise HookError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_HEALTH_BYTES:
        raise HookError(f"{path}: larger than {MAX_HEALTH_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise HookError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HookError(f"{path}: not a JSON object")
    updated = data.get("updated_at")
    if isinstance(updated, bool) or not isinstance(updated, int | float):
        raise HookError(f"{path}: updated_at missing or not a number")
    fatal = data.get("fatal", [])
    if not isinstance(fatal, list) or not all(isinstance(f, dict) for f in fatal):
        raise HookError(f"{path}: fatal is not a list of findings")
    return data


def _describe(finding: Mapping[str, Any]) -> str:
    text = str(finding.get("check") or "fatal finding")
    if finding.get("gpu") is not None:
        text += f" on GPU {finding['gpu']}"
    if finding.get("detail"):
        text += f" ({finding['detail']})"
    return text


def gate_decision(
    config: HookConfig, node: str, partition: str, now: float
) -> tuple[bool, str, list[dict[str, Any]]]:
    """Should the prolog refuse ``node``? ``(refuse, why, fatal findings)``.

    Refuses only when every one of these holds: ``hooks.health_gate`` is on; the sidecar's
    ``health.json`` is readable, names this node (or no node), was updated within
    ``HEALTH_FRESH_POLLS * sidecar.poll_interval`` of ``now`` and lists at least one fatal
    finding; and ``controller.policy`` is readable and puts ``partition`` in act mode.
    Anything missing, stale, corrupt or unreadable fails open (no refusal; ``why`` says why).
    """
    if not config["hooks.health_gate"]:
        return False, "health gate off", []
    return _fatal_findings_refusal(config, node, partition, now)


def _fatal_findings_refusal(
    config: HookConfig, node: str, partition: str, now: float
) -> tuple[bool, str, list[dict[str, Any]]]:
    """``(refuse, why, fatal findings)`` from the sidecar's health file and the policy's
    mode, for the prolog's gate and the epilog's alike (conditions 2-5 of docs/hooks.md)."""
    return _judge_health(config, node, partition, now)[:3]


def _judge_health(
    config: HookConfig, node: str, partition: str, now: float
) -> tuple[bool, str, list[dict[str, Any]], dict[str, Any] | None]:
    """:func:`_fatal_findings_refusal`, plus the health file it judged (None when it could
    not be used), so that a waiting epilog reads one version of it, not two."""
    path = os.path.join(config.sidecar_spool(node), HEALTH_FILE)
    try:
        health = read_health(path)
    except HookError as exc:
        return False, f"{exc}: failing open", [], None
    owner = health.get("node")
    if owner not in (None, "", node):
        return False, f"{path} is about node {owner!r}, not {node!r}: failing open", [], None
    age = now - float(health["updated_at"])
    fresh_for = HEALTH_FRESH_POLLS * config["sidecar.poll_interval"]
    if abs(age) > fresh_for:
        return (
            False,
            f"{path} is stale ({age:.0f}s old, fresh for {fresh_for:g}s): failing open",
            [],
            None,
        )
    fatal = [dict(f) for f in health.get("fatal", [])]
    if not fatal:
        return False, "no open fatal finding", [], health
    findings = "; ".join(_describe(f) for f in fatal[:4])
    if len(fatal) > 4:
        findings += f"; and {len(fatal) - 4} more"
    problem = f"open fatal GPU findings: {findings}"
    refuse, why = refusal_in_act_mode(config, partition, node, problem)
    if refuse:
        why = f"node {node} has {problem}"
    return refuse, why, fatal, health


def refusal_in_act_mode(
    config: HookConfig, partition: str, node: str, problem: str
) -> tuple[bool, str]:
    """``(refuse, why)`` for ``node``, in which the gate found ``problem``: refuse only when
    the policy puts ``partition`` in act mode; a policy that cannot be read fails open."""
    try:
        mode = policy_mode(config["controller.policy"], partition)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return False, f"cannot read the policy ({first}): failing open"
    if mode != "act":
        return (
            False,
            f"partition {partition or '(default)'} is in {mode} mode; in act mode the gate "
            f"would refuse node {node}: {problem}",
        )
    return True, f"node {node}: {problem}"


#: How often the epilog gate re-reads the health file while it waits (s).
EPILOG_GATE_POLL = 0.05


def job_failed(env: Mapping[str, str]) -> bool:
    """Whether Slurm says the job ended badly (non-zero exit or a signal); False when it
    gave no exit code."""
    fields = exit_fields(env)
    return bool(fields["exit_code"]) or bool(fields["signal"])


def epilog_gate_decision(
    config: HookConfig,
    node: str,
    partition: str,
    failed: bool,
    now: float,
    *,
    spooled_at: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bool, str, list[dict[str, Any]]]:
    """Should the epilog fail on ``node``? ``(fail, why, fatal findings)``.

    The same conditions as the prolog's gate (:func:`gate_decision`) with
    ``hooks.epilog_gate`` in place of ``hooks.health_gate``: a fault the sidecar proved on this
    node (never a line of the job's output). A failed Epilog makes slurmd drain the node
    ("Epilog error"), and on Slurm 25.11+ makes slurmctld requeue a ``--requeue=expedite`` job
    at once, which is Slurm's fastest path back to running. When the job ``failed`` and no
    finding is listed yet, the sidecar may not have read the XID that ended it: wait up to
    ``hooks.epilog_gate_wait`` for one, re-reading the file, and no longer than it takes the
    sidecar to read its fault sources once after the job's ``job_end`` reached its spool at
    ``spooled_at`` (its ``fast_read_at``): the fault came before the job's end, so a read after
    it that lists nothing means nothing is coming, and a healthy node's Epilog need not sit out
    the whole wait. Fails open like the prolog's.
    """
    if not config["hooks.epilog_gate"]:
        return False, "epilog gate off", []
    wait = config["hooks.epilog_gate_wait"] if failed else 0.0
    started = clock()
    while True:
        waited = clock() - started
        refuse, why, fatal, health = _judge_health(config, node, partition, now + waited)
        if fatal or waited >= wait or _read_after(health, spooled_at):
            return refuse, why, fatal
        sleep(min(EPILOG_GATE_POLL, wait - waited))


def _read_after(health: Mapping[str, Any] | None, spooled_at: float | None) -> bool:
    """Whether the sidecar read its fault sources after ``spooled_at`` (``fast_read_at``)."""
    if health is None or spooled_at is None:
        return False
    read_at = health.get("fast_read_at")
    return (
        isinstance(read_at, int | float) and not isinstance(read_at, bool) and read_at >= spooled_at
    )


#: Lines, and characters of each, of the site health check's output kept in ``job_start``.
NHC_OUTPUT_LINES = 5
NHC_LINE_CHARS = 200
#: Most bytes of its output read; the rest is left unread (the check still runs to its end).
NHC_OUTPUT_BYTES = 64 * 1024


def run_nhc(path: str, timeout: float, env: Mapping[str, str]) -> dict[str, Any]:
    """Run the site's health check (``hooks.nhc``, LBNL NHC) once with the prolog's environment,
    within ``timeout`` seconds (then its whole process group is killed). Its record, as the
    ``job_start`` event keeps it: ``verdict`` (``pass``: exit 0; ``fail``: another exit;
    ``timeout``, ``absent``, ``error``: it gave no verdict, the gate fails open), ``exit_code``,
    ``output`` (its first lines, stdout and stderr together), ``duration`` (s), ``path``, and
    ``note`` when it gave no verdict."""
    started = time.monotonic()
    record: dict[str, Any] = {"path": path}
    if not os.path.isfile(path):
        return {**record, "verdict": "absent", "duration": 0.0, "note": f"no {path} on this node"}
    import subprocess  # only a gate that runs the check pays for it

    try:
        proc = subprocess.Popen(
            [path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,  # its own process group: a timeout kills all of it
        )
    except OSError as exc:
        return {
            **record,
            "verdict": "error",
            "duration": round(time.monotonic() - started, 3),
            "note": f"cannot run {path}: {exc.strerror or exc}",
        }
    try:
        out, _ = proc.communicate(timeout=timeout)
        verdict, note = ("pass" if proc.returncode == 0 else "fail"), ""
    except subprocess.TimeoutExpired:
        with suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            out, _ = proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:  # a child left its own group and holds the pipe
            out = b""
        verdict, note = "timeout", f"killed after {timeout:g}s"
    record["verdict"] = verdict
    record["exit_code"] = proc.returncode if verdict != "timeout" else None
    text = out[:NHC_OUTPUT_BYTES].decode("utf-8", "replace")
    record["output"] = [
        line.strip()[:NHC_LINE_CHARS] for line in text.splitlines() if line.strip()
    ][:NHC_OUTPUT_LINES]
    record["duration"] = round(time.monotonic() - started, 3)
    if note:
        record["note"] = note
    return record


def nhc_gate(
    config: HookConfig, node: str, partition: str, env: Mapping[str, str]
) -> tuple[bool, str, dict[str, Any]]:
    """The health gate's run of ``hooks.nhc``: ``(refuse, why, record)``. A failed check
    refuses the node like a fatal GPU finding (act mode only); a check that is absent, hangs
    or cannot start refuses nothing."""
    record = run_nhc(config["hooks.nhc"], config["hooks.nhc_timeout"], env)
    verdict = record["verdict"]
    if verdict == "pass":
        return False, "nhc passed", record
    if verdict != "fail":
        return False, f"nhc {verdict} ({record.get('note', '')}): failing open", record
    from slurm_recovery.contract.wire import health_check_failure_line  # not on the hot path

    line = health_check_failure_line(record["output"])
    said = f": {line}" if line else ""
    problem = f"site health check {config['hooks.nhc']} failed (exit {record['exit_code']}){said}"
    refuse, why = refusal_in_act_mode(config, partition, node, problem)
    return refuse, why, record


# --------------------------------------------------------------------------------- the controller


class _deadline:
    """Raise TimeoutError in the block after ``seconds`` (SIGALRM; in the main thread only,
    elsewhere the block has only its own socket timeouts). A timer already running (pytest's,
    say) gets back what is left of it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.armed = False

    def _expire(self, signum: int, frame: Any) -> None:
        raise TimeoutError(f"no answer within {self.seconds:g}s")

    def __enter__(self) -> None:
        try:
            self.previous = signal.signal(signal.SIGALRM, self._expire)
        except ValueError:  # not the main thread
            return
        self.armed = True
        self.started = time.monotonic()
        self.outer = signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc_info: object) -> None:
        if not self.armed:
            return
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)
        delay, interval = self.outer
        if delay:
            left = delay - (time.monotonic() - self.started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), interval)


def post_event(config: HookConfig, event: Mapping[str, Any]) -> None:
    """POST ``event`` to the controller as an operator within ``hooks.controller_timeout``
    (MUNGE signing included); raises on any failure."""
    from slurm_recovery.contract.client import ControllerClient  # ~25 ms: only here

    timeout = config["hooks.controller_timeout"]
    client = ControllerClient(
        config["client.url"],
        munge_socket=config["auth.munge_socket"] or None,
        timeout=timeout,
        ca_file=config["client.ca_file"] or None,
    )
    with _deadline(timeout):
        client.post_evidence([dict(event)], role="operator")


# --------------------------------------------------------------------------------- running a hook


def run_hook(
    hook: str,
    env: Mapping[str, str] | None = None,
    *,
    now: float | None = None,
    config: HookConfig | None = None,
    out: TextIO | None = None,
) -> int:
    """Run ``hook`` for Slurm's environment ``env`` (default ``os.environ``); the exit status.

    0 whatever goes wrong (each problem logged as one line); 1 only when the prolog's health
    gate refuses the node. ``config`` defaults to :func:`load_hook_config` (the file named by
    ``$SRECOVERY_CONFIG``, else /etc/slurm-recovery/config.toml). ``out`` (default stdout)
    gets the TaskProlog's ``export`` lines, and nothing else from any hook.
    """
    env = os.environ if env is None else env
    now = time.time() if now is None else now
    try:
        if hook not in HOOKS:
            raise HookError(f"unknown hook {hook!r}; one of {', '.join(HOOKS)}")
        if config is None:
            config = load_hook_config(env)
        if hook == "task_prolog":
            return _run_task_prolog(config, env, sys.stdout if out is None else out)
        if hook == "epilog_slurmctld":
            return _run_ctld(config, env, now)
        return _run_node(hook, config, env, now)
    except HookConfigError as exc:
        log(hook, f"configuration unusable, {_lost(hook)}: {exc}")
    except HookError as exc:
        log(hook, f"{_lost(hook)}: {exc}")
    except Exception as exc:  # the job must never pay for our bug
        log(hook, f"{_lost(hook)}: unexpected {type(exc).__name__}: {exc}")
    return EXIT_OK


def _lost(hook: str) -> str:
    return "progress file not set" if hook == "task_prolog" else "event dropped"


def _run_node(hook: str, config: HookConfig, env: Mapping[str, str], now: float) -> int:
    node = config.node_name(env)
    event = build_event(hook, env, now, node=node)
    refuse = False
    if hook == "prolog" and config["hooks.health_gate"]:
        partition = env.get("SLURM_JOB_PARTITION", "")
        try:
            refuse, why, fatal = gate_decision(config, node, partition, now)
        except Exception as exc:  # fail open
            refuse, why, fatal = False, f"health gate failed ({exc}): failing open", []
        if not refuse and (fatal or "failing open" in why):
            log(hook, f"job {event['job_id']} allowed on {node}: {why}")
        nhc: dict[str, Any] | None = None
        if config["hooks.nhc"] and not refuse:  # refused already: no need to wait for it
            try:
                refuse, why, nhc = nhc_gate(config, node, partition, env)
            except Exception as exc:  # fail open
                refuse, why = False, f"nhc failed to run ({exc}): failing open"
                nhc = {"path": config["hooks.nhc"], "verdict": "error", "note": str(exc)}
            if nhc["verdict"] != "pass" and not refuse:
                log(hook, f"job {event['job_id']} allowed on {node}: {why}")
        if refuse or nhc is not None:
            gate: dict[str, Any] = {"refused": refuse, "reason": why, "fatal": fatal}
            if nhc is not None:
                gate["nhc"] = nhc
            event["payload"]["health_gate"] = gate
    if hook == "prolog" and not refuse:  # before job_start: the sidecar finds it in place
        make_job_dir(config, env, node, event["job_id"])
    spool = config.sidecar_spool(node)
    spooled_at: float | None = None
    try:
        spool_event(spool, event)
        spooled_at = time.time()
    except OSError as exc:
        log(
            hook, f"job {event['job_id']}: cannot spool the {event['kind']} event in {spool}: {exc}"
        )
    if hook == "epilog" and config["hooks.epilog_gate"]:
        # after the job_end is spooled: the sidecar, reading it, says when it last read the
        # fault sources, which may end a failed job's wait early (epilog_gate_decision)
        partition = env.get("SLURM_JOB_PARTITION", "")
        try:
            refuse, why, fatal = epilog_gate_decision(
                config, node, partition, job_failed(env), now, spooled_at=spooled_at
            )
        except Exception as exc:  # fail open
            refuse, why, fatal = False, f"epilog gate failed ({exc}): failing open", []
        if not refuse and (fatal or "failing open" in why):
            log(hook, f"job {event['job_id']}: epilog passes on {node}: {why}")
    if refuse and hook == "epilog":
        log(hook, f"failing the epilog of job {event['job_id']} so that Slurm drains {node}: {why}")
        return EXIT_REFUSE
    if refuse:
        log(hook, f"refusing job {event['job_id']}: {event['payload']['health_gate']['reason']}")
        return EXIT_REFUSE
    return EXIT_OK


def _job_owner(env: Mapping[str, str]) -> tuple[int, int]:
    """The job user's uid and gid (``SLURM_JOB_UID``/``SLURM_JOB_GID``, which slurmd gives
    the prolog; the user's primary group when the gid is missing)."""
    uid = _int(env.get("SLURM_JOB_UID"))
    if uid is None or uid >= 2**32 - 1:
        raise HookError(f"SLURM_JOB_UID is {env.get('SLURM_JOB_UID')!r}, not a uid")
    gid = _int(env.get("SLURM_JOB_GID"))
    if gid is None or gid >= 2**32 - 1:
        import pwd

        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            raise HookError(f"no SLURM_JOB_GID, and uid {uid} has no passwd entry") from None
    return uid, gid


def make_job_dir(config: HookConfig, env: Mapping[str, str], node: str, job: int) -> str | None:
    """Create the job's directory on this node for the job user (:func:`jobdir.create`); its
    path, or None after logging why not. Never raises: the job starts without it."""
    try:
        uid, gid = _job_owner(env)
        return jobdir.create(config["hooks.job_dir"], node, job, uid, gid)
    except Exception as exc:
        log("prolog", f"job {job}: no job directory on {node} (no progress file): {exc}")
        return None


def task_prolog_lines(config: HookConfig, env: Mapping[str, str]) -> list[str]:
    """What the TaskProlog prints for the task whose environment is ``env``: ``export
    SRECOVERY_PROGRESS_FILE=<job dir>/progress.jsonl`` and, unless the job set its own,
    ``export TORCH_NCCL_DEBUG_INFO_TEMP_FILE=<job dir>/nccl_trace_rank_``. A value that points
    into this job's directory on another node is not the job's own: srun passed on what the
    TaskProlog of the batch step exported, and it is replaced. Raises HookError when the job
    directory is missing or not writable by this user (Slurm does not unquote a value, so the
    path is printed as it is; the config check keeps newlines out of it)."""
    job = job_id(env)
    node = config.node_name(env)
    path = config.job_dir(node, job)
    if not os.path.isdir(path):
        raise HookError(f"job {job}: no job directory {path} (did the prolog run?)")
    if not os.access(path, os.W_OK | os.X_OK):
        raise HookError(f"job {job}: {path} is not writable by uid {os.getuid()}")
    lines = [f"export {jobdir.PROGRESS_ENV}={jobdir.progress_file(path)}"]
    own = env.get(jobdir.NCCL_TRACE_ENV)
    if own is None or jobdir.is_job_path(config["hooks.job_dir"], job, own):
        lines.append(f"export {jobdir.NCCL_TRACE_ENV}={jobdir.nccl_trace_prefix(path)}")
    if any(ord(c) < 0x20 for line in lines for c in line):
        raise HookError(f"job {job}: {path!r} holds a control character")
    return lines


def _run_task_prolog(config: HookConfig, env: Mapping[str, str], out: TextIO) -> int:
    try:
        lines = task_prolog_lines(config, env)
    except HookError as exc:
        log("task_prolog", f"progress file not set: {exc}")
        return EXIT_OK
    out.write("".join(line + "\n" for line in lines))
    out.flush()
    return EXIT_OK


def _run_ctld(config: HookConfig, env: Mapping[str, str], now: float) -> int:
    event = build_event("epilog_slurmctld", env, now)
    try:
        post_event(config, event)
        return EXIT_OK
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
    spool = config["controller.spool_dir"]
    try:
        spool_event(spool, event)
    except OSError as exc:
        log(
            "epilog_slurmctld",
            f"job {event['job_id']}: controller failed ({reason}) and cannot spool in {spool}: "
            f"{exc}; event lost",
        )
        return EXIT_OK
    log("epilog_slurmctld", f"job {event['job_id']}: controller failed ({reason}); spooled")
    return EXIT_OK


def main(hook: str) -> int:
    """Entry point of the hook executables; never raises."""
    try:
        return run_hook(hook)
    except BaseException as exc:  # even KeyboardInterrupt/SystemExit: Slurm gets 0
        with suppress(BaseException):
            log(hook, f"{_lost(hook)}: {type(exc).__name__}: {exc}")
        return EXIT_OK


# --------------------------------------------------------------------------------- wrappers


def source_hooks_dir() -> Path | None:
    """``hooks/`` of the source tree this package was imported from, if there is one."""
    from pathlib import Path

    candidate = Path(__file__).resolve().parent.parent / "hooks"
    if (candidate / SCRIPT_DIRS["prolog"] / SCRIPT_NAMES["prolog"]).is_file():
        return candidate
    return None


def runnable_by_everyone(path: str | os.PathLike[str]) -> bool:
    """Can any user execute ``path``: the file (links resolved) and every directory above it
    open to others? (A job user must run the TaskProlog's Python; a virtual environment
    under a private home is out of reach.)"""
    real = os.path.realpath(path)
    try:
        if not os.stat(real).st_mode & 0o001:
            return False
        folder = os.path.dirname(real)
        while True:
            if not os.stat(folder).st_mode & 0o001:
                return False
            parent = os.path.dirname(folder)
            if parent == folder:
                return True
            folder = parent
    except OSError:
        return False


def python_for_job_users(python: str | os.PathLike[str]) -> str:
    """``python`` when every user can run it, else the system's ``/usr/bin/python3`` when that
    is 3.11 or newer and open to all (the TaskProlog script then imports the package from its
    own source tree), else ``python`` (jobs of other users than its owner get no variables)."""
    import subprocess

    if runnable_by_everyone(python):
        return str(python)
    system = "/usr/bin/python3"
    if runnable_by_everyone(system):
        check = [system, "-I", "-c", "import sys; sys.exit(sys.version_info < (3, 11))"]
        with suppress(OSError, subprocess.SubprocessError):
            if subprocess.run(check, capture_output=True, timeout=30).returncode == 0:
                return system
    return str(python)


def write_hook_wrappers(
    dest_dir: str | os.PathLike[str],
    config_path: str | os.PathLike[str],
    python: str | os.PathLike[str] = sys.executable,
    *,
    user_python: str | os.PathLike[str] | None = None,
) -> dict[str, Path]:
    """Write a small ``/bin/sh`` executable per hook into ``dest_dir`` that sets
    ``SRECOVERY_CONFIG=config_path`` and runs the hook with ``python`` (so a virtual
    environment's package imports). Returns ``{"prolog": path, "epilog": path,
    "epilog_slurmctld": path, "task_prolog": path}``, the values for slurm.conf's Prolog=,
    Epilog=, EpilogSlurmctld= and TaskProlog= (:func:`slurm_conf_lines`). Each wrapper runs
    the source tree's ``hooks/*/srecovery-*`` script when this package comes from a source
    tree, else ``python -m slurm_recovery.hooks HOOK``.

    The TaskProlog runs as the job user, with the job's environment: its wrapper uses
    ``user_python`` (default: :func:`python_for_job_users`), isolated (``-I``: the job's
    PYTHONPATH, PYTHONHOME or user site cannot break it), and exits 0 even when that Python
    cannot start, since a failing TaskProlog fails the task."""
    import shlex
    from pathlib import Path

    dest = Path(dest_dir).absolute()
    dest.mkdir(mode=0o755, parents=True, exist_ok=True)
    config_file = Path(config_path).absolute()
    source = source_hooks_dir()
    if user_python is None:
        user_python = python_for_job_users(python)
    written: dict[str, Path] = {}
    for hook in HOOKS:
        if source is not None:
            target = [str(source / SCRIPT_DIRS[hook] / SCRIPT_NAMES[hook])]
        else:
            target = ["-m", "slurm_recovery.hooks", hook]
        if hook == "task_prolog":
            command = " ".join(shlex.quote(p) for p in (str(user_python), "-I", *target))
            run = f'{command} "$@"\nexit 0\n'
        else:
            command = " ".join(shlex.quote(part) for part in (str(python), *target))
            run = f'exec {command} "$@"\n'
        text = (
            "#!/bin/sh\n"
            "# Written by slurm_recovery.hooks.write_hook_wrappers: the slurm-recovery "
            f"{hook} hook with its config file.\n"
            f"SRECOVERY_CONFIG={shlex.quote(str(config_file))}\n"
            "export SRECOVERY_CONFIG\n"
            f"{run}"
        )
        path = dest / SCRIPT_NAMES[hook]
        tmp = dest / (SCRIPT_NAMES[hook] + ".tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, path)
        written[hook] = path
    return written


def slurm_conf_lines(wrappers: Mapping[str, str | os.PathLike[str]]) -> list[str]:
    """The slurm.conf lines that install the hooks at ``wrappers`` (docs/hooks.md): Prolog,
    Epilog, EpilogSlurmctld, TaskProlog (when given), ``PrologFlags=Alloc`` (run the prolog
    on every node at allocation) and ``SchedulerParameters=nohold_on_prolog_fail`` (a job the
    health gate refused is requeued, not held)."""
    return [
        *(f"{SLURM_CONF_KEYS[hook]}={wrappers[hook]}" for hook in HOOKS if hook in wrappers),
        "PrologFlags=Alloc",
        "SchedulerParameters=nohold_on_prolog_fail",
    ]


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in HOOKS:
        print(f"usage: python -m slurm_recovery.hooks {{{','.join(HOOKS)}}}", file=sys.stderr)
        sys.exit(EXIT_OK)
    sys.exit(main(sys.argv[1]))
