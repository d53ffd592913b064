"""The driver's versions from files (sidecar/gpu/driver.py): the loaded kernel module's line,
the library a new process would load, and their comparison, with temp files.

The /proc lines are the formats the NVIDIA module prints (``NVRM version: %s`` of its build
id; the proprietary and the open modules, x86_64 and aarch64, a Tegra build with no number).
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from slurm_recovery.sidecar.gpu.driver import (
    DriverFiles,
    compare,
    library_version,
    loaded_library_dir,
    module_version,
)

PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
)
OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  555.42.02  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Jun 25 01:26:03 UTC 2024\n"
    "GCC version:  gcc version 14.2.1 20240801 (Red Hat 14.2.1-1) (GCC)\n"
)
OPEN_ARM = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  540.4.0  Release Build  "
    "(buildbrain@mobile-u64-6336-d8000)  Tue Jan  7 17:35:12 PST 2025\n"
)
PROPRIETARY_ARM = "NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.129.03  Thu Oct 19 ...\n"
OLD_TWO_PART = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  384.81  Wed Aug 17 22:24:07 PDT 2016\n"
)
TEGRA_NO_NUMBER = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  TempVersion  Release Build  "
    "(bugfix_main)  (buildbrain@x)  Tue Dec 30 15:54:35 PST 2025\nGCC version: 13\n"
)


# ------------------------------------------------------------------ the module's line


def test_the_module_versions_of_every_known_format():
    assert module_version(PROPRIETARY) == "550.54.15"
    assert module_version(OPEN) == "555.42.02"
    assert module_version(OPEN_ARM) == "540.4.0"
    assert module_version(PROPRIETARY_ARM) == "535.129.03"
    assert module_version(OLD_TWO_PART) == "384.81"


def test_lines_without_a_version_are_unknown():
    assert module_version(TEGRA_NO_NUMBER) is None
    assert module_version("") is None
    assert module_version("\n") is None
    assert module_version("GCC version:  gcc version 12.3.0\n") is None  # not the NVRM line
    assert module_version("garbage 550.54.15\n") is None
    assert module_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module\n") is None
    # only the first line counts: the GCC line's version is not the module's
    assert module_version("NVRM version: mangled\nGCC version:  gcc version 12.3.0\n") is None


versions = st.lists(st.integers(0, 99999), min_size=2, max_size=4).map(
    lambda parts: ".".join(map(str, parts))
)
arches = st.sampled_from(["x86_64", "aarch64", "ppc64le"])
dates = st.sampled_from(["Tue Mar  5 22:23:56 UTC 2024", "Thu Oct 19 10:00:00 PDT 2023", ""])


@given(version=versions, arch=arches, date=dates, open_module=st.booleans(), gcc=versions)
def test_any_version_in_either_module_format_is_read(version, arch, date, open_module, gcc):
    if open_module:
        line = (
            f"NVRM version: NVIDIA UNIX Open Kernel Module for {arch}  {version}  Release Build  "
            f"(builder@host-1.2)  {date}"
        )
    else:
        line = f"NVRM version: NVIDIA UNIX {arch} Kernel Module  {version}  {date}"
    text = f"{line}\nGCC version:  gcc version {gcc} (GCC)\n"
    assert module_version(text) == version


@given(st.text(max_size=200))
def test_any_text_is_read_or_unknown_never_an_error(text):
    found = module_version(text)
    assert found is None or (found in text and found.replace(".", "").isdigit())


# ------------------------------------------------------------------ the library


def test_the_library_version_is_in_the_resolved_file_name():
    assert library_version("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15") == "550.54.15"
    assert library_version("/usr/lib64/libnvidia-ml.so.555.42.02") == "555.42.02"
    assert library_version("/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.540.4.0") == "540.4.0"
    assert library_version("/usr/lib64/libnvidia-ml.so.1") is None  # not a link: no version
    assert library_version("/usr/lib64/libnvidia-ml.so") is None
    assert library_version("/usr/lib64/libnvidia-ml.so.550.54.15.bak") is None
    assert library_version("/usr/lib64/libcuda.so.550.54.15") is None


@given(version=versions)
def test_any_library_version_round_trips(version):
    assert library_version(f"/usr/lib64/libnvidia-ml.so.{version}") == version


def test_the_loaded_library_directory_from_the_memory_map():
    maps = (
        "7f1c2a000000-7f1c2a0a0000 r--p 00000000 08:01 131 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f1c2b000000-7f1c2b100000 r-xp 00000000 08:01 4242 "
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15\n"
    )
    assert loaded_library_dir(maps) == "/usr/lib/x86_64-linux-gnu"
    deleted = (
        "7f1c2b000000-7f1c2b100000 r-xp 00000000 08:01 4242         "
        "/usr/lib64/libnvidia-ml.so.550.54.15 (deleted)\n"
    )
    assert loaded_library_dir(deleted) == "/usr/lib64"
    assert loaded_library_dir("7f1c2a000000-7f1c2a0a0000 rw-p 00000000 00:00 0 [heap]\n") is None
    assert loaded_library_dir("") is None


# ------------------------------------------------------------------ the comparison


def test_compare_equal_differ_and_unknown():
    lib = "/usr/lib64/libnvidia-ml.so.550.54.15"
    same = compare(PROPRIETARY, "/proc/driver/nvidia/version", lib)
    assert (same.module, same.library, same.differ) == ("550.54.15", "550.54.15", False)
    other = compare(OPEN, "/proc/driver/nvidia/version", lib)
    assert other.differ is True
    cause = other.cause()
    for part in ("555.42.02", "550.54.15", lib, "/proc/driver/nvidia/version"):
        assert part in cause
    assert compare(None, "/p", lib).differ is None  # no module file
    assert compare(PROPRIETARY, "/p", None).differ is None  # no library
    assert compare(TEGRA_NO_NUMBER, "/p", lib).differ is None  # no number in the line
    assert compare(PROPRIETARY, "/p", "/usr/lib64/libnvidia-ml.so.1").differ is None
    assert "not found" in compare(PROPRIETARY, "/p", None).unknown()


@given(module=versions, library=versions)
def test_they_differ_exactly_when_the_strings_differ(module, library):
    text = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {module}  Tue Mar  5 2024\n"
    found = compare(text, "/p", f"/usr/lib64/libnvidia-ml.so.{library}")
    assert found.differ is (module != library)


# ------------------------------------------------------------------ reading the files


def host(tmp_path: Path, module_text: str | None, library: str | None) -> DriverFiles:
    """A fake host: a version file (None: absent) and a lib directory whose libnvidia-ml.so.1
    links to ``libnvidia-ml.so.<library>`` (None: no library)."""
    proc = tmp_path / "version"
    if module_text is not None:
        proc.write_text(module_text)
    libdir = tmp_path / "lib"
    libdir.mkdir(exist_ok=True)
    if library is not None:
        relink(libdir, library)
    return DriverFiles(proc_version=str(proc), library_dirs=(str(libdir),), maps=None)


def relink(libdir: Path, library: str) -> None:
    """What the driver package's upgrade does: a new file, libnvidia-ml.so.1 pointed at it."""
    (libdir / f"libnvidia-ml.so.{library}").write_bytes(b"\x7fELF")
    link = libdir / "libnvidia-ml.so.1"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(f"libnvidia-ml.so.{library}")


def test_reading_a_host_that_agrees_then_is_upgraded(tmp_path):
    files = host(tmp_path, PROPRIETARY, "550.54.15")
    found = files.read()
    assert found.differ is False
    assert found.library_path == str(tmp_path / "lib" / "libnvidia-ml.so.550.54.15")
    relink(tmp_path / "lib", "555.42.02")  # the package upgraded; the module still loaded
    assert files.read().differ is True


def test_reading_fails_open(tmp_path):
    for name in "abcd":
        (tmp_path / name).mkdir()
    assert host(tmp_path / "a", None, "550.54.15").read().differ is None  # no driver loaded
    assert host(tmp_path / "b", PROPRIETARY, None).read().differ is None  # no library
    assert host(tmp_path / "c", "\xff\xfe binary\n", "550.54.15").read().differ is None
    files = host(tmp_path / "d", PROPRIETARY, None)
    (tmp_path / "d" / "lib" / "libnvidia-ml.so.1").symlink_to("gone")  # dangling link
    assert files.read().differ is None
    # a directory where the file should be, and nothing at all
    weird = DriverFiles(proc_version=str(tmp_path), library_dirs=(str(tmp_path / "none"),))
    assert weird.read().differ is None
    nothing = DriverFiles(
        proc_version=str(tmp_path / "absent"), library_dirs=(), maps=str(tmp_path / "absent")
    )
    assert nothing.read().differ is None


def test_the_directory_this_process_loaded_it_from_comes_first(tmp_path):
    loaded, standard = tmp_path / "loaded", tmp_path / "standard"
    loaded.mkdir()
    standard.mkdir()
    relink(loaded, "555.42.02")
    relink(standard, "550.54.15")
    proc = tmp_path / "version"
    proc.write_text(PROPRIETARY)
    maps = tmp_path / "maps"
    maps.write_text(
        "7f1c2b000000-7f1c2b100000 r-xp 00000000 08:01 4242 "
        f"{loaded}/libnvidia-ml.so.550.54.15 (deleted)\n"
    )
    files = DriverFiles(proc_version=str(proc), library_dirs=(str(standard),), maps=str(maps))
    found = files.read()
    assert found.library == "555.42.02" and found.differ is True
    maps.write_text("")  # found once: not read again
    assert files.read().library == "555.42.02"
    # no mapping: the standard directories
    plain = DriverFiles(proc_version=str(proc), library_dirs=(str(standard),), maps=str(proc))
    assert plain.read().differ is False


def test_the_default_paths_are_the_hosts():
    files = DriverFiles()
    assert files.proc_version == "/proc/driver/nvidia/version"
    assert "/usr/lib/x86_64-linux-gnu" in files.library_dirs and "/usr/lib64" in files.library_dirs
    assert files.read().differ in (None, True, False)  # never raises, whatever the host
    assert os.path.basename(files.maps or "") == "maps"
