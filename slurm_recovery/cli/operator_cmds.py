"""``srecovery status``, ``srecovery mode``, ``srecovery drain`` and ``srecovery undrain``.

``status`` reads (any user); the others are operator actions, signed as operator, carried out
and audited by the controller. Changes ask for confirmation unless ``--yes``, and refuse to
run without a terminal to ask on (exit 2). Exit codes as in cli/common.py.
"""

from __future__ import annotations

import os
import pwd
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import click

from slurm_recovery.cli.common import (
    EXIT_CHECK,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    client_for,
    explain_client_error,
    fail,
    json_option,
    print_json,
    table,
    when,
)
from slurm_recovery.config import Config
from slurm_recovery.contract import hostlist
from slurm_recovery.contract.client import ClientError, ControllerClient

T = TypeVar("T")

ACT_MEANS = (
    "act mode: from the controller's next pass, slurm-recovery changes Slurm for new incidents "
    "there: it drains nodes, holds, requeues and releases jobs, and cancels jobs the policy stops"
)
MONITOR_MEANS = (
    "monitor mode: from the controller's next pass, new incidents there get advice only; Slurm "
    "is not touched (incidents already being acted on finish their steps)"
)


# --------------------------------------------------------------------------------- helpers


def _config(ctx: click.Context) -> Config:
    from slurm_recovery.cli import load_or_exit

    return load_or_exit(ctx)


def _call(config: Config, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(...)``; a refusal becomes the message of common.explain_client_error (with the
    operator group this host's config names, for a 403) and its exit code."""
    try:
        return fn(*args, **kwargs)
    except ClientError as exc:
        message, code = explain_client_error(exc, config.client.url)
        if exc.status == 403:
            group = config.auth.operator_group
            message += (
                f". Here the operator group is {group!r} (auth.operator_group)"
                if group
                else ". No operator group is configured here (auth.operator_group is empty): "
                f"only root and the SlurmUser ({config.auth.slurm_user}) are operators"
            )
        fail(message, code)


def _post(config: Config, path: str, payload: dict[str, Any]) -> Any:
    import json

    body = json.dumps(payload, separators=(",", ":")).encode()
    client: ControllerClient = client_for(config)
    return _call(config, client.request, "POST", path, body, role="operator")


def _interactive() -> bool:
    """Whether there is someone to ask: standard input is a terminal."""
    return sys.stdin.isatty()


def _need_terminal(yes: bool, what: str) -> None:
    if not yes and not _interactive():
        fail(
            f"{what} needs a confirmation and there is no terminal to ask on: pass --yes to "
            "do it without asking",
            EXIT_USAGE,
        )


def _confirm(question: str) -> None:
    if not click.confirm(question, default=False):
        fail("nothing changed", EXIT_FAILED)


def _ago(iso: str | None, now: float | None = None) -> str:
    """``12s ago``, ``3min 5s ago``, ``2h 4min ago``, ``3 days ago``; ``never`` for none."""
    if not iso:
        return "never"
    try:
        then = datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return iso
    delta = max(0.0, (time.time() if now is None else now) - then)
    if delta < 10:
        text = f"{delta:.1f}s"
    elif delta < 60:
        text = f"{delta:.0f}s"
    elif delta < 3600:
        text = f"{int(delta // 60)}min {int(delta % 60)}s"
    elif delta < 86400:
        text = f"{int(delta // 3600)}h {int(delta % 3600 // 60)}min"
    else:
        text = f"{int(delta // 86400)} days"
    return f"{text} ago"


def _stamp(iso: str | None) -> str:
    """A local date and time for the status lines: ``2026-11-29 13:47:56``."""
    if not iso:
        return "-"
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    except ValueError:
        return iso


def _keys(pairs: list[tuple[str, str]]) -> None:
    """Aligned ``key: value`` lines, as systemctl status prints them."""
    width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        click.echo(f"{key:>{width + 2}}: {value}")


def _counts(block: dict[str, Any]) -> str:
    if not block["total"]:
        return "0"
    by_class = ", ".join(f"{k} {v}" for k, v in block["by_class"].items())
    by_kind = ", ".join(f"{k} {v}" for k, v in block["by_kind"].items())
    return f"{block['total']} ({by_class}; {by_kind})"


def _source(entry: dict[str, Any]) -> str:
    if entry["source"] == "override":
        text = f"override by {entry['set_by']}, {when(entry['set_at'])}"
        if entry.get("reason"):
            text += f": {entry['reason']}"
        return text
    return "policy file"


def _mode_rows(modes: dict[str, Any]) -> list[list[str]]:
    rows = [["(default)", modes["default"]["mode"], _source(modes["default"])]]
    for name, entry in modes["partitions"].items():
        source = "follows the default" if entry.get("inherits_default") else _source(entry)
        rows.append([name, entry["mode"], source])
    return rows


def _my_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid{os.getuid()}"


# --------------------------------------------------------------------------------- status


@click.command("status")
@json_option
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Is the controller running, in which mode, and what needs attention (like systemctl
    status). Exit 0 active, 5 degraded, 3 unreachable."""
    config = _config(ctx)
    client = client_for(config)
    try:
        info = client.get("/v1/status")
    except ClientError as exc:
        message, code = explain_client_error(exc, config.client.url)
        if code == EXIT_UNREACHABLE and not as_json:
            dot = click.style("●", fg="red")
            click.echo(f"{dot} slurm-recovery controller: unreachable ({config.client.url})")
        fail(message, code)
    if as_json:
        print_json(info)
        ctx.exit(EXIT_OK if info["state"] == "active" else EXIT_CHECK)
    _print_status(info)
    ctx.exit(EXIT_OK if info["state"] == "active" else EXIT_CHECK)


def _print_status(info: dict[str, Any]) -> None:
    active = info["state"] == "active"
    dot = click.style("●", fg="green" if active else "yellow")
    click.echo(f"{dot} slurm-recovery controller: {info['state']} on cluster {info['cluster']}")
    watchdog = info["watchdog"]
    released = watchdog["released_total"]
    wd = {
        "ok": f"ok, last run {when(watchdog['last_run'])} ({_ago(watchdog['last_run'])})",
        "stale": f"STALE: last run {_stamp(watchdog['last_run'])} ({_ago(watchdog['last_run'])})"
        " - is `srecovery watchdog` running?",
        "never": "never ran (no heartbeat in watchdog.spool_dir) - is `srecovery watchdog` "
        "running?",
    }[watchdog["state"]]
    wd += f"; {released} job{'s' if released != 1 else ''} released in all"
    pairs = [
        ("Version", info["version"]),
        ("Auth", info["auth"]),
        ("Started", f"{_stamp(info['started_at'])}; {_ago(info['started_at'])}"),
        (
            "Last pass",
            f"{_stamp(info['last_pass'])}; {_ago(info['last_pass'])}"
            if info["last_pass"]
            else "none yet",
        ),
        ("Last error", info["last_error"] or "-"),
        ("Slurm", "reachable" if info["slurm_reachable"] else "UNREACHABLE"),
        ("Watchdog", wd),
        ("Drained", hostlist.compress(info["drained_by_tool"]) or "-"),
    ]
    if "drained_by_operator" in info:
        pairs.append(
            ("Drained by ops", hostlist.compress(info["drained_by_operator"]) or "-"),
        )
    pairs += [
        ("Excluded", hostlist.compress(info["excluded_by_tool"]) or "-"),
        ("Last hour", _counts(info["incidents"]["last_hour"])),
        ("Last day", _counts(info["incidents"]["last_day"])),
    ]
    _keys(pairs)

    click.echo("\nModes (`srecovery mode`):")
    table(["PARTITION", "MODE", "SOURCE"], _mode_rows(info["modes"]))

    click.echo(f"\nIn flight: {len(info['in_flight']) or 'none'}")
    if info["in_flight"]:
        table(
            ["INCIDENT", "JOB", "KIND", "ACTION", "MILESTONE", "SINCE"],
            [
                [f["incident"], f["job_id"], f["kind"], f["action"], f["milestone"],
                 f"{when(f['since'])} ({_ago(f['since'])})"]
                for f in info["in_flight"]
            ],
        )  # fmt: skip

    needs = info["needs_operator"]
    click.echo(f"\nNeeds an operator (last day): {len(needs) or 'none'}")
    if needs:
        table(
            ["INCIDENT", "JOB", "REASON"],
            [[n["incident"], n["job_id"], n["reason"]] for n in needs],
        )

    stuck = info.get("unplaceable") or []  # absent from a controller older than this CLI
    click.echo(f"\nCannot run (needs an operator): {len(stuck) or 'none'}")
    if stuck:
        table(
            ["JOB", "INCIDENT", "REASON"],
            [[s["job_id"], s["incident"] or "-", s["reason"]] for s in stuck],
        )

    errors = info["errors"]
    click.echo(f"\nLast errors: {'none' if not errors else ''}".rstrip())
    for error in errors:
        click.echo(f"  {when(error['at'])} {error['level']:<8} {error['message']}")


# --------------------------------------------------------------------------------- mode


def _scope(partition: str | None) -> str:
    return "the default mode" if partition is None else f"partition {partition}"


@click.command("mode")
@click.argument("mode", required=False, type=click.Choice(["monitor", "act"]))
@click.option("--partition", "-p", help="One partition (default: the default mode).")
@click.option("--reason", help="Why, for the audit trail and `srecovery status`.")
@click.option("--clear", is_flag=True, help="Remove the override: back to the policy file.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
@click.pass_context
def mode(
    ctx: click.Context,
    mode: str | None,
    partition: str | None,
    reason: str | None,
    clear: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Show the modes, or switch the default or a partition to monitor or act (operators).

    \b
    srecovery mode                                 every partition's mode and where it comes from
    srecovery mode act --partition gpu --reason "trial week"
    srecovery mode monitor                         the default (partitions without their own)
    srecovery mode --clear --partition gpu         back to the policy file for gpu

    The change is an override kept by the controller (audited); the policy file is not
    rewritten. The Prolog health gate reads the policy file on the nodes and does not see
    overrides (docs/policy.md).
    """
    config = _config(ctx)
    if mode and clear:
        fail("give a mode or --clear, not both", EXIT_USAGE)
    if not mode and not clear:
        if reason or yes:
            fail("--reason and --yes go with a mode (monitor or act) or --clear", EXIT_USAGE)
        result = _call(config, client_for(config).get, "/v1/mode")
        if as_json:
            print_json(result)
            return
        table(["PARTITION", "MODE", "SOURCE"], _mode_rows(result["modes"]))
        return
    what = "clearing a mode override" if clear else "changing the mode"
    _need_terminal(yes, what)
    payload: dict[str, Any] = {"partition": partition, "reason": reason or ""}
    payload.update({"clear": True} if clear else {"mode": mode})
    if not yes:
        preview = _post(config, "/v1/mode", {**payload, "dry_run": True})
        _describe_change(preview)
        _confirm("Proceed?")
    result = _post(config, "/v1/mode", payload)
    if as_json:
        print_json(result)
        return
    scope = _scope(result["partition"])
    if clear and not result["had_override"]:
        click.echo(f"{scope}: there was no override; it is {result['mode']} (policy file)")
    elif clear:
        click.echo(f"{scope}: override cleared; {result['previous']} -> {result['mode']} "
                   "(policy file)")  # fmt: skip
    else:
        click.echo(f"{scope}: {result['previous']} -> {result['mode']} (override)")
    _print_changes(result)
    click.echo("Effective modes from the controller's next pass:")
    table(["PARTITION", "MODE", "SOURCE"], _mode_rows(result["modes"]))


def _print_changes(result: dict[str, Any]) -> None:
    changes = result["changes"]
    if not changes:
        click.echo("No partition's mode changes.")
        return
    for change in changes:
        name = "(default)" if change["partition"] is None else change["partition"]
        click.echo(f"  {name}: {change['from']} -> {change['to']}")
    targets = {c["to"] for c in changes}
    for target in sorted(targets):
        click.echo(ACT_MEANS if target == "act" else MONITOR_MEANS)


def _describe_change(preview: dict[str, Any]) -> None:
    scope = _scope(preview["partition"])
    if preview["cleared"]:
        if not preview["had_override"]:
            click.echo(f"{scope} has no override: nothing to clear.")
        else:
            click.echo(
                f"Clear the override of {scope}: back to the policy file "
                f"({preview['policy']}): {preview['previous']} -> {preview['mode']}"
            )
    else:
        click.echo(f"Set {scope} to {preview['mode']} (was {preview['previous']}), as an override")
    if preview["partition"] is None:
        own = [
            name
            for name, entry in preview["modes"]["partitions"].items()
            if not entry.get("inherits_default")
        ]
        if own:
            click.echo(
                f"Partitions with their own mode are not affected: {', '.join(own)} "
                "(use --partition)"
            )
    _print_changes(preview)


# --------------------------------------------------------------------------------- drain


def _expand_or_exit(nodes: tuple[str, ...]) -> list[str]:
    names: list[str] = []
    for expr in nodes:
        try:
            expanded = hostlist.expand(expr)
        except hostlist.HostlistError as exc:
            fail(str(exc), EXIT_USAGE)
        if not expanded:
            fail(f"{expr!r} names no node", EXIT_USAGE)
        names.extend(n for n in expanded if n not in names)
    return names


def _node_exit(result: dict[str, Any], failed: set[str]) -> int:
    if not result["slurm_reachable"]:
        return EXIT_UNREACHABLE
    return EXIT_FAILED if any(n["result"] in failed for n in result["nodes"]) else EXIT_OK


@click.command("drain")
@click.argument("nodes", nargs=-1, required=True)
@click.option("--reason", required=True, help="Why (shown in `sinfo -R` and the audit trail).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
@click.pass_context
def drain(
    ctx: click.Context, nodes: tuple[str, ...], reason: str, yes: bool, as_json: bool
) -> None:
    """Drain nodes through the controller, audited (operators).

    NODE...: names or host lists like n[1-3]. Running jobs go on; no new job starts
    there. The Slurm reason reads `srecovery-op:<you>: <reason>`. A node already drained
    keeps its reason.
    """
    config = _config(ctx)
    names = _expand_or_exit(nodes)
    if not reason.strip():
        fail("--reason must say why", EXIT_USAGE)
    _need_terminal(yes, "draining nodes")
    if not yes:
        click.echo(
            f"Drain {hostlist.compress(names)} ({len(names)} node{'s' if len(names) > 1 else ''})"
            f" with the reason 'srecovery-op:{_my_name()}: {' '.join(reason.split())}'.\n"
            "Jobs running there go on; no new job starts there until `srecovery undrain`."
        )
        _confirm("Proceed?")
    result = _post(config, "/v1/drain", {"nodes": list(nodes), "reason": reason})
    if as_json:
        print_json(result)
    else:
        table(
            ["NODE", "RESULT", "REASON"],
            [
                [
                    n["node"],
                    n["result"].replace("_", " "),
                    n["reason"] if n["result"] != "failed" else n["message"],
                ]
                for n in result["nodes"]
            ],
        )
        if not result["slurm_reachable"]:
            click.echo("srecovery: slurmctld did not answer the controller", err=True)
    ctx.exit(_node_exit(result, {"failed"}))


@click.command("undrain")
@click.argument("nodes", nargs=-1, required=True)
@click.option(
    "--force",
    is_flag=True,
    help="Also resume nodes someone else drained (not through slurm-recovery).",
)
@json_option
@click.pass_context
def undrain(ctx: click.Context, nodes: tuple[str, ...], force: bool, as_json: bool) -> None:
    """Resume nodes slurm-recovery drained, audited (operators).

    NODE...: names or host lists like n[1-3], drained by an operator's `srecovery drain` or by
    the controller itself. A node drained by anyone else is refused, and nothing is resumed,
    unless --force. A node not drained is left as it is."""
    config = _config(ctx)
    _expand_or_exit(nodes)
    result = _post(config, "/v1/undrain", {"nodes": list(nodes), "force": force})
    if as_json:
        print_json(result)
    else:
        rows = []
        for n in result["nodes"]:
            was = (
                f"drained by {n['drained_by']}: {n['previous_reason'] or '(no reason)'}"
                if n["drained_by"]
                else "-"
            )
            rows.append([n["node"], n["result"].replace("_", " "), n["message"] or was])
        table(["NODE", "RESULT", "WAS"], rows)
        if not result["slurm_reachable"]:
            click.echo("srecovery: slurmctld did not answer the controller", err=True)
    ctx.exit(_node_exit(result, {"failed"}))


#: The commands this module adds to ``srecovery``.
COMMANDS: list[click.Command] = [status, mode, drain, undrain]
