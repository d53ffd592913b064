"""Scheduler backend over pyslurm (Slurm's C API): the production default where it imports.

pyslurm's API follows Slurm's own major release: pyslurm 25.11.x (the only series on PyPI)
builds only against Slurm 25.11 headers and talks only to a 25.11 slurmctld.

**Every call runs in a worker process, bounded by ``timeout``.** pyslurm calls libslurm with
the GIL held (no ``nogil`` anywhere in its .pxd files), and libslurm waits as long as it
likes: with slurmctld down it retries the connection for ``MessageTimeout`` seconds per RPC,
and ``Job.load`` makes two RPCs (``slurm_load_federation``, then the job), so one call took
20 s on Slurm 25.11.7 with the default MessageTimeout of 10 s. Run in a thread of this
process, such a call cannot be timed out at all: the waiting thread needs the GIL to notice its
deadline, and every other thread of the controller (its HTTP ingest, its node listing) stops
for those 20 s. So each :class:`PyslurmScheduler` keeps one child process (``python -c ...
_serve()``) that imports pyslurm and runs the calls; the parent sends a request over a pipe and
waits (GIL released) at most ``timeout`` seconds. A call that has not answered by then is
:class:`~base.Unreachable`, and its child is killed (SIGKILL: a call inside libslurm cannot be
stopped any other way) and replaced by a fresh one on the next call. What this cannot know: a
write killed that way (requeue, modify, release, cancel, node update) may or may not have
reached slurmctld; the controller re-reads and does only the missing step, as after any
timeout of the scontrol backend. The records come back already translated (``base.Job``,
``base.Node``, pickled); the child is this module, so both sides always agree on the protocol.
``isolate=False`` runs pyslurm in this process instead, with no bound at all: for the unit
tests over the recorded model, not for production.

This path cannot run on the development and CI machines: they have Debian's Slurm 22.05,
against which pyslurm 25.11 neither builds nor talks. What covers it there is
``tests/unit/test_pyslurm_backend.py``: the translation in both directions (pyslurm objects
to ``base.Job``/``base.Node``, each operation to the exact pyslurm calls, ``RPCError`` to
the typed errors), run over a recorded model of the pyslurm 25.11.2 objects in
``tests/unit/pyslurm_model/``, and the worker process over the same model. What runs it for
real is the contract suite in ``tests/integration``, parametrized over backends, on any host
where pyslurm imports against a matching Slurm (:func:`available` says whether this host is
one; it was run on Slurm 25.11.7 with pyslurm 25.11.2).

pyslurm is imported inside functions only, so this module imports wherever pyslurm is
absent; backend selection ``auto`` asks :func:`available` first.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pickle
import re
import select
import struct
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from slurm_recovery.contract.hostlist import expand
from slurm_recovery.scheduler.base import (
    ExitCode,
    InvalidRequest,
    Job,
    Node,
    SchedulerError,
    SchedulerSteps,
    UnknownJob,
    UnknownNode,
    Unreachable,
    slurm_time,
)
from slurm_recovery.scheduler.errors import slurm_error

#: Reasons Slurm shows for a held job (``state_reason`` is the state description when
#: Slurm set one, as for ``requeue(hold=True)``, else the reason code's name).
HELD_REASONS = frozenset({"JobHeldAdmin", "JobHeldUser", "job requeued in held state"})

# pyslurm raises some RPCErrors of its own, with no Slurm errno behind them (errno stays
# SLURM_ERROR). pyslurm 25.11.2: core/node.pyx Node.load, core/job/job.pyx Job.load.
_PYSLURM_OWN_ERRORS: tuple[tuple[re.Pattern[str], type[SchedulerError]], ...] = (
    (re.compile(r"^Node '.*' does not exist$"), UnknownNode),
    (re.compile(r"^RPC was successful but got no job data"), UnknownJob),
)


def _major_minor(version: str | None) -> str | None:
    """``"25.05"`` for Slurm's ``25.05.3`` and for pyslurm's ``25.5.0`` (pyslurm drops the
    zero), so the two compare as the release they are."""
    match = re.match(r"^\s*(\d+)\.(\d+)", version or "")
    return f"{int(match[1])}.{int(match[2]):02d}" if match else None


def available() -> tuple[bool, str]:
    """Whether pyslurm imports here and speaks the running slurmctld's release, and why.

    This one question is asked in this process (importing pyslurm here, as ``auto`` needs to
    know that it imports), so it is bounded by libslurm alone: about MessageTimeout (10 s by
    default) when slurmctld does not answer, with this process's GIL held meanwhile.
    """
    try:
        import pyslurm
    except Exception as exc:  # ImportError, or libslurm/slurm.conf trouble at import
        return False, f"pyslurm does not import: {type(exc).__name__}: {exc}"
    built_for = getattr(pyslurm, "__version__", None)
    try:
        running = pyslurm.slurmctld.Config.load().version
    except pyslurm.RPCError as exc:
        return False, (
            f"pyslurm {built_for} imports, but slurmctld did not say its version: "
            f"{getattr(exc, 'msg', None) or exc}"
        )
    if _major_minor(built_for) is None or _major_minor(built_for) != _major_minor(running):
        return False, (
            f"pyslurm {built_for} is for Slurm {_major_minor(built_for)}, but slurmctld "
            f"runs Slurm {running}: install pyslurm {_major_minor(running)}.x or use the "
            "scontrol backend"
        )
    return True, f"pyslurm {built_for} matches slurmctld {running}"


def _str(value: Any) -> str:
    """pyslurm gives None for strings Slurm left unset."""
    return "" if value is None else str(value)


def _int(value: Any) -> int:
    """pyslurm gives None for unset numbers and times (0 or NO_VAL in Slurm)."""
    return value if isinstance(value, int) else 0


def _array_task_id(job: Any) -> int | None:
    """The task id of an array task; None for an array's pending record (and off arrays).

    pyslurm's ``Job.array_task_id`` is ``u32_parse(array_task_id)`` (job.pyx:1135), whose
    ``zero_is_noval`` turns task **0** into None, the same None it gives for NO_VAL, the
    pending record's task id. What tells the two apart is ``array_tasks_waiting`` (Slurm's
    ``array_task_str``): slurmctld sends it only for the pending record, the one whose task id
    is NO_VAL (job_mgr.c build_array_str), e.g. ``"1-3"`` for ``17_[1-3%1]``. Seen on Slurm
    25.11.7: task 0 of array 1 reads ``array_id=1, array_task_id=None,
    array_tasks_waiting=None``; the pending record ``array_id=2, array_task_id=None,
    array_tasks_waiting='1-3'``. One record stays ambiguous: an array's record whose pending
    tasks were all cancelled before any started keeps task id NO_VAL with no waiting tasks,
    and reads here as task 0 (it is CANCELLED, and it carries the array's own id, so the
    writes below refuse it either way).
    """
    if not _int(job.array_id):
        return None
    if job.array_tasks_waiting:
        return None
    task = job.array_task_id
    return task if isinstance(task, int) else 0


def job_from_pyslurm(job: Any) -> Job:
    """A ``pyslurm.Job`` (25.11) as a :class:`base.Job`."""
    reason = _str(job.state_reason)
    return Job(
        job_id=int(job.id),
        name=_str(job.name),
        state=_str(job.state),
        reason=reason,
        user=_str(job.user_name),
        partition=_str(job.partition),
        nodes=tuple(expand(job.allocated_nodes)),
        num_nodes=_int(job.num_nodes),
        submit_time=_int(job.submit_time),
        restart_count=_int(job.requeue_count),
        excluded_nodes=frozenset(expand(job.excluded_nodes)),
        exit_code=ExitCode(_int(job.exit_code), _int(job.exit_code_signal)),
        held=job.priority == 0 or reason in HELD_REASONS,
        begin_time=_int(job.eligible_time),  # Slurm's BeginTime, shown as EligibleTime
        start_time=_int(job.start_time),
        end_time=_int(job.end_time),
        stdout_path=job.standard_output or None,
        admin_comment=_str(job.admin_comment),
        requeueable=job.is_requeueable is not False,  # job.pyx: is_requeueable (u16 bool)
        required_nodes=frozenset(expand(job.required_nodes)),  # job.pyx: required_nodes
        array_job_id=_int(job.array_id),  # job.pyx:1127 array_id (None off arrays)
        array_task_id=_array_task_id(job),
        batch=job.is_batch_job is not False,  # job.pyx: is_batch_job (batch_flag)
    )


def node_from_pyslurm(node: Any) -> Node:
    """A ``pyslurm.Node`` (25.11) as a :class:`base.Node`.

    pyslurm spells the state as Slurm's ``node_state_string_complete``: the base state,
    then ``+FLAG`` for each flag (``"IDLE+DRAIN"``, ``"MIXED+DRAIN+NOT_RESPONDING"``).
    """
    base, *flags = _str(node.state).split("+") if node.state else ["UNKNOWN"]
    return Node(
        name=_str(node.name),
        state=base,
        flags=frozenset(flags),
        reason=_str(node.reason),
        partitions=tuple(node.partitions or ()),
        address=_str(node.address),
        hostname=_str(node.hostname),
    )


# --- the pyslurm calls, by name: run in the worker process (or here, isolate=False) ---------
# Each takes the pyslurm module and plain arguments and returns plain, picklable values.


def _op_config(ps: Any) -> tuple[str, str]:
    config = ps.slurmctld.Config.load()
    return _str(config.cluster_name), _str(config.version)


def _op_list_jobs(ps: Any) -> list[Job]:
    return [job_from_pyslurm(j) for j in ps.Jobs.load().values()]


def _op_load_job(ps: Any, job_id: int) -> Job:
    return job_from_pyslurm(ps.Job.load(job_id))


def _op_list_nodes(ps: Any) -> list[Node]:
    return [node_from_pyslurm(n) for n in ps.Nodes.load().values()]


def _op_load_node(ps: Any, name: str) -> Node:
    return node_from_pyslurm(ps.Node.load(name))


def _op_requeue_hold(ps: Any, job_id: int) -> None:
    ps.Job(job_id).requeue(hold=True)


def _op_modify_job(ps: Any, job_id: int, changes: dict[str, Any]) -> None:
    ps.Job(job_id).modify(ps.JobSubmitDescription(**changes))


def _op_release(ps: Any, job_id: int) -> None:
    ps.Job(job_id).release()


def _op_cancel(ps: Any, job_id: int) -> None:
    ps.Job(job_id).cancel()


def _op_modify_node(ps: Any, name: str, changes: dict[str, Any]) -> None:
    ps.Node(name).modify(ps.Node(**changes))


_OPS: dict[str, Callable[..., Any]] = {
    "config": _op_config,
    "list_jobs": _op_list_jobs,
    "load_job": _op_load_job,
    "list_nodes": _op_list_nodes,
    "load_node": _op_load_node,
    "requeue_hold": _op_requeue_hold,
    "modify_job": _op_modify_job,
    "release": _op_release,
    "cancel": _op_cancel,
    "modify_node": _op_modify_node,
}


class _RPCFailure(Exception):
    """pyslurm's ``RPCError``, as plain data (it may come from the worker process)."""

    def __init__(self, message: str, errno: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.errno = errno


def _rpc_failure(exc: BaseException) -> _RPCFailure:
    message = _str(getattr(exc, "msg", None)) or str(exc)
    errno = getattr(exc, "errno", None)
    return _RPCFailure(message, errno if isinstance(errno, int) else None)


class _NoAnswer(Exception):
    """The worker did not answer before the deadline."""


class _WorkerGone(Exception):
    """The worker process ended (or never started) without answering."""


_HEADER = struct.Struct("!Q")


def _send(out: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_HEADER.pack(len(data)) + data)
    out.flush()


def _receive_blocking(inp: BinaryIO) -> Any:
    """The next message, or None at end of input (the parent has gone)."""
    header = inp.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = inp.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def _serve() -> None:
    """The worker process: import pyslurm, then run one request at a time from stdin.

    The protocol has a private copy of stdout; fd 1 itself is pointed at stderr, so that
    whatever libslurm or pyslurm prints cannot corrupt it. At end of input (the parent closed
    the pipe, or died) the worker exits.
    """
    inp = os.fdopen(os.dup(0), "rb")
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    try:
        import pyslurm
    except Exception as exc:
        _send(out, ("error", f"pyslurm does not import: {type(exc).__name__}: {exc}", ""))
        return
    _send(out, ("ready", getattr(pyslurm, "__version__", None)))
    while (request := _receive_blocking(inp)) is not None:
        op, args = request
        try:
            reply: tuple[Any, ...] = ("ok", _OPS[op](pyslurm, *args))
        except pyslurm.RPCError as exc:
            failure = _rpc_failure(exc)
            reply = ("rpc", failure.message, failure.errno)
        except Exception as exc:
            reply = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())
        _send(out, reply)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End a worker for good (also run when its scheduler is collected, or at exit)."""
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL is not refused
        proc.wait(timeout=5)


class _Worker:
    """One child process that runs pyslurm; at most one call in it at a time."""

    def __init__(self, env: dict[str, str]) -> None:
        self._env = env
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._buffer = b""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def run(self, op: str, args: tuple[Any, ...], timeout: float) -> Any:
        """``op``'s result; raises :class:`_RPCFailure`, :class:`_NoAnswer` (the child was
        killed) or :class:`_WorkerGone`."""
        deadline = time.monotonic() + timeout
        if not self._lock.acquire(timeout=max(timeout, 0.0)):
            raise _NoAnswer("another pyslurm call held the worker until the deadline")
        try:
            try:
                if self._proc is None:
                    self._start(deadline)
                assert self._proc is not None and self._proc.stdin is not None
                try:
                    _send(self._proc.stdin, (op, args))
                except (BrokenPipeError, OSError) as exc:
                    raise _WorkerGone(f"the pyslurm worker is gone ({exc})") from None
                reply = self._receive(deadline)
            except (_NoAnswer, _WorkerGone):
                self.close()
                raise
        finally:
            self._lock.release()
        kind = reply[0]
        if kind == "ok":
            return reply[1]
        if kind == "rpc":
            raise _RPCFailure(reply[1], reply[2])
        raise RuntimeError(f"pyslurm worker: {reply[1]}\n{reply[2]}".rstrip())

    def _start(self, deadline: float) -> None:
        # the child imports this module from where this process found it
        root = str(Path(__file__).resolve().parents[2])
        env = dict(self._env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        code = "from slurm_recovery.scheduler.pyslurm_backend import _serve; _serve()"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self._buffer = b""
        self._finalizer = weakref.finalize(self, _stop, self._proc)
        try:  # large listings in fewer reads (Linux; best effort)
            import fcntl

            fcntl.fcntl(self._proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)  # type: ignore[union-attr,attr-defined]
        except (ImportError, AttributeError, OSError):
            pass
        reply = self._receive(deadline)
        if reply[0] != "ready":
            raise _WorkerGone(reply[1])

    def _read(self, size: int, deadline: float) -> bytes:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while len(self._buffer) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poller.poll(remaining * 1000):
                raise _NoAnswer("no answer before the deadline")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                rc = self._proc.wait()
                raise _WorkerGone(
                    f"the pyslurm worker exited (status {rc}) without answering; libslurm "
                    "says why on stderr (a fatal slurm.conf error ends the process)"
                )
            self._buffer += chunk
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def _receive(self, deadline: float) -> tuple[Any, ...]:
        (size,) = _HEADER.unpack(self._read(_HEADER.size, deadline))
        reply: tuple[Any, ...] = pickle.loads(self._read(size, deadline))
        return reply

    def close(self) -> None:
        """Kill the child (a fresh one starts on the next call)."""
        if self._finalizer is not None:
            self._finalizer()  # _stop(proc), once
        self._proc = None
        self._finalizer = None
        self._buffer = b""


def importable() -> bool:
    """Whether ``import pyslurm`` can find it, without importing it (which runs slurm_init)."""
    if "pyslurm" in sys.modules:
        return sys.modules["pyslurm"] is not None
    return importlib.util.find_spec("pyslurm") is not None


class _InProcess:
    """pyslurm in this process, with no bound (``isolate=False``: the unit tests' model)."""

    def __init__(self) -> None:
        import pyslurm

        self._ps = pyslurm

    def run(self, op: str, args: tuple[Any, ...], timeout: float) -> Any:
        try:
            return _OPS[op](self._ps, *args)
        except self._ps.RPCError as exc:
            raise _rpc_failure(exc) from exc

    def close(self) -> None:
        pass


class PyslurmScheduler(SchedulerSteps):
    """:class:`base.Scheduler` over pyslurm 25.11 (``Job``, ``Node``, ``slurmctld.Config``).

    ``timeout`` bounds every call (``scheduler.command_timeout``), as it bounds each command
    of the scontrol backend; ``slurm_conf`` sets ``SLURM_CONF`` for pyslurm. Both apply to the
    worker process (the default); ``isolate=False`` runs pyslurm in this process, unbounded.
    """

    name = "pyslurm"

    def __init__(
        self, timeout: float = 15.0, *, slurm_conf: str = "", isolate: bool = True
    ) -> None:
        self.timeout = timeout
        self.env = dict(os.environ)
        if slurm_conf:
            self.env["SLURM_CONF"] = slurm_conf
        self.isolated = isolate
        if isolate:
            if not importable():  # the worker imports it; this process need not
                raise ImportError("No module named 'pyslurm'")
            self._runner: _Worker | _InProcess = _Worker(self.env)
        else:
            self._runner = _InProcess()

    def close(self) -> None:
        """Stop the worker process (the scheduler stays usable: the next call starts one)."""
        self._runner.close()

    @property
    def worker_pid(self) -> int | None:
        """The worker process's pid, None while none runs (or with ``isolate=False``)."""
        return self._runner.pid if isinstance(self._runner, _Worker) else None

    def _call(self, action: str, command: str, op: str, *args: Any) -> Any:
        """Run one pyslurm call within the timeout; its ``RPCError`` becomes our typed
        error, in Slurm's words."""
        try:
            return self._runner.run(op, args, self.timeout)
        except _NoAnswer as exc:
            raise Unreachable(
                f"{command} did not finish within {self.timeout:g}s (its pyslurm worker "
                "process was killed; a write may or may not have reached slurmctld)",
                command=command,
            ) from exc
        except _WorkerGone as exc:
            raise SchedulerError(f"{action} failed: {exc}", command=command) from exc
        except _RPCFailure as exc:
            cause = exc.__cause__ or exc  # pyslurm's RPCError itself when it ran here
            for pattern, error in _PYSLURM_OWN_ERRORS:
                if pattern.search(exc.message):
                    raise error(
                        f"{action} failed", slurm_message=exc.message, command=command
                    ) from cause
            raise slurm_error(action, exc.message, errno=exc.errno, command=command) from cause

    def cluster_name(self) -> str:
        return self._call("read slurmctld config", "pyslurm.slurmctld.Config.load()", "config")[0]

    def version(self) -> str:
        return self._call("read slurmctld config", "pyslurm.slurmctld.Config.load()", "config")[1]

    def list_jobs(self) -> list[Job]:
        jobs = self._call("list jobs", "pyslurm.Jobs.load()", "list_jobs")
        found = sorted(jobs, key=lambda j: j.job_id)
        self._remember(found)
        return found

    def get_job(self, job_id: int) -> Job:
        job = self._call(f"read job {job_id}", f"pyslurm.Job.load({job_id})", "load_job", job_id)
        if job.job_id != job_id:
            # Job.load takes the first record Slurm sends; for an array's id Slurm sends
            # every task, so pick the one whose own id this is from the whole listing.
            job = next((j for j in self.list_jobs() if j.job_id == job_id), None)
            if job is None:
                raise UnknownJob(f"job {job_id} not found", command=f"pyslurm.Job.load({job_id})")
        self._remember([job])
        return job

    def _target(self, job_id: int) -> int:
        """The number a pyslurm write sends for ``job_id``.

        pyslurm names jobs by number only, and Slurm reads a number that is an array's id
        as every task of that array. An array task is sent as its own id when that differs
        from the array's; the task that carries the array's own id is refused, not sent.
        """
        address = self.address(job_id)
        array_id, _, task = address.partition("_")
        if task and int(array_id) == job_id:
            raise InvalidRequest(
                f"job {job_id} is array task {address}, whose id is also the array's: pyslurm "
                "can name it only by that number, which Slurm applies to every task; "
                "nothing done (the scontrol backend names it exactly)"
            )
        return job_id

    def list_nodes(self) -> list[Node]:
        nodes = self._call("list nodes", "pyslurm.Nodes.load()", "list_nodes")
        return sorted(nodes, key=lambda n: n.name)

    def get_node(self, name: str) -> Node:
        node: Node = self._call(
            f"read node {name}", f"pyslurm.Node.load({name!r})", "load_node", name
        )
        return node

    def requeue_hold(self, job_id: int) -> None:
        job_id = self._target(job_id)
        self._call(
            f"requeue job {job_id} held",
            f"pyslurm.Job({job_id}).requeue(hold=True)",
            "requeue_hold",
            job_id,
        )

    def _modify_job(self, job_id: int, action: str, **changes: Any) -> None:
        job_id = self._target(job_id)
        shown = ", ".join(f"{k}={v!r}" for k, v in changes.items())
        self._call(
            action,
            f"pyslurm.Job({job_id}).modify(JobSubmitDescription({shown}))",
            "modify_job",
            job_id,
            changes,
        )

    def _write_excluded_nodes(self, job_id: int, expr: str) -> None:
        self._modify_job(job_id, f"exclude nodes from job {job_id}", excluded_nodes=expr)

    def _write_begin_now(self, job_id: int, at: float | None) -> None:
        # pyslurm passes a begin_time string to slurm_parse_time, as scontrol does for
        # StartTime=now; slurmctld moves a time in the past up to its own "now".
        when = "now" if at is None else slurm_time(at)
        self._modify_job(job_id, f"set begin time of job {job_id} to {when}", begin_time=when)

    def release(self, job_id: int) -> None:
        job_id = self._target(job_id)
        self._call(f"release job {job_id}", f"pyslurm.Job({job_id}).release()", "release", job_id)

    def _write_admin_comment(self, job_id: int, comment: str) -> None:
        self._modify_job(job_id, f"record cancel reason on job {job_id}", admin_comment=comment)

    def _signal_cancel(self, job_id: int) -> None:
        job_id = self._target(job_id)
        self._call(f"cancel job {job_id}", f"pyslurm.Job({job_id}).cancel()", "cancel", job_id)

    def _modify_node(self, name: str, action: str, **changes: Any) -> None:
        shown = ", ".join(f"{k}={v!r}" for k, v in changes.items())
        self._call(
            action,
            f"pyslurm.Node({name!r}).modify(pyslurm.Node({shown}))",
            "modify_node",
            name,
            changes,
        )

    def _write_node_state(self, name: str, state: str, reason: str | None) -> None:
        changes = {"state": state} if reason is None else {"state": state, "reason": reason}
        self._modify_node(name, f"set node {name} {state}", **changes)
