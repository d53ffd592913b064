"""PyTorch flight-recorder dumps: which collective a hung job is stuck in, and who never came.

With ``TORCH_FR_BUFFER_SIZE`` (formerly ``TORCH_NCCL_TRACE_BUFFER_SIZE``) set, PyTorch keeps
the last N collectives of every process group in a ring buffer and can dump it, one file per
rank, to ``TORCH_FR_DUMP_TEMP_FILE`` (formerly ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``) plus the
rank: ``<job dir>/nccl_trace_rank_3``. The NCCL backend writes the dumps itself on a
collective timeout; gloo records but never writes one (see docs/signals.md). A dump is a
pickle (the default) or JSON (``_dump_fr_trace_json``) of ``{version, pg_config, pg_status,
entries: [{pg_id, process_group, collective_seq_id, p2p_seq_id, profiling_name, state,
retired, input_sizes, time_created_ns, timeout_ms, ...}], ...}``.

Three parts:

- :func:`read_dump` / :func:`read_dumps` read dumps into :class:`RankTrace` values. The files
  are written by the job user and read by the root sidecar, so the pickle is loaded by an
  unpickler that builds nothing but dicts, lists, tuples, strings and numbers: a pickle that
  names any class or function is refused before anything runs;
- :func:`evidence_payload` / :func:`trace_from_payload`: the small ``flight_recorder``
  evidence a sidecar sends and the controller turns back into a :class:`RankTrace`;
- :func:`stuck_collective` (pure): across the ranks' traces, the process group and collective
  the job is stuck in, the ranks that never entered it (the suspects) and those that wait.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import re
import stat
from collections import Counter
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from slurm_recovery.contract.jobdir import NCCL_TRACE_PREFIX

__all__ = [
    "DUMP_PREFIXES",
    "MAX_DUMP_BYTES",
    "FlightRecorderError",
    "GroupTrace",
    "PendingEntry",
    "RankTrace",
    "StuckCollective",
    "evidence_payload",
    "read_dump",
    "read_dumps",
    "stuck_collective",
    "trace_from_payload",
]

log = logging.getLogger("srecovery.flight_recorder")

#: File-name prefixes of per-rank dumps: the one the TaskProlog sets (NCCL's old default),
#: and the default of recent PyTorch (``~/.cache/torch/comm_lib_trace_rank_<rank>``).
DUMP_PREFIXES = (NCCL_TRACE_PREFIX, "comm_lib_trace_rank_")
#: A larger file is not read. Real dumps are small (a 2,000-entry buffer with stack traces
#: pickles to about a megabyte: frames are shared); a pickle can build an object per two bytes,
#: so this also bounds what a hostile file makes the root sidecar allocate.
MAX_DUMP_BYTES = 32 << 20
#: Payload bounds: groups per rank, characters per text, tensors and dimensions per size.
MAX_GROUPS = 32
#: Bytes of JSON the groups of one payload may take (the wire's limit is 16 KiB).
MAX_PAYLOAD_TEXT = 12 * 1024
_MAX_TEXT = 120
_MAX_TENSORS = 4
_MAX_DIMS = 8
_MAX_RANK_TEXT = 4096

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TRAILING_RANK = re.compile(r"([0-9]{1,9})$")
_RANK_SUFFIX = re.compile(r"[0-9]{1,9}")
_RANK_LIST = re.compile(r"\[\s*(?:[0-9]{1,9}\s*(?:,\s*[0-9]{1,9}\s*)*)?\]")
_RANGES = re.compile(r"(?:[0-9]{1,9}(?:-[0-9]{1,9})?)(?:,[0-9]{1,9}(?:-[0-9]{1,9})?)*")


class FlightRecorderError(ValueError):
    """A dump that cannot be used: the message names the file and why."""


@dataclass(frozen=True)
class PendingEntry:
    """The first collective of a process group that this rank entered and has not finished."""

    seq_id: int
    op: str  # profiling name: "nccl:all_reduce", "gloo:broadcast"
    input_sizes: tuple[tuple[int, ...], ...] = ()
    time_created_ns: int | None = None
    timeout_ms: int | None = None


@dataclass(frozen=True)
class GroupTrace:
    """One rank's view of one process group (collectives only; point-to-point is not counted).

    ``last_enqueued`` is the last collective the rank entered, ``last_completed`` the last it
    finished (completed, or retired: the backend is done with it, also when it failed),
    ``last_started`` the last that started on the device (NCCL only; gloo reports none, and
    a finished collective counts as started). 0 means none. ``ranks`` are the group's global
    ranks when the dump's ``pg_config`` names them, else None."""

    pg: str
    desc: str = ""
    ranks: tuple[int, ...] | None = None
    last_enqueued: int = 0
    last_started: int = 0
    last_completed: int = 0
    first_pending: PendingEntry | None = None

    @property
    def pending(self) -> bool:
        """Whether the rank is inside a collective of this group."""
        return self.last_enqueued > self.last_completed


@dataclass(frozen=True)
class RankTrace:
    """What one rank's dump says. ``rank`` comes from the file name (None when it has no
    trailing number); ``groups`` is keyed by process-group name (``"0"`` is the default
    group)."""

    rank: int | None
    groups: Mapping[str, GroupTrace]
    version: str = ""
    backend: str = ""  # "nccl", "gloo", ... from the entries' profiling names
    format: str = "pickle"  # or "json"
    path: str = ""
    entries: int = 0


@dataclass(frozen=True)
class StuckCollective:
    """The collective a job is stuck in. ``suspects`` never entered it (``behind`` maps each
    to the last collective of the group it did enter); ``waiting`` entered it and wait (or
    failed in it); ``missing`` are members of the group that left no dump (known only when
    the dumps name the group's ranks). No suspect and no missing rank means every rank is in
    the collective: it hangs by itself (network, device), no rank is to blame."""

    pg: str
    desc: str
    seq_id: int
    op: str
    suspects: tuple[int, ...]
    waiting: tuple[int, ...]
    missing: tuple[int, ...] = ()
    behind: Mapping[int, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "pg": self.pg,
            "desc": self.desc,
            "seq_id": self.seq_id,
            "op": self.op,
            "suspects": list(self.suspects),
            "waiting": list(self.waiting),
            "missing": list(self.missing),
            "behind": {str(r): s for r, s in sorted(self.behind.items())},
        }


# ------------------------------------------------------------------------------ reading


class _BuiltinsOnly(pickle.Unpickler):
    """An unpickler that can build only what pickle's own opcodes make (dict, list, tuple,
    set, str, bytes, int, float, bool, None): anything that names a class or a function is
    refused, so nothing in the file is ever called."""

    def __init__(self, data: bytes, where: str) -> None:
        super().__init__(io.BytesIO(data))
        self._where = where

    def find_class(self, module: str, name: str) -> Any:
        raise FlightRecorderError(
            f"{self._where}: refused: the pickle asks for {module[:80]}.{name[:80]}; "
            "a flight-recorder dump holds only dicts, lists, strings and numbers"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise FlightRecorderError(f"{self._where}: refused: the pickle asks for external objects")


def _load(data: bytes, where: str) -> tuple[Any, str]:
    """The dump's object and its format: JSON when it starts with ``{``, else a pickle
    (PyTorch writes protocol 2; any protocol is read, by the restricted unpickler)."""
    if data.lstrip()[:1] == b"{":
        try:
            return json.loads(data), "json"
        except (ValueError, RecursionError) as exc:
            raise FlightRecorderError(
                f"{where}: not readable JSON ({type(exc).__name__}); truncated or damaged"
            ) from None
    try:
        return _BuiltinsOnly(data, where).load(), "pickle"
    except FlightRecorderError:
        raise
    except Exception as exc:  # any failure of a damaged pickle is an error, never a crash
        raise FlightRecorderError(
            f"{where}: not a readable pickle ({type(exc).__name__}); "
            "not a dump, or truncated, damaged or still being written"
        ) from None


def read_dump(
    path: str | os.PathLike[str],
    *,
    rank: int | None = None,
    max_bytes: int = MAX_DUMP_BYTES,
) -> RankTrace | None:
    """The trace in one dump file; None when the file does not exist or is empty (not
    written yet). ``rank`` defaults to the number the file name ends with.

    The file is opened without following a link, must be a regular file and at most
    ``max_bytes``. Raises :class:`FlightRecorderError` (and nothing else) for anything else."""
    where = os.fspath(path)
    try:
        fd = os.open(where, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise FlightRecorderError(f"{where}: cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FlightRecorderError(f"{where}: not a regular file")
        if st.st_size > max_bytes:
            raise FlightRecorderError(
                f"{where}: {st.st_size} bytes, more than the {max_bytes} a dump may have"
            )
        with os.fdopen(fd, "rb", closefd=False) as stream:
            data = stream.read(max_bytes + 1)
    except OSError as exc:
        raise FlightRecorderError(f"{where}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise FlightRecorderError(f"{where}: grew past {max_bytes} bytes while read")
    if not data.strip():
        return None
    if rank is None:
        found = _TRAILING_RANK.search(os.path.basename(where))
        rank = int(found.group(1)) if found else None
    document, fmt = _load(data, where)
    return _trace(document, where, rank, fmt)


def read_dumps(
    directory: str | os.PathLike[str],
    seen: MutableMapping[str, tuple[int, int]],
    *,
    prefixes: Iterable[str] = DUMP_PREFIXES,
    max_bytes: int = MAX_DUMP_BYTES,
) -> list[RankTrace]:
    """The traces of the dumps in ``directory`` that are new or changed since the last call,
    ordered by rank. ``seen`` (kept by the caller between polls) maps each dump path read to
    its ``(mtime_ns, size)`` and is updated; a dump that cannot be used is logged once per
    version of the file and skipped. A missing directory has no dumps."""
    names = tuple(prefixes)
    try:
        listing = list(os.scandir(directory))
    except OSError:
        return []
    traces: list[RankTrace] = []
    for entry in listing:
        prefix = next((p for p in names if entry.name.startswith(p)), None)
        if prefix is None or not _RANK_SUFFIX.fullmatch(entry.name[len(prefix) :]):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        key = (st.st_mtime_ns, st.st_size)
        if seen.get(entry.path) == key:
            continue
        seen[entry.path] = key
        try:
            trace = read_dump(entry.path, max_bytes=max_bytes)
        except FlightRecorderError as exc:
            log.warning("flight-recorder dump skipped: %s", exc)
            continue
        if trace is not None:
            traces.append(trace)
    traces.sort(key=lambda t: (t.rank is None, t.rank or 0, t.path))
    return traces


# ------------------------------------------------------------------------------ parsing


def _int(value: Any) -> int | None:
    """An integer field: an int (not a bool) or, in JSON dumps, its decimal text."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and len(value) <= 20 and re.fullmatch(r"-?[0-9]+", value):
        return int(value)
    return None


def _text(value: Any) -> str:
    return value[:_MAX_TEXT] if isinstance(value, str) else ""


def _sizes(value: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list | tuple):
        return ()
    out = []
    for item in value[:_MAX_TENSORS]:
        if isinstance(item, list | tuple):
            dims = tuple(d for d in (_int(x) for x in item[:_MAX_DIMS]) if d is not None)
            out.append(dims)
    return tuple(out)


def _rank_list(value: Any) -> tuple[int, ...] | None:
    """``pg_config`` ranks: ``"[0, 1, 2]"`` (as PyTorch writes them) or a list of ints."""
    if isinstance(value, str) and len(value) <= 1 << 20 and _RANK_LIST.fullmatch(value.strip()):
        return tuple(int(x) for x in re.findall(r"[0-9]+", value))
    if isinstance(value, list | tuple) and all(_int(x) is not None for x in value):
        return tuple(int(x) for x in value)
    return None


def _trace(document: Any, where: str, rank: int | None, fmt: str) -> RankTrace:
    if not isinstance(document, dict):
        raise FlightRecorderError(f"{where}: not a flight-recorder dump (top level is not a map)")
    entries = document.get("entries", [])
    if not isinstance(entries, list):
        raise FlightRecorderError(f"{where}: entries is not a list")
    if "version" not in document and "entries" not in document:
        raise FlightRecorderError(f"{where}: not a flight-recorder dump (no version, no entries)")
    names: dict[int, str] = {}  # pg_id -> name
    descs: dict[str, str] = {}
    # per group: each collective's entry by sequence number, and the progress the entries show
    seen_ops: dict[str, dict[int, PendingEntry]] = {}
    enqueued: Counter[str] = Counter()
    started: Counter[str] = Counter()
    completed: Counter[str] = Counter()
    backend = ""
    for item in entries:
        if not isinstance(item, dict) or item.get("is_p2p") is True:
            continue
        seq = _int(item.get("collective_seq_id"))
        if seq is None or seq <= 0:
            continue
        pg_id = _int(item.get("pg_id"))
        group = item.get("process_group")
        if isinstance(group, list | tuple) and group and isinstance(group[0], str):
            name = group[0][:_MAX_TEXT]
            if len(group) > 1 and isinstance(group[1], str):
                descs.setdefault(name, group[1][:_MAX_TEXT])
        elif pg_id is not None:
            name = str(pg_id)
        else:
            continue
        if pg_id is not None:
            names.setdefault(pg_id, name)
        op = _text(item.get("profiling_name"))
        if not backend and ":" in op:
            backend = op.partition(":")[0]
        seen_ops.setdefault(name, {}).setdefault(
            seq,
            PendingEntry(
                seq_id=seq,
                op=op,
                input_sizes=_sizes(item.get("input_sizes")),
                time_created_ns=_int(item.get("time_created_ns")),
                timeout_ms=_int(item.get("timeout_ms")),
            ),
        )
        state = item.get("state")
        enqueued[name] = max(enqueued[name], seq)
        if state in ("started", "completed"):
            started[name] = max(started[name], seq)
        if state == "completed" or item.get("retired") is True:
            completed[name] = max(completed[name], seq)
    status = document.get("pg_status")
    if isinstance(status, dict):
        for key, values in status.items():
            pg_id = _int(key)
            if pg_id is None or not isinstance(values, dict):
                continue
            name = names.get(pg_id, str(pg_id))
            for counter, field_name in (
                (enqueued, "last_enqueued_collective"),
                (started, "last_started_collective"),
                (completed, "last_completed_collective"),
            ):
                value = _int(values.get(field_name))
                if value is not None and value > 0:
                    counter[name] = max(counter[name], value)
    members: dict[str, tuple[int, ...]] = {}
    config = document.get("pg_config")
    if isinstance(config, dict):
        for key, info in config.items():
            if isinstance(key, str) and key and isinstance(info, dict):
                ranks = _rank_list(info.get("ranks"))
                if ranks is not None:
                    members[key[:_MAX_TEXT]] = ranks
                if isinstance(info.get("desc"), str):
                    descs.setdefault(key[:_MAX_TEXT], info["desc"][:_MAX_TEXT])
    groups: dict[str, GroupTrace] = {}
    for name in sorted(set(enqueued) | set(completed) | set(started)):
        done = completed[name]
        begun = max(started[name], done)
        entered = max(enqueued[name], begun)
        pending = None
        if entered > done:
            later = [s for s in seen_ops.get(name, {}) if s > done]
            if later:
                pending = seen_ops[name][min(later)]
        groups[name] = GroupTrace(
            pg=name,
            desc=descs.get(name, ""),
            ranks=members.get(name),
            last_enqueued=entered,
            last_started=begun,
            last_completed=done,
            first_pending=pending,
        )
    version = document.get("version")
    return RankTrace(
        rank=rank,
        groups=groups,
        version=version[:_MAX_TEXT] if isinstance(version, str) else "",
        backend=backend,
        format=fmt,
        path=where,
        entries=len(entries),
    )


# ------------------------------------------------------------------------------ evidence


def _ranges(ranks: Iterable[int]) -> str:
    """``0-3,8``: ranks as compact ranges (a group can hold thousands)."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def _parse_ranges(text: Any) -> tuple[int, ...] | None:
    if not isinstance(text, str) or len(text) > _MAX_RANK_TEXT or not _RANGES.fullmatch(text):
        return None
    ranks: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if last < first or last - first > 1 << 20:
            return None
        ranks.extend(range(first, last + 1))
    return tuple(ranks)


def evidence_payload(trace: RankTrace) -> dict[str, Any]:
    """The ``flight_recorder`` evidence payload for one rank's dump: small and JSON-able, at
    most ``MAX_GROUPS`` groups (those inside a collective first) and about
    ``MAX_PAYLOAD_TEXT`` bytes of JSON (the controller refuses payloads over 16 KiB).
    :func:`trace_from_payload` reads it back."""
    ordered = sorted(trace.groups.values(), key=lambda g: (not g.pending, g.pg))
    groups: list[dict[str, Any]] = []
    size = 0
    for group in ordered[:MAX_GROUPS]:
        item: dict[str, Any] = {
            "pg": group.pg,
            "desc": group.desc,
            "last_enqueued": group.last_enqueued,
            "last_started": group.last_started,
            "last_completed": group.last_completed,
        }
        if group.ranks is not None:
            text = _ranges(group.ranks)
            if len(text) <= _MAX_RANK_TEXT:
                item["ranks"] = text
        if group.first_pending is not None:
            entry = group.first_pending
            item["pending"] = {
                "seq_id": entry.seq_id,
                "op": entry.op,
                "input_sizes": [list(s) for s in entry.input_sizes],
                "time_created_ns": entry.time_created_ns,
                "timeout_ms": entry.timeout_ms,
            }
        size += len(json.dumps(item, separators=(",", ":")))
        if groups and size > MAX_PAYLOAD_TEXT:
            break
        groups.append(item)
    return {
        "rank": trace.rank,
        "backend": trace.backend,
        "version": trace.version,
        "format": trace.format,
        "path": trace.path[-200:],
        "entries": trace.entries,
        "groups": groups,
    }


def trace_from_payload(payload: Mapping[str, Any]) -> RankTrace:
    """A :class:`RankTrace` from a ``flight_recorder`` evidence payload (what the controller
    has). FlightRecorderError for a payload that is not one."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("groups"), list):
        raise FlightRecorderError("flight_recorder evidence: no groups")
    groups: dict[str, GroupTrace] = {}
    for item in payload["groups"][:MAX_GROUPS]:
        if not isinstance(item, Mapping) or not isinstance(item.get("pg"), str):
            raise FlightRecorderError("flight_recorder evidence: a group without a name")
        pending = None
        raw = item.get("pending")
        if isinstance(raw, Mapping) and _int(raw.get("seq_id")) is not None:
            pending = PendingEntry(
                seq_id=int(raw["seq_id"]),
                op=_text(raw.get("op")),
                input_sizes=_sizes(raw.get("input_sizes")),
                time_created_ns=_int(raw.get("time_created_ns")),
                timeout_ms=_int(raw.get("timeout_ms")),
            )
        name = item["pg"][:_MAX_TEXT]
        groups[name] = GroupTrace(
            pg=name,
            desc=_text(item.get("desc")),
            ranks=_parse_ranges(item.get("ranks")),
            last_enqueued=max(_int(item.get("last_enqueued")) or 0, 0),
            last_started=max(_int(item.get("last_started")) or 0, 0),
            last_completed=max(_int(item.get("last_completed")) or 0, 0),
            first_pending=pending,
        )
    rank = _int(payload.get("rank"))
    return RankTrace(
        rank=rank if rank is not None and rank >= 0 else None,
        groups=groups,
        version=_text(payload.get("version")),
        backend=_text(payload.get("backend")),
        format=_text(payload.get("format")),
        path=_text(payload.get("path")),
        entries=_int(payload.get("entries")) or 0,
    )


# ------------------------------------------------------------------------------ analysis


def stuck_collective(traces: Iterable[RankTrace]) -> StuckCollective | None:
    """The collective the job is stuck in, from its ranks' traces (pure); None when no group
    shows one. Meant for a job already judged hung: a snapshot of a healthy job may show
    ranks a collective apart.

    Per process group: the group is stuck when a rank is inside a collective or the ranks
    disagree on the last one they entered. Its stuck collective is the one most ranks inside
    a collective wait in (the earliest on a tie), or, when no rank is inside one (each gave
    up with an error), the last one any rank entered. Ranks whose last entered collective
    is older never entered it: the suspects. When several groups are stuck, the one with
    suspects or missing ranks comes first, then the one whose stuck collective began
    earliest, then the one with most waiting ranks. Traces without a rank are ignored; of
    two traces of one rank the later counts."""
    by_rank: dict[int, RankTrace] = {}
    for trace in traces:
        if trace.rank is not None:
            by_rank[trace.rank] = trace
    names = sorted({name for t in by_rank.values() for name in t.groups})
    found: list[tuple[tuple[Any, ...], StuckCollective]] = []
    for name in names:
        views = {r: t.groups[name] for r, t in by_rank.items() if name in t.groups}
        result = _stuck_in_group(name, views)
        if result is None:
            continue
        stuck, began = result
        key = (
            not (stuck.suspects or stuck.missing),
            began is None,
            began or 0,
            -len(stuck.waiting),
            name,
        )
        found.append((key, stuck))
    if not found:
        return None
    return min(found, key=lambda item: item[0])[1]


def _stuck_in_group(
    name: str, views: Mapping[int, GroupTrace]
) -> tuple[StuckCollective, int | None] | None:
    inside = {r: g.last_completed + 1 for r, g in views.items() if g.pending}
    entered = {g.last_enqueued for g in views.values()}
    if not inside and len(entered) <= 1:
        return None
    if inside:
        counts = Counter(inside.values())
        top = max(counts.values())
        seq = min(s for s, n in counts.items() if n == top)
    else:
        seq = max(entered)
    waiting = tuple(sorted(r for r, g in views.items() if g.last_enqueued >= seq))
    suspects = tuple(sorted(r for r, g in views.items() if g.last_enqueued < seq))
    members: set[int] = set()
    for group in views.values():
        members |= set(group.ranks or ())
    missing = tuple(sorted(members - set(views)))
    op, desc, began = "", "", None
    for rank in waiting:
        group = views[rank]
        desc = desc or group.desc
        entry = group.first_pending
        if entry is not None and entry.seq_id == seq:
            op = op or entry.op
            if entry.time_created_ns is not None:
                began = (
                    entry.time_created_ns if began is None else min(began, entry.time_created_ns)
                )
    for group in views.values():
        desc = desc or group.desc
    stuck = StuckCollective(
        pg=name,
        desc=desc,
        seq_id=seq,
        op=op,
        suspects=suspects,
        waiting=waiting,
        missing=missing,
        behind={r: views[r].last_enqueued for r in suspects},
    )
    return stuck, began
