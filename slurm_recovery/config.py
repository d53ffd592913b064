"""The admin's configuration file (``/etc/slurm-recovery/config.toml``): found, read, checked.

The schema is one table, :data:`KEYS`; docs/configuration.md and etc/config.toml document every
row of it (a unit test holds them to that). Every problem becomes a :class:`ConfigError` naming the
file, the dotted key, what is wrong and how to fix it: a typo in admin config is never ignored.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
import socket
import stat
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

#: Where the RPM installs the file; read when neither a path nor the variable names another.
DEFAULT_CONFIG_PATH = Path("/etc/slurm-recovery/config.toml")
#: Environment variable naming the config file; an explicit path (``--config``) wins over it.
CONFIG_ENV_VAR = "SRECOVERY_CONFIG"
#: Environment variable overriding ``client.url`` (where srecovery reaches the controller).
URL_ENV_VAR = "SRECOVERY_URL"


class ConfigError(ValueError):
    """The configuration cannot be used. One line per problem, each naming file, key and fix."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems: tuple[str, ...] = problems


# --------------------------------------------------------------------------------- durations

#: Units a duration string may use, in seconds.
DURATION_UNITS: dict[str, Decimal] = {
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
    "d": Decimal(86400),
}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"  # ASCII digits only
_UNIT = "|".join(sorted(DURATION_UNITS, key=len, reverse=True))  # "ms" before "m"
_PLAIN_SECONDS = re.compile(rf"\s*({_NUMBER})\s*")
_DURATION = re.compile(rf"(?:\s*{_NUMBER}\s*(?:{_UNIT}))+\s*")
_DURATION_PART = re.compile(rf"({_NUMBER})\s*({_UNIT})")
_DURATION_HINT = (
    'write a number of seconds (90) or a string with a unit ("90s", "5m", "1h30m"; '
    "units: " + ", ".join(DURATION_UNITS) + ")"
)


def parse_duration(value: object) -> float:
    """Seconds in ``value``: a number of seconds, or a string like ``"90s"``, ``"5m"``, ``"1h30m"``.

    Raises :class:`ValueError` saying how to write a duration for anything else (negative,
    infinite, not a number, unknown unit).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"must be a duration, not {type(value).__name__}; {_DURATION_HINT}")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond float range
            seconds = math.inf if value > 0 else -math.inf
        if math.isnan(seconds):
            raise ValueError(f"must be a number of seconds, not nan; {_DURATION_HINT}")
    else:
        plain = _PLAIN_SECONDS.fullmatch(value)
        if plain:
            total = Decimal(plain.group(1))
        elif _DURATION.fullmatch(value):
            total = sum(
                (Decimal(n) * DURATION_UNITS[u] for n, u in _DURATION_PART.findall(value)),
                Decimal(0),
            )
        else:
            raise ValueError(f"not a duration; {_DURATION_HINT}")
        seconds = float(total)  # inf when beyond float range
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative; {_DURATION_HINT}")
    if math.isinf(seconds):
        raise ValueError(f"a duration must be finite; {_DURATION_HINT}")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest usual spelling of ``seconds`` (``5400`` -> ``"1h30m"``, ``1.5`` -> ``"1.5s"``).

    ``parse_duration(format_duration(x)) == x`` for every finite ``x >= 0``.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"not a number of seconds: {seconds!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"not a finite, non-negative number of seconds: {seconds!r}")
    if seconds == int(seconds) and seconds < 2**53:
        rest = int(seconds)
        parts = []
        for unit in ("d", "h", "m", "s"):
            count, rest = divmod(rest, int(DURATION_UNITS[unit]))
            if count:
                parts.append(f"{count}{unit}")
        return "".join(parts) or "0s"
    # repr() is the shortest decimal that reads back as the same float; "f" avoids exponents.
    return f"{Decimal(repr(float(seconds))):f}s"


# --------------------------------------------------------------------------------- validators

#: Checks one TOML value and returns it converted; raises ValueError("problem; fix") otherwise.
Validator = Callable[[Any], Any]


def did_you_mean(name: str, options: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``options``, or nothing: every file of
    ours (config, policy, catalogues) suggests the same way."""
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _choice(*options: str) -> Validator:
    listed = ", ".join(options)

    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"must be a string, one of {listed}")
        if value.lower() in options:
            return value.lower()
        raise ValueError(f"must be one of {listed}{did_you_mean(value.lower(), options)}")

    return check


def _duration_above_zero(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"must be more than 0 seconds; {_DURATION_HINT}")
    return seconds


def _retention(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds < 86400:
        raise ValueError(
            f'must be at least 1 day ("1d"): the controller decides on the last hour of '
            f"evidence, and explains incidents with older evidence; {_DURATION_HINT}"
        )
    return seconds


def _path_string(value: Any, *, empty_ok: bool) -> str:
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


def _optional_path(value: Any) -> str:
    return _path_string(value, empty_ok=True)


def _path(value: Any) -> Path:
    return Path(_path_string(value, empty_ok=False))


_CLUSTER_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


def _cluster_name(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError('must be a string: the cluster\'s ClusterName, or "" to ask Slurm')
    name = value.lower()  # Slurm itself maps ClusterName to lower case
    if name and not _CLUSTER_NAME.fullmatch(name):
        raise ValueError(
            "must be a Slurm ClusterName (letters, digits, '.', '_' and '-', starting with a "
            'letter or digit), or "" to take ClusterName from Slurm'
        )
    return name


# A DNS name (RFC 1123): dot-separated labels of letters, digits and inner hyphens.
_HOSTNAME = re.compile(
    r"(?=.{1,253}\.?\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?"
)
_LISTEN_HINT = 'write "HOST:PORT", e.g. "0.0.0.0:7765", "head1:7765" or "[::1]:7765"'


def split_host_port(text: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``; an IPv6 host is written in brackets, returned without.

    HOST is an IPv4 address, a bracketed IPv6 address (``"[::]:7765"`` for every IPv6 address) or
    a host name; PORT is 1 to 65535. Raises :class:`ValueError` saying how to write it otherwise.
    """
    if not isinstance(text, str):
        raise ValueError(f"must be a string; {_LISTEN_HINT}")
    if "://" in text:
        raise ValueError(f"a URL is not an address to listen on; {_LISTEN_HINT}")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"unclosed '[' around an IPv6 address; {_LISTEN_HINT}")
        host, rest = text[1:end], text[end + 1 :]
        if not rest.startswith(":"):
            raise ValueError(f"no port after the IPv6 address; {_LISTEN_HINT}")
        port_text = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address; {_LISTEN_HINT}") from None
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            raise ValueError(f"no port; {_LISTEN_HINT}")
        if ":" in host:
            raise ValueError(f"an IPv6 address must be in brackets; {_LISTEN_HINT}")
        if not host:
            raise ValueError(f'no host; use "0.0.0.0" for every address; {_LISTEN_HINT}')
        if re.fullmatch(r"[0-9.]+", host):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise ValueError(f"{host!r} is not an IPv4 address; {_LISTEN_HINT}") from None
        elif not _HOSTNAME.fullmatch(host):
            raise ValueError(
                f"{host!r} is not a host name or IP address (letters, digits, '-' and '.'); "
                + _LISTEN_HINT
            )
    if not re.fullmatch(r"[0-9]{1,5}", port_text) or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"port {port_text!r} must be a number from 1 to 65535; {_LISTEN_HINT}")
    return host, int(port_text)


def _listen(value: Any) -> str:
    split_host_port(value)
    return value


def _url(value: Any) -> str:
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


#: Limits of ``controller.max_request_bytes``.
MIN_REQUEST_BYTES = 1024
MAX_REQUEST_BYTES = 64 * 1024 * 1024


def _request_bytes(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"must be a whole number of bytes from {MIN_REQUEST_BYTES} to {MAX_REQUEST_BYTES} "
            "(64 MiB), without quotes, e.g. 1048576"
        )
    if not MIN_REQUEST_BYTES <= value <= MAX_REQUEST_BYTES:
        raise ValueError(f"must be from {MIN_REQUEST_BYTES} to {MAX_REQUEST_BYTES} (64 MiB) bytes")
    return value


# A Unix user or group name as shadow-utils accepts it (a trailing $ marks Samba machine accounts).
_UNIX_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\$?")


def _unix_name(what: str, *, empty_ok: bool) -> Validator:
    def check(value: Any) -> str:
        fix = f'a {what} name such as "slurm"' + (', or ""' if empty_ok else "")
        if not isinstance(value, str):
            raise ValueError(f"must be a string: {fix}")
        if value == "" and empty_ok:
            return value
        if not _UNIX_NAME.fullmatch(value) or len(value) > 256:
            raise ValueError(
                f"must be {fix} (letters, digits, '_', '.' and '-', not starting with a digit "
                "or '-')"
            )
        return value

    return check


def _bool(value: Any) -> bool:
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


def _int_range(low: int, high: int) -> Validator:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(
                f"must be a whole number from {low} to {high}, without quotes, e.g. {max(low, 1)}"
            )
        if not low <= value <= high:
            raise ValueError(f"must be from {low} to {high}")
        return value

    return check


# A Slurm NodeName: letters, digits, '.', '_' and '-', starting with a letter or digit.
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _node_name(value: Any) -> str:
    fix = 'a Slurm node name such as "gpu017", or "" for this host\'s short hostname'
    if not isinstance(value, str):
        raise ValueError(f"must be a string: {fix}")
    if value and not _NODE_NAME.fullmatch(value):
        raise ValueError(
            f"must be {fix} (letters, digits, '.', '_' and '-', starting with a letter or digit)"
        )
    return value


#: The placeholder ``sidecar.spool_dir`` may contain, replaced by the sidecar's node name.
NODE_PLACEHOLDER = "{node}"


def _node_path(value: Any) -> Path:
    path = _path_string(value, empty_ok=False)
    rest = path.replace(NODE_PLACEHOLDER, "")
    if "{" in rest or "}" in rest:
        raise ValueError(
            f"the only placeholder a path may hold is {NODE_PLACEHOLDER} (the node name), "
            'e.g. "/var/spool/slurm-recovery/{node}"'
        )
    return Path(path)


def _job_dir(value: Any) -> Path:
    path = _node_path(value)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in str(path)):
        # the TaskProlog prints it in "export NAME=value" lines, one per line
        raise ValueError("must not contain control characters such as a newline")
    return path


def short_hostname() -> str:
    """This host's name up to the first dot: what Slurm usually calls the node."""
    return socket.gethostname().split(".", 1)[0]


# --------------------------------------------------------------------------------- the schema


@dataclass(frozen=True)
class Key:
    """One setting: where it lives, its type and default (as written in TOML), what it means."""

    section: str
    name: str
    type: str  # as an admin reads it in docs/configuration.md
    default: Any  # the TOML value; ``validator(default)`` is the value the program uses
    doc: str
    validator: Validator

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"


#: Every setting there is. docs/configuration.md and etc/config.toml document each one.
KEYS: tuple[Key, ...] = (
    Key(
        "cluster",
        "name",
        "string",
        "",
        "Name of this cluster in job-attempt keys (cluster, job id, submit time, restart "
        "count). Empty: take ClusterName from Slurm. Mapped to lower case, as Slurm does.",
        _cluster_name,
    ),
    Key(
        "scheduler",
        "backend",
        "one of auto, scontrol, pyslurm",
        "auto",
        "How slurm-recovery talks to Slurm. auto: pyslurm if it imports and matches the running "
        "Slurm, else scontrol. scontrol: the squeue/sinfo/scontrol commands with --json (any "
        "Slurm since 21.08). pyslurm: the pyslurm library only; an error if it cannot be used.",
        _choice("auto", "scontrol", "pyslurm"),
    ),
    Key(
        "scheduler",
        "command_timeout",
        "duration, more than 0",
        15,
        "Longest wait for any one Slurm call. If slurmctld does not answer within it, the call "
        "fails with an 'unreachable' error instead of hanging.",
        _duration_above_zero,
    ),
    Key(
        "scheduler",
        "slurm_bin_dir",
        "absolute path, or empty",
        "",
        "Directory holding squeue, sinfo, scontrol and scancel. Empty: search PATH.",
        _optional_path,
    ),
    Key(
        "scheduler",
        "slurm_conf",
        "absolute path, or empty",
        "",
        "slurm.conf to use, passed to the Slurm commands as SLURM_CONF. Empty: Slurm's own "
        "choice ($SLURM_CONF if set, else the slurm.conf Slurm was built with).",
        _optional_path,
    ),
    Key(
        "store",
        "path",
        "absolute path",
        "/var/lib/slurm-recovery/state.db",
        "SQLite database holding incidents, advice and the audit trail. Its directory must "
        "exist and be writable by the controller.",
        _path,
    ),
    Key(
        "store",
        "retention",
        "duration, at least 1 day",
        "30d",
        "Routine evidence (sidecar status, GPU activity and inventory, training progress) older "
        "than this is deleted, unless an advice rests on it. Incidents, advice, XIDs, findings, "
        "job events and the audit trail are kept.",
        _retention,
    ),
    Key(
        "log",
        "level",
        "one of debug, info, warning, error",
        "info",
        "Least severe message written to the log.",
        _choice("debug", "info", "warning", "error"),
    ),
    Key(
        "controller",
        "listen",
        'string "HOST:PORT"',
        "0.0.0.0:7765",
        "Address and port the controller's HTTP API listens on. HOST is an IPv4 address, a host "
        'name, or an IPv6 address in brackets ("[::1]:7765"); "0.0.0.0" means every IPv4 '
        'address, "[::]" every IPv6 one. PORT is 1 to 65535.',
        _listen,
    ),
    Key(
        "controller",
        "policy",
        "absolute path",
        "/etc/slurm-recovery/policy.toml",
        "The decision policy file (docs/policy.md): what to do with each kind of incident.",
        _path,
    ),
    Key(
        "controller",
        "loop_interval",
        "duration, more than 0",
        1,
        "How often the controller reconciles with Slurm: reads jobs and nodes and advances the "
        "actions in progress.",
        _duration_above_zero,
    ),
    Key(
        "controller",
        "hold_deadline",
        "duration, more than 0",
        "2m",
        "The longest a job may stay held by slurm-recovery; after it, the watchdog releases the "
        "job so that normal scheduling proceeds.",
        _duration_above_zero,
    ),
    Key(
        "controller",
        "max_request_bytes",
        f"integer, {MIN_REQUEST_BYTES} to {MAX_REQUEST_BYTES} (64 MiB)",
        1048576,
        "Largest request body the controller's HTTP API accepts, in bytes; a larger one is "
        "refused (HTTP 413).",
        _request_bytes,
    ),
    Key(
        "controller",
        "max_queued_requests",
        "integer, 10 to 100000",
        1000,
        "Evidence requests waiting to be stored beyond which new ones are refused with HTTP 429 "
        "and a Retry-After; the sidecars keep their events and retry.",
        _int_range(10, 100_000),
    ),
    Key(
        "controller",
        "spool_dir",
        "absolute path",
        "/var/spool/slurm-recovery/controller",
        "Directory where the head-node EpilogSlurmctld hook spools its events when the "
        "controller does not answer; the controller imports them.",
        _path,
    ),
    Key(
        "controller",
        "tls_cert",
        "absolute path, or empty",
        "",
        "PEM certificate (chain) the HTTP API serves over TLS; set it with tls_key. Empty: plain "
        "HTTP (requests are still signed with MUNGE).",
        _optional_path,
    ),
    Key(
        "controller",
        "tls_key",
        "absolute path, or empty",
        "",
        "PEM private key of tls_cert; readable by the controller's user only.",
        _optional_path,
    ),
    Key(
        "auth",
        "munge_socket",
        "absolute path, or empty",
        "",
        "Socket of the munged daemon used to check credentials. Empty: libmunge's default.",
        _optional_path,
    ),
    Key(
        "auth",
        "max_age",
        "duration, more than 0",
        60,
        "Credentials older than this are refused, even if MUNGE still accepts them.",
        _duration_above_zero,
    ),
    Key(
        "auth",
        "operator_group",
        "string (Unix group name), or empty",
        "",
        "Unix group whose members are operators (may act, not only read), besides root and the "
        "SlurmUser. Empty: no group.",
        _unix_name("group", empty_ok=True),
    ),
    Key(
        "auth",
        "slurm_user",
        "string (Unix user name)",
        "slurm",
        "The SlurmUser (as in slurm.conf), who may act as an operator.",
        _unix_name("user", empty_ok=False),
    ),
    Key(
        "watchdog",
        "interval",
        "duration, more than 0",
        10,
        "How often the watchdog checks for jobs held past controller.hold_deadline.",
        _duration_above_zero,
    ),
    Key(
        "watchdog",
        "spool_dir",
        "absolute path",
        "/var/lib/slurm-recovery/watchdog",
        "Directory where the watchdog records the jobs it released, for the controller to copy "
        "into its audit trail.",
        _path,
    ),
    Key(
        "client",
        "url",
        "string, an http:// or https:// URL",
        "http://localhost:7765",
        "Where srecovery and the sidecars reach the controller. The environment variable "
        "SRECOVERY_URL overrides it. A trailing / is dropped.",
        _url,
    ),
    Key(
        "client",
        "ca_file",
        "absolute path, or empty",
        "",
        "PEM file of the certificate authorities trusted for an https:// client.url. Empty: "
        "the system's trust store.",
        _optional_path,
    ),
    Key(
        "sidecar",
        "node",
        "string (Slurm node name), or empty",
        "",
        "The Slurm node name this sidecar speaks for. Empty: this host's short hostname.",
        _node_name,
    ),
    Key(
        "sidecar",
        "gpu_backend",
        "one of nvml, sim, none",
        "nvml",
        "Where GPU state comes from. nvml: the NVIDIA driver (libnvidia-ml). sim: simulated "
        "GPUs under sidecar.sim_dir, for tests. none: no GPU telemetry.",
        _choice("nvml", "sim", "none"),
    ),
    Key(
        "sidecar",
        "sim_dir",
        "absolute path",
        "/var/lib/slurm-recovery/sim",
        "Where the simulated backend keeps each node's GPU state and injected faults.",
        _path,
    ),
    Key(
        "sidecar",
        "sim_gpus",
        "integer, 1 to 64",
        8,
        "GPUs per node for the simulated backend.",
        _int_range(1, 64),
    ),
    Key(
        "sidecar",
        "expected_gpus",
        "integer, 0 to 64",
        0,
        "GPUs this node should have; fewer is a gpu_lost finding. 0: take the count from the "
        "first inventory.",
        _int_range(0, 64),
    ),
    Key(
        "sidecar",
        "poll_interval",
        "duration, more than 0",
        10,
        "How often the sidecar polls telemetry (NVML, InfiniBand).",
        _duration_above_zero,
    ),
    Key(
        "sidecar",
        "fast_interval",
        "duration, more than 0",
        0.2,
        "How often the sidecar checks the kernel log reader, injected faults and the hook spool.",
        _duration_above_zero,
    ),
    Key(
        "sidecar",
        "spool_dir",
        'absolute path, may contain "{node}"',
        "/var/spool/slurm-recovery",
        "Directory for hook events, the outbound queue and the health file. {node} is replaced "
        "by the node name, so several sidecars on one host each get their own.",
        _node_path,
    ),
    Key(
        "sidecar",
        "queue_max_events",
        "integer, 1000 to 10000000",
        100000,
        "Bound of the on-disk outbound queue; past it the oldest events are dropped and counted.",
        _int_range(1000, 10_000_000),
    ),
    Key(
        "sidecar",
        "kmsg",
        "boolean",
        True,
        "Read GPU XID errors from the kernel log (/dev/kmsg).",
        _bool,
    ),
    Key(
        "sidecar",
        "ib_sysfs",
        "absolute path, or empty",
        "/sys/class/infiniband",
        "sysfs directory of the InfiniBand devices. Empty: no InfiniBand telemetry.",
        _optional_path,
    ),
    Key(
        "sidecar",
        "nvml_timeout",
        "duration, more than 0",
        5,
        "The longest any one NVML call may take before it counts as failed.",
        _duration_above_zero,
    ),
    Key(
        "sidecar",
        "batch_max_events",
        "integer, 1 to 1000",
        500,
        "Most events the sidecar sends to the controller in one request.",
        _int_range(1, 1000),
    ),
    Key(
        "hooks",
        "health_gate",
        "boolean",
        False,
        "The prolog refuses a node with an open fatal GPU finding (Slurm then drains the node "
        "and requeues the job). Honoured only in act mode.",
        _bool,
    ),
    Key(
        "hooks",
        "controller_timeout",
        "duration, more than 0",
        0.5,
        "How long the head-node EpilogSlurmctld hook waits for the controller before spooling "
        "its event to controller.spool_dir.",
        _duration_above_zero,
    ),
    Key(
        "hooks",
        "job_dir",
        'absolute path, may contain "{node}"',
        "/run/slurm-recovery/jobs/{node}",
        "Where the prolog gives each job a directory of its own on each node, <job_dir>/<job id>, "
        "owned by the job user, for its progress file and NCCL flight-recorder dumps; the "
        "sidecar reads and then removes it. {node} is replaced by the node name. Local disk.",
        _job_dir,
    ),
)

_BY_DOTTED: dict[str, Key] = {key.dotted: key for key in KEYS}


#: The value the program uses for each key ("scheduler.command_timeout" -> 15.0) when unset.
DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {key.dotted: key.validator(key.default) for key in KEYS}
)


# --------------------------------------------------------------------------------- the object


@dataclass(frozen=True)
class ClusterConfig:
    name: str = DEFAULTS["cluster.name"]


@dataclass(frozen=True)
class SchedulerConfig:
    backend: str = DEFAULTS["scheduler.backend"]
    command_timeout: float = DEFAULTS["scheduler.command_timeout"]
    slurm_bin_dir: str = DEFAULTS["scheduler.slurm_bin_dir"]
    slurm_conf: str = DEFAULTS["scheduler.slurm_conf"]


@dataclass(frozen=True)
class StoreConfig:
    path: Path = DEFAULTS["store.path"]
    retention: float = DEFAULTS["store.retention"]


@dataclass(frozen=True)
class LogConfig:
    level: str = DEFAULTS["log.level"]


@dataclass(frozen=True)
class ControllerConfig:
    listen: str = DEFAULTS["controller.listen"]
    policy: Path = DEFAULTS["controller.policy"]
    loop_interval: float = DEFAULTS["controller.loop_interval"]
    hold_deadline: float = DEFAULTS["controller.hold_deadline"]
    max_request_bytes: int = DEFAULTS["controller.max_request_bytes"]
    max_queued_requests: int = DEFAULTS["controller.max_queued_requests"]
    spool_dir: Path = DEFAULTS["controller.spool_dir"]
    tls_cert: str = DEFAULTS["controller.tls_cert"]
    tls_key: str = DEFAULTS["controller.tls_key"]

    @property
    def listen_host_port(self) -> tuple[str, int]:
        """``listen`` split: ``("0.0.0.0", 7765)``; an IPv6 host comes without its brackets."""
        return split_host_port(self.listen)


@dataclass(frozen=True)
class AuthConfig:
    munge_socket: str = DEFAULTS["auth.munge_socket"]
    max_age: float = DEFAULTS["auth.max_age"]
    operator_group: str = DEFAULTS["auth.operator_group"]
    slurm_user: str = DEFAULTS["auth.slurm_user"]


@dataclass(frozen=True)
class WatchdogConfig:
    interval: float = DEFAULTS["watchdog.interval"]
    spool_dir: Path = DEFAULTS["watchdog.spool_dir"]


@dataclass(frozen=True)
class ClientConfig:
    url: str = DEFAULTS["client.url"]
    ca_file: str = DEFAULTS["client.ca_file"]


@dataclass(frozen=True)
class SidecarConfig:
    node: str = DEFAULTS["sidecar.node"]
    gpu_backend: str = DEFAULTS["sidecar.gpu_backend"]
    sim_dir: Path = DEFAULTS["sidecar.sim_dir"]
    sim_gpus: int = DEFAULTS["sidecar.sim_gpus"]
    expected_gpus: int = DEFAULTS["sidecar.expected_gpus"]
    poll_interval: float = DEFAULTS["sidecar.poll_interval"]
    fast_interval: float = DEFAULTS["sidecar.fast_interval"]
    spool_dir: Path = DEFAULTS["sidecar.spool_dir"]
    queue_max_events: int = DEFAULTS["sidecar.queue_max_events"]
    kmsg: bool = DEFAULTS["sidecar.kmsg"]
    ib_sysfs: str = DEFAULTS["sidecar.ib_sysfs"]
    nvml_timeout: float = DEFAULTS["sidecar.nvml_timeout"]
    batch_max_events: int = DEFAULTS["sidecar.batch_max_events"]

    @property
    def node_name(self) -> str:
        """``node``, or this host's short hostname when ``node`` is empty."""
        return self.node or short_hostname()

    def spool_path(self, node: str | None = None) -> Path:
        """``spool_dir`` with ``{node}`` replaced by ``node`` (default: :attr:`node_name`)."""
        name = self.node_name if node is None else node
        return Path(str(self.spool_dir).replace(NODE_PLACEHOLDER, name))


@dataclass(frozen=True)
class HooksConfig:
    health_gate: bool = DEFAULTS["hooks.health_gate"]
    controller_timeout: float = DEFAULTS["hooks.controller_timeout"]
    job_dir: Path = DEFAULTS["hooks.job_dir"]


@dataclass(frozen=True)
class Config:
    """The settings in force; ``source`` is the file they came from (None: all defaults)."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    log: LogConfig = field(default_factory=LogConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    sidecar: SidecarConfig = field(default_factory=SidecarConfig)
    hooks: HooksConfig = field(default_factory=HooksConfig)
    source: Path | None = None


#: Section name -> the dataclass holding its keys (field names are the key names).
SECTIONS: Mapping[str, type] = MappingProxyType(
    {
        "cluster": ClusterConfig,
        "scheduler": SchedulerConfig,
        "store": StoreConfig,
        "log": LogConfig,
        "controller": ControllerConfig,
        "auth": AuthConfig,
        "watchdog": WatchdogConfig,
        "client": ClientConfig,
        "sidecar": SidecarConfig,
        "hooks": HooksConfig,
    }
)


# --------------------------------------------------------------------------------- loading


def resolve_config_path(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> tuple[Path, str | None]:
    """The file to read and what named it: explicit ``path`` > ``$SRECOVERY_CONFIG`` > default.

    The second item is None for the default file (which may be absent), else a phrase for
    error messages.
    """
    env = os.environ if env is None else env
    if path is not None and str(path) != "":
        return Path(path), "--config"
    if env.get(CONFIG_ENV_VAR):
        return Path(env[CONFIG_ENV_VAR]), f"${CONFIG_ENV_VAR}"
    return DEFAULT_CONFIG_PATH, None


def load_config(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """Read and check the config file chosen by :func:`resolve_config_path`, then apply
    ``$SRECOVERY_URL`` (which overrides ``client.url``) from ``env`` (default: ``os.environ``).

    A missing default file means all defaults; a missing file named by ``path`` or
    ``$SRECOVERY_CONFIG`` is an error. Raises :class:`ConfigError` listing every problem.
    """
    env = os.environ if env is None else env
    file, named_by = resolve_config_path(path, env)
    try:
        text = _read_text(file)
    except FileNotFoundError:
        if named_by is None:
            return _apply_env(Config(), env)
        raise ConfigError(
            f"{file}: no such file (named by {named_by}); check the path, or create the file "
            "(docs/configuration.md lists every key)"
        ) from None
    return _apply_env(config_from_toml(text, file), env)


def _apply_env(loaded: Config, env: Mapping[str, str]) -> Config:
    """``$SRECOVERY_URL``, when set and not empty, replaces ``client.url``."""
    url = env.get(URL_ENV_VAR)
    if not url:
        return loaded
    try:
        checked = _url(url)
    except ValueError as exc:
        raise ConfigError(
            f"${URL_ENV_VAR} = {url!r}: {exc}; or unset it to use client.url from the config file"
        ) from None
    return replace(loaded, client=replace(loaded.client, url=checked))


def config_from_toml(text: str, source: str | os.PathLike[str] | None = None) -> Config:
    """Parse and check ``text``, the contents of the file ``source`` (named in every error)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(_syntax_problem(source or "config", text, exc)) from None
    return config_from_dict(data, source)


def _read_text(file: Path) -> str:
    try:
        with open(file, "rb") as fh:
            _refuse_if_others_can_write(file, os.fstat(fh.fileno()))
            raw = fh.read()
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise ConfigError(f"{file}: is a directory; name the config file itself") from None
    except PermissionError:
        raise ConfigError(
            f"{file}: permission denied; run as a user that can read it (root), or "
            f"chmod o+r {file} if it holds nothing secret"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read it: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{file}:{line}: not UTF-8 text; TOML files must be UTF-8 (convert it with iconv)"
        ) from None


def _refuse_if_others_can_write(file: Path, st: os.stat_result) -> None:
    """Whoever can edit this file decides which nodes are drained: refuse world-writable."""
    if st.st_mode & stat.S_IWOTH:
        raise ConfigError(
            f"{file}: world-writable (mode {stat.S_IMODE(st.st_mode):04o}): any user could "
            f"change what slurm-recovery does to jobs and nodes; fix: chmod o-w {file}"
        )
    folder = os.path.dirname(os.path.realpath(file))
    try:
        dst = os.stat(folder)
    except OSError:
        return
    if dst.st_mode & stat.S_IWOTH and not dst.st_mode & stat.S_ISVTX:
        raise ConfigError(
            f"{file}: its directory {folder} is world-writable (mode "
            f"{stat.S_IMODE(dst.st_mode):04o}): any user could replace the file; "
            f"fix: chmod o-w {folder}"
        )


_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


def _syntax_problem(source: str | os.PathLike[str], text: str, exc: tomllib.TOMLDecodeError) -> str:
    message = str(exc)
    lineno = getattr(exc, "lineno", None)  # Python 3.14+
    found = _TOML_POSITION.search(message)
    if found:
        lineno = int(found.group(1))
        message = f"{message[: found.start()]} (column {found.group(2)})"
    if lineno is None:  # "(at end of document)"
        lineno = max(1, len(text.splitlines()))
    problem = f"{source}:{lineno}: invalid TOML: {message}"
    if message.startswith("Invalid value"):
        problem += '; strings must be quoted, e.g. backend = "scontrol"'
    lines = text.splitlines()
    if 0 < lineno <= len(lines) and lines[lineno - 1].strip():
        problem += f"\n    {lines[lineno - 1].strip()}"
    return problem


def config_from_dict(
    data: Mapping[str, Any], source: str | os.PathLike[str] | None = None
) -> Config:
    """Check ``data`` (parsed TOML: section -> key -> value) and build the :class:`Config`.

    ``source`` names the file in error messages and becomes ``Config.source``.
    """
    path = Path(source) if source is not None else None
    label = str(path) if path is not None else "config"
    problems: list[str] = []
    values: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    for section, table in data.items():
        if section not in SECTIONS:
            problems.append(_unknown_top_level(label, section, table))
        elif not isinstance(table, Mapping):
            problems.append(
                f"{label}: {section} = {table!r}: {section} is a section; write [{section}] "
                "on a line of its own and its keys below it"
            )
        else:
            for name, value in table.items():
                key = _BY_DOTTED.get(f"{section}.{name}")
                if key is None:
                    problems.append(_unknown_key(label, section, name))
                    continue
                try:
                    values[section][name] = key.validator(value)
                except ValueError as exc:
                    problems.append(f"{label}: {key.dotted} = {value!r}: {exc}")
    tls = values["controller"]
    if bool(tls.get("tls_cert")) != bool(tls.get("tls_key")):
        problems.append(
            f"{label}: controller.tls_cert and controller.tls_key go together: set both (TLS) "
            "or neither (plain HTTP)"
        )
    if problems:
        raise ConfigError(*problems)
    sections = {section: cls(**values[section]) for section, cls in SECTIONS.items()}
    return Config(**sections, source=path)


def _did_you_mean(candidates: list[str]) -> str:
    return f"; did you mean {candidates[0]}?" if candidates else ""


def _keys_named_like(name: str) -> list[str]:
    """Dotted keys named ``name`` in any section, else the one whose name is closest to it."""
    exact = [key.dotted for key in KEYS if key.name == name]
    close = difflib.get_close_matches(name, [key.name for key in KEYS], n=1)
    return exact or [key.dotted for key in KEYS if key.name in close][:1]


def _unknown_key(source: str, section: str, name: str) -> str:
    names = [key.name for key in KEYS if key.section == section]
    same_section = [f"{section}.{n}" for n in difflib.get_close_matches(name, names, n=1)]
    elsewhere = _keys_named_like(name)
    exact_elsewhere = [dotted for dotted in elsewhere if dotted.endswith(f".{name}")]
    candidates = exact_elsewhere or same_section or elsewhere
    return (
        f"{source}: {section}.{name}: unknown key{_did_you_mean(candidates)} "
        f"(keys of [{section}]: {', '.join(names)})"
    )


def _unknown_top_level(source: str, name: str, value: Any) -> str:
    sections = ", ".join(SECTIONS)
    if isinstance(value, Mapping):
        close = difflib.get_close_matches(name, list(SECTIONS), n=1)
        hint = _did_you_mean([f"[{section}]" for section in close])
        return f"{source}: [{name}]: unknown section{hint} (sections: {sections})"
    return (
        f"{source}: {name}: unknown key{_did_you_mean(_keys_named_like(name))} "
        f"(every key belongs to a section: {sections})"
    )
