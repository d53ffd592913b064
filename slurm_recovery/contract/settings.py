"""The settings Slurm's hooks read from config.toml: their defaults, their checks, one reader.

The hooks (:mod:`slurm_recovery.hooks`) run in every job's prolog and epilog, so they read these
few keys straight from the file instead of importing the daemons' schema
(:mod:`slurm_recovery.config`). There is one copy of each rule: the daemons' schema takes the
defaults (:data:`HOOK_DEFAULTS`) and the checks (:data:`HOOK_CHECKS`) of these keys from here.
Every check returns the value the program uses, or raises ``ValueError("problem; fix")``.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping

from slurm_recovery.contract.durations import DURATION_HINT, parse_duration
from slurm_recovery.contract.jobdir import NODE_PLACEHOLDER

#: typing costs a hook ~3 ms to import; the annotations need only its names
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Check = Callable[[Any], Any]

#: Where the RPM installs the file; read when neither a path nor the variable names another.
DEFAULT_CONFIG_PATH = "/etc/slurm-recovery/config.toml"
#: Environment variable naming the config file; an explicit path (``--config``) wins over it.
CONFIG_ENV_VAR = "SRECOVERY_CONFIG"
#: Environment variable overriding ``client.url`` (where srecovery reaches the controller).
URL_ENV_VAR = "SRECOVERY_URL"


class SettingsError(ValueError):
    """The config file cannot be used; the message names the file and, where known, the key."""


# --------------------------------------------------------------------------------- checks


def duration_above_zero(value: Any) -> float:
    """A duration of more than 0 seconds."""
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"must be more than 0 seconds; {DURATION_HINT}")
    return seconds


def boolean(value: Any) -> bool:
    """``true`` or ``false``; a quoted ``"true"`` is refused by name (TOML reads it as text)."""
    if not isinstance(value, bool):
        hint = ""
        if isinstance(value, str) and value.strip().lower() in {
            "true",
            "false",
            "yes",
            "no",
            "on",
            "off",
        }:
            hint = " (a quoted string is not a boolean)"
        raise ValueError(f"must be true or false, lower case and without quotes{hint}")
    return value


def path_string(value: Any, *, empty_ok: bool = False) -> str:
    """An absolute path (``""`` too when ``empty_ok``: the key's default applies)."""
    if not isinstance(value, str):
        raise ValueError('must be a string holding an absolute path, e.g. "/usr/bin"')
    if value == "" and empty_ok:
        return value
    if "\0" in value:
        raise ValueError("a path cannot contain a NUL character")
    if not value.startswith("/"):
        raise ValueError(
            "must be an absolute path (starting with /): a relative one would depend on the "
            "directory the service starts in" + ('; or "" for the default' if empty_ok else "")
        )
    return value


def optional_path(value: Any) -> str:
    """An absolute path, or ``""``."""
    return path_string(value, empty_ok=True)


def node_path(value: Any) -> str:
    """An absolute path that may hold ``{node}`` and no other placeholder."""
    path = path_string(value)
    rest = path.replace(NODE_PLACEHOLDER, "")
    if "{" in rest or "}" in rest:
        raise ValueError(
            f"the only placeholder a path may hold is {NODE_PLACEHOLDER} (the node name), "
            'e.g. "/var/spool/slurm-recovery/{node}"'
        )
    return path


def job_dir(value: Any) -> str:
    """A node path without control characters: the TaskProlog prints it in ``export`` lines."""
    path = node_path(value)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise ValueError("must not contain control characters such as a newline")
    return path


#: A Slurm NodeName: letters, digits, '.', '_' and '-', starting with a letter or digit.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def node_name(value: Any) -> str:
    """A Slurm node name, or ``""`` for this host's short hostname."""
    fix = 'a Slurm node name such as "gpu017", or "" for this host\'s short hostname'
    if not isinstance(value, str):
        raise ValueError(f"must be a string: {fix}")
    if value and not NODE_NAME.fullmatch(value):
        raise ValueError(
            f"must be {fix} (letters, digits, '.', '_' and '-', starting with a letter or digit)"
        )
    return value


def url(value: Any) -> str:
    """An ``http://`` or ``https://`` URL with a host, without query or fragment; no trailing /."""
    import urllib.parse  # only a config that sets client.url pays for it

    hint = 'e.g. "http://head1:7765" or "https://head1.example.org:7765"'
    if not isinstance(value, str):
        raise ValueError(f"must be a string holding a URL, {hint}")
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"must start with http:// or https://, {hint}")
    if re.search(r"[\s\x00-\x1f\x7f]", value):
        raise ValueError(f"a URL cannot contain spaces or control characters, {hint}")
    try:
        parts = urllib.parse.urlsplit(value)
        port = parts.port  # raises ValueError for a port out of range or not a number
    except ValueError as exc:
        raise ValueError(f"not a valid URL ({exc}), {hint}") from None
    if not parts.hostname:
        raise ValueError(f"no host after {parts.scheme}://, {hint}")
    if port == 0:
        raise ValueError(f"port must be from 1 to 65535, {hint}")
    if parts.query or parts.fragment or "?" in value or "#" in value:
        raise ValueError(f"must not contain '?' or '#', {hint}")
    return value.rstrip("/")


# --------------------------------------------------------------------------------- the keys

#: The keys the hooks read and their defaults: the values the programs use, so each passes its
#: own check unchanged (a unit test holds it) and a hook need not check them on every run.
HOOK_DEFAULTS: Mapping[str, object] = {
    "sidecar.node": "",
    "sidecar.spool_dir": "/var/spool/slurm-recovery",
    "sidecar.poll_interval": 10.0,
    "hooks.health_gate": False,
    "hooks.epilog_gate": False,
    "hooks.epilog_gate_wait": 1.0,
    "hooks.controller_timeout": 0.5,
    "hooks.job_dir": "/run/slurm-recovery/jobs/{node}",
    "hooks.nhc": "",
    "hooks.nhc_timeout": 30.0,
    "controller.spool_dir": "/var/spool/slurm-recovery/controller",
    "controller.policy": "/etc/slurm-recovery/policy.toml",
    "client.url": "http://localhost:7765",
    "client.ca_file": "",
    "auth.munge_socket": "",
}
#: The check of each key the hooks read.
HOOK_CHECKS: Mapping[str, Check] = {
    "sidecar.node": node_name,
    "sidecar.spool_dir": node_path,
    "sidecar.poll_interval": duration_above_zero,
    "hooks.health_gate": boolean,
    "hooks.epilog_gate": boolean,
    "hooks.epilog_gate_wait": parse_duration,  # 0 s or more
    "hooks.controller_timeout": duration_above_zero,
    "hooks.job_dir": job_dir,
    "hooks.nhc": optional_path,
    "hooks.nhc_timeout": duration_above_zero,
    "controller.spool_dir": path_string,
    "controller.policy": path_string,
    "client.url": url,
    "client.ca_file": optional_path,
    "auth.munge_socket": optional_path,
}


def refuse_if_others_can_write(
    path: str,
    st: os.stat_result,
    *,
    stakes: str = "change what slurm-recovery does to jobs and nodes",
    what: str = "file",
) -> None:
    """Refuse a file any user can change (``st``: its open descriptor's), or replace (in a
    world-writable directory without the sticky bit): whoever can edit our config or policy
    decides where root writes, which jobs restart and which nodes drain. ``stakes`` says what
    such a user could do, ``what`` names the file, in the message."""
    if st.st_mode & stat.S_IWOTH:
        raise SettingsError(
            f"{path}: world-writable (mode {stat.S_IMODE(st.st_mode):04o}): any user could "
            f"{stakes}; fix: chmod o-w {path}"
        )
    folder = os.path.dirname(os.path.realpath(path))
    try:
        dst = os.stat(folder)
    except OSError:
        return
    if dst.st_mode & stat.S_IWOTH and not dst.st_mode & stat.S_ISVTX:
        raise SettingsError(
            f"{path}: its directory {folder} is world-writable (mode "
            f"{stat.S_IMODE(dst.st_mode):04o}): any user could replace the {what}; "
            f"fix: chmod o-w {folder}"
        )


#: What a user who can edit the policy could do (the policy's own words in its refusals).
POLICY_STAKES = "change which jobs are restarted and which nodes drained"


def _load_toml(path: str, **refusal: str) -> dict[str, Any]:
    """The TOML file ``path``, refused when others can write it (``refusal``: the words of
    :func:`refuse_if_others_can_write`). FileNotFoundError as is (absent may be fine);
    SettingsError naming the file for anything else."""
    try:
        with open(path, "rb") as fh:
            refuse_if_others_can_write(path, os.fstat(fh.fileno()), **refusal)
            raw = fh.read()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    import tomllib  # ~8 ms: only when there is a file

    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{path}: not a valid TOML file: {exc}") from None


#: The modes a policy may put a partition in.
MODES = ("monitor", "act")


def mode_for(partition: str, default: str, partition_modes: Mapping[str, str]) -> str:
    """The mode of a job in ``partition`` (``"a,b"`` when pending in several): ``"act"`` only
    when every one of its partitions is in act mode, else ``"monitor"``. The one copy of the
    rule: :meth:`slurm_recovery.decide.policy.Policy.mode_for` and the prolog's health gate."""
    names = [p.strip() for p in partition.split(",") if p.strip()] or [""]
    modes = {str(partition_modes.get(name, default)) for name in names}
    return "act" if modes == {"act"} else "monitor"


def policy_mode(path: str, partition: str) -> str:
    """The mode ``path`` (the policy file) gives a job in ``partition``, reading only its
    ``mode`` and ``[partitions.NAME] mode`` keys: the health gate's question, answered without
    the daemons' policy schema. Raises :class:`SettingsError` for a file that cannot be read,
    is writable by others, is not TOML, or holds a mode that is neither monitor nor act (the
    gate then fails open)."""
    try:
        data = _load_toml(path, stakes=POLICY_STAKES, what="policy")
    except FileNotFoundError as exc:
        raise SettingsError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    default = data.get("mode", "monitor")
    tables = data.get("partitions", {})
    if not isinstance(tables, dict):
        raise SettingsError(f"{path}: partitions must be a table of [partitions.NAME] tables")
    modes = {
        name: table.get("mode", default)
        for name, table in tables.items()
        if isinstance(table, dict)
    }
    for key, mode in (("mode", default), *((f"partitions.{n}.mode", m) for n, m in modes.items())):
        if mode not in MODES:
            raise SettingsError(f"{path}: {key} = {mode!r}: must be one of {', '.join(MODES)}")
    return mode_for(partition, default, modes)


def read_hook_settings(env: Mapping[str, str]) -> tuple[dict[str, Any], str | None]:
    """The checked values of the hook keys the file sets, and the file read (None: absent).

    The file is ``$SRECOVERY_CONFIG``, else /etc/slurm-recovery/config.toml (absent: no values,
    all defaults); ``$SRECOVERY_URL`` overrides ``client.url``. Raises :class:`SettingsError`
    naming the file and the key for a named file that is missing, an unreadable file, a file
    that is not TOML, or a bad value in a key the hooks read; other keys are the daemons'.
    """
    named = env.get(CONFIG_ENV_VAR)
    path = named or DEFAULT_CONFIG_PATH
    try:
        data, source = _load_toml(path), path
    except FileNotFoundError:
        if named:
            raise SettingsError(f"{path}: no such file (named by ${CONFIG_ENV_VAR})") from None
        data, source = {}, None  # the default file is absent: all defaults
    values: dict[str, Any] = {}
    for dotted, check in HOOK_CHECKS.items():
        section, key = dotted.split(".")
        table = data.get(section, {})
        if not isinstance(table, dict) or key not in table:
            continue
        try:
            values[dotted] = check(table[key])
        except ValueError as exc:
            raise SettingsError(f"{path}: {dotted} = {table[key]!r}: {exc}") from None
    override = env.get(URL_ENV_VAR)
    if override:
        try:
            values["client.url"] = url(override)
        except ValueError as exc:
            raise SettingsError(f"${URL_ENV_VAR} = {override!r}: {exc}") from None
    return values, source
