"""What every ``srecovery`` command that talks to the controller shares: the client, errors that
say what to do, exit codes, ``--json``, ``--since`` and tables that fit the terminal.

Exit codes (docs/cli.md): 0 done, 1 failed or refused, 2 bad usage or configuration, 3 the
controller or slurmctld did not answer, 4 not allowed (authentication or authorization), 5 a
check found a problem (``srecovery audit verify``: the chain is broken).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import click

from slurm_recovery.config import Config, parse_duration
from slurm_recovery.contract.client import ClientError, ControllerClient

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_DENIED, EXIT_CHECK = 0, 1, 2, 3, 4, 5

T = TypeVar("T")


#: Characters that drive a terminal rather than show: C0 controls but tab and newline, DEL, C1
#: (ESC starts OSC/CSI sequences: window titles, screen clears), and bidi overrides.
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match[0])
    if code < 0x20:
        return f"^{chr(code + 64)}"  # caret notation, as `cat -v` shows them
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable_data(value: Any) -> Any:
    """Every string in a JSON-like ``value`` made :func:`printable`."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {k: printable_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_data(v) for v in value]
    return value


def printable(text: str) -> str:
    """``text`` safe to print on an admin's terminal: text that users control (job output,
    report reasons) cannot retitle or clear it; each control character shows visibly
    (ESC as ``^[``, BEL as ``^G``); tabs and newlines stay layout."""
    return _UNPRINTABLE.sub(_visible, text)


class PrintableStream:
    """stdout/stderr for the CLI: every write goes through :func:`printable`, so no command can
    forget to. Rich consoles that colour their own output write to :func:`raw_stream` instead,
    with the user's text in ``Text`` (never markup) and made printable first."""

    def __init__(self, stream: Any) -> None:
        self.raw = stream

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError("a text stream")  # so click writes text here, never bytes around it
        self.raw.write(printable(text))
        return len(text)

    def flush(self) -> None:
        self.raw.flush()

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.raw, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str:
        return getattr(self.raw, "errors", None) or "strict"


def printable_output() -> None:
    """Route this process's stdout and stderr through :class:`PrintableStream` (once)."""
    if not isinstance(sys.stdout, PrintableStream):
        sys.stdout = PrintableStream(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, PrintableStream):
        sys.stderr = PrintableStream(sys.stderr)  # type: ignore[assignment]


def raw_stream(stream: Any = None) -> Any:
    """The terminal under a :class:`PrintableStream`, for rich's own colours."""
    stream = sys.stdout if stream is None else stream
    return stream.raw if isinstance(stream, PrintableStream) else stream


def client_for(config: Config, insecure: bool = False) -> ControllerClient:
    return ControllerClient(
        config.client.url,
        munge_socket=config.auth.munge_socket or None,
        insecure=insecure,
        ca_file=config.client.ca_file or None,
    )


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    click.echo(f"srecovery: {message}", err=True)
    raise SystemExit(code)


def explain_client_error(exc: ClientError, url: str = "") -> tuple[str, int]:
    """The message and exit code for a refused or unanswered request: what happened and what
    to do about it."""
    where = f" at {url}" if url else ""
    if exc.status == 0:
        return (
            f"the controller{where} did not answer ({exc.reason}). Is it running? "
            "`systemctl status srecovery-controller` and `journalctl -u srecovery-controller` "
            "on the head node; the address is client.url in the config (or $SRECOVERY_URL)",
            EXIT_UNREACHABLE,
        )
    if exc.status == 401:
        return (
            f"the controller did not accept this request's credential ({exc.reason}). Is munged "
            "running here (`systemctl status munge`), with the same key as the head node, and "
            "is the clock right? auth.munge_socket in the config names the socket",
            EXIT_DENIED,
        )
    if exc.status == 403:
        return (
            f"not allowed: {exc.reason}. Operator commands need root, the SlurmUser or a member "
            "of auth.operator_group (docs/security.md)",
            EXIT_DENIED,
        )
    if exc.status == 404:
        return (f"not found: {exc.reason}", EXIT_FAILED)
    if exc.status == 503:
        return (f"the controller cannot serve this now: {exc.reason}; try again", EXIT_FAILED)
    return (f"the controller refused ({exc.status}): {exc.reason}", EXIT_FAILED)


def call(fn: Callable[..., T], *args: Any, url: str = "", **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``; a ClientError becomes a message on stderr and an exit code."""
    try:
        return fn(*args, **kwargs)
    except ClientError as exc:
        message, code = explain_client_error(exc, url)
        fail(message, code)


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: a duration back from now (``90s``, ``2h``, ``3d``, ``1w``, ``1h30m``) or a
    date/time (``2026-11-29``, ``2026-11-29T03:00``, ISO 8601; local time unless it says
    otherwise). Returns epoch seconds; ValueError with what is accepted."""
    now = time.time() if now is None else now
    value = text.strip()
    weeks = _RELATIVE.match(value)
    if weeks and weeks.group(2) in ("d", "w"):
        return now - float(weeks.group(1)) * (86400 if weeks.group(2) == "d" else 604800)
    try:
        return now - parse_duration(value)
    except (ValueError, TypeError):
        pass
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration (90s, 2h, 3d, 1w) nor a date (2026-11-29, "
            "2026-11-29T03:00)"
        ) from None
    return when.timestamp()


class SinceType(click.ParamType):
    name = "WHEN"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, float):
            return value
        try:
            return parse_since(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


SINCE = SinceType()


def when(iso: str | None) -> str:
    """An ISO time from the API as a short local time for tables (``-`` for none)."""
    if not iso:
        return "-"
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    local = moment.astimezone()
    if abs(time.time() - local.timestamp()) < 86400:
        return local.strftime("%H:%M:%S")
    return local.strftime("%Y-%m-%d %H:%M")


def seconds(value: float | None) -> str:
    """A latency for tables: ``850ms``, ``2.4s``, ``3m05s``."""
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 120:
        return f"{value:.1f}s"
    minutes, rest = divmod(int(value), 60)
    return f"{minutes}m{rest:02d}s"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str = "") -> None:
    """A table that fits the terminal (long columns wrap), like sinfo's: plain text without
    colour when stdout is not a terminal, so it pipes into grep and awk."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    grid = Table(
        title=title or None,
        box=None,
        header_style="bold" if sys.stdout.isatty() else "",
        pad_edge=False,
        show_edge=False,
    )
    for header in headers:
        grid.add_column(header, overflow="fold")
    for row in rows:
        # Text, never markup: "[bold]" in a user's words is shown, not obeyed
        grid.add_row(
            *(Text("-" if cell is None or cell == "" else printable(str(cell))) for cell in row)
        )
    console = Console(
        file=raw_stream(),
        markup=False,
        soft_wrap=False,
        highlight=False,
        no_color=not sys.stdout.isatty(),
        width=None if sys.stdout.isatty() else 200,
    )
    console.print(grid)


def now_iso() -> str:
    return datetime.now(UTC).isoformat()
