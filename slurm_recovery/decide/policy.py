"""The decision policy (``/etc/slurm-recovery/policy.toml``): what to do with each incident.

Loading the file is this module's only I/O; the result is a frozen :class:`Policy` that the pure
``advise`` and ``attribute`` functions read. Every key, its default and its meaning are listed in
:data:`KEYS`; docs/policy.md and etc/policy.toml document each one (a unit test holds them to it).
Every problem becomes a :class:`PolicyError` naming the file, the dotted key, what is wrong and
how to fix it; unknown keys are errors with a did-you-mean, never ignored.
"""

from __future__ import annotations

import difflib
import math
import os
import stat
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from slurm_recovery.config import ConfigError, did_you_mean, parse_duration
from slurm_recovery.decide.model import Action, FaultClass, Mode

#: Where the RPM installs the policy; ``controller.policy`` in config.toml may name another.
DEFAULT_POLICY_PATH = Path("/etc/slurm-recovery/policy.toml")


class PolicyError(ConfigError):
    """The policy cannot be used. One line per problem, each naming file, key, problem and fix."""


# --------------------------------------------------------------------------------- the value


@dataclass(frozen=True)
class ClassPolicy:
    """What to do with a verdict of one fault class."""

    action: Action
    #: drain the implicated nodes (not only exclude them from this job's next attempt)
    drain: bool = False
    #: ... but only when the verdict's confidence is at least this
    drain_min_confidence: float = 0.9


@dataclass(frozen=True)
class BlastRadius:
    """The most nodes the tool may drain within ``window`` seconds, in all and per partition."""

    max_nodes: int = 4
    max_percent: float = 10.0
    window: float = 3600.0


@dataclass(frozen=True)
class EvidenceWindow:
    """Node evidence counts from ``window_before`` before a failure to ``window_after`` after.
    A crash no node evidence explains yet is decided only ``settle`` seconds after it: its
    node's XID or its last log lines may still be on their way from the sidecar."""

    window_before: float = 600.0
    window_after: float = 300.0
    settle: float = 2.0


@dataclass(frozen=True)
class HangPolicy:
    """When a running job that stopped making progress is hung (``decide.hang``).

    The deadline adapts to the job: ``interval_multiple`` times the median of its last
    ``recent_intervals`` intervals between progress reports, at least ``longest_gap_multiple``
    times the longest pause the attempt already came back from, clamped to [floor, ceiling].
    Before the first progress report the deadline is ``startup_grace`` after the start.
    """

    interval_multiple: float = 10.0
    floor: float = 60.0
    ceiling: float = 1800.0
    recent_intervals: int = 20
    longest_gap_multiple: float = 1.5
    startup_grace: float = 1800.0
    gpu_idle: float = 900.0


@dataclass(frozen=True)
class StragglerPolicy:
    """When a running job is a straggler (``decide.straggler``): its throughput, measured over
    ``rate_interval`` steps of time, stayed at least ``drop_percent`` below the median of the
    ``baseline_window`` before the drop for ``min_duration``. A rank whose own work per step
    takes ``rank_lag_percent`` longer than the other ranks' median lags (and names its node)."""

    baseline_window: float = 600.0
    drop_percent: float = 20.0
    min_duration: float = 180.0
    rate_interval: float = 30.0
    rank_lag_percent: float = 20.0
    restart: bool = True
    drain: bool = False


#: Fault classes whose verdicts may implicate nodes (and so may drain them).
NODE_CLASSES = (FaultClass.HARDWARE, FaultClass.SYSTEM)

DEFAULT_CLASSES: Mapping[FaultClass, ClassPolicy] = MappingProxyType(
    {
        FaultClass.HARDWARE: ClassPolicy(Action.REQUEUE_EXCLUDE, drain=True),
        FaultClass.SYSTEM: ClassPolicy(Action.REQUEUE_EXCLUDE, drain=False),
        FaultClass.APPLICATION: ClassPolicy(Action.STOP),
        FaultClass.UNKNOWN: ClassPolicy(Action.REQUEUE),
    }
)


def _no_partitions() -> Mapping[str, Mode]:
    return MappingProxyType({})


def _default_classes() -> Mapping[FaultClass, ClassPolicy]:
    return DEFAULT_CLASSES


@dataclass(frozen=True)
class Policy:
    """The policy in force. ``Policy()`` is the shipped default (etc/policy.toml)."""

    mode: Mode = Mode.MONITOR
    partition_modes: Mapping[str, Mode] = field(default_factory=_no_partitions)
    max_restarts: int = 3
    max_excluded_nodes: int = 2
    #: a restarted job that fails again with the same cause, no node implicated, is stopped
    stop_on_same_failure: bool = True
    #: an application or contained XID logged this many times on one GPU in a day implicates
    #: the GPU's node (0: never)
    xid_repeats: int = 3
    do_not_requeue_exit_codes: frozenset[int] = frozenset({93})
    #: an interactive (srun/salloc) job that needs a restart, which Slurm cannot requeue:
    #: "leave" it to end on its own, or "cancel" it
    interactive_jobs: str = "leave"
    classes: Mapping[FaultClass, ClassPolicy] = field(default_factory=_default_classes)
    blast_radius: BlastRadius = field(default_factory=BlastRadius)
    fatal_evidence_window: EvidenceWindow = field(default_factory=EvidenceWindow)
    hang: HangPolicy = field(default_factory=HangPolicy)
    straggler: StragglerPolicy = field(default_factory=StragglerPolicy)
    #: the file it came from, for messages; not part of the value
    source: str = field(default="<defaults>", compare=False)

    def mode_for(self, partition: str) -> Mode:
        """The mode for a job in ``partition``; a job pending in several (``"a,b"``) acts only
        when every one of them is in act mode."""
        names = [p.strip() for p in partition.split(",") if p.strip()] or [""]
        modes = {self.partition_modes.get(name, self.mode) for name in names}
        return Mode.ACT if modes == {Mode.ACT} else Mode.MONITOR

    def for_class(self, fault_class: FaultClass) -> ClassPolicy:
        return self.classes.get(fault_class) or DEFAULT_CLASSES[fault_class]


# --------------------------------------------------------------------------------- the schema


@dataclass(frozen=True)
class Key:
    """One policy key: dotted name as written in the file, type, default (TOML), meaning."""

    dotted: str
    type: str
    default: Any
    doc: str


_CLASS_DOC = {
    FaultClass.HARDWARE: "the GPU, its memory, NVLink, PCIe, or an operator's report",
    FaultClass.SYSTEM: "node software: driver, GPU firmware, a node Slurm lost",
    FaultClass.APPLICATION: "the job's own code or data",
    FaultClass.UNKNOWN: "no evidence either way",
}

#: Every key there is. ``partitions.NAME.mode`` stands for any partition name.
KEYS: tuple[Key, ...] = (
    Key(
        "mode",
        "one of monitor, act",
        "monitor",
        "Mode of partitions not listed under [partitions]. monitor: advice is recorded and "
        "published, Slurm is never touched. act: the advice is carried out.",
    ),
    Key(
        "max_restarts",
        "whole number, 0 or more",
        3,
        "Most times the tool restarts one job (counted over the job's whole history by the "
        "controller: Slurm keeps no such count). When reached, the job is stopped.",
    ),
    Key(
        "max_excluded_nodes",
        "whole number, 0 or more",
        2,
        "Most nodes one job may have excluded (its existing ExcNodeList included). A restart "
        "that would exclude more stops the job and asks for an operator.",
    ),
    Key(
        "stop_on_same_failure",
        "true or false",
        True,
        "true: a job the tool restarted that fails again with the same cause, and no node "
        "implicated, is stopped: the application's fault, a restart would fail the same way.",
    ),
    Key(
        "xid_repeats",
        "whole number, 0 or more",
        3,
        "An application or contained XID (13, 31, 94...) logged on one GPU in this many separate "
        "episodes within 24 hours, while the job's other GPUs ran clean, implicates the GPU's "
        "node (a weak hardware finding). 0 = never.",
    ),
    Key(
        "do_not_requeue_exit_codes",
        "list of exit codes 0-255",
        [93],
        "A job that exits with one of these codes is never restarted (93 is NVIDIA "
        "Resiliency Extension's 'do not requeue').",
    ),
    Key(
        "interactive_jobs",
        "one of leave, cancel",
        "leave",
        "An interactive job (srun or salloc, not sbatch) that a fault would restart: Slurm "
        "cannot requeue it. leave: its nodes are still drained as advised and it gets the "
        "advice, but it runs on until it ends on its own. cancel: it is cancelled, the reason "
        "in its AdminComment.",
    ),
    Key(
        "partitions.NAME.mode",
        "one of monitor, act",
        "monitor",
        "Mode of the partition NAME; overrides the top-level mode.",
    ),
    *(
        key
        for fault_class in FaultClass
        for key in (
            Key(
                f"classes.{fault_class}.action",
                "one of requeue_exclude, requeue, stop, none",
                str(DEFAULT_CLASSES[fault_class].action),
                f"What to do with a {fault_class} verdict ({_CLASS_DOC[fault_class]}). "
                "requeue_exclude: restart away from the implicated nodes; requeue: restart "
                "anywhere; stop: do not restart; none: record the advice only.",
            ),
            *(
                (
                    Key(
                        f"classes.{fault_class}.drain",
                        "true or false",
                        DEFAULT_CLASSES[fault_class].drain,
                        f"Drain the nodes a {fault_class} verdict implicates, so no job lands "
                        "on them, besides excluding them from this job.",
                    ),
                    Key(
                        f"classes.{fault_class}.drain_min_confidence",
                        "number from 0 to 1",
                        DEFAULT_CLASSES[fault_class].drain_min_confidence,
                        "Drain only when the verdict's confidence is at least this.",
                    ),
                )
                if fault_class in NODE_CLASSES
                else ()
            ),
        )
    ),
    Key(
        "blast_radius.max_nodes",
        "whole number, 0 or more",
        4,
        "Most nodes the tool may drain within the window, cluster-wide. Past it nothing more "
        "is drained and the advice says it needs an operator.",
    ),
    Key(
        "blast_radius.max_percent",
        "number from 0 to 100",
        10.0,
        "Most nodes of any one partition the tool may drain within the window, in percent "
        "of the partition's nodes.",
    ),
    Key(
        "blast_radius.window",
        "duration, more than 0",
        "1h",
        "The window for the two caps above: drains by the tool this recent count.",
    ),
    Key(
        "fatal_evidence_window.window_before",
        "duration",
        "10m",
        "Node evidence up to this long before a failure can explain it.",
    ),
    Key(
        "fatal_evidence_window.window_after",
        "duration",
        "5m",
        "Node evidence up to this long after a failure can explain it (reports arrive late).",
    ),
    Key(
        "fatal_evidence_window.settle",
        "duration, at most 1 minute",
        "2s",
        "A crash no node evidence explains yet is decided this long after it, not before: the "
        "node's XID or the job's last log lines may still be on their way.",
    ),
    Key(
        "hang.interval_multiple",
        "number from 1 to 1000",
        10.0,
        "A running job is hung when it made no progress for this many times its recent median "
        "interval between progress reports (then clamped to floor and ceiling).",
    ),
    Key(
        "hang.floor",
        "duration, more than 0",
        "1m",
        "The shortest no-progress deadline, whatever the job's step interval.",
    ),
    Key(
        "hang.ceiling",
        "duration, at least hang.floor",
        "30m",
        "The longest no-progress deadline, whatever the job's step interval.",
    ),
    Key(
        "hang.recent_intervals",
        "whole number, 1 or more",
        20,
        "The median interval is taken over this many of the job's latest intervals between "
        "progress reports.",
    ),
    Key(
        "hang.longest_gap_multiple",
        "number from 0 to 1000",
        1.5,
        "The deadline is also at least this many times the longest pause the attempt already "
        "came back from (a checkpoint save, an evaluation). 0 turns this off.",
    ),
    Key(
        "hang.startup_grace",
        "duration, more than 0",
        "30m",
        "A job that has reported no progress yet is hung this long after it started.",
    ),
    Key(
        "hang.gpu_idle",
        "duration, more than 0",
        "15m",
        "A job that reports no step progress at all is hung when its GPUs, busy before, have "
        "been idle on every node this long (the sidecar's gpu_activity).",
    ),
    Key(
        "straggler.baseline_window",
        "duration, more than 0",
        "10m",
        "The job's baseline throughput is its median over this long before the drop.",
    ),
    Key(
        "straggler.drop_percent",
        "number from 0 to 100 (more than 0)",
        20.0,
        "A drop of at least this many percent below the baseline counts.",
    ),
    Key(
        "straggler.min_duration",
        "duration, more than 0",
        "3m",
        "The drop must last this long before the job is reported as a straggler.",
    ),
    Key(
        "straggler.rate_interval",
        "duration, more than 0",
        "30s",
        "Throughput is measured over consecutive intervals of this length.",
    ),
    Key(
        "straggler.rank_lag_percent",
        "number from 0 to 1000 (more than 0)",
        20.0,
        "A rank whose own work per step takes this many percent longer than the median of the "
        "other ranks lags, and its node is named.",
    ),
    Key(
        "straggler.restart",
        "true or false",
        True,
        "true: a straggler whose slowdown a node explains is requeued away from that node "
        "(within max_restarts and max_excluded_nodes). false: it is only reported. A straggler "
        "that no node explains is always only reported.",
    ),
    Key(
        "straggler.drain",
        "true or false",
        False,
        "true: the node that explains a straggler is also drained (within the blast radius and "
        "the class's drain_min_confidence). Off by default: throttling is often transient.",
    ),
)

_TOP_LEVEL = (
    "mode",
    "max_restarts",
    "max_excluded_nodes",
    "stop_on_same_failure",
    "xid_repeats",
    "do_not_requeue_exit_codes",
    "interactive_jobs",
)
_SECTIONS = ("partitions", "classes", "blast_radius", "fatal_evidence_window", "hang", "straggler")
_NODE_CLASS_KEYS = ("action", "drain", "drain_min_confidence")
_CLASS_KEYS = {
    fault_class: _NODE_CLASS_KEYS if fault_class in NODE_CLASSES else ("action",)
    for fault_class in FaultClass
}
_SECTION_KEYS = {
    "blast_radius": ("max_nodes", "max_percent", "window"),
    "fatal_evidence_window": ("window_before", "window_after", "settle"),
    "hang": (
        "interval_multiple",
        "floor",
        "ceiling",
        "recent_intervals",
        "longest_gap_multiple",
        "startup_grace",
        "gpu_idle",
    ),
    "straggler": (
        "baseline_window",
        "drop_percent",
        "min_duration",
        "rate_interval",
        "rank_lag_percent",
        "restart",
        "drain",
    ),
}


# --------------------------------------------------------------------------------- validators

Validator = Callable[[Any], Any]


def _choice(*options: str) -> Validator:
    listed = ", ".join(options)

    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f'must be a quoted string, one of {listed} (e.g. "{options[0]}")')
        if value.lower() in options:
            return value.lower()
        raise ValueError(f"must be one of {listed}{did_you_mean(value.lower(), options)}")

    return check


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("must be a whole number (0, 1, 2, ...), without quotes")
    if value < 0:
        raise ValueError("cannot be negative; write 0 or more")
    return value


def _bounded_number(low: float, high: float) -> Validator:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"must be a number from {low:g} to {high:g}, without quotes")
        number = float(value)
        if math.isnan(number) or not low <= number <= high:
            raise ValueError(f"must be from {low:g} to {high:g}")
        return number

    return check


def _positive_count(value: Any) -> int:
    count = _count(value)
    if count < 1:
        raise ValueError("must be 1 or more")
    return count


def _positive_number(high: float) -> Validator:
    bounded = _bounded_number(0.0, high)

    def check(value: Any) -> float:
        number = bounded(value)
        if number <= 0:
            raise ValueError(f"must be more than 0 (and at most {high:g})")
        return number

    return check


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false, without quotes")
    return value


def _exit_codes(value: Any) -> frozenset[int]:
    if not isinstance(value, list):
        raise ValueError("must be a list of exit codes, e.g. [93] (or [] for none)")
    codes = set()
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item <= 255:
            raise ValueError(f"{item!r} is not an exit code; exit codes are whole numbers 0-255")
        codes.add(item)
    return frozenset(codes)


def _duration(value: Any) -> float:
    return parse_duration(value)


def _duration_above_zero(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError('must be more than 0 seconds, e.g. "1h"')
    return seconds


def _duration_at_most(limit: float) -> Validator:
    def check(value: Any) -> float:
        seconds = parse_duration(value)
        if seconds > limit:
            raise ValueError(f"must be at most {limit:g} seconds: recovery waits this long")
        return seconds

    return check


_mode = _choice(*(m.value for m in Mode))
_action = _choice("requeue_exclude", "requeue", "stop", "none")

_VALIDATORS: Mapping[str, Validator] = MappingProxyType(
    {
        "mode": _mode,
        "max_restarts": _count,
        "max_excluded_nodes": _count,
        "stop_on_same_failure": _bool,
        "xid_repeats": _count,
        "do_not_requeue_exit_codes": _exit_codes,
        "interactive_jobs": _choice("leave", "cancel"),
        "action": _action,
        "drain": _bool,
        "drain_min_confidence": _bounded_number(0.0, 1.0),
        "max_nodes": _count,
        "max_percent": _bounded_number(0.0, 100.0),
        "window": _duration_above_zero,
        "window_before": _duration,
        "window_after": _duration,
        "settle": _duration_at_most(60.0),
        "interval_multiple": _bounded_number(1.0, 1000.0),
        "floor": _duration_above_zero,
        "ceiling": _duration_above_zero,
        "recent_intervals": _positive_count,
        "longest_gap_multiple": _bounded_number(0.0, 1000.0),
        "startup_grace": _duration_above_zero,
        "gpu_idle": _duration_above_zero,
        "baseline_window": _duration_above_zero,
        "drop_percent": _positive_number(100.0),
        "min_duration": _duration_above_zero,
        "rate_interval": _duration_above_zero,
        "rank_lag_percent": _positive_number(1000.0),
        "restart": _bool,
    }
)


# --------------------------------------------------------------------------------- loading


def load_policy(path: str | os.PathLike[str] = DEFAULT_POLICY_PATH) -> Policy:
    """Read and check the policy file at ``path``. Raises :class:`PolicyError`."""
    file = Path(path)
    try:
        with open(file, "rb") as fh:
            st = os.fstat(fh.fileno())
            if st.st_mode & stat.S_IWOTH:
                raise PolicyError(
                    f"{file}: world-writable (mode {stat.S_IMODE(st.st_mode):04o}): any user "
                    f"could change which jobs are restarted and which nodes drained; "
                    f"fix: chmod o-w {file}"
                )
            _refuse_writable_folder(file)
            raw = fh.read()
    except FileNotFoundError:
        raise PolicyError(
            f"{file}: no such file; check controller.policy in config.toml, or install the "
            "default policy (etc/policy.toml; docs/policy.md lists every key)"
        ) from None
    except IsADirectoryError:
        raise PolicyError(f"{file}: is a directory; name the policy file itself") from None
    except PermissionError:
        raise PolicyError(
            f"{file}: permission denied; run as a user that can read it (root), or chmod o+r {file}"
        ) from None
    except OSError as exc:
        raise PolicyError(f"{file}: cannot read it: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise PolicyError(
            f"{file}:{line}: not UTF-8 text; TOML files must be UTF-8 (convert it with iconv)"
        ) from None
    return policy_from_toml(text, str(file))


def _refuse_writable_folder(file: Path) -> None:
    """A world-writable folder (without the sticky bit) lets anyone replace the file."""
    folder = os.path.dirname(os.path.realpath(file))
    try:
        st = os.stat(folder)
    except OSError:
        return
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise PolicyError(
            f"{file}: its directory {folder} is world-writable (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): any user could replace the policy; "
            f"fix: chmod o-w {folder}"
        )


def policy_from_toml(text: str, source: str = "<string>") -> Policy:
    """Parse and check policy ``text``; ``source`` names it in every error."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        problem = f"{source}: invalid TOML: {exc}"
        if str(exc).startswith("Invalid value"):
            problem += '; strings must be quoted, e.g. mode = "act"'
        raise PolicyError(problem) from None
    return policy_from_dict(data, source)


def policy_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> Policy:
    """Check ``data`` (parsed TOML) and build the :class:`Policy`. Lists every problem at once."""
    problems: list[str] = []
    top: dict[str, Any] = {}
    partitions: dict[str, Mode] = {}
    classes: dict[FaultClass, ClassPolicy] = dict(DEFAULT_CLASSES)
    sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTION_KEYS}

    def check(dotted: str, name: str, value: Any) -> Any:
        try:
            return _VALIDATORS[name](value)
        except ValueError as exc:
            problems.append(f"{source}: {dotted} = {value!r}: {exc}")
            return None

    for name, value in data.items():
        if name in _TOP_LEVEL:
            checked = check(name, name, value)
            if checked is not None:
                top[name] = checked
        elif name not in _SECTIONS:
            problems.append(_unknown_top_level(source, name, value))
        elif not isinstance(value, Mapping):
            problems.append(
                f"{source}: {name} = {value!r}: {name} is a section; write [{name}] (or "
                f"[{name}.NAME]) on a line of its own and its keys below it"
            )
        elif name == "partitions":
            _partitions(source, value, partitions, problems, check)
        elif name == "classes":
            _classes(source, value, classes, problems, check)
        else:
            for key, item in value.items():
                if key not in _SECTION_KEYS[name]:
                    problems.append(_unknown_key(source, name, key, _SECTION_KEYS[name]))
                    continue
                checked = check(f"{name}.{key}", key, item)
                if checked is not None:
                    sections[name][key] = checked
    _check_hang_bounds(source, sections["hang"], problems)
    if problems:
        raise PolicyError(*problems)
    return Policy(
        mode=Mode(top.get("mode", Mode.MONITOR)),
        partition_modes=MappingProxyType(dict(sorted(partitions.items()))),
        max_restarts=top.get("max_restarts", Policy.max_restarts),
        max_excluded_nodes=top.get("max_excluded_nodes", Policy.max_excluded_nodes),
        stop_on_same_failure=top.get("stop_on_same_failure", Policy.stop_on_same_failure),
        xid_repeats=top.get("xid_repeats", Policy.xid_repeats),
        do_not_requeue_exit_codes=top.get(
            "do_not_requeue_exit_codes", Policy.do_not_requeue_exit_codes
        ),
        interactive_jobs=top.get("interactive_jobs", Policy.interactive_jobs),
        classes=MappingProxyType(classes),
        blast_radius=BlastRadius(**sections["blast_radius"]),
        fatal_evidence_window=EvidenceWindow(**sections["fatal_evidence_window"]),
        hang=HangPolicy(**sections["hang"]),
        straggler=StragglerPolicy(**sections["straggler"]),
        source=source,
    )


def _check_hang_bounds(source: str, hang: Mapping[str, Any], problems: list[str]) -> None:
    floor = hang.get("floor", HangPolicy.floor)
    ceiling = hang.get("ceiling", HangPolicy.ceiling)
    if floor > ceiling:
        problems.append(
            f"{source}: hang.ceiling = {ceiling:g}s is below hang.floor = {floor:g}s: the "
            "deadline would have no room; raise hang.ceiling or lower hang.floor"
        )


def _partitions(
    source: str,
    table: Mapping[str, Any],
    partitions: dict[str, Mode],
    problems: list[str],
    check: Callable[[str, str, Any], Any],
) -> None:
    for partition, keys in table.items():
        where = f"partitions.{partition}"
        if not isinstance(keys, Mapping):
            problems.append(
                f'{source}: {where} = {keys!r}: write [partitions.{partition}] and mode = "act" '
                '(or "monitor") below it'
            )
            continue
        if not partition or "," in partition or any(c.isspace() for c in partition):
            problems.append(
                f"{source}: [{where}]: {partition!r} is not a Slurm partition name; name one "
                "partition per table, as sinfo shows it"
            )
            continue
        for key, value in keys.items():
            if key != "mode":
                problems.append(_unknown_key(source, where, key, ("mode",)))
                continue
            mode = check(f"{where}.mode", "mode", value)
            if mode is not None:
                partitions[partition] = Mode(mode)


def _classes(
    source: str,
    table: Mapping[str, Any],
    classes: dict[FaultClass, ClassPolicy],
    problems: list[str],
    check: Callable[[str, str, Any], Any],
) -> None:
    names = [c.value for c in FaultClass]
    for name, keys in table.items():
        if name not in names:
            problems.append(
                f"{source}: [classes.{name}]: unknown fault class"
                f"{did_you_mean(name, names)} (classes: {', '.join(names)})"
            )
            continue
        fault_class = FaultClass(name)
        where = f"classes.{name}"
        if not isinstance(keys, Mapping):
            problems.append(
                f"{source}: {where} = {keys!r}: write [{where}] on a line of its own and "
                'action = "..." below it'
            )
            continue
        values: dict[str, Any] = {}
        allowed = _CLASS_KEYS[fault_class]
        for key, value in keys.items():
            if key not in allowed:
                if key in ("drain", "drain_min_confidence"):
                    problems.append(
                        f"{source}: {where}.{key}: not allowed: a verdict of class {name} "
                        "never implicates a node, so there is nothing to drain; remove the key"
                    )
                else:
                    problems.append(_unknown_key(source, where, key, allowed))
                continue
            checked = check(f"{where}.{key}", key, value)
            if checked is not None:
                values[key] = Action(checked) if key == "action" else checked
        default = DEFAULT_CLASSES[fault_class]
        classes[fault_class] = ClassPolicy(
            action=values.get("action", default.action),
            drain=values.get("drain", default.drain),
            drain_min_confidence=values.get("drain_min_confidence", default.drain_min_confidence),
        )


def _all_dotted() -> list[str]:
    return [key.dotted for key in KEYS]


def _closest_key(name: str, section: str, allowed: Any) -> str | None:
    """The dotted key a misspelt ``name`` most likely meant: same section first on a tie."""
    candidates = [(f"{section}.{key}", key, True) for key in allowed]
    candidates += [(d, d.rsplit(".", 1)[-1], False) for d in _all_dotted()]
    scored = [
        (difflib.SequenceMatcher(None, name, last).ratio(), here, dotted)
        for dotted, last, here in candidates
    ]
    ratio, _, dotted = max(scored)
    return dotted if ratio >= 0.6 else None


def _unknown_key(source: str, section: str, name: str, allowed: Any) -> str:
    allowed = list(allowed)
    guess = _closest_key(name, section, allowed)
    hint = f"; did you mean {guess}?" if guess else ""
    if guess and "." not in guess:
        hint = f"; did you mean {guess}? (a top-level key: write it above the first [section])"
    return (
        f"{source}: {section}.{name}: unknown key{hint} (keys of [{section}]: {', '.join(allowed)})"
    )


def _unknown_top_level(source: str, name: str, value: Any) -> str:
    if isinstance(value, Mapping):
        close = difflib.get_close_matches(name, list(_SECTIONS), n=1)
        hint = f"; did you mean [{close[0]}]?" if close else ""
        return f"{source}: [{name}]: unknown section{hint} (sections: {', '.join(_SECTIONS)})"
    elsewhere = [d for d in _all_dotted() if d.rsplit(".", 1)[-1] == name]
    close = difflib.get_close_matches(name, list(_TOP_LEVEL), n=1)
    if elsewhere:
        hint = f"; did you mean {elsewhere[0]}? (write it under [{elsewhere[0].rsplit('.', 1)[0]}])"
    elif close:
        hint = f"; did you mean {close[0]}?"
    else:
        hint = ""
    return (
        f"{source}: {name}: unknown key{hint} (top-level keys: {', '.join(_TOP_LEVEL)}; "
        f"sections: {', '.join(_SECTIONS)})"
    )
