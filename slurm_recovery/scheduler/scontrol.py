"""Scheduler backend over Slurm's command-line tools (squeue/sinfo/scontrol --json, scancel).

Works on Slurm 22.05 to 25.11 (``scheduler.slurmjson`` reads each release's JSON; which
command lists nodes depends on the release) and is what the tests run on, on 22.05 and 24.11.
Commands are argv lists, never shell strings: job names, reasons and node names from
anywhere reach Slurm as single arguments. Every call is bounded by ``timeout``; a
slurmctld that does not answer within it raises :class:`Unreachable`.
"""

from __future__ import annotations

import json
import locale
import os
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from slurm_recovery.contract import hostlist
from slurm_recovery.scheduler import nodetext
from slurm_recovery.scheduler.base import (
    InvalidRequest,
    Job,
    Node,
    SchedulerError,
    SchedulerSteps,
    UnknownJob,
    UnknownNode,
    Unreachable,
    UnsupportedOutput,
    slurm_time,
)
from slurm_recovery.scheduler.errors import slurm_error
from slurm_recovery.scheduler.slurmjson import jobs_from_json, nodes_from_json

# Slurm 22.05 reports "Unspecified error" in --json output, and scontrol sometimes an
# unrelated message, when slurmctld is down; a ping tells the two cases apart.
_VAGUE = ("Unspecified error", "Unexpected message received")


def _text(output: bytes) -> str:
    """A command's output as ``subprocess.run(text=True)`` gives it: the locale's encoding
    (UTF-8 where Slurm runs), newlines made ``\\n``; a byte that is not text is replaced."""
    text = output.decode(locale.getpreferredencoding(False), "replace")
    if "\r" not in text:  # one scan; each replace is a scan and a copy (5 MB at 10,000 nodes)
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


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
        self._client: tuple[int, int] | None = None
        self._node_lines = nodetext.NodeLines()

    # --- plumbing ----------------------------------------------------------------------

    def _argv(self, argv: Sequence[str]) -> list[str]:
        if self.bin_dir:
            return [str(Path(self.bin_dir) / argv[0]), *argv[1:]]
        return list(argv)

    def _run(self, argv: Sequence[str], env: dict[str, str] | None = None) -> str:
        """Run one Slurm command (``env``: variables to add); Slurm's refusal becomes the
        matching typed error."""
        command = " ".join(argv)
        # stdout goes to a file in memory, read in one call once the command has ended: a
        # pipe is read 32 KiB at a time, each read taking the GIL again, and at 10,000 nodes
        # (5 MB a second) that cost the controller's other threads 25 ms a second of waits.
        with os.fdopen(os.memfd_create("srecovery-slurm-out", os.MFD_CLOEXEC), "w+b") as out:
            try:
                proc = subprocess.run(
                    self._argv(argv),
                    env={**self.env, **env} if env else self.env,
                    stdout=out,
                    stderr=subprocess.PIPE,
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
            out.seek(0)
            stdout = _text(out.read())
        if proc.returncode != 0:
            message = (_text(proc.stderr) or stdout).strip()
            raise self._error(message, command)
        return stdout

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

    def _document(self, argv: Sequence[str]) -> dict[str, Any]:
        """Run a ``--json`` command; Slurm's own ``errors`` become typed errors."""
        out = self._run(argv)
        command = " ".join(argv)
        try:
            data = json.loads(out)
        except json.JSONDecodeError as exc:
            raise SchedulerError(f"`{command}` printed invalid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise UnsupportedOutput(f"`{command}` printed {type(data).__name__}", "unknown")
        errors = data.get("errors") or []
        if errors:
            first = errors[0]
            message = first.get("description") or first.get("error") or str(first)
            if first.get("error") and first.get("error") not in message:
                message = f"{message}: {first['error']}"
            errno = first.get("error_number", first.get("errno"))
            raise self._error(message, command, errno if errno and errno > 0 else None)
        return data

    def client_release(self) -> tuple[int, int]:
        """(major, minor) of the Slurm commands we run (``scontrol --version``): which JSON
        commands exist depends on it (no ``scontrol --json`` before 23.02)."""
        if self._client is None:
            out = self._run(["scontrol", "--version"]).split()
            try:
                major, minor = (int(p) for p in out[-1].split(".")[:2])
            except (IndexError, ValueError):
                raise UnsupportedOutput(
                    f"`scontrol --version` printed {' '.join(out)!r}, not 'slurm X.Y.Z'",
                    "unknown",
                ) from None
            self._client = (major, minor)
        return self._client

    def _per_node_json(self) -> list[str]:
        """22.05: ``sinfo --json`` lists nodes; from 23.02 it groups them and per-node
        records come from ``scontrol show nodes --json``."""
        if self.client_release() < (23, 2):
            return ["sinfo", "--json"]
        return ["scontrol", "show", "nodes", "--json"]

    def show_config(self) -> dict[str, str]:
        """``scontrol show config`` as a dict (read once per scheduler object)."""
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
        return self.show_config().get("ClusterName", "")

    def version(self) -> str:
        return self.show_config().get("SLURM_VERSION", "")

    def list_jobs(self) -> list[Job]:
        # --states=all: from 24.05 --json shows only active jobs otherwise, and a FAILED job
        # (what crash detection looks for) would never be seen
        argv = ["squeue", "--all", "--states=all", "--json"]
        jobs = jobs_from_json(self._document(argv), " ".join(argv))
        self._remember(jobs)
        return jobs

    def get_job(self, job_id: int) -> Job:
        if self.client_release() >= (23, 2):
            argv = ["scontrol", "show", "job", str(job_id), "--json"]
        else:  # 22.05: squeue --json ignores job filters, and scontrol has no --json
            argv = ["squeue", "--all", "--json", f"--jobs={job_id}"]
        # An array's id lists every task (and the pending record): take the one whose own
        # id this is, never another task.
        jobs = jobs_from_json(self._document(argv), " ".join(argv))
        self._remember(jobs)
        for job in jobs:
            if job.job_id == job_id:
                return job
        raise self._missing(UnknownJob, ["scontrol", "show", "job", str(job_id)], f"job {job_id}")

    def list_nodes(self) -> list[Node]:
        """Every node, from ``scontrol -o show nodes`` (``scheduler.nodetext``: why not JSON);
        a line read before is not parsed again, and a line the text cannot say with certainty
        (free text after the reason) is read from the JSON."""
        return self._node_lines.read(self._run(nodetext.COMMAND, nodetext.ENV), self._nodes_json)

    def _nodes_json(self, names: Iterable[str]) -> dict[str, Node]:
        """``names``' records from the JSON listing (22.05: every node's, then picked)."""
        wanted = set(names)
        if self.client_release() >= (23, 2):
            argv = ["scontrol", "show", "node", hostlist.compress(sorted(wanted)), "--json"]
        else:  # 22.05: sinfo --json ignores a node filter
            argv = self._per_node_json()
        nodes = nodes_from_json(self._document(argv), " ".join(argv))
        return {node.name: node for node in nodes if node.name in wanted}

    def get_node(self, name: str) -> Node:
        if self.client_release() >= (23, 2):
            found = self._nodes_json([name])
        else:  # 22.05: its JSON lists every node; the text listing costs a tenth of it
            found = {node.name: node for node in self.list_nodes()}
        if name in found:
            return found[name]
        raise self._missing(UnknownNode, ["scontrol", "show", "node", name], f"node {name!r}")

    def query(self, argv: Sequence[str]) -> str:
        """Run a read-only Slurm command (``sacct``, ``sacctmgr``) through the same runner:
        bounded, and Slurm's refusal a typed error."""
        return self._run(argv)

    def _missing(self, cls: type[SchedulerError], argv: list[str], what: str) -> SchedulerError:
        """Not in the JSON listing: let Slurm say why, in its own words."""
        try:
            self._run(argv)
        except SchedulerError as exc:
            if isinstance(exc, Unreachable | cls):
                return exc
            return cls(f"{what} not found", slurm_message=exc.slurm_message, command=exc.command)
        return cls(f"{what} not found in the listing (it appeared just now: retry)")

    # --- steps: each names its job by :meth:`address` (``17_3``, never a bare array id) ---

    def requeue_hold(self, job_id: int) -> None:
        self._run(["scontrol", "requeuehold", self.address(job_id)])

    def _write_excluded_nodes(self, job_id: int, expr: str) -> None:
        self._run(["scontrol", "update", f"JobId={self.address(job_id)}", f"ExcNodeList={expr}"])

    def _write_begin_now(self, job_id: int, at: float | None) -> None:
        when = "now" if at is None else slurm_time(at)
        self._run(["scontrol", "update", f"JobId={self.address(job_id)}", f"StartTime={when}"])

    def release(self, job_id: int) -> None:
        self._run(["scontrol", "release", self.address(job_id)])

    def _write_admin_comment(self, job_id: int, comment: str) -> None:
        self._run(
            ["scontrol", "update", f"JobId={self.address(job_id)}", f"AdminComment={comment}"]
        )

    def _signal_cancel(self, job_id: int) -> None:
        self._run(["scancel", self.address(job_id)])

    def _write_node_state(self, name: str, state: str, reason: str | None) -> None:
        argv = ["scontrol", "update", f"NodeName={name}", f"State={state}"]
        if reason is not None:
            argv.append(f"Reason={reason}")
        self._run(argv)
