"""Each job's directory on each of its nodes: where its progress file and NCCL dumps go.

``<hooks.job_dir>/<job_id>/`` with ``{node}`` in ``hooks.job_dir`` replaced by the Slurm node
name, e.g. ``/run/slurm-recovery/jobs/n1/41/``:

- the Prolog (root) creates it, owned by the job user, mode 0700 (:func:`create`);
- the TaskProlog points the job's tasks at ``progress.jsonl`` and ``nccl_trace_rank_<rank>``
  in it (:func:`progress_file`, :func:`nccl_trace_prefix`);
- the sidecar (root) follows the progress file and, after the job ended, removes the directory
  (:func:`remove`); on start it removes those left untouched for a week (:func:`remove_stale`).

This module is the only place that knows the layout (hooks, sidecar and the flight-recorder
reader all call :func:`job_dir_for`). Standard library only, imported by the hooks, whose every
millisecond a job start pays.

Trust: the node's root (``<job_dir>`` with ``{node}`` replaced) must be owned by root and
writable by no one else, so no user can add, rename or replace the job directories in it; a job
user owns only its own directory and may put anything in it (symlinks included), so root never
follows a link inside it: removal walks by file descriptor (``shutil.rmtree`` with ``dir_fd``)
and readers open files with ``O_NOFOLLOW``. The Prolog and the sidecar serialise on an
``flock`` of the root, so the sidecar never removes a directory that a later attempt of the
same job (requeued onto this node) has just claimed.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

__all__ = [
    "NCCL_TRACE_PREFIX",
    "NODE_PLACEHOLDER",
    "PROGRESS_FILE",
    "STALE_AFTER",
    "JobDirError",
    "create",
    "is_job_path",
    "job_dir_for",
    "job_ids",
    "nccl_trace_prefix",
    "node_root",
    "progress_file",
    "remove",
    "remove_stale",
]

#: Replaced by the Slurm node name (as in ``sidecar.spool_dir``).
NODE_PLACEHOLDER = "{node}"
#: The progress file in a job directory (slurm_recovery.progress writes it).
PROGRESS_FILE = "progress.jsonl"
#: The variable the TaskProlog sets to the progress file; slurm_recovery.progress reads it.
PROGRESS_ENV = "SRECOVERY_PROGRESS_FILE"
#: The variable the TaskProlog points at the job directory for PyTorch's flight recorder dumps.
NCCL_TRACE_ENV = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
#: PyTorch's flight recorder appends the rank: ``nccl_trace_rank_0``, ``nccl_trace_rank_1``...
NCCL_TRACE_PREFIX = "nccl_trace_rank_"
#: A job directory untouched this long (seconds) is a leftover; the sidecar removes it at start.
STALE_AFTER = 7 * 24 * 3600.0
#: A directory being removed is first renamed to ``.removing-...`` (left over by a crash: removed).
REMOVING_PREFIX = ".removing-"
#: The longest the Prolog waits for the root's lock before going on without it, and the sidecar
#: before leaving a removal for later (seconds).
LOCK_WAIT = 2.0

_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_JOB_NAME = re.compile(r"[1-9][0-9]{0,18}")


class JobDirError(OSError):
    """A job directory cannot be created or removed safely (the message says why)."""


# ------------------------------------------------------------------------------ paths


def node_root(template: str, node: str) -> str:
    """``template`` (``hooks.job_dir``) with ``{node}`` replaced: this node's job directories.
    ValueError for a relative template or a node name that is not one."""
    if not template.startswith("/"):
        raise ValueError(f"job_dir {template!r} is not an absolute path")
    if not _NODE.fullmatch(node):
        raise ValueError(f"{node!r} is not a Slurm node name")
    return template.replace(NODE_PLACEHOLDER, node).rstrip("/") or "/"


def job_dir_for(template: str, node: str, job_id: int) -> str:
    """The directory of job ``job_id`` on ``node``: ``<template with {node}>/<job_id>``."""
    if type(job_id) is not int or not 0 < job_id < 2**63:
        raise ValueError(f"{job_id!r} is not a job id")
    return os.path.join(node_root(template, node), str(job_id))


def progress_file(job_dir: str) -> str:
    """Where the job's tasks on this node write their progress (``SRECOVERY_PROGRESS_FILE``)."""
    return os.path.join(job_dir, PROGRESS_FILE)


def nccl_trace_prefix(job_dir: str) -> str:
    """``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``: PyTorch appends the rank to it."""
    return os.path.join(job_dir, NCCL_TRACE_PREFIX)


def is_job_path(template: str, job_id: int, value: str) -> bool:
    """Is ``value`` a path in the directory of ``job_id`` on some node? (``srun`` carries the
    batch step's environment, TaskProlog exports included, to the tasks on the other nodes,
    where the TaskProlog must replace them with its own node's.)"""
    if not template.startswith("/"):
        return False
    text = template.rstrip("/") or "/"
    root = _NODE.pattern.join(re.escape(p) for p in text.split(NODE_PLACEHOLDER))
    sep = "" if text.endswith("/") else "/"
    return re.fullmatch(rf"{root}{sep}{job_id}/[^/]+", value) is not None


# ------------------------------------------------------------------------------ the root


def _check_root(root: str, st: os.stat_result) -> None:
    if not stat.S_ISDIR(st.st_mode):
        raise JobDirError(f"{root} is not a directory")
    if st.st_uid != os.geteuid():
        raise JobDirError(f"{root} is owned by uid {st.st_uid}, not by uid {os.geteuid()}")
    if st.st_mode & 0o022:
        raise JobDirError(
            f"{root} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
            f"anyone could plant job directories; fix: chmod go-w {root}"
        )


def _make_parents(root: str) -> None:
    """Create ``root`` and its missing parents, each mode 0755 whatever the umask."""
    missing = []
    path = root
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for path in reversed(missing):
        with suppress(FileExistsError):  # another prolog made it meanwhile
            os.mkdir(path, 0o755)
            os.chmod(path, 0o755)


def _open_root(root: str, make: bool = False) -> int | None:
    """A descriptor of ``root``, checked (:func:`_check_root`); None when it does not exist
    and ``make`` is false."""
    if make:
        _make_parents(root)
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        if make:
            raise
        return None
    try:
        _check_root(root, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def _locked(fd: int, wait: float) -> Iterator[bool]:
    """Hold an exclusive flock on ``fd`` (the root) in the block; yields whether it got one
    within ``wait`` seconds (a stuck holder must never hang a job start)."""
    import fcntl

    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                yield False
                return
            time.sleep(0.005)
    try:
        yield True
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _tombstone(name: str) -> str:
    return f"{REMOVING_PREFIX}{name}-{os.getpid()}-{time.time_ns()}"


def _delete(root_fd: int, name: str) -> None:
    """Delete ``name`` in the root, never following a symlink (a directory is walked by
    descriptor: ``shutil.rmtree`` with ``dir_fd``)."""
    st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=root_fd)
        return
    import shutil

    if not shutil.rmtree.avoids_symlink_attacks:  # pragma: no cover - not on Linux
        raise JobDirError("this platform's rmtree can be tricked by symlinks: not removing")
    shutil.rmtree(name, dir_fd=root_fd)


# ------------------------------------------------------------------------------ the Prolog


def create(template: str, node: str, job_id: int, uid: int, gid: int) -> str:
    """Create (or claim again) the directory of ``job_id`` on ``node`` for the job user
    ``uid``/``gid``: owned by them, mode 0700, in a root-owned 0755 root. Returns its path.

    A directory left by an earlier attempt of the same job by the same user is kept (its
    files stay for whoever reads them; the progress of a previous attempt is ignored by its
    timestamps). Anything else in its place (another user's, a file, a link) is removed first.
    Raises OSError (JobDirError for an unsafe root)."""
    path = job_dir_for(template, node, job_id)
    root, name = os.path.split(path)
    root_fd = _open_root(root, make=True)
    assert root_fd is not None
    tomb = None
    try:
        with _locked(root_fd, LOCK_WAIT):  # without the lock: carry on (fail open)
            try:
                os.mkdir(name, 0o700, dir_fd=root_fd)
            except FileExistsError:
                st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
                if not (stat.S_ISDIR(st.st_mode) and st.st_uid == uid):
                    tomb = _tombstone(name)
                    os.rename(name, tomb, src_dir_fd=root_fd, dst_dir_fd=root_fd)
                    os.mkdir(name, 0o700, dir_fd=root_fd)
            fd = os.open(
                name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd
            )
            try:
                os.fchown(fd, uid, gid)
                os.fchmod(fd, 0o700)  # also marks it claimed now (its ctime): see remove()
            finally:
                os.close(fd)
        if tomb is not None:  # what was in the way, deleted outside the lock
            with suppress(OSError):  # left for the sidecar's clean-up at its next start
                _delete(root_fd, tomb)
    finally:
        os.close(root_fd)
    return path


# ------------------------------------------------------------------------------ the sidecar


def job_ids(root: str) -> list[int]:
    """The job ids that have a directory under ``root`` (none when it does not exist)."""
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(n) for n in names if _JOB_NAME.fullmatch(n))


def remove(root: str, job_id: int, *, unless_changed_after: float | None = None) -> bool:
    """Remove the directory of ``job_id`` under ``root``; True if it was removed.

    ``unless_changed_after``: keep it when its inode changed after that time (the Prolog of a
    later attempt claims the directory with a chmod, which sets its ctime): pass the time the
    job ended on this node. The check and a rename out of the way happen under the root's
    lock, so a Prolog never sees half of it; the deletion itself happens after, unlocked.
    Never follows a symlink. Raises OSError (JobDirError for an unsafe root)."""
    name = str(job_id)
    if not _JOB_NAME.fullmatch(name):
        raise ValueError(f"{job_id!r} is not a job id")
    root_fd = _open_root(root)
    if root_fd is None:
        return False
    try:
        with _locked(root_fd, LOCK_WAIT) as locked:
            if not locked:
                raise JobDirError(f"{root}: locked by another process for {LOCK_WAIT:g}s")
            try:
                st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            if unless_changed_after is not None and st.st_ctime > unless_changed_after:
                return False
            tomb = _tombstone(name)
            os.rename(name, tomb, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        _delete(root_fd, tomb)
        return True
    finally:
        os.close(root_fd)


def last_touched(path: str) -> float:
    """The latest change to the directory ``path`` or to anything directly in it (mtime or
    ctime, links not followed)."""
    st = os.stat(path, follow_symlinks=False)
    latest = max(st.st_mtime, st.st_ctime)
    if stat.S_ISDIR(st.st_mode):
        with os.scandir(path) as entries:
            for entry in entries:
                with suppress(OSError):
                    est = entry.stat(follow_symlinks=False)
                    latest = max(latest, est.st_mtime, est.st_ctime)
    return latest


def remove_stale(root: str, now: float, max_age: float = STALE_AFTER) -> list[str]:
    """Remove the job directories under ``root`` untouched for ``max_age`` seconds before
    ``now`` (:func:`last_touched`), and what an interrupted removal left; the names removed.
    Problems with one entry are skipped (the next start tries again); an unsafe root raises
    JobDirError."""
    removed: list[str] = []
    root_fd = _open_root(root)
    if root_fd is None:
        return removed
    try:
        for name in os.listdir(root_fd):
            if name.startswith(REMOVING_PREFIX):
                with suppress(OSError):
                    _delete(root_fd, name)
                    removed.append(name)
    finally:
        os.close(root_fd)
    cutoff = now - max_age
    for job_id in job_ids(root):
        try:
            if last_touched(os.path.join(root, str(job_id))) > cutoff:
                continue
            if remove(root, job_id, unless_changed_after=cutoff):
                removed.append(str(job_id))
        except OSError:
            continue
    return removed
