"""packaging/rpm/build: the RPMs' contents, dependencies and an install into a scratch root.

Builds once per module into a temporary folder (a few seconds), then reads the packages with
``rpm -qp`` and installs them with ``rpm --root`` (``--nodeps``: the scratch root has no
Python or Slurm in its rpm database; ``--noscripts``: it has no shell to run them with).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "packaging" / "rpm" / "build"
PREFIX = "/usr/lib/slurm-recovery"
HOOKDIR = "/usr/libexec/slurm-recovery"
# The build makes the SPANK package when the plugin source and Slurm's headers are there.
SPANK_BUILT = (ROOT / "spank" / "build").is_file() and Path("/usr/include/slurm/spank.h").is_file()

# scripts/bootstrap installs rpm: without it these tests fail (never skip) and say what to do.
assert shutil.which("rpmbuild"), (
    "rpmbuild is not installed: apt-get install rpm (scripts/bootstrap)"
)


def _run(*args: str | Path, **kwargs) -> str:
    proc = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=120, **kwargs
    )
    assert proc.returncode == 0, f"{args}: rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _version() -> tuple[str, str, str]:
    """pyproject's version and the RPM Version and Release the build derives from it."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        version = tomllib.load(f)["project"]["version"]
    m = re.fullmatch(r"(\d+(?:\.\d+)*)[.\-_]?(.*)", version)
    assert m, version
    return version, m.group(1), f"0.{m.group(2)}" if m.group(2) else "1"


@pytest.fixture(scope="module")
def rpms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("rpms")
    _run(BUILD, out, cwd=ROOT)
    found: dict[str, Path] = {}
    for path in out.glob("*.rpm"):
        if path.name.endswith(".src.rpm"):
            continue
        name = _run("rpm", "-qp", "--qf", "%{NAME}", path)
        found[name] = path
    return found


def _files(rpm: Path) -> list[str]:
    return _run("rpm", "-qlp", rpm).split()


def _requires(rpm: Path) -> set[str]:
    return {line.strip() for line in _run("rpm", "-qp", "--requires", rpm).splitlines()}


def test_packages_versions_and_arches(rpms: dict[str, Path]) -> None:
    expected = {"slurm-recovery", "slurm-recovery-controller", "slurm-recovery-sidecar"}
    if SPANK_BUILT:
        expected.add("slurm-recovery-spank")
    assert set(rpms) == expected
    _, version, release = _version()
    for name, rpm in rpms.items():
        got = _run("rpm", "-qp", "--qf", "%{VERSION} %{RELEASE} %{ARCH}", rpm).split()
        assert got[:2] == [version, release], name
        if name != "slurm-recovery-spank":
            assert got[2] == "noarch", name


def test_main_package_files(rpms: dict[str, Path]) -> None:
    files = _files(rpms["slurm-recovery"])
    pyversion = _version()[0]
    for stray in files:
        assert "__pycache__" not in stray and not stray.endswith((".pyc", ".pyo")), stray
        assert "egg-info" not in stray and "/tests" not in stray and "/build" not in stray, stray
        assert stray.startswith(
            (PREFIX, "/usr/bin/srecovery", "/usr/share/doc/slurm-recovery", "/etc/slurm-recovery")
        ), stray
    assert "/usr/bin/srecovery" in files
    # every node reads them (hooks, sidecar, health gate), not only the controller's
    assert _run("rpm", "-qp", "--configfiles", rpms["slurm-recovery"]).split() == [
        "/etc/slurm-recovery/config.toml",
        "/etc/slurm-recovery/policy.toml",
    ]
    dist_info = f"{PREFIX}/slurm_recovery-{pyversion}.dist-info"
    assert f"{dist_info}/METADATA" in files
    assert f"{dist_info}/RECORD" not in files  # names files that are not shipped
    # Exactly the source tree's modules and data files, nothing more or less.
    source = ROOT / "slurm_recovery"
    wanted = {
        f"{PREFIX}/slurm_recovery/{p.relative_to(source)}"
        for p in source.rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and (p.suffix == ".py" or p.match("*/data/*.toml") or p.match("*/data/emitters/*.toml"))
    }
    shipped = {f for f in files if f.startswith(f"{PREFIX}/slurm_recovery/") and "." in f}
    assert shipped == wanted


def test_main_package_requires(rpms: dict[str, Path]) -> None:
    requires = _requires(rpms["slurm-recovery"])
    for dep in (
        "python3 >= 3.11",
        "python3dist(aiohttp) >= 3.9",
        "python3dist(click) >= 8.1",
        "python3dist(clustershell) >= 1.9",
        "python3dist(msgspec) >= 0.18",
        "python3dist(prometheus-client) >= 0.17",
        "python3dist(psutil) >= 5.9",
        "python3dist(rich) >= 13",
    ):
        assert dep in requires, (dep, requires)


def test_controller_and_sidecar(rpms: dict[str, Path]) -> None:
    _, version, release = _version()
    controller = rpms["slurm-recovery-controller"]
    files = _files(controller)
    for path in (
        "/usr/bin/srecovery-controller",
        "/usr/lib/systemd/system/srecovery-controller.service",
        "/usr/lib/systemd/system/srecovery-watchdog.service",
        "/var/lib/slurm-recovery",
        "/usr/share/slurm-recovery/prometheus/srecovery-rules.yml",
        "/usr/share/slurm-recovery/grafana/srecovery-dashboard.json",
        "/usr/share/slurm-recovery/job_submit.lua",
    ):
        assert path in files, path
    qf = "[%{FILEMODES:perms} %{FILEUSERNAME}:%{FILEGROUPNAME} %{FILENAMES}\n]"
    modes = _run("rpm", "-qp", "--qf", qf, controller).splitlines()
    assert "drwxr-x--- slurm:slurm /var/lib/slurm-recovery" in modes  # the units' User=
    main = _run("rpm", "-qp", "--qf", qf, rpms["slurm-recovery"]).splitlines()
    assert "-rw-r--r-- root:root /etc/slurm-recovery/config.toml" in main
    assert f"slurm-recovery = {version}-{release}" in _requires(controller)
    # a weak dependency: the controller runs on asyncio's loop without it
    recommends = _run("rpm", "-qp", "--recommends", controller).splitlines()
    assert "python3dist(uvloop) >= 0.19" in {line.strip() for line in recommends}
    assert not any("uvloop" in dep for dep in _requires(controller))
    for sub in ("controller", "sidecar"):
        if (ROOT / f"packaging/systemd/tmpfiles.d/slurm-recovery-{sub}.conf").is_file():
            conf = f"/usr/lib/tmpfiles.d/slurm-recovery-{sub}.conf"
            assert conf in _files(rpms[f"slurm-recovery-{sub}"])

    sidecar = rpms["slurm-recovery-sidecar"]
    files = _files(sidecar)
    for path in (
        "/usr/bin/srecovery-sidecar",
        "/usr/lib/systemd/system/srecovery-sidecar.service",
        *(
            f"{HOOKDIR}/srecovery-{hook}"
            for hook in ("prolog", "epilog", "epilog-slurmctld", "task-prolog")
        ),
    ):
        assert path in files, path
    assert f"slurm-recovery = {version}-{release}" in _requires(sidecar)
    # Nothing of Slurm's own configuration in any of the Python packages.
    for rpm in (rpms["slurm-recovery"], controller, sidecar):
        assert not [f for f in _files(rpm) if f.startswith("/etc/slurm/")]


def test_spank_package(rpms: dict[str, Path]) -> None:
    # scripts/bootstrap installs gcc and libslurm-dev: the SPANK package is always built here
    assert SPANK_BUILT, "no SPANK package: apt-get install gcc libslurm-dev (scripts/bootstrap)"
    spank = rpms["slurm-recovery-spank"]
    libdir = _run("rpm", "--eval", "%{_libdir}").strip()
    files = _files(spank)
    assert f"{libdir}/slurm/slurm_recovery.so" in files
    assert "/etc/slurm/plugstack.conf.d/slurm-recovery.conf" in files
    header = Path("/usr/include/slurm/slurm_version.h").read_text()
    number = int(re.search(r"#define SLURM_VERSION_NUMBER\s+(0x[0-9a-fA-F]+)", header)[1], 16)
    major, minor = (number >> 16) & 0xFF, (number >> 8) & 0xFF
    requires = _requires(spank)
    assert f"slurm >= {major}.{minor:02d}" in requires, requires
    assert f"slurm < {major}.{minor + 1:02d}" in requires, requires


def test_install_into_scratch_root(rpms: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    rpm_root = ("rpm", "--root", root)
    _run(*rpm_root, "--initdb")
    _run(*rpm_root, "-ivh", "--nodeps", "--noscripts", *rpms.values())

    prefix = root / PREFIX.lstrip("/")
    assert (root / "usr/bin/srecovery").is_file()
    assert os.access(root / "usr/bin/srecovery", os.X_OK)
    assert (root / "etc/slurm-recovery/config.toml").is_file()
    assert (root / "etc/slurm-recovery/policy.toml").is_file()
    assert (root / "var/lib/slurm-recovery").stat().st_mode & 0o777 == 0o750
    assert not list(prefix.rglob("__pycache__"))
    for name in ("controller", "watchdog", "sidecar"):  # the units of packaging/systemd/
        unit = f"srecovery-{name}.service"
        source = ROOT / "packaging/systemd" / unit
        assert (root / "usr/lib/systemd/system" / unit).read_text() == source.read_text()
    if SPANK_BUILT:
        conf = root / "etc/slurm/plugstack.conf.d/slurm-recovery.conf"
        libdir = _run("rpm", "--eval", "%{_libdir}").strip()
        lines = [x for x in conf.read_text().splitlines() if x and not x.startswith("#")]
        assert lines == [f"optional {libdir}/slurm/slurm_recovery.so"]
        assert (root / libdir.lstrip("/") / "slurm/slurm_recovery.so").is_file()

    # The package imports from the private prefix (this interpreter has the dependencies).
    env = {**os.environ, "PYTHONPATH": str(prefix)}
    out = _run(sys.executable, "-s", "-m", "slurm_recovery.cli", "--version", env=env, cwd=tmp_path)
    assert _version()[0] in out
    where = _run(sys.executable, "-c", "import slurm_recovery; print(slurm_recovery.__file__)",
                 env=env, cwd=tmp_path)  # fmt: skip
    assert where.strip() == str(prefix / "slurm_recovery" / "__init__.py")

    # /usr/bin/srecovery itself, its prefix pointed into the scratch root.
    wrapper = (root / "usr/bin/srecovery").read_text()
    assert wrapper.startswith("#!/usr/bin/python3 ")
    assert f'"{PREFIX}"' in wrapper
    relocated = tmp_path / "srecovery"
    relocated.write_text(wrapper.replace(f'"{PREFIX}"', repr(str(prefix))))
    out = _run(sys.executable, "-s", relocated, "--version", cwd=tmp_path)
    assert _version()[0] in out

    # The installed prolog, run as slurmd runs it (system Python, isolated, bare environment),
    # imports the private prefix and spools its event.
    prolog = (root / HOOKDIR.lstrip("/") / "srecovery-prolog").read_text()
    assert prolog.startswith("#!/usr/bin/python3 -I\n")
    system_python = Path("/usr/bin/python3")
    if system_python.exists():
        check = "import sys; sys.exit(sys.version_info < (3, 11))"
        if subprocess.run([system_python, "-c", check]).returncode == 0:
            hook = tmp_path / "srecovery-prolog"
            hook.write_text(prolog.replace(f'"{PREFIX}"', repr(str(prefix))))
            config = tmp_path / "config.toml"
            config.write_text(
                f'[sidecar]\nspool_dir = "{tmp_path}/spool/{{node}}"\n'
                f'[hooks]\njob_dir = "{tmp_path}/jobs/{{node}}"\n'
            )
            env = {
                "SRECOVERY_CONFIG": str(config),
                "SLURM_JOB_ID": "7",
                "SLURMD_NODENAME": "n1",
                "SLURM_NODELIST": "n1",
                "SLURM_JOB_UID": str(os.getuid()),
                "SLURM_JOB_GID": str(os.getgid()),
            }
            proc = subprocess.run(
                [system_python, "-I", hook], env=env, capture_output=True, text=True, timeout=30
            )
            assert proc.returncode == 0, proc.stderr
            assert "cannot import" not in proc.stderr, proc.stderr
            assert list((tmp_path / "spool/n1/events").glob("*-7.json")), proc.stderr


def test_config_noreplace_and_erase(rpms: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    rpm_root = ("rpm", "--root", root)
    _run(*rpm_root, "--initdb")
    packages = [rpms["slurm-recovery"], rpms["slurm-recovery-controller"]]
    _run(*rpm_root, "-ivh", "--nodeps", "--noscripts", *packages)
    config = root / "etc/slurm-recovery/config.toml"
    edited = config.read_text() + "\n# edited by the admin\n"
    config.write_text(edited)
    state = root / "var/lib/slurm-recovery/state.db"
    state.write_text("not rpm's")

    # Reinstalling (as an update does) keeps the admin's file.
    _run(*rpm_root, "-Uvh", "--replacepkgs", "--nodeps", "--noscripts", *packages)
    assert config.read_text() == edited
    assert state.read_text() == "not rpm's"

    # Erasing keeps the state and the edited config (rpm saves it as .rpmsave).
    _run(*rpm_root, "-e", "--nodeps", "--noscripts", "slurm-recovery-controller", "slurm-recovery")
    assert state.read_text() == "not rpm's"
    saved = root / "etc/slurm-recovery/config.toml.rpmsave"
    assert saved.read_text() == edited
    assert not (root / PREFIX.lstrip("/")).exists()
