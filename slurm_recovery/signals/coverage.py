"""How completely the shipped signature catalogue reads each emitter's messages.

Every classified member of every emitter table (:mod:`slurm_recovery.signals.emitters`) has an
example line; the catalogue scans it (as ``explain-log --nodes n1`` would for a member that
blames its node, as ``explain-log`` would for any other: the line alone, not a one-node job's
context) and its verdict either agrees with the member (same action, same class unless nothing
is to be done, a node blamed exactly when the member blames it), disagrees, or recognises
nothing. A member's other formats (``forms``: its family's other call sites, other releases'
words) are each printed with values of their kinds and must be looked up as that member.
``docs/signatures.md``'s coverage table is this, printed by ``python -m bench.attribution
--coverage``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from slurm_recovery.signals.emitters import CONVERSION, EmitterTable, Member
from slurm_recovery.signals.logs import LogVerdict, SignatureCatalogue, classify

#: The node a member's example is read on (a one-node job).
NODE = "n1"


@dataclass(frozen=True)
class Coverage:
    """One table as the catalogue reads it."""

    table: EmitterTable
    #: member name -> what the catalogue answered, where it is not what the member says
    disagree: Mapping[str, str]
    #: classified members whose example the catalogue does not recognise at all
    unrecognised: tuple[str, ...]
    #: a form -> the member it was looked up as instead of its own ("nothing": no member)
    forms_misread: Mapping[str, str] = field(default_factory=dict)

    @property
    def classified(self) -> tuple[Member, ...]:
        return tuple(m for m in self.table.members if m.classified)

    @property
    def unclassified(self) -> tuple[Member, ...]:
        return tuple(m for m in self.table.members if not m.classified)

    @property
    def forms(self) -> int:
        """The members' other formats, counted."""
        return sum(len(m.forms) for m in self.table.members)

    @property
    def agree(self) -> int:
        return len(self.classified) - len(self.disagree) - len(self.unrecognised)


def read_example(member: Member, catalogue: SignatureCatalogue) -> tuple[bool, LogVerdict]:
    """Whether the catalogue recognises ``member``'s example, and its verdict on it: in a
    one-node job when the member blames its node (so that the blame has a node to name), else
    as the line alone means it (without the job's nodes: a one-node job's own reading, such as
    its collective timeouts being the program's, is the job's context, not the line's)."""
    matches = list(catalogue.scan_text(member.example, source=member.table))
    nodes = [NODE] if member.blame_node else None
    return bool(matches), classify(matches, nodes=nodes, catalogue=catalogue)


def mismatch(member: Member, verdict: LogVerdict) -> str:
    """What is wrong with ``verdict`` for ``member`` ("" when it agrees)."""
    blamed = bool(verdict.blame_nodes)
    if verdict.action != member.action:
        return f"{verdict.action} ({verdict.fault_domain}, {verdict.cause})"
    if member.action != "none" and verdict.fault_domain != member.fault_class:
        return f"{verdict.action} but {verdict.fault_domain} ({verdict.cause})"
    if blamed != member.blame_node:
        return f"{verdict.action} {'blaming' if blamed else 'not blaming'} the node"
    return ""


#: what a printf conversion prints in :func:`form_line`, by its conversion character
_FILL = {**dict.fromkeys("diouxXc", "7"), **dict.fromkeys("eEfgGaA", "1.5"), "p": "0x7f3a2c0040"}


def form_line(form: str) -> str:
    """A line ``form`` prints, each conversion given a value of its kind (a word for ``%s``)."""
    return CONVERSION.sub(lambda m: _FILL.get(m.group(0)[-1], "mlx5_0"), form.replace("%%", "%"))


def coverage(table: EmitterTable, catalogue: SignatureCatalogue) -> Coverage:
    disagree: dict[str, str] = {}
    unrecognised: list[str] = []
    for member in table.members:
        if not member.classified:
            continue
        seen, verdict = read_example(member, catalogue)
        if not seen:
            if member.action != "none":  # nothing recognised in a line that asks nothing: right
                unrecognised.append(member.name)
            continue
        wrong = mismatch(member, verdict)
        if wrong:
            disagree[member.name] = wrong
    return Coverage(table, disagree, tuple(unrecognised), misread_forms(table, catalogue))


def misread_forms(table: EmitterTable, catalogue: SignatureCatalogue) -> dict[str, str]:
    """Each of ``table``'s forms that is not looked up as its own member, and what it is looked
    up as ("nothing": no member)."""
    misread: dict[str, str] = {}
    for member in table.members:
        for form in member.forms:
            got = catalogue.emitters.lookup([table.name], form_line(form))
            if got is not member:
                misread[form] = got.name if got is not None else "nothing"
    return misread
