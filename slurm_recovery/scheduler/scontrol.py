"""Scheduler backend over Slurm's command-line tools (squeue/sinfo --json, scontrol, scancel).

Works on any Slurm since 21.08 (the first with ``--json``) and is what the tests run on.
Commands are argv lists, never shell strings: job names, reasons and node names from
anywhere reach Slurm as single arguments. Every call is bounded by ``timeout``; a
slurmctld that does not answer within it raises :class:`Unreachable`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_recovery import hostlist
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
)
from slurm_recovery.scheduler.errors import slurm_error
from slurm_recovery.scheduler.paths import expand_output_path

# Slurm 22.05 reports "Unspecified error" in --json output, and scontrol sometimes an
# unrelated message, when slurmctld is down; a ping tells the two cases apart.
_VAGUE = ("Unspecified error", "Unexpected message received")


def _number(value: Any, default: int = 0) -> int:
    """Slurm <= 22.05 gives plain ints; 23.02+ gives ``{"set": bool, "number": n}``."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return default
        value = value.get("number", default)
    if value is None:
        return default
    return int(value)


def _exit_code(value: Any) -> ExitCode:
    """A raw wait status (22.05) or ``{"return_code": .., "signal": ..}`` (23.02+)."""
    if isinstance(value, dict):
        signal = value.get("signal", {})
        return ExitCode(
            returncode=_number(value.get("return_code")),
            signal=_number(signal.get("id") if isinstance(signal, dict) else signal),
        )
    status = _number(value)
    return ExitCode(returncode=(status >> 8) & 0xFF, signal=status & 0x7F)


def _state(value: Any) -> tuple[str, frozenset[str]]:
    """``"RUNNING"``/``"mixed"`` (22.05) or ``["IDLE", "DRAIN"]`` (23.02+) -> base, flags."""
    if isinstance(value, list):
        names = [str(v).upper() for v in value]
        return (names[0] if names else "UNKNOWN"), frozenset(names[1:])
    return str(value).upper(), frozenset()


def job_from_json(data: dict[str, Any]) -> Job:
    """One element of ``squeue --json``'s ``jobs`` list."""
    state, _ = _state(data["job_state"])
    nodes = tuple(hostlist.expand(data.get("nodes") or ""))
    return Job(
        job_id=int(data["job_id"]),
        name=data.get("name", ""),
        state=state,
        reason=data.get("state_reason", "") or "",
        user=data.get("user_name", "") or "",
        partition=data.get("partition", "") or "",
        nodes=nodes,
        num_nodes=_number(data.get("node_count"), len(nodes)),
        submit_time=_number(data.get("submit_time")),
        restart_count=_number(data.get("restart_cnt")),
        excluded_nodes=frozenset(hostlist.expand(data.get("excluded_nodes") or "")),
        exit_code=_exit_code(data.get("exit_code")),
        held=_number(data.get("priority"), 1) == 0,
        begin_time=_number(data.get("eligible_time")),
        start_time=_number(data.get("start_time")),
        end_time=_number(data.get("end_time")),
        stdout_path=expand_output_path(
            data.get("standard_output") or "",
            job_id=int(data["job_id"]),
            name=data.get("name", ""),
            user=data.get("user_name", "") or "",
            workdir=data.get("current_working_directory", "") or "",
            batch_host=data.get("batch_host", "") or "",
            array_job_id=_number(data.get("array_job_id")),
            array_task_id=data.get("array_task_id"),
        ),
        admin_comment=data.get("admin_comment", "") or "",
        requeueable=bool(data.get("requeue", True)),
        required_nodes=frozenset(hostlist.expand(data.get("required_nodes") or "")),
    )


def node_from_json(data: dict[str, Any]) -> Node:
    """One element of ``sinfo --json``'s ``nodes`` list."""
    state, flags = _state(data["state"])
    flags |= frozenset(str(f).upper() for f in data.get("state_flags", []) or [])
    return Node(
        name=data["name"],
        state=state,
        flags=flags,
        reason=data.get("reason", "") or "",
        partitions=tuple(data.get("partitions", []) or []),
        address=data.get("address", "") or "",
        hostname=data.get("hostname", "") or "",
    )


class ScontrolScheduler(SchedulerSteps):
    """:class:`~slurm_recovery.scheduler.base.Scheduler` over squeue/sinfo/scontrol/scancel."""

    name = "scontrol"

    def __init__(self, *, timeout: float = 15.0, bin_dir: str = "", slurm_conf: str = "") -> None:
        self.timeout = timeout
        self.bin_dir = bin_dir
        self.env = dict(os.environ)
        if slurm_conf:
            self.env["SLURM_CONF"] = slurm_conf
        self._config: dict[str, str] | None = None

    # --- plumbing ----------------------------------------------------------------------

    def _argv(self, argv: Sequence[str]) -> list[str]:
        if self.bin_dir:
            return [str(Path(self.bin_dir) / argv[0]), *argv[1:]]
        return list(argv)

    def _run(self, argv: Sequence[str]) -> str:
        """Run one Slurm command; Slurm's refusal becomes the matching typed error."""
        command = " ".join(argv)
        try:
            proc = subprocess.run(
                self._argv(argv),
                env=self.env,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise Unreachable(
                f"{argv[0]} did not finish within {self.timeout:g}s", command=command
            ) from exc
        except FileNotFoundError as exc:
            raise SchedulerError(
                f"{argv[0]} not found (set scheduler.slurm_bin_dir)", command=command
            ) from exc
        if proc.returncode != 0:
            message = (proc.stderr or proc.stdout).strip()
            raise self._error(message, command)
        return proc.stdout

    def _error(self, message: str, command: str, errno: int | None = None) -> SchedulerError:
        error = slurm_error(f"`{command}`", message, errno=errno, command=command)
        if type(error) is InvalidRequest and any(v in message for v in _VAGUE) and self._down():
            return Unreachable(error.message, slurm_message=error.slurm_message, command=command)
        return error

    def _down(self) -> bool:
        try:
            proc = subprocess.run(
                self._argv(["scontrol", "ping"]),
                env=self.env,
                capture_output=True,
                text=True,
                timeout=self.timeout,
            )
        except subprocess.TimeoutExpired:
            return True
        return "DOWN" in proc.stdout

    def _json(self, argv: Sequence[str], key: str) -> list[dict[str, Any]]:
        out = self._run(argv)
        command = " ".join(argv)
        try:
            data = json.loads(out)
        except json.JSONDecodeError as exc:
            raise SchedulerError(f"`{command}` printed invalid JSON: {exc}") from exc
        errors = data.get("errors") or []
        if errors:
            first = errors[0]
            message = first.get("description") or first.get("error") or str(first)
            if first.get("error") and first.get("error") not in message:
                message = f"{message}: {first['error']}"
            errno = first.get("error_number", first.get("errno"))
            raise self._error(message, command, errno if errno and errno > 0 else None)
        return data.get(key, [])

    def _show_config(self) -> dict[str, str]:
        if self._config is None:
            config = {}
            for line in self._run(["scontrol", "show", "config"]).splitlines():
                key, sep, value = line.partition("=")
                if sep:
                    config[key.strip()] = value.strip()
            self._config = config
        return self._config

    # --- reads -------------------------------------------------------------------------

    def cluster_name(self) -> str:
        return self._show_config().get("ClusterName", "")

    def version(self) -> str:
        return self._show_config().get("SLURM_VERSION", "")

    def list_jobs(self) -> list[Job]:
        return [job_from_json(j) for j in self._json(["squeue", "--all", "--json"], "jobs")]

    def get_job(self, job_id: int) -> Job:
        # squeue --json ignores job filters on 22.05: read all and pick.
        for data in self._json(["squeue", "--all", "--json", f"--jobs={job_id}"], "jobs"):
            if int(data["job_id"]) == job_id:
                return job_from_json(data)
        raise self._missing(UnknownJob, ["scontrol", "show", "job", str(job_id)], f"job {job_id}")

    def list_nodes(self) -> list[Node]:
        return [node_from_json(n) for n in self._json(["sinfo", "--json"], "nodes")]

    def get_node(self, name: str) -> Node:
        for node in self.list_nodes():
            if node.name == name:
                return node
        raise self._missing(UnknownNode, ["scontrol", "show", "node", name], f"node {name!r}")

    def _missing(self, cls: type[SchedulerError], argv: list[str], what: str) -> SchedulerError:
        """Not in the JSON listing: let Slurm say why, in its own words."""
        try:
            self._run(argv)
        except SchedulerError as exc:
            if isinstance(exc, Unreachable | cls):
                return exc
            return cls(f"{what} not found", slurm_message=exc.slurm_message, command=exc.command)
        return cls(f"{what} not found in the listing (it appeared just now: retry)")

    # --- steps -------------------------------------------------------------------------

    def requeue_hold(self, job_id: int) -> None:
        self._run(["scontrol", "requeuehold", str(job_id)])

    def _write_excluded_nodes(self, job_id: int, expr: str) -> None:
        self._run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={expr}"])

    def _write_begin_now(self, job_id: int) -> None:
        self._run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])

    def release(self, job_id: int) -> None:
        self._run(["scontrol", "release", str(job_id)])

    def _write_admin_comment(self, job_id: int, comment: str) -> None:
        self._run(["scontrol", "update", f"JobId={job_id}", f"AdminComment={comment}"])

    def _signal_cancel(self, job_id: int) -> None:
        self._run(["scancel", str(job_id)])

    def _write_node_state(self, name: str, state: str, reason: str | None) -> None:
        argv = ["scontrol", "update", f"NodeName={name}", f"State={state}"]
        if reason is not None:
            argv.append(f"Reason={reason}")
        self._run(argv)
