"""Emitter tables: every message a program can print, classified, from the program's own source.

A signature catalogue grown from example logs knows the messages someone happened to post. An
emitter table lists an emitter's whole message set, enumerated from its source or headers (the
CUDA runtime's ``cudaError_t``, the driver's ``CUresult``, NCCL's ``ncclResult_t``, Slurm's error
table, the kernel's message forms, ...), each member with its class and action, and one example
line in the shape users see. Data files admins can read: ``signals/data/emitters/*.toml``
(``docs/signatures.md`` has the coverage table).

Two uses:

- a signature with ``tables = [...]`` (``signatures.toml``) captures the error's name, value or
  message in a group named ``code`` (``code2``... for other alternatives) and takes its class
  and action from the member it names (:meth:`EmitterTables.lookup`), so one entry classifies
  every member of an enumeration, not only the ones seen in a log;
- ``tests/unit/test_emitter_coverage.py`` scans every member's example with the shipped
  catalogue and holds the verdict to the member's class and action: the coverage is measured,
  not assumed (``python -m bench.attribution --coverage`` prints the table).

A member that stands for a family (NCCL's WARN call sites, a kernel message whose words changed
between releases) lists its other printf formats in ``forms``; each is read as the member, and
the coverage test prints every form with values of its kinds and looks it up.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from types import MappingProxyType
from typing import Annotated

import msgspec

from slurm_recovery.contract.catalogue import FaultClass
from slurm_recovery.schema import Choice, SchemaError, convert, parse_toml
from slurm_recovery.signals.xid import LOG_ACTIONS

#: A member's class: a fault class, or ``unclassified`` (a wrapper whose wrapped error decides)
CLASSES = (*(str(c) for c in FaultClass), "unclassified")


class EmitterError(SchemaError):
    """An emitter table cannot be used. One line per problem: file, line, key, fix."""


class MemberClass(Choice):
    OPTIONS = CLASSES


class MemberAction(Choice):
    OPTIONS = LOG_ACTIONS


class MemberEntry(
    msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True, rename={"klass": "class"}
):
    name: Annotated[str, msgspec.Meta(min_length=1)]
    example: Annotated[str, msgspec.Meta(min_length=1)]
    klass: MemberClass
    action: MemberAction
    blame_node: bool
    note: str = ""
    message: str = ""
    value: int | None = None
    forms: tuple[str, ...] = ()


class TableEntry(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    emitter: Annotated[str, msgspec.Meta(min_length=1)]
    source: Annotated[str, msgspec.Meta(min_length=1)]
    members_total: Annotated[int, msgspec.Meta(ge=0)]
    member: tuple[MemberEntry, ...]


@dataclass(frozen=True)
class Member:
    """One message of an emitter, classified (``fault_class`` ``unclassified``: not decided;
    a signature that names it falls back to its own class and action)."""

    table: str
    name: str
    example: str
    fault_class: str
    action: str
    blame_node: bool
    note: str = ""
    message: str = ""
    value: int | None = None
    #: the member's other printf formats (its family's other call sites, other releases'
    #: words), read as it is: found in a line by their literal parts, as ``message`` is
    forms: tuple[str, ...] = ()

    @property
    def classified(self) -> bool:
        return self.fault_class != "unclassified"

    @property
    def label(self) -> str:
        """How a verdict names it: ``cudaErrorIllegalAddress (an illegal memory access ...)``."""
        return f"{self.name} ({self.message})" if self.message else self.name


@dataclass(frozen=True)
class EmitterTable:
    """One file: an emitter's members as enumerated from ``source``."""

    name: str  # the file's stem: what ``tables = [...]`` names
    emitter: str
    source: str
    members_total: int
    members: tuple[Member, ...]


def _normal(text: str) -> str:
    return " ".join(text.strip().strip("'\"").split()).rstrip(".").lower()


#: A printf conversion in a message (``%s``, ``%lu``, ``%#x``, glibc's ``%m``, the kernel's
#: ``%pV``, Slurm's ``%ps``, ``%"PRIu64"``): the message is a format, and what a conversion
#: printed can be anything.
CONVERSION = re.compile(
    r"%\"PRI\w{1,8}\"|%[-+ #0']{0,4}(?:\d{1,3}|\*)?(?:\.(?:\d{1,3}|\*))?(?:hh|h|ll|l|z|j|t|L|q)?"
    r"(?:p(?:[A-Z][A-Za-z0-9]{0,2}|[a-z](?![a-z]))?|[diouxXeEfgGaAcsnm])"
)
#: Literal characters a message must have to be looked for inside a line: shorter ones would
#: be found in lines that are not theirs.
MIN_LITERAL = 8


def literal_pieces(message: str) -> tuple[str, ...]:
    """The literal parts of ``message``'s first line between its printf conversions, lower
    case and with spacing normalised (empty when together they are shorter than
    :data:`MIN_LITERAL`). A message of several lines is printed, and scanned, line by line."""
    first = message.replace("%%", "%").split("\n", 1)[0]
    pieces = [" ".join(p.split()).lower() for p in CONVERSION.split(first)]
    pieces = [p for p in pieces if len(p) >= 2]
    return tuple(pieces) if sum(map(len, pieces)) >= MIN_LITERAL else ()


def _cut_short(said: str, rest: str) -> bool:
    """Whether ``said`` is ``said + rest`` cut short: without its hint (``rest`` is `` (run
    with ...)``), or cut inside a word (a capture's length limit), rather than a whole shorter
    message of its own (``Operation not permitted`` is not ``Operation not permitted on
    individual component of heterogeneous job``)."""
    return rest.startswith(" (") or (said[-1:].isalnum() and rest[:1].isalnum())


def _in_order(line: str, pieces: tuple[str, ...]) -> bool:
    at = 0
    for piece in pieces:
        at = line.find(piece, at)
        if at < 0:
            return False
        at += len(piece)
    return True


@dataclass(frozen=True)
class EmitterTables:
    """Every table, and the indexes :meth:`lookup` reads (built once, at load)."""

    tables: Mapping[str, EmitterTable]
    #: (table, name) / (table, normalised message) / (table, value) -> member
    _names: Mapping[tuple[str, str], Member] = field(init=False, repr=False, compare=False)
    _messages: Mapping[tuple[str, str], Member] = field(init=False, repr=False, compare=False)
    _values: Mapping[tuple[str, int], Member] = field(init=False, repr=False, compare=False)
    #: ((table, message), member), the longest message first
    _prefixes: tuple[tuple[tuple[str, str], Member], ...] = field(
        init=False, repr=False, compare=False
    )
    #: (table, longest literal piece, literal pieces, member), the most literal text first: the
    #: most specific form wins; the longest piece is looked for first, as the cheapest refusal
    _forms: tuple[tuple[str, str, tuple[str, ...], Member], ...] = field(
        init=False, repr=False, compare=False
    )
    #: the tables a look-up names -> their forms, as in ``_forms`` without the table: a family
    #: of a thousand formats is read without passing over the other tables' forms
    _forms_of: dict[tuple[str, ...], tuple[tuple[str, tuple[str, ...], Member], ...]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        names: dict[tuple[str, str], Member] = {}
        messages: dict[tuple[str, str], Member] = {}
        values: dict[tuple[str, int], Member] = {}
        forms = []
        for table in self.tables.values():
            for m in table.members:
                names.setdefault((table.name, m.name), m)
                if m.message:
                    messages.setdefault((table.name, _normal(m.message)), m)
                for form in (m.message, *m.forms) if m.message else m.forms:
                    if pieces := literal_pieces(form):
                        forms.append((table.name, max(pieces, key=len), pieces, m))
                if m.value is not None:
                    values.setdefault((table.name, m.value), m)
        forms.sort(key=lambda f: -sum(map(len, f[2])))
        prefixes = sorted(messages.items(), key=lambda item: -len(item[0][1]))
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_messages", messages)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_prefixes", tuple(prefixes))
        object.__setattr__(self, "_forms", tuple(forms))

    def __iter__(self) -> Iterator[EmitterTable]:
        return iter(self.tables.values())

    def lookup(self, tables: Iterable[str], code: str) -> Member | None:
        """The member of one of ``tables`` (in order) that ``code`` names: its name
        (``cudaErrorIllegalAddress``), its value (``700``), its message (case and spacing
        ignored), a line that begins with its message (``out of memory (malloc at ...)``), what
        follows a ``": "`` (an error wrapped in another's words), or else a line holding the
        literal parts of a member's format in order (``execve(): %s: %s``; the member with the
        most literal text first). None when none does."""
        code = code.strip()
        order = list(tables)
        found = self._exact(order, code)
        if found is not None:
            return found
        if code.isascii() and code.lstrip("-").isdigit():
            for table in order:
                found = self._values.get((table, int(code)))
                if found is not None:
                    return found
        # a wrapped error ("Could not synchronize CUDA stream: CUDA_ERROR_X: msg"): what
        # follows each ": " in turn
        # (each printed whole, or cut short by a capture's limit: never the first words of a
        # longer message, as glibc's "Operation not permitted" after a Slurm function's name is
        # not Slurm's "Operation not permitted on individual component of heterogeneous job")
        parts = code.split(": ")
        for k in range(1, len(parts)):
            found = self._exact(order, ": ".join(parts[k:]), whole=True)
            if found is not None:
                return found
        # a message printed from a format ("execve(): %s: %s"), found inside the line
        line = " ".join(code.split()).lower()
        for longest, pieces, member in self._forms_in(tuple(order)):
            if longest in line and _in_order(line, pieces):
                return member
        return None

    def _forms_in(self, order: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...], Member], ...]:
        found = self._forms_of.get(order)
        if found is None:
            found = tuple(
                (longest, pieces, member)
                for table, longest, pieces, member in self._forms
                if table in order
            )
            self._forms_of[order] = found
        return found

    def lookup_text(self, tables: Iterable[str], code: str) -> Member | None:
        """The member of one of ``tables`` whose message ``code`` is, case and spacing aside;
        nothing else (no name, no value, no longer line that begins with it)."""
        said = _normal(code)
        for table in tables:
            found = self._messages.get((table, said))
            if found is not None:
                return found
        return None

    def _exact(self, order: list[str], code: str, *, whole: bool = False) -> Member | None:
        """A member named by ``code`` itself: name, message, a message it begins with, or one
        that begins with it (not when ``whole``: ``code`` is a message printed whole)."""
        code = code.strip()
        for table in order:
            found = self._names.get((table, code))
            if found is not None:
                return found
        found = self.lookup_text(order, code)
        if found is not None:
            return found
        said = _normal(code)
        for (table, message), member in self._prefixes:
            if table in order and len(message) >= MIN_LITERAL and said.startswith(message):
                return member
        if len(said) >= MIN_LITERAL:  # a message printed without its hint ("(run with ...)")
            for (table, message), member in self._prefixes:
                if table in order and message.startswith(said):
                    if whole and not _cut_short(said, message[len(said) :]):
                        continue
                    return member
        return None


def _table(name: str, text: str, source: str) -> EmitterTable:
    data = parse_toml(text, source, error=EmitterError)
    entry = convert(data, TableEntry, source=source, text=text)
    problems = []
    if len(entry.member) != entry.members_total:
        problems.append(
            f"{source}: members_total: {entry.members_total}, but {len(entry.member)} members "
            "are listed; list every member of the enumeration"
        )
    seen: set[str] = set()
    for i, m in enumerate(entry.member):
        where = f"{source}: member[{i}] ({m.name})"
        if m.name in seen:
            problems.append(f"{where}: listed twice; keep one")
        seen.add(m.name)
        if m.klass != "unclassified" and m.blame_node != (m.action == "requeue_exclude"):
            problems.append(f"{where}: blame_node = true goes with action = requeue_exclude, only")
        if m.blame_node and m.klass not in ("hardware", "system"):
            problems.append(f"{where}: only a hardware or system member blames a node")
        for form in m.forms:
            if not literal_pieces(form):
                problems.append(
                    f"{where}: form {form!r} has under {MIN_LITERAL} literal characters: a "
                    "line cannot be told to be it; leave it out"
                )
    if problems:
        raise EmitterError(*problems)
    members = tuple(
        Member(
            table=name,
            name=m.name,
            example=m.example,
            fault_class=str(m.klass),
            action=str(m.action),
            blame_node=m.blame_node,
            note=m.note,
            message=m.message,
            value=m.value,
            forms=m.forms,
        )
        for m in entry.member
    )
    return EmitterTable(name, entry.emitter, entry.source, entry.members_total, members)


@lru_cache(maxsize=1)
def load_emitter_tables() -> EmitterTables:
    """The tables shipped with the package (``signals/data/emitters/*.toml``), checked."""
    folder = resources.files("slurm_recovery.signals") / "data" / "emitters"
    tables: dict[str, EmitterTable] = {}
    problems: list[str] = []
    for item in sorted(folder.iterdir(), key=lambda f: f.name):
        if not item.name.endswith(".toml"):
            continue
        name = item.name.removesuffix(".toml")
        source = f"slurm_recovery/signals/data/emitters/{item.name}"
        try:
            tables[name] = _table(name, item.read_text("utf-8"), source)
        except EmitterError as exc:
            problems.extend(exc.problems or (str(exc),))
    if problems:
        raise EmitterError(*problems)
    return EmitterTables(MappingProxyType(tables))
