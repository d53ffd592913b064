"""The node's NVIDIA driver versions read from files: the loaded kernel module's and the NVML
library's that a new process would load.

A sidecar that was already running when the driver package was upgraded keeps the
libnvidia-ml it loaded at start, which matches the still-loaded old module: its NVML calls keep
working and its ``nvmlInit`` never answers LIB_RM_VERSION_MISMATCH, while every new GPU process
on the node fails. This module sees that without NVML, from two small files:

- the loaded module's version, the first line of ``/proc/driver/nvidia/version``
  (``NVRM version: %s`` of the module's build id: ``NVIDIA UNIX x86_64 Kernel Module
  550.54.15  Tue Mar  5 ...`` for the proprietary module, ``NVIDIA UNIX Open Kernel Module for
  x86_64  555.42.02  Release Build  (...)  ...`` for the open one, ``aarch64`` on Arm);
- the library's version, the name of the file ``libnvidia-ml.so.1`` resolves to
  (``libnvidia-ml.so.550.54.15``), looked up first in the directory of the libnvidia-ml this
  process has mapped (``/proc/self/maps``: where the dynamic linker found it), then in a short
  list of the distributions' library directories. No process is spawned (no ``ldconfig -p``).

:func:`compare` is pure (texts and paths in, :class:`DriverVersions` out);
:class:`DriverFiles` reads the files at the edge and never raises. Either version unknown (no
driver, a container without ``/proc/driver/nvidia``, no library found, a line or a file name
that does not parse) is :attr:`DriverVersions.differ` None: the caller says nothing (fail open).
Versions compare as strings.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

__all__ = [
    "LIBRARY",
    "LIBRARY_DIRS",
    "PROC_VERSION",
    "DriverFiles",
    "DriverVersions",
    "compare",
    "library_version",
    "loaded_library_dir",
    "module_version",
]

#: The loaded kernel module's version file.
PROC_VERSION = "/proc/driver/nvidia/version"
#: The soname pynvml (and every CUDA process's NVML) loads.
LIBRARY = "libnvidia-ml.so.1"
#: Where the distributions put it (Debian/Ubuntu multiarch, RHEL/SUSE lib64, the .run
#: installer's defaults), after the directory this process loaded it from.
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib64",
)
#: This process's memory map: the path of the libnvidia-ml it loaded.
SELF_MAPS = "/proc/self/maps"

_READ_LIMIT = 4096  # the version file is two short lines
_MAPS_LIMIT = 4 * 1024 * 1024
_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)+")
_LIBRARY_FILE = re.compile(r"libnvidia-ml\.so\.([0-9]+(?:\.[0-9]+)+)")
_MAPPED = re.compile(r"(/\S.*/)libnvidia-ml\.so[.\w]*(?: \(deleted\))?$")


def module_version(text: str) -> str | None:
    """The version in the first line of ``/proc/driver/nvidia/version`` (``NVRM version:
    ... Kernel Module  550.54.15  ...``): its first whitespace-separated word that is a dotted
    number; None when the line is not an NVRM line or has none (Tegra's ``TempVersion``)."""
    line = text.split("\n", 1)[0].strip()
    head, sep, rest = line.partition(":")
    if not sep or head.strip() != "NVRM version":
        return None
    for word in rest.split():
        if _VERSION.fullmatch(word):
            return word
    return None


def library_version(path: str) -> str | None:
    """The version in the resolved library's file name (``.../libnvidia-ml.so.550.54.15``);
    None for any other name (``libnvidia-ml.so.1`` that is not a link names no version)."""
    match = _LIBRARY_FILE.fullmatch(os.path.basename(path))
    return match.group(1) if match else None


def loaded_library_dir(maps: str) -> str | None:
    """The directory of the libnvidia-ml mapped in ``maps`` (``/proc/self/maps``'s text; the
    file may show `` (deleted)`` once an upgrade replaced it); None when none is mapped."""
    for line in maps.splitlines():
        if "libnvidia-ml.so" not in line:
            continue
        fields = line.split(None, 5)
        if len(fields) == 6:
            match = _MAPPED.fullmatch(fields[5].strip())
            if match:
                return match.group(1).rstrip("/") or "/"
    return None


@dataclass(frozen=True)
class DriverVersions:
    """The two versions and where they were read; None where unknown."""

    module: str | None
    module_path: str
    library: str | None
    library_path: str | None

    @property
    def differ(self) -> bool | None:
        """True when both are known and differ, False when they agree, None when either is
        unknown (nothing can be said)."""
        if self.module is None or self.library is None:
            return None
        return self.module != self.library

    def cause(self) -> str:
        """What was compared, for the finding's detail."""
        return (
            f"the loaded NVIDIA kernel module is {self.module or '?'} ({self.module_path}) but "
            f"a new process would load libnvidia-ml {self.library or '?'} "
            f"({self.library_path or LIBRARY + ' not found'})"
        )

    def unknown(self) -> str:
        """Why :attr:`differ` is None (for a debug log)."""
        missing = []
        if self.module is None:
            missing.append(f"no module version in {self.module_path}")
        if self.library is None:
            missing.append(
                f"no library version in {self.library_path}"
                if self.library_path
                else f"{LIBRARY} not found"
            )
        return "; ".join(missing)


def compare(module_text: str | None, module_path: str, library_path: str | None) -> DriverVersions:
    """The versions from the version file's text (None: unreadable) and the path the library
    resolves to (None: not found)."""
    return DriverVersions(
        module=module_version(module_text) if module_text is not None else None,
        module_path=module_path,
        library=library_version(library_path) if library_path else None,
        library_path=library_path,
    )


@dataclass
class DriverFiles:
    """Reads the versions (:meth:`read`, never raises): ``proc_version``, the library's
    directories (``library_dirs``, after the one ``maps`` shows this process loaded it from;
    ``maps`` None: not looked at)."""

    proc_version: str = PROC_VERSION
    library_dirs: tuple[str, ...] = LIBRARY_DIRS
    maps: str | None = SELF_MAPS
    _loaded_dir: str | None = field(default=None, repr=False)

    def read(self) -> DriverVersions:
        return compare(_read(self.proc_version, _READ_LIMIT), self.proc_version, self.library())

    def library(self) -> str | None:
        """The real path ``libnvidia-ml.so.1`` resolves to now, in the first directory that
        has it; None when none has."""
        for directory in self._directories():
            path = os.path.join(directory, LIBRARY)
            try:
                if os.path.exists(path):
                    return os.path.realpath(path)
            except (OSError, ValueError):
                continue
        return None

    def _directories(self) -> list[str]:
        if self._loaded_dir is None and self.maps is not None:
            # found once: the directory does not change while the library stays mapped
            self._loaded_dir = loaded_library_dir(_read(self.maps, _MAPS_LIMIT) or "")
        first = [self._loaded_dir] if self._loaded_dir else []
        return first + [d for d in self.library_dirs if d != self._loaded_dir]


def _read(path: str, limit: int) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(limit).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
