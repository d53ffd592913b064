"""Slurm's JSON (``squeue --json``, ``sinfo --json``, ``scontrol show nodes --json``) -> Job/Node.

One parser for every release from 22.05 to 25.11. The shapes moved between releases:

- 22.05 (openapi v0.0.38): numbers are plain ints, ``job_state`` one string in which a flag
  (``COMPLETING``, ``REQUEUE_HOLD``...) stands in for the base state, ``exit_code`` the raw wait
  status, node ``state`` lower-case with a separate ``state_flags`` list, nodes under
  ``sinfo --json``'s ``nodes``.
- 23.02 (data_parser v0.0.39): numbers become ``{"set", "infinite", "number"}``, node states
  lists (base first, then flags); ``job_state`` is still 22.05's one string; ``exit_code`` is
  ``{"set", "infinite", "number"}`` around the raw status; ``sinfo --json`` groups nodes under
  ``sinfo``, and per-node records come from ``scontrol show nodes --json`` (new in 23.02).
- 23.11 and later (v0.0.40+): ``job_state`` a list too; ``exit_code`` is ``{"status",
  "return_code", "signal"}``.
- 24.05 and later: ``squeue --json`` prints only active jobs unless asked ``--states=all``.
- Every release: a job's GPUs are ``gres_detail``, one string per allocated node in node order
  (``["gpu:2(IDX:0-1)", "gpu:1(IDX:0)"]``, ``[]`` without GRES; recorded on 22.05 and 24.11);
  a node's are ``gres`` (``"gpu:8"``, ``""``). Read into ``Job.gpus`` and ``Node.gpus``.

tests/fixtures/slurm/ holds real output of 22.05 and 24.11 and SchedMD's shapes of 23.02,
23.11, 24.05 and 25.05 (each directory's README cites the source file and tag).

``Job.state`` keeps 22.05's spelling on every release (a flag that 22.05 would have shown in
place of the base state wins, in the order of 22.05's ``job_state_string``), so the loop's
tests of ``COMPLETING`` or ``REQUEUE_HOLD`` mean the same everywhere; the full flag set is in
``Job.state_flags``. A field we read that is missing or has a shape not listed here raises
:class:`UnsupportedOutput` naming the field and the Slurm release: never a silent default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from slurm_recovery.contract import hostlist
from slurm_recovery.contract.outputs import expand_output_path
from slurm_recovery.scheduler.base import ExitCode, Job, Node, UnsupportedOutput

#: Flags that 22.05's job_state_string() reports instead of the base state, in its order
#: (src/common/slurm_protocol_defs.c@slurm-22-05-8-1).
_STATE_FLAGS_FIRST = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)
_NUMBER_KEYS = frozenset({"set", "infinite", "number"})
#: 25.05+ print Slurm's own expansion of the output patterns beside them.
_EXPANDED = {"standard_output": "stdout_expanded", "standard_error": "stderr_expanded"}
_MISSING = object()


def release(doc: Mapping[str, Any]) -> str:
    """The Slurm release that printed ``doc`` (its ``meta``), or ``"unknown"``."""
    meta = doc.get("meta") if isinstance(doc, Mapping) else None
    if not isinstance(meta, Mapping):
        return "unknown"
    slurm = meta.get("slurm") or meta.get("Slurm") or {}
    if isinstance(slurm, Mapping):
        if isinstance(slurm.get("release"), str) and slurm["release"]:
            return slurm["release"]
        version = slurm.get("version")
        if isinstance(version, Mapping) and "major" in version:
            return ".".join(str(version.get(k, "?")) for k in ("major", "minor", "micro"))
    return "unknown"


class _Record:
    """One job or node record, read field by field with the shape checked."""

    def __init__(self, data: Any, where: str, slurm: str) -> None:
        if not isinstance(data, Mapping):
            raise UnsupportedOutput(f"{where} is {type(data).__name__}, not an object", slurm)
        self.data = data
        self.where = where
        self.slurm = slurm

    def _bad(self, key: str, value: Any, expected: str) -> UnsupportedOutput:
        shown = repr(value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        return UnsupportedOutput(
            f"{self.where}.{key} is {shown}; expected {expected}", self.slurm, field=key
        )

    def get(self, key: str, required: bool = True) -> Any:
        value = self.data.get(key, _MISSING)
        if value is _MISSING:
            if required:
                raise UnsupportedOutput(f"{self.where} has no {key!r}", self.slurm, field=key)
            return None
        return value

    def number(self, key: str, *, required: bool = True) -> int | None:
        """An int (22.05) or ``{"set", "infinite", "number"}`` (23.02+); None when unset,
        infinite or absent."""
        value = self.get(key, required)
        if value is None:
            return None
        if isinstance(value, Mapping) and set(value) <= _NUMBER_KEYS and "number" in value:
            if not value.get("set", True) or value.get("infinite", False):
                return None
            value = value["number"]
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise self._bad(key, value, "an integer or {set, infinite, number}")

    def text(self, key: str, *, required: bool = True) -> str:
        value = self.get(key, required)
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        raise self._bad(key, value, "a string")

    def flag(self, key: str, default: bool, *, required: bool = True) -> bool:
        value = self.get(key, required)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        raise self._bad(key, value, "true or false")

    def names(self, key: str, *, required: bool = True) -> tuple[str, ...]:
        """A list of strings (partitions) or a comma-separated string."""
        value = self.get(key, required)
        if value is None:
            return ()
        if isinstance(value, str):
            return tuple(p for p in value.split(",") if p)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise self._bad(key, value, "a list of strings")

    def hosts(self, key: str, *, required: bool = True) -> tuple[str, ...]:
        try:
            return tuple(hostlist.expand(self.text(key, required=required)))
        except ValueError as exc:
            raise self._bad(key, self.data.get(key), f"a Slurm host list ({exc})") from None

    def state(self, key: str) -> tuple[str, frozenset[str]]:
        """``"RUNNING"``/``"mixed"`` (22.05) or ``["IDLE", "DRAIN"]`` (23.02+) -> base, flags."""
        value = self.get(key)
        if isinstance(value, str) and value:
            name = value.upper()  # 22.05/23.02 jobs: a flag, when set, stands in for the base
            return name, frozenset({name}) if name in _STATE_FLAGS_FIRST else frozenset()
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            names = [v.upper() for v in value]
            return names[0], frozenset(names[1:])
        raise self._bad(key, value, "a state name or a list of them")

    def exit_code(self, key: str) -> ExitCode:
        """The raw wait status (22.05: int; 23.02: ``{set, number}``) or, from 23.11,
        ``{"status": [...], "return_code": number, "signal": {"id": number, "name": ...}}``."""
        value = self.get(key)
        if value is None:
            return ExitCode()
        if isinstance(value, Mapping) and "return_code" in value:
            sub = _Record(value, f"{self.where}.{key}", self.slurm)
            returncode = sub.number("return_code") or 0
            signal = sub.get("signal", required=False)
            if signal is None:
                return ExitCode(returncode, 0)
            if isinstance(signal, Mapping):
                signum = _Record(signal, f"{self.where}.{key}.signal", self.slurm)
                return ExitCode(returncode, signum.number("id", required=False) or 0)
            return ExitCode(returncode, sub.number("signal") or 0)
        status = self.number(key)
        if status is None:
            return ExitCode()
        return ExitCode(returncode=(status >> 8) & 0xFF, signal=status & 0x7F)


def effective_job_state(base: str, flags: frozenset[str]) -> str:
    """The state as 22.05 spells it: the first of its listed flags, else the base state."""
    for flag in _STATE_FLAGS_FIRST:
        if flag in flags:
            return flag
    return base


def job_from_json(data: Mapping[str, Any], *, slurm: str = "unknown", where: str = "job") -> Job:
    """One element of a ``jobs`` list (``squeue --json``, ``scontrol show job --json``)."""
    r = _Record(data, where, slurm)
    job_id = r.number("job_id")
    if job_id is None:
        raise r._bad("job_id", data.get("job_id"), "a job id")
    r.where = f"{where} {job_id}"
    base, flags = r.state("job_state")
    nodes = r.hosts("nodes")
    array_job_id = r.number("array_job_id") or 0
    task = r.number("array_task_id")
    array_task_id = task if array_job_id else None
    name = r.text("name")
    user = r.text("user_name")
    workdir = r.text("current_working_directory")
    batch_host = r.text("batch_host")

    def output(key: str) -> str | None:
        # 25.05+: Slurm's own expansion beside the pattern as typed ("" when not given)
        expanded = r.text(_EXPANDED[key], required=False)
        if expanded.startswith("/"):
            return expanded
        return expand_output_path(
            r.text(key),
            job_id=job_id,
            name=name,
            user=user,
            workdir=workdir,
            batch_host=batch_host,
            array_job_id=array_job_id,
            array_task_id=array_task_id,
        )

    stdout = output("standard_output")
    stderr_pattern = r.text("standard_error")
    # 23.02+ say "hold"; 22.05 only shows priority 0 for a held job
    held = r.flag("hold", r.number("priority") == 0, required=False)
    job_flags = r.names("flags", required=False)
    return Job(
        job_id=job_id,
        name=name,
        state=effective_job_state(base, flags),
        expedited_requeue="EXPEDITED_REQUEUE" in job_flags,
        state_flags=flags,
        reason=r.text("state_reason"),
        user=user,
        partition=r.text("partition"),
        nodes=nodes,
        num_nodes=r.number("node_count") or len(nodes),
        submit_time=r.number("submit_time") or 0,
        restart_count=r.number("restart_cnt") or 0,
        excluded_nodes=frozenset(r.hosts("excluded_nodes")),
        exit_code=r.exit_code("exit_code"),
        held=held,
        begin_time=r.number("eligible_time") or 0,
        start_time=r.number("start_time") or 0,
        end_time=r.number("end_time") or 0,
        stdout_path=stdout,
        # An empty --error means stderr goes with stdout (sbatch's default).
        stderr_path=output("standard_error") if stderr_pattern else stdout,
        admin_comment=r.text("admin_comment"),
        requeueable=r.flag("requeue", True),
        required_nodes=frozenset(r.hosts("required_nodes")),
        array_job_id=array_job_id,
        array_task_id=array_task_id,
        batch=r.flag("batch_flag", True),  # every release 22.05-25.11 prints it: required
        gpus=job_gpus(nodes, r.get("gres_detail", required=False), r),
        het_job_id=r.number("het_job_id", required=False) or 0,
        het_job_offset=r.number("het_job_offset", required=False) or 0,
        features=r.text("features", required=False),
    )


def node_from_json(data: Mapping[str, Any], *, slurm: str = "unknown", where: str = "node") -> Node:
    """One per-node record (22.05 ``sinfo --json``'s ``nodes``; 23.02+ ``scontrol show
    nodes --json``'s ``nodes``)."""
    r = _Record(data, where, slurm)
    name = r.text("name")
    if not name:
        raise r._bad("name", data.get("name"), "a node name")
    r.where = f"{where} {name}"
    state, flags = r.state("state")
    if "state_flags" in data:  # 22.05: flags beside a lower-case base state
        flags |= frozenset(f.upper() for f in r.names("state_flags"))
    reason = r.text("reason")
    return Node(
        name=name,
        state=state,
        flags=flags,
        reason=reason,
        partitions=r.names("partitions"),
        address=r.text("address"),
        hostname=r.text("hostname"),
        # who set the reason, and when: without a reason, a leftover (24.11 keeps the user of
        # a reason since cleared), which the text listing does not show
        reason_set_by=r.text("reason_set_by_user", required=False) if reason else "",
        reason_changed_at=(r.number("reason_changed_at", required=False) or 0) if reason else 0,
        gpus=gpu_count(r.text("gres", required=False)),
        features=(frozenset(r.names("active_features")) if "active_features" in data else None),
    )


#: GRES that share a GPU between jobs: the job's GPU is not in its ``gpu`` IDX.
_SHARED_GPU_GRES = frozenset({"mps", "shard"})


def _gres_items(text: str) -> list[str]:
    """``"gpu:a:1(IDX:0,2),mps:50"`` -> its items; commas inside parentheses stay."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _index_list(text: str) -> frozenset[int] | None:
    """``"0-1,3"`` -> {0, 1, 3}; None for ``N/A`` or anything else."""
    found: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            return None
        found.update(range(int(low), int(high if dash else low) + 1))
    return frozenset(found)


def gpu_indices(detail: str) -> frozenset[int] | None:
    """The GPU indices in one node's GRES detail (``"gpu:2(IDX:0-1)"``, ``"gpu:a100:1(IDX:0),
    gpu:v100:1(IDX:4)"``; ``""``: none). None when Slurm does not say which (``IDX:N/A``), a
    GPU is shared (``mps``, ``shard``), or the text is not one we know."""
    indices: set[int] = set()
    for item in _gres_items(detail):
        name, _, rest = item.partition(":")
        name = name.split("(", 1)[0]
        if name in _SHARED_GPU_GRES:
            return None
        if name != "gpu":
            continue
        count = rest.split("(", 1)[0].rsplit(":", 1)[-1]
        if count == "0":
            continue
        if "(IDX:" not in item or not item.endswith(")"):
            return None
        found = _index_list(item.split("(IDX:", 1)[1][:-1])
        if found is None:
            return None
        indices |= found
    return frozenset(indices)


def job_gpus(nodes: tuple[str, ...], detail: Any, r: _Record) -> dict[str, frozenset[int]] | None:
    """node -> GPU indices from ``gres_detail`` (one string per allocated node, in node
    order; ``[]`` for a job without GRES). None when Slurm does not say (absent, or not one
    string per node: then every GPU of the job's nodes may be its). A finished job's
    ``gres_detail`` is empty although it held GPUs: when it asked for GPUs (``tres_per_*``),
    no indices means "no longer shown", not "held none"."""
    if detail is None:
        return None
    if not isinstance(detail, list) or not all(isinstance(d, str | None) for d in detail):
        raise r._bad("gres_detail", detail, "a list of strings")
    if not detail:
        return None if _asked_for_gpus(r) else {}
    if len(detail) != len(nodes):
        return None
    held: dict[str, frozenset[int]] = {}
    for node, text in zip(nodes, detail, strict=True):
        indices = gpu_indices(text or "")
        if indices is None:
            return None
        if indices:
            held[node] = indices
    if not held and _asked_for_gpus(r):
        return None
    return held


def _asked_for_gpus(r: _Record) -> bool:
    """Whether the job asked for GPUs (``--gpus*``, ``--gres=gpu``: ``tres_per_*`` name
    ``gres/gpu``)."""
    for key in ("tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket"):
        value = r.get(key, False)
        if isinstance(value, str) and "gpu" in value:
            return True
    return False


def gpu_count(gres: str) -> int:
    """GPUs configured on a node from its ``gres`` (``"gpu:8"``, ``"gpu:h100:4(S:0-1),
    gpu:a100:4(S:1)"``, ``""``); 0 when none or not readable."""
    total = 0
    for item in _gres_items(gres):
        fields = item.split("(", 1)[0].split(":")
        if fields[0] != "gpu":
            continue
        if len(fields) < 2 or not fields[-1].isdigit():
            return 0
        total += int(fields[-1])
    return total


def _records(doc: Any, key: str, command: str, parse: Callable[..., Any]) -> list[Any]:
    if not isinstance(doc, Mapping):
        raise UnsupportedOutput(
            f"`{command}` printed {type(doc).__name__}, not an object", "unknown"
        )
    slurm = release(doc)
    items = doc.get(key, _MISSING)
    if items is _MISSING or not isinstance(items, list):
        keys = ", ".join(sorted(str(k) for k in doc)) or "nothing"
        raise UnsupportedOutput(
            f"`{command}` printed no {key!r} list (it has: {keys})", slurm, field=key
        )
    return [parse(item, slurm=slurm, where=f"{key}[{i}]") for i, item in enumerate(items)]


def jobs_from_json(doc: Any, command: str = "squeue --json") -> list[Job]:
    """Every job in a ``{"jobs": [...]}`` document."""
    return _records(doc, "jobs", command, job_from_json)


def nodes_from_json(doc: Any, command: str = "scontrol show nodes --json") -> list[Node]:
    """Every node in a ``{"nodes": [...]}`` document."""
    return _records(doc, "nodes", command, node_from_json)
