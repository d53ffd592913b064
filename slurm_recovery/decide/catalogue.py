"""The XID catalogue: what an NVIDIA XID means for a job and its node, read from TOML data.

Loading the file is this module's only I/O; the result is a frozen :class:`XidCatalogue` that
the pure decision functions (``detect``, ``attribute``) consult. The shipped catalogue is
``decide/data/xid.toml``; an admin may point at another file with the same format.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from slurm_recovery.config import ConfigError, did_you_mean
from slurm_recovery.decide.model import FaultClass

#: What the GPU or node needs, as NVIDIA recommends it (``XidInfo.action``).
XID_ACTIONS = ("none", "restart", "reset_gpu", "reboot", "drain")

#: ``XidInfo.fault_domain`` for each fault class (``system`` is the driver or GPU firmware).
XID_FAULT_DOMAINS = MappingProxyType(
    {
        FaultClass.HARDWARE: "hardware",
        FaultClass.SYSTEM: "driver",
        FaultClass.APPLICATION: "application",
        FaultClass.UNKNOWN: "unknown",
    }
)

#: ``XidInfo.scope``: ``gpu`` faults harm only work on the XID's GPU; ``node`` ones all work
#: on the node (the default, also for an XID the catalogue does not list).
XID_SCOPES = ("gpu", "node")

#: NVIDIA's immediate-action buckets whose job decision the catalogue tests hold to a rule
#: (``tests/unit/test_xid_nvidia_catalog.py``); the other buckets are NVIDIA's workflows.
NVIDIA_RESOLUTIONS = (
    "IGNORE",
    "RESTART_APP",
    "RESET_GPU",
    "RESTART_BM",
    "RESTART_VM",
    "CONTACT_SUPPORT",
)

#: What explain-log says to do about a job whose log shows an XID (:func:`log_action`).
LOG_ACTIONS = ("none", "requeue", "requeue_exclude", "stop")

_ENTRY_KEYS = (
    "code",
    "meaning",
    "class",
    "action",
    "fatal",
    "scope",
    "not_fatal_when_message_contains",
    "harmless_when_message_contains",
    "mnemonic",
    "nvidia",
    "gpus",
    "source",
    "knock_on",
    "differs",
)
_TEXT_KEYS = (
    "not_fatal_when_message_contains",
    "harmless_when_message_contains",
    "mnemonic",
    "nvidia",
    "source",
    "differs",
)
_REQUIRED_KEYS = ("code", "meaning", "class", "action", "fatal")


class CatalogueError(ConfigError):
    """The XID catalogue cannot be used. One line per problem: file, entry, key, fix."""


@dataclass(frozen=True)
class XidInfo:
    """One XID: its meaning, whose fault it is, what the GPU needs, and whether work on it dies."""

    code: int
    meaning: str
    fault_class: FaultClass
    action: str
    fatal: bool
    #: the XID is not fatal when its log line contains this (case-insensitive); "" = never
    not_fatal_when_message_contains: str = ""
    #: ``gpu``: only jobs on the XID's GPU are hit; ``node``: every job on the node
    scope: str = "node"
    #: informational when its line contains this (class unknown, action none); "" = never
    harmless_when_message_contains: str = field(default="", compare=False)
    #: NVIDIA's mnemonic and immediate-action bucket ("" = not in NVIDIA's catalog, or no bucket)
    mnemonic: str = field(default="", compare=False)
    nvidia: str = field(default="", compare=False)
    #: the GPUs NVIDIA's catalog says the code applies to
    gpus: tuple[str, ...] = field(default=(), compare=False)
    #: where the NVIDIA facts were read (repository@commit:path)
    source: str = field(default="", compare=False)
    #: "any" or comma-separated codes: this XID is a consequence of those in the same log
    knock_on: str = field(default="", compare=False)
    #: why the project's decision departs from NVIDIA's resolution ("" = it does not)
    differs: str = field(default="", compare=False)

    @property
    def blames_node(self) -> bool:
        """Whether the XID implicates the node it was logged on (class hardware or system)."""
        return self.fault_class in (FaultClass.HARDWARE, FaultClass.SYSTEM)

    @property
    def gpu_scoped(self) -> bool:
        return self.scope == "gpu"

    @property
    def label(self) -> str:
        """``"xid 79 (GPU has fallen off the bus)"``: how reasons name it."""
        return f"xid {self.code} ({self.meaning})"

    @property
    def fault_domain(self) -> str:
        """Where the fault lies, in the issue's words: ``hardware``, ``driver`` (class
        ``system``: driver or GPU firmware), ``application``, or ``unknown``."""
        return XID_FAULT_DOMAINS[self.fault_class]

    @property
    def severity(self) -> str:
        """How bad it is for the node, as sidecar findings say it (``sidecar.base``):
        ``fatal`` when work on the GPU is doomed; ``info`` for an application XID (the job's
        fault, the GPU is fine); ``warning`` otherwise (evidence, not a verdict). Derived
        from ``fatal`` and ``class``, so the two can never disagree."""
        if self.fatal:
            return "fatal"
        if self.fault_class is FaultClass.APPLICATION:
            return "info"
        return "warning"


def unknown_xid(code: int) -> XidInfo:
    """What the core assumes about an XID the catalogue does not list (a code newer than
    NVIDIA's catalog): class unknown, not fatal, so a node warning (``severity``) that never
    blames the node on its own; :func:`log_action` requeues the job without exclusion."""
    return XidInfo(
        code=code,
        meaning="not in the XID catalogue",
        fault_class=FaultClass.UNKNOWN,
        action="restart",
        fatal=False,
    )


@dataclass(frozen=True)
class XidCatalogue:
    """XID code -> :class:`XidInfo`. ``source`` names the file it came from."""

    entries: Mapping[int, XidInfo] = field(default_factory=lambda: MappingProxyType({}))
    source: str = field(default="<empty>", compare=False)

    def lookup(self, xid: int) -> XidInfo:
        """The entry for ``xid``; an uncatalogued XID is class unknown and not fatal."""
        return self.entries.get(xid) or unknown_xid(xid)

    def assess(self, xid: int, message: str = "") -> XidInfo:
        """:meth:`lookup`, refined by the XID's log line (:func:`refine`)."""
        return refine(self.lookup(xid), message)

    def __iter__(self) -> Iterator[int]:
        """The catalogued codes, in ascending order."""
        return iter(sorted(self.entries))

    def __len__(self) -> int:
        return len(self.entries)


def refine(info: XidInfo, message: str) -> XidInfo:
    """``info`` as the XID's log line ``message`` qualifies it. Pure and idempotent.

    ``harmless_when_message_contains`` found: informational (class unknown, action none, not
    fatal), e.g. XID 154 changing the recovery action to None. ``not_fatal_when_message_contains``
    found: not fatal, class and action kept (an NVLink5 "Nonfatal" error still implicates the node).
    """
    text = message.lower()
    harmless = info.harmless_when_message_contains
    if harmless and harmless.lower() in text:
        if info.fault_class is FaultClass.UNKNOWN and info.action == "none" and not info.fatal:
            return info
        return replace(info, fault_class=FaultClass.UNKNOWN, action="none", fatal=False)
    marker = info.not_fatal_when_message_contains
    if info.fatal and marker and marker.lower() in text:
        return replace(info, fatal=False)
    return info


def log_action(info: XidInfo, text: str = "") -> str:
    """What explain-log does about a job whose log shows this XID (one of :data:`LOG_ACTIONS`).

    ``info`` is a catalogue entry (``lookup`` or ``assess``) and ``text`` its log line. Pure:
    ``stop`` for an application XID (the job's own bug: 13, 31, 43); ``requeue_exclude`` for
    hardware and system ones (the GPU or node needs a reset, reboot or a human: NVIDIA's
    RESET_GPU, RESTART_BM, CONTACT_SUPPORT and node workflows); for class unknown, ``none``
    when nothing failed (NVIDIA's IGNORE, XID 154 back to None) and ``requeue`` otherwise (a
    contained error whose application restarts, NVIDIA's RESTART_APP, or an uncatalogued XID).
    Knock-on XIDs (``knock_on``) are the caller's to discount: see :func:`is_knock_on`."""
    info = refine(info, text)
    if info.fault_class is FaultClass.APPLICATION:
        return "stop"
    if info.blames_node:
        return "requeue_exclude"
    if info.action == "none":
        return "none"
    return "requeue"


def is_knock_on(info: XidInfo, others: Iterable[int]) -> bool:
    """Whether ``info``'s XID is only a consequence of ``others`` (the other XID codes in the
    same log, on the same node): its ``knock_on`` is ``"any"`` and another code is there, or
    it lists one of them. Pure; a caller adds non-XID causes (a job kill for XID 45)."""
    rule = info.knock_on.strip()
    if not rule:
        return False
    seen = {code for code in others if code != info.code}
    if rule == "any":
        return bool(seen)
    return any(int(part) in seen for part in rule.split(",") if part.strip().isdigit())


def xid_code(payload: Mapping[str, Any]) -> int | None:
    """The XID number in an ``xid`` (or ``operator_report``) evidence payload, if it has one."""
    value = payload.get("xid")
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


# --------------------------------------------------------------------------------- loading


def read_catalogue(
    path: str | os.PathLike[str] | None,
    *,
    package: str,
    name: str,
    what: str,
    error: type[ValueError],
) -> tuple[str, str]:
    """The text of a TOML catalogue and the name to cite it by in errors.

    ``path=None`` reads ``data/<name>`` shipped in ``package``; any problem raises ``error``
    naming the file and the fix. Shared by the XID and the log-signature catalogues."""
    if path is None:
        source = f"{package.replace('.', '/')}/data/{name}"
        try:
            return (resources.files(package) / "data" / name).read_text(encoding="utf-8"), source
        except FileNotFoundError:
            subdir = package.rsplit(".", 1)[-1]
            raise error(
                f"{source}: missing from the installed package; reinstall slurm-recovery "
                f"(the package data must include {subdir}/data/*.toml)"
            ) from None
    file = Path(path)
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise error(f"{file}: no such file; check the path of {what}") from None
    except IsADirectoryError:
        raise error(f"{file}: is a directory; name the catalogue file itself") from None
    except OSError as exc:
        raise error(f"{file}: cannot read it: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8"), str(file)
    except UnicodeDecodeError:
        raise error(
            f"{file}: not UTF-8 text; TOML files must be UTF-8 (convert it with iconv)"
        ) from None


def catalogue_tables(
    text: str, source: str, key: str, error: type[ValueError]
) -> tuple[list[Any], list[str]]:
    """The ``[[key]]`` tables of a catalogue, and the problems with the document around them
    (unknown top-level keys, ``key`` not an array of tables); invalid TOML raises ``error``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{source}: invalid TOML: {exc}") from None
    problems = [
        f"{source}: {other}: unknown key; the catalogue holds only [[{key}]] tables"
        + did_you_mean(other, [key])
        for other in data
        if other != key
    ]
    tables = data.get(key, [])
    if not isinstance(tables, list):
        article = "an" if key[0] in "aeiou" else "a"
        problems.append(f"{source}: {key}: write each entry as {article} [[{key}]] table")
        tables = []
    return tables, problems


def load_xid_catalogue(path: str | os.PathLike[str] | None = None) -> XidCatalogue:
    """Read and check an XID catalogue file; ``None`` reads the one shipped with the package."""
    text, source = read_catalogue(
        path,
        package="slurm_recovery.decide",
        name="xid.toml",
        what="the XID catalogue",
        error=CatalogueError,
    )
    return catalogue_from_toml(text, source)


def catalogue_from_toml(text: str, source: str = "<string>") -> XidCatalogue:
    """Parse and check catalogue ``text``; ``source`` is named in every error."""
    tables, problems = catalogue_tables(text, source, "xid", CatalogueError)
    entries: dict[int, XidInfo] = {}
    for position, table in enumerate(tables, start=1):
        info = _entry(source, position, table, problems)
        if info is None:
            continue
        if info.code in entries:
            problems.append(
                f"{source}: [[xid]] #{position}: code {info.code} is listed twice; keep one entry"
            )
            continue
        entries[info.code] = info
    if problems:
        raise CatalogueError(*problems)
    return XidCatalogue(MappingProxyType(dict(sorted(entries.items()))), source)


def catalogue_from_entries(entries: Iterable[XidInfo], source: str = "<code>") -> XidCatalogue:
    """A catalogue built in code (tests, tools): the same value the loader returns."""
    return XidCatalogue(MappingProxyType({e.code: e for e in sorted(entries, key=_code)}), source)


def _code(info: XidInfo) -> int:
    return info.code


def _entry(source: str, position: int, table: Any, problems: list[str]) -> XidInfo | None:
    where = f"{source}: [[xid]] #{position}"
    if not isinstance(table, Mapping):
        problems.append(f"{where}: not a table; write [[xid]] and its keys below it")
        return None
    if isinstance(table.get("code"), int) and not isinstance(table.get("code"), bool):
        where = f"{source}: [[xid]] code {table['code']}"
    before = len(problems)
    for key in table:
        if key not in _ENTRY_KEYS:
            problems.append(
                f"{where}: {key}: unknown key{did_you_mean(key, _ENTRY_KEYS)} "
                f"(keys: {', '.join(_ENTRY_KEYS)})"
            )
    for key in _REQUIRED_KEYS:
        if key not in table:
            needed = ", ".join(_REQUIRED_KEYS)
            problems.append(f"{where}: {key} is missing; every entry needs {needed}")
    if len(problems) > before:
        return None
    code, meaning, klass, action, fatal = (table[k] for k in _REQUIRED_KEYS)
    marker = table.get("not_fatal_when_message_contains", "")
    scope = table.get("scope", "node")
    gpus = table.get("gpus", [])
    knock_on = table.get("knock_on", "")
    for key in _TEXT_KEYS:
        value = table.get(key, "")
        if not isinstance(value, str) or "\n" in value:
            problems.append(f"{where}: {key} = {value!r}: must be a one-line string")
    if not isinstance(gpus, list) or not all(isinstance(g, str) and g for g in gpus):
        problems.append(f'{where}: gpus = {gpus!r}: must be a list of GPU names, e.g. ["H100"]')
    if not isinstance(knock_on, str) or not (
        knock_on in ("", "any") or all(part.strip().isdigit() for part in knock_on.split(","))
    ):
        problems.append(
            f'{where}: knock_on = {knock_on!r}: must be "any" or XID codes like "48" or "48, 64"'
        )
    if isinstance(code, bool) or not isinstance(code, int) or code < 0:
        problems.append(f"{where}: code = {code!r}: must be a whole number, 0 or more")
    if not isinstance(meaning, str) or not meaning.strip() or "\n" in meaning:
        problems.append(f"{where}: meaning = {meaning!r}: must be a short one-line text")
    classes = [c.value for c in FaultClass]
    if klass not in classes:
        problems.append(
            f"{where}: class = {klass!r}: must be one of {', '.join(classes)}"
            + did_you_mean(str(klass), classes)
        )
    if action not in XID_ACTIONS:
        problems.append(
            f"{where}: action = {action!r}: must be one of {', '.join(XID_ACTIONS)}"
            + did_you_mean(str(action), XID_ACTIONS)
        )
    if not isinstance(fatal, bool):
        problems.append(f"{where}: fatal = {fatal!r}: must be true or false (no quotes)")
    if scope not in XID_SCOPES:
        problems.append(
            f"{where}: scope = {scope!r}: must be gpu (only work on that GPU is hit) or node "
            "(all work on the node)" + did_you_mean(str(scope), XID_SCOPES)
        )
    if klass == FaultClass.APPLICATION.value and fatal is True:
        problems.append(
            f"{where}: fatal = true with class application: an application XID leaves the GPU "
            "usable; set fatal = false, or use class hardware or system if the GPU needs repair"
        )
    if len(problems) > before:
        return None
    return XidInfo(
        code=code,
        meaning=meaning.strip(),
        fault_class=FaultClass(klass),
        action=action,
        fatal=fatal,
        not_fatal_when_message_contains=marker,
        scope=scope,
        harmless_when_message_contains=table.get("harmless_when_message_contains", ""),
        mnemonic=table.get("mnemonic", ""),
        nvidia=table.get("nvidia", ""),
        gpus=tuple(gpus),
        source=table.get("source", ""),
        knock_on=knock_on,
        differs=table.get("differs", ""),
    )
