"""sd_notify and the journald handler against real AF_UNIX datagram sockets standing in for
systemd's notify socket and journald's native socket."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_recovery import service_notify
from slurm_recovery.sidecar.daemon import Sidecar


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # AF_UNIX paths are limited to 107 bytes: pytest's tmp_path can be longer
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sdn-", dir="/tmp") as d:
        yield Path(d)


def receiver(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    return sock


def received(sock: socket.socket) -> list[str]:
    """Every datagram waiting, decoded."""
    out = []
    sock.settimeout(0.2)
    while True:
        try:
            out.append(sock.recv(65536).decode())
        except TimeoutError:
            return out


@pytest.fixture
def notify_socket(sock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    path = str(sock_dir / "notify")
    sock = receiver(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield sock
    sock.close()


# --------------------------------------------------------------------------------- sd_notify


def test_ready_status_stopping_datagrams(notify_socket):
    assert service_notify.ready()
    assert notify_socket.recv(4096) == b"READY=1"
    assert service_notify.ready("listening on 0.0.0.0:7765")
    assert notify_socket.recv(4096) == b"READY=1\nSTATUS=listening on 0.0.0.0:7765"
    assert service_notify.status("last pass\n12:00:01  ok")  # one line on the wire
    assert notify_socket.recv(4096) == b"STATUS=last pass 12:00:01 ok"
    assert service_notify.stopping()
    assert notify_socket.recv(4096) == b"STOPPING=1"


def test_abstract_socket(monkeypatch):
    name = f"srecovery-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert service_notify.ready()
        assert sock.recv(4096) == b"READY=1"
    finally:
        sock.close()


def test_no_socket_is_a_noop(monkeypatch, sock_dir):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert service_notify.ready() is False
    assert service_notify.status("x") is False
    assert service_notify.stopping() is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(sock_dir / "nobody-listens"))
    assert service_notify.ready() is False  # never raises
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert service_notify.ready() is False


def test_watchdog_only_when_enabled_for_this_pid(notify_socket, monkeypatch):
    assert service_notify.watchdog_ping() is False  # no WATCHDOG_USEC
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # meant for another process
    assert service_notify.watchdog_ping() is False
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert service_notify.watchdog_ping()
    assert notify_socket.recv(4096) == b"WATCHDOG=1"
    monkeypatch.delenv("WATCHDOG_PID")
    assert service_notify.watchdog_ping()
    assert notify_socket.recv(4096) == b"WATCHDOG=1"
    monkeypatch.setenv("WATCHDOG_USEC", "junk")
    assert service_notify.watchdog_ping() is False
    assert received(notify_socket) == []


class _Registry:
    def __init__(self) -> None:
        self.sources: list = []
        self.broken: dict = {}

    def close(self) -> None:
        pass


class _Outbox:
    def __len__(self) -> int:
        return 0


class _Sender:
    failures = 0

    def run(self) -> None:
        pass

    def stop(self) -> None:
        pass


def test_sidecar_run_sends_ready_watchdog_stopping(notify_socket, monkeypatch, tmp_path):
    monkeypatch.setenv("WATCHDOG_USEC", "10000000")
    sidecar = Sidecar(
        "n1", _Registry(), _Outbox(), _Sender(), tmp_path, fast_interval=0.05, poll_interval=0.05
    )
    monkeypatch.setattr(sidecar, "emit_status", lambda now: None)
    monkeypatch.setattr(sidecar, "tick_slow", lambda now: None)
    stop = threading.Event()
    thread = threading.Thread(target=sidecar.run, args=(stop,))
    thread.start()
    try:
        assert notify_socket.recv(4096) == b"READY=1\nSTATUS=sidecar for n1"
        assert notify_socket.recv(4096) == b"WATCHDOG=1"
        assert notify_socket.recv(4096) == b"WATCHDOG=1"  # every fast tick
    finally:
        stop.set()
        thread.join(10)
    rest = received(notify_socket)
    assert rest[-1] == "STOPPING=1\nSTATUS=finishing the request in flight"
    assert set(rest[:-1]) <= {"WATCHDOG=1"}


# --------------------------------------------------------------------------------- journald


def parse_journal(data: bytes) -> list[tuple[str, bytes]]:
    """Decode the native protocol independently of the encoder."""
    fields = []
    i = 0
    while i < len(data):
        end = data.index(b"\n", i)
        line = data[i:end]
        if b"=" in line:
            name, _, value = line.partition(b"=")
            fields.append((name.decode(), value))
            i = end + 1
        else:
            (size,) = struct.unpack("<Q", data[end + 1 : end + 9])
            value = data[end + 9 : end + 9 + size]
            assert data[end + 9 + size : end + 10 + size] == b"\n"
            fields.append((line.decode(), value))
            i = end + 10 + size
    return fields


def test_encode_simple_and_binary_safe():
    data = service_notify.encode_fields(
        [("MESSAGE", "two\nlines"), ("PRIORITY", 6), ("BLOB", b"a=b\x00c"), ("X", "a=b")]
    )
    assert data == (
        b"MESSAGE\n" + struct.pack("<Q", 9) + b"two\nlines\nPRIORITY=6\nBLOB=a=b\x00c\nX=a=b\n"
    )
    assert parse_journal(data) == [
        ("MESSAGE", b"two\nlines"),
        ("PRIORITY", b"6"),
        ("BLOB", b"a=b\x00c"),
        ("X", b"a=b"),
    ]
    with pytest.raises(ValueError):
        service_notify.encode_fields([("_TRUSTED", "x")])
    with pytest.raises(ValueError):
        service_notify.encode_fields([("lower", "x")])


@pytest.fixture
def journal(sock_dir: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(sock_dir / "journal")
    sock = receiver(path)
    yield sock, path
    sock.close()


def logger_with(handler: logging.Handler) -> logging.Logger:
    log = logging.getLogger(f"srecovery.test.{uuid.uuid4().hex}")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    return log


def test_journal_handler_fields(journal):
    sock, path = journal
    handler = service_notify.JournalHandler("srecovery-controller", socket_path=path)
    log = logger_with(handler)
    log.warning(
        "job %d requeued", 41, extra={"srecovery_job": 41, "srecovery_node": "n2", "other": "x"}
    )
    line = sys._getframe().f_lineno - 3
    fields = dict(parse_journal(sock.recv(65536)))
    assert fields["MESSAGE"] == b"job 41 requeued"
    assert fields["PRIORITY"] == b"4"
    assert fields["SYSLOG_IDENTIFIER"] == b"srecovery-controller"
    assert fields["CODE_FILE"] == __file__.encode()
    assert fields["CODE_LINE"] == str(line).encode()
    assert fields["CODE_FUNC"] == b"test_journal_handler_fields"
    assert fields["SRECOVERY_JOB"] == b"41"
    assert fields["SRECOVERY_NODE"] == b"n2"
    assert "SRECOVERY_INCIDENT" not in fields
    assert "OTHER" not in fields
    handler.close()


def test_journal_handler_multiline_and_exception(journal):
    sock, path = journal
    handler = service_notify.JournalHandler("srecovery-sidecar", socket_path=path)
    log = logger_with(handler)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("pass failed", extra={"srecovery_incident": 7})
    data = sock.recv(65536)
    assert b"MESSAGE\n" in data  # length-prefixed: the message holds newlines
    fields = dict(parse_journal(data))
    message = fields["MESSAGE"].decode()
    assert message.startswith("pass failed\nTraceback")
    assert "RuntimeError: boom" in message
    assert fields["PRIORITY"] == b"3"
    assert fields["SRECOVERY_INCIDENT"] == b"7"
    log.debug("quiet")
    assert dict(parse_journal(sock.recv(65536)))["PRIORITY"] == b"7"
    handler.close()


def test_journal_handler_large_entry_goes_by_memfd(journal):
    sock, path = journal
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    handler = service_notify.JournalHandler("srecovery-controller", socket_path=path)
    log = logger_with(handler)
    big = "x" * 400_000  # larger than any datagram the socket takes
    log.info(big)
    msg, fds, _flags, _addr = socket.recv_fds(sock, 65536, 1)
    if fds:  # the kernel refused the datagram: the entry came as a sealed memfd
        assert msg == b""
        seals = fcntl.fcntl(fds[0], fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SHRINK  # journald wants it
        with os.fdopen(fds[0], "rb") as f:
            f.seek(0)  # the same open file as the sender's: its offset is at the end
            data = f.read()
    else:  # some kernels accept a datagram this large
        data = msg
    assert dict(parse_journal(data))["MESSAGE"] == big.encode()
    handler.close()


def test_journal_handler_falls_back_to_stderr(sock_dir, capsys):
    handler = service_notify.JournalHandler(
        "srecovery-controller", socket_path=str(sock_dir / "gone")
    )
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler._fallback.stream = sys.stderr  # capsys replaced stderr after construction
    logger_with(handler).error("journald is away")
    assert "ERROR journald is away" in capsys.readouterr().err
    handler.close()


def test_log_handler_journal_only_when_stderr_is_the_journal(journal, tmp_path, monkeypatch):
    _sock, path = journal
    stderr_file = open(tmp_path / "stderr", "w")  # noqa: SIM115
    monkeypatch.setattr(sys, "stderr", stderr_file)
    try:
        st = os.fstat(stderr_file.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        handler = service_notify.log_handler("x", "%(message)s", env=env, socket_path=path)
        assert isinstance(handler, service_notify.JournalHandler)
        handler.close()
        for other in (
            {},
            {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"},
            {"JOURNAL_STREAM": "x"},
        ):
            handler = service_notify.log_handler("x", "%(message)s", env=other, socket_path=path)
            assert type(handler) is logging.StreamHandler
        # stderr is the journal but journald's socket is missing: stderr
        handler = service_notify.log_handler(
            "x", "%(message)s", env=env, socket_path=str(tmp_path / "none")
        )
        assert type(handler) is logging.StreamHandler
    finally:
        stderr_file.close()
