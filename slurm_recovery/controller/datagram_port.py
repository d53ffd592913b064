"""The UDP port that takes heartbeat datagrams (contract.datagrams), beside the HTTP API.

Thin on purpose: each datagram is handed to one function (the controller's
``heartbeat_datagram``) on the event loop, and its answer, if any, goes back to the sender.
A fault in that function is logged and the datagram dropped: the sidecar, hearing nothing,
sends its heartbeat over HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import cast

log = logging.getLogger("srecovery.controller")

#: A datagram and its sender's address -> the answer (None: none).
Answer = Callable[[bytes, str], bytes | None]
#: The receive buffer asked for: a second of heartbeats at 10,000 nodes and a 10 s period
#: (about 300 bytes each) waits here while the event loop is busy, instead of being dropped.
RECEIVE_BUFFER = 4 * 1024 * 1024


class HeartbeatPort(asyncio.DatagramProtocol):
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's UDP transport is not a subclass of asyncio's: typed, not checked
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        try:
            reply = self.answer(data, str(addr[0]))
        except Exception:
            log.exception("heartbeat datagram from %s: not answered", addr[0])
            return
        if reply is not None and self.transport is not None:
            self.transport.sendto(reply, addr)

    def error_received(self, exc: Exception) -> None:
        # an ICMP error for an earlier answer (the sidecar gone): nothing to do
        log.debug("heartbeat port: %s", exc)


async def open_port(host: str, port: int, answer: Answer) -> asyncio.DatagramTransport | None:
    """Bind ``host``:``port`` over UDP for heartbeat datagrams: the transport, or None,
    logged, when it cannot be bound (the sidecars keep to HTTP)."""
    loop = asyncio.get_running_loop()
    try:
        transport, _ = await loop.create_datagram_endpoint(
            lambda: HeartbeatPort(answer), local_addr=(host, port)
        )
    except OSError as exc:
        log.warning(
            "heartbeat datagrams off: cannot bind UDP %s:%d (%s); sidecars send heartbeats "
            "over HTTP",
            host,
            port,
            exc,
        )
        return None
    sock = transport.get_extra_info("socket")
    try:  # best effort: the kernel caps it at net.core.rmem_max
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    except OSError as exc:
        log.debug("heartbeat port: receive buffer left as it is (%s)", exc)
    return cast(asyncio.DatagramTransport, transport)
