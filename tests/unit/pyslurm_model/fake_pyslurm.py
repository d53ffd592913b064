"""A recorded model of pyslurm 25.11.2's object API, standing in for pyslurm in unit tests.

Recorded by reading the pyslurm-25.11.2 sdist from PyPI (pyslurm cannot be built here:
it needs Slurm 25.11 headers, Debian has 22.05). Only what slurm-recovery touches is
modelled, with pyslurm's exact names, signatures and value shapes:

- ``Job`` / ``Jobs``: pyslurm/core/job/job.pyx -- ``Jobs.load(preload_passwd_info=False,
  frozen=False)`` (l.75), ``Job(job_id)`` (l.234), ``Job.load(job_id)`` (l.261),
  ``cancel()`` (l.398), ``modify(JobSubmitDescription changes)`` (l.446),
  ``hold(mode=None)`` (l.470), ``release()`` (l.500), ``requeue(hold=False)`` (l.512);
  properties ``id``, ``name``, ``user_name``, ``priority`` (0 when held: u32_parse with
  zero_is_noval=False), ``state`` (slurm_job_state_string), ``state_reason`` (state_desc
  if set, else the reason code name), ``requeue_count``, ``submit_time``,
  ``eligible_time``, ``start_time``, ``end_time`` (None when 0/NO_VAL: _raw_time),
  ``partition``, ``num_nodes``, ``allocated_nodes``, ``excluded_nodes`` (host-list
  strings or None), ``exit_code``, ``exit_code_signal``, ``admin_comment``,
  ``standard_output`` (l.673-1152).
- ``JobSubmitDescription(**kwargs)``: pyslurm/core/job/submission.pyx l.59; the settable
  names are the ``cdef public`` block of submission.pxd l.572 (``PUBLIC_SUBMIT_FIELDS``).
- ``Node`` / ``Nodes``: pyslurm/core/node.pyx -- ``Nodes.load(preload_passwd_info=False)``
  (l.65), ``Node(name=None, **kwargs)`` (l.222), ``Node.load(name)`` (l.285, raises its
  own ``RPCError(msg="Node '<name>' does not exist")``), ``Node.modify(Node changes)``
  (l.360); ``state`` is ``slurm_node_state_string_complete`` ("IDLE+DRAIN", l.662), its
  setter accepts only the words of ``_node_state_from_str`` (l.693); ``reason``,
  ``partitions`` (a list).
- ``RPCError(errno=SLURM_ERROR, msg=None)``: pyslurm/core/error.pyx l.72-101, message
  from ``slurm_strerror(errno)`` unless ``msg`` is given.
- Array records: a record holds Slurm's own ``slurm_job_info_t`` fields ``array_job_id``,
  ``array_task_id`` (NO_VAL in an array's pending record) and ``array_task_str`` (set by
  slurmctld only in the pending record, e.g. ``"1-3%1"``); the properties compute what
  pyslurm returns from them (job.pyx l.1127-1149): ``array_id`` and ``array_task_id`` are
  ``u32_parse(...)``, whose ``zero_is_noval`` gives **None for task 0** as for NO_VAL;
  ``array_tasks_waiting`` is ``array_task_str`` less its ``%N``, None when unset. Checked on
  Slurm 25.11.7 (``--array=0-3%1``: task 0 read ``array_id=2, array_task_id=None,
  array_tasks_waiting=None``, the pending record ``array_id=2, array_task_id=None,
  array_tasks_waiting='1-3'``).
- slurmctld down (``World.slurmctld_down``): each RPC fails with errno 1800 ("Unable to
  contact slurm controller (connect failure)") after libslurm retried the connection for
  MessageTimeout (``World.msg_timeout``, Slurm's default 10 s: slurm_protocol_api.c
  _open_controller). ``Job.load`` makes two (``slurm_load_job`` asks
  ``slurm_load_federation`` first, src/api/job_info.c), so it fails after 2 x MessageTimeout:
  20.0 s measured on 25.11.7; every other call here fails on its first RPC (10.0 s). Real
  pyslurm holds the GIL all that time (no ``nogil`` in its .pxd files: a thread's deadline
  cannot fire); the model's ``time.sleep`` does not, so the bound is tested through the
  backend's worker process (``site/pyslurm``), the one thing that bounds the real call.
- ``slurmctld.Config.load()`` with ``cluster_name`` and ``version``:
  pyslurm/core/slurmctld/config.pyx l.200, l.383, l.1190. ``__version__``: version.py.

``build(world)`` returns a fresh ``pyslurm`` module over a :class:`World` (what slurmctld
holds) that records every call in ``world.calls`` and raises ``world.fail[method]`` if set.
"""

from __future__ import annotations

import time
import types
from dataclasses import dataclass, field
from typing import Any

SLURM_ERROR = -1

#: slurm_strerror() for the errnos the tests use (Slurm 22.05.8 libslurm agrees).
STRERROR = {
    SLURM_ERROR: "Unspecified error",
    1800: "Unable to contact slurm controller (connect failure)",
    2002: "Access/permission denied",
    2017: "Invalid job id specified",
    2018: "Invalid node name specified",
    2021: "Job/step already completing or completed",
    2024: "Job is pending execution",
    2037: "Requested operation is presently disabled",
    2039: "Only batch jobs are accepted or processed",
    2073: "Job is no longer pending execution",
}

#: pyslurm/core/job/submission.pxd l.572: the only names JobSubmitDescription accepts.
# fmt: off
PUBLIC_SUBMIT_FIELDS = frozenset({
    "name", "account", "user_id", "group_id", "priority", "site_factor", "wckey", "array",
    "batch_constraints", "begin_time", "clusters", "cluster_constraints", "comment",
    "admin_comment", "requires_contiguous_nodes", "cores_reserved_for_system",
    "threads_reserved_for_system", "working_directory", "cpu_frequency", "nodes",
    "deadline", "delay_boot_time", "dependencies", "excluded_nodes", "required_nodes",
    "constraints", "kill_on_node_fail", "licenses", "mail_user", "mail_types", "mcs_label",
    "memory_per_cpu", "memory_per_node", "memory_per_gpu", "network", "nice",
    "log_files_open_mode", "overcommit", "partitions", "profile_types",
    "accounting_gather_frequency", "qos", "requires_node_reboot", "is_requeueable",
    "reservations", "script", "script_args", "environment", "resource_sharing",
    "distribution", "time_limit", "time_limit_min", "container", "container_id",
    "cpus_per_task", "cpus_per_gpu", "sockets_per_node", "cores_per_socket",
    "threads_per_core", "gpus", "gpus_per_socket", "gpus_per_task", "gres_per_node",
    "gpu_binding", "ntasks", "ntasks_per_node", "ntasks_per_socket", "ntasks_per_core",
    "ntasks_per_gpu", "switches", "signal", "standard_in", "standard_output",
    "standard_error", "kill_on_invalid_dependency", "spreads_over_nodes", "use_min_nodes",
    "gres_binding", "gres_tasks_per_sharing", "temporary_disk_per_node",
    "get_user_environment", "min_cpus_per_node", "wait_all_nodes", "selinux_context",
    "segment_size", "reserved_ports", "extra",
})
# fmt: on

#: Job properties modelled (a subset of job.pyx l.673-1152), held as pyslurm returns them
#: (None when Slurm left them unset); the array properties are computed (ARRAY_FIELDS).
JOB_FIELDS = (
    "name",
    "user_name",
    "priority",
    "state",
    "state_reason",
    "requeue_count",
    "submit_time",
    "eligible_time",
    "start_time",
    "end_time",
    "partition",
    "num_nodes",
    "allocated_nodes",
    "excluded_nodes",
    "exit_code",
    "exit_code_signal",
    "admin_comment",
    "standard_output",
    "is_requeueable",  # job.pyx:742
    "required_nodes",  # job.pyx:846
    "is_batch_job",  # job.pyx:750 (batch_flag)
)

NO_VAL = 0xFFFFFFFE  # slurm.h: an unset uint32_t


def u32_parse(val: int, zero_is_noval: bool = True) -> int | None:
    """pyslurm/utils/uint.pyx u32_parse: None for NO_VAL, and for 0 unless told otherwise."""
    if val == NO_VAL or (val == 0 and zero_is_noval):
        return None
    return val


def _tasks_waiting(task_str: str | None) -> str | None:
    if not task_str:
        return None
    return task_str[: task_str.rindex("%")] if "%" in task_str else task_str


#: Slurm's slurm_job_info_t array fields a record holds (defaults: not an array), and the
#: pyslurm properties computed from them (job.pyx l.1127-1149).
ARRAY_RECORD_DEFAULTS = {"array_job_id": 0, "array_task_id": NO_VAL, "array_task_str": None}
ARRAY_FIELDS = {
    "array_id": lambda r: u32_parse(r["array_job_id"]),
    "array_task_id": lambda r: u32_parse(r["array_task_id"]),
    "array_tasks_waiting": lambda r: _tasks_waiting(r["array_task_str"]),
}

#: RPCs each modelled call sends before its first can fail (pyslurm, then libslurm 25.11).
RPCS = {"Job.load": 2}  # slurm_load_federation, then REQUEST_JOB_INFO_SINGLE

#: node.pyx: properties with a setter (l.424-669); others are read-only.
NODE_SETTABLE = frozenset(
    {
        "name",
        "configured_gres",
        "address",
        "hostname",
        "extra",
        "reason",
        "comment",
        "weight",
        "available_features",
        "active_features",
        "cpu_binding",
        "state",
    }
)
NODE_READONLY = frozenset({"partitions", "reason_user", "cluster"})

#: node.pyx _node_state_from_str (l.693): the words the state setter accepts.
NODE_STATE_WORDS = frozenset(
    {
        "CANCEL_REBOOT",
        "DOWN",
        "DRAIN",
        "FAIL",
        "FUTURE",
        "NORESP",
        "NO_RESP",
        "POWER_DOWN",
        "POWER_DOWN_ASAP",
        "POWER_DOWN_FORCE",
        "POWER_UP",
        "RESUME",
        "UNDRAIN",
    }
)


@dataclass
class World:
    """What the fake slurmctld holds, and what was asked of it."""

    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    cluster_name: str = "testcluster"
    version: str = "25.11.2"
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    fail: dict[str, Exception] = field(default_factory=dict)
    #: False plays a slurmctld that drops the update (as it does while COMPLETING).
    apply_begin_time: bool = True
    #: slurmctld not running: every RPC fails after ``msg_timeout`` seconds (see above).
    slurmctld_down: bool = False
    msg_timeout: float = 10.0

    def job_record(self, job_id: int, **values: Any) -> dict[str, Any]:
        record = {**dict.fromkeys(JOB_FIELDS), **ARRAY_RECORD_DEFAULTS}
        record.update(values)
        self.jobs[job_id] = record
        return record

    def array_task(self, job_id: int, array_id: int, task: int, **values: Any) -> dict[str, Any]:
        """A started task of array ``array_id`` (``array_id_task``), as slurmctld holds it."""
        return self.job_record(
            job_id, **{**values, "array_job_id": array_id, "array_task_id": task}
        )

    def array_pending_record(self, array_id: int, waiting: str, **values: Any) -> dict[str, Any]:
        """The array's record of tasks not started yet (``17_[1-3%1]``: ``waiting="1-3%1"``)."""
        array = {"array_job_id": array_id, "array_task_id": NO_VAL, "array_task_str": waiting}
        return self.job_record(array_id, **{"state": "PENDING", **values, **array})

    def node_record(self, name: str, **values: Any) -> dict[str, Any]:
        record = {"state": "IDLE", "reason": None, "partitions": []}
        record.update(values)
        self.nodes[name] = record
        return record


def build(world: World) -> types.ModuleType:
    """A fresh fake ``pyslurm`` module whose objects read and change ``world``."""

    def call(method: str, *args: Any) -> None:
        world.calls.append((method, *args))
        if world.slurmctld_down:
            # libslurm retries each RPC's connection for MessageTimeout, GIL held
            time.sleep(world.msg_timeout * RPCS.get(method, 1))
            raise RPCError(1800)
        if method in world.fail:
            raise world.fail[method]

    class PyslurmError(Exception):
        pass

    class RPCError(PyslurmError):
        def __init__(self, errno: int = SLURM_ERROR, msg: str | None = None) -> None:
            self.msg = msg
            self.errno = errno
            if not msg:
                self.msg = STRERROR.get(errno, f"Unknown error {errno}")
            super().__init__(self.msg)

    class JobSubmitDescription:
        def __init__(self, **kwargs: Any) -> None:
            for key in kwargs:
                if key not in PUBLIC_SUBMIT_FIELDS:
                    # a cdef class without __dict__ refuses unknown attribute names
                    raise AttributeError(
                        f"'pyslurm.core.job.submission.JobSubmitDescription' object has "
                        f"no attribute '{key}'"
                    )
            self.changes = dict(kwargs)

    class Job:
        def __init__(self, job_id: int) -> None:
            self._id = job_id
            self._record: dict[str, Any] | None = None  # Job(id): no data, as in pyslurm

        def __getattr__(self, name: str) -> Any:
            if name in JOB_FIELDS or name in ARRAY_FIELDS:
                if self._record is None:
                    raise AssertionError(
                        f"read Job({self._id}).{name} from a Job that was never loaded"
                    )
                if name in ARRAY_FIELDS:
                    return ARRAY_FIELDS[name](self._record)
                return self._record[name]
            raise AttributeError(f"'pyslurm.Job' object has no attribute '{name}'")

        @property
        def id(self) -> int:
            return self._id

        @staticmethod
        def load(job_id: int) -> Job:
            call("Job.load", job_id)
            # slurm_load_job of an array's id sends every task; pyslurm keeps job_array[0]
            tasks = [i for i, r in world.jobs.items() if r["array_job_id"] == job_id]
            if job_id not in world.jobs and not tasks:
                raise RPCError(2017)
            first = tasks[0] if tasks else job_id
            job = Job(first)
            job._record = dict(world.jobs[first])
            return job

        def _live(self) -> dict[str, Any]:
            if self._id not in world.jobs:
                raise RPCError(2017)
            return world.jobs[self._id]

        def cancel(self) -> None:
            call("Job.cancel", self._id)
            # send_signal(9) ignores ESLURM_INVALID_JOB_ID and ESLURM_ALREADY_DONE (l.389)
            if self._id in world.jobs:
                world.jobs[self._id]["state"] = "CANCELLED"

        def modify(self, changes: JobSubmitDescription) -> None:
            if not isinstance(changes, JobSubmitDescription):
                raise TypeError("Argument 'changes' has incorrect type")
            call("Job.modify", self._id, dict(changes.changes))
            record = self._live()
            for key, value in changes.changes.items():
                if key == "excluded_nodes" and not isinstance(value, str):
                    value = ",".join(value)  # cstr.list_to_str
                if key == "begin_time" and world.apply_begin_time:  # slurmctld: "now" -> now
                    key, value = "eligible_time", int(time.time()) if value == "now" else value
                if key in record:
                    record[key] = value

        def hold(self, mode: str | None = None) -> None:
            call("Job.hold", self._id, {"mode": mode})
            self._live()["priority"] = 0

        def release(self) -> None:
            call("Job.release", self._id)
            self._live()["priority"] = 1

        def requeue(self, hold: bool = False) -> None:
            call("Job.requeue", self._id, {"hold": hold})
            record = self._live()
            record["state"] = "PENDING"
            record["requeue_count"] = (record["requeue_count"] or 0) + 1
            if hold:
                record["priority"] = 0
                record["state_reason"] = "job requeued in held state"

    class Jobs:
        def __init__(self, jobs: list[Job]) -> None:
            self.data = {world.cluster_name: {job.id: job for job in jobs}}

        def values(self) -> Any:  # xcollections.ValuesView: all jobs of all clusters
            return (job for cluster in self.data.values() for job in cluster.values())

        @staticmethod
        def load(preload_passwd_info: bool = False, frozen: bool = False) -> Jobs:
            call("Jobs.load")
            jobs = []
            for job_id in world.jobs:
                job = Job(job_id)
                job._record = dict(world.jobs[job_id])
                jobs.append(job)
            return Jobs(jobs)

    class Node:
        def __init__(self, name: str | None = None, **kwargs: Any) -> None:
            object.__setattr__(self, "_values", {})
            object.__setattr__(self, "_changes", {})
            self.name = name
            for key, value in kwargs.items():
                setattr(self, key, value)

        def __setattr__(self, name: str, value: Any) -> None:
            # node.pyx l.255: Node.__dict__[name].__set__(self, val)
            if name in NODE_READONLY:
                raise AttributeError(f"attribute '{name}' of 'Node' objects is not writable")
            if name not in NODE_SETTABLE:
                raise KeyError(name)
            if name == "state" and value and value.upper() not in NODE_STATE_WORDS:
                raise ValueError(f"Invalid Node state: {value}")
            self._values[name] = value
            if name != "name":
                self._changes[name] = value

        def __getattr__(self, name: str) -> Any:
            values = object.__getattribute__(self, "_values")
            if name in values:
                return values[name]
            if name in NODE_SETTABLE | NODE_READONLY:
                return None
            raise AttributeError(f"'pyslurm.Node' object has no attribute '{name}'")

        @staticmethod
        def load(name: str) -> Node:
            call("Node.load", name)
            if name not in world.nodes:
                raise RPCError(msg=f"Node '{name}' does not exist")
            return Node._from_record(name)

        @staticmethod
        def _from_record(name: str) -> Node:
            node = Node(name)
            record = world.nodes[name]
            node._values.update(record)
            node._changes.clear()
            return node

        def modify(self, changes: Node) -> None:
            if not isinstance(changes, Node):
                raise TypeError("Argument 'changes' has incorrect type")
            call("Node.modify", self.name, dict(changes._changes))
            if self.name not in world.nodes:
                raise RPCError(2018)
            record = world.nodes[self.name]
            state = (changes._changes.get("state") or "").upper()
            base, *flags = record["state"].split("+")
            if state == "DRAIN":
                flags = [*flags, "DRAIN"] if "DRAIN" not in flags else flags
                record["reason"] = changes._changes.get("reason")
            elif state == "RESUME":
                flags = [f for f in flags if f != "DRAIN"]
                record["reason"] = None
            record["state"] = "+".join([base, *flags])

    class Nodes:
        def __init__(self, nodes: list[Node]) -> None:
            self.data = {world.cluster_name: {node.name: node for node in nodes}}

        def values(self) -> Any:
            return (node for cluster in self.data.values() for node in cluster.values())

        @staticmethod
        def load(preload_passwd_info: bool = False) -> Nodes:
            call("Nodes.load")
            return Nodes([Node._from_record(name) for name in world.nodes])

    class Config:
        def __init__(self) -> None:
            raise RuntimeError(
                "Cannot instantiate class directly. Use slurmctld.Config.load() to get an instance."
            )

        @staticmethod
        def load() -> Any:
            call("slurmctld.Config.load")
            return types.SimpleNamespace(cluster_name=world.cluster_name, version=world.version)

    module = types.ModuleType("pyslurm")
    module.__version__ = "25.11.2"
    slurmctld = types.ModuleType("pyslurm.slurmctld")
    slurmctld.Config = Config
    module.slurmctld = slurmctld
    for cls in (PyslurmError, RPCError, JobSubmitDescription, Job, Jobs, Node, Nodes):
        setattr(module, cls.__name__, cls)
    return module
