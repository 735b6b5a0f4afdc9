"""The gateway's graph writer: update batches committed in a process of their own.

A commit (storage/versions.py) is a few milliseconds of Python and numpy per
batch; in the serving process it would hold the interpreter lock that every
request's k-hop and buffer steps need. :class:`WriterProcess` hands each batch
to a child (``python -m gnn_faas.gateway.graph_writer``) that keeps its own view
of every writable graph and commits there, answering the version's record and
delta; the gateway takes the delta into its own state at its next check
(:meth:`GraphVersions.offer`) or, with ``freshness_s: 0``, before it answers
(:meth:`GraphVersions.adopt`). The version flow: docs/architecture.md, section 7.

Protocol on the child's stdin and a duplicate of its stdout (fd 1 itself goes to
stderr): length-prefixed frames (gnn_faas/wire.py). First the job (``store``,
``graphs``, ``budget_bytes``), answered ``{"ready": true}`` or an error; then per
batch its non-empty tensors with ``{"graph": g}``, answered ``{"delta": uint8}``
with ``{"record": JSON}`` or ``{"error": {"type", "message"}}`` (a
:class:`~gnn_faas.errors.GnnFaasError` raised again by name). A child that died
is started again; the batch it held is a 503 (it may have been committed).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

from gnn_faas import errors
from gnn_faas.errors import GnnFaasError, Unavailable
from gnn_faas.parent_death import die_with
from gnn_faas.storage.delta import BATCH_TENSORS, Delta, UpdateBatch
from gnn_faas.storage.served_versions import versions_on
from gnn_faas.storage.versions import VersionRecord
from gnn_faas.wire import decode_frame, encode_frame

log = logging.getLogger("gnn_faas.gateway")

LENGTH = struct.Struct("<Q")
MAX_FRAME_BYTES = 1 << 31  # a batch is bounded by the body limit well below this
READY_TIMEOUT_S = 600.0  # opening every writable graph's base (a large structure)
COMMIT_TIMEOUT_S = 300.0  # one batch, racing other writers included


def write_frame(fd: int, tensors: dict[str, np.ndarray], params: dict[str, Any]) -> None:
    """``tensors`` and ``params`` as one length-prefixed frame on ``fd``."""
    data = encode_frame(tensors, params)
    view = memoryview(LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def read_frame(fd: int, deadline: float | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """One length-prefixed frame from ``fd`` (:class:`EOFError` when it closed;
    :class:`TimeoutError` past ``deadline``, ``time.monotonic``)."""
    (n,) = LENGTH.unpack(_read_exact(fd, LENGTH.size, deadline))
    if n > MAX_FRAME_BYTES:
        raise EOFError(f"a frame of {n} bytes: the stream is out of step")
    return decode_frame(_read_exact(fd, n, deadline), max_bytes=n + 1)


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    parts, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"no answer within the deadline ({got} of {n} bytes)")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("the stream closed")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def batch_tensors(batch: UpdateBatch) -> dict[str, np.ndarray]:
    """The batch's non-empty arrays by their wire names (what ``from_arrays`` reads)."""
    out = {}
    for name in BATCH_TENSORS:
        value = getattr(batch, name)
        if value is not None and value.size:
            out[name] = np.ascontiguousarray(value)
    return out


def error_of(doc: dict) -> GnnFaasError:
    """The exception an error answer names (a :class:`GnnFaasError` subclass by
    name; anything else is ours: a 500 with the child's message)."""
    cls = getattr(errors, str(doc.get("type")), None)
    message = str(doc.get("message", ""))
    if isinstance(cls, type) and issubclass(cls, GnnFaasError):
        return cls(message)
    return GnnFaasError(f"the graph writer failed: {doc.get('type')}: {message}")


class WriterProcess:
    """The serving side of the writer (see the module docstring): :meth:`commit`
    sends a batch and waits for its version. One batch at a time (the child
    commits in order, as one process's writers queue on its commit lock)."""

    def __init__(self, store: str, graphs: list[str], budget_bytes: int):
        self.job = {"store": store, "graphs": sorted(graphs), "budget_bytes": int(budget_bytes)}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._ready = False
        self.started = 0  # children started (more than one: one died)

    def start(self) -> None:
        """Start the child (it opens the graphs meanwhile; :meth:`commit` waits for it)."""
        with self._lock:
            self._spawn()

    def _spawn(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                return
            self._stop_child()  # it died: its pipes closed before the next one starts
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "gnn_faas.gateway.graph_writer"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            preexec_fn=die_with(os.getpid()),  # noqa: PLW1509 - prctl only, no locks taken
        )
        self._ready = False
        self.started += 1
        write_frame(self._proc.stdin.fileno(), {}, {"job": self.job})

    def _ensure_ready(self) -> subprocess.Popen:
        self._spawn()
        proc = self._proc
        if not self._ready:
            _, params = read_frame(proc.stdout.fileno(), time.monotonic() + READY_TIMEOUT_S)
            if "error" in params:
                raise error_of(params["error"])
            self._ready = True
        return proc

    def commit(self, graph: str, batch: UpdateBatch) -> tuple[VersionRecord, Delta]:
        """Commit ``batch`` to ``graph`` in the child: ``(record, delta)`` of its
        version, or the child's error raised here."""
        with self._lock:
            try:
                proc = self._ensure_ready()
                write_frame(proc.stdin.fileno(), batch_tensors(batch), {"graph": graph})
                tensors, params = read_frame(
                    proc.stdout.fileno(), time.monotonic() + COMMIT_TIMEOUT_S
                )
            except (OSError, EOFError, TimeoutError) as exc:
                self._stop_child()  # out of step or gone: the next batch starts another
                raise Unavailable(
                    f"graph {graph!r}: the graph writer process failed ({exc}); the batch "
                    "may or may not have been committed: check GET /v2/graphs/{graph}"
                ) from None
        if "error" in params:
            raise error_of(params["error"])
        rec = VersionRecord.from_dict(json.loads(params["record"]))
        return rec, Delta.decode(tensors["delta"].tobytes(), where=f"version {rec.version}")

    def _stop_child(self) -> None:
        proc, self._proc, self._ready = self._proc, None, False
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)

    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def alive(self) -> bool:
        """Whether a child is running (it may still be opening the graphs)."""
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        with self._lock:
            self._stop_child()


# -- the child ---------------------------------------------------------------------
def serve(inp: int, out: int) -> None:
    """The child's loop (see the module docstring): the job, then batches until EOF."""
    _, params = read_frame(inp)
    job = params["job"]
    try:
        graphs = {g: versions_on(job["store"], g, job["budget_bytes"]) for g in job["graphs"]}
    except Exception as exc:  # noqa: BLE001 - said to the gateway, which raises it
        write_frame(out, {}, {"error": {"type": type(exc).__name__, "message": str(exc)}})
        return
    write_frame(out, {}, {"ready": True})
    while True:
        try:
            tensors, params = read_frame(inp)
        except EOFError:
            return
        try:
            gv = graphs.get(params.get("graph"))
            if gv is None:
                raise errors.NotFound(f"graph {params.get('graph')!r} is not writable here")
            rec, delta = gv.commit(UpdateBatch.from_arrays(dict(tensors)))
            data = np.frombuffer(delta.encode(), np.uint8)
            write_frame(out, {"delta": data}, {"record": rec.to_json().decode()})
        except Exception as exc:  # noqa: BLE001 - every failure is the batch's answer
            if not isinstance(exc, GnnFaasError):
                log.exception("graph writer: committing a batch failed")
            write_frame(out, {}, {"error": {"type": type(exc).__name__, "message": str(exc)}})


def main() -> None:
    from gnn_faas.logs import ensure_logging

    out = os.dup(1)  # the answers' stream; fd 1 (prints, logs) goes to stderr
    os.dup2(2, 1)
    ensure_logging()
    serve(0, out)


if __name__ == "__main__":
    main()
