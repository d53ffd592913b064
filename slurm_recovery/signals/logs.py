"""Log signatures: recognise the lines of job output and kernel logs that say why a job failed.

Three parts, all pure except loading the catalogue file:

- :func:`load_signatures` reads the catalogue (``signals/data/signatures.toml``, data an admin
  can read and extend) and checks every entry, including that its example line is recognised;
- :meth:`SignatureCatalogue.scan` (and :func:`scan`, ``scan_text``, ``scan_file``) turn lines
  into :class:`Match` values. A prefilter of a few literal regexes (:func:`prefilter_patterns`)
  finds the lines that hold a keyword in a few passes over a whole block; only those lines are
  tried against the signatures' patterns, first match wins. NVRM Xid lines go through the
  kmsg XID parser and the XID catalogue;
- :func:`classify` turns matches into a :class:`LogVerdict`: the first failure in time across
  ranks is the root; knock-on symptoms never blame; an application bug never blames a node.

``srecovery explain-log`` and the sidecar's job-log follower use the same functions.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import islice, repeat
from typing import Annotated, Any, Self

import msgspec

from slurm_recovery.contract.catalogue import FaultClass
from slurm_recovery.schema import Checked, Choice, SchemaError, parse_toml
from slurm_recovery.signals.emitters import EmitterTables, Member, load_emitter_tables
from slurm_recovery.signals.xid import (
    LOG_ACTIONS,
    Text,
    XidCatalogue,
    catalogue_entries,
    entry_problem,
    is_knock_on,
    load_xid_catalogue,
    log_action,
    parse_xid_line,
    read_catalogue,
)

__all__ = [
    "ACTIONS",
    "CLASSES",
    "LogVerdict",
    "Match",
    "Signature",
    "SignatureCatalogue",
    "SignatureError",
    "classify",
    "evidence_payload",
    "load_signatures",
    "nested_quantifiers",
    "prefilter_patterns",
    "read_log",
    "scan",
]

CLASSES = tuple(str(c) for c in FaultClass)
ACTIONS = LOG_ACTIONS
PARSERS = ("regex", "xid")
#: What a signature with ``tables`` does with a line whose code no member names: classify it
#: with its own class and action, or leave the line to the entries after it.
UNLISTED = ("classify", "ignore")
_ID = re.compile(r"^[a-z][a-z0-9_]*\.[a-z0-9_]+$")
#: Longest line kept in a match (a log line can be megabytes of tensor dump).
MAX_TEXT = 500
#: Lines joined per block when scanning an iterable of lines.
_BATCH = 4096
#: Bytes read per block when scanning a file.
_CHUNK = 8 << 20


class SignatureError(SchemaError):
    """The signature catalogue cannot be used. One line per problem: file, line, entry, key, fix."""


class SignatureId(str, Checked):
    LABEL = "family.name"

    @classmethod
    def check(cls, value: Any) -> Self:
        if not isinstance(value, str) or not _ID.match(value):
            raise ValueError("write family.name in lower case (nccl.remote_error)")
        return cls(value)


class Pattern(str, Checked):
    """A Python regex that cannot backtrack catastrophically (:func:`nested_quantifiers`)."""

    LABEL = "regex"

    @classmethod
    def check(cls, value: Any) -> Self:
        if not isinstance(value, str) or not value:
            raise ValueError("must be a non-empty regex in single quotes ('a\\d+')")
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid Python regex: {exc}") from None
        nested = nested_quantifiers(value)
        if nested:
            raise ValueError(
                f"nested quantifiers ({', '.join(nested)}) can backtrack catastrophically; "
                "bound or flatten the inner repeat"
            )
        return cls(value)


class SignatureClass(Choice):
    OPTIONS = CLASSES


class SignatureAction(Choice):
    OPTIONS = ACTIONS


class Parser(Choice):
    OPTIONS = PARSERS


class Unlisted(Choice):
    OPTIONS = UNLISTED


class SignatureEntry(
    msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True, rename={"klass": "class"}
):
    """The schema of one ``[[signature]]`` entry (the file's header says what each key means);
    :func:`_signature` checks the rules across keys and builds the :class:`Signature`."""

    id: SignatureId
    description: Text
    keywords: Annotated[tuple[Text, ...], msgspec.Meta(min_length=1)]
    klass: SignatureClass
    category: Text
    action: SignatureAction
    example: Text
    pattern: Pattern | None = None
    parser: Parser = Parser("regex")
    knock_on: bool = False
    decisive: bool = False
    blame_node: bool = False
    blame_sole_node: bool = False
    knock_on_xids: tuple[Annotated[int, msgspec.Meta(ge=0)], ...] = ()
    escalate_after: Annotated[int, msgspec.Meta(ge=0)] = 0
    tables: tuple[Text, ...] = ()
    unlisted: Unlisted = Unlisted("classify")
    whole_text: bool = False


@dataclass(frozen=True)
class Signature:
    """One catalogue entry (see the catalogue file's header for each key)."""

    id: str
    description: str
    keywords: tuple[str, ...]
    regex: re.Pattern[str] | None
    fault_class: str
    category: str
    action: str
    example: str
    knock_on: bool = False
    decisive: bool = False
    blame_node: bool = False
    #: a line that says one of the job's nodes failed without naming which: it blames the node
    #: of a one-node job (the only one it can be), no node otherwise
    blame_sole_node: bool = False
    parser: str = "regex"
    knock_on_xids: frozenset[int] = frozenset()
    #: a warning repeated this many times about one node is a fault of that node (0: never)
    escalate_after: int = 0
    #: emitter tables (``signals/data/emitters``) whose member the line's ``code`` group names
    #: decides class and action (:mod:`slurm_recovery.signals.emitters`)
    tables: tuple[str, ...] = ()
    #: ``ignore``: a line no member names is left to the entries after this one, and a line
    #: whose member asks nothing is no match at all; ``classify``: this entry's own facts
    unlisted: str = "classify"
    #: the ``code`` must be a member's whole message, not a line that begins with it: for a
    #: line that is nothing but the text ("Killed")
    whole_text: bool = False

    @property
    def pattern(self) -> str:
        return self.regex.pattern if self.regex is not None else ""


@dataclass(frozen=True)
class Match:
    """A recognised line. ``line_no`` counts from 1 in its ``source``; ``timestamp`` is epoch
    seconds when the line carries a wall-clock time (naive times are read as UTC; a syslog or
    PyTorch time without a year gets the scan's year); ``xid`` is set for XID lines."""

    signature_id: str
    line_no: int
    text: str
    host: str | None = None
    rank: int | None = None
    gpu: int | None = None
    timestamp: float | None = None
    source: str | None = None
    xid: int | None = None
    #: the line's time carries no year (syslog, PyTorch's glog prefix): the year was assumed
    year_assumed: bool = False
    #: the error the line names (a ``code`` group: a name, value or message an emitter table
    #: lists), for a signature with ``tables``
    code: str | None = None
    #: how many events the line reports (a ``count`` group: EDAC's "120 CE"), for repeats
    count: int = 1


@dataclass(frozen=True)
class Assessment:
    """What one match means: its signature's facts, refined by the XID catalogue for XIDs."""

    fault_class: str
    category: str
    action: str
    knock_on: bool
    decisive: bool
    blame_node: bool
    label: str


@dataclass(frozen=True)
class LogVerdict:
    """The classification of a failed job's logs.

    ``fault_domain`` is whose fault (hardware | system | application | unknown), ``category``
    where (the root signature's category: gpu, interconnect, user_code, ...; ``none`` when
    nothing was recognised), ``blame_nodes`` the nodes implicated, ``action`` what to do,
    ``signatures`` the decisive lines (the root first), each ``{id, line_no, text}``.
    """

    category: str
    fault_domain: str
    blame_nodes: list[str] = field(default_factory=list)
    action: str = "none"
    signatures: list[dict[str, Any]] = field(default_factory=list)
    cause: str = ""
    sources: list[str | None] = field(default_factory=list, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The ``srecovery explain-log --json`` object (exactly these keys)."""
        return {
            "category": self.category,
            "fault_domain": self.fault_domain,
            "blame_nodes": list(self.blame_nodes),
            "action": self.action,
            "signatures": [dict(s) for s in self.signatures],
        }


# ------------------------------------------------------------------------ line context

_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}
_ISO = re.compile(
    r"(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[T ](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
    r"(?:[.,](?P<f>\d{1,9}))?(?P<tz>Z|[+-]\d\d:?\d\d)?"
)
_SYSLOG = re.compile(
    r"^(?P<mon>[A-Z][a-z]{2}) {1,2}(?P<d>\d{1,2}) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
    r"(?:\.(?P<f>\d{1,9}))? (?P<host>[A-Za-z0-9][\w.-]{0,62}) [\w./@()-]{1,64}(?:\[\d{1,10}\])?:"
)
_ISO_HOST = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)? "
    r"(?P<host>[A-Za-z0-9][\w.-]{0,62}) [\w./@()-]{1,64}(?:\[\d{1,10}\])?:"
)
_DMESG_T = re.compile(
    r"^\[(?:[A-Z][a-z]{2}) (?P<mon>[A-Z][a-z]{2}) {1,2}(?P<d>\d{1,2}) "
    r"(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d) (?P<y>\d{4})\]"
)
# glog, as PyTorch's C++ side writes it: "[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607]"
_GLOG = re.compile(
    r"\[[IWEF](?P<mo>1[0-2]|0?[1-9])(?P<d>\d\d) "
    r"(?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d{1,9}))? "
)
# NCCL's prefix "host:pid:tid [gpu]" and UCX's "[host:pid:tid:tid]"
_NCCL_PREFIX = re.compile(
    r"(?:^|\s)(?P<host>[A-Za-z0-9][\w.-]{0,62}):\d{1,10}:\d{1,10} \[(?P<gpu>\d{1,3})\] "
)
_UCX_PREFIX = re.compile(r"\[(?P<host>[A-Za-z0-9][\w.-]{0,62}):\d{1,10}:\d{1,10}:\d{1,10}\]")
_RANK = re.compile(r"\[(?:[Rr]ank ?(?P<r1>\d{1,7})|PG[^\]]{0,80}? Rank (?P<r2>\d{1,7}))\]")
_JOURNAL_JSON = '"__REALTIME_TIMESTAMP"'


def _fraction(text: str | None) -> float:
    return float("0." + text) if text else 0.0


def _utc(year: int, month: int, day: int, hour: int, minute: int, second: int) -> float | None:
    try:
        return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))
    except (ValueError, OverflowError):
        return None


def _timestamp(line: str, year: int) -> tuple[float | None, bool]:
    """Wall-clock time of a log line and whether its year was assumed; ``None`` when the line
    has none (raw ``dmesg`` uptimes are not wall time)."""
    head = line[:160]
    found = _SYSLOG.match(head)
    if found is not None and found["mon"] in _MONTHS:
        base = _utc(year, _MONTHS[found["mon"]], int(found["d"]), *_hms(found))
        return (None if base is None else base + _fraction(found["f"])), True
    found = _DMESG_T.match(head) or _DMESG_T.search(head[:40])
    if found is not None and found["mon"] in _MONTHS:
        when = _utc(int(found["y"]), _MONTHS[found["mon"]], int(found["d"]), *_hms(found))
        return when, False
    found = _ISO.search(head)
    if found is not None and found.start() < 120:
        base = _utc(int(found["y"]), int(found["mo"]), int(found["d"]), *_hms(found))
        if base is None:
            return None, False
        return base + _fraction(found["f"]) - _tz_offset(found["tz"]), False
    found = _GLOG.search(head)
    if found is not None:
        base = _utc(year, int(found["mo"]), int(found["d"]), *_hms(found))
        return (None if base is None else base + _fraction(found["f"])), True
    return None, False


def _hms(found: re.Match[str]) -> tuple[int, int, int]:
    return int(found["h"]), int(found["mi"]), int(found["s"])


def _tz_offset(tz: str | None) -> float:
    if not tz or tz == "Z":
        return 0.0
    sign = -1.0 if tz[0] == "-" else 1.0
    digits = tz[1:].replace(":", "")
    return sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)


def _context(line: str) -> tuple[str | None, int | None, int | None]:
    """Host, rank and GPU that a line's standard prefixes name (syslog/journal host, NCCL's
    ``host:pid:tid [gpu]``, UCX's ``[host:pid:tid:tid]``, PyTorch's ``[rankN]``)."""
    host: str | None = None
    gpu: int | None = None
    head = line[:200]
    found = _SYSLOG.match(head) or _ISO_HOST.match(head)
    if found is not None:
        host = found["host"]
    nccl = _NCCL_PREFIX.search(head)
    if nccl is not None:
        host = host or nccl["host"]
        gpu = int(nccl["gpu"])
    elif host is None:
        ucx = _UCX_PREFIX.search(head)
        if ucx is not None:
            host = ucx["host"]
    rank_found = _RANK.search(line[:300])
    rank = None
    if rank_found is not None:
        rank = int(rank_found["r1"] or rank_found["r2"])
    return host, rank, gpu


def _journal_json(line: str) -> tuple[str, str | None, float | None] | None:
    """A ``journalctl -o json`` record: (message, host, time), or ``None``."""
    if not line.startswith("{") or _JOURNAL_JSON not in line:
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("MESSAGE"), str):
        return None
    host = record.get("_HOSTNAME")
    stamp = record.get("__REALTIME_TIMESTAMP")
    when = int(stamp) / 1e6 if isinstance(stamp, str) and stamp.isdigit() else None
    return record["MESSAGE"], host if isinstance(host, str) else None, when


# ------------------------------------------------------------------------ the catalogue


@dataclass(frozen=True)
class SignatureCatalogue:
    """The signatures in catalogue order, the XID catalogue, and the combined prefilter."""

    signatures: tuple[Signature, ...]
    xids: XidCatalogue
    source: str = "<code>"
    emitters: EmitterTables = field(default_factory=load_emitter_tables)
    _anchors: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _prefilters: tuple[re.Pattern[bytes], ...] = field(init=False, repr=False, compare=False)
    _by_id: Mapping[str, Signature] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        words = {k for s in self.signatures for k in s.keywords}
        # A keyword that contains another keyword adds nothing to the prefilter.
        anchors = tuple(sorted(w for w in words if not any(o != w and o in w for o in words)))
        object.__setattr__(self, "_anchors", anchors)
        object.__setattr__(self, "_prefilters", prefilter_patterns(anchors))
        object.__setattr__(self, "_by_id", {s.id: s for s in self.signatures})

    @property
    def anchors(self) -> tuple[str, ...]:
        """The literal texts the prefilter looks for (the keywords, minus redundant ones)."""
        return self._anchors

    @property
    def prefilters(self) -> tuple[re.Pattern[bytes], ...]:
        """The prefilter's regexes (:func:`prefilter_patterns`): one pass over a block each."""
        return self._prefilters

    def candidate(self, line: str) -> bool:
        """Whether ``line`` holds a keyword (the prefilter, for one line)."""
        return any(a in line for a in self._anchors)

    def candidates(self, data: bytes) -> list[int]:
        """Offsets of the lines of ``data`` (``\\n``-separated) that hold a keyword, in order.

        One pass per prefilter regex (a handful); after a hit a pass resumes at the next line,
        so a long line full of keywords costs no more than one look at it."""
        find, rfind = data.find, data.rfind
        starts: set[int] = set()
        for regex in self._prefilters:
            search = regex.search
            found = search(data)
            while found is not None:
                starts.add(rfind(b"\n", 0, found.start()) + 1)
                end = find(b"\n", found.start())
                if end < 0:
                    break
                found = search(data, end + 1)
        return sorted(starts)

    def __len__(self) -> int:
        return len(self.signatures)

    def __iter__(self) -> Iterator[Signature]:
        return iter(self.signatures)

    def get(self, signature_id: str) -> Signature | None:
        return self._by_id.get(signature_id)

    def member_name(self, match: Match) -> str | None:
        """The name of the emitter member a match's code is (``None``: its signature reads no
        emitter table, or the code is none of its members)."""
        signature = self._by_id.get(match.signature_id)
        if signature is None or not signature.tables or match.code is None:
            return None
        member = self._member(signature, match.code)
        return None if member is None else member.name

    def _member(self, signature: Signature, code: str) -> Member | None:
        """The member of ``signature``'s tables that ``code`` names (:attr:`Signature.whole_text`:
        only one whose text ``code`` is)."""
        if signature.whole_text:
            return self.emitters.lookup_text(signature.tables, code)
        return self.emitters.lookup(signature.tables, code)

    # ------------------------------------------------------------------ scanning

    def match_line(
        self,
        line: str,
        line_no: int = 1,
        *,
        source: str | None = None,
        year: int | None = None,
    ) -> Match | None:
        """The first signature that recognises ``line`` (no prefilter: callers did it).

        A line rewritten in place with carriage returns (a progress bar, then an error on the
        same terminal line) is matched part by part, as a terminal shows it."""
        line = line.rstrip("\r\n")
        host_override: str | None = None
        when_override: float | None = None
        journal = _journal_json(line)
        if journal is not None:
            line, host_override, when_override = journal
        if "\r" not in line:
            return self._match(line, line_no, source, year, host_override, when_override)
        for part in line.split("\r"):
            if self.candidate(part):
                found = self._match(part, line_no, source, year, host_override, when_override)
                if found is not None:
                    return found
        return None

    def _match(
        self,
        line: str,
        line_no: int,
        source: str | None,
        year: int | None,
        host_override: str | None,
        when_override: float | None,
    ) -> Match | None:
        for signature in self.signatures:
            if not any(k in line for k in signature.keywords):
                continue
            found = self._recognise(signature, line)
            if found is None:
                continue
            named, xid = found
            code = _code(named) if signature.tables else None
            if signature.unlisted == "ignore":
                member = self._member(signature, code) if code else None
                if member is None or not member.classified:
                    continue  # not this entry's: the entries after it may know the line
                if member.action == "none":
                    return None  # its emitter's source says the line is no failure
            host, rank, gpu = _context(line)
            host = _group(named, "host") or host_override or host
            rank_text = _group(named, "rank")
            gpu_text = _group(named, "gpu")
            stamp, assumed = when_override, False
            if stamp is None:
                stamp, assumed = _timestamp(line, year if year is not None else _this_year())
            count_text = _group(named, "count")
            return Match(
                signature_id=signature.id,
                line_no=line_no,
                text=_clip(line.strip()),
                host=host,
                rank=int(rank_text) if rank_text and rank_text.isdigit() else rank,
                gpu=int(gpu_text) if gpu_text and gpu_text.isdigit() else gpu,
                timestamp=stamp,
                source=source,
                xid=xid,
                year_assumed=assumed and stamp is not None,
                code=code,
                count=int(count_text) if count_text and count_text.isdigit() else 1,
            )
        return None

    def _recognise(
        self, signature: Signature, line: str
    ) -> tuple[Mapping[str, str | None], int | None] | None:
        if signature.parser == "xid":
            parsed = parse_xid_line(line)
            if parsed is None:
                return None
            return {}, parsed.xid
        assert signature.regex is not None
        found = signature.regex.search(line)
        if found is None:
            return None
        named = found.groupdict()
        # a tool that reports an XID in its own words (the device plugin's "Xid=79"): the XID
        # catalogue decides, as for the driver's own line
        xid = named.get("xid")
        return named, int(xid) if xid and xid.isdigit() else None

    def scan_text(
        self,
        text: str | bytes,
        *,
        first_line: int = 1,
        source: str | None = None,
        year: int | None = None,
    ) -> Iterator[Match]:
        """Matches in ``text`` (lines separated by ``\\n``), numbered from ``first_line``.

        The prefilter runs on bytes (:meth:`candidates`); only the lines holding a keyword
        are decoded and matched."""
        data = _encode(text) if isinstance(text, str) else text
        year = year if year is not None else _this_year()
        find = data.find
        line_no = first_line
        counted = 0  # data[:counted] has been counted into line_no
        for start in self.candidates(data):
            line_no += data.count(b"\n", counted, start)
            counted = start
            end = find(b"\n", start)
            raw = data[start:] if end < 0 else data[start:end]
            line = raw.decode("utf-8", "replace")
            found = self.match_line(line, line_no, source=source, year=year)
            if found is not None:
                yield found

    def scan(
        self,
        lines: Iterable[str | bytes],
        *,
        source: str | None = None,
        year: int | None = None,
        first_line: int = 1,
    ) -> Iterator[Match]:
        """Matches in ``lines`` (one line each, with or without its newline), in order,
        numbered from ``first_line``.

        Lines are joined into blocks of ``_BATCH`` and scanned as text (:meth:`scan_text`);
        a newline inside a line becomes a space, so numbering stays one per item."""
        year = year if year is not None else _this_year()
        items = iter(lines)
        first = first_line
        while True:
            batch = list(islice(items, _BATCH))
            if not batch:
                return
            block = _join_lines(batch)
            yield from self.scan_text(block, first_line=first, source=source, year=year)
            first += len(batch)

    def scan_file(
        self, path: str | os.PathLike[str], *, source: str | None = None, year: int | None = None
    ) -> Iterator[Match]:
        """Matches in a file, read in large blocks (the fast path for big logs). A journald
        export (``journalctl -o export``) is read record by record (:func:`read_log`)."""
        name = source if source is not None else str(path)
        with open(path, "rb") as stream:
            head = stream.read(64)
            stream.seek(0)
            if head.startswith(b"__CURSOR="):
                yield from self._scan_numbered(read_log(path), source=name, year=year)
                return
            first = 1
            rest = b""
            while True:
                chunk = stream.read(_CHUNK)
                if not chunk:
                    break
                data = rest + chunk
                cut = data.rfind(b"\n")
                if cut < 0:
                    rest = data
                    continue
                block, rest = data[:cut], data[cut + 1 :]
                yield from self.scan_text(block, first_line=first, source=name, year=year)
                first += block.count(b"\n") + 1
            if rest:
                yield from self.scan_text(rest, first_line=first, source=name, year=year)

    def _scan_numbered(
        self, numbered: Iterable[tuple[int, str]], *, source: str, year: int | None
    ) -> Iterator[Match]:
        for line_no, line in numbered:
            if not self.candidate(line):
                continue
            found = self.match_line(line, line_no, source=source, year=year)
            if found is not None:
                yield found

    # ------------------------------------------------------------------ meaning

    def assess(self, match: Match) -> Assessment:
        """What ``match`` means. XIDs take class, fatality and action from the XID catalogue;
        an unknown signature id is an unknown knock-on (never blames)."""
        signature = self.get(match.signature_id)
        if signature is None:
            return Assessment(
                "unknown", "unknown", "requeue", True, False, False, match.signature_id
            )
        if match.xid is not None:
            info = self.xids.assess(match.xid, match.text)
            action = log_action(info, match.text)
            # an XID that asks nothing (NVIDIA's IGNORE) is a warning, like a knock-on line
            knock_on = match.xid in signature.knock_on_xids or action == "none"
            blames = info.blames_node and not knock_on
            return Assessment(
                fault_class=info.fault_class.value,
                category=signature.category,
                action=action,
                knock_on=knock_on,
                decisive=info.fatal and blames,
                blame_node=blames,
                label=info.label,
            )
        if signature.tables and match.code:
            member = self._member(signature, match.code)
            if member is not None and member.classified:
                # a code that asks nothing (success, "not ready") is a warning, as an XID is;
                # one that does not say whose fault it is, a symptom: never the root
                return Assessment(
                    fault_class=member.fault_class,
                    category=signature.category,
                    action=member.action,
                    knock_on=member.action == "none" or member.fault_class == "unknown",
                    decisive=member.blame_node,
                    blame_node=member.blame_node,
                    label=f"{signature.id}: {member.label}",
                )
        return Assessment(
            fault_class=signature.fault_class,
            category=signature.category,
            action=signature.action,
            knock_on=signature.knock_on,
            decisive=signature.decisive,
            blame_node=signature.blame_node,
            label=signature.id,
        )


def _code(named: Mapping[str, str | None]) -> str | None:
    """The first ``code``, ``code2``, ... group that matched (one per alternative)."""
    for key in ("code", *(f"code{i}" for i in range(2, 20))):
        value = named.get(key)
        if value:
            return _clip(value.strip())
    return None


def _group(named: Mapping[str, str | None], key: str) -> str | None:
    value = named.get(key)
    return value if value else None


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def _this_year() -> int:
    return time.gmtime().tm_year


def _encode(text: str) -> bytes:
    """UTF-8 with undecodable bytes (``surrogateescape``) given back; any other lone
    surrogate cannot be a log byte and is replaced rather than failing the scan."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


def _join_lines(batch: list[Any]) -> bytes:
    """One ``\\n``-separated block of ``batch``'s lines, one line per item: a trailing newline
    is dropped and any other becomes a space.

    The two common shapes are joined at C speed: items that each end with their only newline
    (iterating a file) and items without newlines (``str.splitlines()`` output)."""
    text = isinstance(batch[0], str)
    newline: Any = "\n" if text else b"\n"
    try:
        if batch[0].endswith(newline):
            joined = ("" if text else b"").join(batch)
            last_ends = batch[-1].endswith(newline)
            if joined.count(newline) == len(batch) - (0 if last_ends else 1) and all(
                map(type(newline).endswith, batch[:-1], repeat(newline))
            ):
                return _as_bytes(joined[:-1] if last_ends else joined)
        else:
            block = newline.join(batch)
            if block.count(newline) == len(batch) - 1:
                return _as_bytes(block)
    except (TypeError, AttributeError):
        pass  # mixed str and bytes, or other bytes-like items: one at a time below
    return b"\n".join(_one_line(item) for item in batch)


def _as_bytes(block: str | bytes) -> bytes:
    return _encode(block) if isinstance(block, str) else bytes(block)


def _one_line(item: str | bytes) -> bytes:
    raw = _encode(item) if isinstance(item, str) else bytes(item)
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    return raw.replace(b"\n", b" ") if b"\n" in raw else raw


# Rough share (%) of each lowercase letter in English text: log text is mostly English words,
# numbers and punctuation, and the prefilter searches for the rarest bytes it can.
_ENGLISH = (
    "e12.7 t9.1 a8.2 o7.5 i7.0 n6.7 s6.3 h6.1 r6.0 d4.3 l4.0 c2.8 u2.8 m2.4 w2.4 f2.2 g2.0 "
    "y2.0 p1.9 b1.5 v1.0 k0.8 j.15 x.15 q.1 z.07"
)
_LETTER_SHARE = {pair[0]: float(pair[1:]) for pair in _ENGLISH.split()}
# What a byte that starts a match attempt costs, per percent of the block's bytes, relative to
# one pass over the block (about 0.4 ns/byte): an attempt costs 10 ns or more (70 ns where the
# trie behind the byte has 19 branches, as behind 'o'), but a pass is dearer than the sum of its
# parts suggests. Calibrated by timing the prefilter on three kinds of log (bench/log_scan.py's
# training log, the development corpus's logs, Slurm daemon and dpkg logs): 0.2 to 0.3 was the
# fastest on all three (10-25% faster than 0.09, which made the most common letters search
# bytes); above 0.5, more passes cost more than the attempts they save.
_ATTEMPT_PER_PERCENT = 0.25


def _byte_share(byte: int) -> float:
    """Guessed share (%) of ``byte`` in a log: the cost of searching for it."""
    char = chr(byte)
    if char in _LETTER_SHARE:
        return _LETTER_SHARE[char]
    if char == " ":
        return 15.0
    if "0" <= char <= "9":
        return 5.0
    if char in ".,:;/-_=[]()'\"|":
        return 2.0
    if "A" <= char <= "Z":
        return 0.5
    return 0.2


def prefilter_patterns(anchors: Iterable[str]) -> tuple[re.Pattern[bytes], ...]:
    """The prefilter as a few regexes that together find every anchor (as UTF-8 bytes).

    Python's regex engine searches fast (a tight byte loop, gigabytes a second) only for a
    pattern that begins with one literal byte; a pattern that may begin with several bytes
    crawls (a few hundred MB/s), and ``bytes.find`` once per anchor costs a pass per anchor.
    So the anchors are covered greedily by a few *search bytes*, rare ones preferred, each
    anchor found by its search byte: the regex for byte ``o`` is ``o`` followed by a trie of
    what follows ``o`` in each anchor, and a look-behind checks the part of the anchor before
    the ``o``. Literals only, so the search is linear: no backtracking beyond the longest
    anchor."""
    words = sorted({a.encode("utf-8") for a in anchors if a})
    uncovered = set(words)
    patterns: list[re.Pattern[bytes]] = []
    while uncovered:
        counts: dict[int, int] = {}
        for word in uncovered:
            for byte in set(word):
                counts[byte] = counts.get(byte, 0) + 1

        # cost per anchor covered: one more pass, plus an attempt at each occurrence
        pick = min(
            counts,
            key=lambda b: ((1 + _ATTEMPT_PER_PERCENT * _byte_share(b)) / counts[b], b),
        )
        group = sorted(w for w in uncovered if pick in w)
        uncovered.difference_update(group)
        entries = []
        for word in group:
            at = word.index(pick)
            entries.append((word[at + 1 :], word if at else None))
        patterns.append(re.compile(re.escape(bytes([pick])) + _trie(entries)))
    return tuple(patterns)


def _trie(entries: list[tuple[bytes, bytes | None]]) -> bytes:
    """A regex for ``rest`` followed by a look-behind for ``whole`` (when given), for each
    ``(rest, whole)``, with shared beginnings written once."""
    branches: list[bytes] = []
    heads: dict[bytes, list[tuple[bytes, bytes | None]]] = {}
    for rest, whole in entries:
        if rest:
            heads.setdefault(rest[:1], []).append((rest[1:], whole))
        elif whole is None:
            return b""  # an anchor ends here: found; what else could follow is irrelevant
        else:
            branches.append(b"(?<=" + re.escape(whole) + b")")
    branches += [re.escape(head) + _trie(sub) for head, sub in sorted(heads.items())]
    return branches[0] if len(branches) == 1 else b"(?:" + b"|".join(branches) + b")"


# ------------------------------------------------------------------------ reading logs


def read_log(path: str | os.PathLike[str]) -> Iterator[tuple[int, str]]:
    """``(line_no, line)`` of a log file as admins paste them. A journald export
    (``journalctl -o export``: ``KEY=value`` records, blank-line separated) becomes one
    ``<ISO time> <host> <ident>: <message>`` line per record, numbered by its MESSAGE line;
    any other file is read as lines. Undecodable bytes are replaced, never fatal."""
    with open(path, "rb") as stream:
        data = stream.read()
    text = data.decode("utf-8", "replace")
    if not text.startswith("__CURSOR="):
        for number, line in enumerate(text.splitlines(), start=1):
            yield number, line
        return
    record: dict[str, str] = {}
    message_line = 0
    for number, line in enumerate(text.split("\n"), start=1):
        if not line:
            if record:
                yield message_line, _export_line(record)
            record, message_line = {}, 0
            continue
        key, _, value = line.partition("=")
        record[key] = value
        if key == "MESSAGE":
            message_line = number
    if record:
        yield message_line, _export_line(record)


def _export_line(record: Mapping[str, str]) -> str:
    stamp = record.get("__REALTIME_TIMESTAMP", "")
    when = ""
    if stamp.isdigit():
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(stamp) / 1e6))
    host = record.get("_HOSTNAME", "-")
    ident = record.get("SYSLOG_IDENTIFIER", "journal")
    return f"{when} {host} {ident}: {record.get('MESSAGE', '')}".strip()


# ------------------------------------------------------------------------ classification


def _short(host: str) -> str:
    return host.split(".", 1)[0]


#: The node blamed for a node-local fault in a log that names no host, read without ``--nodes``:
#: the machine that wrote the log (an admin reading a node's own ``dmesg``).
THIS_NODE = "(the log's node)"


def _node_of(
    match: Match,
    nodes: Sequence[str] | None,
    rank_to_node: Mapping[int, str] | None,
    origin: Mapping[str | None, str] | None = None,
) -> str | None:
    """The job node a match came from.

    - A one-node job: that node, whatever the line says (every process of the job and every
      kernel message about its GPUs is on it).
    - Its host (short name; only a job node when ``nodes`` is given), else its rank's node from
      Slurm's task layout.
    - Else the node the line's file is about (``origin``, :func:`_log_origins`)."""
    if nodes is not None and len(nodes) == 1:
        return nodes[0]
    known = {_short(n): n for n in nodes} if nodes else None
    if match.host:
        short = _short(match.host)
        if known is None:
            return short
        if short in known:
            return known[short]
    if rank_to_node is not None and match.rank is not None and match.rank in rank_to_node:
        node = rank_to_node[match.rank]
        if known is None or _short(node) in known:
            return node if known is None else known[_short(node)]
    if origin is not None:
        return origin.get(match.source)
    return None


def _log_origins(matches: Sequence[Match], nodes: Sequence[str] | None) -> dict[str | None, str]:
    """The node each file's lines are about when a line does not say: the one host (a job node,
    when ``nodes`` is given) that the file's lines name. Read without ``nodes``, a file whose
    lines name no host at all is the log of the machine that wrote it (:data:`THIS_NODE`)."""
    known = {_short(n): n for n in nodes} if nodes else None
    hosts: dict[str | None, set[str]] = {}
    for match in matches:
        named = hosts.setdefault(match.source, set())
        if match.host:
            short = _short(match.host)
            if known is None:
                named.add(short)
            elif short in known:
                named.add(known[short])
    origins: dict[str | None, str] = {}
    for source, named in hosts.items():
        if len(named) == 1:
            origins[source] = next(iter(named))
        elif not named and nodes is None:
            origins[source] = THIS_NODE
    return origins


def classify(
    matches: Iterable[Match],
    *,
    nodes: Sequence[str] | None = None,
    rank_to_node: Mapping[int, str] | None = None,
    catalogue: SignatureCatalogue | None = None,
    limit: int = 20,
) -> LogVerdict:
    """The verdict on a failed job's log matches (pure; order of ``matches`` is the reading
    order, used when lines carry no time).

    - Knock-on symptoms are never the root and never blame a node.
    - The root is the first failure in time; a *decisive* hardware or system failure
      (fatal XID, uncorrectable ECC, node failure) beats an earlier application error.
    - An application root blames no node; a hardware or system root blames the nodes of
      the matches of its class that blame their node. When weak (non-decisive) evidence
      blames every node of a multi-node job, it tells nothing apart: no node is blamed.
    - ``requeue_exclude`` with no node to exclude becomes ``requeue``.
    """
    catalogue = catalogue if catalogue is not None else default_catalogue()
    ordered = list(matches)
    if not ordered:
        return LogVerdict(
            category="none",
            fault_domain="unknown",
            action="none",
            cause="no known failure signature in the log",
        )
    ordered = _rebase_years(ordered)
    assessed = [(m, catalogue.assess(m), i) for i, m in enumerate(ordered)]
    assessed = _escalate_repeats(_xid_knock_ons(assessed, catalogue), catalogue)
    assessed = _unrelated_crashes(assessed)
    assessed = _crash_on_bad_memory(assessed, nodes, rank_to_node)
    assessed = _compiler_retry(assessed)
    assessed = _oom_held_elsewhere(assessed)

    def when(item: tuple[Match, Assessment, int]) -> tuple[bool, float, int]:
        m, _, index = item
        return (m.timestamp is None, m.timestamp or 0.0, index)

    primary = sorted((a for a in assessed if not a[1].knock_on), key=when)
    knock_on = sorted((a for a in assessed if a[1].knock_on), key=when)
    if not primary:
        failing = [a for a in knock_on if a[1].action != "none"]
        if all(_process_ended(m, a, catalogue) for m, a, _ in failing) and any(
            m.signature_id in _ENDED_ON_PURPOSE for m, _, _ in knock_on
        ):
            # a job Slurm ended on purpose prints error words as it is killed, and its
            # launchers report the processes that ended
            failing = []
        lines = [_line(m) for m, _, _ in knock_on[:limit]]
        sources = [m.source for m, _, _ in knock_on[:limit]]
        if not failing:
            return LogVerdict(
                category=knock_on[0][1].category,
                fault_domain="unknown",
                action="none",
                signatures=lines,
                cause=f"warnings only ({knock_on[0][1].label}); nothing failed",
                sources=sources,
            )
        mismatch = _collective_mistake([m for m, _, _ in knock_on])
        if mismatch is None and nodes is not None and len(nodes) == 1:
            mismatch = _one_node_timeout([m for m, _, _ in failing], catalogue)
        if mismatch is not None:
            return LogVerdict(
                category="collective",
                fault_domain="application",
                action="stop",
                signatures=lines,
                cause=mismatch,
                sources=sources,
            )
        root = failing[0][1]
        cause = f"only symptoms of a failure elsewhere ({root.label}); no root cause in the log"
        quiet = _quiet_ranks([m for m, _, _ in knock_on])
        if quiet:
            names = ", ".join(str(r) for r in quiet)
            cause += (
                f"; rank{'s' if len(quiet) > 1 else ''} {names} did not time out: stopped first "
                "(its node, or a code path of its own)"
            )
        return LogVerdict(
            category=root.category,
            fault_domain="unknown",
            action="requeue",
            signatures=lines,
            cause=cause,
            sources=sources,
        )
    decisive = [a for a in primary if a[1].decisive and a[1].fault_class in ("hardware", "system")]
    root_item = decisive[0] if decisive else primary[0]
    if not decisive and _wraps_cuda_error(root_item[0]):
        # NCCL's "unhandled cuda error" wraps a CUDA error: the CUDA error beside it decides,
        # wherever it is printed (NCCL 2.12+ puts it after the wrapper: "Last error: ...")
        wrapped = [
            a
            for a in primary
            if a[0].signature_id.startswith("cuda.") and not _wraps_cuda_error(a[0])
        ]
        if not wrapped:
            # the CUDA error it wraps is one the line cannot pin on the program or the node (a
            # kernel's illegal address: a symptom, restarted once), or the failed call was
            # NCCL's own allocation of GPU memory ("Failed to CUDA calloc ..."): the GPU's
            # memory was full (the job's, or a leftover process's), which the NCCL WARN table
            # reads as a restart, not a node's fault
            wrapped = [
                a
                for a in knock_on
                if _gpu_kernel_fault(a[0], catalogue) or _nccl_cuda_alloc_failed(a[0])
            ]
        if wrapped:
            root_item = wrapped[0]
    root = root_item[1]
    klass = root.fault_class
    blame: list[str] = []
    weak_only = True
    if klass in ("hardware", "system"):
        origin = _log_origins(ordered, nodes)
        one_node = nodes is not None and len(nodes) == 1
        for m, a, _ in primary:
            if a.fault_class != klass:
                continue
            if not a.blame_node and not (one_node and _blames_sole_node(m, catalogue)):
                continue
            node = _node_of(m, nodes, rank_to_node, origin)
            if node is not None and node not in blame:
                blame.append(node)
                weak_only = weak_only and not a.decisive
        if weak_only and nodes and len(nodes) > 1 and set(blame) >= set(nodes):
            blame = []
    action = root.action
    if action == "requeue_exclude" and not blame:
        action = "requeue"
    elif action == "requeue" and blame:
        # a root that asks only for a restart (a file server gone quiet) beside a line of its
        # class that convicts a node (its prolog failed): the node is kept out
        action = "requeue_exclude"
    shown = [root_item] + [a for a in primary if a is not root_item]
    shown += [a for a in knock_on if a is not root_item]
    lines = [_line(m) for m, _, _ in shown[:limit]]
    where = f" on {', '.join(sorted(blame))}" if blame else ""
    return LogVerdict(
        category=root.category,
        fault_domain=klass,
        blame_nodes=sorted(blame),
        action=action,
        signatures=lines,
        cause=f"{root.label}{where}",
        sources=[m.source for m, _, _ in shown[:limit]],
    )


def _blames_sole_node(match: Match, catalogue: SignatureCatalogue) -> bool:
    """The line says one of the job's nodes failed, without saying which (Slurm's ``DUE TO
    NODE FAILURE``, printed by a surviving node's step daemon): in a one-node job it is that
    node."""
    signature = catalogue.get(match.signature_id)
    return signature is not None and signature.blame_sole_node


def _wraps_cuda_error(match: Match) -> bool:
    """A line that only says a CUDA call failed inside NCCL (``unhandled cuda error``): the CUDA
    error it wraps, printed beside it, says which."""
    return match.signature_id == "nccl.unhandled_cuda_error" or (
        match.signature_id == "nccl.error_raised"
        and match.code is not None
        and "unhandled cuda error" in match.code.lower()
    )


#: A GPU kernel's own fault, the SM's or MMU's exception (the driver logs Xid 13 or 31): the
#: program's bug most often, bad HBM, a GPU or its driver as well; a symptom, restarted once
#: (docs/signatures.md, "When the answer is stop")
GPU_KERNEL_FAULT = "cuda.illegal_memory_access"
GPU_KERNEL_FAULT_MEMBERS = frozenset(
    {
        "cudaErrorIllegalAddress",
        "cudaErrorHardwareStackError",
        "cudaErrorIllegalInstruction",
        "cudaErrorMisalignedAddress",
        "cudaErrorInvalidAddressSpace",
        "cudaErrorInvalidPc",
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
    }
)


def _gpu_kernel_fault(match: Match, catalogue: SignatureCatalogue) -> bool:
    """The line reports a GPU kernel's fault (:data:`GPU_KERNEL_FAULT_MEMBERS`): an illegal
    address, a misaligned one, an illegal instruction, ..."""
    if match.signature_id == GPU_KERNEL_FAULT:
        return True
    return catalogue.member_name(match) in GPU_KERNEL_FAULT_MEMBERS


def _nccl_cuda_alloc_failed(match: Match) -> bool:
    """NCCL's allocation of GPU memory failed (``Failed to CUDA calloc %ld bytes``, with or
    without its ``NCCL WARN`` prefix)."""
    return (
        match.signature_id == "nccl.warn"
        and match.code is not None
        and match.code.startswith("Failed to CUDA ")
    )


#: The catalogue's last resort: a line with a failure word and no more (``generic.error_line``).
GENERIC_ERROR = "generic.error_line"
#: Slurm ended the job on purpose: what its processes print as they are killed is no failure.
_ENDED_ON_PURPOSE = frozenset({"slurm.time_limit", "slurm.preemption", "slurm.cancelled"})
#: Launchers' reports that a process they started ended badly (Python's CalledProcessError,
#: torchrun's ChildFailedError, an MPI launcher's lost process) are of this category
LAUNCHER = "launcher"


#: Slurm's own reports that a task or a job ended with a non-zero code or a signal, not why
#: (members of ``emitters/slurm_daemons.toml``)
_SLURM_EXITS = frozenset(
    {"srun.task_exit_code", "stepd.failed_nonzero", "slurmctld.job_complete_exit"}
)


def _process_ended(match: Match, assessment: Assessment, catalogue: SignatureCatalogue) -> bool:
    """A line that says only that something failed or a process ended badly, not why: a
    failure word no entry knows (:data:`GENERIC_ERROR`), a launcher's report of its child's
    exit, srun's ``Exited with exit code N``."""
    if match.signature_id == GENERIC_ERROR or assessment.category == LAUNCHER:
        return True
    return catalogue.member_name(match) in _SLURM_EXITS


#: Lines that end a job's processes: an XID the driver logs as a channel is torn down after them
#: (XID 45) is their consequence.
_ENDS_PROCESSES = frozenset(
    {"slurm.task_killed", "slurm.cancelled", "slurm.time_limit", "slurm.preemption"}
)


def _about(match: Match) -> str | None:
    """What a line is about, for counting lines per node: its host (short name), else its
    file (a node's own kernel log names no host)."""
    return _short(match.host) if match.host else match.source


def _xid_knock_ons(
    assessed: list[tuple[Match, Assessment, int]], catalogue: SignatureCatalogue
) -> list[tuple[Match, Assessment, int]]:
    """XIDs that only follow another failure are knock-on symptoms (the catalogue's
    ``knock_on`` rule, :func:`is_knock_on`): another XID on the same node (host, else file),
    or, for a rule of ``any`` (XID 45, a channel torn down as its process ends), an
    application error or a kill anywhere in the log."""
    codes: dict[str | None, list[int]] = {}
    for m, _, _ in assessed:
        if m.xid is not None:
            codes.setdefault(_about(m), []).append(m.xid)
    if not codes:
        return assessed
    ended = any(
        a.fault_class == "application" or m.signature_id in _ENDS_PROCESSES
        for m, a, _ in assessed
        if m.xid is None
    )
    out = []
    for m, a, i in assessed:
        signature = catalogue.get(m.signature_id)
        if m.xid is not None and signature is not None:
            info = catalogue.xids.assess(m.xid, m.text)
            others = codes[_about(m)]
            if not a.knock_on and (
                is_knock_on(info, others) or (ended and info.knock_on.strip() == "any")
            ):
                a = replace(a, knock_on=True, decisive=False, blame_node=False)
        out.append((m, a, i))
    return out


_WORK = re.compile(
    r"WorkNCCL\(SeqNum=(?P<seq>\d{1,12}), OpType=(?P<op>\w{1,40})"
    r"(?:, NumelIn=(?P<numel>-?\d{1,15}))?"
)
# the process group a watchdog line is about: "[PG 5 Rank 0]", "[PG ID 0 PG GUID 0(default_pg) ..."
_PG = re.compile(r"\[PG (?:ID )?(?P<pg>\d{1,9})\b")
#: PyTorch's warning that the program exits without destroy_process_group()
EXIT_WITHOUT_DESTROY = "torch.exit_without_destroy"
#: Lines that say a collective or its watchdog timed out on this rank
_TIMEOUTS = frozenset(
    {"torch.nccl_watchdog_timeout", "torch.heartbeat_timeout", "torch.store_barrier_timeout"}
)
#: A collective timeout at this sequence number or below happened at start-up: the ranks never
#: met (a wrong world size, address or interface), not a node that went quiet in training.
STARTUP_SEQ = 2


def _collective_mistake(symptoms: Sequence[Match]) -> str | None:
    """Why collective timeouts with no other cause in the log are the program's own mistake,
    or None when they are not (then one rank's node may have gone quiet: requeue).

    From what the watchdog lines carry (``WorkNCCL(SeqNum=, OpType=, NumelIn=)``, compared
    within one process group, whose sequence numbers are its own), a launch or code mismatch:
    - ranks that timed out in different collectives (another sequence number, operation or
      size): a code path that not every rank takes;
    - the first collectives (``SeqNum`` <= :data:`STARTUP_SEQ`): the ranks never met;
    - a checkpoint save started before the first timeout: the save outlasted the timeout;
    - the program's exit begun before the first timeout (PyTorch's warning that it exits without
      ``destroy_process_group()``, printed as its process groups are torn down): the hang is
      in the program's own teardown, not a peer that went quiet in training.
    """
    groups: dict[str | None, dict[int | None, tuple[int, str, str | None]]] = {}
    saving = False
    exiting = False
    timed_out = False
    for match in symptoms:
        if match.signature_id == "training.checkpoint_save" and not groups:
            saving = True
        if match.signature_id == EXIT_WITHOUT_DESTROY and not timed_out:
            exiting = True
        if match.signature_id in _TIMEOUTS:
            timed_out = True
        if match.signature_id != "torch.nccl_watchdog_timeout":
            continue
        found = _WORK.search(match.text)
        if found is None:
            continue
        pg = _PG.search(match.text)
        works = groups.setdefault(pg["pg"] if pg else None, {})
        works.setdefault(match.rank, (int(found["seq"]), found["op"], found["numel"]))
    for works in groups.values():
        kinds = set(works.values())
        if len(kinds) > 1:
            shown = ", ".join(
                f"SeqNum={s} {o}" + (f" NumelIn={n}" if n else "") for s, o, n in sorted(kinds)
            )
            return (
                f"ranks timed out in different collectives ({shown}): "
                "a code path not every rank takes"
            )
    first = [work for works in groups.values() for work in works.values()]
    if first and max(seq for seq, _, _ in first) <= STARTUP_SEQ:
        seq, op, _ = first[0]
        return (
            f"the first collectives timed out (SeqNum={seq} {op}): the ranks never met; "
            "check the launch (world size, master address, network interface)"
        )
    if saving and first:
        return (
            "a checkpoint save outlasted the collective timeout: "
            "raise the timeout or save asynchronously"
        )
    if exiting and timed_out:
        return (
            "the collectives hung after the program began to exit without "
            "destroy_process_group(): its teardown, not a peer; destroy the process groups "
            "before exit"
        )
    return None


#: A one-node job's waits that are timeouts too (read as :data:`_TIMEOUTS` are): gloo's
#: collective timeout, and a store client that was connected and waited for a key another rank
#: never set (PyTorch's members in emitters/torch_distributed.toml). A client that never
#: connected is not one: its address, the launch's, is at fault as often as the program.
_ONE_NODE_WAITS = frozenset({"gloo.timeout"})
_STORE_WAITS = frozenset(
    {
        "c10d socket wait timed out",
        "c10d socket poll returned 0 (timeout)",
        "gloo operation timeout",
        "gloo pair closed by timeout",
        "monitoredBarrier failure",
    }
)


def _waited(match: Match, catalogue: SignatureCatalogue) -> bool:
    """Whether ``match`` says this rank timed out waiting for another rank of its job."""
    if match.signature_id in _TIMEOUTS or match.signature_id in _ONE_NODE_WAITS:
        return True
    if match.signature_id != "torch.distributed_error" or not match.code:
        return False
    signature = catalogue.get(match.signature_id)
    tables = signature.tables if signature is not None else ()
    member = catalogue.emitters.lookup(tables, match.code)
    return member is not None and member.name in _STORE_WAITS


def _one_node_timeout(
    failing: Sequence[Match], catalogue: SignatureCatalogue | None = None
) -> str | None:
    """Why collective timeouts in a one-node job, with no other cause in the log, are the
    program's own, or None when no rank timed out.

    Every rank is on the one node, so no network and no other node stands between them: a
    rank that did not reach the collective in time was busy elsewhere in the program (one
    rank's evaluation, tokenising or saving, a collective only some ranks call, a deadlock),
    or its GPU hung, which the driver reports as an XID (decisive: it wins, in the log and in
    the controller's node evidence). A startup hang from broken peer-to-peer is the first
    collectives' rule already (:func:`_collective_mistake`). A rank that never joined the
    process group (the store-based barrier's or the store's timeout) is the same on one node:
    it crashed (its own error is then the root), never started, or was busy elsewhere. So is
    gloo's collective timeout, and a store client's wait for a key another rank never set
    (:func:`_waited`); a client that could not connect to the store at all is not (the
    address it was given may be the node's, as a wrong host entry)."""
    catalogue = catalogue if catalogue is not None else default_catalogue()
    timed_out = [m for m in failing if _waited(m, catalogue)]
    if not timed_out:
        return None
    return (
        f"collectives timed out in a one-node job ({timed_out[0].signature_id}), with no GPU "
        "or driver error: a rank busy elsewhere in the program (an evaluation or a save on one "
        "rank, a collective not every rank calls, a deadlock); raise the timeout or even out "
        "the work"
    )


def _quiet_ranks(symptoms: Sequence[Match]) -> list[int]:
    """The ranks missing from an otherwise complete run of ranks that timed out in a
    collective (0-3 and 5-7 did, 4 did not): the one that stopped first, which the others
    waited for. Empty when the timeouts do not say (one rank, or too many missing). Named in
    the verdict's cause, never blamed: a quiet rank alone does not say whose fault it was."""
    timed = {
        m.rank
        for m in symptoms
        if m.signature_id == "torch.nccl_watchdog_timeout" and m.rank is not None
    }
    if len(timed) < 2:
        return []
    missing = sorted(set(range(max(timed) + 1)) - timed)
    return missing if 0 < len(missing) <= max(1, (max(timed) + 1) // 4) else []


def _escalate_repeats(
    assessed: list[tuple[Match, Assessment, int]], catalogue: SignatureCatalogue
) -> list[tuple[Match, Assessment, int]]:
    """Repeats escalate: a hardware warning that a signature says to count (``escalate_after``,
    e.g. corrected memory errors) becomes a fault of its node once that many events about one
    node (its host, else its file) are in the log: a line counts as the events it reports
    (EDAC's "120 CE memory read error" is 120, a storm in one line), else as one."""
    counts: dict[tuple[str, str | None], int] = {}
    for m, _, _ in assessed:
        signature = catalogue.get(m.signature_id)
        if signature is not None and signature.escalate_after:
            key = (m.signature_id, _about(m))
            counts[key] = counts.get(key, 0) + max(1, m.count)
    if not counts:
        return assessed
    escalated = []
    for m, a, i in assessed:
        signature = catalogue.get(m.signature_id)
        key = (m.signature_id, _about(m))
        if (
            signature is not None
            and signature.escalate_after
            and (counts[key] >= signature.escalate_after)
        ):
            a = replace(
                a,
                action="requeue_exclude",
                knock_on=False,
                blame_node=True,
                label=f"{a.label} repeated: {counts[key]} events about one node",
            )
        escalated.append((m, a, i))
    return escalated


# The kernel's report of a user process killed by a memory fault (arch/x86/mm/fault.c
# show_signal_msg: "%s[%d]: segfault at %lx ip %px sp %px error %lx", then " in <object>[...]";
# arch/x86/kernel/traps.c: "traps: %s[%d] general protection fault ip:%lx sp:%lx error:%lx"):
# the program's name (comm, at most 15 characters) and the object it crashed in.
_KERNEL_CRASH = re.compile(
    r"(?:^|[\s\]:])(?P<comm>[^\s\[\]]{1,16})\[\d{1,10}\]:? "
    r"(?:segfault at [0-9a-f]{1,16} ip|general protection fault ip:)"
)
_CRASH_OBJECT = re.compile(r" in (?P<object>[^\s\[]{1,200})\[[0-9a-f]{1,16}\+[0-9a-f]{1,16}\]")
#: Distinct programs, each in an object of its own, that the kernel saw crash on one node
UNRELATED_CRASHES = 2


def _node_memory_fault(a: Assessment, label: str) -> Assessment:
    """A program's crash read as its node's memory or CPU: the node excluded from the
    restart, never decisive on its own (what :func:`_unrelated_crashes` and
    :func:`_crash_on_bad_memory` conclude)."""
    return replace(
        a,
        fault_class="hardware",
        category="host_memory",
        action="requeue_exclude",
        knock_on=False,
        decisive=False,
        blame_node=True,
        label=label,
    )


def _unrelated_crashes(
    assessed: list[tuple[Match, Assessment, int]],
) -> list[tuple[Match, Assessment, int]]:
    """Crashes of unrelated programs on one node are its memory or CPU: the kernel's segfault
    and general-protection reports (:data:`_KERNEL_CRASH`) about one node (its host, else its
    file) that name at least :data:`UNRELATED_CRASHES` different programs, crashing in as many
    different objects, become a fault of that node (weak: excluded, never decisive).

    One program's crash is its bug, its build or the node's memory, and the line cannot tell
    (``process.segfault``: restarted once); a bug crashes its own program, or every program
    that loads the same broken library (then the object is the same), not a compiler, a shell
    and a Python process in objects of their own. A node with bit flips does (the kernel prints
    the CPU since 6.2 for this reason: crashes that share a core, not a program)."""
    seen: dict[str | None, set[tuple[str, str | None]]] = {}
    crashes: list[tuple[int, str | None]] = []
    for k, (m, _, _) in enumerate(assessed):
        if m.signature_id not in ("process.segfault", "kernel.message"):
            continue
        found = _KERNEL_CRASH.search(m.text)
        if found is None:
            continue
        where = _CRASH_OBJECT.search(m.text, found.end())
        about = _about(m)
        seen.setdefault(about, set()).add((found["comm"], where["object"] if where else None))
        crashes.append((k, about))
    if not crashes:
        return assessed
    unrelated = {
        about
        for about, pairs in seen.items()
        if len({comm for comm, _ in pairs}) >= UNRELATED_CRASHES
        and len({obj for _, obj in pairs if obj is not None}) >= UNRELATED_CRASHES
    }
    if not unrelated:
        return assessed
    out = list(assessed)
    for k, about in crashes:
        if about not in unrelated:
            continue
        m, a, i = out[k]
        programs = sorted({comm for comm, _ in seen[about]})
        label = (
            f"{len(programs)} unrelated programs crashed on one node "
            f"({', '.join(programs[:3])}): its memory or CPU"
        )
        out[k] = (m, _node_memory_fault(a, label), i)
    return out


#: A program's crash that the node's bad memory causes as often as its own bug: a segfault or
#: bus error in the program's words or srun's (``process.segfault``), PyTorch's DataLoader worker
#: killed by SIGBUS (``torch.dataloader_bus_error``), the shell's report of a command killed by
#: SIGSEGV or SIGBUS (``shell.signal_exit``, :data:`_CRASH_SIGNALS`), and the kernel's own
#: segfault and general-protection reports (``kernel.message`` lines :data:`_KERNEL_CRASH`
#: recognises)
_CRASHES = frozenset({"process.segfault", "torch.dataloader_bus_error"})
_CRASH_SIGNALS = frozenset({"Segmentation fault", "Bus error"})


def _is_crash(match: Match) -> bool:
    if match.signature_id in _CRASHES:
        return True
    if match.signature_id == "shell.signal_exit":
        return match.code in _CRASH_SIGNALS
    return match.signature_id == "kernel.message" and _KERNEL_CRASH.search(match.text) is not None


def _crash_on_bad_memory(
    assessed: list[tuple[Match, Assessment, int]],
    nodes: Sequence[str] | None,
    rank_to_node: Mapping[int, str] | None,
) -> list[tuple[Match, Assessment, int]]:
    """A crash on a node whose memory the same log shows failing is that node's: a segfault
    or bus error (:func:`_is_crash`) beside a line of the node's memory hardware (a signature
    of class ``hardware`` and category ``host_memory``: EDAC's and the machine-check handler's
    corrected errors, mcelog's, a memory tester's failure, an uncorrectable error) about the
    same node becomes a fault of that node (weak: excluded, never decisive).

    A crash alone never blames a node (``process.segfault``: restarted once, no node): programs
    crash from their own bugs far more often than from bad RAM. Corrected errors alone are a
    warning until they repeat (``escalate_after``). Together they are the sig11 lore's case:
    memory that flips bits where the program's pages are. Both on one node (a one-node job's
    lines are all its node's; otherwise the line's host, rank or file, :func:`_node_of`). In a
    job of several nodes the crash must name its own host or rank: a job's output that mixes
    every node's lines is not about the one host its kernel lines name."""
    crashes = [k for k, (m, a, _) in enumerate(assessed) if _is_crash(m) and not a.blame_node]
    if not crashes:
        return assessed
    memory = [
        m for m, a, _ in assessed if a.fault_class == "hardware" and a.category == "host_memory"
    ]
    if not memory:
        return assessed
    origin = _log_origins([m for m, _, _ in assessed], nodes)
    failing = {_node_of(m, nodes, rank_to_node, origin) for m in memory} - {None}
    out = list(assessed)
    several = nodes is not None and len(nodes) > 1
    for k in crashes:
        m, a, i = out[k]
        if _node_of(m, nodes, rank_to_node, None if several else origin) not in failing:
            continue
        label = f"{a.label} on a node whose memory reports errors in the same log"
        out[k] = (m, _node_memory_fault(a, label), i)
    return out


_SIZE = r"(?P<{}>\d{{1,9}}(?:\.\d{{1,4}})?) (?P<{}u>bytes|[KMGT]iB)"
#: PyTorch's caching allocator's out-of-memory sizes (c10/cuda/CUDACachingAllocator.cpp), in the
#: texts of 1.x-2.0 ("(GPU 0; 10.73 GiB total capacity; 9.85 GiB already allocated; 46.44 MiB
#: free; 9.86 GiB reserved in total by PyTorch)", before 1.4 "... cached)") and of 2.1+ ("GPU 0
#: has a total capacity of 79.15 GiB of which 141.25 MiB is free. ... Including non-PyTorch
#: memory, this process has 78.99 GiB memory in use. Of the allocated memory 77.21 GiB is
#: allocated by PyTorch, and 283.51 MiB is reserved by PyTorch but unallocated.")
_OOM_TOTAL = re.compile(
    _SIZE.format("total", "total") + " total capacity|total capacity of " + _SIZE.format("t2", "t2")
)
_OOM_FREE = re.compile(
    _SIZE.format("free", "free") + " free\\b|of which " + _SIZE.format("f2", "f2") + " is free"
)
_OOM_OWN = re.compile(
    "this process has " + _SIZE.format("proc", "proc") + " memory in use"
    "|" + _SIZE.format("alloc", "alloc") + " (?:already allocated|is allocated by PyTorch)"
    "|" + _SIZE.format("res", "res") + " (?:reserved in total by PyTorch|cached\\b)"
    "|and " + _SIZE.format("unalloc", "unalloc") + " is reserved by PyTorch but unallocated"
)
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
#: More than this share of the GPU held outside the program's allocator: another process's
#: (docs/signatures.md, "When the answer is stop"); a CUDA context and the libraries' workspaces
#: take a few hundred MiB, far below it
HELD_ELSEWHERE = 0.5


def _bytes(found: re.Match[str], name: str) -> float:
    return float(found[name]) * _UNITS[found[name + "u"]]


def oom_held_elsewhere(text: str) -> tuple[float, float] | None:
    """``(held outside the program, the GPU's capacity)`` in bytes when PyTorch's
    out-of-memory line gives its sizes and more than :data:`HELD_ELSEWHERE` of the GPU was held
    outside the process's own memory: another process on the GPU (a leftover of an earlier
    job, another job, a second rank on the same GPU). None otherwise."""
    total_m, free_m = _OOM_TOTAL.search(text), _OOM_FREE.search(text)
    if total_m is None or free_m is None:
        return None
    total = _bytes(total_m, "total" if total_m["total"] else "t2")
    free = _bytes(free_m, "free" if free_m["free"] else "f2")
    sizes: dict[str, float] = {}
    for found in _OOM_OWN.finditer(text):
        for name in ("proc", "alloc", "res", "unalloc"):
            if found[name] and name not in sizes:
                sizes[name] = _bytes(found, name)
    if not sizes:
        return None
    if "proc" in sizes:  # 2.1+: the process's own use, PyTorch's and the rest
        own = sizes["proc"]
    elif "unalloc" in sizes:  # 2.1+ without it: allocated plus reserved but unallocated
        own = sizes.get("alloc", 0.0) + sizes["unalloc"]
    else:  # 1.x: reserved in total (or cached), at least what is allocated
        own = max(sizes.get("alloc", 0.0), sizes.get("res", 0.0))
    elsewhere = total - free - own
    if total <= 0 or elsewhere <= HELD_ELSEWHERE * total:
        return None
    return elsewhere, total


def _oom_held_elsewhere(
    assessed: list[tuple[Match, Assessment, int]],
) -> list[tuple[Match, Assessment, int]]:
    """A GPU out-of-memory of the program whose own sizes say most of the GPU was held by
    another process (:func:`oom_held_elsewhere`): not the program's memory use, and not
    surely the node's either (a second rank on the same GPU is the job's launch): restarted
    once, no node blamed."""
    out = []
    for m, a, i in assessed:
        if a.fault_class == "application" and a.category == "gpu_memory" and m.xid is None:
            held = oom_held_elsewhere(m.text)
            if held is not None:
                elsewhere, total = held
                a = replace(
                    a,
                    fault_class="unknown",
                    action="requeue",
                    knock_on=False,
                    decisive=False,
                    blame_node=False,
                    label=f"{a.label}: {elsewhere / (1 << 30):.2f} of {total / (1 << 30):.2f} GiB "
                    "of the GPU held by another process (a leftover of an earlier job, another "
                    "job, a second rank on the GPU)",
                )
        out.append((m, a, i))
    return out


#: a compiler killed by the kernel (its out-of-memory killer's SIGKILL), or the kernel's kill
#: itself: then the driver's retry that passed says the memory was freed, not that it is bad
_KILLED_COMPILER = frozenset({"gcc.ice_killed", "kernel.oom_killed", "slurm.oom_kill"})


def _compiler_retry(
    assessed: list[tuple[Match, Assessment, int]],
) -> list[tuple[Match, Assessment, int]]:
    """GCC's driver re-runs a compiler that crashed; when the re-run passes it prints "The bug
    is not reproducible, so it is likely a hardware or OS problem" (``gcc.ice_not_reproducible``:
    the node's memory or CPU). When the crash was a SIGKILL from the out-of-memory killer
    (:data:`_KILLED_COMPILER` in the log), the re-run passed because memory was free again: the
    line is then a symptom of the job's memory use, not of the node."""
    if not any(m.signature_id in _KILLED_COMPILER for m, _, _ in assessed):
        return assessed
    return [
        (m, replace(a, action="requeue", knock_on=True, decisive=False, blame_node=False), i)
        if m.signature_id == "gcc.ice_not_reproducible"
        else (m, a, i)
        for m, a, i in assessed
    ]


def _rebase_years(matches: list[Match]) -> list[Match]:
    """Give yearless times (syslog, glog) the year of the latest time that has one, so that a
    syslog line compares with Slurm's ISO times; a date that would then lie more than half a
    year after that time belongs to the year before (logs that span New Year)."""
    known = [m.timestamp for m in matches if m.timestamp is not None and not m.year_assumed]
    if not known:
        return matches
    latest = max(known)
    year = time.gmtime(latest).tm_year
    rebased: list[Match] = []
    for match in matches:
        if match.timestamp is None or not match.year_assumed:
            rebased.append(match)
            continue
        when = time.gmtime(match.timestamp)
        fraction = match.timestamp - int(match.timestamp)
        stamp = _utc(year, when.tm_mon, when.tm_mday, when.tm_hour, when.tm_min, when.tm_sec)
        if stamp is not None and stamp - latest > 183 * 86400:
            stamp = _utc(
                year - 1, when.tm_mon, when.tm_mday, when.tm_hour, when.tm_min, when.tm_sec
            )
        if stamp is None:
            rebased.append(match)
            continue
        rebased.append(replace(match, timestamp=stamp + fraction))
    return rebased


def _line(match: Match) -> dict[str, Any]:
    return {"id": match.signature_id, "line_no": match.line_no, "text": match.text}


def evidence_payload(match: Match, catalogue: SignatureCatalogue | None = None) -> dict[str, Any]:
    """The ``log_signature`` evidence payload (decide.model) for one match. ``blame_node``
    is true only for a hardware/system line that is not a knock-on symptom."""
    catalogue = catalogue if catalogue is not None else default_catalogue()
    meaning = catalogue.assess(match)
    payload: dict[str, Any] = {
        "signature": match.signature_id,
        "fault_class": meaning.fault_class,
        "blame_node": bool(meaning.blame_node and not meaning.knock_on),
        "text": match.text,
        "knock_on": meaning.knock_on,
        "category": meaning.category,
        "line_no": match.line_no,
    }
    if match.xid is not None:
        payload["xid"] = match.xid
    if match.code is not None:
        payload["code"] = match.code
    if match.rank is not None:
        payload["rank"] = match.rank
    if match.host is not None:
        payload["host"] = match.host
    if match.gpu is not None:
        payload["gpu"] = match.gpu
    if match.timestamp is not None:
        payload["timestamp"] = match.timestamp
        payload["year_assumed"] = match.year_assumed
    return payload


def match_from_payload(payload: Mapping[str, Any], source: str | None = None) -> Match | None:
    """The :class:`Match` a ``log_signature`` payload was made from (what the controller has),
    so that it classifies a job's lines with :func:`classify`, as ``explain-log`` does. None
    when the payload names no signature."""
    signature = payload.get("signature")
    if not isinstance(signature, str) or not signature:
        return None

    def number(key: str) -> int | None:
        value = payload.get(key)
        return value if type(value) is int else None

    stamp = payload.get("timestamp")
    host = payload.get("host")
    return Match(
        signature_id=signature,
        line_no=number("line_no") or 0,
        text=str(payload.get("text", "")),
        host=host if isinstance(host, str) and host else None,
        rank=number("rank"),
        gpu=number("gpu"),
        timestamp=float(stamp) if type(stamp) in (int, float) else None,
        source=source,
        xid=number("xid"),
        year_assumed=payload.get("year_assumed") is True,
        code=code if isinstance(code := payload.get("code"), str) and code else None,
    )


# ------------------------------------------------------------------------ loading


def nested_quantifiers(pattern: str) -> list[str]:
    """Repeats inside repeats in ``pattern`` (the shape of catastrophic backtracking), as
    readable fragments; empty when the pattern is safe by this rule."""
    try:
        import re._parser as sre_parse  # Python 3.11+
    except ImportError:  # pragma: no cover - older layout
        import sre_parse  # type: ignore[no-redef]
    repeats = {sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, sre_parse.POSSESSIVE_REPEAT}
    found: list[str] = []

    def walk(items: Any, inside: bool) -> None:
        for op, arg in items:
            if op in repeats:
                low, high, body = arg
                unbounded_or_many = high is sre_parse.MAXREPEAT or high > 1
                if inside and unbounded_or_many:
                    found.append(f"{{{low},{'' if high is sre_parse.MAXREPEAT else high}}}")
                walk(body, inside or unbounded_or_many)
            elif op is sre_parse.SUBPATTERN:
                walk(arg[-1], inside)
            elif op is sre_parse.BRANCH:
                for branch in arg[1]:
                    walk(branch, inside)
            elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
                walk(arg[1], inside)
            elif op is sre_parse.GROUPREF_EXISTS:
                walk(arg[1], inside)
                if arg[2] is not None:
                    walk(arg[2], inside)
            elif op is sre_parse.ATOMIC_GROUP:
                walk(arg, inside)

    walk(sre_parse.parse(pattern), False)
    return found


@lru_cache(maxsize=1)
def default_catalogue() -> SignatureCatalogue:
    """The shipped catalogue with the shipped XID catalogue (loaded once)."""
    return load_signatures()


def load_signatures(
    path: str | os.PathLike[str] | None = None, *, xids: XidCatalogue | None = None
) -> SignatureCatalogue:
    """Read and check a signature catalogue; ``None`` reads the one shipped with the package."""
    text, data, source = read_catalogue(
        path, name="signatures.toml", what="the signature catalogue", error=SignatureError
    )
    return _catalogue(text, data, source, xids)


def signatures_from_toml(
    text: str, source: str = "<string>", *, xids: XidCatalogue | None = None
) -> SignatureCatalogue:
    """Parse and check catalogue ``text``; ``source`` is named in every error."""
    return _catalogue(text, parse_toml(text, source, error=SignatureError), source, xids)


def _catalogue(
    text: str, data: dict[str, Any], source: str, xids: XidCatalogue | None
) -> SignatureCatalogue:
    xids = xids if xids is not None else load_xid_catalogue()
    read, problems = catalogue_entries(text, data, source, "signature", SignatureEntry)
    signatures: dict[str, tuple[int, Signature]] = {}
    for index, entry in read:
        broken = [
            entry_problem(source, text, ("signature", index, key), problem)
            for key, problem in _broken_rules(entry)
        ]
        if entry.id in signatures:
            broken.append(
                entry_problem(
                    source,
                    text,
                    ("signature", index, "id"),
                    f"{entry.id} is listed twice; keep one",
                )
            )
        problems.extend(broken)
        if not broken:
            signatures[entry.id] = (index, _signature(entry))
    if problems:
        raise SignatureError(*problems)
    catalogue = SignatureCatalogue(tuple(s for _, s in signatures.values()), xids, source)
    for index, signature in signatures.values():
        found = next(catalogue.scan([signature.example]), None)
        if found is None or found.signature_id != signature.id:
            got = "nothing" if found is None else found.signature_id
            problems.append(
                entry_problem(
                    source,
                    text,
                    ("signature", index, "example"),
                    f"recognised as {got}, not as {signature.id}; fix the pattern or keywords, "
                    "or move the entry before the one that takes it",
                )
            )
    if problems:
        raise SignatureError(*problems)
    return catalogue


def _broken_rules(entry: SignatureEntry) -> list[tuple[str, str]]:
    """The rules across an entry's keys that it breaks: (key, problem)."""
    node_class = entry.klass in ("hardware", "system")
    broken = []
    if entry.blame_node and not node_class:
        problem = f"true with class {entry.klass}: only hardware or system lines blame a node"
        broken.append(("blame_node", problem))
    if entry.blame_sole_node and (entry.blame_node or not node_class):
        problem = "only for a hardware or system line that does not blame its own node"
        broken.append(("blame_sole_node", problem))
    if entry.knock_on and (entry.blame_node or entry.decisive):
        broken.append(
            ("knock_on", "true: a knock-on symptom is neither decisive nor blames a node")
        )
    if entry.parser == "regex" and entry.pattern is None:
        broken.append(("pattern", "missing; a regex signature needs a pattern"))
    if entry.parser != "regex" and entry.pattern is not None:
        broken.append(("pattern", f"not used with parser = {entry.parser!r}; remove it"))
    if entry.knock_on_xids and entry.parser != "xid":
        broken.append(("knock_on_xids", 'only for parser = "xid"'))
    if entry.tables:
        known = load_emitter_tables().tables
        missing = [t for t in entry.tables if t not in known]
        if missing:
            problem = (
                f"no emitter table {', '.join(missing)} (signals/data/emitters: {', '.join(known)})"
            )
            broken.append(("tables", problem))
        if entry.pattern is None or "(?P<code" not in entry.pattern:
            broken.append(("tables", "the pattern needs a (?P<code>...) group naming the error"))
    elif entry.unlisted != "classify":
        broken.append(("unlisted", "only with tables"))
    elif entry.whole_text:
        broken.append(("whole_text", "only with tables"))
    if entry.escalate_after and (entry.escalate_after < 2 or not entry.knock_on or not node_class):
        broken.append(
            (
                "escalate_after",
                "only for a hardware or system warning (knock_on = true), and at least 2",
            )
        )
    return broken


def _signature(entry: SignatureEntry) -> Signature:
    return Signature(
        id=str(entry.id),
        description=entry.description.strip(),
        keywords=tuple(str(k) for k in entry.keywords),
        regex=re.compile(entry.pattern) if entry.pattern is not None else None,
        fault_class=str(entry.klass),
        category=entry.category.strip(),
        action=str(entry.action),
        example=str(entry.example),
        knock_on=entry.knock_on,
        decisive=entry.decisive,
        blame_node=entry.blame_node,
        blame_sole_node=entry.blame_sole_node,
        parser=str(entry.parser),
        knock_on_xids=frozenset(entry.knock_on_xids),
        escalate_after=entry.escalate_after,
        tables=tuple(str(t) for t in entry.tables),
        unlisted=str(entry.unlisted),
        whole_text=entry.whole_text,
    )


def scan(
    lines: Iterable[str | bytes],
    *,
    catalogue: SignatureCatalogue | None = None,
    source: str | None = None,
    year: int | None = None,
) -> Iterator[Match]:
    """Matches in ``lines`` with the shipped catalogue (or ``catalogue``)."""
    catalogue = catalogue if catalogue is not None else default_catalogue()
    return catalogue.scan(lines, source=source, year=year)
