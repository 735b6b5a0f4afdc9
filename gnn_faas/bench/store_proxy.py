"""A TCP proxy in front of a graph store: round-trip latency, and hangs on demand.

Benchmarks on loopback measure a store with no network between it and its
clients; an in-region S3 answers a GET about 20 ms later, a Redis about 1 ms.
:class:`StoreProxy` runs this module as its own process (so the benchmark's
client threads do not slow it) listening on a loopback port and forwarding
to the store: every byte waits ``rtt_ms / 2`` on its way in each direction, in
order, so a request and its answer cost ``rtt_ms`` more (as a ``netem delay``
on the link would), while concurrent connections overlap as they would.

:meth:`StoreProxy.pause` makes the store hang (``SIGUSR1``): connections are
accepted and held, nothing is forwarded either way, as when the store's
process is stopped (``SIGSTOP``); :meth:`StoreProxy.resume` (``SIGUSR2``)
delivers what waited, in order. :func:`proxied` points a store URI (Redis) or
the S3 endpoint (``AWS_ENDPOINT_URL``) at the proxy.

    python -m gnn_faas.bench.store_proxy --target 127.0.0.1:6379 --rtt-ms 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from urllib.parse import urlsplit, urlunsplit

from gnn_faas.errors import InvalidRequest, Unavailable
from gnn_faas.storage.store_health import public_uri

CHUNK = 1 << 16


class _State:
    def __init__(self) -> None:
        self.flowing = asyncio.Event()
        self.flowing.set()


async def _pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float, state: _State
) -> None:
    """Forward ``reader`` to ``writer``, each chunk ``delay_s`` after it arrived."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def receive() -> None:
        while True:
            try:
                data = await reader.read(CHUNK)
            except (ConnectionError, OSError):
                data = b""
            await queue.put((loop.time() + delay_s, data))
            if not data:
                return

    async def send() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await state.flowing.wait()
            if not data:
                with suppress(OSError, RuntimeError):
                    writer.write_eof()
                return
            writer.write(data)
            try:
                await writer.drain()
            except (ConnectionError, OSError):
                return

    await asyncio.gather(receive(), send())


async def _serve(target: tuple[str, int], rtt_ms: float, port: int) -> None:
    state = _State()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, state.flowing.clear)
    loop.add_signal_handler(signal.SIGUSR2, state.flowing.set)
    half = max(0.0, rtt_ms) / 2e3

    tasks: set[asyncio.Task] = set()  # asyncio keeps no reference to a closed stream's task

    async def connection(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        tasks.add(task)
        try:
            await state.flowing.wait()  # a hung store answers no new connection either
            try:
                s_reader, s_writer = await asyncio.open_connection(*target)
            except OSError:
                c_writer.close()
                return
            try:
                await asyncio.gather(
                    _pump(c_reader, s_writer, half, state),
                    _pump(s_reader, c_writer, half, state),
                    return_exceptions=True,
                )
            finally:
                for w in (s_writer, c_writer):
                    w.close()
        finally:
            tasks.discard(task)

    server = await asyncio.start_server(connection, "127.0.0.1", port, backlog=1024)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="HOST:PORT of the store")
    p.add_argument("--rtt-ms", type=float, default=0.0, help="round-trip time to add")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: any)")
    args = p.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    asyncio.run(_serve((host, int(port)), args.rtt_ms, args.port))
    return 0


class StoreProxy:
    """This module's proxy in a subprocess, as a context manager; ``port`` is
    where it listens once entered."""

    def __init__(self, target: tuple[str, int], rtt_ms: float = 0.0):
        self.target = target
        self.rtt_ms = float(rtt_ms)
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> StoreProxy:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gnn_faas.bench.store_proxy",
             "--target", f"{self.target[0]}:{self.target[1]}", "--rtt-ms", str(self.rtt_ms)],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("listening "):
            self.__exit__()
            raise Unavailable(f"store proxy did not start: {line!r}")
        self.port = int(line.split()[1])
        return self

    def pause(self) -> None:
        """The store hangs: nothing is forwarded until :meth:`resume`."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGUSR1)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGUSR2)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def store_target(uri: str) -> tuple[str, int]:
    """Where the store at ``uri`` listens: a Redis URI's host and port, or for S3
    the endpoint in ``AWS_ENDPOINT_URL`` (a file store has none)."""
    scheme = urlsplit(uri).scheme if "://" in uri else "file"
    if scheme in ("redis", "rediss"):
        parts = urlsplit(uri)
        return parts.hostname or "127.0.0.1", parts.port or 6379
    if scheme == "s3":
        endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
        parts = urlsplit(endpoint)
        if not parts.hostname:
            raise InvalidRequest(
                "adding store latency to s3:// needs AWS_ENDPOINT_URL (a local S3 server)"
            )
        return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    raise InvalidRequest(f"store latency applies to s3:// and redis:// stores, not {uri!r}")


def proxied(uri: str, port: int) -> tuple[str, dict[str, str]]:
    """``(uri, environment)`` that reach the store at ``uri`` through the proxy
    listening on ``port``."""
    parts = urlsplit(uri)
    if parts.scheme in ("redis", "rediss"):
        netloc = f"127.0.0.1:{port}"
        if parts.username or parts.password:
            netloc = f"{parts.netloc.rpartition('@')[0]}@{netloc}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, "")), {}
    endpoint = urlsplit(os.environ["AWS_ENDPOINT_URL"])
    return uri, {"AWS_ENDPOINT_URL": f"{endpoint.scheme}://127.0.0.1:{port}"}


@contextmanager
def store_access(
    store: str, rtt_ms: float | None, always: bool = False
) -> Iterator[tuple[str, dict[str, str], StoreProxy | None]]:
    """``(uri, environment, proxy)`` through which a stack reaches ``store``:
    the store itself without ``rtt_ms`` (and not ``always``), else a
    :class:`StoreProxy` adding ``rtt_ms`` per round trip."""
    if not rtt_ms and not always:
        yield store, {}, None
        return
    with StoreProxy(store_target(store), rtt_ms or 0.0) as proxy:
        uri, env = proxied(store, proxy.port)
        yield uri, env, proxy


def add_store_arguments(p: argparse.ArgumentParser) -> None:
    """``--store`` and ``--store-rtt-ms``, as every stack benchmark takes them."""
    p.add_argument(
        "--store", default=None,
        help="graph store URI: file://..., s3://BUCKET/PREFIX (AWS_ENDPOINT_URL for a local "
        "server), redis://HOST:PORT/DB (default: ./var/store)",
    )  # fmt: skip
    p.add_argument(
        "--store-rtt-ms", type=float, default=0.0,
        help="round-trip time added to every store call (a TCP proxy; s3 and redis only): "
        "~20 models an in-region S3, ~1 an in-region Redis",
    )  # fmt: skip


def store_fields(store: str, rtt_ms: float | None) -> dict:
    """What a benchmark's JSON says of the store it ran on."""
    scheme = urlsplit(store).scheme if "://" in store else "file"
    return {"store": public_uri(store), "store_kind": scheme, "store_rtt_ms": float(rtt_ms or 0.0)}


if __name__ == "__main__":
    sys.exit(main())
