"""When the server took a request in: the start of its latency.

A request's latency, as its client sees it, starts before the handler runs:
under load it waits in the kernel (until the worker's event loop reads it) and
then in gunicorn's queue for a free thread. The gateway's worker
(:class:`~gnn_faas.functions.buffered_worker.BufferedWorker`) reads every request
whole on its event loop before a thread takes it; :class:`AcceptStampWorker`
stamps the request when its first byte is read, backdated by the kernel's own
record of the wait: ``TCP_INFO.tcpi_last_data_recv``, the milliseconds since the
socket last received data (the request's bytes, for a connection queued in the
backlog)::

    queued_at = time.monotonic() - tcpi_last_data_recv / 1000

(clamped to ``[now - 60 s, now]``; plain ``now`` where ``TCP_INFO`` is not
available). The time a client takes to send its body counts as latency too, as
it does for the client. While a pool thread handles the request the stamp is
published to that thread; the data plane reads it with :func:`accepted_at` and
counts latency and SLO violations from there (``time.monotonic()`` is the clock
of :class:`~gnn_faas.clock.RealClock`).

Outside such a worker (tests, an in-process gateway) :func:`accepted_at` is
``None`` and callers use the time the handler started.

Serve with ``worker_class="gnn_faas.gateway.accept_clock.AcceptStampWorker"``.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

from gnn_faas.functions.buffered_worker import BufferedWorker

_current = threading.local()
_TCP_INFO = getattr(socket, "TCP_INFO", None)
_LAST_DATA_RECV = 52  # offset of tcpi_last_data_recv (u32, ms) in struct tcp_info
_MAX_BACKDATE_S = 60.0


def kernel_wait_s(sock: socket.socket) -> float:
    """Seconds since ``sock`` last received data, from ``TCP_INFO`` (0 if unknown)."""
    if _TCP_INFO is None:
        return 0.0
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 104)
        (ms,) = struct.unpack_from("=I", info, _LAST_DATA_RECV)
    except (OSError, struct.error):
        return 0.0
    return min(ms / 1000.0, _MAX_BACKDATE_S)


def accepted_at() -> float | None:
    """Monotonic time the request being handled on this thread was queued."""
    return getattr(_current, "queued_at", None)


class AcceptStampWorker(BufferedWorker):
    """Buffering worker that stamps each request when its first byte is read."""

    def on_request_start(self, conn) -> None:
        conn.gnn_faas_queued_at = time.monotonic() - kernel_wait_s(conn.sock)

    def handle(self, conn):
        _current.queued_at = getattr(conn, "gnn_faas_queued_at", None)
        try:
            return super().handle(conn)
        finally:
            _current.queued_at = None
