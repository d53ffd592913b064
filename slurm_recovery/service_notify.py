"""systemd integration without dependencies: ``sd_notify`` and a journald log handler.

**sd_notify.** With ``Type=notify`` systemd sets ``NOTIFY_SOCKET`` (a path, or ``@name`` for an
abstract socket) and waits for ``READY=1`` before it calls the unit started. :func:`ready`,
:func:`status`, :func:`watchdog_ping` and :func:`stopping` send one datagram each; without
``NOTIFY_SOCKET`` (a terminal, the dev stack, the tests) they do nothing and return False.
They never raise: a lost notification must not take a daemon down.

**journald.** Under systemd, a service's stderr is usually the journal, and systemd says so in
``JOURNAL_STREAM`` (``DEVICE:INODE`` of that stream). :func:`log_handler` then returns a
:class:`JournalHandler`, which sends each record to journald's native socket as structured
fields (``MESSAGE``, ``PRIORITY``, ``SYSLOG_IDENTIFIER``, ``CODE_FILE``/``CODE_LINE``/
``CODE_FUNC``, and ``SRECOVERY_JOB``/``SRECOVERY_NODE``/``SRECOVERY_INCIDENT`` when the record
carries them: ``log.info("...", extra={"srecovery_job": 41})``), so that
``journalctl SRECOVERY_JOB=41`` finds them. Otherwise it returns a plain stderr handler.

Protocol references: sd_notify(3), systemd.exec(5) (``$JOURNAL_STREAM``, ``$WATCHDOG_USEC``),
and systemd's "Native Journal Protocol" document.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import logging
import os
import re
import socket
import struct
import sys
import traceback
from collections.abc import Iterable, Mapping

#: journald's native protocol socket.
JOURNAL_SOCKET = "/run/systemd/journal/socket"

#: Record attributes (set with ``extra=``) copied into journal fields, upper-cased:
#: ``srecovery_job`` -> ``SRECOVERY_JOB``. Any other ``srecovery_*`` attribute is copied too.
EXTRA_PREFIX = "srecovery_"

#: logging level -> syslog priority (journald's PRIORITY field).
_PRIORITY = (
    (logging.CRITICAL, 2),
    (logging.ERROR, 3),
    (logging.WARNING, 4),
    (logging.INFO, 6),
)

#: A journal field name: upper-case letters, digits and underscores, not starting with an
#: underscore (those are trusted fields journald adds itself), at most 64 characters.
_FIELD_NAME = re.compile(r"[A-Z0-9][A-Z0-9_]{0,63}")


# --------------------------------------------------------------------------------- sd_notify


def _address(env: Mapping[str, str]) -> str | None:
    """The socket address named by ``NOTIFY_SOCKET``: a path, or ``@name`` -> ``\\0name``."""
    name = env.get("NOTIFY_SOCKET", "")
    if not name:
        return None
    if name.startswith("@"):  # an abstract socket: a leading NUL byte instead of the '@'
        return "\0" + name[1:]
    if not name.startswith("/"):  # vsock:... and other forms are not supported: no-op
        return None
    return name


def notify(*assignments: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``VAR=value`` lines as one datagram to ``$NOTIFY_SOCKET``; True if sent.

    A no-op (False) when ``NOTIFY_SOCKET`` is unset or unusable; never raises.
    """
    address = _address(os.environ if env is None else env)
    if address is None or not assignments:
        return False
    payload = "\n".join(assignments).encode("utf-8", "replace")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(payload)
    except OSError:
        return False
    return True


def ready(status_text: str | None = None) -> bool:
    """``READY=1``: start-up is finished (``Type=notify``), with an optional ``STATUS=``."""
    lines = ["READY=1"]
    if status_text:
        lines.append(_status_line(status_text))
    return notify(*lines)


def status(text: str) -> bool:
    """``STATUS=text``: one line shown by ``systemctl status``."""
    return notify(_status_line(text))


def stopping(status_text: str | None = None) -> bool:
    """``STOPPING=1``: the service is shutting down."""
    lines = ["STOPPING=1"]
    if status_text:
        lines.append(_status_line(status_text))
    return notify(*lines)


def watchdog_enabled(env: Mapping[str, str] | None = None) -> bool:
    """True when systemd expects ``WATCHDOG=1`` pings from this process (``WatchdogSec=``)."""
    env = os.environ if env is None else env
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return False
    pid = env.get("WATCHDOG_PID", "")
    return usec > 0 and (not pid or pid == str(os.getpid()))


def watchdog_ping() -> bool:
    """``WATCHDOG=1`` when the watchdog is enabled for this process; else nothing."""
    return watchdog_enabled() and notify("WATCHDOG=1")


def _status_line(text: str) -> str:
    return "STATUS=" + " ".join(str(text).split())  # one line: the protocol is line-based


# --------------------------------------------------------------------------------- journald


def encode_fields(fields: Iterable[tuple[str, object]]) -> bytes:
    """Journal native protocol: ``NAME=value\\n``, or, for a value holding a newline (or any
    binary data), ``NAME\\n`` + its length as 64-bit little-endian + the bytes + ``\\n``."""
    out = bytearray()
    for name, value in fields:
        if not _FIELD_NAME.fullmatch(name):
            raise ValueError(f"not a journal field name: {name!r}")
        data = value if isinstance(value, bytes) else str(value).encode("utf-8", "replace")
        if b"\n" in data:
            out += name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name.encode() + b"=" + data + b"\n"
    return bytes(out)


def syslog_priority(levelno: int) -> int:
    for level, priority in _PRIORITY:
        if levelno >= level:
            return priority
    return 7  # debug


def _field_name(attribute: str) -> str | None:
    name = re.sub(r"[^A-Z0-9_]", "_", attribute.upper())
    return name if _FIELD_NAME.fullmatch(name) else None


class JournalHandler(logging.Handler):
    """Sends each record to journald's native socket as structured fields.

    If a send fails (journald restarting, the socket gone) the record goes to stderr instead:
    systemd connects stderr to the journal too, so it is not lost, only less structured.
    """

    def __init__(
        self,
        identifier: str,
        *,
        socket_path: str = JOURNAL_SOCKET,
        level: int = logging.NOTSET,
    ) -> None:
        super().__init__(level)
        self.identifier = identifier
        self.socket_path = socket_path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._fallback = logging.StreamHandler(sys.stderr)

    def setFormatter(self, fmt: logging.Formatter | None) -> None:
        super().setFormatter(fmt)
        self._fallback.setFormatter(fmt)

    def fields(self, record: logging.LogRecord) -> list[tuple[str, object]]:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        elif record.exc_text:
            message += "\n" + record.exc_text
        fields: list[tuple[str, object]] = [
            ("MESSAGE", message),
            ("PRIORITY", syslog_priority(record.levelno)),
            ("SYSLOG_IDENTIFIER", self.identifier),
            ("CODE_FILE", record.pathname),
            ("CODE_LINE", record.lineno),
            ("CODE_FUNC", record.funcName),
            ("LOGGER", record.name),
            ("THREAD_NAME", record.threadName),
        ]
        for attribute, value in vars(record).items():
            if attribute.startswith(EXTRA_PREFIX) and value is not None:
                name = _field_name(attribute)
                if name:
                    fields.append((name, value))
        return fields

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = encode_fields(self.fields(record))
        except Exception:
            self.handleError(record)
            return
        try:
            self._send(data)
        except OSError:
            self._fallback.handle(record)

    def _send(self, data: bytes) -> None:
        try:
            self._sock.sendto(data, self.socket_path)
        except OSError as exc:
            if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):  # too big for one datagram
                raise
            # Large entries: journald takes a sealed memfd holding the same bytes.
            fd = os.memfd_create("srecovery-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.write(fd, data)
                seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals | fcntl.F_SEAL_SEAL)
                rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))
                self._sock.sendmsg([], [rights], 0, self.socket_path)
            finally:
                os.close(fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()
        super().close()


def journal_stream_is_stderr(env: Mapping[str, str] | None = None) -> bool:
    """True when ``$JOURNAL_STREAM`` names this process's stderr (systemd.exec(5))."""
    env = os.environ if env is None else env
    value = env.get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    if not device or not inode:
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
        return (st.st_dev, st.st_ino) == (int(device), int(inode))
    except (OSError, ValueError, AttributeError):
        return False


def log_handler(
    identifier: str,
    fmt: str,
    *,
    env: Mapping[str, str] | None = None,
    socket_path: str = JOURNAL_SOCKET,
) -> logging.Handler:
    """A :class:`JournalHandler` when stderr is the journal and its socket exists, else a
    stderr handler with ``fmt``."""
    handler: logging.Handler
    if journal_stream_is_stderr(env) and os.path.exists(socket_path):
        handler = JournalHandler(identifier, socket_path=socket_path)
        handler.setFormatter(logging.Formatter(fmt))  # used only by the stderr fallback
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(fmt))
    return handler
