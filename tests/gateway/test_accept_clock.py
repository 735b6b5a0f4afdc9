"""The accept stamp: the kernel's record of how long a request waited before accept."""

from __future__ import annotations

import socket
import time

import pytest

from gnn_faas.gateway import accept_clock
from gnn_faas.gateway.accept_clock import kernel_wait_s


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="TCP_INFO is Linux only")
def test_time_queued_in_the_accept_backlog_is_read_from_tcp_info():
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        t0 = time.monotonic()
        with socket.create_connection(srv.getsockname()) as client:
            client.sendall(b"POST / HTTP/1.1\r\n\r\n")
            time.sleep(0.3)  # the request waits in the backlog, unaccepted
            conn, _ = srv.accept()
            with conn:
                waited = kernel_wait_s(conn)
                held = time.monotonic() - t0  # connect to accept, and a little more
    assert 0.25 <= waited <= held + 0.05


def test_no_stamp_outside_a_stamping_worker():
    assert accept_clock.accepted_at() is None
