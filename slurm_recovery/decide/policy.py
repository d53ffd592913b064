"""The decision policy (``/etc/slurm-recovery/policy.toml``): what to do with each incident.

Loading the file is this module's only I/O; the result is a frozen :class:`Policy` that the pure
``advise`` and ``attribute`` functions read. The file's shape is one msgspec schema
(:class:`_PolicyFile` and its tables, see :mod:`slurm_recovery.schema`); :data:`KEYS`, read
from it, lists every key and its default so a unit test holds docs/policy.md and
etc/policy.toml (which say what each key means) to it. Every problem becomes a
:class:`PolicyError` naming the file, the line, the dotted key, what is wrong and how to fix
it; unknown keys are errors with a did-you-mean, also across tables.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Self

import msgspec

from slurm_recovery.contract.durations import format_duration, parse_duration
from slurm_recovery.contract.settings import (
    POLICY_STAKES,
    SettingsError,
    mode_for,
    refuse_if_others_can_write,
)
from slurm_recovery.decide.model import Action, FaultClass, Mode
from slurm_recovery.schema import (
    Choice,
    Duration,
    KeyPath,
    PositiveDuration,
    SchemaError,
    convert,
    dotted,
    find_line,
    parse_toml,
    read_toml,
    suggest_key,
)

#: Where the RPM installs the policy; ``controller.policy`` in config.toml may name another.
DEFAULT_POLICY_PATH = Path("/etc/slurm-recovery/policy.toml")


class PolicyError(SchemaError):
    """The policy cannot be used. One line per problem, each naming file, key, problem and fix."""


# --------------------------------------------------------------------------------- value types


class ModeName(Choice):
    OPTIONS = tuple(m.value for m in Mode)


class ActionName(Choice):
    OPTIONS = tuple(a.value for a in Action)


class InteractiveJobs(Choice):
    OPTIONS = ("leave", "cancel")


class Unplaceable(Choice):
    OPTIONS = ("wait", "stop")


class SettleDuration(Duration):
    """How long a crash waits for late node evidence: recovery waits this long, so short."""

    LABEL = "duration, at most 1 minute"

    @classmethod
    def check(cls, value: Any) -> Self:
        seconds = parse_duration(value)
        if seconds > 60:
            raise ValueError("must be at most 60 seconds: recovery waits this long")
        return cls(seconds)


Count = Annotated[int, msgspec.Meta(ge=0)]
ExitCode = Annotated[int, msgspec.Meta(ge=0, le=255)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]
Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]

#: Options of each table of the file: a misspelt key is an error, a loaded value is frozen.
_TABLE: dict[str, Any] = {"forbid_unknown_fields": True, "frozen": True}


# --------------------------------------------------------------------------------- the value
#
# The sections are both the schema of their [table] and the value the decision core reads
# (positional, as the tests and the core build them).


class BlastRadius(msgspec.Struct, **_TABLE):
    """The most nodes the tool may drain within ``window`` seconds, in all and per partition."""

    max_nodes: Count = 4
    max_percent: Percent = 10.0
    window: PositiveDuration = PositiveDuration(3600.0)


class EvidenceWindow(msgspec.Struct, **_TABLE):
    """Node evidence counts from ``window_before`` before a failure to ``window_after`` after.
    A crash no node evidence explains yet is decided only ``settle`` seconds after it: its
    node's XID or its last log lines may still be on their way from the sidecar."""

    window_before: Duration = Duration(600.0)
    window_after: Duration = Duration(300.0)
    settle: SettleDuration = SettleDuration(2.0)


class HangPolicy(msgspec.Struct, **_TABLE):
    """When a running job that stopped making progress is hung (``decide.hang``).

    The deadline adapts to the job: ``interval_multiple`` times the median of its last
    ``recent_intervals`` intervals between progress reports, at least ``longest_gap_multiple``
    times the longest pause the attempt already came back from, clamped to [floor, ceiling].
    Before the first progress report the deadline is ``startup_grace`` after the start.
    """

    interval_multiple: Annotated[float, msgspec.Meta(ge=1, le=1000)] = 10.0
    floor: PositiveDuration = PositiveDuration(60.0)
    ceiling: PositiveDuration = PositiveDuration(1800.0)
    recent_intervals: Annotated[int, msgspec.Meta(ge=1)] = 20
    longest_gap_multiple: Annotated[float, msgspec.Meta(ge=0, le=1000)] = 1.5
    startup_grace: PositiveDuration = PositiveDuration(1800.0)
    gpu_idle: PositiveDuration = PositiveDuration(900.0)


class StragglerPolicy(msgspec.Struct, **_TABLE):
    """When a running job is a straggler (``decide.straggler``): its throughput, measured over
    ``rate_interval`` steps of time, stayed at least ``drop_percent`` below the median of the
    ``baseline_window`` before the drop for ``min_duration``. A rank whose own work per step
    takes ``rank_lag_percent`` longer than the other ranks' median lags (and names its node)."""

    baseline_window: PositiveDuration = PositiveDuration(600.0)
    drop_percent: Annotated[float, msgspec.Meta(gt=0, le=100)] = 20.0
    min_duration: PositiveDuration = PositiveDuration(180.0)
    rate_interval: PositiveDuration = PositiveDuration(30.0)
    rank_lag_percent: Annotated[float, msgspec.Meta(gt=0, le=1000)] = 20.0
    restart: bool = True
    drain: bool = False


@dataclass(frozen=True)
class ClassPolicy:
    """What to do with a verdict of one fault class."""

    action: Action
    #: drain the implicated nodes (not only exclude them from this job's next attempt)
    drain: bool = False
    #: ... but only when the verdict's confidence is at least this
    drain_min_confidence: float = 0.9


class _ClassTable(msgspec.Struct, kw_only=True, **_TABLE):
    """``[classes.CLASS]`` of a class whose verdicts never implicate a node: nothing to drain."""

    action: ActionName

    def class_policy(self) -> ClassPolicy:
        return ClassPolicy(Action(self.action))


class _NodeClassTable(_ClassTable, kw_only=True):
    """``[classes.CLASS]`` of a class whose verdicts may implicate nodes (and drain them)."""

    drain: bool = False
    drain_min_confidence: Fraction = 0.9

    def class_policy(self) -> ClassPolicy:
        return ClassPolicy(Action(self.action), self.drain, self.drain_min_confidence)


class _Hardware(_NodeClassTable, kw_only=True):
    action: ActionName = ActionName(Action.REQUEUE_EXCLUDE)
    drain: bool = True


class _System(_NodeClassTable, kw_only=True):
    action: ActionName = ActionName(Action.REQUEUE_EXCLUDE)


class _Application(_ClassTable, kw_only=True):
    action: ActionName = ActionName(Action.STOP)


class _Unknown(_ClassTable, kw_only=True):
    action: ActionName = ActionName(Action.REQUEUE)


class _ClassTables(msgspec.Struct, kw_only=True, **_TABLE):
    """``[classes]``: one table per fault class, each with that class's defaults."""

    hardware: _Hardware = _Hardware()
    system: _System = _System()
    application: _Application = _Application()
    unknown: _Unknown = _Unknown()

    def by_class(self) -> Mapping[FaultClass, ClassPolicy]:
        return MappingProxyType({c: getattr(self, c.value).class_policy() for c in FaultClass})


#: Fault classes whose verdicts may implicate nodes (and so may drain them).
NODE_CLASSES = (FaultClass.HARDWARE, FaultClass.SYSTEM)

DEFAULT_CLASSES: Mapping[FaultClass, ClassPolicy] = _ClassTables().by_class()


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
    #: a job the exclusions leave too few usable nodes: "wait" (requeue it excluding them,
    #: flagged as needing an operator) or "stop" it (decide/placement.py)
    unplaceable: str = "wait"
    classes: Mapping[FaultClass, ClassPolicy] = field(default_factory=_default_classes)
    blast_radius: BlastRadius = field(default_factory=BlastRadius)
    fatal_evidence_window: EvidenceWindow = field(default_factory=EvidenceWindow)
    hang: HangPolicy = field(default_factory=HangPolicy)
    straggler: StragglerPolicy = field(default_factory=StragglerPolicy)
    #: the file it came from, for messages; not part of the value
    source: str = field(default="<defaults>", compare=False)

    def mode_for(self, partition: str) -> Mode:
        """The mode for a job in ``partition``; a job pending in several (``"a,b"``) acts only
        when every one of them is in act mode (the rule the prolog's health gate shares)."""
        return Mode(mode_for(partition, self.mode, self.partition_modes))

    def for_class(self, fault_class: FaultClass) -> ClassPolicy:
        return self.classes.get(fault_class) or DEFAULT_CLASSES[fault_class]


# --------------------------------------------------------------------------------- the file


class _PartitionTable(msgspec.Struct, kw_only=True, **_TABLE):
    """``[partitions.NAME]``; without ``mode`` the partition follows the top-level mode."""

    mode: ModeName | None = None


class _PolicyFile(msgspec.Struct, kw_only=True, **_TABLE):
    """The whole file; a key left out takes the :class:`Policy` default."""

    mode: ModeName = ModeName(Policy.mode)
    max_restarts: Count = Policy.max_restarts
    max_excluded_nodes: Count = Policy.max_excluded_nodes
    stop_on_same_failure: bool = Policy.stop_on_same_failure
    xid_repeats: Count = Policy.xid_repeats
    do_not_requeue_exit_codes: tuple[ExitCode, ...] = tuple(Policy.do_not_requeue_exit_codes)
    interactive_jobs: InteractiveJobs = InteractiveJobs(Policy.interactive_jobs)
    unplaceable: Unplaceable = Unplaceable(Policy.unplaceable)
    partitions: dict[str, _PartitionTable] = {}
    classes: _ClassTables = _ClassTables()
    blast_radius: BlastRadius = BlastRadius()
    fatal_evidence_window: EvidenceWindow = EvidenceWindow()
    hang: HangPolicy = HangPolicy()
    straggler: StragglerPolicy = StragglerPolicy()

    def policy(self, source: str) -> Policy:
        return Policy(
            mode=Mode(self.mode),
            partition_modes=MappingProxyType(
                {name: Mode(t.mode) for name, t in sorted(self.partitions.items()) if t.mode}
            ),
            max_restarts=self.max_restarts,
            max_excluded_nodes=self.max_excluded_nodes,
            stop_on_same_failure=self.stop_on_same_failure,
            xid_repeats=self.xid_repeats,
            do_not_requeue_exit_codes=frozenset(self.do_not_requeue_exit_codes),
            interactive_jobs=str(self.interactive_jobs),
            unplaceable=str(self.unplaceable),
            classes=self.classes.by_class(),
            blast_radius=self.blast_radius,
            fatal_evidence_window=self.fatal_evidence_window,
            hang=self.hang,
            straggler=self.straggler,
            source=source,
        )


# --------------------------------------------------------------------------------- the keys


@dataclass(frozen=True)
class Key:
    """One policy key: its dotted name as written in the file, its default as TOML writes it."""

    dotted: str
    default: Any


def _keys(schema: type[msgspec.Struct], prefix: str = "") -> Iterator[Key]:
    """Every key of ``schema``'s tables; a table of named tables (``[partitions.NAME]``) shows
    as ``NAME``."""
    for info in msgspec.structs.fields(schema):
        name = prefix + info.encode_name
        if isinstance(info.default, msgspec.Struct):
            yield from _keys(type(info.default), f"{name}.")
        elif typing.get_origin(info.type) is dict:
            yield from _keys(typing.get_args(info.type)[1], f"{name}.NAME.")
        else:
            yield Key(name, _toml_value(info.default))


def _toml_value(default: Any) -> Any:
    if isinstance(default, Duration):
        return format_duration(default)
    if isinstance(default, tuple):
        return list(default)
    if isinstance(default, str):
        return str(default)
    return default


#: Every key there is, from the schema; docs/policy.md and etc/policy.toml describe each one.
KEYS: tuple[Key, ...] = tuple(_keys(_PolicyFile))

#: Every table a key may live in (``classes``, ``classes.hardware``, ``hang``...).
_TABLES = frozenset(
    ".".join(parts[:end])
    for parts in (key.dotted.split(".") for key in KEYS)
    for end in range(1, len(parts))
)


# --------------------------------------------------------------------------------- loading


def load_policy(path: str | os.PathLike[str] = DEFAULT_POLICY_PATH) -> Policy:
    """Read and check the policy file at ``path``. Raises :class:`PolicyError`."""
    try:
        text, data = read_toml(path, check_stat=_refuse_writable, error=PolicyError)
    except FileNotFoundError:
        raise PolicyError(
            f"{path}: no such file; check controller.policy in config.toml, or install the "
            "default policy (etc/policy.toml; docs/policy.md lists every key)"
        ) from None
    return _policy(data, os.fspath(path), text)


def _refuse_writable(file: str, st: os.stat_result) -> None:
    """Whoever can change the file (or replace it) decides which jobs are restarted and which
    nodes drained: :func:`slurm_recovery.contract.settings.refuse_if_others_can_write`, the
    prolog's health gate's check of the same file."""
    try:
        refuse_if_others_can_write(file, st, stakes=POLICY_STAKES, what="policy")
    except SettingsError as exc:
        raise PolicyError(str(exc)) from None


def policy_from_toml(text: str, source: str = "<string>") -> Policy:
    """Parse and check policy ``text``; ``source`` names it in every error."""
    return _policy(parse_toml(text, source, error=PolicyError), source, text)


def _policy(data: dict[str, Any], source: str, text: str) -> Policy:
    """Check ``data`` (parsed from ``text``) and build the :class:`Policy`; every problem at
    once."""
    problems = _partition_name_problems(data, source, text)
    try:
        file = convert(data, _PolicyFile, source=source, text=text, suggest=_suggest)
    except SchemaError as exc:
        raise PolicyError(*problems, *exc.problems) from None
    hang = file.hang
    if hang.floor > hang.ceiling:
        problems.append(
            f"{_where(source, text, ('hang', 'ceiling'))}: hang.ceiling = {hang.ceiling:g}s is "
            f"below hang.floor = {hang.floor:g}s: the deadline would have no room; raise "
            "hang.ceiling or lower hang.floor"
        )
    if problems:
        raise PolicyError(*problems)
    return file.policy(source)


def _where(source: str, text: str, path: KeyPath) -> str:
    line = find_line(text, path)
    return source if line is None else f"{source}:{line}"


def _partition_name_problems(data: Mapping[str, Any], source: str, text: str) -> list[str]:
    """Table names msgspec cannot check: one Slurm partition per ``[partitions.NAME]``."""
    partitions = data.get("partitions")
    if not isinstance(partitions, Mapping):
        return []
    return [
        f"{_where(source, text, ('partitions', name))}: [{dotted(('partitions', name))}]: "
        f"{name!r} is not a Slurm partition name; name one partition per table, as sinfo "
        "shows it"
        for name in partitions
        if not name or "," in name or any(c.isspace() for c in name)
    ]


def _suggest(table: KeyPath, name: str, names: Sequence[str]) -> str:
    """:func:`slurm_recovery.schema.suggest_key`, after the one mistake only the policy has: a
    drain key in a class table whose verdicts never name a node."""
    if len(table) == 2 and table[0] == "classes" and name in _NodeClassTable.__struct_fields__:
        return (
            f"; a verdict of class {table[-1]} never implicates a node, so there is nothing "
            "to drain: remove the key"
        )
    return suggest_key(table, name, names, keys=[key.dotted for key in KEYS], tables=_TABLES)
