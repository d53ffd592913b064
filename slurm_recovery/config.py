"""The admin's configuration file (``/etc/slurm-recovery/config.toml``): found, read, checked.

The schema is the section Structs below (:class:`Config` and its sections): each field's type
checks its value and its ``msgspec.Meta(description=...)`` says what it means.
docs/configuration.md and etc/config.toml document every field (a unit test holds them to
that). Every problem becomes a :class:`ConfigError` naming the file, the line, the dotted key,
what is wrong and how to fix it: a typo in admin config is never ignored. The keys Slurm's
hooks read take their defaults and checks from :mod:`slurm_recovery.contract.settings`.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PosixPath
from types import MappingProxyType
from typing import Annotated, Any, Self

import msgspec

from slurm_recovery.contract import settings as hook
from slurm_recovery.contract.durations import DURATION_HINT
from slurm_recovery.contract.durations import format_duration as format_duration
from slurm_recovery.contract.durations import parse_duration as parse_duration
from slurm_recovery.schema import (
    Checked,
    Choice,
    Duration,
    KeyPath,
    PositiveDuration,
    SchemaError,
    convert,
    field_docs,
    find_line,
    parse_toml,
    read_toml,
    suggest_key,
)
from slurm_recovery.schema import did_you_mean as did_you_mean

#: Where the RPM installs the file; read when neither a path nor the variable names another.
DEFAULT_CONFIG_PATH = Path(hook.DEFAULT_CONFIG_PATH)
CONFIG_ENV_VAR = hook.CONFIG_ENV_VAR
URL_ENV_VAR = hook.URL_ENV_VAR
NODE_PLACEHOLDER = hook.NODE_PLACEHOLDER

#: The error of every file of ours (config, policy, catalogues): one line per problem, each
#: naming file, key and fix, in ``.problems``. One class, so ``except ConfigError`` catches all.
ConfigError = SchemaError


# --------------------------------------------------------------------------------- value types


class AbsPath(PosixPath, Checked):
    LABEL = "absolute path"
    RULE = staticmethod(hook.path_string)


class OptionalPath(str, Checked):
    LABEL = "absolute path, or empty"
    RULE = staticmethod(hook.optional_path)


class NodePath(AbsPath):
    LABEL = 'absolute path, may contain "{node}"'
    RULE = staticmethod(hook.node_path)


class JobDir(NodePath):
    RULE = staticmethod(hook.job_dir)


class NodeName(str, Checked):
    LABEL = "string (Slurm node name), or empty"
    RULE = staticmethod(hook.node_name)


class Url(str, Checked):
    LABEL = "string, an http:// or https:// URL"
    RULE = staticmethod(hook.url)


class Retention(Duration):
    LABEL = "duration, at least 1 day"

    @classmethod
    def check(cls, value: Any) -> Self:
        seconds = parse_duration(value)
        if seconds < 86400:
            raise ValueError(
                f'must be at least 1 day ("1d"): the controller decides on the last hour of '
                f"evidence, and explains incidents with older evidence; {DURATION_HINT}"
            )
        return cls(seconds)


#: What LBNL NHC's drain reasons start with: ``controller.health_check_drain_prefixes``.
DEFAULT_HEALTH_CHECK_PREFIXES = ("NHC:",)
#: The tool's own drain reasons start with this (``srecovery:<incident>:``, ``srecovery-op:``).
TOOL_REASON_START = "srecovery"
#: Most prefixes, and the longest, ``controller.health_check_drain_prefixes`` takes.
MAX_HEALTH_CHECK_PREFIXES = 32
MAX_HEALTH_CHECK_PREFIX_CHARS = 64


class DrainReasonPrefixes(tuple[str, ...], Checked):
    """Drain-reason prefixes that mark a site health check's drain (``["NHC:"]``)."""

    LABEL = "list of strings"

    @classmethod
    def check(cls, value: Any) -> Self:
        example = 'e.g. ["NHC:", "healthcheck:"]'
        if not isinstance(value, list | tuple):
            raise ValueError(f"must be a list of strings, {example}")
        if len(value) > MAX_HEALTH_CHECK_PREFIXES:
            raise ValueError(f"at most {MAX_HEALTH_CHECK_PREFIXES} prefixes, got {len(value)}")
        for item in value:
            if not isinstance(item, str):
                raise ValueError(f"{item!r} is not a string: must be a list of strings, {example}")
            if not item.strip():
                raise ValueError(
                    "an empty prefix would make every drain a health check's; remove it"
                )
            if len(item) > MAX_HEALTH_CHECK_PREFIX_CHARS:
                raise ValueError(
                    f"{item!r} is longer than {MAX_HEALTH_CHECK_PREFIX_CHARS} characters"
                )
            if any(ord(c) < 0x20 or ord(c) == 0x7F for c in item):
                raise ValueError(f"{item!r} holds a control character (Slurm reasons have none)")
            if item.startswith(TOOL_REASON_START) or TOOL_REASON_START.startswith(item.strip()):
                raise ValueError(
                    f"{item!r} would match slurm-recovery's own drain reasons "
                    f"({TOOL_REASON_START}:<incident>:..., {TOOL_REASON_START}-op:...)"
                )
        return cls(value)


_CLUSTER_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


class ClusterName(str, Checked):
    LABEL = "string"

    @classmethod
    def check(cls, value: Any) -> Self:
        if not isinstance(value, str):
            raise ValueError('must be a string: the cluster\'s ClusterName, or "" to ask Slurm')
        name = value.lower()  # Slurm itself maps ClusterName to lower case
        if name and not _CLUSTER_NAME.fullmatch(name):
            raise ValueError(
                "must be a Slurm ClusterName (letters, digits, '.', '_' and '-', starting with a "
                'letter or digit), or "" to take ClusterName from Slurm'
            )
        return cls(name)


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


class Listen(str, Checked):
    LABEL = 'string "HOST:PORT"'

    @classmethod
    def check(cls, value: Any) -> Self:
        split_host_port(value)
        return cls(value)


#: Limits of ``controller.max_request_bytes``.
MIN_REQUEST_BYTES = 1024
MAX_REQUEST_BYTES = 64 * 1024 * 1024


class RequestBytes(int, Checked):
    LABEL = f"integer, {MIN_REQUEST_BYTES} to {MAX_REQUEST_BYTES} (64 MiB)"

    @classmethod
    def check(cls, value: Any) -> Self:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(
                f"must be a whole number of bytes from {MIN_REQUEST_BYTES} to "
                f"{MAX_REQUEST_BYTES} (64 MiB), without quotes, e.g. 1048576"
            )
        if not MIN_REQUEST_BYTES <= value <= MAX_REQUEST_BYTES:
            raise ValueError(
                f"must be from {MIN_REQUEST_BYTES} to {MAX_REQUEST_BYTES} (64 MiB) bytes"
            )
        return cls(value)


# A Unix user or group name as shadow-utils accepts it (a trailing $ marks Samba machine accounts).
_UNIX_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\$?")


def _unix_name(value: Any, what: str, *, empty_ok: bool) -> str:
    fix = f'a {what} name such as "slurm"' + (', or ""' if empty_ok else "")
    if not isinstance(value, str):
        raise ValueError(f"must be a string: {fix}")
    if value == "" and empty_ok:
        return value
    if not _UNIX_NAME.fullmatch(value) or len(value) > 256:
        raise ValueError(
            f"must be {fix} (letters, digits, '_', '.' and '-', not starting with a digit or '-')"
        )
    return value


class GroupName(str, Checked):
    LABEL = "string (Unix group name), or empty"

    RULE = staticmethod(functools.partial(_unix_name, what="group", empty_ok=True))


class UserName(str, Checked):
    LABEL = "string (Unix user name)"

    RULE = staticmethod(functools.partial(_unix_name, what="user", empty_ok=False))


class SchedulerBackend(Choice):
    OPTIONS = ("auto", "scontrol", "pyslurm")


class LogLevel(Choice):
    OPTIONS = ("debug", "info", "warning", "error")


class GpuBackend(Choice):
    OPTIONS = ("nvml", "sim", "none")


def short_hostname() -> str:
    """This host's name up to the first dot: what Slurm usually calls the node."""
    return socket.gethostname().split(".", 1)[0]


def _hook_default(kind: type[Checked], dotted: str) -> Any:
    """The default of a key the hooks read, as :mod:`~slurm_recovery.contract.settings` has it."""
    return kind.check(hook.HOOK_DEFAULTS[dotted])


# --------------------------------------------------------------------------------- the schema


class _Section(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One ``[section]`` of the file: its fields are its keys."""


class ClusterConfig(_Section):
    name: Annotated[
        ClusterName,
        msgspec.Meta(
            description="Name of this cluster in job-attempt keys (cluster, job id, submit time, "
            "restart count). Empty: take ClusterName from Slurm. Mapped to lower case, as Slurm "
            "does."
        ),
    ] = ClusterName.check("")


class SchedulerConfig(_Section):
    backend: Annotated[
        SchedulerBackend,
        msgspec.Meta(
            description="How slurm-recovery talks to Slurm. auto: pyslurm if it imports and "
            "matches the running Slurm, else scontrol. scontrol: the squeue/sinfo/scontrol "
            "commands with --json (any Slurm since 21.08). pyslurm: the pyslurm library only; "
            "an error if it cannot be used."
        ),
    ] = SchedulerBackend.check("auto")
    command_timeout: Annotated[
        PositiveDuration,
        msgspec.Meta(
            description="Longest wait for any one Slurm call. If slurmctld does not answer "
            "within it, the call fails with an 'unreachable' error instead of hanging."
        ),
    ] = PositiveDuration.check(15)
    slurm_bin_dir: Annotated[
        OptionalPath,
        msgspec.Meta(
            description="Directory holding squeue, sinfo, scontrol and scancel. Empty: search PATH."
        ),
    ] = OptionalPath.check("")
    slurm_conf: Annotated[
        OptionalPath,
        msgspec.Meta(
            description="slurm.conf to use, passed to the Slurm commands as SLURM_CONF. Empty: "
            "Slurm's own choice ($SLURM_CONF if set, else the slurm.conf Slurm was built with)."
        ),
    ] = OptionalPath.check("")


class StoreConfig(_Section):
    path: Annotated[
        AbsPath,
        msgspec.Meta(
            description="SQLite database holding incidents, advice and the audit trail. Its "
            "directory must exist and be writable by the controller."
        ),
    ] = AbsPath.check("/var/lib/slurm-recovery/state.db")
    retention: Annotated[
        Retention,
        msgspec.Meta(
            description="Routine evidence (sidecar status, GPU activity and inventory, training "
            "progress) older than this is deleted, unless an advice rests on it. Incidents, "
            "advice, XIDs, findings, job events and the audit trail are kept."
        ),
    ] = Retention.check("30d")


class LogConfig(_Section):
    level: Annotated[
        LogLevel, msgspec.Meta(description="Least severe message written to the log.")
    ] = LogLevel.check("info")


class ControllerConfig(_Section):
    listen: Annotated[
        Listen,
        msgspec.Meta(
            description="Address and port the controller's HTTP API listens on. HOST is an IPv4 "
            'address, a host name, or an IPv6 address in brackets ("[::1]:7765"); "0.0.0.0" '
            'means every IPv4 address, "[::]" every IPv6 one. PORT is 1 to 65535.'
        ),
    ] = Listen.check("0.0.0.0:7765")
    policy: Annotated[
        AbsPath,
        msgspec.Meta(
            description="The decision policy file (docs/policy.md): what to do with each kind "
            "of incident."
        ),
    ] = _hook_default(AbsPath, "controller.policy")
    loop_interval: Annotated[
        PositiveDuration,
        msgspec.Meta(
            description="How often the controller reconciles with Slurm: reads jobs and nodes "
            "and advances the actions in progress."
        ),
    ] = PositiveDuration.check(1)
    hold_deadline: Annotated[
        PositiveDuration,
        msgspec.Meta(
            description="The longest a job may stay held by slurm-recovery; after it, the "
            "watchdog releases the job so that normal scheduling proceeds."
        ),
    ] = PositiveDuration.check("2m")
    max_request_bytes: Annotated[
        RequestBytes,
        msgspec.Meta(
            description="Largest request body the controller's HTTP API accepts, in bytes; a "
            "larger one is refused (HTTP 413)."
        ),
    ] = RequestBytes.check(1048576)
    max_queued_requests: Annotated[
        int,
        msgspec.Meta(
            ge=10,
            le=100_000,
            description="Evidence requests waiting to be stored beyond which new ones are "
            "refused with HTTP 429 and a Retry-After; the sidecars keep their events and retry.",
        ),
    ] = 20_000
    max_queued_bytes: Annotated[
        int,
        msgspec.Meta(
            ge=1_048_576,
            le=4_294_967_296,
            description="Bytes of request bodies waiting to be stored beyond which new "
            "evidence requests are refused with HTTP 429 (as max_queued_requests): what bounds "
            "the controller's memory under a flood of large batches.",
        ),
    ] = 67_108_864
    spool_dir: Annotated[
        AbsPath,
        msgspec.Meta(
            description="Directory where the head-node EpilogSlurmctld hook spools its events "
            "when the controller does not answer; the controller imports them."
        ),
    ] = _hook_default(AbsPath, "controller.spool_dir")
    tls_cert: Annotated[
        OptionalPath,
        msgspec.Meta(
            description="PEM certificate (chain) the HTTP API serves over TLS; set it with "
            "tls_key. Empty: plain HTTP (requests are still signed with MUNGE)."
        ),
    ] = OptionalPath.check("")
    tls_key: Annotated[
        OptionalPath,
        msgspec.Meta(
            description="PEM private key of tls_cert; readable by the controller's user only."
        ),
    ] = OptionalPath.check("")
    health_check_drain_prefixes: Annotated[
        DrainReasonPrefixes,
        msgspec.Meta(
            description="Drain reasons starting with one of these mark a drain by the site's "
            'health check (LBNL NHC\'s start with "NHC:"): evidence against the node, kept out '
            "of the job's restarts while drained, never counted or resumed as the tool's."
        ),
    ] = DrainReasonPrefixes.check(list(DEFAULT_HEALTH_CHECK_PREFIXES))
    missing_report_grace: Annotated[
        Duration,
        msgspec.Meta(
            description="A node running a job whose sidecar has sent nothing for this long is "
            "a finding about the node (sidecar_silent: weak, system; it never drains, stops "
            "or requeues anything on its own). 2.5 sidecar.status_interval periods by "
            "default: a finding within 3 periods of the last report; 0: off."
        ),
    ] = Duration.check(150)
    heartbeat_datagrams: Annotated[
        bool,
        msgspec.Meta(
            description="Take sidecars' heartbeats as UDP datagrams on listen's port number "
            "(signed in their session as over HTTP, answered signed; docs/security.md): about "
            "half the controller's CPU of an HTTP heartbeat. A sidecar that hears no answer sends "
            "over HTTP. Needs auth.sessions; false: heartbeats over HTTP only."
        ),
    ] = True

    @property
    def listen_host_port(self) -> tuple[str, int]:
        """``listen`` split: ``("0.0.0.0", 7765)``; an IPv6 host comes without its brackets."""
        return split_host_port(self.listen)


class AuthConfig(_Section):
    munge_socket: Annotated[
        OptionalPath,
        msgspec.Meta(
            description="Socket of the munged daemon used to check credentials. Empty: "
            "libmunge's default."
        ),
    ] = _hook_default(OptionalPath, "auth.munge_socket")
    max_age: Annotated[
        PositiveDuration,
        msgspec.Meta(
            description="Credentials older than this are refused, even if MUNGE still accepts them."
        ),
    ] = PositiveDuration.check(60)
    operator_group: Annotated[
        GroupName,
        msgspec.Meta(
            description="Unix group whose members are operators (may act, not only read), "
            "besides root and the SlurmUser. Empty: no group."
        ),
    ] = GroupName.check("")
    slurm_user: Annotated[
        UserName,
        msgspec.Meta(description="The SlurmUser (as in slurm.conf), who may act as an operator."),
    ] = UserName.check("slurm")
    sessions: Annotated[
        bool,
        msgspec.Meta(
            description="Sidecars open a session with one MUNGE credential and sign their "
            "reports with its key, bound to their address (the controller offers them, the "
            "sidecars use them); false: every request carries its own MUNGE credential."
        ),
    ] = True
    session_ttl: Annotated[
        PositiveDuration,
        msgspec.Meta(description="How long a sidecar's session lasts before it opens another."),
    ] = PositiveDuration.check(3600)


class WatchdogConfig(_Section):
    interval: Annotated[
        PositiveDuration,
        msgspec.Meta(
            description="How often the watchdog checks for jobs held past controller.hold_deadline."
        ),
    ] = PositiveDuration.check(10)
    spool_dir: Annotated[
        AbsPath,
        msgspec.Meta(
            description="Directory where the watchdog records the jobs it released, for the "
            "controller to copy into its audit trail."
        ),
    ] = AbsPath.check("/var/lib/slurm-recovery/watchdog")


class ClientConfig(_Section):
    url: Annotated[
        Url,
        msgspec.Meta(
            description="Where srecovery and the sidecars reach the controller. The environment "
            "variable SRECOVERY_URL overrides it. A trailing / is dropped."
        ),
    ] = _hook_default(Url, "client.url")
    ca_file: Annotated[
        OptionalPath,
        msgspec.Meta(
            description="PEM file of the certificate authorities trusted for an https:// "
            "client.url. Empty: the system's trust store."
        ),
    ] = _hook_default(OptionalPath, "client.ca_file")


class SidecarConfig(_Section):
    node: Annotated[
        NodeName,
        msgspec.Meta(
            description="The Slurm node name this sidecar speaks for. Empty: this host's short "
            "hostname."
        ),
    ] = _hook_default(NodeName, "sidecar.node")
    gpu_backend: Annotated[
        GpuBackend,
        msgspec.Meta(
            description="Where GPU state comes from. nvml: the NVIDIA driver (libnvidia-ml). "
            "sim: simulated GPUs under sidecar.sim_dir, for tests. none: no GPU telemetry."
        ),
    ] = GpuBackend.check("nvml")
    sim_dir: Annotated[
        AbsPath,
        msgspec.Meta(
            description="Where the simulated backend keeps each node's GPU state and injected "
            "faults."
        ),
    ] = AbsPath.check("/var/lib/slurm-recovery/sim")
    sim_gpus: Annotated[
        int, msgspec.Meta(ge=1, le=64, description="GPUs per node for the simulated backend.")
    ] = 8
    expected_gpus: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=64,
            description="GPUs this node should have; fewer is a gpu_lost finding. 0: take the "
            "count from the first inventory.",
        ),
    ] = 0
    poll_interval: Annotated[
        PositiveDuration,
        msgspec.Meta(description="How often the sidecar polls telemetry (NVML, InfiniBand)."),
    ] = _hook_default(PositiveDuration, "sidecar.poll_interval")
    fast_interval: Annotated[
        PositiveDuration,
        msgspec.Meta(
            description="How often the sidecar checks the kernel log reader, injected faults "
            "and the hook spool."
        ),
    ] = PositiveDuration.check(0.2)
    status_interval: Annotated[
        PositiveDuration,
        msgspec.Meta(
            description="How often the sidecar sends its status (heartbeat, queue, sources) "
            "when nothing else is sent; the controller's missing_report_grace counts in these."
        ),
    ] = PositiveDuration.check(60)
    full_status_interval: Annotated[
        Duration,
        msgspec.Meta(
            description="The longest time between two full statuses (with the GPU readings "
            "srecovery nodes shows). Between them a status whose condition has not changed "
            "goes as a heartbeat of 100 bytes that the controller answers without parsing or "
            "storing anything. 0: every status in full."
        ),
    ] = Duration.check(300)
    spool_dir: Annotated[
        NodePath,
        msgspec.Meta(
            description="Directory for hook events, the outbound queue and the health file. "
            "{node} is replaced by the node name, so several sidecars on one host each get "
            "their own."
        ),
    ] = _hook_default(NodePath, "sidecar.spool_dir")
    queue_max_events: Annotated[
        int,
        msgspec.Meta(
            ge=1000,
            le=10_000_000,
            description="Bound of the on-disk outbound queue; past it the oldest events are "
            "dropped and counted.",
        ),
    ] = 100000
    kmsg: Annotated[
        bool, msgspec.Meta(description="Read GPU XID errors from the kernel log (/dev/kmsg).")
    ] = True
    ib_sysfs: Annotated[
        OptionalPath,
        msgspec.Meta(
            description="sysfs directory of the InfiniBand devices. Empty: no InfiniBand telemetry."
        ),
    ] = OptionalPath.check("/sys/class/infiniband")
    nvml_timeout: Annotated[
        PositiveDuration,
        msgspec.Meta(
            description="The longest any one NVML call may take before it counts as failed."
        ),
    ] = PositiveDuration.check(5)
    batch_max_events: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=1000,
            description="Most events the sidecar sends to the controller in one request.",
        ),
    ] = 500

    @property
    def node_name(self) -> str:
        """``node``, or this host's short hostname when ``node`` is empty."""
        return self.node or short_hostname()

    def spool_path(self, node: str | None = None) -> Path:
        """``spool_dir`` with ``{node}`` replaced by ``node`` (default: :attr:`node_name`)."""
        name = self.node_name if node is None else node
        return Path(str(self.spool_dir).replace(NODE_PLACEHOLDER, name))


class HooksConfig(_Section):
    health_gate: Annotated[
        bool,
        msgspec.Meta(
            description="The prolog refuses a node with an open fatal GPU finding (Slurm then "
            "drains the node and requeues the job). Honoured only in act mode."
        ),
    ] = hook.boolean(hook.HOOK_DEFAULTS["hooks.health_gate"])
    epilog_gate: Annotated[
        bool,
        msgspec.Meta(
            description="The node Epilog fails on a node with an open fatal GPU finding, so "
            "that Slurm drains it at once and, for --requeue=expedite jobs on Slurm 25.11+, "
            "requeues the job at once. Honoured only in act mode."
        ),
    ] = hook.boolean(hook.HOOK_DEFAULTS["hooks.epilog_gate"])
    epilog_gate_wait: Annotated[
        Duration,
        msgspec.Meta(
            description="With hooks.epilog_gate, how long the Epilog of a job that failed "
            "waits for the sidecar to list a fatal finding it may not have read yet, at most "
            "(it ends once the sidecar has read its sources after the job's end)."
        ),
    ] = _hook_default(Duration, "hooks.epilog_gate_wait")
    controller_timeout: Annotated[
        PositiveDuration,
        msgspec.Meta(
            description="How long the head-node EpilogSlurmctld hook waits for the controller "
            "before spooling its event to controller.spool_dir."
        ),
    ] = _hook_default(PositiveDuration, "hooks.controller_timeout")
    job_dir: Annotated[
        JobDir,
        msgspec.Meta(
            description="Where the prolog gives each job a directory of its own on each node, "
            "<job_dir>/<job id>, owned by the job user, for its progress file and NCCL "
            "flight-recorder dumps; the sidecar reads and then removes it. {node} is replaced "
            "by the node name. Local disk."
        ),
    ] = _hook_default(JobDir, "hooks.job_dir")
    nhc: Annotated[
        OptionalPath,
        msgspec.Meta(
            description="The site's health check the prolog's health gate runs at each job "
            'start (LBNL NHC: "/usr/sbin/nhc"); a failure refuses the node like a fatal GPU '
            'finding (act mode only). "": not run. A path that is absent on a node is skipped '
            "there, with a line in syslog."
        ),
    ] = _hook_default(OptionalPath, "hooks.nhc")
    nhc_timeout: Annotated[
        PositiveDuration,
        msgspec.Meta(
            description="How long the health gate lets hooks.nhc run; then it is killed and "
            "the job starts (fails open)."
        ),
    ] = _hook_default(PositiveDuration, "hooks.nhc_timeout")


class ConfigFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """What the file may hold: its sections."""

    cluster: ClusterConfig = ClusterConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    store: StoreConfig = StoreConfig()
    log: LogConfig = LogConfig()
    controller: ControllerConfig = ControllerConfig()
    auth: AuthConfig = AuthConfig()
    watchdog: WatchdogConfig = WatchdogConfig()
    client: ClientConfig = ClientConfig()
    sidecar: SidecarConfig = SidecarConfig()
    hooks: HooksConfig = HooksConfig()


class Config(ConfigFile, frozen=True, kw_only=True):
    """The settings in force; ``source`` is the file they came from (None: all defaults)."""

    source: Path | None = None

    def asdict(self) -> dict[str, Any]:
        """Section -> key -> value, then ``"source"``: what ``srecovery config check`` prints."""
        sections = {name: msgspec.structs.asdict(getattr(self, name)) for name in SECTIONS}
        return {**sections, "source": self.source}


#: Section name -> the Struct holding its keys (field names are the key names).
_FILE_DEFAULTS = ConfigFile()
SECTIONS: Mapping[str, type[_Section]] = MappingProxyType(
    {name: type(getattr(_FILE_DEFAULTS, name)) for name in ConfigFile.__struct_fields__}
)

#: The value the program uses for each key ("scheduler.command_timeout" -> 15.0) when unset.
DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        f"{section}.{name}": getattr(getattr(_FILE_DEFAULTS, section), name)
        for section, struct in SECTIONS.items()
        for name in struct.__struct_fields__
    }
)


@dataclass(frozen=True)
class Key:
    """One setting as docs present it: where it lives, its type, default and meaning."""

    section: str
    name: str
    type: str  # as an admin reads it in docs/configuration.md
    default: Any  # the value the program uses when the file does not set it
    doc: str

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"


@functools.cache
def _keys() -> tuple[Key, ...]:
    keys = []
    for section, struct in SECTIONS.items():
        for name, (label, doc) in field_docs(struct).items():
            keys.append(Key(section, name, label, DEFAULTS[f"{section}.{name}"], doc))
    return tuple(keys)


def __getattr__(name: str) -> Any:
    """``KEYS``: every setting there is, for docs and tests (docs/configuration.md and
    etc/config.toml document each one). Built on first use: resolving the annotations for
    their labels costs milliseconds that the daemons' start-up need not pay."""
    if name == "KEYS":
        return _keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        text, data = read_toml(file, check_stat=_refuse_if_others_can_write)
    except FileNotFoundError:
        if named_by is None:
            return _apply_env(Config(), env)
        raise ConfigError(
            f"{file}: no such file (named by {named_by}); check the path, or create the file "
            "(docs/configuration.md lists every key)"
        ) from None
    return _apply_env(_build(data, file, text), env)


def _refuse_if_others_can_write(file: str, st: os.stat_result) -> None:
    try:
        hook.refuse_if_others_can_write(file, st)
    except hook.SettingsError as exc:
        raise ConfigError(str(exc)) from None


def _apply_env(loaded: Config, env: Mapping[str, str]) -> Config:
    """``$SRECOVERY_URL``, when set and not empty, replaces ``client.url``."""
    url = env.get(URL_ENV_VAR)
    if not url:
        return loaded
    try:
        checked = Url.check(url)
    except ValueError as exc:
        raise ConfigError(
            f"${URL_ENV_VAR} = {url!r}: {exc}; or unset it to use client.url from the config file"
        ) from None
    client = msgspec.structs.replace(loaded.client, url=checked)
    return msgspec.structs.replace(loaded, client=client)


def config_from_toml(text: str, source: str | os.PathLike[str] | None = None) -> Config:
    """Parse and check ``text``, the contents of the file ``source`` (named in every error)."""
    data = parse_toml(text, source or "config")
    return _build(data, Path(source) if source is not None else None, text)


def config_from_dict(
    data: Mapping[str, Any], source: str | os.PathLike[str] | None = None
) -> Config:
    """Check ``data`` (parsed TOML: section -> key -> value) and build the :class:`Config`.

    ``source`` names the file in error messages and becomes ``Config.source``.
    """
    return _build(data, Path(source) if source is not None else None, None)


def _build(data: Mapping[str, Any], path: Path | None, text: str | None) -> Config:
    label = str(path) if path is not None else "config"
    loaded = convert(dict(data), ConfigFile, source=label, text=text, suggest=_suggest_key)
    controller = loaded.controller
    if bool(controller.tls_cert) != bool(controller.tls_key):
        line = find_line(text, ("controller", "tls_cert" if controller.tls_cert else "tls_key"))
        where = f"{label}:{line}" if line is not None else label
        raise ConfigError(
            f"{where}: controller.tls_cert and controller.tls_key go together: set both (TLS) "
            "or neither (plain HTTP)"
        )
    sections = {name: getattr(loaded, name) for name in SECTIONS}
    return Config(**sections, source=path)


def _suggest_key(table: KeyPath, name: str, fields: Sequence[str]) -> str:
    return suggest_key(table, name, fields, keys=DEFAULTS, tables=SECTIONS)
