"""Expand Slurm's output file patterns (``%j``, ``%x``, ``%N``...) to the batch step's path.

Slurm reports ``--output`` as the user typed it; the sidecar needs the file it became.
Follows the sbatch(1) "filename pattern" rules for the batch step (node 0, task 0).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

_PATTERN = re.compile(r"%(\d*)([%AaJjNnstuxb])")
_NO_ARRAY = {None, "", 4294967294, 4294967295}  # NO_VAL / unset array index


def expand_output_path(
    pattern: str,
    *,
    job_id: int,
    name: str = "",
    user: str = "",
    workdir: str = "",
    batch_host: str = "",
    array_job_id: int = 0,
    array_task_id: int | None = None,
) -> str | None:
    """The batch step's stdout path; ``None`` when it cannot be known (no workdir)."""
    in_array = array_task_id not in _NO_ARRAY and array_job_id
    if not pattern:
        pattern = "slurm-%A_%a.out" if in_array else "slurm-%j.out"
    if "\\" in pattern:  # sbatch: a backslash anywhere turns expansion off
        expanded = pattern.replace("\\", "")
    else:
        task = int(array_task_id) if in_array else 0  # type: ignore[arg-type]
        values = {
            "A": str(array_job_id if in_array else job_id),
            "a": str(task) if in_array else "4294967294",
            "b": str(task % 10) if in_array else "4294967294",
            "J": str(job_id),
            "j": str(job_id),
            "N": batch_host,
            "n": "0",
            "s": "batch",
            "t": "0",
            "u": user,
            "x": name,
        }

        def replace(match: re.Match[str]) -> str:
            width, code = match.groups()
            if code == "%":
                return "%"
            value = values[code]
            if width and value.isdigit():
                value = value.zfill(min(int(width), 10))
            return value

        expanded = _PATTERN.sub(replace, pattern)
    path = PurePosixPath(expanded)
    if not path.is_absolute():
        if not workdir:
            return None
        path = PurePosixPath(workdir) / path
    return str(path)
