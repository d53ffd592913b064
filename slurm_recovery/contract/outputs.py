"""Slurm's output-file patterns (``--output=%x-%j.out``) expanded to the batch step's file.

Slurm reports ``--output`` as the user typed it (squeue/scontrol ``StdOut``, the hooks'
``SLURM_JOB_STDOUT``); the sidecar and the prolog need the file it became. One expansion for
both, following sbatch(1)'s "filename pattern" rules for the batch step (node 0, task 0).
"""

from __future__ import annotations

import re

_SPEC = re.compile(r"%(\d*)([%AaJjNnstuxb])")
#: Slurm's NO_VAL / unset array task index (a job that is not an array task).
NO_ARRAY = (4294967294, 4294967295)


def expand_output_path(
    pattern: str | None,
    *,
    job_id: int,
    name: str | None = "",
    user: str | None = "",
    workdir: str | None = "",
    batch_host: str | None = "",
    array_job_id: int | None = 0,
    array_task_id: int | None = None,
) -> str | None:
    """The batch step's output file; ``None`` when it cannot be known (a relative pattern and
    no absolute ``workdir``).

    An empty pattern is Slurm's default (``slurm-%j.out``, ``slurm-%A_%a.out`` for an array
    task). ``%j %J %u %x %A %a %b %N %n %t %s %%`` and zero-padded forms (``%5j``) are
    replaced; a backslash anywhere turns expansion off. A value given as ``None`` (not known
    where the caller runs, e.g. the job name in an old Slurm's prolog) leaves its specifier
    as written.
    """
    in_array = bool(array_job_id) and array_task_id is not None and array_task_id not in NO_ARRAY
    if not pattern:
        pattern = "slurm-%A_%a.out" if in_array else "slurm-%j.out"
    if "\\" in pattern:
        expanded = pattern.replace("\\", "")
    else:
        task = array_task_id if in_array else None
        values: dict[str, str | None] = {
            "A": str(array_job_id if in_array else job_id),
            "a": str(task) if task is not None else str(NO_ARRAY[0]),
            "b": str(task % 10) if task is not None else str(NO_ARRAY[0]),
            "J": str(job_id),
            "j": str(job_id),
            "N": batch_host,
            "n": "0",
            "s": "batch",
            "t": "0",
            "u": user,
            "x": name,
        }

        def fill(found: re.Match[str]) -> str:
            width, spec = found.groups()
            if spec == "%":
                return "%"
            value = values[spec]
            if value is None:
                return found.group(0)
            if width and value.isdigit():
                return value.zfill(min(int(width), 10))
            return value

        expanded = _SPEC.sub(fill, pattern)
    if not expanded.startswith("/"):
        if not workdir or not workdir.startswith("/"):
            return None
        expanded = f"{workdir}/{expanded}"
    return normal_path(expanded)


def normal_path(path: str) -> str:
    """``path`` as :class:`pathlib.PurePosixPath` writes it (repeated and trailing slashes and
    ``.`` parts dropped, ``..`` kept, POSIX's two leading slashes kept), without importing
    pathlib: the prolog runs this on every job start."""
    if path.startswith("//") and not path.startswith("///"):
        lead = "//"
    elif path.startswith("/"):
        lead = "/"
    else:
        lead = ""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    return lead + "/".join(parts) or "."
