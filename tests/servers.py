"""Real servers for tests, on free loopback ports (docs/architecture.md, principle 4).

``redis_server()`` runs the ``redis-server`` binary; ``moto_server()`` runs
moto's standalone S3-compatible HTTP server in a subprocess. Both wait (with a
bound) until the server answers, yield its URL, and always stop it.
``http_server(handler)`` serves a test's own :class:`QuietHandler` in a thread.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gnn_faas.ports import free_port

LOOPBACK = "127.0.0.1"
START_TIMEOUT = 60.0  # seconds a server may take to answer (CI machines can be loaded)
START_ATTEMPTS = 3  # a fresh port each time: another process may grab ours first


def _redis_pings(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _log_tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-2000:]
    except OSError:
        return ""


@contextlib.contextmanager
def _serve(
    name: str, argv: Callable[[int], list[str]], ready: Callable[[int], bool], workdir: Path
) -> Iterator[int]:
    """Start ``argv(port)`` until ``ready(port)``; yield the port; stop it."""
    log = workdir / f"{name}.log"
    for _ in range(START_ATTEMPTS):
        port = free_port()
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv(port), stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
        deadline = time.monotonic() + START_TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline and not ready(port):
            time.sleep(0.05)
        if proc.poll() is None and ready(port):
            break
        _stop(proc)  # exited (port taken?) or too slow: try a fresh port
    else:
        raise RuntimeError(
            f"{name} did not start in {START_ATTEMPTS} attempts; log:\n{_log_tail(log)}"
        )
    try:
        yield port
    finally:
        _stop(proc)


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A throw-away ``redis-server`` (no persistence); yields ``redis://127.0.0.1:P/0``."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (`make test-deps` installs it)")
    with (
        tempfile.TemporaryDirectory(prefix="gnn-faas-redis-") as tmp,
        _serve(
            "redis-server",
            lambda port: [
                exe,
                "--port",
                str(port),
                "--bind",
                LOOPBACK,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                tmp,
            ],
            _redis_pings,
            Path(tmp),
        ) as port,
    ):
        yield f"redis://{LOOPBACK}:{port}/0"


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """moto's standalone S3-compatible server; yields its endpoint ``http://127.0.0.1:P``."""
    with (
        tempfile.TemporaryDirectory(prefix="gnn-faas-moto-") as tmp,
        _serve(
            "moto-server",
            lambda port: [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)],
            _accepts,
            Path(tmp),
        ) as port,
    ):
        yield f"http://{LOOPBACK}:{port}"


class QuietHandler(BaseHTTPRequestHandler):
    """A test's request handler, without http.server's line per request on stderr."""

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's name
        return None


@contextlib.contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served by a threaded http.server on a free loopback port;
    yields its base URL and always shuts it down."""
    srv = ThreadingHTTPServer((LOOPBACK, 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://{LOOPBACK}:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
