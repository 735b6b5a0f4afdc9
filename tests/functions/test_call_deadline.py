"""A function call made under a request's deadline never outlives it
(``functions/client.call_deadline``; the gateway sets it where a lone request's
calls run on its own HTTP thread)."""

from __future__ import annotations

import socket
import threading

import pytest

from gnn_faas import errors
from gnn_faas.functions.client import FunctionClient, call_deadline


@pytest.fixture
def silent_server():
    """A server that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def test_a_call_past_its_deadline_is_refused_before_it_is_sent(silent_server):
    client = FunctionClient(silent_server, timeout=3600.0)
    with call_deadline(-1.0), pytest.raises(errors.Unavailable, match="no time left"):
        client.get_json("/v1/stats")
    client.close()


def test_a_silent_function_fails_the_call_at_the_deadline_not_its_own_timeout(silent_server):
    # the client's own timeout is an hour: only the deadline can end this call
    client = FunctionClient(silent_server, timeout=3600.0)
    with call_deadline(0.5), pytest.raises(errors.Unavailable, match="unreachable"):
        client.get_json("/v1/stats")
    client.close()


def test_without_a_deadline_a_call_keeps_the_clients_timeout(silent_server):
    client = FunctionClient(silent_server, timeout=0.3)
    assert client._call_timeout() == 0.3
    with call_deadline(3600.0):
        assert client._call_timeout() == 0.3
    with call_deadline(0.2):
        assert client._call_timeout() <= 0.2
    assert client._call_timeout() == 0.3
    client.close()
