"""NVIDIA XIDs: the driver's ``NVRM: Xid`` log lines, and what each code means.

Evidence parsing, below the decision core and the sidecar (both import it, it imports neither):

- :func:`parse_xid_line` is pure: any text in (a /dev/kmsg record, a dmesg or journal line, a
  job log line), an :class:`XidLine` or ``None`` out. The sidecar's kmsg source and the log
  signatures (``kernel.xid``) read XIDs through it;
- the XID catalogue: what an XID means for a job and its node, read from TOML data. Loading
  the file is this module's only I/O; the result is a frozen :class:`XidCatalogue` that the
  pure decision functions (``detect``, ``attribute``) consult. The shipped catalogue is
  ``signals/data/xid.toml``; an admin may point at another file with the same format.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from types import MappingProxyType
from typing import Annotated, Any, Self, TypeVar

import msgspec

from slurm_recovery.contract.catalogue import FaultClass
from slurm_recovery.schema import (
    Checked,
    Choice,
    KeyPath,
    SchemaError,
    convert,
    dotted,
    find_line,
    parse_toml,
    read_toml,
)

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


class CatalogueError(SchemaError):
    """The XID catalogue cannot be used. One line per problem: file, line, entry, key, fix."""


class Text(str, Checked):
    """A non-empty one-line text (a meaning, a description, an example line)."""

    LABEL = "one-line text"

    @classmethod
    def check(cls, value: Any) -> Self:
        if not isinstance(value, str) or not value.strip() or "\n" in value:
            raise ValueError("must be a non-empty one-line text")
        return cls(value)


class Note(str, Checked):
    """A one-line text that may be empty (``""``: none)."""

    LABEL = "one-line text, or empty"

    @classmethod
    def check(cls, value: Any) -> Self:
        if not isinstance(value, str) or "\n" in value:
            raise ValueError("must be a one-line string")
        return cls(value)


class KnockOn(str, Checked):
    """``knock_on``: ``"any"``, XID codes (``"48"``, ``"48, 64"``), or ``""`` for none."""

    LABEL = '"any" or XID codes'

    @classmethod
    def check(cls, value: Any) -> Self:
        if not isinstance(value, str) or not (
            value in ("", "any") or all(part.strip().isdigit() for part in value.split(","))
        ):
            raise ValueError('must be "any" or XID codes like "48" or "48, 64"')
        return cls(value)


class XidClass(Choice):
    OPTIONS = tuple(c.value for c in FaultClass)


class XidAction(Choice):
    OPTIONS = XID_ACTIONS


class XidScope(Choice):
    """``gpu``: only work on the XID's GPU is hit; ``node``: all work on the node."""

    OPTIONS = XID_SCOPES


class XidInfo(
    msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True, rename={"klass": "class"}
):
    """One XID: its meaning, whose fault it is, what the GPU needs, and whether work on it dies.

    Also the schema of an ``[[xid]]`` entry of the catalogue file (its keys are these fields,
    ``klass`` written ``class``)."""

    code: Annotated[int, msgspec.Meta(ge=0)]
    meaning: Text
    #: the fault class as the file writes it; :attr:`fault_class` is the enum
    klass: XidClass
    action: XidAction
    fatal: bool
    #: the XID is not fatal when its log line contains this (case-insensitive); "" = never
    not_fatal_when_message_contains: Note = Note("")
    #: ``gpu``: only jobs on the XID's GPU are hit; ``node``: every job on the node
    scope: XidScope = XidScope("node")
    #: informational when its line contains this (class unknown, action none); "" = never
    harmless_when_message_contains: Note = Note("")
    #: NVIDIA's mnemonic and immediate-action bucket ("" = not in NVIDIA's catalog, or no bucket)
    mnemonic: Note = Note("")
    nvidia: Note = Note("")
    #: the GPUs NVIDIA's catalog says the code applies to
    gpus: tuple[Text, ...] = ()
    #: where the NVIDIA facts were read (repository@commit:path)
    source: Note = Note("")
    #: "any" or comma-separated codes: this XID is a consequence of those in the same log
    knock_on: KnockOn = KnockOn("")
    #: why the project's decision departs from NVIDIA's resolution ("" = it does not)
    differs: Note = Note("")

    @property
    def fault_class(self) -> FaultClass:
        return FaultClass(self.klass)

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
        meaning=Text("not in the XID catalogue"),
        klass=XidClass("unknown"),
        action=XidAction("restart"),
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
        return msgspec.structs.replace(
            info, klass=XidClass("unknown"), action=XidAction("none"), fatal=False
        )
    marker = info.not_fatal_when_message_contains
    if info.fatal and marker and marker.lower() in text:
        return msgspec.structs.replace(info, fatal=False)
    return info


def log_action(info: XidInfo, text: str = "") -> str:
    """What explain-log does about a job whose log shows this XID (one of :data:`LOG_ACTIONS`).

    ``info`` is a catalogue entry (``lookup`` or ``assess``) and ``text`` its log line. Pure:
    ``stop`` for an application XID (the job's own bug: 43, 69, ...; a GPU kernel's
    fault, 13 and 31, is class unknown: restarted once); ``requeue_exclude`` for
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


# ------------------------------------------------------------------------- kernel-log lines

#: XID reported for a "fallen off the bus" line that carries no Xid number.
FALLEN_OFF_THE_BUS_XID = 79

#: A /dev/kmsg record: "<priority>,<sequence>,<timestamp us>,<flags>[,more];<message>"
KMSG_RECORD = re.compile(r"^(?P<pri>\d+),(?P<seq>\d+),(?P<ts>\d+),[^;]*;")
# The kernel escapes bytes < 0x20, >= 0x7f and the backslash in /dev/kmsg text as \xNN.
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
_BUS = r"[0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
# "NVRM: Xid (PCI:0000:3b:00): 79, ..." -- also without "PCI:", without the parentheses.
_XID = re.compile(
    r"NVRM:\s*Xid\s*(?:\((?P<paren>[^()]{0,64})\))?\s*:?\s*(?P<xid>\d{1,6})\b\s*(?:,\s*)?"
    r"(?P<rest>.*)",
    re.DOTALL,
)
_PID = re.compile(
    r"^pid=(?P<pid>'?<unknown>'?|\d{1,10})\s*(?:,\s*|$)(?:name=(?P<name>[^,]*?)\s*(?:,\s*|$))?",
    re.DOTALL,
)
# NVLink5 (XIDs 144-150): "<unit> <Fatal|Nonfatal> XC<n> i<n> Link <n> (0x... 0x... ...)"
_NVLINK = re.compile(
    r"^(?P<unit>[A-Z][A-Z0-9_/]*)\s+(?P<sev>Fatal|Nonfatal|Non-fatal)\s+XC(?P<xc>\d+)\s+"
    r"i(?P<inst>\d+)\s+Link\s+(?P<link>-?\d+)\s+\((?P<words>0x[0-9a-fA-F]+(?:\s+0x[0-9a-fA-F]+)*)\)"
)
_FALLEN = "fallen off the bus"
# "NVRM: GPU 0000:09:00.0: GPU has fallen off the bus." / "NVRM: The NVIDIA GPU 0000:b3:00.0"
_FALLEN_PCI = re.compile(
    r"NVRM:\s*(?:The NVIDIA\s+)?GPU\s+(?:at\s+)?(?:PCI:)?(?P<pci>" + _BUS + ")"
)
_NVRM_PREFIX = re.compile(r"NVRM:\s*")


@dataclass(frozen=True)
class XidLine:
    """One XID the driver logged. ``pci`` is normalized (``"0000:3b:00"``); ``gpu`` is the
    GPU index it maps to, if known; ``inferred`` marks a "fallen off the bus" line with no
    Xid number (reported as XID 79); ``nvlink`` holds the NVLink5 fields (XIDs 144-150);
    ``seq`` and ``timestamp_us`` come from a /dev/kmsg record."""

    xid: int
    message: str
    pci: str | None = None
    pid: int | None = None
    process: str | None = None
    inferred: bool = False
    nvlink: Mapping[str, Any] | None = field(default=None, hash=False)
    seq: int | None = None
    timestamp_us: int | None = None
    gpu: int | None = None

    def to_payload(self, origin: str = "kmsg") -> dict[str, Any]:
        """The ``xid`` evidence payload (base.KINDS): absent facts are left out."""
        payload: dict[str, Any] = {"xid": self.xid, "message": self.message, "origin": origin}
        if self.pci is not None:
            payload["pci"] = self.pci
        if self.pid is not None:
            payload["pid"] = self.pid
        if self.process is not None:
            payload["process"] = self.process
        if self.seq is not None:
            payload["seq"] = self.seq
        if self.inferred:
            payload["inferred"] = True
        if self.nvlink is not None:
            payload["nvlink"] = dict(self.nvlink)
        return payload


def parse_xid_line(line: str | bytes, gpus: Mapping[str, int] | None = None) -> XidLine | None:
    """The XID in one kernel-log line, or ``None``. Never raises.

    Accepts a /dev/kmsg record (``6,1234,5678901,-;NVRM: Xid ...``, \\xNN escapes decoded),
    a dmesg or journal line, or the bare message. ``gpus`` maps PCI bus ids (any spelling
    :func:`normalize_pci_bus_id` reads) to GPU indexes.
    """
    try:
        text = line.decode("utf-8", "replace") if isinstance(line, bytes | bytearray) else line
        seq: int | None = None
        stamp: int | None = None
        record = KMSG_RECORD.match(text)
        if record is not None:
            seq, stamp = int(record["seq"]), int(record["ts"])
            text = _unescape(text[record.end() :])
        found = _parse_message(text)
        if found is None:
            return None
        return replace(found, seq=seq, timestamp_us=stamp, gpu=gpu_of(found.pci, gpus))
    except (ValueError, TypeError, OverflowError):
        return None


def _unescape(text: str) -> str:
    """Undo the kernel's \\xNN escaping of /dev/kmsg text (only bytes it escapes)."""
    if "\\x" not in text:
        return text
    out = bytearray()
    for position, part in enumerate(_ESCAPE.split(text)):
        if position % 2 == 0:
            out += part.encode("utf-8", "surrogatepass")
            continue
        value = int(part, 16)
        if value < 0x20 or value >= 0x7F or value == 0x5C:
            out.append(value)
        else:
            out += b"\\x" + part.encode("ascii")
    return out.decode("utf-8", "replace")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _parse_message(text: str) -> XidLine | None:
    if "NVRM" not in text:
        return None
    if "Xid" in text:
        match = _XID.search(text)
        if match is not None:
            return _xid_from(match)
    if _FALLEN in text:
        return _fallen_from(text)
    return None


def nvlink5_subcode(intr_info: str) -> int:
    """Bits 20-25 of an NVLink5 XID's first register (IntrInfo), the field NVIDIA's "XID
    144-150 Decode" sheet keys the recovery action on beside the unit (e.g. the link-down
    reason of XID 149 NETIR_LINK_EVT). What a value means depends on the driver generation
    (the sheet has one decode before R575 and one from R575 on), so it is given raw."""
    return (int(intr_info, 16) >> 20) & 0x3F


def _xid_from(match: re.Match[str]) -> XidLine:
    pci = None
    paren = match["paren"]
    if paren:
        pci = normalize_pci_bus_id(paren.strip())
    rest = match["rest"].strip()
    pid: int | None = None
    process: str | None = None
    owner = _PID.match(rest)
    if owner is not None:
        if owner["pid"].isdigit():
            pid = int(owner["pid"])
        name = (owner["name"] or "").strip()
        if name and name.strip("'") != "<unknown>":
            process = name
        rest = rest[owner.end() :]
    message = _one_line(rest).rstrip(",").strip()
    nvlink = None
    shape = _NVLINK.match(message)
    if shape is not None:
        words = shape["words"].split()
        nvlink = {
            "unit": shape["unit"],
            "fatal": shape["sev"] == "Fatal",
            "xc": int(shape["xc"]),
            "instance": int(shape["inst"]),
            "link": int(shape["link"]),
            "intr_info": words[0],
            "error_status": words[1] if len(words) > 1 else None,
            "words": words,
            "subcode": nvlink5_subcode(words[0]),
        }
    return XidLine(
        xid=int(match["xid"]),
        message=message,
        pci=pci,
        pid=pid,
        process=process,
        nvlink=nvlink,
    )


def _fallen_from(text: str) -> XidLine:
    start = text.find("NVRM")
    body = _NVRM_PREFIX.sub("", text[start:])
    place = _FALLEN_PCI.search(text)
    pci = normalize_pci_bus_id(place["pci"]) if place is not None else None
    return XidLine(xid=FALLEN_OFF_THE_BUS_XID, message=_one_line(body), pci=pci, inferred=True)


def gpu_of(pci: str | None, gpus: Mapping[str, int] | None) -> int | None:
    """The index of the GPU at normalized bus id ``pci`` in ``gpus`` (any bus-id spelling)."""
    if pci is None or not gpus:
        return None
    if pci in gpus:
        return gpus[pci]
    for key, index in gpus.items():
        if normalize_pci_bus_id(key) == pci:
            return index
    return None


_PCI = re.compile(
    r"^(?:PCI:)?(?P<domain>[0-9a-fA-F]{1,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})"
    r"(?:\.(?P<fn>[0-7]))?$"
)


def normalize_pci_bus_id(bus_id: str) -> str | None:
    """``"00000000:3B:00.0"``, ``"PCI:0000:3b:00"``, ``"0000:3b:00.0"`` -> ``"0000:3b:00"``:
    4-digit domain, lower case, no function (a GPU is function 0). ``None`` if not a bus id."""
    match = _PCI.match(bus_id.strip())
    if match is None:
        return None
    domain = int(match["domain"], 16)
    if domain > 0xFFFF:
        return None
    return f"{domain:04x}:{match['bus'].lower()}:{match['dev'].lower()}"


# --------------------------------------------------------------------------------- loading

#: The schema of one ``[[key]]`` entry of a catalogue file.
_Entry = TypeVar("_Entry", bound=msgspec.Struct)


def read_catalogue(
    path: str | os.PathLike[str] | None, *, name: str, what: str, error: type[SchemaError]
) -> tuple[str, dict[str, Any], str]:
    """The text of a TOML catalogue, its contents, and the name to cite it by in errors.

    ``path=None`` reads ``signals/data/<name>`` shipped with the package; any problem raises
    ``error`` naming the file and the fix. Shared by the XID and the log-signature catalogues."""
    source = f"slurm_recovery/signals/data/{name}" if path is None else os.fspath(path)
    try:
        if path is None:
            text = (resources.files("slurm_recovery.signals") / "data" / name).read_text("utf-8")
            return text, parse_toml(text, source, error=error), source
        text, data = read_toml(path, error=error)
        return text, data, source
    except FileNotFoundError:
        if path is None:
            raise error(
                f"{source}: missing from the installed package; reinstall slurm-recovery "
                "(the package data must include signals/data/*.toml)"
            ) from None
        raise error(f"{source}: no such file; check the path of {what}") from None


def catalogue_entries(
    text: str, data: dict[str, Any], source: str, key: str, entry: type[_Entry]
) -> tuple[list[tuple[int, _Entry]], list[str]]:
    """Each ``[[key]]`` table of a catalogue read as ``entry``, with its index, and every
    problem: of the document, and of each entry (read one by one, so that all are told)."""
    document = msgspec.defstruct(
        "Catalogue", [(key, list[dict[str, Any]], [])], forbid_unknown_fields=True, frozen=True
    )
    problems: list[str] = []
    try:
        convert(data, document, source=source, text=text)
    except SchemaError as exc:
        problems.extend(exc.problems)
    tables = data.get(key)
    entries: list[tuple[int, _Entry]] = []
    for index, table in enumerate(tables if isinstance(tables, list) else []):
        if not isinstance(table, dict):
            continue  # the document's problem
        try:
            found = convert(table, entry, source=source, text=text, prefix=f"{key}[{index}]")
        except SchemaError as exc:
            problems.extend(exc.problems)
        else:
            entries.append((index, found))
    return entries, problems


def entry_problem(source: str, text: str, path: KeyPath, problem: str) -> str:
    """A rule across an entry's keys broken, worded as :func:`~slurm_recovery.schema.convert`
    words a key's problem: ``file:line: key: problem``."""
    line = find_line(text, path)
    return f"{source}{f':{line}' if line is not None else ''}: {dotted(path)}: {problem}"


def load_xid_catalogue(path: str | os.PathLike[str] | None = None) -> XidCatalogue:
    """Read and check an XID catalogue file; ``None`` reads the one shipped with the package."""
    text, data, source = read_catalogue(
        path, name="xid.toml", what="the XID catalogue", error=CatalogueError
    )
    return _catalogue(text, data, source)


def catalogue_from_toml(text: str, source: str = "<string>") -> XidCatalogue:
    """Parse and check catalogue ``text``; ``source`` is named in every error."""
    return _catalogue(text, parse_toml(text, source, error=CatalogueError), source)


def catalogue_from_entries(entries: Iterable[XidInfo], source: str = "<code>") -> XidCatalogue:
    """A catalogue built in code (tests, tools): the same value the loader returns."""
    return XidCatalogue(MappingProxyType({e.code: e for e in sorted(entries, key=_code)}), source)


def _code(info: XidInfo) -> int:
    return info.code


def _catalogue(text: str, data: dict[str, Any], source: str) -> XidCatalogue:
    read, problems = catalogue_entries(text, data, source, "xid", XidInfo)
    entries: dict[int, XidInfo] = {}
    for index, info in read:
        if info.fatal and info.fault_class is FaultClass.APPLICATION:
            problems.append(
                entry_problem(
                    source,
                    text,
                    ("xid", index, "fatal"),
                    "true with class application: an application XID leaves the GPU usable; "
                    "set fatal = false, or use class hardware or system if the GPU needs repair",
                )
            )
        elif info.code in entries:
            problems.append(
                entry_problem(
                    source, text, ("xid", index, "code"), f"{info.code} is listed twice; keep one"
                )
            )
        else:
            entries[info.code] = info
    if problems:
        raise CatalogueError(*problems)
    return XidCatalogue(MappingProxyType(dict(sorted(entries.items()))), source)
