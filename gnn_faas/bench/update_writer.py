"""The writer of ``gnn-faas bench updates``: an edge stream posted as batches while serving.

:class:`EdgeCycle` turns the later edges of a graph (``bitcoin-otc-time``,
``higgs-activity``) into an endless sequence of batches: the edges added
``batch`` at a time, in time order; then (``add-remove``) removed in the same
batches, then added again, so the graph stays the size of the real one however
long the stream runs; or (``add``) added again and again (multi-edges).
:meth:`EdgeCycle.present` says which stream edges (with multiplicity) the graph
holds after the first ``k`` batches: the reference the final answers are
checked against.

:func:`post_batches` posts batches to ``POST /v2/graphs/{g}/updates`` (the
binary tensor extension, or JSON) one after the other: as fast as the gateway
acknowledges them, or each when due at ``rate`` edges per second; it stops at a
deadline (after the batch in flight) or at the first refused batch, and keeps
an :class:`Ack` per batch (monotonic clock).

:class:`WriterProcess` runs :func:`post_batches` in a process of its own
(``python -m gnn_faas.bench.update_writer``, the job as JSON on stdin, the acks
as JSON on stdout): the benchmark's load generator then does not share an
interpreter lock with the writer, whose Python work per batch would otherwise
delay the load's sends and reads and count as inference latency (a real writer
is another client altogether).
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

import numpy as np

from gnn_faas.client import HEADER_LENGTH
from gnn_faas.errors import InvalidRequest

CYCLES = ("add-remove", "add")


@dataclass(frozen=True)
class Ack:
    """One batch: when it went out and was acknowledged (``time.monotonic``)."""

    sent: float
    acked: float
    status: int
    version: int  # -1: not committed (status != 200)
    edges: int
    kind: str  # add_edges | remove_edges
    error: str = ""


class EdgeCycle:
    """See the module docstring. ``edges``: ``[m, 2]`` ``(src, dst)`` in stream order."""

    def __init__(self, edges: np.ndarray, batch: int, cycle: str = "add-remove"):
        if batch < 1:
            raise InvalidRequest("--batch must be at least 1")
        if cycle not in CYCLES:
            raise InvalidRequest(f"unknown cycle {cycle!r}; known: {', '.join(CYCLES)}")
        if edges.shape[0] == 0:
            raise InvalidRequest("the update stream holds no edges")
        self.edges = np.ascontiguousarray(edges, np.int64)
        self.batch = int(batch)
        self.cycle = cycle
        self.per_pass = -(-self.edges.shape[0] // self.batch)
        self.file: str | None = None  # where :meth:`save` wrote the edges

    def save(self, path: str) -> None:
        """Write the edges to ``path`` (``.npy``) for a :class:`WriterProcess`."""
        np.save(path, self.edges, allow_pickle=False)
        self.file = path

    def _slice(self, j: int) -> np.ndarray:
        return self.edges[j * self.batch : (j + 1) * self.batch]

    def get(self, k: int) -> tuple[str, np.ndarray]:
        """Batch ``k`` (from 0): ``(kind, edges)``."""
        p, j = divmod(k, self.per_pass)
        if self.cycle == "add-remove" and p % 2 == 1:
            return "remove_edges", self._slice(j)
        return "add_edges", self._slice(j)

    def present(self, k: int) -> np.ndarray:
        """The stream edges the graph holds after batches ``0 .. k-1`` (with multiplicity)."""
        p, j = divmod(k, self.per_pass)
        cut = min(j * self.batch, self.edges.shape[0])
        if self.cycle == "add":
            return np.concatenate([self.edges] * p + [self.edges[:cut]])
        if p % 2 == 0:
            return self.edges[:cut]
        return self.edges[cut:]


def batch_body(kind: str, edges: np.ndarray, binary: bool) -> tuple[bytes, dict[str, str]]:
    """An update request's body and headers: OIP tensors (binary) or the JSON form."""
    if not binary:
        return json.dumps({kind: edges.tolist()}).encode(), {"Content-Type": "application/json"}
    raw = np.ascontiguousarray(edges, "<i8").tobytes()
    head = json.dumps({"inputs": [{
        "name": kind, "datatype": "INT64", "shape": list(edges.shape),
        "parameters": {"binary_data_size": len(raw)},
    }]}).encode()  # fmt: skip
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(head))}
    return head + raw, headers


class Poster:
    """POSTs over one kept-alive connection (``http.client``): the writer shares the
    benchmark's two cores with what it measures, and a ``requests`` call costs
    several times the CPU of the bare exchange. A dropped connection is opened
    again on the next post."""

    def __init__(self, url: str, timeout_s: float):
        u = urlsplit(url)
        self.host, self.port, self.timeout_s = u.hostname, u.port or 80, timeout_s
        self.conn: http.client.HTTPConnection | None = None

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
        """``(status, JSON answer)``; ``(0, {"error": ...})`` when no answer came."""
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            self.conn.request("POST", path, body=body, headers=headers)
            r = self.conn.getresponse()
            raw = r.read()
            return r.status, (json.loads(raw) if raw else {})
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.close()
            return 0, {"error": f"{type(exc).__name__}: {exc}"}

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def post_batches(
    url: str,
    graph: str,
    token: str,
    cycle: EdgeCycle,
    until: float,
    rate: float = 0.0,
    binary: bool = True,
    max_edges: int = 0,
    first: int = 0,
    timeout_s: float = 60.0,
) -> list[Ack]:
    """Post ``cycle``'s batches from batch ``first`` until ``until`` (monotonic)
    passes or ``max_edges`` (> 0) were posted; ``rate`` > 0: a batch is due
    ``e / rate`` seconds after the start, ``e`` the edges posted before it (a pass's
    last batch is short: pacing by batches would post fewer edges than ``rate``)."""
    acks: list[Ack] = []
    path = f"/v2/graphs/{graph}/updates"
    auth = {"Authorization": f"Bearer {token}"}
    start = time.monotonic()
    poster = Poster(url, timeout_s)
    k = posted = 0
    try:
        while time.monotonic() < until and not (max_edges and posted >= max_edges):
            if rate > 0:
                wait = start + posted / rate - time.monotonic()
                if wait > 0:
                    time.sleep(min(wait, max(0.0, until - time.monotonic())))
                    if time.monotonic() >= until:
                        break
            kind, edges = cycle.get(first + k)
            body, headers = batch_body(kind, edges, binary)
            sent = time.monotonic()
            status, doc = poster.post(path, body, {**headers, **auth})
            acked = time.monotonic()
            ok = status == 200
            acks.append(Ack(sent, acked, status, int(doc["version"]) if ok else -1,
                            int(edges.shape[0]), kind, "" if ok else str(doc.get("error"))[:200]))  # fmt: skip
            if not ok:  # the stream's reference is uncertain past a refused batch
                break
            k += 1
            posted += int(edges.shape[0])
    finally:
        poster.close()
    return acks


class WriterProcess:
    """:func:`post_batches` in a child process, started (and its imports done)
    before the window it posts in; :meth:`run` posts one window's batches."""

    def __init__(self, edges_file: str, batch: int, cycle: str):
        self.job = {"edges_file": edges_file, "batch": batch, "cycle": cycle}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gnn_faas.bench.update_writer"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self.proc.stdout.readline().strip()
        if ready != "ready":
            self.proc.kill()
            raise RuntimeError(f"the writer process did not start (said {ready!r})")

    def run(self, url: str, graph: str, token: str, until: float, **kw) -> list[Ack]:
        """:func:`post_batches` with these arguments (``until``: ``time.monotonic``,
        which is the machine's, so the child's deadline is the caller's)."""
        job = {**self.job, "url": url, "graph": graph, "token": token, "until": until, **kw}
        out, _ = self.proc.communicate(json.dumps(job), timeout=until - time.monotonic() + 120)
        if self.proc.returncode != 0:
            raise RuntimeError(f"the writer process failed (exit {self.proc.returncode})")
        return [Ack(**a) for a in json.loads(out)]


def main() -> None:
    print("ready", flush=True)
    job = json.loads(sys.stdin.read())
    edges = np.load(job.pop("edges_file"), allow_pickle=False)
    cycle = EdgeCycle(edges, job.pop("batch"), job.pop("cycle"))
    acks = post_batches(job.pop("url"), job.pop("graph"), job.pop("token"), cycle, **job)
    json.dump([asdict(a) for a in acks], sys.stdout)


if __name__ == "__main__":
    main()
